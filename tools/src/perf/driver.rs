//! Running a test: on two RNICs in this process joined by a DPDK ring link (`--loopback`),
//! or on one RNIC on a DPDK port against a peer over the network. Shared by `rnic-perf` and
//! the end-to-end benchmark.

use std::io::Write;
use std::net::TcpListener;

use dataplane::config::RnicConfig;
use dataplane::runtime::Runtime;
use dataplane::worker::NicSnapshot;
use serde_json::{json, Value};

use super::pingpong::{self, PpArgs, PpKind};
use super::run::{self, Endpoint};
use super::{Kind, Params, PerfArgs, Verb};
use crate::rnic_opts::RnicOpts;

/// What to run.
#[derive(Debug, Clone)]
pub enum Job {
    /// A perftest tool.
    Perf(Verb, Kind, PerfArgs),
    /// An rdma-core pingpong.
    Pp(PpKind, PpArgs),
}

impl Job {
    fn server_addr(&self) -> Option<&String> {
        match self {
            Job::Perf(_, _, a) => a.server.as_ref(),
            Job::Pp(_, a) => a.server.as_ref(),
        }
    }

    /// Whether only one figure is printed (`--output`): no counter lines then.
    fn quiet(&self) -> bool {
        matches!(self, Job::Perf(_, _, a) if a.output.is_some())
    }

    /// Whether the job exchanges over rdma_cm (`-R`).
    fn rdma_cm(&self) -> bool {
        matches!(self, Job::Perf(_, _, a) if a.rdma_cm)
    }

    fn tcp_port(&self) -> u16 {
        match self {
            Job::Perf(_, _, a) => a.tcp_port,
            Job::Pp(_, a) => a.tcp_port,
        }
    }

    /// The same job as server (no address) or as client of `addr`.
    fn with_server(&self, addr: Option<&str>) -> Job {
        match self {
            Job::Perf(v, k, a) => {
                let mut a = a.clone();
                a.server = addr.map(String::from);
                Job::Perf(*v, *k, a)
            }
            Job::Pp(k, a) => {
                let mut a = a.clone();
                a.server = addr.map(String::from);
                Job::Pp(*k, a)
            }
        }
    }

    /// Checks the flags (a bad option is reported before any RNIC starts).
    pub fn validate(&self) -> Result<(), String> {
        if let Job::Perf(v, k, a) = self {
            Params::from_args(*v, *k, a)?;
        }
        Ok(())
    }

    fn run<V: dataplane::Verbs + ferroce_host::app::RdmaCm>(
        &self,
        ctx: V,
        ep: Endpoint,
        dev: &str,
        out: &mut dyn Write,
    ) -> Result<Value, String> {
        match self {
            Job::Perf(v, k, a) => {
                let p = Params::from_args(*v, *k, a)?;
                run::run(ctx, &p, ep, dev, out)
            }
            Job::Pp(k, a) => pingpong::run(ctx, *k, a, ep, out),
        }
    }
}

/// An emulated switch's counters as JSON (`counters.switch` of rnic-perf's output).
pub fn switch_json(s: &dataplane::switch::SwitchStats) -> Value {
    json!({
        "rx_frames": s.model.rx_frames,
        "tx_frames": s.model.tx_frames,
        "ecn_marked": s.model.marked,
        "pfc_xoff": s.model.pfc_xoff,
        "pfc_xon": s.model.pfc_xon,
        "drops_buffer": s.model.drops[1],
        "drops_ingress": s.model.drops[2],
        "drops_delay_line": s.delay_dropped,
        "drops_nombuf": s.nombuf,
        "peak_queue_bytes": s.model.peak_queue,
        "flooded": s.flooded,
    })
}

/// One line of an emulated switch's counters.
pub fn switch_line(s: &dataplane::switch::SwitchStats) -> String {
    let m = &s.model;
    let peaks: Vec<String> = m
        .peak_queue
        .iter()
        .enumerate()
        .map(|(i, q)| format!("port {i} {} KB", q / 1000))
        .collect();
    format!(
        " switch: frames {} in {} out, ECN marked {}, PFC XOFF {} XON {}, drops {} (buffer) {} (ingress) {} (delay line full) {} (no mbuf), peak queue {}, flooded {}",
        m.rx_frames,
        m.tx_frames,
        m.marked,
        m.pfc_xoff,
        m.pfc_xon,
        m.drops[1],
        m.drops[2],
        s.delay_dropped,
        s.nombuf,
        peaks.join(", "),
        s.flooded
    )
}

/// The loopback pair's configuration: like the tests' (`net_ring`, 10.99.0.`host`/24), path
/// MTU `mtu`, plus the user's `--set` overrides.
pub fn loopback_config(host: u8, mtu: u32, opts: &RnicOpts) -> Result<RnicConfig, String> {
    let mut r = dataplane::runtime::loopback_raw_config(host, mtu);
    opts.apply_overrides(&mut r)?;
    r.validate().map_err(|e| e.to_string())
}

/// Every counter of an RNIC by name (port, neighbour, engine device counters and the port
/// totals of the QP counters), in that order.
pub fn all_counters(s: &NicSnapshot) -> Vec<(&'static str, u64)> {
    s.nic
        .iter()
        .chain(s.neigh.iter())
        .chain(s.dev.iter())
        .chain(s.qps.iter())
        .collect()
}

/// An RNIC's counters as a JSON object of numbers (every counter, zeros included).
pub fn counters_json(s: &NicSnapshot) -> Value {
    Value::Object(
        all_counters(s)
            .into_iter()
            .map(|(k, v)| (k.to_string(), Value::from(v)))
            .collect(),
    )
}

/// One line of an RNIC's counters: every non-zero one, by its rxe/mlx5 (or ferroce) name.
pub fn counters_line(name: &str, cfg: &RnicConfig, s: &NicSnapshot) -> String {
    let mut parts = vec![format!(
        " {name} ({}):",
        cfg.ipv4
            .first()
            .map(|a| a.addr.to_string())
            .unwrap_or_default(),
    )];
    let nonzero: Vec<String> = all_counters(s)
        .into_iter()
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    parts.push(nonzero.join(", "));
    parts.join(" ")
}

/// Runs `job` on two ferroce RNICs in this process joined back to back by a DPDK ring link
/// (10.99.0.1 serves, 10.99.0.2 is the client; path MTU `mtu`), on one worker thread or,
/// with `workers` 2, one each. The client's text goes to
/// `out`. Returns `{"client", "server", "counters"}`.
pub fn loopback(
    job: &Job,
    mtu: u32,
    opts: &RnicOpts,
    switch: &crate::rnic_opts::SwitchOpts,
    workers: u32,
    out: &mut dyn Write,
) -> Result<Value, String> {
    if job.server_addr().is_some() {
        return Err("--loopback runs both ends: give no server address".into());
    }
    if opts.port.is_some() || !opts.ip.is_empty() || opts.config.is_some() || opts.mac.is_some() {
        return Err(
            "--loopback uses its own two RNICs (02:00:00:99:00:01/10.99.0.1 and \
             02:00:00:99:00:02/10.99.0.2): --port/--ip/--mac/--config do not apply"
                .into(),
        );
    }
    job.validate()?;
    let mut cfg0 = loopback_config(1, mtu, opts)?;
    let mut cfg1 = loopback_config(2, mtu, opts)?;
    if workers == 2 {
        // The server's RNIC on a worker thread of its own (worker.thread).
        (cfg0.worker_thread, cfg1.worker_thread) = (0, 1);
    }
    let settings = switch.settings()?;
    let rt = match &settings {
        None => Runtime::loopback("rnic-perf", cfg0.clone(), cfg1.clone()),
        Some(s) => {
            if let dcb::pfc::Mode::Pfc { .. } = s.pfc {
                for c in [&mut cfg0, &mut cfg1] {
                    c.pfc.mode = s.pfc;
                    c.pfc
                        .check_reachable(c.mbufs)
                        .map_err(|e| format!("with --switch-pfc: {e}"))?;
                }
            }
            Runtime::switched("rnic-perf", vec![cfg0.clone(), cfg1.clone()], s)
        }
    }
    .map_err(|e| e.to_string())?;
    let ctx_s = rt.open(0).map_err(|e| e.to_string())?;
    let ctx_c = rt.open(1).map_err(|e| e.to_string())?;
    let v6 = matches!(job, Job::Perf(_, _, a) if a.ipv6);
    let (host, ep_s, ep_c, port) = if job.rdma_cm() {
        // -R: the exchange on rdma_cm connections of second contexts of the same RNICs; the
        // client names the server RNIC's address.
        let ip0 = cfg0
            .ipv4
            .first()
            .map(|a| a.addr)
            .ok_or("--loopback: the server RNIC has no IPv4 address")?;
        let port = job.tcp_port();
        let comm_s = rt.open(0).map_err(|e| e.to_string())?;
        let comm_c = rt.open(1).map_err(|e| e.to_string())?;
        // The server gives up once its client cannot have come any more.
        let wait = Some(run::CONNECT_PATIENCE * 2);
        (
            ip0.to_string(),
            super::cm::comm(comm_s, None, port, wait),
            super::cm::comm(comm_c, Some(ip0), port, None),
            port,
        )
    } else {
        let host = if v6 { "::1" } else { "127.0.0.1" };
        let listener = TcpListener::bind((host, 0)).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        (
            host.to_string(),
            Endpoint::Listen(listener),
            Endpoint::Connect(host.into(), port),
            port,
        )
    };
    let job_s = job.with_server(None);
    let job_c = job.with_server(Some(&host));
    let (srv_res, cli_res) = std::thread::scope(|sc| {
        let h = sc.spawn(|| {
            let mut sink = Vec::new();
            let r = job_s.run(ctx_s, ep_s, "ferroce0", &mut sink);
            (r, sink)
        });
        let c = job_c.run(ctx_c, ep_c, "ferroce1", &mut *out);
        if c.is_err() && !job.rdma_cm() {
            // The server may still be waiting for its client: a connection that closes at
            // once ends its accept or read with an error.
            let _ = std::net::TcpStream::connect((host.as_str(), port));
        }
        (h.join(), c)
    });
    let (srv, srv_text) = match srv_res {
        Ok(x) => x,
        Err(_) => return Err("the server thread panicked".into()),
    };
    let sw = rt.switch_stats(0);
    let snaps = rt.stop();
    let mut lines = vec![
        counters_line("ferroce0", &cfg0, &snaps[0]),
        counters_line("ferroce1", &cfg1, &snaps[1]),
    ];
    if let Some(s) = &sw {
        lines.push(switch_line(s));
    }
    if !job.quiet() {
        let _ = writeln!(out, "{}", lines.join("\n"));
    }
    let mut counters =
        json!({"ferroce0": counters_json(&snaps[0]), "ferroce1": counters_json(&snaps[1])});
    if let Some(s) = &sw {
        counters["switch"] = switch_json(s);
    }
    match (cli_res, srv) {
        (Ok(c), Ok(s)) => Ok(json!({
            "client": c,
            "server": s,
            "counters": counters,
        })),
        (c, s) => {
            super::keep_partial("counters", counters);
            let mut msg = String::new();
            if let Err(e) = c {
                msg += &format!("client side: {e}\n");
            }
            if let Err(e) = s {
                msg += &format!(
                    "server side: {e}\nserver output:\n{}",
                    String::from_utf8_lossy(&srv_text)
                );
            }
            Err(msg.trim_end().to_string())
        }
    }
}

/// Runs `job` on RNIC `device` (default `ferroce0`) of the rnicd listening on `socket`
/// (default: `$FERROCE_SOCKET` or /run/ferroce/rnicd.sock): this process is rnicd's client,
/// its posts and completions go through shared memory. As server or client per the job.
pub fn via_rnicd(
    job: &Job,
    socket: Option<&std::path::Path>,
    device: Option<&str>,
    out: &mut dyn Write,
) -> Result<Value, String> {
    job.validate()?;
    let ctx = ferroce_host::app::remote::connect(socket, device).map_err(|e| e.to_string())?;
    let name = device.unwrap_or("ferroce0").to_string();
    let ep = if job.rdma_cm() {
        let comm = ferroce_host::app::remote::connect(socket, device).map_err(|e| e.to_string())?;
        cm_endpoint(job, comm)?
    } else {
        endpoint(job)?
    };
    let r = job.run(ctx, ep, &name, out);
    if !job.quiet() {
        // The RNIC's counters as rnicd reports them (the RNIC is shared: they count every
        // client's traffic).
        if let Ok(mut a) = ferroce_host::app::remote::Admin::connect(socket) {
            if let Ok(ferroce_host::abi::proto::ReplyBody::Stats(s)) =
                a.request(ferroce_host::abi::proto::AdminRequest::Stats { qps: false })
            {
                if let Some(d) = s.iter().find(|d| d.device == name) {
                    let nonzero: Vec<String> = d
                        .port
                        .iter()
                        .filter(|(_, v)| *v != 0)
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect();
                    let _ = writeln!(out, " {name} (rnicd): {}", nonzero.join(", "));
                }
            }
        }
    }
    r
}

/// Where `job` meets its peer: the job's server address (as client) or, as server, a
/// listener on the job's TCP port.
fn endpoint(job: &Job) -> Result<Endpoint, String> {
    let port = job.tcp_port();
    Ok(match job.server_addr() {
        Some(h) => Endpoint::Connect(h.clone(), port),
        None => {
            let v6 = matches!(job, Job::Perf(_, _, a) if a.ipv6);
            Endpoint::Listen(
                super::oob::Oob::listen(port, v6)
                    .map_err(|e| format!("listen on TCP port {port}: {e}"))?,
            )
        }
    })
}

/// `-R`: the exchange on `comm`, a second context on the test's RNIC, as client of the job's
/// server address (the server RNIC's IPv4 address, or a name for one) or as server on the
/// job's port.
fn cm_endpoint<V: dataplane::Verbs + ferroce_host::app::RdmaCm + Send + 'static>(
    job: &Job,
    comm: V,
) -> Result<Endpoint, String> {
    let server = match job.server_addr() {
        Some(h) => Some(super::cm::resolve(h)?),
        None => None,
    };
    Ok(super::cm::comm(comm, server, job.tcp_port(), None))
}

/// Runs `job` on one RNIC on the DPDK port `opts` describes, against a peer on the network:
/// as server (listening on the job's TCP port) or as client of the job's server address.
pub fn on_port(job: &Job, opts: &RnicOpts, out: &mut dyn Write) -> Result<Value, String> {
    job.validate()?;
    let cfg = opts.validate()?;
    let rt = Runtime::start("rnic-perf", vec![cfg.clone()]).map_err(|e| e.to_string())?;
    let ctx = rt.open(0).map_err(|e| e.to_string())?;
    let ep = if job.rdma_cm() {
        cm_endpoint(job, rt.open(0).map_err(|e| e.to_string())?)?
    } else {
        endpoint(job)?
    };
    let r = job.run(ctx, ep, "ferroce0", out);
    let sw = rt.switch_stats(0);
    let snaps = rt.stop();
    if !job.quiet() {
        let _ = writeln!(out, "{}", counters_line("ferroce0", &cfg, &snaps[0]));
        // The RNIC's [switch], if any.
        if let Some(s) = &sw {
            let _ = writeln!(out, "{}", switch_line(s));
        }
    }
    let mut counters = json!({"ferroce0": counters_json(&snaps[0])});
    if let Some(s) = &sw {
        counters["switch"] = switch_json(s);
    }
    match r {
        // The RNIC's counters beside the results, as the loopback driver reports them.
        Ok(Value::Object(mut m)) => {
            m.insert("counters".into(), counters);
            Ok(Value::Object(m))
        }
        Ok(v) => Ok(v),
        Err(e) => {
            super::keep_partial("counters", counters);
            Err(e)
        }
    }
}
