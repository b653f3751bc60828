//! rnic-perf: perftest's `ib_*_bw` / `ib_*_lat` and rdma-core's `ibv_rc_pingpong` /
//! `ibv_ud_pingpong` on a ferroce RNIC, compatible on the wire and over TCP with the
//! unmodified tools on the other end, in either role.
//!
//! `rnic-perf write_bw --loopback` runs both ends on two ferroce RNICs joined by an in-process
//! DPDK link; `rnic-perf write_bw --port net_af_packet0,iface=eth1 --ip 10.0.0.3/24 [SERVER]`
//! runs one end on a DPDK port.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ferroce_tools::perf::driver::{self, Job};
use ferroce_tools::perf::pingpong::{PpArgs, PpKind};
use ferroce_tools::perf::{Kind, PerfArgs, Verb};
use ferroce_tools::rnic_opts::{
    init_logging, install_signal_handlers, signal_exit_code, signal_name, stop_signal, RnicOpts,
};

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
    /// With --loopback: worker threads for the two RNICs (1: one drives both; 2: each its
    /// own, so the client's and the server's RNICs run on two cores).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=2))]
    workers: u32,
    /// Use an RNIC of a running rnicd instead of starting one in this process: the RNIC is
    /// named with -d (default ferroce0); SOCKET defaults to $FERROCE_SOCKET or
    /// /run/ferroce/rnicd.sock.
    #[arg(long, value_name = "SOCKET", num_args = 0..=1, default_missing_value = "")]
    rnicd: Option<String>,
    #[command(flatten)]
    switch: ferroce_tools::rnic_opts::SwitchOpts,
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

/// `--baseline`: each result row of the run as a fraction of this machine's memcpy of the
/// same message size, printed after the tables and added to the JSON as `baseline`.
fn with_baseline(v: &mut serde_json::Value, out: &mut dyn std::io::Write) {
    let rows = ["client", "server"]
        .iter()
        .map(|k| v[k]["results"].clone())
        .chain(std::iter::once(v["results"].clone()))
        .find(|r| r.as_array().is_some_and(|a| !a.is_empty()))
        .unwrap_or_default();
    let mut list = Vec::new();
    let _ = writeln!(
        out,
        " Baseline: memcpy of the message size on this machine, now (best, median and slowest of 7):"
    );
    let _ = writeln!(
        out,
        " #bytes     memcpy best[Gb/s]   median    slowest   this run avg[Gb/s]   fraction of best"
    );
    for row in rows.as_array().into_iter().flatten() {
        let (Some(bytes), Some(avg)) = (row["bytes"].as_u64(), row["bw_avg_Gbps"].as_f64()) else {
            continue;
        };
        let b = ferroce_tools::perf::baseline::memcpy(bytes as usize, 7);
        let g = |bps: f64| bps / 1e9;
        let frac = avg / g(b.best_bps);
        let _ = writeln!(
            out,
            " {bytes:<10} {:>17.1} {:>8.1} {:>10.1} {avg:>20.2} {frac:>18.4}",
            g(b.best_bps),
            g(b.median_bps),
            g(b.worst_bps)
        );
        list.push(serde_json::json!({
            "bytes": bytes,
            "memcpy_best_Gbps": g(b.best_bps),
            "memcpy_median_Gbps": g(b.median_bps),
            "memcpy_worst_Gbps": g(b.worst_bps),
            "bw_avg_Gbps": avg,
            "fraction_of_memcpy": frac,
        }));
    }
    if let Some(o) = v.as_object_mut() {
        o.insert("baseline".into(), serde_json::Value::Array(list));
    }
}

fn main() -> ExitCode {
    ferroce_tools::docgen::maybe_generate::<Cli>("rnic-perf");
    let cli = Cli::parse();
    init_logging("warn");
    // SIGINT/SIGTERM end the test cleanly: what was measured is printed, the capture is
    // flushed, DPDK's runtime directory removed, and the exit code is 128 + the signal.
    install_signal_handlers();
    if let Cmd::write_bw(c)
    | Cmd::read_bw(c)
    | Cmd::send_bw(c)
    | Cmd::atomic_bw(c)
    | Cmd::write_lat(c)
    | Cmd::read_lat(c)
    | Cmd::send_lat(c)
    | Cmd::atomic_lat(c) = &cli.cmd
    {
        if c.perf.version {
            // perftest prints its version; this is the one whose exchange ferroce speaks.
            println!(
                "Version: {} (rnic-perf {}, ferroce)",
                ferroce_tools::perf::oob::VERSION,
                env!("CARGO_PKG_VERSION")
            );
            return ExitCode::SUCCESS;
        }
    }
    let perf = |v, k, c: PerfCmd| {
        let mtu = c.perf.mtu.unwrap_or(4096);
        let (json, dev) = (c.perf.json, c.perf.ib_dev.clone());
        (Job::Perf(v, k, c.perf), c.rnic, mtu, json, dev)
    };
    let pp = |k, c: PpCmd| {
        let (json, dev) = (c.pp.json, c.pp.ib_dev.clone());
        (Job::Pp(k, c.pp), c.rnic, 4096, json, dev)
    };
    let (job, rnic, mtu, json_out, dev) = match cli.cmd {
        Cmd::write_bw(c) => perf(Verb::Write, Kind::Bw, c),
        Cmd::read_bw(c) => perf(Verb::Read, Kind::Bw, c),
        Cmd::send_bw(c) => perf(Verb::Send, Kind::Bw, c),
        Cmd::atomic_bw(c) => perf(Verb::Atomic, Kind::Bw, c),
        Cmd::write_lat(c) => perf(Verb::Write, Kind::Lat, c),
        Cmd::read_lat(c) => perf(Verb::Read, Kind::Lat, c),
        Cmd::send_lat(c) => perf(Verb::Send, Kind::Lat, c),
        Cmd::atomic_lat(c) => perf(Verb::Atomic, Kind::Lat, c),
        Cmd::rc_pingpong(c) => pp(PpKind::Rc, c),
        Cmd::ud_pingpong(c) => pp(PpKind::Ud, c),
    };
    if let Some(d) = dev.as_ref().filter(|_| rnic.rnicd.is_none()) {
        if d != "ferroce0" {
            eprintln!("rnic-perf: IB device {d} not found (ferroce's device is ferroce0)");
            return ExitCode::from(1);
        }
    }
    // With --json, stdout carries only the JSON document; the tables go to stderr.
    let mut out: Box<dyn Write> = if json_out {
        Box::new(std::io::stderr())
    } else {
        Box::new(std::io::stdout())
    };
    let r = if rnic.switch.asked() && !rnic.loopback {
        Err("the emulated switch (--switch-*) joins the two RNICs of --loopback".to_string())
    } else if rnic.workers != 1 && !rnic.loopback {
        Err(
            "--workers spreads the two RNICs of --loopback over worker threads (an RNIC on a \
             port or in rnicd has its own: worker.thread)"
                .to_string(),
        )
    } else if let Some(sock) = &rnic.rnicd {
        if rnic.loopback || rnic.opts.any() {
            Err(
                "--rnicd uses rnicd's RNIC: --loopback and the RNIC options (--port, --ip, \
                 --config, --set...) belong to rnicd"
                    .to_string(),
            )
        } else {
            let sock = (!sock.is_empty()).then(|| PathBuf::from(sock));
            driver::via_rnicd(&job, sock.as_deref(), dev.as_deref(), &mut *out)
        }
    } else if rnic.loopback {
        driver::loopback(&job, mtu, &rnic.opts, &rnic.switch, rnic.workers, &mut *out)
    } else {
        driver::on_port(&job, &rnic.opts, &mut *out)
    };
    let baseline = matches!(&job, Job::Perf(_, Kind::Bw, a) if a.baseline);
    match r {
        Ok(mut v) => {
            if baseline {
                with_baseline(&mut v, &mut *out);
            }
            if json_out {
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            let stopped = stop_signal();
            let msg = match stopped {
                Some(sig) => format!("stopped by {}", signal_name(sig)),
                None => e.clone(),
            };
            if json_out {
                // A failed run still gives one JSON document, with the error and whatever it
                // measured before (rows, verified messages, counters): a run of one side
                // has its document's fields at the top, as a successful run.
                let mut v = serde_json::json!({"error": msg, "interrupted": stopped.is_some()});
                let mut partial = ferroce_tools::perf::take_partial();
                let sides = ["client", "server"]
                    .iter()
                    .filter(|k| partial.contains_key(**k))
                    .count();
                let obj = v.as_object_mut().expect("an object");
                if sides == 1 && !rnic.loopback {
                    for k in ["client", "server"] {
                        if let Some(serde_json::Value::Object(d)) = partial.remove(k) {
                            for (f, x) in d {
                                obj.entry(f).or_insert(x);
                            }
                        }
                    }
                }
                for (k, x) in partial {
                    obj.insert(k, x);
                }
                println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            }
            eprintln!("rnic-perf: {msg}");
            match stopped {
                Some(sig) => ExitCode::from(signal_exit_code(sig)),
                None => ExitCode::from(1),
            }
        }
    }
}
