//! rnicd's configuration tools: `--check` finds what cannot work before anything starts (no
//! address, a capture directory that does not exist, an interface that is missing or whose
//! MTU is below `port.mtu`) and says what only the port can tell; `--print-config` prints
//! the effective configuration, which reads back as the same configuration.

use std::process::{Command, Output};

fn rnicd(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_rnicd"))
        .args(args)
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `rnicd args --check`, which must exit with `code`; what it printed.
fn check(args: &[&str], code: i32) -> String {
    let o = rnicd(&[args, &["--check"]].concat());
    let t = text(&o);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {t}");
    t
}

/// `check` of an AF_PACKET port on `iface` with address 10.99.0.3/24, and `more`.
fn check_af_packet(iface: &str, more: &[&str], code: i32) -> String {
    let port = format!("net_af_packet0,iface={iface}");
    check(
        &[&["--port", &port, "--ip", "10.99.0.3/24"], more].concat(),
        code,
    )
}

#[test]
fn check_finds_what_cannot_start() {
    // Fine: lo exists and its MTU (65536) holds 5000.
    let t = check_af_packet("lo", &["--set", "port.mtu=5000"], 0);
    assert!(
        t.contains("configuration ok") && t.contains("lo exists"),
        "{t}"
    );
    assert!(
        t.contains("mac the port's") && !t.contains("00:00:00:00:00:00"),
        "{t}"
    );
    assert!(t.contains("needs the port"), "{t}");
    // Each problem is named, and the exit status is 2.
    for (args, want) in [
        (vec!["--port", "net_af_packet0,iface=lo"], "no IP address"),
        (
            vec![
                "--port",
                "net_null0",
                "--ip",
                "10.99.0.3/24",
                "--set",
                "capture.pcap=/nonexistent-dir/x.pcap",
            ],
            "capture.pcap /nonexistent-dir/x.pcap",
        ),
    ] {
        let t = check(&args, 2);
        assert!(t.contains(want), "{args:?}: {t}");
    }
    // A right configuration naming an interface this machine lacks: "not here", exit 1.
    let t = check_af_packet("ferroce-none0", &[], 1);
    assert!(
        t.contains("no network interface ferroce-none0") && t.contains("not here"),
        "{t}"
    );
}

/// Every configuration the README and the tests use checks as it should: the loopback pair
/// and a tap port (whose driver creates the interface) are fine; the example configuration
/// is valid, only its interface is not on this machine.
#[test]
fn check_accepts_the_configurations_in_use() {
    let ws = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let example = ws.join("docs/rnic.example.toml");
    for (args, code, want) in [
        (vec!["--loopback"], 0, "internal ring link"),
        (
            vec!["--port", "net_tap0,iface=ferrotap0", "--ip", "10.99.0.5/24"],
            0,
            "the driver creates its interface",
        ),
        (
            vec!["--port", "net_tun0,iface=ferrotun0", "--ip", "10.99.0.5/24"],
            0,
            "the driver creates its interface",
        ),
        (
            vec!["--config", example.to_str().unwrap()],
            1,
            "no network interface veth-rnic here",
        ),
        (
            vec![
                "--config",
                example.to_str().unwrap(),
                "--set",
                "port.device=net_af_packet0,iface=lo",
            ],
            0,
            "configuration ok",
        ),
    ] {
        let t = check(&args, code);
        assert!(t.contains(want), "{args:?}: {t}");
    }
}

/// An interface whose MTU is below port.mtu, in a private network namespace (as root).
#[test]
fn check_compares_port_mtu_with_the_interface() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root for a network namespace");
        return;
    }
    let ns = format!("ferroce-chk-{}", std::process::id());
    let ip = |a: &[&str]| Command::new("ip").args(a).status().unwrap().success();
    assert!(ip(&["netns", "add", &ns]));
    let ok = ip(&[
        "-n", &ns, "link", "add", "v0", "type", "veth", "peer", "name", "v1",
    ]) && ip(&["-n", &ns, "link", "set", "v0", "mtu", "1500"]);
    let o = Command::new("ip")
        .args(["netns", "exec", &ns, env!("CARGO_BIN_EXE_rnicd")])
        .args([
            "--port",
            "net_af_packet0,iface=v0",
            "--ip",
            "10.99.0.3/24",
            "--set",
            "port.mtu=5000",
            "--check",
        ])
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    ip(&["netns", "del", &ns]);
    assert!(ok);
    let t = text(&o);
    assert_eq!(o.status.code(), Some(2), "{t}");
    assert!(t.contains("port.mtu 5000 exceeds v0's MTU 1500"), "{t}");
}

#[test]
fn print_config_reads_back() {
    let o = rnicd(&[
        "--port",
        "net_null0",
        "--ip",
        "10.99.0.3/24",
        "--set",
        "roce.dscp=26",
        "--print-config",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let toml = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(
        toml.contains("dscp = 26") && toml.contains("ud_rx_hold_us = 50000"),
        "{toml}"
    );
    let f = std::env::temp_dir().join(format!("ferroce-printed-{}.toml", std::process::id()));
    std::fs::write(&f, &toml).unwrap();
    let again = rnicd(&["--config", f.to_str().unwrap(), "--print-config"]);
    let _ = std::fs::remove_file(&f);
    assert_eq!(String::from_utf8_lossy(&again.stdout), toml);
}
