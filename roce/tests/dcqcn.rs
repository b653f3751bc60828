//! DCQCN on the wire, on simulated time: the notification point sends CNPs for CE-marked
//! packets (at most one per QP per interval, on DSCP 48, never ECN-capable), and the reaction
//! point cuts a QP's rate on CNPs and paces its packets, which shows as throughput and wire
//! spacing; when marking stops, the QP climbs back to line rate.

use dcb::dcqcn::RpParams;
use roce::engine::cc::CongestionConfig;
use roce::engine::{DeviceConfig, Transmit};
use roce::sim::{connect, node_gid, ConnectOpts, Endpoint, LinkConfig, Pair};
use roce::types::{Gid, Psn};
use roce::verbs::*;
use roce::wire::bth::BthRepr;
use roce::wire::cnp::CnpRepr;
use roce::wire::frame::TransportRepr;
use roce::wire::ipv4::Ecn;
use roce::wire::opcode::{Opcode, Operation};

const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const LINE_MBPS: f64 = 10_000.0;
const MSG: u32 = 64 * 1024;

fn cfg(cc: CongestionConfig) -> DeviceConfig {
    DeviceConfig {
        port_mtu: Mtu::M4096,
        cc,
        ..Default::default()
    }
}

/// The QPs here: MTU 4096, 16 messages of memory, 32 deep, an ACK timeout of ~4 s.
fn opts() -> ConnectOpts {
    ConnectOpts {
        mtu: Mtu::M4096,
        mem_len: 16 * MSG as usize,
        depth: 32,
        timeout: 20,
        ..Default::default()
    }
}

/// A QP on A writing to B over a 10 Gb/s, 2 us link, frames recorded; A's data ECN-capable.
fn pair(a: CongestionConfig, b: CongestionConfig) -> (Pair, Endpoint, Endpoint) {
    let mut p = Pair::new(cfg(a), cfg(b), LinkConfig::lossless(10, 2 * US), 7);
    let (a, b) = connect(&mut p, &opts());
    p.record = true;
    p.ect = true;
    (p, a, b)
}

/// Keeps 8 WRITEs of 64 KiB outstanding from A until `until`; every completion succeeds.
fn drive(p: &mut Pair, a: &Endpoint, b: &Endpoint, until: u64, posted: &mut u64, done: &mut u64) {
    while p.now < until {
        while *posted - *done < 8 {
            let off = (*posted % 16) * MSG as u64;
            p.post(0, a, *posted, b.write_to(off), &[a.sge(off, MSG)]);
            *posted += 1;
        }
        let cq = a.cq;
        p.run(until, |p| p.a.dev.cq_has_entries(cq));
        let cs = p.cqes(0, a);
        if cs.is_empty() {
            // Nothing happens before `until` (run stops short of its deadline).
            p.now = p.now.max(until);
        }
        for c in cs {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            *done += 1;
        }
    }
}

/// A's WRITE payload put on the link in [from, to), as Gb/s.
fn goodput(p: &Pair, from: u64, to: u64) -> f64 {
    let bytes: usize = p
        .recorded
        .iter()
        .filter(|(side, t, _)| *side == 0 && (from..to).contains(t))
        .filter_map(|(_, _, f)| roce::wire::frame::parse(f).ok())
        .filter(|f| f.info().op == Operation::Write)
        .map(|f| f.payload_len)
        .sum();
    bytes as f64 * 8.0 / (to - from) as f64
}

/// CNPs recorded from B to A, with their times.
fn cnps(p: &Pair) -> Vec<(u64, roce::wire::frame::ParsedFrame)> {
    p.recorded
        .iter()
        .filter(|(side, _, _)| *side == 1)
        .filter_map(|(_, t, f)| Some((*t, roce::wire::frame::parse(f).ok()?)))
        .filter(|(_, f)| f.repr.transport.bth.opcode == Opcode::CNP)
        .collect()
}

fn np_only(interval: u64) -> CongestionConfig {
    CongestionConfig {
        np_min_interval_ns: Some(interval),
        ..Default::default()
    }
}

#[test]
fn ce_marks_bring_cnps_at_most_one_per_interval_per_qp() {
    let (mut p, a, b) = pair(CongestionConfig::default(), np_only(50 * US));
    // A switch marks every data frame of A's between 1 and 3 ms.
    p.mark_ce_if = Some(Box::new(|side, t, _| {
        side == 0 && (MS..3 * MS).contains(&t)
    }));
    let (mut posted, mut done) = (0, 0);
    drive(&mut p, &a, &b, 4 * MS, &mut posted, &mut done);
    let c = cnps(&p);
    // One at the first mark, then one at the first mark 50 us or more after the last: 40 in
    // 2 ms at most (41 if the last fits), a few fewer as marks come only with frames.
    assert!((36..=41).contains(&c.len()), "{} CNPs in 2 ms", c.len());
    for w in c.windows(2) {
        assert!(
            w[1].0 - w[0].0 >= 50 * US,
            "CNPs {} ns apart",
            w[1].0 - w[0].0
        );
    }
    for (t, f) in &c {
        assert!(
            (MS..3 * MS + 10 * US).contains(t),
            "a CNP at {t} ns, outside the marking"
        );
        let bth = &f.repr.transport.bth;
        assert_eq!(bth.dest_qp, a.qpn, "to the QP that sent the marked traffic");
        assert!(bth.becn);
        assert_eq!(bth.psn, Psn::new(0));
        assert_eq!(f.repr.ip.dscp(), 48);
        assert_eq!(f.repr.ip.ecn(), Ecn::NotEct, "a CNP is never ECN-capable");
        assert_eq!(f.payload_len, 0);
    }
    // Data is ECN-capable, ACKs are not.
    for (side, _, f) in &p.recorded {
        let f = roce::wire::frame::parse(f).unwrap();
        match f.info().op {
            Operation::Write => assert_ne!(f.repr.ip.ecn(), Ecn::NotEct),
            Operation::Acknowledge => {
                assert_eq!(*side, 1);
                assert_eq!(f.repr.ip.ecn(), Ecn::NotEct, "ACKs are not ECN-capable");
            }
            _ => {}
        }
    }
    let marked = p
        .recorded
        .iter()
        .filter(|(s, t, _)| *s == 0 && (MS..3 * MS).contains(t))
        .count() as u64;
    let cb = p.b.dev.qp_counters(b.qpn).unwrap();
    assert_eq!(cb.np_ecn_marked_roce_packets, marked);
    assert_eq!(cb.np_cnp_sent, c.len() as u64);
    // A's reaction point is off: the CNPs are counted, the rate is untouched.
    let ca = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!(ca.rp_cnp_ignored, c.len() as u64);
    assert_eq!(ca.rp_cnp_handled, 0);
    let before = goodput(&p, MS / 2, MS);
    let during = goodput(&p, 2 * MS, 3 * MS);
    assert!(
        during > 0.9 * before,
        "without a reaction point CNPs change nothing: {before:.2} -> {during:.2} Gb/s"
    );
    assert_eq!(p.a.dev.query_qp(a.qpn).unwrap().rate_kbps, None);
}

/// A CNP travels on its own priority (6), not its QP's data class: while the notification
/// point's data priority is paused (its ACKs wait), the CNPs its marked arrivals earn still
/// leave.
#[test]
fn cnps_go_while_the_qps_data_priority_is_paused() {
    let (mut p, a, b) = pair(CongestionConfig::default(), np_only(50 * US));
    p.mark_ce_if = Some(Box::new(|side, _, _| side == 0));
    // B's QP sends on priority 0 (no VLAN, SL 0); its CNPs on 6.
    p.b.dev.set_paused(1);
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, MSG)]);
    p.run(MS, |_| false);
    let from_b: Vec<_> = p
        .recorded
        .iter()
        .filter(|(side, _, _)| *side == 1)
        .filter_map(|(_, _, f)| roce::wire::frame::parse(f).ok())
        .map(|f| f.repr.transport.bth.opcode)
        .collect();
    assert!(from_b.contains(&Opcode::CNP), "no CNP left: {from_b:?}");
    assert!(
        from_b.iter().all(|&o| o == Opcode::CNP),
        "only CNPs leave a paused QP: {from_b:?}"
    );
}

/// CNPs go ahead of every ETS class (dcb.md: the CNP priority is a strict class): while a
/// QP of B in a strict class keeps the link busy for a millisecond, the CNPs B owes for the
/// marked WRITE arriving on another QP still leave within microseconds. They used to wait for
/// the turn of their QP's data class, which the strict class starved.
#[test]
fn cnps_go_ahead_of_a_busy_strict_class() {
    use dcb::ets::{EtsConfig, Tsa};
    use roce::sim::connect_per_sl;
    let mut tsa = [Tsa::Ets; 8];
    tsa[3] = Tsa::Strict;
    let ets = EtsConfig {
        prio_tc: [0, 1, 2, 3, 4, 5, 6, 7],
        tsa,
        bw_percent: [50, 0, 0, 0, 0, 0, 50, 0],
    };
    ets.validate().unwrap();
    let dcfg = DeviceConfig {
        ets: Some(ets),
        ..cfg(np_only(50 * US))
    };
    let mut p = Pair::new(dcfg.clone(), dcfg, LinkConfig::lossless(10, 2 * US), 7);
    // Pair 0 on priority 0: A writes to B, marked. Pair 1 on priority 3 (strict): B writes
    // to A, 1 MiB queued at once.
    let eps = connect_per_sl(&mut p, &opts(), &[0, 3]);
    p.record = true;
    p.ect = true;
    p.mark_ce_if = Some(Box::new(|side, _, f| side == 0 && f.info().is_request));
    let (a1, b1) = &eps[1];
    for i in 0..16u64 {
        p.post(
            1,
            b1,
            i,
            a1.write_to(i * MSG as u64),
            &[b1.sge(i * MSG as u64, MSG)],
        );
    }
    let (a0, b0) = &eps[0];
    p.post(0, a0, 100, b0.write_to(0), &[a0.sge(0, MSG)]);
    p.run(300 * US, |_| false);
    assert!(
        p.cqes(1, b1).len() < 16,
        "the strict class stayed busy for the whole window"
    );
    let c = cnps(&p);
    assert!(!c.is_empty(), "no CNP left B in 300 us");
    assert!(
        c[0].0 < 100 * US,
        "the first CNP waited until {} ns",
        c[0].0
    );
}

#[test]
fn cnps_slow_a_qp_down_and_it_climbs_back_when_marking_stops() {
    let rp = CongestionConfig {
        rp: Some(RpParams::paper(LINE_MBPS)),
        ..Default::default()
    };
    let (mut p, a, b) = pair(rp, np_only(50 * US));
    p.mark_ce_if = Some(Box::new(|side, t, _| {
        side == 0 && (MS..3 * MS).contains(&t)
    }));
    let (mut posted, mut done) = (0, 0);
    drive(&mut p, &a, &b, 3 * MS, &mut posted, &mut done);
    let throttled = p.a.dev.query_qp(a.qpn).unwrap().rate_kbps;
    drive(&mut p, &a, &b, 40 * MS, &mut posted, &mut done);
    let before = goodput(&p, MS / 2, MS);
    let during = goodput(&p, 2 * MS, 3 * MS);
    let after = goodput(&p, 30 * MS, 40 * MS);
    eprintln!(
        "goodput before marking {before:.2} Gb/s, marked {during:.3} Gb/s, 27 ms after {after:.2} \
         Gb/s; rate at 3 ms {throttled:?} kb/s"
    );
    assert!(before > 9.0, "line rate before any mark: {before:.2} Gb/s");
    assert!(
        during < 0.1 * before,
        "every 50 us a CNP halves the rate: {during:.3} Gb/s while marked"
    );
    assert!(throttled.is_some_and(|k| k < 1_000_000), "{throttled:?}");
    assert!(
        after > 0.9 * before,
        "the QP climbs back to line rate when marking stops: {after:.2} Gb/s"
    );
    assert_eq!(p.a.dev.query_qp(a.qpn).unwrap().rate_kbps, None);
    let ca = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!(ca.rp_cnp_handled, cnps(&p).len() as u64);
    // The pacing is in the wire spacing: while throttled, A's data frames leave far apart
    // (at 10 Gb/s a 4 KiB frame takes 3.4 us).
    let times: Vec<u64> = p
        .recorded
        .iter()
        .filter(|(s, t, _)| *s == 0 && (2 * MS..3 * MS).contains(t))
        .map(|(_, t, _)| *t)
        .collect();
    let min_gap = times
        .windows(2)
        .map(|w| w[1] - w[0])
        .min()
        .unwrap_or(u64::MAX);
    assert!(
        times.len() < 20 && min_gap > 20 * US,
        "{} frames, closest {min_gap} ns apart",
        times.len()
    );
}

/// A CNP built as B would send it, from `src`.
fn cnp_from(p: &Pair, src: Gid, dest: roce::types::Qpn) -> Vec<u8> {
    let mut bth = BthRepr::new(Opcode::CNP, dest, Psn::new(0));
    bth.becn = true;
    let mut t = TransportRepr::new(bth);
    t.ext.cnp = Some(CnpRepr::default());
    let mut tx = Transmit {
        transport: t,
        ..Default::default()
    };
    tx.path.sgid = src;
    tx.path.dgid = p.a.dev.gids()[0];
    tx.path.traffic_class = 48 << 2;
    let repr = tx.frame_repr(p.b.mac, p.a.mac, None, 1);
    let mut buf = vec![0u8; repr.frame_len(0).unwrap()];
    repr.emit(&mut buf, &[]).unwrap();
    buf
}

#[test]
fn firmware_cuts_at_the_monitor_period_and_only_for_the_peer() {
    let rp = CongestionConfig {
        rp: Some(RpParams::firmware(LINE_MBPS)),
        ..Default::default()
    };
    let (mut p, a, _b) = pair(rp, CongestionConfig::default());
    // A third party's CNP for A's QP is dropped: it must not slow the connection.
    let stranger = cnp_from(&p, Gid::from_ipv4([10, 99, 0, 9]), a.qpn);
    p.inject(0, &stranger);
    let ca = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!((ca.rp_cnp_handled, ca.rx_dropped_path), (0, 1));
    assert_eq!(p.a.dev.query_qp(a.qpn).unwrap().rate_kbps, None);
    // The peer's CNP: the firmware cuts at the end of the 4 us monitor period, by
    // alpha / 2 with alpha = 1023/1024 on the first CNP, decayed by g = 5/1024 in each of
    // the three 1 us alpha periods without a CNP before the cut.
    let frame = cnp_from(&p, node_gid(1), a.qpn);
    p.inject(0, &frame);
    assert_eq!(p.a.dev.query_qp(a.qpn).unwrap().rate_kbps, None, "not yet");
    let t0 = p.now;
    p.run_until_idle(t0 + 5 * US);
    let k = p.a.dev.query_qp(a.qpn).unwrap().rate_kbps.expect("cut");
    let g = 5.0 / 1024.0;
    let alpha = ((1.0 - g) * 1023.0 / 1024.0 + g) * (1.0 - g) * (1.0 - g) * (1.0 - g);
    let want = LINE_MBPS * 1000.0 * (1.0 - alpha / 2.0);
    assert!(
        (k as f64 - want).abs() < 0.002 * want,
        "{k} kb/s, want {want}"
    );
    assert_eq!(p.a.dev.qp_counters(a.qpn).unwrap().rp_cnp_handled, 1);
}

/// A UD QP's peers are anyone: a CNP addressed to it is counted and changes nothing (the
/// RNIC sends none for UD traffic either).
#[test]
fn a_ud_qp_only_counts_cnps() {
    let rp = CongestionConfig {
        rp: Some(RpParams::paper(LINE_MBPS)),
        ..Default::default()
    };
    let mut p = Pair::new(cfg(rp), cfg(rp), LinkConfig::lossless(10, 2 * US), 7);
    let o = ConnectOpts {
        qp_type: QpType::Ud,
        mtu: Mtu::M4096,
        ..Default::default()
    };
    let (a, _b) = connect(&mut p, &o);
    let frame = cnp_from(&p, node_gid(1), a.qpn);
    p.inject(0, &frame);
    let c = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!((c.rp_cnp_handled, c.rp_cnp_ignored), (0, 1));
    assert_eq!(p.a.dev.query_qp(a.qpn).unwrap().rate_kbps, None);
}
