//! rnic-pcap end to end, and ferroce's wire format against scapy's independent RoCEv2 layer:
//! scapy recomputes the ICRC of every frame `rnic-pcap gen` writes (IPv4, IPv6, VLAN, every
//! opcode), and ferroce decodes frames scapy built (IPv6, VLAN, ECN, DETH+ImmDt, FECN...).

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_rnic-pcap")
}

fn tmp(name: &str) -> PathBuf {
    common::process_temp_dir("rnic-pcap").join(name)
}

/// `rnic-pcap decode --json capture`, run to its end.
fn decode_json(capture: &Path) -> std::process::Output {
    Command::new(bin())
        .args(["decode", "--json"])
        .arg(capture)
        .output()
        .unwrap()
}

/// The JSON values `out` printed, one a line.
fn json_lines(out: &std::process::Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn scapy(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/scapy_roce.py");
    ferroce_tests::output_ok(
        Command::new("python3").arg(script).args(args),
        &format!("scapy_roce.py {args:?} (is scapy installed? run `make deps`)"),
    )
}

#[test]
fn generated_frames_verify_here_and_in_scapy() {
    let f = tmp("gen.pcap");
    let out = Command::new(bin()).arg("gen").arg(&f).output().unwrap();
    assert!(out.status.success());
    let out = Command::new(bin()).arg("verify").arg(&f).output().unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{line}");
    assert!(
        line.contains("160 RoCE (4 CNP)") && line.contains("all ICRCs ok"),
        "{line}"
    );
    let out = scapy(&["check", f.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.trim_end().ends_with("ok 160"), "{text}");
    std::fs::remove_file(f).ok();
}

#[test]
fn scapy_built_frames_decode_to_what_scapy_put_in() {
    let f = tmp("scapy.pcap");
    let out = scapy(&["gen", f.to_str().unwrap()]);
    let expected = json_lines(&out);
    let out = decode_json(&f);
    assert!(out.status.success());
    let got = json_lines(&out);
    assert_eq!(got.len(), expected.len());
    let data = std::fs::read(&f).unwrap();
    let frames: Vec<Vec<u8>> = roce::pcap::Reader::new(&data)
        .unwrap()
        .map(|r| r.unwrap().data.to_vec())
        .collect();
    for ((g, e), raw) in got.iter().zip(&expected).zip(&frames) {
        assert_eq!(g["icrc"], "ok", "{g}");
        for k in ["opcode", "dqpn", "psn", "dscp", "ecn", "pad"] {
            assert_eq!(g[k], e[k], "{k}: {g} vs {e}");
        }
        assert_eq!(g["ip"], if e["ipv6"] == true { 6 } else { 4 });
        match e["vlan"].as_array() {
            Some(v) => {
                assert_eq!(g["vlan"]["pcp"], v[0]);
                assert_eq!(g["vlan"]["vid"], v[1]);
            }
            None => assert!(g.get("vlan").is_none()),
        }
        let p = roce::wire::frame::parse(raw).unwrap();
        let hex: String = p.payload(raw).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, e["payload"].as_str().unwrap());
        if let Some(r) = e.get("reth") {
            assert_eq!(g["reth"]["va"], r[0]);
            assert_eq!(g["reth"]["rkey"], r[1]);
            assert_eq!(g["reth"]["len"], r[2]);
        }
        if let Some(a) = e.get("aeth") {
            assert_eq!(g["aeth"]["syndrome"], a[0]);
            assert_eq!(g["aeth"]["msn"], a[1]);
            assert_eq!(g["aeth"]["type"], "rnr");
            assert_eq!(g["aeth"]["rnr_timer"], 14);
        }
        if let Some(d) = e.get("deth") {
            assert_eq!(g["deth"]["qkey"], d[0]);
            assert_eq!(g["deth"]["sqpn"], d[1]);
        }
        if let Some(i) = e.get("imm") {
            assert_eq!(&g["imm"], i);
        }
        if let Some(a) = e.get("atomic") {
            assert_eq!(g["atomic"]["va"], a[0]);
            assert_eq!(g["atomic"]["rkey"], a[1]);
            assert_eq!(g["atomic"]["swap_add"], a[2]);
            assert_eq!(g["atomic"]["compare"], a[3]);
            assert_eq!(g["fecn"], true);
        }
        if e["opcode"] == 129 {
            assert_eq!(g["kind"], "cnp");
            assert_eq!(g["becn"], true);
        }
    }
    std::fs::remove_file(f).ok();
}

#[test]
fn verify_fails_on_a_corrupted_capture_and_bad_arguments_are_clear() {
    let f = tmp("corrupt.pcap");
    Command::new(bin()).arg("gen").arg(&f).status().unwrap();
    let mut data = std::fs::read(&f).unwrap();
    // Flip a payload byte of the first frame (after 24 + 16 header bytes and 42+ of headers).
    data[24 + 16 + 60] ^= 0xff;
    std::fs::write(&f, &data).unwrap();
    let out = Command::new(bin()).arg("verify").arg(&f).output().unwrap();
    let line = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{line}");
    assert!(line.contains("1 bad; first: frame 1: bad ICRC"), "{line}");
    let out = decode_json(&f);
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert!(first.contains(r#""icrc":"bad""#), "{first}");
    // Not a capture, missing file, bad subcommand: exit 2 with a message, no panic.
    std::fs::write(&f, b"hello, world, this is not a pcap file").unwrap();
    let out = Command::new(bin()).arg("decode").arg(&f).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a pcap"));
    let out = Command::new(bin())
        .args(["verify", "/nonexistent.pcap"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
    let out = Command::new(bin()).arg("frobnicate").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_file(f).ok();
}

#[test]
fn reads_pcapng_like_pcap() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus/atomic_faa.pcap");
    let ng = tmp("faa.pcapng");
    let st = Command::new("editcap")
        .args(["-F", "pcapng"])
        .arg(&corpus)
        .arg(&ng)
        .status()
        .expect("editcap (from tshark's wireshark-common): run `make deps`");
    assert!(st.success());
    let a = decode_json(&corpus);
    let b = decode_json(&ng);
    assert!(a.status.success() && b.status.success());
    assert_eq!(a.stdout, b.stdout);
    let out = Command::new(bin()).arg("verify").arg(&ng).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("100 RoCE"));
    std::fs::remove_file(ng).ok();
}

/// Frames that are not RoCE are named (ICMP, ICMPv6 ND, TCP, UDP) rather than "other";
/// MACs are printed one way (colons) everywhere; `-` reads the capture from standard input.
#[test]
fn other_protocols_are_named_and_stdin_is_read() {
    let f = tmp("misc.pcap");
    let script = format!(
        r#"
from scapy.all import Ether, IP, IPv6, ICMP, TCP, UDP, ARP, ICMPv6ND_NS, wrpcap
m = "52:54:00:99:00:02"
wrpcap("{}", [
    Ether(src=m, dst="02:00:00:99:00:03")/IP(src="10.99.0.2", dst="10.99.0.3")/ICMP(),
    Ether(src=m, dst="33:33:ff:00:00:03")/IPv6(src="fd00:99::2", dst="ff02::1:ff00:3")/ICMPv6ND_NS(tgt="fd00:99::3"),
    Ether(src=m, dst="02:00:00:99:00:03")/IP(src="10.99.0.2", dst="10.99.0.3")/TCP(sport=40000, dport=18515),
    Ether(src=m, dst="02:00:00:99:00:03")/IP(src="10.99.0.2", dst="10.99.0.3")/UDP(sport=5000, dport=53),
    Ether(src=m, dst="ff:ff:ff:ff:ff:ff")/ARP(hwsrc=m, psrc="10.99.0.2", pdst="10.99.0.3"),
])
"#,
        f.display()
    );
    let out = Command::new("python3")
        .arg("-c")
        .arg(&script)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = std::fs::read(&f).unwrap();
    let mut child = Command::new(bin())
        .args(["decode", "-", "--json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let v = json_lines(&out);
    let kinds: Vec<&str> = v.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["icmp", "nd", "tcp", "udp", "arp"]);
    assert_eq!(v[2]["dport"], 18515);
    assert_eq!(v[1]["icmp_type"], 135);
    assert_eq!(v[4]["sender_mac"], "52:54:00:99:00:02");
    assert_eq!(v[4]["src_mac"], "52:54:00:99:00:02");
    let text = Command::new(bin()).arg("decode").arg(&f).output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("ICMP 10.99.0.2 > 10.99.0.3 echo request"),
        "{text}"
    );
    assert!(text.contains("neighbour solicitation"), "{text}");
    assert!(
        text.contains("TCP 10.99.0.2:40000 > 10.99.0.3:18515"),
        "{text}"
    );
    assert!(!text.contains("other"), "{text}");
    std::fs::remove_file(f).ok();
}

/// rxe's rdma_cm exchange (rping): the MADs on QP1 decode as the connection manager's
/// messages, with the fields tshark's independent dissector reads from the same frames.
#[test]
fn cm_mads_decode_as_tshark_reads_them() {
    let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus/rping.pcap");
    let ours = decode_json(&corpus);
    assert!(ours.status.success());
    let frames = json_lines(&ours);
    let cm: Vec<&str> = frames
        .iter()
        .filter_map(|f| f["mad"]["cm"]["msg"].as_str())
        .collect();
    assert_eq!(cm, ["REQ", "REP", "RTU", "DREQ", "DREP"], "{cm:?}");
    let fields = [
        "infiniband.cm.req.localqpn",
        "infiniband.cm.req.startpsn",
        "infiniband.cm.req.serviceid.dport",
        "infiniband.cm.req.pkey",
        "infiniband.cm.req.rnrretrcount",
        "infiniband.cm.req.retrcount",
        "infiniband.cm.req.maxcmretr",
        "infiniband.cm.req.pppmtu",
        "infiniband.cm.req.responderres",
        "infiniband.cm.req.initdepth",
        "infiniband.cm.rep.localqpn",
        "infiniband.cm.rep.startpsn",
        "infiniband.cm.rep.remotecommid",
    ];
    let mut args = vec!["-r".to_string(), corpus.display().to_string()];
    args.extend(["-d", "udp.port==4791,infiniband", "-T", "fields"].map(String::from));
    for f in fields {
        args.extend(["-e".to_string(), f.to_string()]);
    }
    let t = Command::new("tshark")
        .args(&args)
        .output()
        .expect("tshark: run `make deps`");
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stderr));
    let text = String::from_utf8_lossy(&t.stdout);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    assert!(
        rows.len() >= 2 && rows[0].len() == fields.len(),
        "tshark's fields: {text}"
    );
    let num = |s: &str| -> u64 {
        match s.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap(),
            None => s.parse().unwrap(),
        }
    };
    let (req, rep) = (&frames[0]["mad"]["cm"], &frames[1]["mad"]["cm"]);
    let port = frames[0]["mad"]["rdma_cm"]
        .as_str()
        .unwrap()
        .trim_start_matches("tcp:");
    let u = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    let ours_req = [
        u(req, "qpn"),
        u(req, "starting_psn"),
        port.parse().unwrap(),
        u(req, "pkey"),
        u(req, "rnr_retry_count"),
        u(req, "retry_count"),
        u(req, "max_cm_retries"),
        u(req, "path_mtu"),
        u(req, "responder_resources"),
        u(req, "initiator_depth"),
    ];
    let theirs_req: Vec<u64> = rows[0][..10].iter().map(|s| num(s)).collect();
    assert_eq!(ours_req.to_vec(), theirs_req, "REQ");
    let ours_rep = [
        u(rep, "qpn"),
        u(rep, "starting_psn"),
        u(rep, "remote_comm_id"),
    ];
    let theirs_rep: Vec<u64> = rows[1][10..13].iter().map(|s| num(s)).collect();
    assert_eq!(ours_rep.to_vec(), theirs_rep, "REP");
    // The text line names them too.
    let line = Command::new(bin())
        .arg("decode")
        .arg(&corpus)
        .output()
        .unwrap();
    let first = String::from_utf8_lossy(&line.stdout)
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert!(
        first.contains("mad cm send REQ")
            && first.contains("qpn 0x31")
            && first.contains("rdma_cm tcp:7174"),
        "{first}"
    );
}
