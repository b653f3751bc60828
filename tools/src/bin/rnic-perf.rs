//! rnic-perf: perftest's `ib_*_bw` / `ib_*_lat` and rdma-core's `ibv_rc_pingpong` /
//! `ibv_ud_pingpong` on a ferroce RNIC, compatible on the wire and over TCP with the
//! unmodified tools on the other end, in either role.
//!
//! `rnic-perf write_bw --loopback` runs both ends on two ferroce RNICs joined by an in-process
//! DPDK link; `rnic-perf write_bw --port net_af_packet0,iface=eth1 --ip 10.0.0.3/24 [SERVER]`
//! runs one end on a DPDK port.

use std::io::Write;
use std::net::TcpListener;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use dataplane::config::{RawConfig, RnicConfig};
use dataplane::runtime::Runtime;
use dataplane::worker::NicSnapshot;
use ferroce_tools::perf::pingpong::{self, PpArgs, PpKind};
use ferroce_tools::perf::run::{self, Endpoint};
use ferroce_tools::perf::{Kind, Params, PerfArgs, Verb};
use ferroce_tools::rnic_opts::{init_logging, RnicOpts};
use serde_json::{json, Value};

#[derive(Parser)]
#[command(
    name = "rnic-perf",
    version,
    about = "perftest and rdma-core pingpong on a ferroce software RNIC",
    after_help = "Run the server with no address and the client with the server's address, \
                  both with the same options (as with perftest). --loopback runs both ends \
                  in this process on two RNICs joined by a DPDK ring link."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// Options of the RNIC the test runs on.
#[derive(Debug, Clone, Args)]
struct Rnic {
    #[command(flatten)]
    opts: RnicOpts,
    /// Run server and client in this process on two ferroce RNICs joined by an in-process
    /// DPDK link (10.99.0.1 and 10.99.0.2); needs no port, hugepages or configuration.
    #[arg(long)]
    loopback: bool,
}

#[derive(Debug, Args)]
struct PerfCmd {
    #[command(flatten)]
    perf: PerfArgs,
    #[command(flatten)]
    rnic: Rnic,
}

#[derive(Debug, Args)]
struct PpCmd {
    #[command(flatten)]
    pp: PpArgs,
    #[command(flatten)]
    rnic: Rnic,
}

#[derive(Subcommand)]
#[allow(non_camel_case_types)]
#[command(rename_all = "snake_case")]
enum Cmd {
    /// RDMA WRITE bandwidth (ib_write_bw).
    write_bw(PerfCmd),
    /// RDMA READ bandwidth (ib_read_bw).
    read_bw(PerfCmd),
    /// SEND bandwidth (ib_send_bw).
    send_bw(PerfCmd),
    /// ATOMIC bandwidth (ib_atomic_bw).
    atomic_bw(PerfCmd),
    /// RDMA WRITE ping-pong latency (ib_write_lat).
    write_lat(PerfCmd),
    /// RDMA READ latency (ib_read_lat).
    read_lat(PerfCmd),
    /// SEND ping-pong latency (ib_send_lat).
    send_lat(PerfCmd),
    /// ATOMIC latency (ib_atomic_lat).
    atomic_lat(PerfCmd),
    /// RC SEND ping-pong (ibv_rc_pingpong).
    rc_pingpong(PpCmd),
    /// UD SEND ping-pong (ibv_ud_pingpong).
    ud_pingpong(PpCmd),
}

/// The loopback pair's configuration: like the tests' (`net_ring`, 10.99.0.`host`/24), path
/// MTU `mtu`, plus the user's `--set` overrides.
fn loopback_config(host: u8, mtu: u32, opts: &RnicOpts) -> Result<RnicConfig, String> {
    let mut r = RawConfig::default();
    let set = |r: &mut RawConfig, k: &str, v: &str| r.set(k, v).map_err(|e| e.to_string());
    set(&mut r, "port.device", "net_ring_loopback")?;
    set(&mut r, "address.mac", &format!("02:00:00:99:00:{host:02x}"))?;
    set(&mut r, "address.ipv4", &format!("10.99.0.{host}/24"))?;
    set(&mut r, "port.mtu", &(mtu + 200).max(1500).to_string())?;
    set(&mut r, "roce.path_mtu", &mtu.to_string())?;
    if let Some(e) = &opts.eal {
        set(&mut r, "eal.args", e)?;
    }
    for kv in &opts.set {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--set {kv:?}: expected KEY=VALUE"))?;
        set(&mut r, k.trim(), v.trim())?;
    }
    r.validate().map_err(|e| e.to_string())
}

fn counters_line(name: &str, cfg: &RnicConfig, s: &NicSnapshot) -> String {
    let mut parts = vec![format!(
        " {name} ({}): tx {} frames, rx {} frames",
        cfg.ipv4
            .first()
            .map(|a| a.addr.to_string())
            .unwrap_or_default(),
        s.nic.tx_frames,
        s.nic.rx_frames
    )];
    for (k, v) in s.qps.iter() {
        if v != 0 {
            parts.push(format!("{k} {v}"));
        }
    }
    parts.join(", ")
}

enum Job<'a> {
    Perf(&'a Params),
    Pp(PpKind, &'a PpArgs),
}

fn run_job<V: dataplane::Verbs>(
    ctx: V,
    job: &Job<'_>,
    ep: Endpoint,
    out: &mut dyn Write,
) -> Result<Value, String> {
    match job {
        Job::Perf(p) => run::run(ctx, p, ep, "ferroce0", out),
        Job::Pp(k, a) => pingpong::run(ctx, *k, a, ep, out),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging("warn");
    let (verb, kind, cmd_perf, cmd_pp) = match cli.cmd {
        Cmd::write_bw(c) => (Verb::Write, Kind::Bw, Some(c), None),
        Cmd::read_bw(c) => (Verb::Read, Kind::Bw, Some(c), None),
        Cmd::send_bw(c) => (Verb::Send, Kind::Bw, Some(c), None),
        Cmd::atomic_bw(c) => (Verb::Atomic, Kind::Bw, Some(c), None),
        Cmd::write_lat(c) => (Verb::Write, Kind::Lat, Some(c), None),
        Cmd::read_lat(c) => (Verb::Read, Kind::Lat, Some(c), None),
        Cmd::send_lat(c) => (Verb::Send, Kind::Lat, Some(c), None),
        Cmd::atomic_lat(c) => (Verb::Atomic, Kind::Lat, Some(c), None),
        Cmd::rc_pingpong(c) => (Verb::Send, Kind::Lat, None, Some((PpKind::Rc, c))),
        Cmd::ud_pingpong(c) => (Verb::Send, Kind::Lat, None, Some((PpKind::Ud, c))),
    };
    match go(verb, kind, cmd_perf, cmd_pp) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rnic-perf: {e}");
            ExitCode::from(1)
        }
    }
}

fn go(
    verb: Verb,
    kind: Kind,
    perf: Option<PerfCmd>,
    pp: Option<(PpKind, PpCmd)>,
) -> Result<(), String> {
    let (rnic, server, tcp_port, json_out, dev) = match (&perf, &pp) {
        (Some(c), _) => (
            c.rnic.clone(),
            c.perf.server.clone(),
            c.perf.tcp_port,
            c.perf.json,
            c.perf.ib_dev.clone(),
        ),
        (_, Some((_, c))) => (
            c.rnic.clone(),
            c.pp.server.clone(),
            c.pp.tcp_port,
            c.pp.json,
            c.pp.ib_dev.clone(),
        ),
        _ => unreachable!("one command"),
    };
    if let Some(d) = &dev {
        if d != "ferroce0" {
            return Err(format!(
                "IB device {d} not found (ferroce's device is ferroce0)"
            ));
        }
    }
    let mut out: Box<dyn Write> = if json_out {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let result = if rnic.loopback {
        if server.is_some() {
            return Err("--loopback runs both ends: give no server address".into());
        }
        if rnic.opts.port.is_some() || !rnic.opts.ip.is_empty() || rnic.opts.config.is_some() {
            return Err(
                "--loopback uses its own two RNICs: --port/--ip/--config do not apply".into(),
            );
        }
        let mtu = match (&perf, &pp) {
            (Some(c), _) => c.perf.mtu.unwrap_or(4096),
            _ => 4096,
        };
        // Flags first: a bad option is reported as such, before any RNIC starts.
        if let Some(c) = &perf {
            Params::from_args(verb, kind, &c.perf)?;
        }
        let a = loopback_config(1, mtu, &rnic.opts)?;
        let b = loopback_config(2, mtu, &rnic.opts)?;
        let rt = Runtime::loopback("rnic-perf", a, b).map_err(|e| e.to_string())?;
        let ctx_s = rt.open(0).map_err(|e| e.to_string())?;
        let ctx_c = rt.open(1).map_err(|e| e.to_string())?;
        let listener = TcpListener::bind(("127.0.0.1", 0)).map_err(|e| e.to_string())?;
        let port = listener.local_addr().map_err(|e| e.to_string())?.port();
        let (srv_params, cli_params, pp_srv, pp_cli);
        let (job_s, job_c) = match (&perf, &pp) {
            (Some(c), _) => {
                let mut sa = c.perf.clone();
                sa.server = None;
                let mut ca = c.perf.clone();
                ca.server = Some("127.0.0.1".into());
                srv_params = Params::from_args(verb, kind, &sa)?;
                cli_params = Params::from_args(verb, kind, &ca)?;
                (Job::Perf(&srv_params), Job::Perf(&cli_params))
            }
            (_, Some((k, c))) => {
                let mut sa = c.pp.clone();
                sa.server = None;
                let mut ca = c.pp.clone();
                ca.server = Some("127.0.0.1".into());
                pp_srv = sa;
                pp_cli = ca;
                (Job::Pp(*k, &pp_srv), Job::Pp(*k, &pp_cli))
            }
            _ => unreachable!(),
        };
        let (srv_res, cli_res) = std::thread::scope(|sc| {
            let h = sc.spawn(|| {
                let mut sink = Vec::new();
                let r = run_job(ctx_s, &job_s, Endpoint::Listen(listener), &mut sink);
                (r, sink)
            });
            let c = run_job(
                ctx_c,
                &job_c,
                Endpoint::Connect("127.0.0.1".into(), port),
                &mut *out,
            );
            if c.is_err() {
                // The server may still be waiting for its client: a connection that closes at
                // once ends its accept or read with an error.
                let _ = std::net::TcpStream::connect(("127.0.0.1", port));
            }
            (h.join(), c)
        });
        let (srv, srv_text) = match srv_res {
            Ok(x) => x,
            Err(_) => return Err("the server thread panicked".into()),
        };
        let snaps = rt.stop();
        let cfg0 = loopback_config(1, mtu, &rnic.opts)?;
        let cfg1 = loopback_config(2, mtu, &rnic.opts)?;
        let lines = [
            counters_line("ferroce0", &cfg0, &snaps[0]),
            counters_line("ferroce1", &cfg1, &snaps[1]),
        ];
        let (cli, srv) = match (cli_res, srv) {
            (Ok(c), Ok(s)) => (c, s),
            (c, s) => {
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
                let _ = writeln!(out, "{}", lines.join("\n"));
                return Err(msg.trim_end().to_string());
            }
        };
        let _ = writeln!(out, "{}", lines.join("\n"));
        json!({"client": cli, "server": srv, "counters": lines})
    } else {
        let cfg = rnic.opts.validate()?;
        let rt = Runtime::start("rnic-perf", vec![cfg.clone()]).map_err(|e| e.to_string())?;
        let ctx = rt.open(0).map_err(|e| e.to_string())?;
        let job_params;
        let job = match (&perf, &pp) {
            (Some(c), _) => {
                job_params = Params::from_args(verb, kind, &c.perf)?;
                Job::Perf(&job_params)
            }
            (_, Some((k, c))) => Job::Pp(*k, &c.pp),
            _ => unreachable!(),
        };
        let ep = match &server {
            Some(h) => Endpoint::Connect(h.clone(), tcp_port),
            None => Endpoint::Listen(
                ferroce_tools::perf::oob::Oob::listen(tcp_port)
                    .map_err(|e| format!("listen on TCP port {tcp_port}: {e}"))?,
            ),
        };
        let r = run_job(ctx, &job, ep, &mut *out);
        let snaps = rt.stop();
        let line = counters_line("ferroce0", &cfg, &snaps[0]);
        let r = r?;
        let _ = writeln!(out, "{line}");
        r
    };
    if json_out {
        println!(
            "{}",
            serde_json::to_string_pretty(&result).unwrap_or_default()
        );
    }
    Ok(())
}
