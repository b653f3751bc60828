//! Hostile peers: an RNIC on DPDK (a ring port whose other end this test drives) receives
//! frames that scapy built (`tests/hostile_peer.py`, independent of ferroce's frame builder
//! and ICRC): accesses outside a region, overflowing VA + length, bad keys, length
//! mismatches, opcode sequence violations, PSNs far ahead, a flood of bad-ICRC frames,
//! duplicated READs and ATOMICs, a spoofed source address, an unknown QP and malformed
//! headers. Each case targets its own QP (an error takes a responder QP to the error state);
//! each must get the IBA's NAK or a counted drop, write no byte it may not, and leave the
//! other QPs working. At the end the pool's mbufs are back where they started.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dataplane::runtime::{test_config, Runtime};
use dataplane::worker::NicSnapshot;
use ferroce_tests::{connect_with, raw_pair, side, wait_until, Side};
use pmd_bindings::{Mbuf, Mempool, RxQueue, TxQueue};
use roce::types::{Gid, Qpn};
use roce::verbs::*;
use roce::wire::frame::{self, FrameKind};

const PEER_MAC: [u8; 6] = [0x52, 0x54, 0, 0x99, 0, 2];
/// The PSN every case's QP expects first from the peer.
const PSN: u32 = 5000;
const REGION: usize = 64 * 1024;
/// What the regions hold before the peer acts: any other byte is a write.
const FILL: u8 = 0x5a;

/// AETH syndromes (IBA 9.7.5.2.2, table 47).
const NAK_PSN_SEQ: u8 = 0x60;
const NAK_INVALID_REQUEST: u8 = 0x61;
const NAK_REMOTE_ACCESS: u8 = 0x62;

const CASES: [&str; 15] = [
    "arp",
    "write_past_end",
    "write_va_wraps",
    "write_bad_rkey",
    "write_length_mismatch",
    "write_middle_without_first",
    "write_first_then_only",
    "psn_far_ahead",
    "bad_icrc_flood",
    "read_replayed",
    "atomic_replayed",
    "spoofed_source",
    "unknown_qp",
    "malformed",
    "control",
];

/// A response the RNIC sent the peer: opcode, destination QP, PSN, AETH syndrome, the atomic
/// original value and the payload.
#[derive(Debug, Clone)]
struct Resp {
    opcode: u8,
    qpn: u32,
    psn: u32,
    syndrome: Option<u8>,
    orig: Option<u64>,
    payload: Vec<u8>,
}

struct Peer<'a> {
    rt: &'a Runtime,
    rx: &'a mut RxQueue,
    tx: &'a mut TxQueue,
    pool: &'a Mempool,
    /// Frames sent so far.
    sent: u64,
}

impl Peer<'_> {
    fn send(&mut self, f: &[u8]) {
        let mut m = self.pool.alloc().expect("mbuf for the peer's frame");
        m.extend_from_slice(f);
        self.tx.tx_one(m).expect("tx");
        self.sent += 1;
    }

    /// Sends `frames` back to back; then the RoCE frames the RNIC sends during `window`, or
    /// until `want` arrived.
    fn exchange(&mut self, frames: &[Vec<u8>], window: Duration, want: usize) -> Vec<Resp> {
        for f in frames {
            self.send(f);
        }
        self.responses(window, want)
    }

    /// Sends `frames` one at a time, each after the RNIC's answer to the one before (or a
    /// second without one), and returns all the answers.
    fn exchange_each(&mut self, frames: &[Vec<u8>]) -> Vec<Resp> {
        let mut r = Vec::new();
        for f in frames {
            self.send(f);
            r.extend(self.responses(Duration::from_secs(1), 1));
        }
        r
    }

    /// RoCE frames the RNIC sends during `window`, or until `want` arrived.
    fn responses(&mut self, window: Duration, want: usize) -> Vec<Resp> {
        let deadline = Instant::now() + window;
        let mut out = Vec::new();
        let mut burst: Vec<Mbuf> = Vec::with_capacity(32);
        while Instant::now() < deadline && out.len() < want {
            self.rx.rx_burst(&mut burst);
            for m in burst.drain(..) {
                let f = m.to_vec();
                if frame::classify(&f) != FrameKind::Roce {
                    continue;
                }
                let p = frame::parse(&f).expect("the RNIC's own frame parses");
                let t = &p.repr.transport;
                out.push(Resp {
                    opcode: t.bth.opcode.0,
                    qpn: t.bth.dest_qp.value(),
                    psn: t.bth.psn.value(),
                    syndrome: t.ext.aeth.map(|a| a.syndrome),
                    orig: t.ext.atomic_ack.map(|a| a.orig),
                    payload: p.payload(&f).to_vec(),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        out
    }

    /// The RNIC's counters once they cover every frame sent so far (the worker counts a
    /// frame as it takes it and publishes after the loop iteration that handled it).
    fn stats(&self) -> NicSnapshot {
        let sent = self.sent;
        assert!(
            wait_until(10, || self.rt.stats(0).nic.rx_frames >= sent),
            "the RNIC took {} of {sent} frames",
            self.rt.stats(0).nic.rx_frames
        );
        self.rt.stats(0)
    }
}

/// The peer's view of one case's QP.
fn case_json(name: &str, s: &Side) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "dqpn": s.qpn.value(),
        "psn": PSN,
        "va": s.mr.addr,
        "rkey": s.mr.rkey.expect("remote access").0,
        "len": REGION,
    })
}

fn region(s: &Side) -> Vec<u8> {
    let mut b = vec![0u8; REGION];
    s.buf.read(0, &mut b);
    b
}

fn untouched(s: &Side) -> bool {
    region(s).iter().all(|&b| b == FILL)
}

/// Builds the cases' frames with scapy; returns them by case, in order.
fn scapy_frames(params: &serde_json::Value, dir: &Path) -> HashMap<String, Vec<Vec<u8>>> {
    let pj = dir.join("params.json");
    let pcap = dir.join("hostile.pcap");
    std::fs::write(&pj, params.to_string()).unwrap();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hostile_peer.py");
    let o = ferroce_tests::output_ok(
        Command::new("python3").arg(&script).arg(&pj).arg(&pcap),
        "hostile_peer.py (is scapy installed? run `make deps`)",
    );
    let data = std::fs::read(&pcap).unwrap();
    let mut frames = roce::pcap::Reader::new(&data)
        .unwrap()
        .map(|r| r.unwrap().data.to_vec());
    let mut by_case = HashMap::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let n = v["frames"].as_u64().unwrap() as usize;
        let fs: Vec<Vec<u8>> = frames.by_ref().take(n).collect();
        assert_eq!(fs.len(), n);
        by_case.insert(v["case"].as_str().unwrap().to_string(), fs);
    }
    by_case
}

/// One NAK with `syndrome` to the case's peer QP, no byte written, the QP in error.
fn expect_nak(peer: &mut Peer<'_>, s: &mut Side, frames: &[Vec<u8>], syndrome: u8, what: &str) {
    let r = peer.exchange(frames, Duration::from_millis(500), 2);
    let naks: Vec<&Resp> = r.iter().filter(|x| x.opcode == 0x11).collect();
    assert_eq!(naks.len(), 1, "{what}: one NAK: {r:?}");
    assert_eq!(naks[0].syndrome, Some(syndrome), "{what}: {r:?}");
    assert_eq!(naks[0].psn, PSN, "{what}: the NAK names the request's PSN");
    assert_eq!(naks[0].qpn, peer_qpn(what), "{what}: to the QP's peer");
    assert!(untouched(s), "{what}: the region was written");
}

#[test]
fn hostile_frames_get_the_ibas_naks_or_counted_drops_and_write_nothing() {
    let mut cfg = test_config(4, 1024);
    cfg.ack_coalescing = false; // every AckReq answered at once: responses are countable
    let (rt, mut rx, mut tx, pool) = raw_pair(cfg, "hostile");
    let peer_gid = Gid::from_ipv4([10, 99, 0, 2]);
    let dir = std::env::temp_dir().join(format!("ferroce-hostile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut sides: HashMap<&str, Side> = HashMap::new();
    for name in &CASES[1..] {
        let s = side(rt.open(0).unwrap(), QpType::Rc, REGION, 16);
        s.buf.fill(FILL);
        sides.insert(name, s);
    }
    let mut cases =
        vec![serde_json::json!({"name": "arp", "dqpn": 0, "psn": 0, "va": 0, "rkey": 0, "len": 0})];
    cases.extend(CASES[1..].iter().map(|n| case_json(n, &sides[n])));
    let params = serde_json::json!({
        "ours": {"mac": mac_text(rt.mac(0)), "ip": "10.99.0.4"},
        "peer": {"mac": mac_text(PEER_MAC), "ip": "10.99.0.2"},
        "cases": cases,
    });
    let frames = scapy_frames(&params, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let base_mbufs = rt.stats(0).mbufs_in_use;
    let mut peer = Peer {
        rt: &rt,
        rx: &mut rx,
        tx: &mut tx,
        pool: &pool,
        sent: 0,
    };
    // The peer announces itself; then every QP is connected to it (QPN 0x200 + i).
    peer.send(&frames["arp"][0]);
    for name in &CASES[1..] {
        let s = sides.get_mut(name).unwrap();
        let q = Qpn::new(peer_qpn(name));
        connect_with(s, q, peer_gid, Mtu::M1024, 1000, PSN, QpType::Rc, 14);
    }
    assert!(
        wait_until(5, || peer.rt.stats(0).neigh.arp_requests_rx >= 1),
        "the RNIC heard the peer"
    );

    // An access outside the region, through a VA + length that wraps, or with a key that
    // names no region: NAK Remote Access Error, nothing written (IBA 9.7.5.2.4, 10.6.7).
    for (name, syn) in [
        ("write_past_end", NAK_REMOTE_ACCESS),
        ("write_va_wraps", NAK_REMOTE_ACCESS),
        ("write_bad_rkey", NAK_REMOTE_ACCESS),
        // The RETH's length differs from what the only packet carries (IBA 9.7.5.2.2).
        ("write_length_mismatch", NAK_INVALID_REQUEST),
        // Opcode sequence errors (IBA 9.7.5.2.2): a MIDDLE with no FIRST.
        ("write_middle_without_first", NAK_INVALID_REQUEST),
    ] {
        let s = sides.get_mut(name).unwrap();
        expect_nak(&mut peer, s, &frames[name], syn, name);
    }
    {
        // A FIRST (accepted) then an ONLY inside the message: NAK Invalid Request at the
        // ONLY's PSN; the FIRST's 1024 bytes may already be in memory, nothing past them.
        let name = "write_first_then_only";
        let s = sides.get_mut(name).unwrap();
        let r = peer.exchange(&frames[name], Duration::from_millis(500), 2);
        let naks: Vec<&Resp> = r.iter().filter(|x| x.opcode == 0x11).collect();
        assert_eq!(naks.len(), 1, "{name}: {r:?}");
        assert_eq!(naks[0].syndrome, Some(NAK_INVALID_REQUEST), "{name}: {r:?}");
        assert_eq!(naks[0].psn, PSN + 1, "{name}");
        assert!(
            region(s)[1024..].iter().all(|&b| b == FILL),
            "{name}: written past the FIRST packet"
        );
    }
    {
        // PSNs far ahead are a sequence error: one NAK (at the expected PSN), not one per
        // packet, and nothing written (IBA 9.7.5.1.2; docs roce-wire "PSN rules").
        let name = "psn_far_ahead";
        let s = sides.get_mut(name).unwrap();
        let r = peer.exchange(&frames[name], Duration::from_millis(500), 4);
        assert_eq!(r.len(), 1, "{name}: one NAK for the gap: {r:?}");
        assert_eq!(
            (r[0].syndrome, r[0].psn),
            (Some(NAK_PSN_SEQ), PSN),
            "{name}: {r:?}"
        );
        assert!(untouched(s), "{name}");
    }
    {
        // A flood of frames whose ICRC fails: dropped and counted, no answer, nothing
        // written (a packet that fails its ICRC check is silently dropped, IBA 9.8.2); the
        // good WRITE after them lands and is acknowledged.
        let name = "bad_icrc_flood";
        let before = peer.stats();
        let s = sides.get_mut(name).unwrap();
        let r = peer.exchange(&frames[name], Duration::from_secs(2), 1);
        assert_eq!(r.len(), 1, "{name}: only the good WRITE answered: {r:?}");
        assert_eq!(
            (r[0].opcode, r[0].syndrome.map(|s| s >> 5)),
            (0x11, Some(0))
        );
        let after = peer.stats();
        assert_eq!(
            after.dev.rx_icrc_encapsulated - before.dev.rx_icrc_encapsulated,
            300,
            "{name}: every bad ICRC counted"
        );
        let m = region(s);
        assert!(
            m[..128].iter().all(|&b| b == FILL),
            "{name}: a bad frame wrote"
        );
        assert!(
            m[128..192].iter().all(|&b| b == 0xa5),
            "{name}: the good one did not"
        );
        assert!(m[192..].iter().all(|&b| b == FILL));
    }
    {
        // A READ and three duplicates of it: four responses, each with the region's bytes
        // (a duplicate READ is executed again from memory).
        let name = "read_replayed";
        let s = sides.get_mut(name).unwrap();
        s.buf.write(0, &(0..=255u8).collect::<Vec<_>>());
        // Each copy after the previous answer (a duplicate that arrives while the original's
        // response is still queued needs no second one, and gets none).
        let r = peer.exchange_each(&frames[name]);
        assert_eq!(r.len(), 4, "{name}: {r:?}");
        for x in &r {
            assert_eq!((x.opcode, x.psn), (0x10, PSN), "{name}: READ RESPONSE ONLY");
            assert_eq!(x.payload, (0..=255u8).collect::<Vec<_>>(), "{name}");
        }
    }
    {
        // FETCH_ADD and two duplicates: the same original value three times, added once.
        let name = "atomic_replayed";
        let s = sides.get_mut(name).unwrap();
        s.buf.write(0, &40u64.to_ne_bytes());
        let r = peer.exchange_each(&frames[name]);
        assert_eq!(r.len(), 3, "{name}: {r:?}");
        for x in &r {
            assert_eq!((x.opcode, x.orig), (0x12, Some(40)), "{name}: {r:?}");
        }
        let mut v = [0u8; 8];
        s.buf.read(0, &mut v);
        assert_eq!(u64::from_ne_bytes(v), 45, "{name}: executed once");
    }
    {
        // A WRITE for the QP from an address that is not its peer's: dropped, counted.
        let name = "spoofed_source";
        let before = peer.stats();
        let s = sides.get_mut(name).unwrap();
        peer.send(&frames[name][0]);
        let r = peer.responses(Duration::from_millis(300), 1);
        assert!(r.is_empty(), "{name}: answered: {r:?}");
        assert!(untouched(s), "{name}");
        // Per-QP counters reach the published totals a few QPs per publication.
        let dropped = || peer.rt.stats(0).qps.rx_dropped_path - before.qps.rx_dropped_path;
        assert!(wait_until(5, || dropped() >= 1), "{name}: not counted");
        assert_eq!(dropped(), 1, "{name}");
    }
    {
        let name = "unknown_qp";
        let before = peer.stats();
        peer.send(&frames[name][0]);
        let r = peer.responses(Duration::from_millis(300), 1);
        assert!(r.is_empty(), "{name}: answered: {r:?}");
        assert_eq!(
            peer.stats().dev.rx_dropped_no_qp - before.dev.rx_dropped_no_qp,
            1
        );
    }
    {
        // Malformed headers, one at a time: none answered, none written, each counted as
        // a drop of some kind.
        let name = "malformed";
        let s = sides.get_mut(name).unwrap();
        let what = [
            "cut inside the BTH",
            "cut after the BTH",
            "IPv4 header checksum wrong",
            "IPv4 total length past the frame",
            "UDP length past the IP payload",
            "BTH transport version 1",
            "an IPv4 fragment",
        ];
        assert_eq!(frames[name].len(), what.len());
        for (f, w) in frames[name].iter().zip(what) {
            let before = peer.stats();
            peer.send(f);
            let r = peer.responses(Duration::from_millis(300), 1);
            assert!(r.is_empty(), "{name}: {w}: answered: {r:?}");
            assert!(untouched(s), "{name}: {w}: written");
            let after = peer.stats();
            let dropped = |x: &NicSnapshot| {
                x.dev.rx_malformed
                    + x.dev.rx_icrc_encapsulated
                    + x.nic.rx_runts
                    + x.nic.rx_ipv4_fragments
                    + x.nic.rx_other
            };
            assert!(
                dropped(&after) > dropped(&before),
                "{name}: {w}: not counted"
            );
        }
    }
    {
        // Every other QP still works: a valid WRITE on the one kept aside lands and is
        // acknowledged.
        let name = "control";
        let s = sides.get_mut(name).unwrap();
        peer.send(&frames[name][0]);
        let r = peer.responses(Duration::from_secs(1), 1);
        assert_eq!(r.len(), 1, "{name}: {r:?}");
        assert_eq!(
            (r[0].opcode, r[0].syndrome.map(|s| s >> 5)),
            (0x11, Some(0))
        );
        let m = region(s);
        assert!(m[256..320].iter().all(|&b| b == 0xa5), "{name}");
    }
    // Nothing held: the peer's frames all went back to the pool.
    assert!(
        wait_until(5, || peer.rt.stats(0).mbufs_in_use <= base_mbufs),
        "mbufs in use {} > {base_mbufs}",
        peer.rt.stats(0).mbufs_in_use
    );
    drop(sides);
    rt.stop();
}

/// The peer QP a case's QP is connected to.
fn peer_qpn(name: &str) -> u32 {
    0x200 + CASES.iter().position(|c| *c == name).expect("a case") as u32
}

fn mac_text(m: [u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
