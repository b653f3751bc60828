//! Transport breadth: UC, UD, SRQ, SEND with invalidate, LOCAL_INV and fast registration,
//! fence, solicited events, inline data and SGE limits, asynchronous events and device
//! attributes.

use std::sync::Arc;

use roce::engine::{DeviceConfig, ModifyError, QpInit, SrqAttr, VerbsError};
use roce::memory::{HeapMemory, Memory};
use roce::sim::traffic::{OpKind, Traffic, TrafficSpec};
use roce::sim::{bring_up, connect, node_gid, ConnectOpts, Endpoint, LinkConfig, Pair, Rng};
use roce::types::{Gid, Lkey, Psn, Qkey, Qpn, Rkey};
use roce::verbs::*;
use roce::wire::opcode::{Opcode, Operation};

mod common;

use common::{cfg, recording_pair as pair, SEC};

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

// ---- UC ----

#[test]
fn uc_send_and_write_on_a_lossless_link() {
    for seed in 0..20 {
        let mut p = pair(seed);
        let o = ConnectOpts {
            qp_type: QpType::Uc,
            mtu: [Mtu::M256, Mtu::M1024, Mtu::M4096][seed as usize % 3],
            mem_len: 8 << 20,
            ..Default::default()
        };
        let (a, b) = connect(&mut p, &o);
        let spec = TrafficSpec {
            ops_per_side: 30,
            max_len: 64 << 10,
            kinds: OpKind::UC.to_vec(),
            bidirectional: true,
        };
        let mut t = Traffic::plan(&mut Rng::new(seed), &spec, 8 << 20);
        assert!(t.run(&mut p, [&a, &b], 10 * SEC));
        t.verify([&a, &b], true)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert!(
            p.recorded_frames(1)
                .iter()
                .all(|f| f.repr.transport.bth.opcode != Opcode::RC_ACK),
            "UC sends no ACKs"
        );
    }
}

#[test]
fn uc_under_faults_drops_broken_messages_but_never_completes_a_wrong_one() {
    for seed in 0..40 {
        // Loss and corruption keep order; reordering and duplication do not (UC has no
        // duplicate detection: rxe, too, delivers any FIRST/ONLY it receives).
        let ordered = seed % 2 == 0;
        let mut link = LinkConfig::lossless(25, 2_000).faulty(0.03);
        if ordered {
            link.reorder = 0.0;
            link.duplicate = 0.0;
        }
        let mut p = Pair::new(cfg(), cfg(), link, seed);
        let o = ConnectOpts {
            qp_type: QpType::Uc,
            mtu: Mtu::M1024,
            mem_len: 8 << 20,
            ..Default::default()
        };
        let (a, b) = connect(&mut p, &o);
        let mut rng = Rng::new(seed);
        let n = 40;
        let lens: Vec<u32> = (0..n).map(|_| 1 + rng.below(8000) as u32).collect();
        for (i, &len) in lens.iter().enumerate() {
            a.mem
                .write(i * 8192, &pattern(i as u64, len as usize))
                .unwrap();
            p.recv(1, &b, i as u64, &[b.sge(i as u64 * 8192, 8192)]);
        }
        for (i, &len) in lens.iter().enumerate() {
            let op = if i % 2 == 0 {
                WrOp::Send
            } else {
                WrOp::SendWithImm { imm: i as u32 }
            };
            p.post(0, &a, i as u64, op, &[a.sge(i as u64 * 8192, len)]);
        }
        p.run_until_idle(10 * SEC);
        // UC completes sends when they leave: all succeed.
        let sent = p.cqes(0, &a);
        assert_eq!(sent.len(), n);
        assert!(sent.iter().all(|c| c.status == WcStatus::Success));
        // A sent SEND with immediate says so in its completion, as rxe's do.
        for (i, c) in sent.iter().enumerate() {
            assert_eq!(c.wc_flags.contains(WcFlags::WITH_IMM), i % 2 == 1, "{c:?}");
        }
        // Every receive that completed holds exactly one message, whole, in order.
        let mut last = None;
        for c in p.cqes(1, &b) {
            assert_eq!(c.status, WcStatus::Success, "seed {seed}: {c:?}");
            let buf = b.mem.to_vec(c.wr_id as usize * 8192, c.byte_len as usize);
            let k = (0..n)
                .find(|&k| lens[k] == c.byte_len && pattern(k as u64, lens[k] as usize) == buf)
                .unwrap_or_else(|| {
                    panic!("seed {seed}: receive {} holds no whole message", c.wr_id)
                });
            if ordered {
                assert!(
                    last.is_none_or(|l| k > l),
                    "seed {seed}: messages out of order"
                );
            }
            assert_eq!(c.wc_flags.contains(WcFlags::WITH_IMM), k % 2 == 1);
            // Every RoCE packet has a GRH (its IP header): rxe flags each receive with it.
            assert!(c.wc_flags.contains(WcFlags::GRH), "{c:?}");
            if k % 2 == 1 {
                assert_eq!(c.imm_data, k as u32);
            }
            last = Some(k);
        }
    }
}

// ---- UD ----

fn ud_endpoints(p: &mut Pair) -> (Endpoint, Endpoint) {
    let o = ConnectOpts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    connect(p, &o)
}

fn ud_dest(to: &Endpoint, gid: Gid, qkey: u32) -> UdDest {
    UdDest {
        ah: AddressVector::new(gid, 0),
        remote_qpn: to.qpn,
        remote_qkey: Qkey(qkey),
    }
}

/// Posts a signaled, solicited UD send WR of `len` bytes at the start of A's MR from `a` (a
/// QP of node A) to `dest`.
fn post_ud(
    p: &mut Pair,
    a: &Endpoint,
    wr_id: u64,
    op: WrOp,
    len: u32,
    dest: UdDest,
) -> Result<(), roce::engine::VerbsError> {
    p.node(0).dev.post_send(
        a.qpn,
        &SendWr {
            wr_id,
            op,
            sg_list: &[a.sge(0, len)],
            flags: SendFlags::SIGNALED | SendFlags::SOLICITED,
            ud: Some(dest),
        },
    )
}

#[test]
fn ud_send_delivers_grh_source_qp_and_immediate() {
    let mut p = pair(1);
    let (a, b) = ud_endpoints(&mut p);
    let data = pattern(5, 1000);
    a.mem.write(0, &data).unwrap();
    p.recv(1, &b, 7, &[b.sge(0, 2048)]);
    post_ud(
        &mut p,
        &a,
        1,
        WrOp::SendWithImm { imm: 0xfeed },
        1000,
        ud_dest(&b, node_gid(1), 0x1111_1111),
    )
    .unwrap();
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
    let c = p.cqes(1, &b)[0];
    assert_eq!(
        (c.wr_id, c.status, c.byte_len),
        (7, WcStatus::Success, 1040)
    );
    assert!(c.wc_flags.contains(WcFlags::GRH) && c.wc_flags.contains(WcFlags::WITH_IMM));
    assert_eq!((c.src_qp, c.imm_data), (a.qpn, 0xfeed));
    assert!(c.solicited);
    // GRH area: 20 zero bytes, then the IPv4 header (rxe's layout for RoCEv2 over IPv4).
    let grh = b.mem.to_vec(0, 40);
    assert_eq!(&grh[..20], &[0u8; 20]);
    assert_eq!(grh[20], 0x45);
    assert_eq!(&grh[32..40], &[10, 99, 0, 3, 10, 99, 0, 4]);
    assert_eq!(b.mem.to_vec(40, 1000), data);
    // The frame on the wire: UD_SEND_ONLY_WITH_IMMEDIATE, DETH with our QP and the Q_Key.
    let f = &p.recorded_frames(0)[0];
    let t = &f.repr.transport;
    assert_eq!(t.bth.opcode, Opcode(0x65));
    assert_eq!(t.ext.deth.unwrap().src_qp, a.qpn);
    assert_eq!(t.ext.deth.unwrap().qkey, Qkey(0x1111_1111));
    assert_eq!(
        f.repr.udp_src_port,
        roce::engine::transmit::udp_sport_ud(a.qpn.value())
    );
    assert!(!t.bth.ack_req);
}

/// A UD QP whose datagram the driver holds for a next hop (`DeviceEvent::PathHeld`) sends
/// nothing more until that hop resolves or fails, and then the rest of its queue goes, in
/// order; a QP released before its next turn is never left parked.
#[test]
fn a_ud_qp_held_for_a_next_hop_goes_on_when_it_resolves_or_fails() {
    use roce::engine::{DeviceEvent, Transmit};
    let mut p = pair(1);
    let (a, b) = ud_endpoints(&mut p);
    let dest = ud_dest(&b, node_gid(1), 0x1111_1111);
    for i in 0..6 {
        post_ud(&mut p, &a, i, WrOp::Send, 8, dest).unwrap();
    }
    let dev = &mut p.node(0).dev;
    let mut tx = Transmit::default();
    let held = DeviceEvent::PathHeld {
        qpn: a.qpn,
        dgid: node_gid(1),
    };
    let resolved = |dgid| DeviceEvent::PathResolved { dgid, now: 0 };
    assert!(dev.poll_transmit(0, &mut tx));
    dev.handle_event(held);
    assert!(!dev.poll_transmit(0, &mut tx), "held for node 1");
    // Another destination's resolution does not release it; its own does.
    assert_eq!(dev.handle_event(resolved(node_gid(0))), 0);
    assert!(!dev.poll_transmit(0, &mut tx));
    assert_eq!(dev.handle_event(resolved(node_gid(1))), 1);
    assert!(dev.poll_transmit(0, &mut tx));
    // Held and released before its next turn: it still sends.
    dev.handle_event(held);
    dev.handle_event(resolved(node_gid(1)));
    assert!(dev.poll_transmit(0, &mut tx));
    // Resolved while the held datagram waits for a PFC pause: the QP goes on with the rest.
    dev.handle_event(held);
    assert!(!dev.poll_transmit(0, &mut tx));
    assert_eq!(
        dev.handle_event(DeviceEvent::PathKnown { dgid: node_gid(1) }),
        1
    );
    assert!(dev.poll_transmit(0, &mut tx));
    // Unreachable: the datagram is lost, the QP goes on (UD has no connection to fail).
    dev.handle_event(held);
    assert!(!dev.poll_transmit(0, &mut tx));
    dev.handle_event(DeviceEvent::PathUnreachable { dgid: node_gid(1) });
    assert!(dev.poll_transmit(0, &mut tx));
    assert!(dev.poll_transmit(0, &mut tx));
    assert!(!dev.poll_transmit(0, &mut tx), "six datagrams in all");
}

/// An RC QP held for its next hop is not released when the address comes while the held
/// packets wait for a PFC pause (`PathKnown`, which releases UD and UC QPs): its ACK timer
/// counts from when they leave (`PathResolved`).
#[test]
fn an_rc_qp_stays_held_until_its_packets_leave() {
    use roce::engine::{DeviceEvent, Transmit};
    let (mut p, a, _b) = common::connected(9, &ConnectOpts::default());
    let write = WrOp::Write {
        remote_addr: 0,
        rkey: Rkey(0),
    };
    p.post(0, &a, 1, write, &[a.sge(0, 8)]);
    let dev = &mut p.node(0).dev;
    assert!(dev.poll_transmit(0, &mut Transmit::default()));
    let dgid = node_gid(1);
    dev.handle_event(DeviceEvent::PathHeld { qpn: a.qpn, dgid });
    assert_eq!(dev.handle_event(DeviceEvent::PathKnown { dgid }), 0);
    let left = DeviceEvent::PathResolved { dgid, now: 1 };
    assert_eq!(dev.handle_event(left), 1, "released when its packets leave");
}

#[test]
fn ud_qkey_mismatch_is_dropped_and_privileged_qkey_uses_the_qps() {
    let mut p = pair(2);
    let (a, b) = ud_endpoints(&mut p);
    p.recv(1, &b, 1, &[b.sge(0, 2048)]);
    post_ud(
        &mut p,
        &a,
        1,
        WrOp::Send,
        10,
        ud_dest(&b, node_gid(1), 0x2222),
    )
    .unwrap();
    p.run_until_idle(SEC);
    assert!(p.cqes(1, &b).is_empty());
    assert_eq!(p.b.dev.qp_counters(b.qpn).unwrap().rx_dropped_qkey, 1);
    // A Q_Key with the high bit set means "use the sending QP's Q_Key" (IBA 10.2.5).
    post_ud(
        &mut p,
        &a,
        2,
        WrOp::Send,
        10,
        ud_dest(&b, node_gid(1), 0x8000_0000),
    )
    .unwrap();
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(1, &b).len(), 1);
}

/// A UD receive WQE the datagram cannot be placed in (its lkey is wrong) completes with the
/// error and the QP goes to ERR (class A, as rxe and the UC path): it used to go on
/// receiving as if the application's buffers were fine.
#[test]
fn a_ud_receive_wqe_with_a_bad_lkey_fails_the_qp() {
    let mut p = pair(3);
    let (a, b) = ud_endpoints(&mut p);
    let bad = Sge {
        lkey: Lkey(b.lkey.0 ^ 0x01),
        ..b.sge(0, 2048)
    };
    p.recv(1, &b, 7, &[bad]);
    p.recv(1, &b, 8, &[b.sge(0, 2048)]);
    post_ud(
        &mut p,
        &a,
        1,
        WrOp::Send,
        10,
        ud_dest(&b, node_gid(1), 0x1111_1111),
    )
    .unwrap();
    p.run_until_idle(SEC);
    let c = p.cqes(1, &b);
    assert_eq!(
        (c[0].wr_id, c[0].status),
        (7, WcStatus::LocProtErr),
        "{c:?}"
    );
    assert_eq!(
        (c[1].wr_id, c[1].status),
        (8, WcStatus::WrFlushErr),
        "{c:?}"
    );
    assert_eq!(p.qp_state(1, &b), QpState::Err);
}

#[test]
fn ud_messages_larger_than_the_port_mtu_are_refused_at_post_time() {
    let mut p = Pair::new(
        DeviceConfig::default(),
        DeviceConfig::default(),
        LinkConfig::default(),
        3,
    );
    let (a, b) = ud_endpoints(&mut p);
    let e = post_ud(
        &mut p,
        &a,
        1,
        WrOp::Send,
        1025,
        ud_dest(&b, node_gid(1), 0x1111_1111),
    );
    assert!(matches!(
        e,
        Err(roce::engine::VerbsError::InvalidArgument(_))
    ));
    post_ud(
        &mut p,
        &a,
        1,
        WrOp::Send,
        1024,
        ud_dest(&b, node_gid(1), 0x1111_1111),
    )
    .unwrap();
    // UD allows only SEND.
    let e = p.a.dev.post_send(
        a.qpn,
        &SendWr {
            wr_id: 2,
            op: WrOp::Write {
                remote_addr: 0,
                rkey: Rkey(1),
            },
            sg_list: &[a.sge(0, 8)],
            flags: SendFlags::SIGNALED,
            ud: Some(ud_dest(&b, node_gid(1), 1)),
        },
    );
    assert!(e.is_err());
}

#[test]
fn ud_over_ipv6_gids_writes_the_ipv6_header_as_grh() {
    let v6 = |i: u8| Gid([0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, i]);
    let mk = |g| DeviceConfig {
        gids: vec![g],
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut p = Pair::new(mk(v6(3)), mk(v6(4)), LinkConfig::default(), 4);
    let o = ConnectOpts {
        qp_type: QpType::Ud,
        ..Default::default()
    };
    // connect() uses IPv4 node GIDs for the path; UD needs no path, only the AH.
    let (a, b) = connect(&mut p, &o);
    p.recv(1, &b, 1, &[b.sge(0, 256)]);
    post_ud(
        &mut p,
        &a,
        1,
        WrOp::Send,
        16,
        ud_dest(&b, v6(4), 0x1111_1111),
    )
    .unwrap();
    p.run_until_idle(SEC);
    let c = p.cqes(1, &b)[0];
    assert_eq!((c.status, c.byte_len), (WcStatus::Success, 56));
    let grh = b.mem.to_vec(0, 40);
    assert_eq!(grh[0] >> 4, 6);
    assert_eq!(&grh[8..24], &v6(3).0);
    assert_eq!(&grh[24..40], &v6(4).0);
}

#[test]
fn mads_to_qp1_are_counted_and_garbage_is_dropped() {
    let mut p = pair(5);
    let (a, _b) = ud_endpoints(&mut p);
    let gsi = Endpoint {
        qpn: Qpn::GSI,
        ..a.clone()
    };
    post_ud(
        &mut p,
        &a,
        1,
        WrOp::Send,
        256,
        ud_dest(&gsi, node_gid(1), 0x8001_0000),
    )
    .unwrap();
    p.run_until_idle(SEC);
    assert_eq!(p.b.dev.counters().0.rx_gsi_mads, 1);
    // Zeros are no CM message: the connection manager counts it and answers nothing.
    assert_eq!(p.b.dev.cm().counters.rx_bad, 1);
    assert_eq!(p.b.dev.counters().0.tx_gsi_mads, 0);
}

// ---- SRQ ----

fn qp_on_srq(
    p: &mut Pair,
    side: usize,
    pd: roce::memory::PdId,
    cq: roce::engine::CqId,
    srq: roce::engine::SrqId,
) -> Qpn {
    p.node(side)
        .dev
        .create_qp(&QpInit {
            srq: Some(srq),
            ..QpInit::rc(pd, cq)
        })
        .unwrap()
}

/// Endpoints for the new QPs `qa` on A and `qb` on B (with `a0`'s and `b0`'s PD, CQ and
/// MR), connected to each other.
fn join(
    p: &mut Pair,
    (a0, qa): (&Endpoint, Qpn),
    (b0, qb): (&Endpoint, Qpn),
    o: &ConnectOpts,
) -> (Endpoint, Endpoint) {
    let ea = Endpoint {
        qpn: qa,
        ..a0.clone()
    };
    let eb = Endpoint {
        qpn: qb,
        ..b0.clone()
    };
    bring_up(&mut p.a.dev, &ea, qb, node_gid(1), o, 0x10, 0x20);
    bring_up(&mut p.b.dev, &eb, qa, node_gid(0), o, 0x20, 0x10);
    (ea, eb)
}

#[test]
fn srq_feeds_several_qps_and_fires_its_limit() {
    let mut p = pair(6);
    let o = ConnectOpts::default();
    let (a0, b0) = connect(&mut p, &o);
    let srq =
        p.b.dev
            .create_srq(
                b0.pd,
                &SrqAttr {
                    max_wr: 64,
                    max_sge: 1,
                    srq_limit: 0,
                },
            )
            .unwrap();
    // Three QP pairs; B's side of each uses the SRQ.
    let mut pairs = Vec::new();
    for _ in 0..3 {
        let qa = p.a.dev.create_qp(&QpInit::rc(a0.pd, a0.cq)).unwrap();
        let qb = qp_on_srq(&mut p, 1, b0.pd, b0.cq, srq);
        pairs.push(join(&mut p, (&a0, qa), (&b0, qb), &o));
    }
    for i in 0..12u64 {
        p.b.dev
            .post_srq_recv(
                srq,
                &RecvWr {
                    wr_id: 100 + i,
                    sg_list: &[b0.sge(i * 256, 256)],
                },
            )
            .unwrap();
    }
    assert!(
        p.b.dev
            .post_recv(
                pairs[0].1.qpn,
                &RecvWr {
                    wr_id: 0,
                    sg_list: &[]
                }
            )
            .is_err(),
        "post to the SRQ, not the QP"
    );
    p.b.dev.modify_srq(srq, 4).unwrap();
    assert_eq!(
        p.b.dev.query_srq(srq).unwrap(),
        SrqAttr {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 4
        }
    );
    for (i, (ea, _)) in pairs.iter().enumerate() {
        for k in 0..3u64 {
            a0.mem
                .write(
                    ((i as u64 * 3 + k) * 100) as usize,
                    &[(i * 3) as u8 + k as u8; 100],
                )
                .unwrap();
            p.post(
                0,
                ea,
                k,
                WrOp::Send,
                &[ea.sge((i as u64 * 3 + k) * 100, 100)],
            );
        }
    }
    p.run_until_idle(SEC);
    let got = p.cqes(1, &b0);
    assert_eq!(got.len(), 9);
    assert!(got
        .iter()
        .all(|c| c.status == WcStatus::Success && c.byte_len == 100));
    let qps: std::collections::HashSet<Qpn> = got.iter().map(|c| c.qp_num).collect();
    assert_eq!(qps.len(), 3, "three QPs consumed from the one SRQ");
    let mut ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    ids.sort();
    assert_eq!(ids, (100..109).collect::<Vec<_>>());
    // 3 WQEs left < limit 4: the event fired once and disarmed the limit.
    let events: Vec<_> = std::iter::from_fn(|| p.b.dev.poll_event()).collect();
    assert_eq!(events, vec![AsyncEvent::SrqLimitReached(srq.0)]);
    assert_eq!(p.b.dev.query_srq(srq).unwrap().srq_limit, 0);
    // A QP on the SRQ that enters ERR reports LAST_WQE_REACHED.
    p.set_qp_state(1, &pairs[1].1, QpState::Err);
    assert_eq!(
        p.b.dev.poll_event(),
        Some(AsyncEvent::QpLastWqeReached(pairs[1].1.qpn))
    );
    assert!(p.b.dev.destroy_srq(srq).is_err(), "still in use");
    // SRQ QPs advertise no credits (IBA 9.7.7.2).
    let acks = p.recorded_frames(1);
    assert!(acks
        .iter()
        .filter_map(|f| f.repr.transport.ext.aeth)
        .all(|a| a.syndrome & 0x1f == 0x1f));
}

// ---- invalidation and fast registration ----

/// Binds a fresh fast-registration MR of node `side` to `addr` with key byte `key` (REG_MR
/// through `ep`'s send queue); returns its lkey and the memory behind it.
fn fast_reg(
    p: &mut Pair,
    side: usize,
    ep: &Endpoint,
    key: u8,
    addr: u64,
) -> (Lkey, Arc<HeapMemory>) {
    let mem = HeapMemory::shared(1 << 16);
    let frmr = p.node(side).dev.alloc_mr(ep.pd, mem.clone()).unwrap();
    p.post(
        side,
        ep,
        100,
        WrOp::RegMr {
            lkey: frmr,
            key,
            addr,
            length: 1 << 16,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        },
        &[],
    );
    p.run_until_idle(SEC);
    let c = p.cqes(side, ep);
    assert_eq!(
        (c[0].opcode, c[0].status),
        (WcOpcode::RegMr, WcStatus::Success)
    );
    (frmr, mem)
}

/// The status of an 8-byte WRITE from A to `addr` under `rkey`.
fn write_status(p: &mut Pair, a: &Endpoint, addr: u64, rkey: Rkey) -> WcStatus {
    p.write_status(a, addr, rkey, &[0x5a; 8])
}

#[test]
fn send_with_invalidate_revokes_a_fast_registered_rkey() {
    let (mut p, a, b) = common::connected(7, &ConnectOpts::default());
    let (frmr, _mem) = fast_reg(&mut p, 1, &b, 0x42, 0x7700_0000);
    let rkey = Rkey((frmr.index() << 8) | 0x42);
    assert_eq!(
        write_status(&mut p, &a, 0x7700_0000, rkey),
        WcStatus::Success
    );
    p.recv(1, &b, 1, &[b.sge(0, 64)]);
    p.post(0, &a, 1, WrOp::SendWithInv { rkey }, &[a.sge(0, 16)]);
    p.run_until_idle(SEC);
    let c = p.cqes(1, &b)[0];
    assert!(c.wc_flags.contains(WcFlags::WITH_INV));
    assert_eq!(c.invalidated_rkey, rkey.0);
    assert!(p
        .recorded_frames(0)
        .iter()
        .any(|f| f.repr.transport.bth.opcode == Opcode(0x17)));
    // The rkey no longer works.
    assert_eq!(
        write_status(&mut p, &a, 0x7700_0000, rkey),
        WcStatus::RemAccessErr
    );
}

/// A peer cannot revoke an MR registered with reg_mr: SEND with Invalidate naming it is an
/// invalid request (rxe: RESPST_ERR_INVALIDATE_RKEY), and the MR stays valid.
#[test]
fn send_with_invalidate_of_an_ordinary_mr_is_refused() {
    let (mut p, a, b) = common::connected(7, &ConnectOpts::default());
    p.recv(1, &b, 1, &[b.sge(0, 64)]);
    p.post(
        0,
        &a,
        1,
        WrOp::SendWithInv { rkey: b.rkey },
        &[a.sge(0, 16)],
    );
    p.run_until_idle(SEC);
    let c = p.cqes(0, &a);
    assert_eq!(c[0].status, WcStatus::RemInvReqErr);
    assert!(p.b.dev.mr(b.lkey).unwrap().valid, "the MR survives");
    // LOCAL_INV of it fails too - LOC_QP_OP_ERR, as rxe_do_local_ops completes a refused
    // invalidation - and leaves it valid.
    let (_a2, b2) = connect(&mut p, &ConnectOpts::default());
    let mr2 = p.b.dev.mr(b2.lkey).unwrap().rkey.unwrap();
    p.post(1, &b2, 5, WrOp::LocalInv { rkey: mr2 }, &[]);
    p.run_until_idle(SEC);
    let c = p.cqes(1, &b2);
    assert_eq!(
        (c[0].opcode, c[0].status),
        (WcOpcode::LocalInv, WcStatus::LocQpOpErr)
    );
    assert!(p.b.dev.mr(b2.lkey).unwrap().valid);
}

#[test]
fn fast_registration_binds_a_new_key_and_local_invalidate_revokes_it() {
    let (mut p, a, b) = common::connected(8, &ConnectOpts::default());
    let (frmr, mem) = fast_reg(&mut p, 1, &b, 0x42, 0xabc0_0000);
    let rkey = Rkey((frmr.index() << 8) | 0x42);
    a.mem.write(0, &[0x77; 100]).unwrap();
    p.post(
        0,
        &a,
        1,
        WrOp::Write {
            remote_addr: 0xabc0_0100,
            rkey,
        },
        &[a.sge(0, 100)],
    );
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
    assert_eq!(mem.to_vec(0x100, 100), vec![0x77; 100]);
    p.post(1, &b, 2, WrOp::LocalInv { rkey }, &[]);
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(1, &b)[0].opcode, WcOpcode::LocalInv);
    assert_eq!(
        write_status(&mut p, &a, 0xabc0_0100, rkey),
        WcStatus::RemAccessErr
    );
    // Re-registering with a new key byte works again; the old key stays dead.
    let (mut p, a, b) = common::connected(8, &ConnectOpts::default());
    let (frmr, _) = fast_reg(&mut p, 1, &b, 0x42, 0xabc0_0000);
    p.post(
        1,
        &b,
        2,
        WrOp::LocalInv {
            rkey: Rkey((frmr.index() << 8) | 0x42),
        },
        &[],
    );
    p.run_until_idle(SEC);
    p.cqes(1, &b);
    p.post(
        1,
        &b,
        3,
        WrOp::RegMr {
            lkey: Lkey((frmr.index() << 8) | 0x42),
            key: 0x43,
            addr: 0xabc0_0000,
            length: 1 << 16,
            access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        },
        &[],
    );
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(1, &b)[0].status, WcStatus::Success);
    let new = Rkey((frmr.index() << 8) | 0x43);
    let old = Rkey((frmr.index() << 8) | 0x42);
    assert_eq!(
        write_status(&mut p, &a, 0xabc0_0000, new),
        WcStatus::Success
    );
    assert_eq!(
        write_status(&mut p, &a, 0xabc0_0000, old),
        WcStatus::RemAccessErr
    );
}

/// A LOCAL_INV waits until every WQE before it has completed (IBA 10.6.5.1's local
/// invalidate fence, mandatory in rxe): a READ into a fast-registered MR followed at once by
/// the MR's invalidation still lands, and only then is the MR invalidated. (Run at once,
/// the invalidation made the READ's response fail its lkey check: LOC_PROT_ERR.)
#[test]
fn local_invalidate_waits_for_the_read_before_it() {
    let (mut p, a, b) = common::connected(10, &ConnectOpts::default());
    let (frmr, mem) = fast_reg(&mut p, 0, &a, 0x42, 0xabc0_0000);
    let key = Lkey((frmr.index() << 8) | 0x42);
    b.mem.write(0, &[0x3c; 64]).unwrap();
    let into = Sge {
        addr: 0xabc0_0000,
        length: 64,
        lkey: key,
    };
    p.post(0, &a, 1, b.read_from(0), &[into]);
    p.post(0, &a, 2, WrOp::LocalInv { rkey: Rkey(key.0) }, &[]);
    p.run_until_idle(SEC);
    let got: Vec<_> = p.cqes(0, &a).iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(got, [(1, WcStatus::Success), (2, WcStatus::Success)]);
    assert_eq!(mem.to_vec(0, 64), vec![0x3c; 64]);
    // Invalidated once the READ was done: a READ into it now fails.
    p.post(0, &a, 3, b.read_from(0), &[into]);
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::LocProtErr);
}

/// REG_MR applies reg_mr's rules: a range that wraps, or remote write without local write,
/// completes with LOC_QP_OP_ERR (rxe's status for a refused REG_MR) and binds nothing.
#[test]
fn fast_registration_refuses_a_wrapping_range_and_remote_write_without_local_write() {
    for (addr, access) in [
        (u64::MAX - 10, Access::LOCAL_WRITE | Access::REMOTE_WRITE),
        (0x1000, Access::REMOTE_WRITE),
        (0x1000, Access::REMOTE_ATOMIC | Access::REMOTE_READ),
    ] {
        let (mut p, _a, b) = common::connected(8, &ConnectOpts::default());
        let mem = HeapMemory::shared(1 << 16);
        let frmr = p.b.dev.alloc_mr(b.pd, mem).unwrap();
        p.post(
            1,
            &b,
            1,
            WrOp::RegMr {
                lkey: frmr,
                key: 9,
                addr,
                length: 1 << 12,
                access,
            },
            &[],
        );
        p.run_until_idle(SEC);
        let c = p.cqes(1, &b);
        assert_eq!(c[0].status, WcStatus::LocQpOpErr, "{addr:#x} {access:?}");
        assert!(!p.b.dev.mr(frmr).unwrap().valid);
    }
}

// ---- fence, solicited, inline, SGE limits ----

#[test]
fn fenced_write_waits_for_the_read_before_it() {
    for fence in [false, true] {
        let (mut p, a, b) = common::connected(9, &ConnectOpts::default());
        p.post(0, &a, 1, b.read_from(0), &[a.sge(0, 16384)]);
        let flags = if fence {
            SendFlags::SIGNALED | SendFlags::FENCE
        } else {
            SendFlags::SIGNALED
        };
        p.post_flags(0, &a, 2, b.write_to(65536), &[a.sge(32768, 64)], flags);
        p.run_until_idle(SEC);
        let t = |side: usize, pred: &dyn Fn(Operation) -> bool| -> Vec<u64> {
            p.recorded
                .iter()
                .filter(|(s, _, f)| {
                    *s == side && pred(roce::wire::frame::parse(f).unwrap().info().op)
                })
                .map(|(_, t, _)| *t)
                .collect()
        };
        let write_at = t(0, &|o| o == Operation::Write)[0];
        let last_resp = *t(1, &|o| o == Operation::ReadResponse).last().unwrap();
        assert_eq!(write_at > last_resp, fence, "fence={fence}");
        assert!(p.cqes(0, &a).iter().all(|c| c.status == WcStatus::Success));
    }
}

#[test]
fn solicited_event_bit_is_carried_on_the_last_packet() {
    let (mut p, a, b) = common::connected(10, &ConnectOpts::default());
    p.recv(1, &b, 1, &[b.sge(0, 4096)]);
    p.recv(1, &b, 2, &[b.sge(0, 4096)]);
    p.post_flags(
        0,
        &a,
        1,
        WrOp::Send,
        &[a.sge(0, 3000)],
        SendFlags::SIGNALED | SendFlags::SOLICITED,
    );
    p.post(0, &a, 2, WrOp::Send, &[a.sge(0, 10)]);
    p.run_until_idle(SEC);
    let se: Vec<bool> = p
        .recorded_frames(0)
        .iter()
        .map(|f| f.repr.transport.bth.se)
        .collect();
    assert_eq!(se, vec![false, false, true, false]);
    let c = p.cqes(1, &b);
    assert!(c[0].solicited && !c[1].solicited);
}

#[test]
fn inline_data_is_copied_at_post_time_within_the_reported_limit() {
    let mut p = pair(11);
    let o = ConnectOpts {
        max_inline: 64,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    assert_eq!(p.a.dev.query_qp(a.qpn).unwrap().caps.max_inline_data, 64);
    // The reported device limit is the enforced one: a QP may ask for exactly it, not more.
    let limit = p.a.dev.attr().max_inline_data;
    assert!(limit >= 64);
    let pd = p.a.dev.alloc_pd().unwrap();
    let cq = p.a.dev.create_cq(4).unwrap();
    let qp_init = |max_inline_data| QpInit {
        caps: QpCaps {
            max_send_wr: 4,
            max_recv_wr: 4,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data,
        },
        ..QpInit::rc(pd, cq)
    };
    let q = p.a.dev.create_qp(&qp_init(limit)).unwrap();
    p.a.dev.destroy_qp(q).unwrap();
    assert!(p.a.dev.create_qp(&qp_init(limit + 1)).is_err());
    p.recv(1, &b, 1, &[b.sge(0, 128)]);
    a.mem.write(0, &[1; 64]).unwrap();
    p.post_flags(
        0,
        &a,
        1,
        WrOp::Send,
        &[a.sge(0, 64)],
        SendFlags::SIGNALED | SendFlags::INLINE,
    );
    a.mem.write(0, &[2; 64]).unwrap(); // changed after posting: the receiver sees the old data
    let too_big = p.a.dev.post_send(
        a.qpn,
        &SendWr {
            wr_id: 2,
            op: WrOp::Send,
            sg_list: &[a.sge(0, 65)],
            flags: SendFlags::INLINE,
            ud: None,
        },
    );
    assert!(too_big.is_err());
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(1, &b)[0].byte_len, 64);
    assert_eq!(b.mem.to_vec(0, 64), vec![1; 64]);
}

#[test]
fn sge_limits_are_enforced_and_multi_sge_gathers_and_scatters() {
    let mut p = pair(12);
    let o = ConnectOpts {
        max_sge: 3,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    let four = [a.sge(0, 1), a.sge(1, 1), a.sge(2, 1), a.sge(3, 1)];
    assert!(p
        .a
        .dev
        .post_send(
            a.qpn,
            &SendWr {
                wr_id: 1,
                op: WrOp::Send,
                sg_list: &four,
                flags: SendFlags::SIGNALED,
                ud: None
            }
        )
        .is_err());
    assert!(p
        .b
        .dev
        .post_recv(
            b.qpn,
            &RecvWr {
                wr_id: 1,
                sg_list: &[b.sge(0, 1); 4]
            }
        )
        .is_err());
    let data = pattern(3, 3000);
    a.mem.write(1000, &data[..1000]).unwrap();
    a.mem.write(5000, &data[1000..2500]).unwrap();
    a.mem.write(9000, &data[2500..]).unwrap();
    p.recv(1, &b, 1, &[b.sge(0, 700), b.sge(10_000, 2300)]);
    p.post(
        0,
        &a,
        1,
        WrOp::Send,
        &[a.sge(1000, 1000), a.sge(5000, 1500), a.sge(9000, 500)],
    );
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(1, &b)[0].byte_len, 3000);
    let mut got = b.mem.to_vec(0, 700);
    got.extend(b.mem.to_vec(10_000, 2300));
    assert_eq!(got, data);
}

// ---- events and attributes ----

#[test]
fn cq_overflow_raises_cq_error_and_fails_its_qps() {
    let (mut p, a, b) = common::connected(13, &ConnectOpts::default());
    let small = p.a.dev.create_cq(2).unwrap();
    let qpn =
        p.a.dev
            .create_qp(&QpInit {
                sq_sig_all: true,
                ..QpInit::rc(a.pd, small)
            })
            .unwrap();
    let e = Endpoint {
        qpn,
        cq: small,
        ..a.clone()
    };
    let qb = p.b.dev.create_qp(&QpInit::rc(b.pd, b.cq)).unwrap();
    let o = ConnectOpts::default();
    bring_up(&mut p.a.dev, &e, qb, node_gid(1), &o, 1, 2);
    bring_up(
        &mut p.b.dev,
        &Endpoint {
            qpn: qb,
            ..b.clone()
        },
        qpn,
        node_gid(0),
        &o,
        2,
        1,
    );
    for i in 0..3 {
        p.post(0, &e, i, b.write_to(0), &[a.sge(0, 8)]);
    }
    p.run_until_idle(SEC);
    assert!(p.a.dev.cq_overflowed(small));
    let ev: Vec<_> = std::iter::from_fn(|| p.a.dev.poll_event()).collect();
    assert_eq!(
        ev,
        vec![AsyncEvent::CqError(small.0), AsyncEvent::QpFatal(qpn)]
    );
    assert_eq!(p.a.dev.query_qp(qpn).unwrap().state, QpState::Err);
    assert_eq!(p.a.dev.counters().0.cq_overflows, 1);
}

#[test]
fn port_state_changes_are_events() {
    let mut p = pair(14);
    p.a.dev.set_port_active(false);
    p.a.dev.set_port_active(false);
    p.a.dev.set_port_active(true);
    let ev: Vec<_> = std::iter::from_fn(|| p.a.dev.poll_event()).collect();
    assert_eq!(ev, vec![AsyncEvent::PortError, AsyncEvent::PortActive]);
    assert!(p.a.dev.port_attr().active);
}

#[test]
fn device_and_port_attributes_are_the_enforced_limits() {
    let mut dev = roce::engine::Device::new(DeviceConfig {
        gids: vec![node_gid(0), Gid::link_local_from_mac([2, 0, 0, 0x99, 0, 3])],
        limits: roce::engine::DeviceLimits {
            max_qp: 2,
            max_cq: 1,
            max_mr: 1,
            max_pd: 1,
            ..Default::default()
        },
        ..Default::default()
    });
    let at = dev.attr();
    let l = at.limits;
    assert_eq!(
        (l.max_qp, l.max_cq, l.max_mr, l.max_pd, l.max_qp_rd_atom),
        (2, 1, 1, 1, 128)
    );
    assert_eq!(at.atomic_cap, 1);
    let port = dev.port_attr();
    assert_eq!(
        (port.active_mtu, port.gid_tbl_len, port.link_layer),
        (Mtu::M1024, roce::engine::GID_TABLE_LEN, "Ethernet"),
        "a table with room beyond its two populated GIDs"
    );
    let pd = dev.alloc_pd().unwrap();
    assert!(dev.alloc_pd().is_err());
    let cq = dev.create_cq(16).unwrap();
    assert!(dev.create_cq(16).is_err());
    assert!(dev.create_cq(at.limits.max_cqe + 1).is_err());
    let mem = HeapMemory::shared(4096);
    dev.reg_mr(pd, mem.clone(), 0, 0, 4096, Access::LOCAL_WRITE)
        .unwrap();
    assert!(dev
        .reg_mr(pd, mem.clone(), 0, 0, 4096, Access::LOCAL_WRITE)
        .is_err());
    assert!(
        dev.reg_mr(pd, mem, 0, 0, 8192, Access::LOCAL_WRITE)
            .is_err(),
        "longer than its memory"
    );
    let init = QpInit::rc(pd, cq);
    let q1 = dev.create_qp(&init).unwrap();
    dev.create_qp(&init).unwrap();
    assert!(dev.create_qp(&init).is_err());
    assert!(dev
        .create_qp(&QpInit {
            caps: QpCaps {
                max_send_wr: at.limits.max_qp_wr + 1,
                ..Default::default()
            },
            ..init
        })
        .is_err());
    // A PD in use cannot go; a destroyed QP frees its slot; a path MTU above the port's fails.
    assert!(dev.dealloc_pd(pd).is_err());
    dev.destroy_qp(q1).unwrap();
    dev.create_qp(&init).unwrap();
    let _ = Psn::new(0);
}

#[test]
fn path_mtu_above_the_port_mtu_is_refused() {
    // The port runs a 1024-byte MTU; a QP's path MTU may not exceed it (IBA 10.3.1.2,
    // ibv_modify_qp returns EINVAL). The QP is left as it was.
    let mut p = Pair::new(
        DeviceConfig {
            port_mtu: Mtu::M1024,
            ..Default::default()
        },
        DeviceConfig::default(),
        LinkConfig::default(),
        1,
    );
    let o = ConnectOpts {
        mtu: Mtu::M1024,
        ..Default::default()
    };
    let (a, _b) = connect(&mut p, &o);
    // A fresh QP in INIT, taken to RTR with path MTU 4096, then 1024.
    let info = p.a.dev.query_qp(a.qpn).unwrap();
    let init = QpInit {
        caps: info.caps,
        ..QpInit::rc(a.pd, a.cq)
    };
    let q = p.a.dev.create_qp(&init).unwrap();
    p.a.dev
        .modify_qp(
            q,
            &QpAttr {
                state: Some(QpState::Init),
                pkey_index: Some(0),
                port: Some(1),
                access: Some(Access::REMOTE_WRITE),
                ..Default::default()
            },
        )
        .unwrap();
    let rtr = |mtu| QpAttr {
        state: Some(QpState::Rtr),
        av: Some(AddressVector::new(roce::sim::node_gid(1), 0)),
        path_mtu: Some(mtu),
        dest_qp: Some(Qpn::new(0x30)),
        rq_psn: Some(Psn::new(0)),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(1),
        ..Default::default()
    };
    match p.a.dev.modify_qp(q, &rtr(Mtu::M4096)) {
        Err(VerbsError::Modify(ModifyError::Invalid(msg))) => {
            assert!(msg.contains("exceeds the port's active MTU"), "{msg}")
        }
        other => panic!("expected the port MTU refusal, got {other:?}"),
    }
    let info = p.a.dev.query_qp(q).unwrap();
    assert_eq!((info.state, info.attr.path_mtu), (QpState::Init, None));
    p.a.dev.modify_qp(q, &rtr(Mtu::M1024)).unwrap();
    assert_eq!(p.a.dev.query_qp(q).unwrap().state, QpState::Rtr);
}

// ---- QP states: SQD drain events, SQE, numbering ----

fn to_sqd(p: &mut Pair, side: usize, ep: &Endpoint) {
    p.node(side)
        .dev
        .modify_qp(
            ep.qpn,
            &QpAttr {
                state: Some(QpState::Sqd),
                en_sqd_async_notify: Some(true),
                ..Default::default()
            },
        )
        .unwrap();
}

/// SQ_DRAINED fires once per drain: at once when nothing is outstanding, otherwise when the
/// last WQE in flight completes; an SQD -> SQD modify is not a new drain.
#[test]
fn entering_sqd_raises_sq_drained_once_when_nothing_is_outstanding() {
    let (mut p, a, b) = common::connected(13, &ConnectOpts::default());
    to_sqd(&mut p, 0, &a);
    let ev: Vec<_> = std::iter::from_fn(|| p.a.dev.poll_event()).collect();
    assert_eq!(ev, vec![AsyncEvent::SqDrained(a.qpn)]);
    p.a.dev
        .modify_qp(
            a.qpn,
            &QpAttr {
                timeout: Some(12),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(p.a.dev.poll_event(), None, "SQD -> SQD is not a new drain");
    // Back to RTS, a WRITE in flight, then SQD: the event waits for its ACK.
    p.set_qp_state(0, &a, QpState::Rts);
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 64)]);
    let aq = a.qpn;
    p.run(SEC, |p| p.a.dev.qp_counters(aq).unwrap().sent_pkts > 0);
    to_sqd(&mut p, 0, &a);
    assert_eq!(p.a.dev.poll_event(), None, "the WRITE is still in flight");
    p.run_until_idle(SEC);
    assert_eq!(p.a.dev.poll_event(), Some(AsyncEvent::SqDrained(a.qpn)));
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
}

/// A drain finishes what it started, and only then is drained: a multi-packet WRITE being
/// sent when SQD comes holds SQ_DRAINED back until its ACK, and attributes cannot change
/// meanwhile (rxe refuses a modify out of a draining SQD); a SEND that an RNR NAK put back
/// goes again once the peer has a receive WQE, though no new WQE may start.
#[test]
fn a_drain_finishes_started_messages_before_sq_drained() {
    let (mut p, a, b) = common::connected(17, &ConnectOpts::default());
    let aq = a.qpn;
    // 64 KiB in 1 KiB packets, SQD after the first packets left.
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 65536)]);
    p.run(SEC, |p| p.a.dev.qp_counters(aq).unwrap().sent_pkts >= 4);
    p.post(0, &a, 2, b.write_to(0), &[a.sge(0, 64)]);
    to_sqd(&mut p, 0, &a);
    assert_eq!(p.a.dev.poll_event(), None, "a WRITE is half sent");
    assert!(p.a.dev.query_qp(aq).unwrap().sq_draining);
    let timeout = QpAttr {
        timeout: Some(12),
        ..Default::default()
    };
    assert!(
        p.a.dev.modify_qp(aq, &timeout).is_err(),
        "an attribute changed while draining"
    );
    p.run_until_idle(SEC);
    assert_eq!(p.a.dev.poll_event(), Some(AsyncEvent::SqDrained(aq)));
    assert!(!p.a.dev.query_qp(aq).unwrap().sq_draining);
    let c = p.cqes(0, &a);
    assert_eq!(c.len(), 1, "the WRITE after the drain began waits: {c:?}");
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success));
    p.a.dev.modify_qp(aq, &timeout).unwrap();
    p.set_qp_state(0, &a, QpState::Rts);
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].wr_id, 2);

    // A SEND to a peer with no receive WQE: RNR NAK, and the requester rewinds it.
    p.post(0, &a, 3, WrOp::Send, &[a.sge(0, 64)]);
    p.run(SEC, |p| p.a.dev.qp_counters(aq).unwrap().rcvd_rnr_err > 0);
    to_sqd(&mut p, 0, &a);
    assert_eq!(p.a.dev.poll_event(), None, "the SEND is not done");
    p.recv(1, &b, 9, &[b.sge(0, 4096)]);
    p.run_until_idle(SEC);
    let c = p.cqes(0, &a);
    assert_eq!((c[0].wr_id, c[0].status), (3, WcStatus::Success), "{c:?}");
    assert_eq!(p.a.dev.poll_event(), Some(AsyncEvent::SqDrained(aq)));
}

/// A recording pair with one UC QP pair connected.
fn uc_pair(seed: u64) -> (Pair, Endpoint, Endpoint) {
    let mut p = pair(seed);
    let o = ConnectOpts {
        qp_type: QpType::Uc,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    (p, a, b)
}

/// An SGE of `len` bytes at the start of `ep`'s MR under a key that names no MR.
fn bad_lkey(ep: &Endpoint, len: u32) -> Sge {
    Sge {
        addr: ep.addr,
        length: len,
        lkey: Lkey(ep.lkey.0 ^ 0xff),
    }
}

/// A UC receive WQE the data cannot go into (a bad lkey) completes with the error and the QP
/// goes to the error state (class A, as rxe's malformed WQE); the WQE behind it is flushed.
/// (It used to be kept, silently swallowing every later message.)
#[test]
fn a_uc_receive_wqe_with_a_bad_lkey_completes_in_error() {
    let (mut p, a, b) = uc_pair(15);
    let bad = bad_lkey(&b, 4096);
    p.recv(1, &b, 7, &[bad]);
    p.recv(1, &b, 8, &[b.sge(0, 4096)]);
    a.mem.write(0, &[0x5a; 64]).unwrap();
    p.post(0, &a, 1, WrOp::Send, &[a.sge(0, 64)]);
    p.post(0, &a, 2, WrOp::Send, &[a.sge(0, 64)]);
    p.run_until_idle(SEC);
    let c = p.cqes(1, &b);
    let got: Vec<_> = c.iter().map(|c| (c.wr_id, c.status)).collect();
    assert_eq!(
        got,
        [(7, WcStatus::LocProtErr), (8, WcStatus::WrFlushErr)],
        "{c:?}"
    );
    assert_eq!(p.qp_state(1, &b), QpState::Err);
    assert_eq!(b.mem.to_vec(0, 64), vec![0; 64], "nothing landed");
}

/// A UC SEND too long for its receive WQE: with an SRQ the WQE completes with
/// REM_INV_REQ_ERR (class E, as rxe); the QP stays in RTS and the next message takes the next
/// WQE. (With the QP's own receive queue the message is dropped and the WQE kept, class D:
/// `uc_under_faults_drops_broken_messages_but_never_completes_a_wrong_one`.)
#[test]
fn a_uc_send_too_long_for_its_srq_wqe_completes_it_in_error() {
    let mut p = pair(16);
    let o = ConnectOpts {
        qp_type: QpType::Uc,
        ..Default::default()
    };
    let (a0, b0) = connect(&mut p, &o);
    let attr = SrqAttr {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    };
    let srq = p.b.dev.create_srq(b0.pd, &attr).unwrap();
    let uc = |pd, cq| QpInit {
        qp_type: QpType::Uc,
        ..QpInit::rc(pd, cq)
    };
    let qa = p.a.dev.create_qp(&uc(a0.pd, a0.cq)).unwrap();
    let qb =
        p.b.dev
            .create_qp(&QpInit {
                srq: Some(srq),
                ..uc(b0.pd, b0.cq)
            })
            .unwrap();
    let (ea, eb) = join(&mut p, (&a0, qa), (&b0, qb), &o);
    for (id, len) in [(1u64, 32u32), (2, 4096)] {
        let wr = RecvWr {
            wr_id: id,
            sg_list: &[b0.sge(id * 8192, len)],
        };
        p.b.dev.post_srq_recv(srq, &wr).unwrap();
    }
    p.post(0, &ea, 1, WrOp::Send, &[ea.sge(0, 100)]);
    p.post(0, &ea, 2, WrOp::Send, &[ea.sge(0, 100)]);
    p.run_until_idle(SEC);
    let got: Vec<_> = p
        .cqes(1, &eb)
        .iter()
        .map(|c| (c.wr_id, c.status, c.qp_num))
        .collect();
    assert_eq!(
        got,
        [(1, WcStatus::RemInvReqErr, qb), (2, WcStatus::Success, qb)]
    );
    assert_eq!(p.qp_state(1, &eb), QpState::Rts);
}

/// A local error on a UC (or UD) send moves the QP to SQE, not ERR (IBA 10.3.1): the failed
/// WR completes with its error, later sends are flushed, receiving goes on, and SQE -> RTS
/// resumes sending. (rxe moves the QP to ERR.)
#[test]
fn uc_send_error_moves_the_qp_to_sqe_and_receiving_goes_on() {
    let (mut p, a, b) = uc_pair(14);
    let bad = bad_lkey(&a, 16);
    p.post(0, &a, 1, WrOp::Send, &[bad]);
    p.run_until_idle(SEC);
    assert_eq!(p.qp_state(0, &a), QpState::Sqe);
    let c = p.cqes(0, &a);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::LocProtErr));
    // Sends posted in SQE are flushed.
    p.post(0, &a, 2, WrOp::Send, &[a.sge(0, 16)]);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::WrFlushErr);
    // The receive side still works.
    p.recv(0, &a, 10, &[a.sge(4096, 64)]);
    b.mem.write(0, &[0x3c; 32]).unwrap();
    p.post(1, &b, 20, WrOp::Send, &[b.sge(0, 32)]);
    p.run_until_idle(SEC);
    let c = p.cqes(0, &a);
    assert_eq!(
        (c[0].wr_id, c[0].status, c[0].byte_len),
        (10, WcStatus::Success, 32)
    );
    assert_eq!(a.mem.to_vec(4096, 32), vec![0x3c; 32]);
    // SQE -> RTS: sending resumes.
    p.set_qp_state(0, &a, QpState::Rts);
    p.recv(1, &b, 21, &[b.sge(8192, 64)]);
    p.post(0, &a, 3, WrOp::Send, &[a.sge(4096, 32)]);
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
    assert_eq!(b.mem.to_vec(8192, 32), vec![0x3c; 32]);
}

/// QP numbers are not reused last-in-first-out: a destroyed QP's number stays unused, so a
/// late packet for it is dropped instead of landing on the next QP created.
#[test]
fn destroyed_qp_numbers_are_not_handed_out_again_at_once() {
    let (mut p, a, b) = common::connected(15, &ConnectOpts::default());
    // A WRITE frame for B's QP, kept for later.
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 64)]);
    p.run_until_idle(SEC);
    let late = p.first_frame(0);
    p.b.dev.destroy_qp(b.qpn).unwrap();
    let mut seen = std::collections::HashSet::new();
    for _ in 0..50 {
        let (_, nb) = connect(&mut p, &ConnectOpts::default());
        assert_ne!(nb.qpn, b.qpn, "the destroyed number came back");
        assert!(seen.insert(nb.qpn));
        p.b.dev.destroy_qp(nb.qpn).unwrap();
    }
    let before = p.b.dev.counters().0.rx_dropped_no_qp;
    p.inject(1, &late);
    assert_eq!(p.b.dev.counters().0.rx_dropped_no_qp, before + 1);
}
