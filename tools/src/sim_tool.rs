//! rnic-sim's scenarios on dcb's fabric simulator: what each sets up, the CSV it writes, the
//! figures it draws and the summary it prints.

use std::io::Write;
use std::path::Path;

use dcb::dcqcn::RpParams;
use dcb::dcqcn::Variant;
use dcb::ecn::Red;
use dcb::sim::{Config, FlowSpec, Outcome, Sim};
use roce::sim::fabric::{self, Incast, IncastOutcome};

use crate::plot::{draw, Panel, Series};

/// Which DCQCN parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// The SIGCOMM'15 paper's algorithm and values.
    Paper,
    /// NVIDIA firmware's algorithm and defaults.
    Nvidia,
}

impl Preset {
    /// Reaction point parameters at `mbps`.
    pub fn rp(self, mbps: f64) -> RpParams {
        match self {
            Preset::Paper => RpParams::paper(mbps),
            Preset::Nvidia => RpParams::firmware(mbps),
        }
    }

    /// The marking curve and CNP interval that go with it: the paper's Kmin 5 KB, Kmax
    /// 200 KB, Pmax 1 % and one CNP per 50 us; the firmware's deployments mark with the
    /// simulators' scaled thresholds (Kmin 100 KB, Kmax 400 KB per 25 Gb/s, Pmax 0.2) and
    /// min_time_between_cnps 4 us.
    pub fn marking(self, gbps: f64) -> (Red, u64) {
        match self {
            Preset::Paper => (Red::PAPER, 50_000),
            Preset::Nvidia => (Red::scaled(gbps), 4_000),
        }
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Paper => "paper",
            Preset::Nvidia => "nvidia",
        }
    }
}

/// A fabric with `senders` senders and `receivers` receivers at `gbps`.
pub fn fabric(senders: usize, receivers: usize, gbps: f64, duration_ns: u64) -> Config {
    let mbps = gbps * 1000.0;
    // XOFF at 3 bandwidth-delay products of a link (1 us each way), at least 64 KB.
    let bdp = (2.0 * 1_000.0 * gbps / 8.0) as u64;
    Config {
        senders,
        receivers,
        flows: Vec::new(),
        link_mbps: mbps,
        link_delay: 1_000,
        mtu: 1024,
        dcqcn: None,
        cnp_interval: 4_000,
        red: None,
        pfc: true,
        pfc_xoff: (3 * bdp).max(64 << 10),
        buffer: 32 << 20,
        sample: (duration_ns / 1500).clamp(1_000, 100_000),
        seed: 1,
    }
}

/// Writes the flows' samples as CSV: `time_us,flow,rate_gbps,goodput_gbps,queue_kb`.
pub fn write_csv(path: &Path, o: &Outcome) -> Result<(), String> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
    );
    let w = |f: &mut std::io::BufWriter<std::fs::File>, s: String| {
        f.write_all(s.as_bytes()).map_err(|e| e.to_string())
    };
    w(
        &mut f,
        "time_us,flow,rate_gbps,goodput_gbps,queue_kb\n".into(),
    )?;
    let n = o.delivered.len().max(1);
    for (i, s) in o.flows.iter().enumerate() {
        let q = o.switch.get(i / n).map_or(0, |x| x.queue_bytes);
        w(
            &mut f,
            format!(
                "{:.1},{},{:.4},{:.4},{:.2}\n",
                s.time_us,
                s.flow,
                s.rate_gbps,
                s.goodput_gbps,
                q as f64 / 1000.0
            ),
        )?;
    }
    f.flush().map_err(|e| e.to_string())
}

fn per_flow(o: &Outcome, f: impl Fn(&dcb::sim::FlowSample) -> f64, name: &str) -> Vec<Series> {
    // One pass over the samples (not one per flow: up to 1024 flows of ~1500 samples).
    let mut series: Vec<Series> = (0..o.delivered.len())
        .map(|k| Series {
            name: format!("{name} {k}"),
            points: Vec::new(),
        })
        .collect();
    for s in &o.flows {
        if let Some(v) = series.get_mut(s.flow) {
            v.points.push((s.time_us, f(s)));
        }
    }
    series
}

/// A moving average over about 1 % of the run: per-sample goodput counts a handful of
/// packets, too noisy to read as a line.
fn smooth(mut v: Vec<Series>) -> Vec<Series> {
    for s in &mut v {
        let w = (s.points.len() / 100).max(1);
        let mut out = Vec::with_capacity(s.points.len());
        let mut sum = 0.0;
        for i in 0..s.points.len() {
            sum += s.points[i].1;
            if i >= w {
                sum -= s.points[i - w].1;
            }
            out.push((s.points[i].0, sum / (i + 1).min(w) as f64));
        }
        s.points = out;
    }
    v
}

fn queue_series(o: &Outcome, name: &str) -> Series {
    Series {
        name: name.into(),
        points: o
            .switch
            .iter()
            .map(|s| (s.time_us, s.queue_bytes as f64 / 1000.0))
            .collect(),
    }
}

/// A run's summary in numbers (also what the tests check).
#[derive(Debug, Clone)]
pub struct Summary {
    /// Jain's index over the flows, on goodput averaged over the second half of the run.
    pub jain: f64,
    /// Aggregate goodput over the second half, Gb/s.
    pub goodput: f64,
    /// Mean and largest bottleneck queue over the second half, KB.
    pub queue_mean_kb: f64,
    /// Largest queue over the whole run, KB.
    pub queue_max_kb: f64,
    /// Drops.
    pub drops: u64,
    /// CNPs.
    pub cnps: u64,
    /// PFC XOFF frames (refreshes included).
    pub pfc_xoff: u64,
    /// Share of the run each sender spent paused, averaged.
    pub paused_fraction: f64,
    /// PFC frames in the second half.
    pub late_paused_senders: f64,
}

/// Summarises `o` for `flows` (the second half of the run counts as converged).
pub fn summarise(o: &Outcome, flows: &[usize]) -> Summary {
    let half = o.duration as f64 / 2000.0;
    let late: Vec<_> = o.switch.iter().filter(|s| s.time_us >= half).collect();
    let qmean = late.iter().map(|s| s.queue_bytes as f64).sum::<f64>() / late.len().max(1) as f64;
    Summary {
        jain: o.jain(half, flows),
        goodput: flows.iter().map(|f| o.mean_goodput(*f, half)).sum(),
        queue_mean_kb: qmean / 1000.0,
        queue_max_kb: o.switch.iter().map(|s| s.queue_bytes).max().unwrap_or(0) as f64 / 1000.0,
        drops: o.drops,
        cnps: o.cnps,
        pfc_xoff: o.pfc_xoff,
        paused_fraction: o.paused_ns.iter().sum::<u64>() as f64
            / (o.paused_ns.len().max(1) as f64 * o.duration.max(1) as f64),
        late_paused_senders: late.iter().map(|s| s.paused_senders as f64).sum::<f64>()
            / late.len().max(1) as f64,
    }
}

/// Prints a summary.
pub fn print_summary(what: &str, s: &Summary, out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "{what}: goodput {:.2} Gb/s, Jain {:.3} (second half), bottleneck queue mean {:.1} KB \
         (max {:.1} KB), drops {}, CNPs {}, PFC XOFF frames {}, senders paused {:.1} % of the time",
        s.goodput,
        s.jain,
        s.queue_mean_kb,
        s.queue_max_kb,
        s.drops,
        s.cnps,
        s.pfc_xoff,
        100.0 * s.paused_fraction
    );
}

/// `dcqcn`: `flows` long flows from separate senders into one receiver, starting `stagger_ns`
/// apart.
pub fn dcqcn(
    flows: usize,
    gbps: f64,
    preset: Preset,
    duration_ns: u64,
    stagger_ns: u64,
) -> Outcome {
    let mut c = fabric(flows, 1, gbps, duration_ns);
    c.flows = into_one(flows, stagger_ns);
    with_dcqcn(&mut c, preset, gbps);
    Sim::new(c).run(duration_ns)
}

/// `n` flows from senders 0..n into receiver 0, starting `stagger_ns` apart.
fn into_one(n: usize, stagger_ns: u64) -> Vec<FlowSpec> {
    (0..n)
        .map(|k| FlowSpec {
            src: k,
            dst: 0,
            start: k as u64 * stagger_ns,
        })
        .collect()
}

/// DCQCN at the senders with `preset`'s parameters, and the switch's ECN marking (below
/// PFC's XOFF) and the receivers' CNP interval to match.
fn with_dcqcn(c: &mut Config, preset: Preset, gbps: f64) {
    c.dcqcn = Some(preset.rp(gbps * 1000.0));
    let (red, cnp) = preset.marking(gbps);
    mark_before_pause(c, red);
    c.cnp_interval = cnp;
}

/// ECN marking on, with PFC's XOFF above Kmax: DCQCN reacts before PFC has to (the usual
/// deployment rule: ECN first, PFC as the last resort), within the buffer.
fn mark_before_pause(c: &mut Config, red: Red) {
    c.red = Some(red);
    c.pfc_xoff = c.pfc_xoff.max(red.kmax);
    cap_xoff(c);
}

/// Every ingress port's XOFF plus headroom fits the shared buffer.
fn cap_xoff(c: &mut Config) {
    let per_port = c.buffer / c.senders.max(1) as u64;
    c.pfc_xoff = c
        .pfc_xoff
        .min(per_port.saturating_sub(c.headroom()).max(16 << 10));
}

/// The figure of a `dcqcn` run.
pub fn dcqcn_figure(path: &Path, o: &Outcome, title: &str) -> Result<(), String> {
    draw(
        path,
        &[
            time_panel(
                format!("{title}: DCQCN rate per flow"),
                "rate (Gb/s)",
                per_flow(o, |s| s.rate_gbps, "flow"),
            ),
            time_panel(
                "bottleneck queue",
                "queue (KB)",
                vec![queue_series(o, "queue")],
            ),
        ],
        1000,
        380,
    )
}

/// `incast`: `senders` senders into one receiver, all starting at once.
pub fn incast(senders: usize, gbps: f64, dcqcn: bool, pfc: bool, duration_ns: u64) -> Outcome {
    let mut c = fabric(senders, 1, gbps, duration_ns);
    c.flows = into_one(senders, 0);
    c.pfc = pfc;
    // A shallow shared buffer, as on a switch port: 1 MB per 25 Gb/s.
    c.buffer = (gbps / 25.0 * 1_000_000.0) as u64;
    same_pause_thresholds(&mut c, gbps, dcqcn);
    Sim::new(c).run(duration_ns)
}

/// The switch's PFC thresholds of a fabric deployed for DCQCN (XOFF above ECN's Kmax, within
/// the buffer), set whether DCQCN runs or not: a comparison with and without DCQCN then
/// changes one thing, the senders' reaction, not the pause thresholds too (with 3 BDPs
/// without DCQCN and Kmax with it, XOFF differed sixfold and the pause counts said little).
/// With `dcqcn`, the senders then run NVIDIA's DCQCN.
fn same_pause_thresholds(c: &mut Config, gbps: f64, dcqcn: bool) {
    let (red, _) = Preset::Nvidia.marking(gbps);
    c.pfc_xoff = c.pfc_xoff.max(red.kmax);
    cap_xoff(c);
    if dcqcn {
        with_dcqcn(c, Preset::Nvidia, gbps);
    }
}

/// A panel over time (us) titled `title`, its y axis labelled `y_label`.
fn time_panel(title: impl Into<String>, y_label: &str, series: Vec<Series>) -> Panel {
    Panel {
        title: title.into(),
        x_label: "time (us)".into(),
        y_label: y_label.into(),
        series,
    }
}

/// The panel of how many senders PFC pauses over time.
fn paused_panel(o: &Outcome) -> Panel {
    let paused = Series {
        name: "paused senders".into(),
        points: o
            .switch
            .iter()
            .map(|s| (s.time_us, s.paused_senders as f64))
            .collect(),
    };
    time_panel("senders paused by PFC", "senders", vec![paused])
}

/// The figure of an `incast` run.
pub fn incast_figure(path: &Path, o: &Outcome, title: &str) -> Result<(), String> {
    draw(
        path,
        &[
            time_panel(
                format!("{title}: goodput per sender"),
                "goodput (Gb/s)",
                smooth(per_flow(o, |s| s.goodput_gbps, "sender")),
            ),
            time_panel(
                "bottleneck queue",
                "queue (KB)",
                vec![queue_series(o, "queue")],
            ),
            paused_panel(o),
        ],
        1000,
        320,
    )
}

/// `pfc`: PFC only. `senders` senders each send to receiver 0 (a congested port); sender 0
/// also has a flow to receiver 1, whose port is idle: the victim. Returns the outcome and the
/// victim's flow index.
pub fn pfc_victim(senders: usize, gbps: f64, dcqcn: bool, duration_ns: u64) -> (Outcome, usize) {
    let mut c = fabric(senders, 2, gbps, duration_ns);
    c.flows = into_one(senders, 0);
    c.flows.push(FlowSpec {
        src: 0,
        dst: 1,
        start: 0,
    });
    same_pause_thresholds(&mut c, gbps, dcqcn);
    let victim = c.flows.len() - 1;
    (Sim::new(c).run(duration_ns), victim)
}

/// The payload share of line rate one MTU packet carries.
pub fn payload_share(mtu: u64) -> f64 {
    mtu as f64 / dcb::sim::wire_bytes(mtu) as f64
}

/// The figure of a `pfc` run.
pub fn pfc_figure(path: &Path, o: &Outcome, victim: usize, title: &str) -> Result<(), String> {
    let mut series = smooth(per_flow(o, |s| s.goodput_gbps, "flow"));
    series[victim].name = format!("flow {victim} (victim, to an idle port)");
    draw(
        path,
        &[
            time_panel(
                format!("{title}: goodput per flow"),
                "goodput (Gb/s)",
                series,
            ),
            paused_panel(o),
        ],
        1000,
        380,
    )
}

/// The figure comparing the two presets on the same scenario.
pub fn compare_figure(
    path: &Path,
    paper: &Outcome,
    nvidia: &Outcome,
    what: &str,
) -> Result<(), String> {
    draw(
        path,
        &[
            time_panel(
                format!("paper (SIGCOMM'15): DCQCN rate per flow ({what})"),
                "rate (Gb/s)",
                per_flow(paper, |s| s.rate_gbps, "flow"),
            ),
            time_panel(
                format!("NVIDIA firmware: DCQCN rate per flow ({what})"),
                "rate (Gb/s)",
                per_flow(nvidia, |s| s.rate_gbps, "flow"),
            ),
            time_panel(
                format!("bottleneck queue ({what})"),
                "queue (KB)",
                vec![queue_series(paper, "paper"), queue_series(nvidia, "nvidia")],
            ),
        ],
        1000,
        320,
    )
}

/// `rnic-sim rnics`: an N:1 incast of ferroce RNICs (the transport engine itself, with its
/// DCQCN and PFC hold) through dcb's switch model, on simulated time
/// (`roce::sim::fabric::incast`); measured over the last four fifths of the run.
pub fn rnics(
    senders: usize,
    depth: u64,
    gbps: f64,
    preset: Option<Preset>,
    duration_ns: u64,
) -> IncastOutcome {
    fabric::incast(&Incast {
        senders,
        depth,
        link_mbps: gbps * 1000.0,
        dcqcn: preset.map(|p| match p {
            Preset::Paper => Variant::Paper,
            Preset::Nvidia => Variant::Firmware,
        }),
        from: duration_ns / 5,
        until: duration_ns,
        sample_ns: (duration_ns / 1000).clamp(1_000, 100_000),
    })
}

/// One line of the `rnics` table.
pub fn print_rnics(what: &str, o: &IncastOutcome, out: &mut dyn Write) {
    let _ = writeln!(
        out,
        "{what:<16} aggregate {:>6.2} Gb/s  Jain {:.3}  queue p99 {:>5} KB  peak {:>5} KB  \
         XOFF {:>5}  CNPs {:>5}  drops {}",
        o.aggregate(),
        o.jain(),
        o.p99 / 1000,
        o.peak / 1000,
        o.xoff,
        o.cnps,
        o.drops
    );
    let per: Vec<String> = o.per_sender.iter().map(|g| format!("{g:.2}")).collect();
    let _ = writeln!(out, "{:<16} per sender Gb/s: {}", "", per.join(" "));
}

/// The `rnics` CSV: `scenario,time_us,sender,goodput_gbps,queue_kb`.
pub fn rnics_csv(path: &Path, runs: &[(String, IncastOutcome)]) -> Result<(), String> {
    let mut f = std::io::BufWriter::new(
        std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?,
    );
    let mut text = String::from("scenario,time_us,sender,goodput_gbps,queue_kb\n");
    for (name, o) in runs {
        for (t, g, q) in &o.series {
            for (s, v) in g.iter().enumerate() {
                text.push_str(&format!(
                    "{name},{t:.1},{s},{v:.4},{:.2}\n",
                    *q as f64 / 1000.0
                ));
            }
        }
    }
    f.write_all(text.as_bytes())
        .and_then(|_| f.flush())
        .map_err(|e| e.to_string())
}

/// The `rnics` figure: each scenario's per-sender goodput (averaged over `avg_us`), then the
/// bottleneck queues.
pub fn rnics_figure(
    path: &Path,
    runs: &[(String, IncastOutcome)],
    title: &str,
    avg_us: f64,
) -> Result<(), String> {
    let mut panels = Vec::new();
    for (name, o) in runs {
        let n = o.per_sender.len();
        // Goodput comes in 64 KiB completions: averaged to read as a rate.
        let dt = match o.series.as_slice() {
            [a, b, ..] => (b.0 - a.0).max(1.0),
            _ => avg_us,
        };
        let w = ((avg_us / dt) as usize).max(1);
        let series = (0..n)
            .map(|s| Series {
                name: format!("sender {s}"),
                points: o
                    .series
                    .windows(w)
                    .map(|win| {
                        let mean = win.iter().map(|(_, g, _)| g[s]).sum::<f64>() / w as f64;
                        (win[w - 1].0, mean)
                    })
                    .collect(),
            })
            .collect();
        panels.push(time_panel(
            format!(
                "{title}: {name}, goodput per sender ({} ms average)",
                avg_us / 1000.0
            ),
            "Gb/s",
            series,
        ));
    }
    panels.push(time_panel(
        format!("{title}: bottleneck queue"),
        "KB",
        runs.iter()
            .map(|(name, o)| Series {
                name: name.clone(),
                points: o
                    .series
                    .iter()
                    .map(|(t, _, q)| (*t, *q as f64 / 1000.0))
                    .collect(),
            })
            .collect(),
    ));
    draw(path, &panels, 1000, 300)
}
