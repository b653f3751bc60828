//! The QP counters' port totals kept running a slice of QPs at a time
//! (`Device::counters_incremental`, what the worker publishes every millisecond) equal the
//! exact sum (`Device::counters`) once every QP slot has been visited, and stay equal across
//! QPs destroyed meanwhile.

use roce::engine::DeviceConfig;
use roce::sim::traffic::{OpKind, Traffic, TrafficSpec};
use roce::sim::{connect, ConnectOpts, LinkConfig, Pair, Rng};
use roce::verbs::Mtu;

fn cfg() -> DeviceConfig {
    DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    }
}

#[test]
fn running_qp_totals_equal_the_exact_sum_once_every_qp_is_visited() {
    let mut p = Pair::new(cfg(), cfg(), LinkConfig::lossless(100, 1_000), 7);
    let mut rng = Rng::new(7);
    let mem_len = 1 << 20;
    let o = ConnectOpts {
        mem_len,
        ..Default::default()
    };
    let pairs: Vec<_> = (0..6).map(|_| connect(&mut p, &o)).collect();
    let spec = TrafficSpec {
        ops_per_side: 10,
        max_len: 8192,
        kinds: vec![OpKind::Write, OpKind::Send, OpKind::Read],
        bidirectional: true,
    };
    for (a, b) in &pairs {
        let mut t = Traffic::plan(&mut rng, &spec, mem_len as u64);
        assert!(t.run(&mut p, [a, b], 10_000_000_000));
    }
    let exact = p.a.dev.counters().1;
    assert!(exact.sent_pkts > 0 && exact.rcvd_pkts > 0, "{exact:?}");
    // One QP slot per call: the first call cannot have taken in all six QPs.
    let (_, first) = p.a.dev.counters_incremental(1);
    assert_ne!(first, exact);
    let mut got = first;
    for _ in 0..64 {
        got = p.a.dev.counters_incremental(1).1;
    }
    assert_eq!(got, exact);
    // More traffic on one QP, then that QP destroyed before the running totals saw it: the
    // totals keep what it did.
    let (a, b) = &pairs[2];
    let mut t = Traffic::plan(&mut rng, &spec, mem_len as u64);
    assert!(t.run(&mut p, [a, b], 10_000_000_000));
    p.a.dev.destroy_qp(a.qpn).unwrap();
    let exact = p.a.dev.counters().1;
    assert!(exact.sent_pkts > got.sent_pkts);
    assert_eq!(p.a.dev.counters_incremental(usize::MAX).1, exact);
    // A QP moved to RESET keeps its counters, and the totals do not take them in twice.
    let reset = roce::verbs::QpAttr {
        state: Some(roce::verbs::QpState::Reset),
        ..Default::default()
    };
    p.a.dev.modify_qp(pairs[3].0.qpn, &reset).unwrap();
    assert_eq!(p.a.dev.counters_incremental(usize::MAX).1, exact);
    assert_eq!(p.a.dev.counters().1, exact);
}
