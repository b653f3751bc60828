//! rnicd: runs a ferroce software RNIC on a DPDK port.
//!
//! `rnicd --config rnic.toml` (or `--port net_af_packet0,iface=tap0 --ip 10.99.0.3/24`).
//! It answers ARP, ping and IPv6 ND for its addresses and is a RoCEv2 endpoint; counters are
//! printed every `--stats` seconds and at exit (SIGINT/SIGTERM), each by its rxe/mlx5 name.
//! `--check` validates the configuration and what can be known without starting the port;
//! `--print-config` prints the effective configuration. docs/rnic.example.toml shows every key.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use dataplane::config::Check;
use dataplane::runtime::Runtime;
use ferroce_tools::perf::driver::all_counters;
use ferroce_tools::rnic_opts::{init_logging, install_signal_handlers, stop_requested, RnicOpts};

#[derive(Parser)]
#[command(
    name = "rnicd",
    version,
    about = "ferroce: a software RoCEv2 RNIC on DPDK"
)]
struct Cli {
    #[command(flatten)]
    rnic: RnicOpts,
    /// Check the configuration (and what can be checked without starting the port) and
    /// exit: 0 if nothing is wrong, 2 otherwise.
    #[arg(long)]
    check: bool,
    /// Print the effective configuration (TOML, defaults included) and exit.
    #[arg(long)]
    print_config: bool,
    /// Print counters every SECS seconds (0: only at exit).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    stats: u64,
    /// Stop after SECS seconds (0: run until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    duration: u64,
}

/// Every non-zero counter by its rxe/mlx5 (or ferroce) name, port totals included.
fn print_stats(rt: &Runtime) {
    let s = rt.stats(0);
    let parts: Vec<String> = all_counters(&s)
        .into_iter()
        .filter(|(_, v)| *v != 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    println!(
        "rnicd: counters: {} mbufs_in_use {}",
        parts.join(", "),
        s.mbufs_in_use
    );
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging("warn,dataplane=info");
    let cfg = match cli.rnic.validate() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rnicd: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        print!("{}", cfg.to_toml());
        return ExitCode::SUCCESS;
    }
    if cli.check {
        println!("rnicd: configuration: {}", cfg.describe(None));
        let mut failed = false;
        for c in cfg.preflight() {
            match c {
                Check::Ok(m) => println!("rnicd: ok: {m}"),
                Check::Fail(m) => {
                    failed = true;
                    println!("rnicd: error: {m}");
                }
                Check::NeedsPort(m) => println!("rnicd: needs the port (not checked): {m}"),
            }
        }
        println!(
            "rnicd: {}",
            if failed {
                "configuration has errors"
            } else {
                "configuration ok"
            }
        );
        return if failed {
            ExitCode::from(2)
        } else {
            ExitCode::SUCCESS
        };
    }
    install_signal_handlers();
    let rt = match Runtime::start("rnicd", vec![cfg]) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rnicd: {e}");
            return ExitCode::from(1);
        }
    };
    let c = rt.config(0);
    println!("rnicd: up: {}", c.summary(rt.mac(0)));
    for (i, g) in c.gids(rt.mac(0)).iter().enumerate() {
        println!("rnicd: GID[{i}] {g}");
    }
    let start = Instant::now();
    let mut last = Instant::now();
    while !stop_requested() {
        std::thread::sleep(Duration::from_millis(100));
        if cli.duration > 0 && start.elapsed() >= Duration::from_secs(cli.duration) {
            break;
        }
        if cli.stats > 0 && last.elapsed() >= Duration::from_secs(cli.stats) {
            last = Instant::now();
            print_stats(&rt);
        }
    }
    print_stats(&rt);
    rt.stop();
    println!("rnicd: stopped");
    ExitCode::SUCCESS
}
