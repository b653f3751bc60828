//! rnicd: the ferroce RNIC daemon. It runs one software RNIC per DPDK port (`ferroce0`,
//! `ferroce1`, ...) and serves them to applications in other processes through a Unix socket
//! and shared-memory rings (docs/host-protocol.md): `rnic-perf --rnicd`, the C client library
//! and `rnic-ctl` attach to it.
//!
//! `rnicd --config rnic.toml` (or `--port net_af_packet0,iface=tap0 --ip 10.99.0.3/24`;
//! `--rnic FILE` adds RNICs); `rnicd --loopback` runs two RNICs joined by an in-process DPDK
//! ring link (10.99.0.1 and 10.99.0.2), so two processes can move RDMA traffic with no NIC.
//! Each RNIC answers ARP, ping and IPv6 ND for its addresses. Counters are printed every
//! `--stats` seconds and at exit (SIGINT/SIGTERM), each by its rxe/mlx5 name. `--check`
//! validates the configuration without starting anything; `--print-config` prints the
//! effective configuration. docs/rnic.example.toml shows every key.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use dataplane::config::{Check, RawConfig, RnicConfig};
use dataplane::daemon::Daemon;
use dataplane::runtime::Runtime;
use dataplane::worker::{NicSnapshot, WorkerLoad};
use ferroce_tools::perf::driver::all_counters;
use ferroce_tools::rnic_opts::{init_logging, install_signal_handlers, stop_requested, RnicOpts};

#[derive(Parser)]
#[command(
    name = "rnicd",
    version,
    about = "ferroce: software RoCEv2 RNICs on DPDK, served to applications over a Unix socket"
)]
struct Cli {
    #[command(flatten)]
    rnic: RnicOpts,
    /// Run two RNICs (ferroce0 at 10.99.0.1, ferroce1 at 10.99.0.2) joined by an in-process
    /// DPDK ring link: applications in two processes move RDMA traffic with no NIC.
    #[arg(long)]
    loopback: bool,
    /// Path MTU of the --loopback RNICs (256, 512, 1024, 2048 or 4096).
    #[arg(long, default_value_t = 4096, value_name = "BYTES", value_parser = clap::value_parser!(u32).range(256..=4096))]
    loopback_mtu: u32,
    /// With --loopback: worker threads for its two RNICs (1: one drives both; 2: each its
    /// own). RNICs from files choose theirs with worker.thread.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=2))]
    workers: u32,
    #[command(flatten)]
    switch: ferroce_tools::rnic_opts::SwitchOpts,
    /// A further RNIC, configured by its own file (ferroce1, ferroce2, ... in order;
    /// repeatable). The [host] section of the first configuration applies.
    #[arg(long = "rnic", value_name = "FILE")]
    more: Vec<PathBuf>,
    /// The Unix socket to listen on (overrides host.socket; default /run/ferroce/rnicd.sock).
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
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

/// Writes a line to stdout, as `println!` but never panicking: rnicd goes on serving its
/// clients when the reader of its output goes away (`rnicd --stats 1 | head`).
macro_rules! say {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

/// Every non-zero counter of each RNIC by its rxe/mlx5 (or ferroce) name, port totals
/// included.
fn print_stats(names: &[String], snaps: &[NicSnapshot]) {
    for (name, s) in names.iter().zip(snaps) {
        let parts: Vec<String> = all_counters(s)
            .into_iter()
            .filter(|(_, v)| *v != 0)
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        say!(
            "rnicd: {name} counters: {} mbufs_in_use {} clients {}",
            parts.join(", "),
            s.mbufs_in_use,
            s.hosts
        );
    }
}

/// One line per worker thread: its RNICs and, since the last print (`prev`, updated), the
/// share of the time it was busy, its iterations and how many an application thread ran.
fn print_workers(rt: &Runtime, names: &[String], prev: &mut Vec<WorkerLoad>) {
    for w in 0..rt.workers() {
        let Some((load, rnics)) = rt.worker_load(w) else {
            continue;
        };
        let before = prev.get(w).copied().unwrap_or_default();
        let polls = load.polls.saturating_sub(before.polls);
        let driven = load.driven_polls.saturating_sub(before.driven_polls);
        let rnics: Vec<&str> = rnics.iter().map(|&i| names[i].as_str()).collect();
        say!(
            "rnicd: worker{w} ({}): busy {:.1}%, {polls} polls ({driven} by applications), {} sleeps",
            rnics.join(", "),
            100.0 * load.busy_since(&before),
            load.sleeps.saturating_sub(before.sleeps),
        );
        if prev.len() <= w {
            prev.resize(w + 1, WorkerLoad::default());
        }
        prev[w] = load;
    }
}

/// The configurations of every RNIC, in order.
fn configs(cli: &Cli) -> Result<Vec<RnicConfig>, String> {
    let socket = |raw: &mut RawConfig| -> Result<(), String> {
        if let Some(s) = &cli.socket {
            raw.set("host.socket", &s.display().to_string())
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    if cli.loopback {
        let o = &cli.rnic;
        if o.port.is_some() || !o.ip.is_empty() || o.config.is_some() || o.mac.is_some() {
            return Err(
                "--loopback makes its own two RNICs (02:00:00:99:00:01/10.99.0.1 and \
                        02:00:00:99:00:02/10.99.0.2): --port/--ip/--mac/--config do not apply"
                    .into(),
            );
        }
        if !cli.more.is_empty() {
            return Err("--loopback makes its own two RNICs: --rnic does not apply".into());
        }
        return [1u8, 2]
            .iter()
            .map(|&h| {
                let mut r = dataplane::runtime::loopback_raw_config(h, cli.loopback_mtu);
                o.apply_overrides(&mut r)?;
                if cli.workers == 2 {
                    r.set("worker.thread", &(h - 1).to_string())
                        .map_err(|e| e.to_string())?;
                }
                socket(&mut r)?;
                r.validate().map_err(|e| e.to_string())
            })
            .collect();
    }
    if cli.workers != 1 {
        return Err(
            "--workers spreads the two RNICs of --loopback over worker threads: RNICs from \
             files choose theirs with worker.thread"
                .into(),
        );
    }
    let mut first = cli.rnic.raw()?;
    socket(&mut first)?;
    let mut out = vec![first.validate().map_err(|e| e.to_string())?];
    for f in &cli.more {
        let raw = RawConfig::load(f).map_err(|e| format!("{}: {e}", f.display()))?;
        out.push(
            raw.validate()
                .map_err(|e| format!("{}: {e}", f.display()))?,
        );
    }
    Ok(out)
}

/// `--check`: exit 0 when rnicd could start here, 1 when the configuration is right but this
/// machine lacks something it names (an interface), 2 when the configuration has errors.
fn check(cfgs: &[RnicConfig]) -> ExitCode {
    let (mut failed, mut not_ready) = (false, false);
    for (i, cfg) in cfgs.iter().enumerate() {
        say!("rnicd: ferroce{i}: configuration: {}", cfg.describe(None));
        for c in cfg.preflight() {
            match c {
                Check::Ok(m) => say!("rnicd: ok: {m}"),
                Check::Fail(m) => {
                    failed = true;
                    say!("rnicd: error: {m}");
                }
                Check::NotReady(m) => {
                    not_ready = true;
                    say!("rnicd: not here: {m}");
                }
                Check::NeedsPort(m) => say!("rnicd: needs the port (not checked): {m}"),
            }
        }
    }
    let (verdict, code) = match (failed, not_ready) {
        (true, _) => ("configuration has errors", 2),
        (false, true) => (
            "configuration ok, but this machine lacks what it names (rnicd would not start here now)",
            1,
        ),
        (false, false) => ("configuration ok", 0),
    };
    say!("rnicd: {verdict}");
    ExitCode::from(code)
}

/// Every emulated switch's counters, a line each.
fn print_switches(rt: &dataplane::runtime::Runtime) {
    let mut i = 0;
    while let Some(s) = rt.switch_stats(i) {
        say!("{}", ferroce_tools::perf::driver::switch_line(&s));
        i += 1;
    }
}

fn main() -> ExitCode {
    ferroce_tools::docgen::maybe_generate::<Cli>("rnicd");
    let cli = Cli::parse();
    init_logging("warn,dataplane=info");
    let cfgs = match configs(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rnicd: {e}");
            return ExitCode::from(2);
        }
    };
    if cli.print_config {
        for (i, c) in cfgs.iter().enumerate() {
            if cfgs.len() > 1 {
                say!("# ferroce{i}");
            }
            say!("{}", c.to_toml().trim_end_matches('\n'));
        }
        return ExitCode::SUCCESS;
    }
    if cli.check {
        return check(&cfgs);
    }
    install_signal_handlers();
    let host = cfgs[0].host.clone();
    if let Err(e) = dataplane::daemon::check_socket(&host) {
        eprintln!("rnicd: {e}");
        return ExitCode::from(1);
    }
    let switch = match cli.switch.settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rnicd: {e}");
            return ExitCode::from(2);
        }
    };
    let started = if let (true, Some(s)) = (cli.loopback, &switch) {
        let mut cfgs = cfgs.clone();
        if let dcb::pfc::Mode::Pfc { .. } = s.pfc {
            for c in cfgs.iter_mut() {
                c.pfc.mode = s.pfc;
                if let Err(e) = c.pfc.check_reachable(c.mbufs) {
                    eprintln!("rnicd: with --switch-pfc: {e}");
                    return ExitCode::from(2);
                }
            }
        }
        Runtime::switched("rnicd", cfgs, s)
    } else if cli.loopback {
        Runtime::loopback("rnicd", cfgs[0].clone(), cfgs[1].clone())
    } else if cli.switch.asked() {
        eprintln!("rnicd: the emulated switch (--switch-*) joins the two RNICs of --loopback");
        return ExitCode::from(2);
    } else {
        Runtime::start("rnicd", cfgs.clone())
    };
    let rt = match started {
        Ok(r) => r,
        Err(e) => {
            eprintln!("rnicd: {e}");
            return ExitCode::from(1);
        }
    };
    for i in 0..rt.len() {
        let c = rt.config(i);
        say!("rnicd: ferroce{i} up: {}", c.summary(rt.mac(i)));
        for (g, gid) in c.gids(rt.mac(i)).iter().enumerate() {
            say!("rnicd: ferroce{i} GID[{g}] {gid}");
        }
        // What --check would call wrong (no IP address, PFC that cannot pause...) is said
        // at start too: the RNIC runs, but not as its configuration meant.
        for check in c.preflight() {
            if let dataplane::config::Check::Fail(m) = check {
                eprintln!("rnicd: warning: ferroce{i}: {m}");
            }
        }
    }
    let daemon = match Daemon::start(rt, &host) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("rnicd: {e}");
            return ExitCode::from(1);
        }
    };
    say!(
        "rnicd: listening on {} (mode {:04o}{})",
        daemon.socket().display(),
        host.mode,
        host.group
            .as_ref()
            .map(|g| format!(", group {g}"))
            .unwrap_or_default()
    );
    let names = daemon.names().to_vec();
    let start = Instant::now();
    let mut last = Instant::now();
    let mut failed = false;
    // Each worker's load at the last print, for the share of the interval it was busy.
    let mut loads = Vec::new();
    while !stop_requested() {
        std::thread::sleep(Duration::from_millis(100));
        if cli.duration > 0 && start.elapsed() >= Duration::from_secs(cli.duration) {
            break;
        }
        if !daemon.runtime().alive() {
            eprintln!("rnicd: the worker stopped unexpectedly");
            failed = true;
            break;
        }
        if cli.stats > 0 && last.elapsed() >= Duration::from_secs(cli.stats) {
            last = Instant::now();
            let snaps: Vec<_> = (0..names.len())
                .map(|i| daemon.runtime().stats(i))
                .collect();
            print_stats(&names, &snaps);
            print_switches(daemon.runtime());
            print_workers(daemon.runtime(), &names, &mut loads);
        }
    }
    print_switches(daemon.runtime());
    let snaps = daemon.stop();
    print_stats(&names, &snaps);
    say!("rnicd: stopped");
    if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
