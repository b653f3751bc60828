//! rnic-perf end to end: every test and pingpong between two ferroce RNICs in one process
//! (`--loopback`), data verified, results read from `--json`; and bad input from the command
//! line and from the TCP peer ends in a clear error, never a crash.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;

/// One rnic-perf at a time: each runs a dataplane worker and two busy application threads,
/// and these machines have two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Runs rnic-perf to completion; more than two minutes fails the test.
fn rnic_perf(args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rnic-perf"));
    cmd.args(args).env("RUST_LOG", "error");
    let (out, killed) = common::run_for(&mut cmd, Duration::from_secs(120));
    assert!(!killed, "rnic-perf {args:?} did not finish in 120 s");
    out
}

/// Starts rnic-perf with `args`, its standard output to `stdout` and its error output piped.
fn spawn_rnic_perf(args: &[&str], stdout: Stdio) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_rnic-perf"))
        .args(args)
        .env("RUST_LOG", "error")
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Runs a loopback test and returns its JSON document.
fn loopback(args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["--loopback", "--json"]);
    let out = rnic_perf(&all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "rnic-perf {all:?} failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "rnic-perf {all:?}: bad JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The words of a command line (split at spaces: no argument of these tests holds one).
fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn rows(v: &Value, side: &str) -> Vec<Value> {
    v[side]["results"].as_array().cloned().unwrap_or_default()
}

#[test]
fn bandwidth_tests_move_and_verify_every_message() {
    let _one = serial();
    for (test, extra, size) in [
        ("write_bw", vec!["-s", "65536", "-n", "300"], 65536),
        ("write_bw", vec!["-s", "3000", "-n", "500", "-q", "2"], 3000),
        ("read_bw", vec!["-s", "5000", "-n", "300"], 5000),
        ("send_bw", vec!["-s", "1500", "-n", "600"], 1500),
        ("send_bw", vec!["-s", "1500", "-n", "300", "-e"], 1500),
        ("send_bw", vec!["-s", "1024", "-n", "400", "-c", "UD"], 1024),
        ("send_bw", vec!["-s", "9000", "-n", "200", "-c", "UC"], 9000),
        ("atomic_bw", vec!["-n", "500"], 8),
        ("atomic_bw", vec!["-n", "500", "-A", "CMP_AND_SWAP"], 8),
        // Each RNIC on a worker thread of its own.
        (
            "write_bw",
            vec!["-s", "65536", "-n", "300", "--workers", "2"],
            65536,
        ),
        (
            "read_bw",
            vec!["-s", "5000", "-n", "300", "--workers", "2"],
            5000,
        ),
        (
            "send_bw",
            vec!["-s", "1500", "-n", "600", "--workers", "2"],
            1500,
        ),
    ] {
        let mut args = vec![test, "--verify"];
        args.extend_from_slice(&extra);
        let v = loopback(&args);
        let n = common::flag_number(&extra, "-n").unwrap();
        let qps = common::flag_number(&extra, "-q").unwrap_or(1);
        let c = rows(&v, "client");
        assert_eq!(c.len(), 1, "{test} {extra:?}: {v}");
        assert_eq!(c[0]["bytes"], size, "{test} {extra:?}");
        assert_eq!(c[0]["iterations"], n * qps, "{test} {extra:?}");
        assert!(c[0]["bw_avg_MBps"].as_f64().unwrap() > 0.0);
        // Every message's data was checked by one side or the other.
        let verified = v["client"]["verified_messages"].as_u64().unwrap()
            + v["server"]["verified_messages"].as_u64().unwrap();
        assert_eq!(verified, n * qps, "{test} {extra:?}: {v}");
        // The server of WRITE/READ/ATOMIC prints the client's report, which came over TCP.
        let s = rows(&v, "server");
        if test != "send_bw" {
            assert_eq!(s[0]["iterations"], c[0]["iterations"], "{test}");
            assert_eq!(s[0]["bytes"], c[0]["bytes"], "{test}");
        } else {
            assert_eq!(s[0]["iterations"], n * qps, "{test}: the receiver counted");
        }
    }
}

/// perftest's -R between the two loopback RNICs: the exchange over an rdma_cm connection,
/// the test's QPs connected by the connection manager (RC) or resolved with SIDR (UD), data
/// verified; the MADs crossed the link on QP1 and the connections ended with DREQ/DREP.
#[test]
fn rdma_cm_mode_connects_through_the_connection_manager() {
    let _one = serial();
    for (test, extra, n, qps) in [
        (
            "write_bw",
            vec!["-s", "4096", "-n", "300", "-q", "2"],
            300,
            2,
        ),
        ("read_bw", vec!["-s", "5000", "-n", "200"], 200, 1),
        (
            "send_bw",
            vec!["-s", "1024", "-n", "300", "-c", "UD"],
            300,
            1,
        ),
        ("send_lat", vec!["-s", "64", "-n", "200"], 200, 1),
        (
            "send_lat",
            vec!["-s", "64", "-n", "200", "-c", "UD"],
            200,
            1,
        ),
        ("read_lat", vec!["-s", "64", "-n", "200"], 200, 1),
    ] {
        let mut args = vec![test, "-R", "--verify"];
        args.extend_from_slice(&extra);
        let v = loopback(&args);
        let c = rows(&v, "client");
        assert_eq!(c.len(), 1, "{test} {extra:?}: {v}");
        assert_eq!(c[0]["iterations"], n * qps, "{test} {extra:?}: {v}");
        let verified = v["client"]["verified_messages"].as_u64().unwrap()
            + v["server"]["verified_messages"].as_u64().unwrap();
        assert!(verified >= n * qps, "{test} {extra:?}: {v}");
        // QP1 carried the connection manager: the exchange's connection and one per QP
        // (REQ, REP, RTU, DREQ, DREP; SIDR_REQ/SIDR_REP for UD).
        let mads = |dev: &str, k: &str| v["counters"][dev][k].as_u64().unwrap_or(0);
        let per_qp = if extra.contains(&"UD") { 1 } else { 2 };
        for (dev, k) in [("ferroce0", "rx_gsi_mads"), ("ferroce1", "rx_gsi_mads")] {
            assert!(
                mads(dev, k) >= 2 + per_qp * qps,
                "{test} {extra:?}: {dev} {k} {}",
                mads(dev, k)
            );
        }
    }
    // perftest refuses UC with -R (librdmacm has no UC), and so does rnic-perf.
    let out = rnic_perf(&["write_bw", "-R", "-c", "UC", "--loopback"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("UC is not supported in librdmacm"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn latency_tests_and_pingpongs() {
    let _one = serial();
    for (test, extra, size) in [
        ("write_lat", vec!["-s", "100", "-n", "200"], 100),
        ("write_lat", vec!["-s", "5000", "-n", "100"], 5000),
        ("read_lat", vec!["-s", "64", "-n", "200"], 64),
        ("send_lat", vec!["-s", "2", "-n", "200"], 2),
        ("read_lat", vec!["-s", "64", "-n", "100", "-e"], 64),
        ("send_lat", vec!["-s", "512", "-n", "100", "-c", "UD"], 512),
        ("atomic_lat", vec!["-n", "200"], 8),
    ] {
        let mut args = vec![test, "--verify"];
        args.extend_from_slice(&extra);
        let v = loopback(&args);
        let c = rows(&v, "client");
        assert_eq!(c.len(), 1, "{test}: {v}");
        assert_eq!(c[0]["bytes"], size);
        let t_min = c[0]["t_min_us"].as_f64().unwrap();
        let t_typ = c[0]["t_typical_us"].as_f64().unwrap();
        assert!(t_min > 0.0 && t_min <= t_typ, "{test}: {v}");
        assert!(
            v["client"]["verified_messages"].as_u64().unwrap() > 0,
            "{test}"
        );
    }
    for (test, extra) in [
        ("rc_pingpong", vec!["-n", "100"]),
        ("rc_pingpong", vec!["-n", "50", "-s", "20000", "-m", "2048"]),
        ("ud_pingpong", vec!["-n", "100", "-s", "1000"]),
    ] {
        let mut args = vec![test];
        args.extend_from_slice(&extra);
        let v = loopback(&args);
        for side in ["client", "server"] {
            assert_eq!(v[side]["iters"], extra[1].parse::<u64>().unwrap(), "{test}");
            assert!(v[side]["mbit_per_sec"].as_f64().unwrap() > 0.0, "{test}");
        }
        assert_eq!(v["client"]["remote_qpn"], v["server"]["local_qpn"]);
    }
}

#[test]
fn options_that_change_the_traffic() {
    let _one = serial();
    // All sizes (a short -n keeps it quick), bidirectional, post lists, duration, several QPs.
    let v = loopback(&["write_bw", "-a", "-n", "20"]);
    assert_eq!(rows(&v, "client").len(), 23);
    let v = loopback(&["send_bw", "-b", "-n", "200", "-s", "4096"]);
    assert_eq!(rows(&v, "client")[0]["iterations"], 200);
    let v = loopback(&["write_bw", "-l", "4", "-n", "400", "-s", "256", "-t", "64"]);
    assert_eq!(rows(&v, "client")[0]["iterations"], 400);
    let v = loopback(&["write_bw", "-D", "2", "-s", "4096"]);
    assert!(rows(&v, "client")[0]["iterations"].as_u64().unwrap() > 0);
    let v = loopback(&["write_bw", "--write_with_imm", "-n", "300", "-s", "2048"]);
    assert_eq!(rows(&v, "client")[0]["iterations"], 300);
    let v = loopback(&["send_bw", "-q", "4", "-n", "100", "-s", "700", "--verify"]);
    assert_eq!(v["server"]["verified_messages"], 400);
    let v = loopback(&words("read_bw -m 1024 -n 100 -s 10000 -o 4"));
    assert_eq!(v["client"]["mtu"], 1024);
}

/// UD drops what finds no receive WQE (here: 5% of frames lost on the link): the receiver
/// learns that the sender finished and reports what arrived instead of waiting for the
/// rest; and with an idle link nothing is lost.
#[test]
fn a_lossy_ud_run_ends_and_reports_its_loss() {
    let _one = serial();
    let t = Instant::now();
    let v = loopback(&words(
        "send_bw -c UD -s 1024 -n 2000 --set fault.loss=0.05",
    ));
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
    let got = rows(&v, "server")[0]["iterations"].as_u64().unwrap();
    let lost = v["server"]["lost_messages"].as_u64().unwrap();
    assert!(lost > 0 && got + lost == 2000, "{v}");
    // Without faults nothing may be lost. UD has no flow control: the sender runs ahead of a
    // receiver thread the scheduler leaves out, and a debug build on a loaded 2-core CI
    // machine has left it out for more than the default 50 ms hold and 1024 held frames
    // (CI, 370e965: 512 expired, 256 dropped). So the receiving RNIC may hold every message of
    // the run for up to 10 s here: a loss is then a real fault, not a stalled thread.
    for _ in 0..3 {
        let hold = "--set roce.ud_rx_hold_frames=5000 --set roce.ud_rx_hold_us=10000000";
        let v = loopback(&words(&format!("send_bw -c UD -s 4096 -n 5000 {hold}")));
        assert_eq!(v["server"]["lost_messages"], 0, "{v}");
    }
}

/// A UC WRITE that loses a packet is dropped whole by the receiver, but its earlier packets
/// are already in memory: `--verify` counts such a message as lost, and still fails on any
/// byte that is neither the message's nor untouched. (Both found by the real soak.)
#[test]
fn lossy_uc_and_ud_runs_verify_what_arrived_and_count_the_rest_lost() {
    let _one = serial();
    let v = loopback(&words(
        "write_bw -c UC -s 9000 -n 400 --verify --set fault.loss=0.05",
    ));
    let verified = v["server"]["verified_messages"].as_u64().unwrap();
    let lost = v["server"]["lost_messages"].as_u64().unwrap();
    assert!(lost > 0 && verified > 0 && verified + lost == 400, "{v}");
    // Messages under 8 bytes carry only the low bytes of their number: after a loss the
    // receiver finds the message's number from them, not from its count (which a loss put
    // behind).
    for conn in ["UC", "UD"] {
        let v = loopback(&words(&format!(
            "send_bw -c {conn} -s 1 -n 1000 --verify --set fault.loss=0.05"
        )));
        let verified = v["server"]["verified_messages"].as_u64().unwrap();
        let lost = v["server"]["lost_messages"].as_u64().unwrap();
        assert!(lost > 0 && verified + lost == 1000, "{conn}: {v}");
    }
}

/// Sends `sig` to a running rnic-perf once `ready` says its output shows it is running, then
/// waits (at most 20 s) for it to exit; returns its exit code, stdout and stderr.
fn interrupt(args: &[&str], sig: i32, ready: impl Fn(&str) -> bool) -> (i32, String, String, u32) {
    use std::io::BufRead;
    let mut child = spawn_rnic_perf(args, Stdio::piped());
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(all.clone());
        }
        all
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(text) if ready(&text) => break,
            _ if Instant::now() > deadline => {
                let _ = child.kill();
                panic!("rnic-perf {args:?} never got ready");
            }
            _ => {}
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(pid as i32, sig) };
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            panic!("rnic-perf {args:?} did not stop within 20 s of the signal");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let out = reader.join().unwrap();
    (status.code().unwrap_or(-1), out, err, pid)
}

/// Ctrl-C ends a run cleanly: the rows measured so far are printed, the capture is complete
/// and valid, DPDK's runtime directory is gone, and the exit code says which signal (130
/// SIGINT, 143 SIGTERM) - also for a server still waiting for its client.
#[test]
fn sigint_and_sigterm_stop_cleanly() {
    let _one = serial();
    let pcap = std::env::temp_dir().join(format!("ferroce-int-{}.pcap", std::process::id()));
    let set = format!("capture.pcap={}", pcap.display());
    let (code, out, err, pid) = interrupt(
        &words(&format!("write_bw --loopback -D 30 -s 4096 --set {set}")),
        libc::SIGINT,
        |t| t.contains("#bytes"),
    );
    assert_eq!(code, 130, "{err}");
    assert!(err.contains("stopped by SIGINT"), "{err}");
    let row = out
        .lines()
        .find(|l| l.trim_start().starts_with("4096"))
        .unwrap_or_else(|| panic!("no result row: {out}"));
    let iters: u64 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(iters > 0, "{row}");
    assert!(!std::path::Path::new(&format!("/var/run/dpdk/rnic_perf-{pid}")).exists());
    let v = Command::new(env!("CARGO_BIN_EXE_rnic-pcap"))
        .arg("verify")
        .arg(&pcap)
        .output()
        .unwrap();
    let vout = String::from_utf8_lossy(&v.stdout);
    assert!(
        v.status.success() && vout.contains("all ICRCs ok"),
        "{vout}"
    );
    let _ = std::fs::remove_file(&pcap);

    // With --json, the document carries what was measured before the signal: the rows, the
    // counters, and that it was interrupted.
    let mut child = spawn_rnic_perf(
        &["write_bw", "--loopback", "-D", "30", "-s", "4096", "--json"],
        Stdio::piped(),
    );
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("#bytes") {
        line.clear();
        assert!(
            std::io::BufRead::read_line(&mut err, &mut line).unwrap() > 0,
            "no table header"
        );
    }
    std::thread::sleep(Duration::from_millis(1500));
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["interrupted"], true, "{v}");
    assert_eq!(v["error"], "stopped by SIGINT", "{v}");
    let rows = rows(&v, "client");
    assert_eq!(rows.len(), 1, "{v}");
    assert!(rows[0]["iterations"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["counters"]["ferroce1"]["sent_pkts"].as_u64().unwrap() > 0,
        "{v}"
    );

    // A server waiting for its client, stopped by SIGTERM.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    drop(l);
    let (code, _, err, pid) = interrupt(
        &words(&format!(
            "send_bw --port net_null0,no-rx=1 --ip 10.99.0.9/24 -p {port}"
        )),
        libc::SIGTERM,
        |t| t.contains("Waiting for client"),
    );
    assert_eq!(code, 143, "{err}");
    assert!(!std::path::Path::new(&format!("/var/run/dpdk/rnic_perf-{pid}")).exists());
}

/// The capture carries time-of-day timestamps that never go backwards (so it merges with a
/// host's tcpdump), cuts frames at the snap length, and records nothing while switched off.
#[test]
fn capture_is_wall_clock_stamped_snapped_and_switchable() {
    let _one = serial();
    let pcap = std::env::temp_dir().join(format!("ferroce-cap-{}.pcap", std::process::id()));
    let set = format!("capture.pcap={}", pcap.display());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    loopback(&words(&format!(
        "write_bw -n 50 -s 4096 --set {set} --set capture.snaplen=100"
    )));
    let d = std::fs::read(&pcap).unwrap();
    assert_eq!(
        u32::from_le_bytes(d[16..20].try_into().unwrap()),
        100,
        "snaplen"
    );
    let (mut off, mut last, mut n) = (24usize, 0u64, 0);
    while off + 16 <= d.len() {
        let w = |i: usize| u32::from_le_bytes(d[off + i..off + i + 4].try_into().unwrap());
        let ts = w(0) as u64 * 1_000_000_000 + w(4) as u64;
        let (incl, orig) = (w(8) as usize, w(12) as usize);
        assert!(incl <= 100 && incl <= orig, "{incl} {orig}");
        assert!(ts >= last, "timestamps go backwards");
        assert!(
            (ts / 1_000_000_000).abs_diff(now) < 120,
            "not wall-clock: {ts}"
        );
        last = ts;
        n += 1;
        off += 16 + incl;
    }
    assert!(n > 50, "{n} frames");
    loopback(&words(&format!(
        "write_bw -n 50 --set {set} --set capture.enabled=false"
    )));
    assert_eq!(
        std::fs::read(&pcap).unwrap().len(),
        24,
        "only the file header"
    );
    let _ = std::fs::remove_file(&pcap);
}

/// Each end names its own device, and a UD size above the MTU is clamped with perftest's
/// notice rather than silently.
#[test]
fn headers_and_notices_say_what_happens() {
    let _one = serial();
    let out = rnic_perf(&words("send_bw --loopback -c UD -s 8192 -n 50"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("Device         : ferroce1"),
        "the client runs on ferroce1: {text}"
    );
    assert!(
        text.contains("Max msg size in UD is MTU 4096") && text.contains("Changing to this MTU"),
        "{text}"
    );
}

/// Errors and logs that say why: a client without a server says it is waiting, then gives
/// the error once; the engine's debug logs name the RNIC of each QP (QPN 0x11 is on both).
#[test]
fn errors_and_logs_say_which_and_why() {
    let _one = serial();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let r = common::rnicd::Rnicd::start("perf-wait", &[]);
    let mut child = spawn_rnic_perf(
        &words(&format!(
            "write_bw --rnicd {} -d ferroce1 -p {port} 127.0.0.1",
            r.sock()
        )),
        Stdio::null(),
    );
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    std::io::BufRead::read_line(&mut err, &mut first).unwrap();
    assert!(
        first.contains(&format!("no server at 127.0.0.1:{port} yet")) && first.contains("retrying"),
        "{first}"
    );
    // Ctrl-C stops the wait at once; the error is said once.
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let t0 = Instant::now();
    let st = child.wait().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(!st.success());
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("stopped by SIGINT"), "{rest}");
    drop(r);
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rnic-perf"));
    cmd.args(["write_bw", "--loopback", "-n", "20", "-s", "4096"])
        .env("RUST_LOG", "roce=debug");
    let (out, _) = common::run_for(&mut cmd, Duration::from_secs(60));
    let t = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{t}");
    for dev in ["ferroce0", "ferroce1"] {
        assert!(
            t.lines()
                .any(|l| l.contains(&format!("rnic{{dev={dev}}}")) && l.contains("QP state")),
            "no QP state log names {dev}:\n{t}"
        );
    }
}

/// perftest's other flags: -T/-S set the path's traffic class and service level (seen on
/// the wire), -N drops the peak, --output prints one figure, --ipv6 runs the TCP exchange
/// over IPv6, --use_old_post_send is accepted, -V prints the version, and --run_infinitely
/// prints a row every -D seconds until Ctrl-C.
#[test]
fn perftest_flags_scripts_use() {
    let _one = serial();
    let pcap = std::env::temp_dir().join(format!("ferroce-tos-{}.pcap", std::process::id()));
    let set = format!("capture.pcap={}", pcap.display());
    let v = loopback(&words(&format!(
        "write_bw -n 200 -T 106 -S 3 -N --use_old_post_send --ipv6 --set {set}"
    )));
    assert_eq!(rows(&v, "client")[0]["bw_peak_MBps"], 0.0, "-N: no peak");
    let d = Command::new(env!("CARGO_BIN_EXE_rnic-pcap"))
        .args(["decode", "--json"])
        .arg(&pcap)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&pcap);
    let writes: Vec<Value> = String::from_utf8_lossy(&d.stdout)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|f| f["kind"] == "roce" && f["opname"].as_str().unwrap_or("").contains("WRITE"))
        .collect();
    assert!(!writes.is_empty());
    assert!(writes.iter().all(|f| f["dscp"] == 26), "-T 106 = DSCP 26");
    let out = rnic_perf(&words("write_bw --loopback -n 200 --output bandwidth"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    let figure: f64 = text
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("one number: {text}"));
    assert!(figure > 0.0);
    let out = rnic_perf(&words("write_lat --loopback -n 100 --output latency"));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim().parse::<f64>().is_ok_and(|t| t > 0.0), "{text}");
    let out = rnic_perf(&["write_bw", "-V"]);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("Version: 6.06"));
    let (code, out, err, _) = interrupt(
        &words("write_bw --loopback --run_infinitely -D 1 -s 4096"),
        libc::SIGINT,
        |t| {
            t.lines()
                .filter(|l| l.trim_start().starts_with("4096"))
                .count()
                >= 2
        },
    );
    assert_eq!(code, 130, "{err}");
    assert!(
        out.lines()
            .filter(|l| l.trim_start().starts_with("4096"))
            .count()
            >= 2
    );
}

/// RUST_LOG=debug shows what the RNIC does - QP state changes, neighbour resolution, NAKs and
/// retransmissions under loss - in plain text when stderr is not a terminal.
#[test]
fn debug_logs_show_states_retries_and_resolution() {
    let _one = serial();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rnic-perf"));
    cmd.args([
        "write_bw",
        "--loopback",
        "-n",
        "300",
        "-s",
        "8192",
        "--set",
        "fault.loss=0.02",
    ])
    .env("RUST_LOG", "debug");
    let (out, killed) = common::run_for(&mut cmd, Duration::from_secs(120));
    assert!(!killed && out.status.success());
    let log = String::from_utf8_lossy(&out.stderr);
    for want in ["QP state", "neighbour resolved", "NAK", "retransmission"] {
        assert!(log.contains(want), "no {want:?} in the debug log");
    }
    assert!(!log.contains('\x1b'), "ANSI colours in a pipe");
}

#[test]
fn bad_arguments_are_clear_errors() {
    let _one = serial();
    for (args, want) in [
        (vec!["write_bw", "--loopback", "-c", "UD"], "UD"),
        (vec!["atomic_bw", "--loopback", "-s", "64"], "8-byte"),
        (vec!["write_bw", "--loopback", "-m", "1000"], "-m 1000"),
        (vec!["write_lat", "--loopback", "-q", "2"], "-q"),
        (
            vec!["write_bw", "--loopback", "--workers", "3"],
            "--workers",
        ),
        (
            vec!["write_bw", "--workers", "2", "--port", "net_null0"],
            "--workers",
        ),
        (
            vec!["write_bw", "--loopback", "10.99.0.1"],
            "no server address",
        ),
        (vec!["write_bw", "-d", "mlx5_0", "--loopback"], "mlx5_0"),
        (
            vec!["write_bw", "--port", "net_null0", "--ip", "10.99.0.300/24"],
            "10.99.0.300",
        ),
        (
            vec!["send_bw", "--loopback", "--set", "roce.bogus=1"],
            "roce.bogus",
        ),
        // Errors name the cause, not DPDK's errno.
        (
            vec![
                "write_bw",
                "--port",
                "net_foo0",
                "--ip",
                "10.99.0.9/24",
                "127.0.0.1",
            ],
            "no virtual device driver net_foo",
        ),
        (
            vec![
                "write_bw",
                "--port",
                "net_af_packet0,iface=ferroce-none0",
                "--ip",
                "10.99.0.9/24",
                "127.0.0.1",
            ],
            "no network interface ferroce-none0",
        ),
        (
            vec!["write_bw", "--loopback", "--mac", "02:00:00:00:00:09"],
            "--mac",
        ),
        (
            vec!["write_lat", "--loopback", "-e"],
            "-e is not available with write_lat",
        ),
        (
            vec!["write_bw", "--loopback", "-R", "--ipv6"],
            "-R: rdma_cm addresses are IPv4",
        ),
        (
            vec!["write_bw", "--port", "18515", "10.99.0.1"],
            "perftest's TCP port is -p/--tcp-port here",
        ),
        (
            vec!["write_bw", "--loopback", "--output", "latency"],
            "--output latency",
        ),
        (
            vec!["write_bw", "--loopback", "-x", "5", "-n", "10"],
            "-x 5: no such GID (invalid argument: GID index 5 out of range)",
        ),
    ] {
        let out = rnic_perf(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A server that is not there, and a peer that speaks nonsense: errors, no crash, no hang.
#[test]
fn a_misbehaving_peer_is_an_error() {
    let _one = serial();
    // A fake perftest server that sends garbage where the keys should be.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port().to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = [0u8; 16];
        s.read_exact(&mut buf).unwrap();
        s.write_all(b"6.06\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
        let mut b4 = [0u8; 4];
        s.read_exact(&mut b4).unwrap();
        s.write_all(&[0, 0, 0x10, 0]).unwrap();
        s.read_exact(&mut b4).unwrap();
        s.write_all(&[0, 0, 0, 0x40]).unwrap();
        let mut b2 = [0u8; 2];
        s.read_exact(&mut b2).unwrap();
        s.write_all(b"3\0").unwrap();
        let mut key = [0u8; 108];
        s.read_exact(&mut key).unwrap();
        s.write_all(&[b'z'; 108]).unwrap();
        let _ = s.read(&mut key);
    });
    let start = Instant::now();
    let out = rnic_perf(&words(&format!(
        "write_bw --port net_null0,no-rx=1 --ip 10.99.0.9/24 -p {port} -n 10 127.0.0.1"
    )));
    fake.join().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("key"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(30));

    // A fake client that closes after the version: the server reports it and exits.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    let mut srv = spawn_rnic_perf(
        &words(&format!(
            "send_lat --port net_null0,no-rx=1 --ip 10.99.0.9/24 -p {port}"
        )),
        Stdio::null(),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => {
                let _ = srv.kill();
                panic!("server never listened: {e}");
            }
        }
    };
    s.write_all(b"1.00\0\0\0\0\0\0\0\0\0\0\0\0").unwrap();
    drop(s);
    let out = srv.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("version") || err.contains("closed"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// A loopback `write_bw` of `n` 64 KiB messages through the emulated switch with 10 Gb/s
/// ports but a 500 Mb/s server port, plus `extra` options.
fn slow_server_switch(n: u32, extra: &[&str]) -> Value {
    let n = n.to_string();
    let mut args = vec![
        "write_bw",
        "-s",
        "65536",
        "-n",
        &n,
        "--switch-mbps",
        "10000",
        "--switch-server-mbps",
        "500",
    ];
    args.extend_from_slice(extra);
    loopback(&args)
}

/// `--switch-*`: the loopback pair through the emulated switch. A slow server port with PFC
/// pauses the client instead of dropping; with ECN marking and DCQCN the client takes the
/// server's CNPs; the switch's counters are in the JSON; the options need --loopback.
#[test]
fn the_loopback_pair_through_the_emulated_switch() {
    let _g = serial();
    let v = slow_server_switch(300, &["--switch-pfc", "0"]);
    let sw = &v["counters"]["switch"];
    assert!(sw["pfc_xoff"].as_u64().unwrap() > 0, "{sw}");
    assert_eq!(sw["drops_ingress"], 0, "{sw}");
    assert_eq!(sw["drops_buffer"], 0, "{sw}");
    assert!(v["counters"]["ferroce1"]["rx_pfc"].as_u64().unwrap() > 0);
    let gbps = rows(&v, "client")[0]["bw_avg_Gbps"].as_f64().unwrap();
    assert!(gbps < 0.5, "the 500 Mb/s port is the limit: {gbps} Gb/s");
    let v = slow_server_switch(
        300,
        &words(
            "--switch-ecn 20,200,0.2 --set roce.ecn=true --set dcqcn.rp=true --set dcqcn.np=true",
        ),
    );
    let sw = &v["counters"]["switch"];
    assert!(sw["ecn_marked"].as_u64().unwrap() > 0, "{sw}");
    assert!(
        v["counters"]["ferroce1"]["rp_cnp_handled"]
            .as_u64()
            .unwrap()
            > 0
    );
    // The switch's capture: PFC frames and CE-marked RoCE frames, as they left.
    let dir = std::env::temp_dir().join(format!("ferroce-swpcap-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cap = dir.join("sw.pcap");
    slow_server_switch(
        100,
        &words(&format!(
            "--switch-ecn 20,200,0.2 --switch-pfc 0 --set roce.ecn=true --switch-pcap {}",
            cap.display()
        )),
    );
    let data = std::fs::read(&cap).unwrap();
    let frames: Vec<Vec<u8>> = roce::pcap::Reader::new(&data)
        .unwrap()
        .map(|r| r.unwrap().data.to_vec())
        .collect();
    assert!(frames
        .iter()
        .any(|f| dcb::pfc::PauseFrame::parse(f).is_some()));
    assert!(frames
        .iter()
        .any(|f| roce::wire::frame::parse(f)
            .is_ok_and(|p| p.repr.ip.ecn() == roce::wire::ipv4::Ecn::Ce)));
    let _ = std::fs::remove_dir_all(&dir);
    for bad in [
        vec!["write_bw", "--switch-mbps", "1000"],
        vec!["write_bw", "--loopback", "--switch-ecn", "1,2,0.1"],
        vec!["write_bw", "--loopback", "--switch-mbps", "0"],
        vec![
            "write_bw",
            "--loopback",
            "--switch-mbps",
            "1000",
            "--switch-ecn",
            "9,1,2",
        ],
        vec![
            "write_bw",
            "--loopback",
            "--switch-mbps",
            "1000",
            "--switch-pfc",
            "8",
        ],
    ] {
        let o = rnic_perf(&bad);
        assert!(!o.status.success(), "{bad:?} accepted");
        assert!(!o.stderr.is_empty(), "{bad:?}: no reason given");
    }
}
