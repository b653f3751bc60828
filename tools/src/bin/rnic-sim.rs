//! rnic-sim: DCB scenarios on a simulated fabric (dcb's PFC, ECN marking and DCQCN on
//! simulated time), writing CSV and PNG plots.
//!
//! - `rnic-sim dcqcn --flows N --rate GBPS --preset paper|nvidia --duration MS --csv FILE
//!   [--png FILE]`: N long flows through one bottleneck converge to a fair share;
//! - `rnic-sim incast --senders N --rate GBPS [--no-dcqcn] [--no-pfc]`: queue, pauses,
//!   throughput, fairness and drops of an N:1 incast;
//! - `rnic-sim pfc`: PFC only (no ECN): pause propagation and a victim flow;
//! - `rnic-sim compare`: the paper's and the firmware's DCQCN side by side;
//! - `rnic-sim rnics --senders N --rate GBPS [--dcqcn off|paper|nvidia]`: an N:1 incast of
//!   ferroce's own transport engines through dcb's switch model (without `--dcqcn`: PFC only,
//!   the paper's and the firmware's DCQCN, side by side); with `--dpdk K` the same incast
//!   runs for real, ferroce RNICs on DPDK through the emulated switch in real time, slowed
//!   down K times.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use ferroce_tools::sim_tool::{self as st, Preset};

#[derive(Parser)]
#[command(
    name = "rnic-sim",
    version,
    about = "DCB scenarios (PFC, ECN, DCQCN) on a simulated fabric"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// N long flows through one bottleneck under DCQCN.
    Dcqcn {
        /// Flows (each from its own sender).
        #[arg(long, default_value_t = 4)]
        flows: usize,
        /// Link rate, Gb/s.
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// Parameter set and semantics.
        #[arg(long, value_enum, default_value_t = Preset::Nvidia)]
        preset: Preset,
        /// Simulated time, ms.
        #[arg(long, default_value_t = 20.0)]
        duration: f64,
        /// Flow k starts k x this, us (default: the first quarter of the run is spread over
        /// the flows).
        #[arg(long)]
        stagger: Option<f64>,
        /// CSV output (time_us,flow,rate_gbps,goodput_gbps,queue_kb).
        #[arg(long)]
        csv: Option<PathBuf>,
        /// PNG plot.
        #[arg(long)]
        png: Option<PathBuf>,
    },
    /// N:1 incast.
    Incast {
        /// Senders.
        #[arg(long, default_value_t = 8)]
        senders: usize,
        /// Link rate, Gb/s.
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// Without DCQCN (and without ECN marking).
        #[arg(long)]
        no_dcqcn: bool,
        /// Without PFC.
        #[arg(long)]
        no_pfc: bool,
        /// Simulated time, ms.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// CSV output.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// PNG plot.
        #[arg(long)]
        png: Option<PathBuf>,
    },
    /// PFC only: pause propagation and a victim flow to an idle port.
    Pfc {
        /// Senders into the congested port (sender 0 also sends to the idle port).
        #[arg(long, default_value_t = 4)]
        senders: usize,
        /// Link rate, Gb/s.
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// With DCQCN too (the fix).
        #[arg(long)]
        dcqcn: bool,
        /// Simulated time, ms.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        /// CSV output.
        #[arg(long)]
        csv: Option<PathBuf>,
        /// PNG plot.
        #[arg(long)]
        png: Option<PathBuf>,
    },
    /// N:1 incast of ferroce RNICs (the transport engine, 64 KiB RDMA WRITEs) through the
    /// switch model: PFC only and DCQCN (paper, firmware) side by side.
    Rnics {
        /// Senders.
        #[arg(long, default_value_t = 8)]
        senders: usize,
        /// Link rate, Gb/s.
        #[arg(long, default_value_t = 25.0)]
        rate: f64,
        /// One scenario only: `off` (PFC only), `paper` or `nvidia` (default: all three).
        #[arg(long)]
        dcqcn: Option<String>,
        /// Simulated time, ms (measured over the last four fifths).
        #[arg(long, default_value_t = 25.0)]
        duration: f64,
        /// WRITEs each sender keeps outstanding (1..=64).
        #[arg(long, default_value_t = 4)]
        depth: u64,
        /// Run it for real instead: ferroce RNICs on DPDK through the emulated switch, in
        /// real time, slowed down K times (rates / K, times x K; the figures are the real,
        /// slowed ones).
        #[arg(long, value_name = "K")]
        dpdk: Option<f64>,
        /// CSV output (scenario,time_us,sender,goodput_gbps,queue_kb).
        #[arg(long)]
        csv: Option<PathBuf>,
        /// PNG plot.
        #[arg(long)]
        png: Option<PathBuf>,
    },
    /// The paper's and the firmware's DCQCN on the same flows.
    Compare {
        /// Flows.
        #[arg(long, default_value_t = 4)]
        flows: usize,
        /// Link rate, Gb/s.
        #[arg(long, default_value_t = 40.0)]
        rate: f64,
        /// Simulated time, ms.
        #[arg(long, default_value_t = 40.0)]
        duration: f64,
        /// PNG plot.
        #[arg(long)]
        png: Option<PathBuf>,
    },
}

fn ms(d: f64) -> Result<u64, String> {
    if !(d > 0.0 && d <= 10_000.0) {
        return Err(format!("--duration {d}: 0 < ms <= 10000"));
    }
    Ok((d * 1e6) as u64)
}

fn check_rate(r: f64) -> Result<f64, String> {
    if !(1.0..=1600.0).contains(&r) {
        return Err(format!("--rate {r}: 1..=1600 Gb/s"));
    }
    Ok(r)
}

fn count(n: usize, what: &str) -> Result<usize, String> {
    if !(1..=1024).contains(&n) {
        return Err(format!("--{what} {n}: 1..=1024"));
    }
    Ok(n)
}

fn run(cli: Cli) -> Result<(), String> {
    let mut out = std::io::stdout();
    match cli.cmd {
        Cmd::Dcqcn {
            flows,
            rate,
            preset,
            duration,
            stagger,
            csv,
            png,
        } => {
            let (n, rate, d) = (count(flows, "flows")?, check_rate(rate)?, ms(duration)?);
            let stagger_ns = match stagger {
                Some(s) if s >= 0.0 => (s * 1000.0) as u64,
                Some(s) => return Err(format!("--stagger {s}: not negative")),
                None => d / 4 / n as u64,
            };
            let o = st::dcqcn(n, rate, preset, d, stagger_ns);
            let all: Vec<usize> = (0..n).collect();
            st::print_summary(
                &format!("dcqcn {n} flows at {rate} Gb/s, {} preset", preset.name()),
                &st::summarise(&o, &all),
                &mut out,
            );
            println!(
                "fair share: {:.2} Gb/s of goodput per flow",
                rate * st::payload_share(1024) / n as f64
            );
            if let Some(p) = csv {
                st::write_csv(&p, &o)?;
            }
            if let Some(p) = png {
                st::dcqcn_figure(
                    &p,
                    &o,
                    &format!("{n} flows, {rate} Gb/s, {}", preset.name()),
                )?;
            }
        }
        Cmd::Incast {
            senders,
            rate,
            no_dcqcn,
            no_pfc,
            duration,
            csv,
            png,
        } => {
            let (n, rate, d) = (count(senders, "senders")?, check_rate(rate)?, ms(duration)?);
            let o = st::incast(n, rate, !no_dcqcn, !no_pfc, d);
            let all: Vec<usize> = (0..n).collect();
            let what = format!(
                "incast {n}:1 at {rate} Gb/s, DCQCN {}, PFC {}",
                if no_dcqcn { "off" } else { "on" },
                if no_pfc { "off" } else { "on" }
            );
            st::print_summary(&what, &st::summarise(&o, &all), &mut out);
            if let Some(p) = csv {
                st::write_csv(&p, &o)?;
            }
            if let Some(p) = png {
                st::incast_figure(&p, &o, &what)?;
            }
        }
        Cmd::Pfc {
            senders,
            rate,
            dcqcn,
            duration,
            csv,
            png,
        } => {
            let (n, rate, d) = (count(senders, "senders")?, check_rate(rate)?, ms(duration)?);
            let (o, victim) = st::pfc_victim(n, rate, dcqcn, d);
            let congested: Vec<usize> = (0..n).collect();
            let what = format!(
                "pfc: {n} senders into one port, sender 0 also to an idle port, {rate} Gb/s, DCQCN {}",
                if dcqcn { "on" } else { "off" }
            );
            st::print_summary(&what, &st::summarise(&o, &congested), &mut out);
            let half = d as f64 / 2000.0;
            println!(
                "victim flow {victim} (to the idle port): {:.2} Gb/s; without head-of-line \
                 blocking it could use its sender's spare link, {:.2} Gb/s",
                o.mean_goodput(victim, half),
                rate * st::payload_share(1024) * (1.0 - 1.0 / n as f64)
            );
            if let Some(p) = csv {
                st::write_csv(&p, &o)?;
            }
            if let Some(p) = png {
                st::pfc_figure(&p, &o, victim, &what)?;
            }
        }
        Cmd::Rnics {
            senders,
            rate,
            dcqcn,
            duration,
            depth,
            dpdk,
            csv,
            png,
        } => {
            let (n, d) = (count(senders, "senders")?, ms(duration)?);
            if !(1..=64).contains(&depth) {
                return Err(format!("--depth {depth}: 1..=64 WRITEs"));
            }
            let n = if n > 64 {
                return Err(format!("--senders {n}: 1..=64 RNICs"));
            } else {
                n
            };
            if !(1.0..=400.0).contains(&rate) {
                return Err(format!("--rate {rate}: 1..=400 Gb/s"));
            }
            let all = [
                ("pfc-only", None),
                ("dcqcn-paper", Some(Preset::Paper)),
                ("dcqcn-nvidia", Some(Preset::Nvidia)),
            ];
            let chosen: Vec<_> = match dcqcn.as_deref() {
                None => all.to_vec(),
                Some("off") => vec![all[0]],
                Some("paper") => vec![all[1]],
                Some("nvidia") => vec![all[2]],
                Some(x) => return Err(format!("--dcqcn {x}: off, paper or nvidia")),
            };
            use std::io::Write as _;
            let mut runs = Vec::new();
            if let Some(k) = dpdk {
                let spec = |preset| ferroce_tools::dpdk_incast::DpdkIncast {
                    senders: n,
                    depth,
                    gbps: rate,
                    slowdown: k,
                    preset,
                    duration_ns: d,
                };
                let link = spec(None).link_mbps() / 1000.0;
                let _ = writeln!(
                    out,
                    "{n}:1 incast of ferroce RNICs on DPDK through the emulated switch, the {rate} Gb/s scenario slowed {k}x: {link:.3} Gb/s links ({} us delay), 64 KiB WRITEs {depth} deep, {:.0} ms real time (measured from {:.0} ms); bottleneck payload share {:.3} Gb/s",
                    2.0 * k,
                    d as f64 * k / 1e6,
                    d as f64 * k / 5e6,
                    link * 4096.0 / 4174.0
                );
                for (name, preset) in chosen {
                    let o = ferroce_tools::dpdk_incast::run(&spec(preset))?;
                    st::print_rnics(name, &o, &mut out);
                    runs.push((name.to_string(), o));
                }
            } else {
                let _ = writeln!(
                    out,
                    "{n}:1 incast of ferroce RNICs, {rate} Gb/s links (1 us), 64 KiB WRITEs {depth} deep, {} ms simulated (measured from {} ms); bottleneck payload share {:.2} Gb/s",
                    d / 1_000_000,
                    d / 5_000_000,
                    rate * 4096.0 / 4174.0
                );
                for (name, preset) in chosen {
                    let o = st::rnics(n, depth, rate, preset, d);
                    st::print_rnics(name, &o, &mut out);
                    runs.push((name.to_string(), o));
                }
            }
            if let Some(p) = csv {
                st::rnics_csv(&p, &runs)?;
            }
            if let Some(p) = png {
                let (title, avg_us) = match dpdk {
                    Some(k) => (format!("{n}:1 on DPDK, {rate}/{k} Gb/s"), 1000.0 * k),
                    None => (format!("{n}:1, {rate} Gb/s"), 1000.0),
                };
                st::rnics_figure(&p, &runs, &title, avg_us)?;
            }
        }
        Cmd::Compare {
            flows,
            rate,
            duration,
            png,
        } => {
            let (n, rate, d) = (count(flows, "flows")?, check_rate(rate)?, ms(duration)?);
            let stagger = d / 4 / n as u64;
            let p = st::dcqcn(n, rate, Preset::Paper, d, stagger);
            let f = st::dcqcn(n, rate, Preset::Nvidia, d, stagger);
            let all: Vec<usize> = (0..n).collect();
            let what = |preset: &str| {
                format!(
                    "compare, {preset}: {n} flows into one {rate} Gb/s port, DCQCN on, {} ms",
                    d / 1_000_000
                )
            };
            st::print_summary(&what("paper"), &st::summarise(&p, &all), &mut out);
            st::print_summary(&what("nvidia"), &st::summarise(&f, &all), &mut out);
            if let Some(path) = png {
                st::compare_figure(&path, &p, &f, &format!("{n} flows, {rate} Gb/s"))?;
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    // Output piped into `head` and the like: end quietly when the reader goes (SIGPIPE's
    // default action), as rnic-ctl does, instead of a panic on EPIPE. rnic-sim holds
    // nothing to clean up.
    // SAFETY: resetting a signal's disposition before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    ferroce_tools::docgen::maybe_generate::<Cli>("rnic-sim");
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rnic-sim: {e}");
            ExitCode::from(2)
        }
    }
}
