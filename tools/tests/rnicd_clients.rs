//! rnicd with applications in other processes: `rnicd --loopback` serves two RNICs, and
//! rnic-perf runs as two separate client processes (server on ferroce0, client on
//! ferroce1) through its socket and shared-memory rings - every perftest test with
//! `--verify`; a client killed mid-run is reclaimed and its peer ends with the right status;
//! rnic-ctl shows devices, objects and counters; rnicd stopping fails its clients cleanly.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::rnicd::{ctl, ctl_json, free_port, json, perf, serial, temp_dir, wait_idle, Rnicd};

/// Runs a server process on ferroce0 and a client process on ferroce1; returns both outputs.
fn run_pair(r: &Rnicd, test: &str, args: &[&str]) -> (Output, Output) {
    let port = free_port();
    let mut s = perf(r.sock(), "ferroce0", test, port, args, true);
    let mut c = perf(r.sock(), "ferroce1", test, port, args, false);
    let srv = std::thread::spawn(move || common::run_for(&mut s, Duration::from_secs(120)));
    std::thread::sleep(Duration::from_millis(300));
    let (co, ck) = common::run_for(&mut c, Duration::from_secs(120));
    let (so, sk) = srv.join().unwrap();
    assert!(!ck && !sk, "{test} {args:?} did not finish");
    (so, co)
}

#[test]
fn every_perftest_test_between_two_client_processes() {
    let _one = serial();
    let r = Rnicd::start("perf", &[]);
    for (test, args) in [
        ("write_bw", vec!["-s", "65536", "-n", "200"]),
        ("write_bw", vec!["-s", "3000", "-n", "300", "-q", "2"]),
        ("read_bw", vec!["-s", "5000", "-n", "200"]),
        ("send_bw", vec!["-s", "1500", "-n", "400"]),
        ("send_bw", vec!["-s", "1024", "-n", "300", "-c", "UD"]),
        ("send_bw", vec!["-s", "9000", "-n", "100", "-c", "UC"]),
        ("atomic_bw", vec!["-n", "300"]),
        ("write_lat", vec!["-s", "100", "-n", "200"]),
        ("read_lat", vec!["-s", "64", "-n", "200"]),
        ("send_lat", vec!["-s", "64", "-n", "100", "-e"]),
        ("send_bw", vec!["-s", "4096", "-n", "200", "-e"]),
        ("send_lat", vec!["-s", "2", "-n", "200"]),
        ("send_lat", vec!["-s", "512", "-n", "100", "-c", "UD"]),
        ("atomic_lat", vec!["-n", "200"]),
    ] {
        let mut a = args.clone();
        a.push("--verify");
        let (so, co) = run_pair(&r, test, &a);
        let (s, c) = (json(&so, "server"), json(&co, "client"));
        let rows = c["results"].as_array().cloned().unwrap_or_default();
        assert_eq!(rows.len(), 1, "{test} {args:?}: {c}");
        let verified = c["verified_messages"].as_u64().unwrap_or(0)
            + s["verified_messages"].as_u64().unwrap_or(0);
        assert!(verified > 0, "{test} {args:?}: nothing verified: {c} {s}");
        if test.ends_with("_bw") {
            let n = common::flag_number(&args, "-n").unwrap();
            let q = common::flag_number(&args, "-q").unwrap_or(1);
            assert_eq!(verified, n * q, "{test} {args:?}: every message verified");
        }
    }
    for (test, args) in [
        ("rc_pingpong", vec!["-n", "100"]),
        ("ud_pingpong", vec!["-n", "50"]),
    ] {
        let (so, co) = run_pair(&r, test, &args);
        let (s, c) = (json(&so, "server"), json(&co, "client"));
        assert_eq!(c["iters"], 100 / if test == "ud_pingpong" { 2 } else { 1 });
        assert_eq!(c["remote_qpn"], s["local_qpn"], "{test}");
    }
    // Both processes went away: rnicd holds nothing.
    wait_idle(r.sock());
}

/// Each RNIC over two workers with `worker.spread`: one client process's four QPs are on
/// both workers and share its CQ; every message of the bandwidth tests arrives verified, and
/// the clients' going leaves nothing on any worker.
#[test]
fn one_clients_qps_over_two_workers_through_rnicd() {
    let _one = serial();
    let r = Rnicd::start(
        "spread",
        &["--set", "worker.count=2", "--set", "worker.spread=true"],
    );
    for (test, args) in [
        ("write_bw", vec!["-s", "20000", "-n", "200", "-q", "4"]),
        ("read_bw", vec!["-s", "5000", "-n", "200", "-q", "4"]),
        ("send_bw", vec!["-s", "1500", "-n", "300", "-q", "4"]),
    ] {
        let mut a = args.clone();
        a.push("--verify");
        let (so, co) = run_pair(&r, test, &a);
        let (s, c) = (json(&so, "server"), json(&co, "client"));
        let verified = c["verified_messages"].as_u64().unwrap_or(0)
            + s["verified_messages"].as_u64().unwrap_or(0);
        let n = common::flag_number(&args, "-n").unwrap();
        assert_eq!(
            verified,
            n * 4,
            "{test} {args:?}: every message verified: {c} {s}"
        );
    }
    wait_idle(r.sock());
}

/// Spawns `cmd` with its output discarded.
fn spawn_quiet(mut cmd: Command) -> Child {
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn")
}

/// `test` with `args` as two rnic-perf processes through rnicd (server on ferroce0,
/// client on ferroce1 a moment later), their output kept.
fn spawn_pair(sock: &str, test: &str, args: &[&str]) -> (Child, Child) {
    let port = free_port();
    let srv = spawn_quiet(perf(sock, "ferroce0", test, port, args, true));
    std::thread::sleep(Duration::from_millis(300));
    let cli = spawn_quiet(perf(sock, "ferroce1", test, port, args, false));
    (srv, cli)
}

fn wait_child(c: Child, limit: Duration) -> Output {
    let pid = c.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(c.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(o) => o.unwrap(),
        Err(_) => {
            // SAFETY: our child.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("process {pid} did not end in {limit:?}");
        }
    }
}

#[test]
fn a_killed_client_is_reclaimed_and_its_peer_sees_retries_exhausted() {
    let _one = serial();
    let r = Rnicd::start("kill", &[]);
    // The WRITE receiver (server) is killed mid-run: its QP is torn down as a dying
    // process's is on a hardware RNIC, so the sender's WRITEs are never acknowledged.
    let (srv, cli) = spawn_pair(r.sock(), "write_bw", &["-D", "30"]);
    // Wait until traffic flows (rnicd shows both QPs in RTS or RTR).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let v = ctl_json(r.sock(), &["res"]);
        if v["qps"].as_array().is_some_and(|q| q.len() == 2) {
            break;
        }
        assert!(Instant::now() < deadline, "the test did not start: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let srv_pid = srv.id();
    // SAFETY: our child.
    assert_eq!(unsafe { libc::kill(srv_pid as i32, libc::SIGKILL) }, 0);
    let so = wait_child(srv, Duration::from_secs(10));
    assert!(!so.status.success());
    let co = wait_child(cli, Duration::from_secs(60));
    let text =
        String::from_utf8_lossy(&co.stdout).to_string() + &String::from_utf8_lossy(&co.stderr);
    assert!(!co.status.success(), "the sender did not notice: {text}");
    assert!(
        text.contains("RetryExcErr"),
        "the sender should end with retries exhausted: {text}"
    );
    // Everything both processes held is gone from rnicd.
    wait_idle(r.sock());
    let ferroce1 = device_stat(r.sock(), "ferroce1");
    let retries = ferroce1["port"]["retry_exceeded_err"].as_u64().unwrap_or(0);
    assert!(retries >= 1, "{ferroce1}");
}

/// `device`'s entry (an RNIC, a worker or the switch) in `rnic-ctl stat` of rnicd at `sock`.
fn device_stat(sock: &str, device: &str) -> serde_json::Value {
    let v = ctl_json(sock, &["stat"]);
    v.as_array()
        .unwrap()
        .iter()
        .find(|d| d["device"] == device)
        .unwrap_or_else(|| panic!("no {device} in {v}"))
        .clone()
}

#[test]
fn rnic_ctl_shows_devices_objects_and_counters() {
    let _one = serial();
    let mut r = Rnicd::start("ctl", &[]);
    let o = ctl(r.sock(), &["dev"]);
    let t = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    for want in [
        "hca_id:\tferroce0",
        "hca_id:\tferroce1",
        "PORT_ACTIVE (4)",
        "active_mtu:\t\t4096 (5)",
        "link_layer:\t\tEthernet",
        "0000:0000:0000:0000:0000:ffff:0a63:0001, RoCE v2",
        "node_guid:\t\t\t0000:00ff:fe99:0001",
    ] {
        assert!(t.contains(want), "{want:?} missing from:\n{t}");
    }
    let d = ctl_json(r.sock(), &["dev", "-d", "ferroce1"]);
    assert_eq!(d.as_array().unwrap().len(), 1);
    assert_eq!(d[0]["mac"], "02:00:00:99:00:02");
    // Objects of a running test, with their owner.
    let (srv, cli) = spawn_pair(r.sock(), "send_bw", &["-D", "3"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let res = loop {
        let v = ctl_json(r.sock(), &["res"]);
        if v["qps"].as_array().is_some_and(|q| q.len() == 2) {
            break v;
        }
        assert!(Instant::now() < deadline, "{v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let pids = [srv.id(), cli.id()];
    for q in res["qps"].as_array().unwrap() {
        assert!(pids.contains(&(q["pid"].as_u64().unwrap() as u32)), "{q}");
        assert_eq!(q["comm"], "rnic-perf");
    }
    let text = String::from_utf8_lossy(&ctl(r.sock(), &["res", "qp"]).stdout).to_string();
    assert!(text.contains("type RC state RT"), "{text}");
    assert!(text.contains("comm rnic-perf"), "{text}");
    let text = String::from_utf8_lossy(&ctl(r.sock(), &["res"]).stdout).to_string();
    assert!(text.contains("ferroce0: pd 1 cq 2 qp 1 mr 1"), "{text}");
    assert!(
        text.contains(&format!(
            "client ferroce0 pid {} uid 0 comm rnic-perf",
            srv.id()
        )) || text.contains(&format!(
            "client ferroce0 pid {} uid 0 comm rnic-perf",
            cli.id()
        )),
        "{text}"
    );
    let text = String::from_utf8_lossy(&ctl(r.sock(), &["stat", "--qp"]).stdout).to_string();
    assert!(text.contains("link ferroce1/1 lqpn"), "{text}");
    assert!(text.contains("sent_pkts"), "{text}");
    wait_child(srv, Duration::from_secs(60));
    wait_child(cli, Duration::from_secs(60));
    wait_idle(r.sock());
    // No capture file configured: a clear error.
    let o = ctl(r.sock(), &["capture", "ferroce0", "on"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("capture.pcap"));
    let sock = r.socket.clone();
    assert!(r.stop().success());
    assert!(!sock.exists(), "socket removed at exit");
    let o = ctl(sock.to_str().unwrap(), &["dev"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("is rnicd running?"));
}

/// rnic-ctl behaves as a command-line tool: quiet when its reader goes (`| head`), says so
/// when rnicd holds nothing, refuses `--watch 0`, prints counters as a table with rates in
/// human units, and its JSON has counters as objects and GIDs as text.
#[test]
fn rnic_ctl_is_a_well_behaved_cli() {
    let _one = serial();
    // Each RNIC on a worker thread of its own: rnic-ctl stat shows both workers' load.
    let r = Rnicd::start("ctl-cli", &["--workers", "2"]);
    let t = String::from_utf8_lossy(&ctl(r.sock(), &["res"]).stdout).to_string();
    assert!(t.contains("no clients"), "{t}");
    // 0 is no interval; past a day (1e20 s panicked building the Duration) neither.
    for bad in ["0", "1e20"] {
        let o = ctl(r.sock(), &["stat", "--watch", bad]);
        assert_eq!(o.status.code(), Some(2), "--watch {bad}");
        assert!(
            String::from_utf8_lossy(&o.stderr).contains("more than 0"),
            "--watch {bad}"
        );
    }
    // `rnic-ctl --json stat --watch 1 | head -c 100`: the reader goes; no panic.
    let mut c = Command::new(env!("CARGO_BIN_EXE_rnic-ctl"))
        .args(["--socket", r.sock(), "--json", "stat", "--watch", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 100];
    std::io::Read::read_exact(c.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(c.stdout.take());
    let o = c.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked") && err.is_empty(), "{err}");
    let v = ctl_json(r.sock(), &["stat"]);
    assert!(v[0]["port"]["tx_frames"].is_u64(), "counters by name: {v}");
    let d = ctl_json(r.sock(), &["dev"]);
    assert_eq!(
        d[0]["gids"][1], "0000:0000:0000:0000:0000:ffff:0a63:0001",
        "{d}"
    );
    // Traffic, watched: one counter a line, rates in units.
    let (srv, cli) = spawn_pair(r.sock(), "write_bw", &["-D", "4", "-s", "65536"]);
    std::thread::sleep(Duration::from_secs(2));
    let mut c = Command::new(env!("CARGO_BIN_EXE_rnic-ctl"));
    c.args(["--socket", r.sock(), "stat", "--watch", "0.5"]);
    let (o, _) = common::run_for(&mut c, Duration::from_secs(2));
    let t = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(t.lines().all(|l| l.len() < 100), "{t}");
    assert!(t.contains("b/s") && t.contains("pps"), "{t}");
    assert!(
        t.contains("worker0 (ferroce0)") && t.contains("worker1 (ferroce1)"),
        "{t}"
    );
    wait_child(srv, Duration::from_secs(60));
    wait_child(cli, Duration::from_secs(60));
    // Both workers carried the traffic (the sender's and the receiver's RNIC), each busy a
    // part of the time it has run.
    for (w, rnic) in [("worker0", "ferroce0"), ("worker1", "ferroce1")] {
        let d = device_stat(r.sock(), w);
        assert_eq!(d["rnics"], serde_json::json!([rnic]), "{d}");
        let c = |k: &str| d["port"][k].as_u64().unwrap_or(0);
        assert!(c("busy_polls") > 0 && c("polls") >= c("busy_polls"), "{d}");
        assert!(c("busy_ns") > 0 && c("busy_ns") <= c("elapsed_ns"), "{d}");
    }
}

#[test]
fn a_second_rnicd_on_the_same_socket_is_refused_and_a_stopping_rnicd_fails_its_clients() {
    let _one = serial();
    let mut r = Rnicd::start("second", &[]);
    let mut c = Command::new(env!("CARGO_BIN_EXE_rnicd"));
    c.args(["--loopback", "--socket", r.sock(), "--duration", "5"]);
    let (o, killed) = common::run_for(&mut c, Duration::from_secs(30));
    assert!(!killed);
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("another rnicd is running"), "{e}");
    // A client in the middle of a long run: rnicd stops; the client ends with an error.
    let (srv, cli) = spawn_pair(r.sock(), "write_bw", &["-D", "30"]);
    std::thread::sleep(Duration::from_secs(2));
    let t0 = Instant::now();
    assert!(r.stop().success());
    let co = wait_child(cli, Duration::from_secs(20));
    let so = wait_child(srv, Duration::from_secs(20));
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert!(!co.status.success() && !so.status.success());
    let text = String::from_utf8_lossy(&co.stderr);
    assert!(
        text.contains("WrFlushErr") || text.contains("stopped") || text.contains("fatal"),
        "{text}"
    );
    assert!(!Path::new(&r.socket).exists());
}

#[test]
fn the_c_example_runs_both_roles_through_rnicd() {
    let _one = serial();
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = ws.join("dataplane/client");
    // The library must be this build's (make test builds it before the tests).
    common::fresh_cdylib(
        "libferroce_client.so",
        "ferroce-client",
        &["dataplane/client/src", "dataplane/host/src"],
    );
    // Installed as a user would (make install-files PREFIX=...), built with pkg-config.
    let dir = temp_dir("c-example");
    let prefix = dir.0.join("prefix");
    common::make("install-files", &[format!("PREFIX={}", prefix.display())]);
    let pc = ferroce_tests::output_ok(
        Command::new("pkg-config")
            .args(["--cflags", "--libs", "ferroce"])
            .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
        "pkg-config ferroce",
    );
    let flags = String::from_utf8(pc.stdout).unwrap();
    let exe = dir.0.join("rc_pingpong");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(root.join("examples/rc_pingpong.c"))
        .args(flags.split_whitespace())
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("a C compiler (cc)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = Rnicd::start("c", &[]);
    for extra in [
        vec!["-n", "300", "-s", "4096"],
        vec!["-n", "200", "-s", "100", "-e"],
    ] {
        let port = free_port().to_string();
        let mut s = Command::new(&exe);
        s.args(["-S", r.sock(), "-d", "ferroce0", "-p", &port])
            .args(&extra);
        let mut c = Command::new(&exe);
        c.args(["-S", r.sock(), "-d", "ferroce1", "-p", &port])
            .args(&extra)
            .arg("127.0.0.1");
        let srv = std::thread::spawn(move || common::run_for(&mut s, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(200));
        let (co, _) = common::run_for(&mut c, Duration::from_secs(60));
        let (so, _) = srv.join().unwrap();
        for (o, who) in [(&so, "server"), (&co, "client")] {
            let t = String::from_utf8_lossy(&o.stdout);
            assert!(
                o.status.success(),
                "{who} {extra:?}: {t}{}",
                String::from_utf8_lossy(&o.stderr)
            );
            let n = extra[1];
            assert!(t.contains(&format!("verified {n} messages")), "{who}: {t}");
            assert!(t.contains("usec/iter"), "{who}: {t}");
        }
        assert!(String::from_utf8_lossy(&co.stdout).contains("RDMA WRITE and READ"));
    }
    // Errors are errno values with a reason: an unknown device.
    let o = Command::new(&exe)
        .args(["-S", r.sock(), "-d", "mlx5_0", "-p", "1"])
        .output()
        .unwrap();
    assert!(!o.status.success());
    let e = String::from_utf8_lossy(&o.stderr);
    assert!(e.contains("mlx5_0") && e.contains("ferroce0"), "{e}");
    wait_idle(r.sock());
}

/// `rnic-ctl res` shows a client's PSNs and memory keys (what a peer needs to reach its
/// memory or take over its connection) only to the client's own user, root and rnicd's user;
/// another user sees the objects without them. Needs root (to run rnic-ctl as nobody).
#[test]
fn other_users_see_no_keys_or_psns() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || which("setpriv").is_none() {
        eprintln!("skipped: needs root and setpriv");
        return;
    }
    let _one = serial();
    let r = Rnicd::start("hide", &["--set", "host.mode=0666"]);
    // The socket's directory must let nobody through.
    use std::os::unix::fs::PermissionsExt;
    let dir = r.socket.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (srv, cli) = spawn_pair(r.sock(), "send_bw", &["-D", "3"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mine = loop {
        let v = ctl_json(r.sock(), &["res"]);
        let mrs = v["objects"]
            .as_array()
            .map_or(0, |o| o.iter().filter(|o| o["kind"] == "mr").count());
        if v["qps"].as_array().is_some_and(|q| q.len() == 2) && mrs == 2 {
            break v;
        }
        assert!(Instant::now() < deadline, "{v}");
        std::thread::sleep(Duration::from_millis(50));
    };
    for q in mine["qps"].as_array().unwrap() {
        assert!(
            q["sq_psn"].is_u64() && q["rq_psn"].is_u64(),
            "root sees PSNs: {q}"
        );
    }
    for o in mine["objects"].as_array().unwrap() {
        if o["kind"] == "mr" {
            assert!(o["key"].is_u64(), "root sees keys: {o}");
        }
    }
    // rnic-ctl on rnicd's socket as user and group nobody.
    let ctl_as_nobody = |args: &[&str]| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_rnic-ctl"))
            .args(["--socket", r.sock()])
            .args(args);
        common::run_for(&mut c, Duration::from_secs(30)).0
    };
    let o = ctl_as_nobody(&["--json", "res"]);
    let theirs = json(&o, "rnic-ctl res as nobody");
    assert_eq!(theirs["qps"].as_array().unwrap().len(), 2, "{theirs}");
    for q in theirs["qps"].as_array().unwrap() {
        assert!(
            q["sq_psn"].is_null() && q["rq_psn"].is_null(),
            "nobody sees another user's PSNs: {q}"
        );
    }
    for o in theirs["objects"].as_array().unwrap() {
        assert!(o["key"].is_null(), "nobody sees another user's keys: {o}");
    }
    let o = ctl_as_nobody(&["res", "mr"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("mrn") && !text.contains("lkey"), "{text}");
    wait_child(srv, Duration::from_secs(60));
    wait_child(cli, Duration::from_secs(60));
}

fn which(prog: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(prog))
            .find(|f| f.is_file())
    })
}

/// `rnicd --loopback --switch-*`: two client processes move verified data through the
/// emulated switch (a 2 Gb/s port with PFC) and `rnic-ctl stat` shows the switch's counters.
#[test]
fn rnicd_with_the_emulated_switch() {
    let _one = serial();
    let r = Rnicd::start(
        "sw",
        &[
            "--switch-mbps",
            "10000",
            "--switch-server-mbps",
            "2000",
            "--switch-pfc",
            "0",
        ],
    );
    let (so, co) = run_pair(&r, "write_bw", &["-s", "65536", "-n", "300", "--verify"]);
    let c = json(&co, "client");
    assert!(
        c["verified_messages"].as_u64().unwrap_or(0)
            + json(&so, "server")["verified_messages"]
                .as_u64()
                .unwrap_or(0)
            > 0,
        "{c}"
    );
    let gbps = c["results"][0]["bw_avg_Gbps"].as_f64().unwrap();
    assert!(gbps < 2.0, "the 2 Gb/s port is the limit: {gbps} Gb/s");
    let sw = device_stat(r.sock(), "switch0");
    assert!(sw["port"]["tx_frames"].as_u64().unwrap() > 300, "{sw}");
    assert_eq!(sw["port"]["drops_ingress"], 0, "{sw}");
    assert_eq!(sw["port"]["drops_buffer"], 0, "{sw}");
    let text = String::from_utf8_lossy(&ctl(r.sock(), &["stat"]).stdout).to_string();
    assert!(
        text.contains("\nswitch0\n") && text.contains("tx_frames"),
        "{text}"
    );
}
