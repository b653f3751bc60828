//! One context over several workers (`worker.spread`): a context's QPs are placed on every
//! worker of its RNIC in turn and share its CQs; its PDs, MRs and CQs are replicated on every
//! worker under the same ids and keys. Data moves verified, each QP's completions arrive in
//! order on the one CQ, none lost or doubled; what a QP on another worker uses cannot be
//! destroyed under it; a context closed with work in flight leaves nothing behind.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use dataplane::app::RdmaCm;
use dataplane::config::RnicConfig;
use dataplane::runtime::Runtime;
use dataplane::{Buffer, Context, Mr, Verbs};
use ferroce_host::abi::CmEventData;
use ferroce_tests::{
    cm_establish, cm_event, on_workers, post_signaled, rc_to_rts, side, wait_cq, wait_until,
};
use roce::engine::{CqId, QpInit, QpnStripe, SrqAttr, SrqId, VerbsError};
use roce::memory::PdId;
use roce::types::{Gid, Qpn};
use roce::verbs::*;

/// Bytes of each QP's region in the buffers.
const REGION: usize = 16 * 1024;

fn spread(host: u8, workers: u32) -> RnicConfig {
    let mut c = on_workers(host, workers);
    c.worker_spread = true;
    c
}

/// A context with `n` RC QPs sharing one CQ, a buffer of `n` regions and its MR.
struct Many {
    ctx: Context,
    pd: PdId,
    cq: CqId,
    /// The SRQ its QPs receive from, if they share one.
    srq: Option<SrqId>,
    qps: Vec<Qpn>,
    buf: Buffer,
    mr: Mr,
    gid: Gid,
}

fn many(ctx: Context, n: usize, depth: u32) -> Many {
    many_with(ctx, n, depth, None)
}

/// [`many`], the QPs receiving from one SRQ of `srq` WQEs if given.
fn many_with(ctx: Context, n: usize, depth: u32, srq: Option<u32>) -> Many {
    let mut ctx = ctx;
    let pd = ctx.alloc_pd().expect("pd");
    let cq = ctx.create_cq(4 * depth * n as u32).expect("cq");
    let srq = srq.map(|max_wr| {
        let attr = SrqAttr {
            max_wr,
            max_sge: 1,
            srq_limit: 0,
        };
        ctx.create_srq(pd, &attr).expect("srq")
    });
    let qps = (0..n)
        .map(|_| {
            ctx.create_qp(&QpInit {
                caps: QpCaps {
                    max_send_wr: depth,
                    max_recv_wr: depth,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                srq,
                ..QpInit::rc(pd, cq)
            })
            .expect("qp")
        })
        .collect();
    let buf = ctx.alloc_buffer(n * REGION).expect("buffer");
    let mr = ctx
        .reg_mr(pd, &buf, 0, n * REGION, Access::ALL)
        .expect("mr");
    let gid = ctx.query_gid(1).expect("gid");
    Many {
        ctx,
        pd,
        cq,
        srq,
        qps,
        buf,
        mr,
        gid,
    }
}

/// Brings QP `i` of `a` to RTS towards QP `i` of `b` and back.
fn connect(a: &mut Many, b: &mut Many) {
    for i in 0..a.qps.len() {
        bring_up(a, b.qps[i], b.gid, i);
        bring_up(b, a.qps[i], a.gid, i);
    }
}

fn bring_up(me: &mut Many, peer_qp: Qpn, peer_gid: Gid, i: usize) {
    rc_to_rts(&mut me.ctx, me.qps[i], peer_qp, peer_gid, 100, 16);
}

/// Polls `m`'s CQ until `n` completions came (or 30 s passed).
fn take(m: &mut Many, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let mut buf = [Completion::default(); 64];
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < n && Instant::now() < deadline {
        let k = m.ctx.poll_cq(m.cq, &mut buf).expect("poll");
        out.extend_from_slice(&buf[..k]);
    }
    out
}

fn post(m: &mut Many, i: usize, wr_id: u64, op: WrOp, off: usize, len: u32) {
    let sge = m.mr.sge((i * REGION + off) as u64, len);
    m.ctx
        .post_send(
            m.qps[i],
            &SendWr {
                wr_id,
                op,
                sg_list: std::slice::from_ref(&sge),
                flags: SendFlags::SIGNALED,
                ud: None,
            },
        )
        .expect("post_send");
}

fn post_recv(m: &mut Many, i: usize, wr_id: u64, off: usize, len: u32) {
    let sge = m.mr.sge((i * REGION + off) as u64, len);
    m.ctx
        .post_recv(
            m.qps[i],
            &RecvWr {
                wr_id,
                sg_list: std::slice::from_ref(&sge),
            },
        )
        .expect("post_recv");
}

/// Checks that every QP's completions came in the order of its wr_ids (`wr_id` = QP index
/// x 1000 + sequence), all successful, `per_qp` of each, none doubled.
fn in_order(wc: &[Completion], qps: &[Qpn], per_qp: u64) {
    let mut next: HashMap<Qpn, u64> = HashMap::new();
    for c in wc {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
        let i = qps
            .iter()
            .position(|q| *q == c.qp_num)
            .expect("a QP of the context");
        assert_eq!(c.wr_id / 1000, i as u64, "{c:?}");
        let n = next.entry(c.qp_num).or_insert(0);
        assert_eq!(c.wr_id % 1000, *n, "QP {i}'s completions in order: {c:?}");
        *n += 1;
    }
    for q in qps {
        assert_eq!(
            next.get(q).copied().unwrap_or(0),
            per_qp,
            "every completion of {q:?}"
        );
    }
}

fn pattern(i: usize, k: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (j as u64 * 7 + k * 13 + i as u64 * 101) as u8)
        .collect()
}

/// One context's QPs on both workers of its RNIC, with one CQ: WRITEs, SENDs and READs
/// to a context spread the same way on the other RNIC, every byte checked, every QP's
/// completions in order on the shared CQs.
#[test]
fn one_contexts_qps_on_two_workers_share_its_cq() {
    let rt = Runtime::loopback("ferroce-spread", spread(81, 2), spread(82, 2)).expect("loopback");
    let n = 6;
    let rounds = 20u64;
    let mut a = many(rt.open(0).unwrap(), n, 64);
    let mut b = many(rt.open(1).unwrap(), n, 64);
    let stripes: Vec<u32> = a.qps.iter().map(|q| QpnStripe::owner(*q, 2)).collect();
    assert_eq!(
        stripes,
        [0, 1, 0, 1, 0, 1],
        "QPs placed on the workers in turn"
    );
    connect(&mut a, &mut b);
    // WRITEs: each QP writes its own region of b, several messages of 3 packets each.
    let len = 3000usize;
    for i in 0..n {
        let data = pattern(i, 1, len);
        a.buf.write(i * REGION, &data);
    }
    for k in 0..rounds {
        for i in 0..n {
            let op = WrOp::Write {
                remote_addr: b.mr.addr + (i * REGION) as u64 + k * 8,
                rkey: b.mr.rkey.unwrap(),
            };
            post(&mut a, i, i as u64 * 1000 + k, op, 0, len as u32);
        }
        // The send queues hold 64: take what completed once they fill.
    }
    let wc = take(&mut a, n * rounds as usize);
    in_order(&wc, &a.qps, rounds);
    for i in 0..n {
        let mut got = vec![0u8; len];
        b.buf.read(i * REGION + (rounds as usize - 1) * 8, &mut got);
        assert_eq!(got, pattern(i, 1, len), "QP {i}'s WRITE data");
    }
    // SENDs: b's receive completions of QPs on both workers on b's one CQ.
    for i in 0..n {
        for k in 0..rounds {
            post_recv(&mut b, i, i as u64 * 1000 + k, 8192, 4096);
        }
    }
    for k in 0..rounds {
        for i in 0..n {
            let data = pattern(i, 2 + k, 2500);
            a.buf.write(i * REGION + 4096, &data);
            post(&mut a, i, i as u64 * 1000 + k, WrOp::Send, 4096, 2500);
            // Each SEND's data checked as it lands (the next one overwrites it).
            let wb = take(&mut b, 1);
            assert_eq!(wb.len(), 1, "a receive completion");
            let qi = b.qps.iter().position(|q| *q == wb[0].qp_num).unwrap();
            assert_eq!((qi, wb[0].byte_len), (i, 2500), "{:?}", wb[0]);
            assert_eq!(wb[0].wr_id, i as u64 * 1000 + k, "{:?}", wb[0]);
            let mut got = vec![0u8; 2500];
            b.buf.read(i * REGION + 8192, &mut got);
            assert_eq!(got, data, "QP {i}'s SEND {k}");
        }
    }
    in_order(&take(&mut a, n * rounds as usize), &a.qps, rounds);
    // READs back from b into a.
    for i in 0..n {
        let op = WrOp::Read {
            remote_addr: b.mr.addr + (i * REGION + 8192) as u64,
            rkey: b.mr.rkey.unwrap(),
        };
        post(&mut a, i, i as u64 * 1000, op, 12288, 2500);
    }
    in_order(&take(&mut a, n), &a.qps, 1);
    for i in 0..n {
        let mut got = vec![0u8; 2500];
        a.buf.read(i * REGION + 12288, &mut got);
        assert_eq!(got, pattern(i, 2 + rounds - 1, 2500), "QP {i}'s READ");
    }
    // rnic-ctl's view: one client per RNIC with all its QPs and one CQ.
    let reports = rt.inspect(false, Duration::from_secs(10)).expect("inspect");
    for r in &reports {
        assert_eq!(r.clients.len(), 1, "one client");
        let c = &r.clients[0];
        assert_eq!((c.qps.len(), c.cqs.len(), c.mrs.len()), (n, 1, 1));
    }
    for i in 0..2 {
        let s = rt.stats(i);
        assert_eq!(s.nic.spread_dropped, 0, "{s:?}");
        assert_eq!(s.dev.cq_overflows, 0);
        assert_eq!(s.objects.qps, n as u32, "QPs counted once: {:?}", s.objects);
        assert_eq!((s.objects.cqs, s.objects.mrs, s.objects.pds), (1, 1, 1));
        assert_eq!(s.hosts, 1, "one context");
    }
    drop((a, b));
    rt.stop();
}

/// A PD or CQ that a QP on another worker uses cannot go; what a spread context cannot
/// have (a memory window) is refused with a clear error.
#[test]
fn what_a_remote_qp_uses_stays_and_the_unsupported_is_refused() {
    let rt = Runtime::loopback("ferroce-spread2", spread(83, 2), spread(84, 2)).expect("loopback");
    let mut a = many(rt.open(0).unwrap(), 2, 16);
    assert_eq!(
        QpnStripe::owner(a.qps[1], 2),
        1,
        "the second QP on the second worker"
    );
    let q0 = a.qps[0];
    // Only the second QP (on the other worker) uses the CQ and PD now.
    a.ctx.destroy_qp(q0).expect("destroy the first QP");
    assert!(matches!(a.ctx.destroy_cq(a.cq), Err(VerbsError::Busy(_))));
    a.ctx.dereg_mr(&a.mr).expect("dereg");
    assert!(matches!(a.ctx.dealloc_pd(a.pd), Err(VerbsError::Busy(_))));
    // Calls on the remote QP work through the home.
    let attr = a.ctx.query_qp(a.qps[1]).expect("query the remote QP");
    assert_eq!(attr.state, QpState::Reset);
    a.ctx.destroy_qp(a.qps[1]).expect("destroy the remote QP");
    assert!(a.ctx.query_qp(a.qps[1]).is_err(), "gone");
    a.ctx.destroy_cq(a.cq).expect("the CQ goes now");
    let mw = a.ctx.alloc_mw(a.pd, dataplane::MwType::Two);
    assert!(
        matches!(&mw, Err(VerbsError::InvalidArgument(m)) if m.contains("worker.spread")),
        "{mw:?}"
    );
    a.ctx.dealloc_pd(a.pd).expect("the PD goes now");
    // (Counters are published about every millisecond.)
    assert!(
        wait_until(10, || (0..2)
            .all(|i| rt.stats(i).objects == Default::default())),
        "nothing left: {:?}",
        rt.stats(0).objects
    );
    drop(a);
    rt.stop();
}

/// A context closed while WRITEs on its QPs on both workers are in flight: everything it
/// had goes on every worker, the mbufs come back, and a new context works.
#[test]
fn a_context_closed_with_work_in_flight_leaves_nothing() {
    let rt = Runtime::loopback("ferroce-spread3", spread(85, 2), spread(86, 2)).expect("loopback");
    let base = rt.stats(0).mbufs_in_use + rt.stats(1).mbufs_in_use;
    for round in 0..3 {
        let mut a = many(rt.open(0).unwrap(), 4, 32);
        let mut b = many(rt.open(1).unwrap(), 4, 32);
        connect(&mut a, &mut b);
        for k in 0..32 {
            for i in 0..4 {
                let op = WrOp::Write {
                    remote_addr: b.mr.addr + (i * REGION) as u64,
                    rkey: b.mr.rkey.unwrap(),
                };
                post(&mut a, i, i as u64 * 1000 + k, op, 0, 8192);
            }
        }
        if round == 2 {
            // The last round completes: the RNIC still works after the closes.
            in_order(&take(&mut a, 4 * 32), &a.qps, 32);
        }
        drop(a);
        drop(b);
    }
    assert!(
        wait_until(10, || {
            (0..2).all(|i| {
                let s = rt.stats(i);
                s.objects == Default::default() && s.hosts == 0
            })
        }),
        "every object released on every worker: {:?} {:?}",
        rt.stats(0).objects,
        rt.stats(1).objects
    );
    assert!(
        wait_until(10, || {
            rt.stats(0).mbufs_in_use + rt.stats(1).mbufs_in_use <= base
        }),
        "mbufs back to {base}: {}",
        rt.stats(0).mbufs_in_use + rt.stats(1).mbufs_in_use
    );
    rt.stop();
}

/// An SRQ shared by QPs on both workers: 200 SENDs over four QPs consume 200 WQEs, each
/// exactly once, every message lands whole in the WQE that took it, each QP's messages in
/// order; the limit fires once; an SRQ a remote QP uses stays.
#[test]
fn an_srq_shared_by_qps_on_two_workers_hands_out_each_wqe_once() {
    const MSGS: u64 = 200;
    const SLOT: usize = 256;
    let rt = Runtime::loopback("ferroce-spread4", spread(87, 2), spread(88, 2)).expect("loopback");
    let mut a = many(rt.open(0).unwrap(), 4, 64);
    let mut b = many_with(rt.open(1).unwrap(), 4, 64, Some(256));
    let srq = b.srq.unwrap();
    connect(&mut a, &mut b);
    for j in 0..MSGS {
        let sge = b.mr.sge(j * SLOT as u64, SLOT as u32);
        let wr = RecvWr {
            wr_id: j,
            sg_list: std::slice::from_ref(&sge),
        };
        b.ctx.post_srq_recv(srq, &wr).expect("post_srq_recv");
    }
    // Fires once fewer than 20 WQEs are left: after the 181st is taken.
    b.ctx.modify_srq(srq, 20).expect("arm the limit");
    // Message m: on QP m mod 4, its number in its first two bytes, then a pattern of it.
    let body = |m: u64| -> Vec<u8> {
        let mut v = pattern(m as usize, 9, 200);
        v[..2].copy_from_slice(&(m as u16).to_le_bytes());
        v
    };
    let mut wa = Vec::new();
    for m in 0..MSGS {
        let i = (m % 4) as usize;
        let off = (m / 4 % 16) as usize * 512;
        a.buf.write(i * REGION + off, &body(m));
        post(&mut a, i, i as u64 * 1000 + m / 4, WrOp::Send, off, 200);
        if m % 64 == 63 {
            // The source slots are reused after 16 rounds: wait for these to go.
            wa.extend(take(&mut a, 64));
        }
    }
    wa.extend(take(&mut a, MSGS as usize % 64));
    in_order(&wa, &a.qps, MSGS / 4);
    let wb = take(&mut b, MSGS as usize);
    assert_eq!(wb.len(), MSGS as usize, "every message received");
    let mut wqes = vec![0u32; MSGS as usize];
    let mut seen = vec![0u32; MSGS as usize];
    let mut last: HashMap<Qpn, u64> = HashMap::new();
    for c in &wb {
        assert_eq!((c.status, c.byte_len), (WcStatus::Success, 200), "{c:?}");
        wqes[c.wr_id as usize] += 1;
        let mut got = vec![0u8; 200];
        b.buf.read(c.wr_id as usize * SLOT, &mut got);
        let m = u16::from_le_bytes([got[0], got[1]]) as u64;
        assert!(m < MSGS, "{c:?}");
        assert_eq!(got, body(m), "message {m} whole in WQE {}", c.wr_id);
        seen[m as usize] += 1;
        let i = b.qps.iter().position(|q| *q == c.qp_num).unwrap();
        assert_eq!(m % 4, i as u64, "message {m} on its QP");
        if let Some(p) = last.insert(c.qp_num, m) {
            assert!(m > p, "QP {i}'s messages in order: {p} then {m}");
        }
    }
    assert!(
        wqes.iter().all(|&k| k == 1),
        "each WQE taken once: {wqes:?}"
    );
    assert!(seen.iter().all(|&k| k == 1), "each message once: {seen:?}");
    let stripes: std::collections::HashSet<u32> =
        wb.iter().map(|c| QpnStripe::owner(c.qp_num, 2)).collect();
    assert_eq!(stripes.len(), 2, "received on both workers");
    // The limit event, once.
    let mut events = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        if let Some(e) = b.ctx.poll_event() {
            events.push(e);
        }
    }
    assert_eq!(events, [AsyncEvent::SrqLimitReached(srq.0)]);
    assert_eq!(
        b.ctx.query_srq(srq).expect("query").srq_limit,
        0,
        "disarmed"
    );
    // Room for a full SRQ again (every WQE was taken).
    for j in 0..256 {
        let sge = b.mr.sge(0, 64);
        let wr = RecvWr {
            wr_id: 1000 + j,
            sg_list: std::slice::from_ref(&sge),
        };
        b.ctx.post_srq_recv(srq, &wr).expect("room for 256");
    }
    // A QP on the second worker still uses it.
    assert!(matches!(b.ctx.destroy_srq(srq), Err(VerbsError::Busy(_))));
    for q in b.qps.clone() {
        b.ctx.destroy_qp(q).expect("destroy QP");
    }
    b.ctx.destroy_srq(srq).expect("the SRQ goes now");
    drop((a, b));
    rt.stop();
}

/// rdma_cm in spread contexts: each side's connection uses its QP on the second worker; the
/// home's connection manager connects them (REQ, REP, RTU), a WRITE moves verified, and
/// both sides see the disconnect.
#[test]
fn rdma_cm_connects_qps_on_another_worker() {
    use roce::wire::cm::{service_id, PS_TCP};
    let rt = Runtime::loopback("ferroce-spread5", spread(89, 2), spread(90, 2)).expect("loopback");
    let mut a = side(rt.open(0).unwrap(), QpType::Rc, 8192, 16);
    let mut b = side(rt.open(1).unwrap(), QpType::Rc, 8192, 16);
    for s in [&mut a, &mut b] {
        // The context's second QP: on the second worker.
        let q = s
            .ctx
            .create_qp(&QpInit {
                caps: QpCaps {
                    max_send_wr: 16,
                    max_recv_wr: 16,
                    max_send_sge: 2,
                    max_recv_sge: 2,
                    max_inline_data: 64,
                },
                ..QpInit::rc(s.pd, s.cq)
            })
            .expect("second QP");
        assert_eq!(QpnStripe::owner(q, 2), 1, "on the second worker");
        s.qpn = q;
    }
    b.ctx.cm_listen(service_id(PS_TCP, 7100)).unwrap();
    let (a_id, b_id) = cm_establish(&mut a, &mut b, 7100);
    let data: Vec<u8> = (0..3000).map(|i| (i * 7 + 3) as u8).collect();
    a.buf.write(0, &data);
    let op = WrOp::Write {
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey.unwrap(),
    };
    post_signaled(&mut a, 1, op, 0, 3000);
    let wc = wait_cq(&mut a, 1, 20);
    assert_eq!(
        wc.first().map(|c| c.status),
        Some(WcStatus::Success),
        "{wc:?}"
    );
    assert_eq!(wc[0].qp_num, a.qpn);
    let mut got = vec![0u8; 3000];
    b.buf.read(0, &mut got);
    assert_eq!(got, data, "the WRITE's data");
    a.ctx.cm_disconnect(a_id).unwrap();
    assert_eq!(cm_event(&mut a), CmEventData::Disconnected { id: a_id });
    assert_eq!(cm_event(&mut b), CmEventData::Disconnected { id: b_id });
    drop((a, b));
    rt.stop();
}

/// Program order holds when the queue to a satellite is full: 4000 WRITEs posted to a QP on
/// the second worker, the queues between the workers holding two messages, then the QP
/// moved to the error state and reset at once. Every WRITE posted before the calls completes
/// in order, each done or flushed by the move to ERR (IBA 10.8.3.3), none refused as if
/// posted after the reset.
#[test]
fn posts_before_a_call_stay_before_it_when_a_satellite_lags() {
    const N: u64 = 4000;
    // Queues of two messages between the workers: full at once.
    let small = |h| {
        let mut c = spread(h, 2);
        c.spread_queue = 2;
        c
    };
    let rt = Runtime::loopback("ferroce-spread6", small(91), small(92)).expect("loopback");
    let mut a = many(rt.open(0).unwrap(), 2, 4096);
    let mut b = many(rt.open(1).unwrap(), 2, 16);
    connect(&mut a, &mut b);
    let op = WrOp::Write {
        remote_addr: b.mr.addr + REGION as u64,
        rkey: b.mr.rkey.unwrap(),
    };
    for k in 0..N {
        post(&mut a, 1, 1000 + k, op, 0, 64);
    }
    let err = QpAttr {
        state: Some(QpState::Err),
        ..Default::default()
    };
    a.ctx.modify_qp(a.qps[1], &err).expect("to ERR");
    // And to RESET: a WRITE applied only now would be refused (LOC_QP_OP_ERR).
    let reset = QpAttr {
        state: Some(QpState::Reset),
        ..Default::default()
    };
    a.ctx.modify_qp(a.qps[1], &reset).expect("to RESET");
    let wc = take(&mut a, N as usize);
    assert_eq!(wc.len(), N as usize, "every WRITE completes");
    for (k, c) in wc.iter().enumerate() {
        assert_eq!(c.wr_id, 1000 + k as u64, "in order: {c:?}");
        assert!(
            matches!(c.status, WcStatus::Success | WcStatus::WrFlushErr),
            "WRITE {k} done or flushed: {c:?}"
        );
    }
    drop((a, b));
    rt.stop();
}
