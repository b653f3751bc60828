//! Unmodified RDMA programs on ferroce: Debian's own `ibv_devices`, `ibv_devinfo`, rdma-core's
//! pingpong examples and perftest's `ib_*` binaries run through `ferroce-run` (installed as
//! `make install` installs it) on ferroce's libibverbs.so.1, between two processes on
//! `rnicd --loopback` (one per RNIC), on one RNIC talking to itself (internal loopback), and
//! against rnic-perf; and a C program built against `<infiniband/verbs.h>` checks error paths,
//! the extended verbs and what is not supported (dataplane/ibverbs/tests/verbs_check.c).
//!
//! Needs Debian's `perftest`, `ibverbs-utils` and `libibverbs-dev` (scripts/deps.sh installs
//! them) and this build's libibverbs.so (`make test` builds it).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

mod common;

use common::rnicd::{free_port, perf, serial, temp_dir, Rnicd};

/// ferroce installed into a temporary prefix as a user would (`make install-files`).
struct Install {
    prefix: PathBuf,
}

fn install() -> &'static Install {
    static I: OnceLock<Install> = OnceLock::new();
    I.get_or_init(|| {
        // Also checks that the library is this build's and makes the stubs.
        common::ibverbs_libdir();
        // Kept for the process: every test runs the installed ferroce-run.
        let prefix = common::process_temp_dir("ibverbs-install").join("prefix");
        common::make("install-files", &[format!("PREFIX={}", prefix.display())]);
        for f in [
            "bin/ferroce-run",
            "lib/ferroce/libibverbs.so.1",
            "lib/ferroce/libmlx5.so.1",
            "lib/ferroce/libefa.so.1",
            "lib/ferroce/librdmacm.so.1",
            "bin/rnic-sim",
            "share/man/man1/rnicd.1",
            "share/man/man1/rnic-sim.1",
            "share/bash-completion/completions/rnic-ctl",
            "share/zsh/site-functions/_rnic-perf",
            "share/fish/vendor_completions.d/rnic-pcap.fish",
            "lib/systemd/system/rnicd.service",
        ] {
            assert!(
                prefix.join(f).exists(),
                "make install-files did not install {f}"
            );
        }
        // The man pages are the tools' own options; the unit is one systemd accepts.
        let man = std::fs::read_to_string(prefix.join("share/man/man1/rnic-ctl.1")).unwrap();
        assert!(
            man.contains(".TH rnic-ctl 1") && man.contains("socket"),
            "{man}"
        );
        let unit =
            std::fs::read_to_string(prefix.join("lib/systemd/system/rnicd.service")).unwrap();
        assert!(
            unit.contains(&format!("ExecStart={}/bin/rnicd", prefix.display())),
            "{unit}"
        );
        if Path::new("/usr/bin/systemd-analyze").exists() {
            let o = Command::new("systemd-analyze")
                .arg("verify")
                .arg(prefix.join("lib/systemd/system/rnicd.service"))
                .env("MANPATH", prefix.join("share/man"))
                .output()
                .unwrap();
            assert!(o.status.success(), "systemd-analyze verify: {}", text(&o));
        }
        Install { prefix }
    })
}

/// `ferroce-run --socket SOCK ARGS...`, as installed.
fn run(sock: &str, args: &[&str]) -> Command {
    let mut c = Command::new(install().prefix.join("bin/ferroce-run"));
    c.args(["--socket", sock])
        .args(args)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("FERROCE_LIBDIR");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `cmd` to completion (30 s at most), checks that it succeeded and that its output
/// says each of `want`; the output.
fn says(cmd: &mut Command, want: &[&str]) -> String {
    let (o, _) = common::run_for(cmd, Duration::from_secs(30));
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    for w in want {
        assert!(t.contains(w), "{w:?} missing:\n{t}");
    }
    t
}

/// Runs `server` and then `client` (argument lists, 60 s at most) and checks that both
/// succeeded and said `want`; their outputs.
fn pair_saying(r: &Rnicd, server: &[&str], client: &[&str], want: &str) -> [String; 2] {
    let limit = Duration::from_secs(60);
    let (so, co) = pair(run(r.sock(), server), run(r.sock(), client), limit);
    [(so, server), (co, client)].map(|(o, args)| {
        let t = text(&o);
        assert!(o.status.success() && t.contains(want), "{args:?}: {t}");
        t
    })
}

/// Runs `server` and then `client` (each a full command), both to completion.
fn pair(mut server: Command, mut client: Command, limit: Duration) -> (Output, Output) {
    let srv = std::thread::spawn(move || common::run_for(&mut server, limit));
    std::thread::sleep(Duration::from_millis(400));
    let (co, ck) = common::run_for(&mut client, limit);
    let (so, sk) = srv.join().unwrap();
    assert!(
        !ck && !sk,
        "did not finish:\nserver: {}\nclient: {}",
        text(&so),
        text(&co)
    );
    (so, co)
}

/// perftest's result row: the numbers after its `#bytes` header.
fn perftest_row(t: &str) -> Option<Vec<f64>> {
    let mut lines = t
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"));
    lines.next()?;
    let row: Vec<f64> = lines
        .next()?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    (row.len() >= 3).then_some(row)
}

#[test]
fn ibv_devices_and_ibv_devinfo_list_ferroce() {
    let _one = serial();
    let r = Rnicd::start("ibv-dev", &[]);
    // GUIDs are EUI-64s of the MACs (02:00:00:99:00:01 -> 000000fffe990001).
    let devices = ["ferroce0", "ferroce1", "000000fffe990001"];
    says(&mut run(r.sock(), &["ibv_devices"]), &devices);
    let devinfo = [
        "hca_id:\tferroce1",
        "transport:\t\t\tInfiniBand (0)",
        "vendor_id:\t\t\t0xffffff",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "active_mtu:\t\t4096 (5)",
        "atomic_cap:\t\t\tATOMIC_HCA (1)",
        "fe80::ff:fe99:2, RoCE v2",
        "::ffff:10.99.0.2, RoCE v2",
    ];
    says(
        &mut run(r.sock(), &["ibv_devinfo", "-v", "-d", "ferroce1"]),
        &devinfo,
    );
    // No rnicd: no devices, and why.
    let (o, _) = common::run_for(
        &mut run("/nonexistent/rnicd.sock", &["ibv_devices"]),
        Duration::from_secs(30),
    );
    let t = text(&o);
    assert!(!t.contains("ferroce0"), "{t}");
    assert!(t.contains("cannot reach rnicd"), "{t}");
    // ferroce-run without a command: usage, exit 2.
    let o = Command::new(install().prefix.join("bin/ferroce-run"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("usage: ferroce-run"));
}

#[test]
fn rdma_core_pingpongs_run_both_roles() {
    let _one = serial();
    let r = Rnicd::start("ibv-pp", &[]);
    // The tool, its arguments (iterations first), the server's and the client's RNIC.
    for (tool, extra, server_dev, client_dev) in [
        ("ibv_rc_pingpong", "-n 200 -s 4096", "ferroce0", "ferroce1"),
        ("ibv_rc_pingpong", "-n 100 -e", "ferroce1", "ferroce0"),
        ("ibv_uc_pingpong", "-n 100", "ferroce0", "ferroce1"),
        ("ibv_ud_pingpong", "-n 100 -s 1024", "ferroce0", "ferroce1"),
        ("ibv_srq_pingpong", "-n 100 -q 4", "ferroce0", "ferroce1"),
        ("ibv_srq_pingpong", "-n 50 -e", "ferroce1", "ferroce0"),
        // Internal loopback: both ends on one RNIC.
        ("ibv_rc_pingpong", "-n 100", "ferroce0", "ferroce0"),
    ] {
        let extra: Vec<&str> = extra.split(' ').collect();
        let port = free_port().to_string();
        let mut s = run(r.sock(), &[tool, "-d", server_dev, "-g", "1", "-p", &port]);
        s.args(&extra);
        let mut c = run(r.sock(), &[tool, "-d", client_dev, "-g", "1", "-p", &port]);
        c.args(&extra).arg("127.0.0.1");
        let (so, co) = pair(s, c, Duration::from_secs(60));
        let n = extra[1];
        for (o, who) in [(&so, "server"), (&co, "client")] {
            let t = text(o);
            assert!(o.status.success(), "{tool} {extra:?} {who}: {t}");
            assert!(
                t.contains(&format!("{n} iters in")),
                "{tool} {extra:?} {who}: {t}"
            );
        }
    }
}

/// `ib_*` on two processes, each on its own RNIC (or both on one); returns the client's
/// result row after checking both ends exited 0.
fn perftest(r: &Rnicd, tool: &str, args: &[&str], devs: (&str, &str)) -> Vec<f64> {
    let port = free_port().to_string();
    let mut s = run(
        r.sock(),
        &[tool, "-d", devs.0, "-x", "1", "-F", "-p", &port],
    );
    s.args(args);
    let mut c = run(
        r.sock(),
        &[tool, "-d", devs.1, "-x", "1", "-F", "-p", &port],
    );
    c.args(args).arg("127.0.0.1");
    let (so, co) = pair(s, c, Duration::from_secs(120));
    for (o, who) in [(&so, "server"), (&co, "client")] {
        assert!(o.status.success(), "{tool} {args:?} {who}: {}", text(o));
    }
    let t = text(&co);
    // On ferroce, as on rxe, perftest posts with ibv_post_send (its wr API is for mlx5/EFA).
    assert!(t.contains("Device         : ") && t.contains(devs.1), "{t}");
    perftest_row(&t).unwrap_or_else(|| panic!("{tool} {args:?}: no result row:\n{t}"))
}

#[test]
fn perftest_binaries_run_between_two_processes() {
    let _one = serial();
    let r = Rnicd::start("ibv-perf", &[]);
    let pair01 = ("ferroce0", "ferroce1");
    for (tool, args) in [
        ("ib_write_bw", vec!["-s", "65536", "-n", "500"]),
        ("ib_read_bw", vec!["-s", "16384", "-n", "500"]),
        ("ib_send_bw", vec!["-s", "4096", "-n", "1000"]),
        ("ib_atomic_bw", vec!["-n", "500"]),
        ("ib_write_bw", vec!["-s", "1024", "-n", "300", "-c", "UC"]),
        ("ib_send_bw", vec!["-s", "1024", "-n", "300", "-c", "UD"]),
        ("ib_write_lat", vec!["-s", "64", "-n", "500"]),
        ("ib_send_lat", vec!["-s", "8", "-n", "500"]),
        ("ib_read_lat", vec!["-s", "64", "-n", "300"]),
        ("ib_atomic_lat", vec!["-n", "300"]),
        ("ib_send_lat", vec!["-s", "64", "-n", "200", "-c", "UD"]),
    ] {
        let row = perftest(&r, tool, &args, pair01);
        if tool.ends_with("_lat") {
            // #bytes #iterations t_min t_max t_typical t_avg ...
            assert!(
                row.len() >= 6 && row[2] > 0.0 && row[2] <= row[4] && row[4] <= row[3],
                "{tool} {args:?}: {row:?}"
            );
            continue;
        }
        // #bytes #iterations BW-peak BW-average MsgRate
        let n: f64 = args[args.iter().position(|a| *a == "-n").unwrap() + 1]
            .parse()
            .unwrap();
        assert_eq!(row[1], n, "{tool} {args:?}: {row:?}");
        assert!(
            row.len() >= 5 && row[3] > 0.0 && row[4] > 0.0,
            "{tool} {args:?}: {row:?}"
        );
    }
    // Internal loopback: both processes on one RNIC (checked: the bandwidth's average, the
    // latency's typical figure).
    for (tool, args, dev, figure) in [
        ("ib_write_bw", ["-s", "65536", "-n", "300"], "ferroce0", 3),
        ("ib_send_lat", ["-s", "8", "-n", "300"], "ferroce1", 4),
    ] {
        let row = perftest(&r, tool, &args, (dev, dev));
        assert!(row[figure] > 0.0, "{tool}: {row:?}");
    }
    common::rnicd::wait_idle(r.sock());
}

/// rdma-core's rdma_cm programs, unmodified, through ferroce's librdmacm.so.1 and its
/// connection manager: rping with data verification in both roles (server on ferroce1, client
/// connecting from ferroce0 across the link), ucmatose with several connections,
/// rdma_server/rdma_client (the synchronous endpoint API), perftest's -R, and udaddy (UD
/// services resolved with SIDR).
#[test]
fn rdma_cm_programs_connect_through_the_connection_manager() {
    let _one = serial();
    let r = Rnicd::start("ibv-rdmacm", &[]);
    // ferroce1 is 10.99.0.2 on rnicd's loopback link; ferroce0 (10.99.0.1) reaches it. -v
    // prints every ping's data on both sides, -V checks it.
    let rping = |role| ["rping", role, "-a", "10.99.0.2", "-v", "-V", "-C", "20"];
    for t in pair_saying(&r, &rping("-s"), &rping("-c"), "ping data: rdma-ping-") {
        assert_eq!(t.matches("ping data: rdma-ping-").count(), 20, "rping: {t}");
    }
    let ucmatose = |role| ["ucmatose", role, "10.99.0.2", "-c", "4", "-C", "20"];
    let done = "data transfers complete";
    pair_saying(&r, &ucmatose("-b"), &ucmatose("-s"), done);
    // librdmacm's synchronous endpoint API (rdma_create_ep, rdma_get_request, static
    // buffers registered in place): a message each way.
    pair_saying(
        &r,
        &["rdma_server", "-s", "10.99.0.2", "-p", "7471"],
        &["rdma_client", "-s", "10.99.0.2", "-p", "7471"],
        ": end 0",
    );
    // perftest's rdma_cm mode (-R; the server listens on the wildcard address, on every
    // device): bandwidth and latency, sizes and counts as asked.
    for (tool, args) in [
        ("ib_write_bw", ["-s", "65536", "-n", "200"]),
        ("ib_send_lat", ["-s", "64", "-n", "200"]),
    ] {
        let port = free_port().to_string();
        let common = ["-x", "1", "-F", "-R", "-p", port.as_str()];
        let mut s = run(r.sock(), &[tool, "-d", "ferroce1"]);
        s.args(common).args(args);
        let mut c = run(r.sock(), &[tool, "-d", "ferroce0"]);
        c.args(common).args(args).arg("10.99.0.2");
        let (so, co) = pair(s, c, Duration::from_secs(60));
        assert!(so.status.success(), "{tool} -R server: {}", text(&so));
        assert!(co.status.success(), "{tool} -R client: {}", text(&co));
        let row = perftest_row(&text(&co)).unwrap_or_else(|| panic!("{}", text(&co)));
        assert_eq!(
            (row[0], row[1]),
            (args[1].parse().unwrap(), 200.0),
            "{tool} -R"
        );
    }
    // UD over rdma_cm: the service is resolved with SIDR (udaddy: UD messages each way, the
    // server answering through an address handle made from each receive).
    let udaddy = |role| ["udaddy", role, "10.99.0.2", "-C", "20"];
    pair_saying(&r, &udaddy("-b"), &udaddy("-s"), done);
    common::rnicd::wait_idle(r.sock());
}

#[test]
fn perftest_against_rnic_perf() {
    let _one = serial();
    let r = Rnicd::start("ibv-rp", &[]);
    // Debian's perftest `tool` on `dev`, `port`, with `args`.
    let theirs = |tool: &str, dev: &str, port: u16, args: &[&str]| {
        let p = port.to_string();
        let mut c = run(r.sock(), &[tool, "-d", dev, "-x", "1", "-F", "-p", &p]);
        c.args(args);
        c
    };
    // Debian's ib_write_bw serves, rnic-perf connects; then rnic-perf serves ib_send_lat.
    let port = free_port();
    let args = ["-s", "65536", "-n", "300"];
    let s = theirs("ib_write_bw", "ferroce0", port, &args);
    let ours = ["-x", "1", "-s", "65536", "-n", "300"];
    let c = perf(r.sock(), "ferroce1", "write_bw", port, &ours, false);
    let (so, co) = pair(s, c, Duration::from_secs(120));
    assert!(so.status.success(), "ib_write_bw: {}", text(&so));
    assert!(co.status.success(), "rnic-perf: {}", text(&co));
    let v: serde_json::Value = serde_json::from_slice(&co.stdout).unwrap();
    assert_eq!(v["results"][0]["iterations"], 300, "{v}");
    assert!(
        v["results"][0]["bw_avg_MBps"].as_f64().unwrap() > 0.0,
        "{v}"
    );

    let port = free_port();
    let ours = ["-x", "1", "-s", "8", "-n", "300"];
    let s = perf(r.sock(), "ferroce0", "send_lat", port, &ours, true);
    let args = ["-s", "8", "-n", "300", "127.0.0.1"];
    let c = theirs("ib_send_lat", "ferroce1", port, &args);
    let (so, co) = pair(s, c, Duration::from_secs(120));
    assert!(so.status.success(), "rnic-perf: {}", text(&so));
    assert!(co.status.success(), "ib_send_lat: {}", text(&co));
    let row = perftest_row(&text(&co)).expect("ib_send_lat row");
    assert_eq!(row[1], 300.0, "{row:?}");
    common::rnicd::wait_idle(r.sock());
}

/// rnic-perf's -R against Debian's perftest -R (on ferroce's librdmacm) in both roles: the
/// exchange's SENDs carry perftest's binary keys, and the test's QPs are connected by the
/// connection manager (RC, several QPs) or resolved with SIDR (UD, with the client's QPN
/// sent as perftest sends it).
#[test]
fn rnic_perf_rdma_cm_mode_against_perftest() {
    let _one = serial();
    let r = Rnicd::start("ibv-rpr", &[]);
    // perftest's tool, rnic-perf's test, their arguments, whether rnic-perf serves.
    for (tool, test, args, ours_serve) in [
        ("ib_write_bw", "write_bw", "-s 16384 -n 300 -q 2", false),
        ("ib_write_bw", "write_bw", "-s 16384 -n 300 -q 2", true),
        ("ib_send_lat", "send_lat", "-s 8 -n 200 -c UD", false),
        ("ib_send_lat", "send_lat", "-s 8 -n 200 -c UD", true),
        ("ib_read_bw", "read_bw", "-s 4096 -n 200", true),
    ] {
        let args: Vec<&str> = args.split(' ').collect();
        let port = free_port();
        let p = port.to_string();
        let theirs = |dev: &str, server: bool| {
            let mut c = run(
                r.sock(),
                &[tool, "-d", dev, "-x", "1", "-F", "-R", "-p", &p],
            );
            c.args(&args);
            if !server {
                c.arg("10.99.0.1");
            }
            c
        };
        let mut a = args.clone();
        a.extend_from_slice(&["-x", "1", "-R"]);
        let (so, co, ours) = if ours_serve {
            let s = perf(r.sock(), "ferroce0", test, port, &a, true);
            let (so, co) = pair(s, theirs("ferroce1", false), Duration::from_secs(120));
            (so, co, 0)
        } else {
            let mut c = perf(r.sock(), "ferroce1", test, port, &a, true);
            c.arg("10.99.0.1");
            let (so, co) = pair(theirs("ferroce0", true), c, Duration::from_secs(120));
            (so, co, 1)
        };
        for (o, who) in [(&so, "server"), (&co, "client")] {
            assert!(
                o.status.success(),
                "{tool}/{test} -R {args:?} {who}: {}",
                text(o)
            );
        }
        let mine = if ours == 0 { &so } else { &co };
        let v: serde_json::Value = serde_json::from_slice(&mine.stdout)
            .unwrap_or_else(|e| panic!("rnic-perf JSON ({e}): {}", text(mine)));
        let n: u64 = args[3].parse().unwrap();
        let qps: u64 = if args.contains(&"-q") { 2 } else { 1 };
        let theirs_out = if ours == 0 { &co } else { &so };
        if test.ends_with("_bw") {
            // The client's figures; a bandwidth server prints the client's report.
            assert_eq!(v["results"][0]["iterations"], n * qps, "{v}");
            let row = perftest_row(&text(theirs_out)).expect("perftest row");
            assert_eq!(row[1], (n * qps) as f64, "{tool}: {row:?}");
        } else {
            assert_eq!(v["results"][0]["iterations"], n, "{v}");
            let row = perftest_row(&text(theirs_out)).expect("perftest row");
            assert_eq!(row[1], n as f64, "{tool}: {row:?}");
        }
    }
    common::rnicd::wait_idle(r.sock());
}

/// `dataplane/ibverbs/tests/NAME.c` built into `dir` against the system's headers and
/// libibverbs, as any rdma-core program is.
fn build_c_program(dir: &Path, name: &str) -> PathBuf {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let exe = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let o = Command::new(&cc)
        .args(["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Werror"])
        .arg(ws.join(format!("dataplane/ibverbs/tests/{name}.c")))
        .args(["-libverbs", "-lrdmacm", "-pthread", "-o"])
        .arg(&exe)
        .output()
        .expect("a C compiler (cc)");
    assert!(o.status.success(), "{}", text(&o));
    exe
}

#[test]
fn a_c_program_sees_the_verbs_errors_rdma_core_documents() {
    let _one = serial();
    let dir = temp_dir("verbs-check");
    let exe = build_c_program(&dir.0, "verbs_check");
    let r = Rnicd::start("ibv-check", &[]);
    for dev in ["ferroce0", "ferroce1"] {
        // On ferroce1 the library says why each verb failed (FERROCE_VERBOSE).
        let mut cmd = run(r.sock(), &[exe.to_str().unwrap(), "-d", dev]);
        if dev == "ferroce1" {
            cmd.env("FERROCE_VERBOSE", "1");
        }
        let (o, killed) = common::run_for(&mut cmd, Duration::from_secs(120));
        let t = text(&o);
        assert!(!killed && o.status.success(), "verbs_check on {dev}:\n{t}");
        assert!(t.contains("0 failure(s)") && !t.contains("FAIL"), "{t}");
        // Every check ran (a program that stops early must not pass).
        let checks = t.lines().filter(|l| l.starts_with("ok ")).count();
        assert!(checks >= 150, "only {checks} checks ran:\n{t}");
        if dev == "ferroce1" {
            let why = String::from_utf8_lossy(&o.stderr);
            for want in [
                "ah_attr.is_global is 0, but RoCE addresses the peer by its GID",
                "ibv_create_cq: cqe",
                "memory window(s) bound to the MR",
            ] {
                assert!(why.contains(want), "FERROCE_VERBOSE lacks {want:?}:\n{why}");
            }
        }
    }
    common::rnicd::wait_idle(r.sock());
}

/// Clients of the libibverbs library killed with SIGKILL at random moments while they
/// register, re-register and deregister memory as fast as they can (reg_churn.c: registration
/// moves the pages onto a memfd and hands it to rnicd; a kill can fall anywhere in that), move
/// data through it and create and destroy objects. After each kill rnicd must hold nothing of
/// the client; meanwhile two rnic-perf processes keep moving verified data on the same
/// rnicd, and must not notice.
#[test]
fn libibverbs_clients_killed_mid_registration_leave_nothing_behind() {
    use std::io::BufRead;
    const KILLS: usize = 24;
    let _one = serial();
    let dir = temp_dir("reg-kill");
    let exe = build_c_program(&dir.0, "reg_churn");
    let r = Rnicd::start("reg-kill-rnicd", &[]);
    let sock = r.sock().to_string();
    let gauges = |sock: &str| {
        let v = common::rnicd::ctl_json(sock, &["stat"]);
        let mut sum = std::collections::BTreeMap::<String, u64>::new();
        for d in v.as_array().unwrap() {
            for k in ferroce_host::abi::proto::STAT_GAUGES {
                *sum.entry(k.into()).or_default() += d["port"][k].as_u64().unwrap_or(0);
            }
        }
        sum
    };
    let idle = gauges(&sock);
    // The bystanders: verified SEND runs between two rnic-perf processes until the kills end.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bystander = {
        let (stop, sock) = (stop.clone(), sock.clone());
        std::thread::spawn(move || {
            let mut runs = 0;
            while runs == 0 || !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let port = free_port();
                let args = ["-n", "3000", "-s", "8192", "--verify"];
                let (so, co) = pair(
                    perf(&sock, "ferroce1", "send_bw", port, &args, true),
                    perf(&sock, "ferroce0", "send_bw", port, &args, false),
                    Duration::from_secs(120),
                );
                assert!(
                    so.status.success() && co.status.success(),
                    "a bystander's run failed:\n{}\n{}",
                    text(&so),
                    text(&co)
                );
                runs += 1;
            }
            runs
        })
    };
    let phase_names = [
        "other",
        "ibv_reg_mr",
        "ibv_rereg_mr",
        "ibv_dereg_mr",
        "a WRITE",
        "objects",
    ];
    let mut landed = [0usize; 6];
    let (mut iterations, mut registrations) = (0u64, 0u64);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    for k in 0..KILLS {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let phase = dir.0.join(format!("phase-{k}"));
        let dev = ["ferroce0", "ferroce1"][k % 2];
        let mut child = run(&sock, &["--no-ns", exe.to_str().unwrap(), "-d", dev, "-p"])
            .arg(&phase)
            .args(["-s", &rng.to_string()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn reg_churn");
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        if line.trim() != "ready" {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "reg_churn did not start: {line}{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        // Up to 400 ms of churn, then SIGKILL: no exit handler, no library teardown.
        std::thread::sleep(Duration::from_millis(rng % 400));
        let pid = child.id();
        // SAFETY: signalling our own unreaped child by its pid.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut rest);
        let o = child.wait_with_output().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&o.status),
            Some(libc::SIGKILL),
            "reg_churn ended before the kill: {rest}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(!rest.contains("FAIL"), "reg_churn found a fault: {rest}");
        let words = std::fs::read(&phase).unwrap();
        let word = |i: usize| u64::from_le_bytes(words[i * 8..i * 8 + 8].try_into().unwrap());
        landed[(word(0) as usize).min(5)] += 1;
        iterations += word(1);
        registrations += word(2);
        // Everything the client held is gone from rnicd (the bystanders hold theirs).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let v = common::rnicd::ctl_json(&sock, &["res"]);
            let held: Vec<&serde_json::Value> = ["qps", "objects", "clients"]
                .iter()
                .flat_map(|k| v[*k].as_array().into_iter().flatten())
                .filter(|o| o["pid"].as_u64() == Some(pid as u64))
                .collect();
            if held.is_empty() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "after kill {k}: rnicd still holds {held:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let runs = bystander.join().expect("the bystanders' traffic failed");
    let summary: Vec<String> = phase_names
        .iter()
        .zip(landed)
        .map(|(n, c)| format!("{n}: {c}"))
        .collect();
    eprintln!(
        "{KILLS} kills ({}); {iterations} iterations, {registrations} registrations; {runs} bystander runs",
        summary.join(", ")
    );
    // Most kills must land inside a registration call, or the test is not testing that.
    assert!(
        landed[1] + landed[2] + landed[3] >= KILLS / 3,
        "too few kills inside a registration: {summary:?}"
    );
    common::rnicd::wait_idle(&sock);
    let end = gauges(&sock);
    assert_eq!(
        end, idle,
        "rnicd's levels after the kills and the bystanders"
    );
}

/// The functions (with their symbol versions) an ELF library defines.
fn exports(lib: &Path) -> std::collections::BTreeSet<String> {
    let o = Command::new("readelf")
        .args(["--dyn-syms", "-W"])
        .arg(lib)
        .output()
        .expect("readelf");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8 && f[3] == "FUNC" && f[6] != "UND").then(|| f[7].to_string())
        })
        .collect()
}

/// The stub libmlx5.so.1, libefa.so.1 and ferroce's librdmacm.so.1 export every function of
/// the installed libraries, with the same symbol versions (default and older ones), so any
/// program linked against them loads under ferroce-run; and a program that uses an rdma_cm
/// call ferroce does not serve yet (multicast: mckey) is told so, instead of failing with a
/// bare error.
#[test]
fn the_direct_verbs_stubs_export_what_the_real_libraries_do() {
    let multiarch = Command::new("cc").arg("-print-multiarch").output().unwrap();
    let sysdir = PathBuf::from("/usr/lib").join(String::from_utf8_lossy(&multiarch.stdout).trim());
    for lib in ["libmlx5.so.1", "libefa.so.1", "librdmacm.so.1"] {
        let real = exports(&sysdir.join(lib));
        assert!(real.len() > 3, "{lib}: {real:?}");
        let ours = exports(&install().prefix.join("lib/ferroce").join(lib));
        let missing: Vec<_> = real.difference(&ours).collect();
        assert!(missing.is_empty(), "{lib} stub lacks {missing:?}");
    }
    let _one = serial();
    let r = Rnicd::start("ibv-rdmacm-stub", &[]);
    // Multicast over rdma_cm is not served yet: mckey is told so, and fails cleanly.
    let (o, killed) = common::run_for(
        &mut run(r.sock(), &["mckey", "-m", "239.0.0.1", "-b", "10.99.0.2"]),
        Duration::from_secs(30),
    );
    let t = text(&o);
    assert!(!killed && !o.status.success(), "{t}");
    assert!(t.contains("not served by ferroce yet"), "{t}");
}

/// Programs that look for the device before using it find it: `/dev/infiniband/<dev_name>`
/// a readable and writable character device, `/sys/class/infiniband/<name>` with the values
/// the verbs report, `ibstat` (libibumad) listing the RNICs, pyverbs importing and using one;
/// as root (a mount namespace) and as an unprivileged user (a user namespace too), each
/// keeping its own uid; nothing on the host; and `--no-ns` without the view.
#[test]
fn devices_are_visible_where_programs_look() {
    let _one = serial();
    let r = Rnicd::start("ibv-visible", &["--set", "host.mode=0666"]);
    let check =
        "set -e; d=/dev/infiniband/uverbs_ferroce0; test -c $d && test -r $d && test -w $d; \
                 c=/sys/class/infiniband; cat $c/ferroce0/node_guid $c/ferroce0/node_type \
                 $c/ferroce0/ports/1/gids/1 $c/ferroce0/ports/1/gid_attrs/types/1 \
                 /sys/class/infiniband_verbs/uverbs_ferroce1/ibdev; test -d /sys/class/net; \
                 echo x > /dev/null; echo uid=$(id -u)";
    let sysfs = [
        "0000:00ff:fe99:0001",
        "1: CA",
        "0000:0000:0000:0000:0000:ffff:0a63:0001",
        "RoCE v2",
        "ferroce1",
        "uid=0",
    ];
    says(&mut run(r.sock(), &["sh", "-c", check]), &sysfs);
    assert!(
        !Path::new("/dev/infiniband/uverbs_ferroce0").exists(),
        "nothing is left on the host"
    );
    let (o, _) = common::run_for(
        &mut run(
            r.sock(),
            &[
                "--no-ns",
                "sh",
                "-c",
                "test -e /dev/infiniband/uverbs_ferroce0",
            ],
        ),
        Duration::from_secs(30),
    );
    assert!(!o.status.success(), "--no-ns shows no device files");
    if Path::new("/usr/sbin/ibstat").exists() || Path::new("/usr/bin/ibstat").exists() {
        let ibstat = [
            "CA 'ferroce0'",
            "CA 'ferroce1'",
            "State: Active",
            "Link layer: Ethernet",
        ];
        says(&mut run(r.sock(), &["ibstat"]), &ibstat);
    }
    if Path::new("/usr/lib/python3/dist-packages/pyverbs").exists() {
        let script = "import pyverbs.device as d\n\
            import pyverbs.providers.mlx5.mlx5dv, pyverbs.providers.efa.efadv\n\
            import pyverbs.enums as e\n\
            from pyverbs.pd import PD\nfrom pyverbs.mr import MR\nfrom pyverbs.cq import CQ\n\
            from pyverbs.qp import QP, QPInitAttr, QPCap\n\
            print(sorted(x.name.decode() for x in d.get_device_list()))\n\
            ctx = d.Context(name='ferroce1')\n\
            print('gid', ctx.query_gid(1, 1))\n\
            pd = PD(ctx)\n\
            mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE)\n\
            cq = CQ(ctx, 16)\n\
            qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)))\n\
            print('qp', qp.qp_num, 'mr', mr.lkey == mr.rkey)\n";
        let (o, _) = common::run_for(
            &mut run(r.sock(), &["/usr/bin/python3", "-c", script]),
            Duration::from_secs(60),
        );
        let t = text(&o);
        assert!(o.status.success(), "pyverbs: {t}");
        assert!(t.contains("['ferroce0', 'ferroce1']"), "{t}");
        assert!(
            t.contains("gid 0000:0000:0000:0000:0000:ffff:0a63:0002"),
            "{t}"
        );
        assert!(t.contains("mr True"), "{t}");
    }
    // An unprivileged user: a user namespace as well, and the program keeps its uid.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 && Path::new("/usr/bin/setpriv").exists() {
        use std::os::unix::fs::PermissionsExt;
        let dir = r.socket.parent().unwrap();
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(install().prefix.join("bin/ferroce-run"))
            .args(["--socket", r.sock(), "sh", "-c", check])
            .env_remove("LD_LIBRARY_PATH")
            .env_remove("FERROCE_LIBDIR")
            .env("TMPDIR", "/tmp");
        let (o, _) = common::run_for(&mut c, Duration::from_secs(30));
        let t = text(&o);
        assert!(o.status.success(), "as nobody: {t}");
        assert!(t.contains("uid=65534") && t.contains("RoCE v2"), "{t}");
    }
}
