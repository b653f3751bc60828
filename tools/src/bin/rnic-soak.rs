//! rnic-soak: rnicd for minutes under injected faults, with mixed rnic-perf clients
//! (`ferroce_tools::soak` says what is run and judged). Writes soak.csv (a row a second),
//! soak.png, runs.csv and summary.json to --out, prints the summary, and exits 0 only if
//! the soak passed.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use ferroce_tools::rnic_opts::{install_signal_handlers, stop_requested};
use ferroce_tools::soak::{run, SoakConfig};

#[derive(Parser)]
#[command(
    name = "rnic-soak",
    version,
    about = "Soak rnicd: two RNICs over a faulty link, mixed rnic-perf clients with --verify, some killed mid-run; memory and counters sampled every second"
)]
struct Cli {
    /// Minutes to start runs for (fractions allowed); runs under way then finish.
    #[arg(long, default_value_t = 10.0, value_parser = positive)]
    minutes: f64,
    /// Directory for soak.csv, soak.png, runs.csv, summary.json, rnicd's log and the output
    /// of failed runs.
    #[arg(long, default_value = "soak-out")]
    out: PathBuf,
    /// Client pairs (two rnic-perf processes each) running at once.
    #[arg(long, default_value_t = 3)]
    pairs: usize,
    /// Seed of the mix of runs and of rnicd's fault injection.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Probability that a frame either RNIC sends is lost.
    #[arg(long, default_value_t = 0.01, value_parser = probability)]
    loss: f64,
    /// ... is duplicated.
    #[arg(long, default_value_t = 0.005, value_parser = probability)]
    duplicate: f64,
    /// ... is reordered.
    #[arg(long, default_value_t = 0.005, value_parser = probability)]
    reorder: f64,
    /// ... is corrupted (its ICRC then fails at the receiver).
    #[arg(long, default_value_t = 0.001, value_parser = probability)]
    corrupt: f64,
    /// Every Nth run has one of its two processes killed with SIGKILL mid-run (0: none).
    #[arg(long, default_value_t = 10)]
    kill_every: u64,
    /// rnicd's worker threads (1: one drives both RNICs).
    #[arg(long, default_value_t = 2)]
    workers: u32,
    /// Workers per RNIC (worker.count): above 1, the RNICs' QPs are spread over that many
    /// threads and frames are steered between them (--workers is then not used).
    #[arg(long, default_value_t = 1)]
    worker_count: u32,
    /// Seconds a run may take before it counts as hung.
    #[arg(long, default_value_t = 180)]
    run_timeout: u64,
    /// Growth of rnicd's resident memory allowed after the first quarter of the run, MiB.
    #[arg(long, default_value_t = 16.0)]
    rss_slack_mib: f64,
    /// Only these runs of the mix, once each (to repeat a failure: its number in runs.csv).
    #[arg(long, value_delimiter = ',')]
    only: Vec<u64>,
    /// rnicd's log filter (RUST_LOG syntax) for rnicd.log, e.g. roce=debug to see every
    /// retransmission and NAK.
    #[arg(long, default_value = "warn")]
    rnicd_log: String,
    /// Where rnicd and rnic-perf are (default: beside this program).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

fn positive(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("{s}: expected a number above 0")),
    }
}

fn probability(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("{s}: expected a probability from 0 to 1")),
    }
}

fn main() -> ExitCode {
    ferroce_tools::docgen::maybe_generate::<Cli>("rnic-soak");
    let cli = Cli::parse();
    install_signal_handlers();
    let bin_dir = cli.bin_dir.clone().unwrap_or_else(|| {
        std::env::current_exe()
            .ok()
            .and_then(|p| p.parent().map(PathBuf::from))
            .unwrap_or_default()
    });
    let cfg = SoakConfig {
        duration: Duration::from_secs_f64(cli.minutes * 60.0),
        out: cli.out.clone(),
        pairs: cli.pairs,
        seed: cli.seed,
        faults: [cli.loss, cli.duplicate, cli.reorder, cli.corrupt],
        kill_every: cli.kill_every,
        workers: cli.workers,
        worker_count: cli.worker_count,
        bin_dir,
        run_timeout: Duration::from_secs(cli.run_timeout),
        rss_slack_mib: cli.rss_slack_mib,
        only: cli.only.clone(),
        rnicd_log: cli.rnicd_log.clone(),
    };
    match run(&cfg, &stop_requested) {
        Ok(s) => {
            println!("{}", serde_json::to_string_pretty(&s).unwrap_or_default());
            if s.failures.is_empty() {
                println!("rnic-soak: passed ({})", cli.out.display());
                ExitCode::SUCCESS
            } else {
                for f in &s.failures {
                    eprintln!("rnic-soak: FAILED: {f}");
                }
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("rnic-soak: {e}");
            ExitCode::from(2)
        }
    }
}
