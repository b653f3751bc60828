//! rnicd: runs a ferroce software RNIC on a DPDK port.
//!
//! `rnicd --config rnic.toml` (or `--port net_af_packet0,iface=tap0 --ip 10.99.0.3/24`).
//! It answers ARP, ping and IPv6 ND for its addresses and is a RoCEv2 endpoint; counters are
//! printed every `--stats` seconds and at exit (SIGINT/SIGTERM). `--check` validates the
//! configuration and exits.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use dataplane::runtime::Runtime;
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
    /// Validate the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Print counters every SECS seconds (0: only at exit).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    stats: u64,
    /// Stop after SECS seconds (0: run until SIGINT/SIGTERM).
    #[arg(long, default_value_t = 0, value_name = "SECS")]
    duration: u64,
}

fn print_stats(rt: &Runtime) {
    let s = rt.stats(0);
    println!(
        "rx {} (roce {} arp {} icmp {} pfc {} pause {} other {}) tx {} (roce {} neigh {}) | arp replies {} echo replies {} na {} | icrc errors {} no-qp {} | mbufs in use {}",
        s.nic.rx_frames, s.nic.rx_roce, s.nic.rx_arp, s.nic.rx_icmp, s.nic.rx_pfc, s.nic.rx_pause, s.nic.rx_other,
        s.nic.tx_frames, s.nic.tx_roce, s.nic.tx_neighbor,
        s.neigh.arp_replies_tx, s.neigh.echo_replies_tx, s.neigh.na_tx,
        s.dev.rx_icrc_encapsulated, s.dev.rx_dropped_no_qp, s.mbufs_in_use
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
    if cli.check {
        println!(
            "rnicd: configuration ok: {}",
            cfg.summary(cfg.mac.unwrap_or_default())
        );
        return ExitCode::SUCCESS;
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
