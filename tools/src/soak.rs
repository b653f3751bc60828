//! The real soak (`rnic-soak`, `scripts/soak.sh`): rnicd serving two RNICs over a link with
//! injected faults, driven for minutes by rnic-perf client processes running a seeded mix of
//! every test (RC, UC and UD; WRITE, READ, SEND, ATOMIC; sizes from 1 B to 8 MiB; events,
//! rdma_cm, two QPs, MTU 1024) with `--verify`, some of them killed with SIGKILL mid-run.
//! Every second it samples rnicd's resident memory and every counter into a CSV; at the end
//! it draws them, and judges the run:
//! - every run ended in time, and every run not killed succeeded with every message verified
//!   (UC and UD may lose messages on a lossy link, RC may not);
//! - a killed run's surviving process ended too, and rnicd reclaimed what the pair held: with
//!   every client gone no object is left and the pool's mbufs are back to the level of the
//!   idle start;
//! - no error a fault cannot explain: no access, length or invalid-request error anywhere;
//! - memory stays flat: rnicd's private resident memory (RssAnon: its heap and DPDK's
//!   memory; the clients' shared areas it maps are apart) in the last quarter of the run
//!   within `rss_slack_mib` of its level a quarter of the way in (the pool and the
//!   allocator's arenas are touched during the first minutes).
//!
//! The mix is a pure function of the seed and the run's number, so a failing run can be
//! repeated alone (`rnic-soak --only N`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferroce_host::abi::proto::{AdminRequest, DeviceStats, ReplyBody};
use ferroce_host::app::remote::Admin;

use crate::plot::{draw, Panel, Series};

/// What to run.
#[derive(Debug, Clone)]
pub struct SoakConfig {
    /// How long new runs are started.
    pub duration: Duration,
    /// Where the CSV, the plot, the per-run table, rnicd's log and failed runs' output go.
    pub out: PathBuf,
    /// Client pairs running at once.
    pub pairs: usize,
    /// Seed of the mix and of rnicd's fault injection.
    pub seed: u64,
    /// Injected on every frame either RNIC sends: loss, duplication, reordering, corruption
    /// (probabilities).
    pub faults: [f64; 4],
    /// Every Nth run has one of its processes killed mid-run (0: none).
    pub kill_every: u64,
    /// rnicd's worker threads (`--workers`).
    pub workers: u32,
    /// Workers per RNIC (`worker.count`); above 1, both RNICs share threads 0 .. count-1
    /// and `workers` is not used. With fault injection the port has one queue, so the
    /// first worker receives every frame and steers the others' to them.
    pub worker_count: u32,
    /// Where rnicd, rnic-perf live.
    pub bin_dir: PathBuf,
    /// A run not ended by then is a hang (both processes are killed, the soak fails).
    pub run_timeout: Duration,
    /// Allowed growth of rnicd's resident memory after the first quarter (MiB).
    pub rss_slack_mib: f64,
    /// Run only these run numbers (repeating a failure), once each.
    pub only: Vec<u64>,
    /// rnicd's log filter (`RUST_LOG`), e.g. "warn" or "roce=debug".
    pub rnicd_log: String,
}

/// Which process of a pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The rnic-perf started without an address.
    Server,
    /// The one that connects.
    Client,
}

/// One run of the mix.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    /// Its number (from 0).
    pub index: u64,
    /// rnic-perf's test.
    pub test: &'static str,
    /// Arguments for both sides (size, iterations, transport...), `--verify` included.
    pub args: Vec<String>,
    /// Messages a bandwidth test must account for (verified + lost); 0 for the others.
    pub messages: u64,
    /// Whether messages may be lost (UC, UD).
    pub lossy: bool,
    /// The side killed and when, for a kill run.
    pub kill: Option<(Side, Duration)>,
}

/// splitmix64: the mix's generator (no dependency, same numbers everywhere).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn pick<T: Copy>(rng: &mut u64, from: &[T]) -> T {
    from[(next(rng) % from.len() as u64) as usize]
}

/// Message sizes of the bandwidth tests: each size class from 1 B to 8 MiB.
const SIZES: [u64; 10] = [1, 8, 64, 1000, 4096, 9000, 65536, 300_000, 1 << 20, 8 << 20];

/// Iterations for a bandwidth test of `size`: about 24 MiB, between 5 (perftest's least)
/// and 1000 messages; a kill run's 50 times that, within the 256 MiB a `--verify` WRITE
/// server keeps per QP.
fn iters_for(size: u64, kill: bool) -> u64 {
    let n = ((24u64 << 20) / size).clamp(5, 1000);
    if kill {
        // rnic-perf places each message on its own cache lines: count whole pages.
        (n * 50)
            .min((256u64 << 20) / size.next_multiple_of(4096))
            .max(n)
    } else {
        n
    }
}

/// The `index`th run of the mix for `seed`.
pub fn job(seed: u64, index: u64, kill_every: u64) -> Job {
    let mut rng = seed ^ index.wrapping_mul(0xd6e8_feb8_6659_fd93);
    let mut args: Vec<String> = Vec::new();
    let mut a = |v: &[&str]| args.extend(v.iter().map(|s| s.to_string()));
    let kill = kill_every > 0 && index % kill_every == kill_every - 1;
    let kind = next(&mut rng) % 14;
    let mtu1024 = next(&mut rng).is_multiple_of(4);
    let (test, messages, lossy) = match kind {
        // RC bandwidth: WRITE, READ, SEND, and variants.
        0..=5 => {
            let test = [
                "write_bw", "read_bw", "send_bw", "write_bw", "send_bw", "write_bw",
            ][kind as usize];
            // SEND with --verify keeps a slot per receive: up to 1 MiB.
            let sizes = if test == "send_bw" {
                &SIZES[..9]
            } else {
                &SIZES[..]
            };
            let size = pick(&mut rng, sizes);
            let n = iters_for(size, kill);
            let q = if next(&mut rng).is_multiple_of(3) {
                2
            } else {
                1
            };
            a(&["-s", &size.to_string(), "-n", &n.to_string()]);
            if q > 1 {
                a(&["-q", &q.to_string()]);
            }
            match kind {
                3 => a(&["-R"]),
                4 => a(&["-e"]),
                _ => {}
            }
            (test, n * q, false)
        }
        6 => {
            let n = if kill { 50_000 } else { 500 };
            let t = pick(&mut rng, &["FETCH_AND_ADD", "CMP_AND_SWAP"]);
            a(&["-A", t, "-n", &n.to_string()]);
            ("atomic_bw", n, false)
        }
        // UC: SEND and WRITE, which a lossy link may drop whole.
        7 | 8 => {
            let size = pick(&mut rng, &SIZES[..7]);
            let n = if kill {
                iters_for(size, true)
            } else {
                iters_for(size, false).min(400)
            };
            a(&["-c", "UC", "-s", &size.to_string(), "-n", &n.to_string()]);
            (if kind == 7 { "send_bw" } else { "write_bw" }, n, true)
        }
        // UD SEND: one packet per message.
        9 => {
            let size = pick(&mut rng, &[1u64, 64, 1000]);
            let n = if kill { 50_000 } else { 800 };
            a(&["-c", "UD", "-s", &size.to_string(), "-n", &n.to_string()]);
            ("send_bw", n, true)
        }
        // RC latency tests and ibv_rc_pingpong.
        _ => {
            let test = ["write_lat", "read_lat", "send_lat", "atomic_lat"][(kind - 10) as usize];
            let n = if kill { 100_000 } else { 300 };
            if test != "atomic_lat" {
                let size = pick(&mut rng, &[2u64, 64, 4096]);
                a(&["-s", &size.to_string()]);
            }
            a(&["-n", &n.to_string()]);
            (test, 0, false)
        }
    };
    if mtu1024 {
        a(&["-m", "1024"]);
    }
    a(&["--verify"]);
    let kill = kill.then(|| {
        let side = if next(&mut rng).is_multiple_of(2) {
            Side::Server
        } else {
            Side::Client
        };
        (side, Duration::from_millis(1000 + next(&mut rng) % 2000))
    });
    Job {
        index,
        test,
        args,
        messages,
        lossy,
        kill,
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Both sides succeeded; messages verified and lost (UC/UD).
    Ok {
        /// Messages verified by either side.
        verified: u64,
        /// Messages a lossy transport lost.
        lost: u64,
    },
    /// One side was killed; the other ended (with this exit code, or a signal: None).
    Killed {
        /// The survivor's exit code.
        survivor: Option<i32>,
    },
    /// Something went wrong.
    Failed(String),
}

/// What one side printed: its exit code and its JSON report.
#[derive(Debug, Clone)]
pub struct SideResult {
    /// Exit code (None: killed by a signal).
    pub code: Option<i32>,
    /// rnic-perf's `--json` output, if it parsed.
    pub json: Option<serde_json::Value>,
}

/// Judges a run that was not killed from both sides' results.
pub fn judge(job: &Job, server: &SideResult, client: &SideResult) -> Outcome {
    for (name, s) in [("server", server), ("client", client)] {
        if s.code != Some(0) {
            let err = s
                .json
                .as_ref()
                .and_then(|j| j["error"].as_str().map(str::to_string))
                .unwrap_or_default();
            return Outcome::Failed(format!("{name} exited with {:?}: {err}", s.code));
        }
        if s.json.is_none() {
            return Outcome::Failed(format!("{name} printed no JSON report"));
        }
    }
    let num = |s: &SideResult, k: &str| {
        s.json
            .as_ref()
            .and_then(|j| j[k].as_u64())
            .unwrap_or_default()
    };
    let verified = num(server, "verified_messages") + num(client, "verified_messages");
    let lost = num(server, "lost_messages") + num(client, "lost_messages");
    if lost > 0 && !job.lossy {
        return Outcome::Failed(format!("{lost} messages lost on a reliable connection"));
    }
    if job.messages > 0 && verified + lost != job.messages {
        return Outcome::Failed(format!(
            "{verified} verified + {lost} lost of {} messages",
            job.messages
        ));
    }
    if verified == 0 {
        return Outcome::Failed("nothing verified".into());
    }
    Outcome::Ok { verified, lost }
}

/// A child process with its output going to files.
struct Proc {
    child: Child,
    out: PathBuf,
    err: PathBuf,
}

impl Proc {
    fn result(&mut self, status: Option<std::process::ExitStatus>) -> SideResult {
        let json = std::fs::read(&self.out)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        SideResult {
            code: status.and_then(|s| s.code()),
            json,
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn remove_files(&self) {
        let _ = std::fs::remove_file(&self.out);
        let _ = std::fs::remove_file(&self.err);
    }
}

/// Runs one job (the `seq`th launched): both rnic-perf processes, the kill if any, the
/// judgement. A failed run's output stays in runs/INDEX-SEQ-server.json and the like.
fn run_job(cfg: &SoakConfig, sock: &Path, job: &Job, seq: u64) -> Outcome {
    let port = match std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => return Outcome::Failed(format!("no free TCP port: {e}")),
    };
    let runs = cfg.out.join("runs");
    let spawn = |side: Side| -> Result<Proc, String> {
        let (dev, name) = match side {
            Side::Server => ("ferroce0", "server"),
            Side::Client => ("ferroce1", "client"),
        };
        let out = runs.join(format!("{}-{seq}-{name}.json", job.index));
        let err = runs.join(format!("{}-{seq}-{name}.err", job.index));
        let mut c = Command::new(cfg.bin_dir.join("rnic-perf"));
        c.arg(job.test)
            .arg("--rnicd")
            .arg(sock)
            .args(["-d", dev, "-p", &port.to_string(), "--json"])
            .args(&job.args)
            .env("RUST_LOG", "error")
            .stdin(Stdio::null())
            .stdout(File::create(&out).map_err(|e| e.to_string())?)
            .stderr(File::create(&err).map_err(|e| e.to_string())?);
        if side == Side::Client {
            // perftest's -R connects through rdma_cm to the server's RDMA address; the
            // others exchange over TCP with the server's host.
            let rdma_cm = job.args.iter().any(|a| a == "-R");
            c.arg(if rdma_cm { "10.99.0.1" } else { "127.0.0.1" });
        }
        let child = c.spawn().map_err(|e| format!("rnic-perf: {e}"))?;
        Ok(Proc { child, out, err })
    };
    let mut server = match spawn(Side::Server) {
        Ok(p) => p,
        Err(e) => return Outcome::Failed(e),
    };
    // The client retries its TCP connection for a while; a short head start is enough.
    std::thread::sleep(Duration::from_millis(200));
    let mut client = match spawn(Side::Client) {
        Ok(p) => p,
        Err(e) => {
            server.kill();
            return Outcome::Failed(e);
        }
    };
    let start = Instant::now();
    let deadline = start + cfg.run_timeout;
    let mut status = [None, None];
    let mut killed = None;
    let mut failed_at: Option<Instant> = None;
    loop {
        for (i, p) in [&mut server, &mut client].into_iter().enumerate() {
            if status[i].is_none() {
                status[i] = p.child.try_wait().ok().flatten();
            }
        }
        if let Some((side, after)) = job.kill {
            let i = side as usize;
            if killed.is_none() && start.elapsed() >= after {
                let p = if side == Side::Server {
                    &mut server
                } else {
                    &mut client
                };
                if status[i].is_none() {
                    let _ = p.child.kill();
                    killed = Some(side);
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        // One side failed on its own: the other may wait for it forever, as perftest's
        // server waits for a client; give it a while to notice, then end the run.
        let failed = status.iter().any(|s| s.is_some_and(|s| !s.success()));
        if killed.is_none() && failed {
            failed_at.get_or_insert_with(Instant::now);
        }
        if failed_at.is_some_and(|t| t.elapsed() > Duration::from_secs(15)) {
            let s = server.result(status[0]);
            let c = client.result(status[1]);
            server.kill();
            client.kill();
            return match judge(job, &s, &c) {
                Outcome::Failed(why) => Outcome::Failed(why),
                _ => Outcome::Failed("one side failed".into()),
            };
        }
        if Instant::now() > deadline {
            server.kill();
            client.kill();
            return Outcome::Failed(format!(
                "did not end in {:?} (server {}, client {})",
                cfg.run_timeout,
                if status[0].is_some() {
                    "ended"
                } else {
                    "running"
                },
                if status[1].is_some() {
                    "ended"
                } else {
                    "running"
                },
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let outcome = match killed {
        Some(side) => {
            let survivor = if side == Side::Server { 1 } else { 0 };
            Outcome::Killed {
                survivor: status[survivor].and_then(|s| s.code()),
            }
        }
        // The kill came too late (the run had ended) or there was none.
        None => {
            let s = server.result(status[0]);
            let c = client.result(status[1]);
            judge(job, &s, &c)
        }
    };
    if !matches!(outcome, Outcome::Failed(_)) {
        server.remove_files();
        client.remove_files();
    }
    outcome
}

/// Counters summed over the RNICs (`ferroce*`), by name.
fn sum_rnics(stats: &[DeviceStats]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for d in stats.iter().filter(|d| d.device.starts_with("ferroce")) {
        for (k, v) in &d.port {
            *m.entry(k.clone()).or_insert(0) += v;
        }
    }
    m
}

/// Resident memory of a process (KiB) from /proc: all of it, its private anonymous part (the
/// heap, DPDK's memory) and its shared part (the clients' areas the worker maps, which come
/// and go with the clients and their buffer sizes).
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: u64,
    anon: u64,
    shmem: u64,
}

fn mem_kib(pid: u32) -> Mem {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let get = |key: &str| -> u64 {
        s.lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    Mem {
        rss: get("VmRSS:"),
        anon: get("RssAnon:"),
        shmem: get("RssShmem:"),
    }
}

/// One sample: time, RSS, the run tallies and the RNICs' counters.
#[derive(Debug, Clone)]
struct Sample {
    t: f64,
    mem: Mem,
    runs: [u64; 3],
    counters: BTreeMap<String, u64>,
}

/// Run tallies: ok, killed, failed.
#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    killed: AtomicU64,
    failed: AtomicU64,
}

impl Tally {
    fn get(&self) -> [u64; 3] {
        [
            self.ok.load(Ordering::Relaxed),
            self.killed.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        ]
    }
}

/// Counters that no injected fault explains: any non-zero value fails the soak (rnic-perf
/// never makes a bad access, a short receive or an invalid request).
pub const MUST_STAY_ZERO: [&str; 8] = [
    "req_remote_access_errors",
    "resp_remote_access_errors",
    "req_remote_invalid_request",
    "resp_remote_invalid_request",
    "resp_local_length_error",
    "req_remote_operational_error",
    "rx_steer_dropped",
    "cq_overflows",
];

/// The soak's result, as printed and written to summary.json.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Summary {
    /// Seconds runs were started for.
    pub seconds: f64,
    /// Runs that succeeded, verified.
    pub runs_ok: u64,
    /// Runs with a process killed (and the other ended).
    pub runs_killed: u64,
    /// Runs that failed.
    pub runs_failed: u64,
    /// Runs per test (`test` or `test/UC`...).
    pub runs_by_test: BTreeMap<String, u64>,
    /// Messages verified by rnic-perf.
    pub messages_verified: u64,
    /// Messages UC/UD lost.
    pub messages_lost: u64,
    /// Faults injected: lost, duplicated, reordered, corrupted frames.
    pub faults: [u64; 4],
    /// Frames sent by both RNICs.
    pub tx_frames: u64,
    /// Bytes sent by both RNICs.
    pub tx_bytes: u64,
    /// Packets retransmitted.
    pub retransmitted_pkts: u64,
    /// WRs that ended with retries exhausted (a killed peer's).
    pub retry_exceeded_err: u64,
    /// Private resident memory (RssAnon, MiB): at the first sample, a quarter in, the last
    /// quarter's peak, at the end.
    pub anon_mib: [f64; 4],
    /// Peak of all resident memory (VmRSS, MiB), the clients' shared areas included.
    pub rss_peak_mib: f64,
    /// Mbufs in use when idle at the start, and at the end.
    pub mbufs_in_use: [u64; 2],
    /// Objects left once every client had gone (QPs, MRs, CQs, PDs, SRQs, clients).
    pub objects_left: u64,
    /// Why the soak failed (empty: it passed).
    pub failures: Vec<String>,
}

/// Runs the soak. Returns its summary (`failures` empty when it passed) or an error that
/// stopped it from running at all.
pub fn run(cfg: &SoakConfig, stop: &(dyn Fn() -> bool + Sync)) -> Result<Summary, String> {
    std::fs::create_dir_all(cfg.out.join("runs")).map_err(|e| e.to_string())?;
    let sock = cfg.out.join("rnicd.sock");
    let _ = std::fs::remove_file(&sock);
    let log = File::create(cfg.out.join("rnicd.log")).map_err(|e| e.to_string())?;
    let [loss, dup, reorder, corrupt] = cfg.faults;
    // Several workers per RNIC (`worker.count`): both RNICs' shards on threads 0 .. count-1
    // (their first shards on thread 0), so --workers stays 1.
    let workers = if cfg.worker_count > 1 { 1 } else { cfg.workers };
    let mut rnicd = Command::new(cfg.bin_dir.join("rnicd"))
        .args(["--loopback", "--workers", &workers.to_string(), "--socket"])
        .arg(&sock)
        .args([
            "--set",
            &format!("worker.count={}", cfg.worker_count.max(1)),
        ])
        .args(["--set", &format!("fault.loss={loss}")])
        .args(["--set", &format!("fault.duplicate={dup}")])
        .args(["--set", &format!("fault.reorder={reorder}")])
        .args(["--set", &format!("fault.corrupt={corrupt}")])
        .args(["--set", &format!("fault.seed={}", cfg.seed)])
        // Two cores for rnicd and the clients: a worker with nothing to do sleeps soon.
        .args(["--set", "worker.idle_sleep_us=50"])
        .env("RUST_LOG", &cfg.rnicd_log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("rnicd: {e}"))?;
    let pid = rnicd.id();
    let lines = BufReader::new(rnicd.stdout.take().ok_or("rnicd: no stdout")?);
    let (tx, rx) = std::sync::mpsc::channel();
    let log_path = cfg.out.join("rnicd.out");
    std::thread::spawn(move || {
        let mut f = File::create(log_path).ok();
        for line in lines.lines().map_while(Result::ok) {
            if line.contains("listening on") {
                let _ = tx.send(());
            }
            if let Some(f) = f.as_mut() {
                let _ = writeln!(f, "{line}");
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = rnicd.kill();
        let _ = rnicd.wait();
        return Err("rnicd did not start (see rnicd.log)".into());
    }
    let result = soak_with(cfg, &sock, pid, stop);
    // SAFETY: signalling our own child by its pid.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Ok(Some(s)) = rnicd.try_wait() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = rnicd.kill();
            let _ = rnicd.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut summary = result?;
    match status {
        Some(s) if s.success() => {}
        Some(s) => summary.failures.push(format!("rnicd exited with {s}")),
        None => summary
            .failures
            .push("rnicd did not stop on SIGTERM in 30 s".into()),
    }
    std::fs::write(
        cfg.out.join("summary.json"),
        serde_json::to_string_pretty(&summary).unwrap_or_default(),
    )
    .map_err(|e| e.to_string())?;
    Ok(summary)
}

fn connect(sock: &Path) -> Result<Admin, String> {
    Admin::connect(Some(sock)).map_err(|e| format!("rnicd's socket: {e}"))
}

fn stats(admin: &mut Admin) -> Result<Vec<DeviceStats>, String> {
    match admin.request(AdminRequest::Stats { qps: false }) {
        Ok(ReplyBody::Stats(s)) => Ok(s),
        Ok(_) => Err("rnicd: unexpected reply to stats".into()),
        Err(e) => Err(format!("rnicd: {e}")),
    }
}

fn soak_with(
    cfg: &SoakConfig,
    sock: &Path,
    pid: u32,
    stop: &(dyn Fn() -> bool + Sync),
) -> Result<Summary, String> {
    let mut admin = connect(sock)?;
    let t0 = Instant::now();
    let idle = sum_rnics(&stats(&mut admin)?);
    let base_mbufs = idle.get("mbufs_in_use").copied().unwrap_or(0);
    let tally = Tally::default();
    let done = AtomicBool::new(false);
    let next_job = AtomicU64::new(0);
    let samples: Mutex<Vec<Sample>> = Mutex::new(Vec::new());
    let csv =
        Mutex::new(Csv::create(&cfg.out.join("soak.csv")).map_err(|e| format!("soak.csv: {e}"))?);
    let runs_csv =
        Mutex::new(File::create(cfg.out.join("runs.csv")).map_err(|e| format!("runs.csv: {e}"))?);
    if let Ok(mut f) = runs_csv.lock() {
        let _ = writeln!(f, "run,start_s,secs,test,args,outcome,verified,lost,detail");
    }
    let totals = Mutex::new((0u64, 0u64, BTreeMap::<String, u64>::new()));
    let failures = Mutex::new(Vec::<String>::new());
    let admin = Arc::new(Mutex::new(admin));
    std::thread::scope(|sc| {
        // The sampler: once a second until the runs are over.
        sc.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let s = admin.lock().ok().and_then(|mut a| stats(&mut a).ok());
                if let Some(s) = s {
                    let sample = Sample {
                        t: t0.elapsed().as_secs_f64(),
                        mem: mem_kib(pid),
                        runs: tally.get(),
                        counters: sum_rnics(&s),
                    };
                    if let Ok(mut c) = csv.lock() {
                        if let Err(e) = c.row(&sample) {
                            eprintln!("rnic-soak: soak.csv: {e}");
                        }
                    }
                    if let Ok(mut v) = samples.lock() {
                        v.push(sample);
                    }
                }
                let until = Instant::now() + Duration::from_secs(1);
                while Instant::now() < until && !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        });
        let runners: Vec<_> = (0..cfg.pairs.max(1))
            .map(|_| {
                sc.spawn(|| loop {
                    if stop() {
                        return;
                    }
                    let n = next_job.fetch_add(1, Ordering::Relaxed);
                    let index = if cfg.only.is_empty() {
                        if t0.elapsed() >= cfg.duration {
                            return;
                        }
                        n
                    } else {
                        match cfg.only.get(n as usize) {
                            Some(&i) => i,
                            None => return,
                        }
                    };
                    let job = job(cfg.seed, index, cfg.kill_every);
                    let started = t0.elapsed().as_secs_f64();
                    let outcome = run_job(cfg, sock, &job, n);
                    let secs = t0.elapsed().as_secs_f64() - started;
                    let (name, v, l, detail) = match &outcome {
                        Outcome::Ok { verified, lost } => {
                            tally.ok.fetch_add(1, Ordering::Relaxed);
                            ("ok", *verified, *lost, String::new())
                        }
                        Outcome::Killed { survivor } => {
                            tally.killed.fetch_add(1, Ordering::Relaxed);
                            ("killed", 0, 0, format!("survivor exit {survivor:?}"))
                        }
                        Outcome::Failed(why) => {
                            tally.failed.fetch_add(1, Ordering::Relaxed);
                            if let Ok(mut f) = failures.lock() {
                                f.push(format!(
                                    "run {index} ({} {}): {why}",
                                    job.test,
                                    job.args.join(" ")
                                ));
                            }
                            ("failed", 0, 0, why.clone())
                        }
                    };
                    if let Ok(mut t) = totals.lock() {
                        t.0 += v;
                        t.1 += l;
                        let conn = job
                            .args
                            .iter()
                            .position(|a| a == "-c")
                            .map_or("", |i| job.args[i + 1].as_str());
                        let key = if conn.is_empty() {
                            job.test.to_string()
                        } else {
                            format!("{}/{conn}", job.test)
                        };
                        *t.2.entry(key).or_insert(0) += 1;
                    }
                    if let Ok(mut f) = runs_csv.lock() {
                        let _ = writeln!(
                            f,
                            "{index},{started:.1},{secs:.2},{},{},{name},{v},{l},\"{}\"",
                            job.test,
                            job.args.join(" "),
                            detail.replace('"', "'")
                        );
                    }
                })
            })
            .collect();
        for r in runners {
            let _ = r.join();
        }
        done.store(true, Ordering::Relaxed);
    });
    let seconds = t0.elapsed().as_secs_f64();
    let mut failures = failures.into_inner().unwrap_or_default();
    // Every client is gone: rnicd must come back to where it started.
    let mut admin = Arc::try_unwrap(admin)
        .ok()
        .and_then(|m| m.into_inner().ok())
        .ok_or("sampler still holds the admin connection")?;
    let objects = |c: &BTreeMap<String, u64>| -> u64 {
        ["res_qp", "res_mr", "res_cq", "res_pd", "res_srq", "clients"]
            .iter()
            .map(|k| c.get(*k).copied().unwrap_or(0))
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let last = loop {
        let c = sum_rnics(&stats(&mut admin)?);
        let settled = objects(&c) == 0 && c.get("mbufs_in_use").copied().unwrap_or(0) <= base_mbufs;
        if settled || Instant::now() > deadline {
            break c;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut samples = samples.into_inner().unwrap_or_default();
    let end = Sample {
        t: t0.elapsed().as_secs_f64(),
        mem: mem_kib(pid),
        runs: tally.get(),
        counters: last.clone(),
    };
    csv.into_inner()
        .map_err(|_| "soak.csv: poisoned".to_string())?
        .row(&end)
        .map_err(|e| format!("soak.csv: {e}"))?;
    samples.push(end);
    let get = |k: &str| last.get(k).copied().unwrap_or(0);
    let objects_left = objects(&last);
    if objects_left > 0 {
        failures.push(format!(
            "with every client gone rnicd still holds {objects_left} objects and clients"
        ));
    }
    let end_mbufs = get("mbufs_in_use");
    if end_mbufs > base_mbufs {
        failures.push(format!(
            "mbufs in use {end_mbufs} at the end, {base_mbufs} when idle at the start"
        ));
    }
    for k in MUST_STAY_ZERO {
        if get(k) > 0 {
            failures.push(format!("{k} = {}", get(k)));
        }
    }
    // Flat memory is judged on rnicd's private memory: its shared part is the clients'
    // areas, as large as the buffers of the runs under way.
    let mib = |kib: u64| kib as f64 / 1024.0;
    let anon_at = |frac: f64| -> f64 {
        let t = seconds * frac;
        samples
            .iter()
            .find(|s| s.t >= t)
            .map_or(0.0, |s| mib(s.mem.anon))
    };
    let quarter = anon_at(0.25);
    let last_peak = samples
        .iter()
        .filter(|s| s.t >= seconds * 0.75)
        .map(|s| mib(s.mem.anon))
        .fold(0.0, f64::max);
    if quarter > 0.0 && last_peak > quarter + cfg.rss_slack_mib {
        failures.push(format!(
            "private memory grew from {quarter:.1} MiB a quarter in to {last_peak:.1} MiB in the last quarter"
        ));
    }
    let [ok, killed, failed] = tally.get();
    if ok == 0 {
        failures.push("no run succeeded".into());
    }
    if let Err(e) = plot(&cfg.out.join("soak.png"), &samples) {
        // The figures are in the CSV; a missing font only costs the picture.
        eprintln!("rnic-soak: no plot: {e}");
    }
    let (verified, lost, by_test) = totals.into_inner().unwrap_or_default();
    Ok(Summary {
        seconds,
        runs_ok: ok,
        runs_killed: killed,
        runs_failed: failed,
        runs_by_test: by_test,
        messages_verified: verified,
        messages_lost: lost,
        faults: [
            get("fault_lost"),
            get("fault_duplicated"),
            get("fault_reordered"),
            get("fault_corrupted"),
        ],
        tx_frames: get("tx_frames"),
        tx_bytes: get("tx_bytes"),
        retransmitted_pkts: get("retransmitted_pkts"),
        retry_exceeded_err: get("retry_exceeded_err"),
        anon_mib: [
            samples.first().map_or(0.0, |s| mib(s.mem.anon)),
            quarter,
            last_peak,
            samples.last().map_or(0.0, |s| mib(s.mem.anon)),
        ],
        rss_peak_mib: samples.iter().map(|s| mib(s.mem.rss)).fold(0.0, f64::max),
        mbufs_in_use: [base_mbufs, end_mbufs],
        objects_left,
        failures,
    })
}

/// soak.csv, written as the samples come (a soak cut short keeps what it sampled): a row a
/// second: time, RSS, run tallies, then every counter summed over both RNICs (the names of
/// the first sample).
struct Csv {
    f: std::io::BufWriter<File>,
    names: Option<Vec<String>>,
}

impl Csv {
    fn create(path: &Path) -> std::io::Result<Csv> {
        Ok(Csv {
            f: std::io::BufWriter::new(File::create(path)?),
            names: None,
        })
    }

    fn row(&mut self, s: &Sample) -> std::io::Result<()> {
        if self.names.is_none() {
            let names: Vec<String> = s.counters.keys().cloned().collect();
            let mut head = String::from(
                "t_s,rss_kib,rss_anon_kib,rss_shmem_kib,runs_ok,runs_killed,runs_failed",
            );
            for n in &names {
                let _ = write!(head, ",{n}");
            }
            writeln!(self.f, "{head}")?;
            self.names = Some(names);
        }
        let mut row = format!(
            "{:.1},{},{},{},{},{},{}",
            s.t, s.mem.rss, s.mem.anon, s.mem.shmem, s.runs[0], s.runs[1], s.runs[2]
        );
        for n in self.names.iter().flatten() {
            let _ = write!(row, ",{}", s.counters.get(n).copied().unwrap_or(0));
        }
        writeln!(self.f, "{row}")?;
        self.f.flush()
    }
}

/// soak.png: memory, pool, objects, faults and recovery, runs: one panel each, over time.
fn plot(path: &Path, samples: &[Sample]) -> Result<(), String> {
    let level = |name: &str, f: &dyn Fn(&Sample) -> f64| Series {
        name: name.to_string(),
        points: samples.iter().map(|s| (s.t, f(s))).collect(),
    };
    let c = |s: &Sample, k: &str| s.counters.get(k).copied().unwrap_or(0) as f64;
    // Per-second rates of counters between consecutive samples.
    let rate = |name: &str, keys: &[&str]| Series {
        name: name.to_string(),
        points: samples
            .windows(2)
            .map(|w| {
                let dt = (w[1].t - w[0].t).max(1e-3);
                let d: f64 = keys.iter().map(|k| c(&w[1], k) - c(&w[0], k)).sum();
                (w[1].t, d.max(0.0) / dt)
            })
            .collect(),
    };
    let x = "seconds";
    let panels = [
        Panel {
            title: "rnicd resident memory".into(),
            x_label: x.into(),
            y_label: "MiB".into(),
            series: vec![
                level("all (VmRSS)", &|s| s.mem.rss as f64 / 1024.0),
                level("private", &|s| s.mem.anon as f64 / 1024.0),
                level("clients' areas", &|s| s.mem.shmem as f64 / 1024.0),
            ],
        },
        Panel {
            title: "mbufs in use (both RNICs' pools)".into(),
            x_label: x.into(),
            y_label: "mbufs".into(),
            series: vec![level("in use", &|s| c(s, "mbufs_in_use"))],
        },
        Panel {
            title: "objects held by rnicd".into(),
            x_label: x.into(),
            y_label: "count".into(),
            series: vec![
                level("QPs", &|s| c(s, "res_qp")),
                level("MRs", &|s| c(s, "res_mr")),
                level("CQs", &|s| c(s, "res_cq")),
                level("clients", &|s| c(s, "clients")),
            ],
        },
        Panel {
            title: "faults injected and recovery, per second".into(),
            x_label: x.into(),
            y_label: "per second".into(),
            series: vec![
                rate(
                    "faults",
                    &[
                        "fault_lost",
                        "fault_duplicated",
                        "fault_reordered",
                        "fault_corrupted",
                    ],
                ),
                rate("retransmitted", &["retransmitted_pkts"]),
                rate("NAKs sent", &["naks_sent"]),
            ],
        },
        Panel {
            title: "runs ended".into(),
            x_label: x.into(),
            y_label: "runs".into(),
            series: vec![
                level("ok", &|s| s.runs[0] as f64),
                level("killed", &|s| s.runs[1] as f64),
                level("failed", &|s| s.runs[2] as f64),
            ],
        },
    ];
    draw(path, &panels, 1000, 260)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_a_function_of_seed_and_index_and_covers_every_class() {
        assert_eq!(job(7, 42, 10), job(7, 42, 10));
        let jobs: Vec<Job> = (0..2000).map(|i| job(1, i, 10)).collect();
        for t in [
            "write_bw",
            "read_bw",
            "send_bw",
            "atomic_bw",
            "write_lat",
            "read_lat",
            "send_lat",
            "atomic_lat",
        ] {
            assert!(jobs.iter().any(|j| j.test == t), "{t} never run");
        }
        let has = |a: &str| {
            jobs.iter()
                .filter(|j| j.args.iter().any(|x| x == a))
                .count()
        };
        for a in ["UC", "UD", "-R", "-e", "-q", "1024", "8388608", "1"] {
            assert!(has(a) > 0, "{a} never used");
        }
        assert_eq!(jobs.iter().filter(|j| j.kill.is_some()).count(), 200);
        assert!(jobs.iter().all(|j| j.args.iter().any(|x| x == "--verify")));
    }

    fn side(code: i32, json: serde_json::Value) -> SideResult {
        SideResult {
            code: Some(code),
            json: Some(json),
        }
    }

    #[test]
    fn a_run_is_judged_by_what_both_sides_verified_and_lost() {
        let mut j = job(1, 0, 0);
        j.messages = 100;
        j.lossy = false;
        let v = |n: u64, l: u64| serde_json::json!({"verified_messages": n, "lost_messages": l});
        let ok = judge(&j, &side(0, v(100, 0)), &side(0, v(0, 0)));
        assert_eq!(
            ok,
            Outcome::Ok {
                verified: 100,
                lost: 0
            }
        );
        // A reliable connection that lost a message, a short count, a failed side.
        assert!(matches!(
            judge(&j, &side(0, v(99, 1)), &side(0, v(0, 0))),
            Outcome::Failed(_)
        ));
        assert!(matches!(
            judge(&j, &side(0, v(99, 0)), &side(0, v(0, 0))),
            Outcome::Failed(_)
        ));
        assert!(matches!(
            judge(&j, &side(0, v(100, 0)), &side(1, v(0, 0))),
            Outcome::Failed(_)
        ));
        j.lossy = true;
        assert_eq!(
            judge(&j, &side(0, v(97, 3)), &side(0, v(0, 0))),
            Outcome::Ok {
                verified: 97,
                lost: 3
            }
        );
    }
}
