//! One named test per RC error path: the exact NAK on the wire and the exact completion status
//! on both sides (IBA 9.7.5, 9.9; rxe's responder error classes).

use std::sync::Arc;

use roce::engine::{CreditMode, DeviceEvent};
use roce::memory::{HeapMemory, Memory, PdId};
use roce::sim::{connect, connect_each, ConnectOpts, Endpoint, Pair};
use roce::types::{Lkey, Msn, Psn, Rkey};
use roce::verbs::*;
use roce::wire::aeth::{AethKind, AethRepr, NakCode, RNR_TIMER_NS};
use roce::wire::bth::BthRepr;
use roce::wire::frame::TransportRepr;
use roce::wire::opcode::{Opcode, Operation};
use roce::wire::reth::RethRepr;

mod common;

use common::{cfg, recording_pair_of, SEC};

/// The pair of tests here: RNG seed 7, both ports at MTU 4096, frames recorded.
fn setup(o: ConnectOpts) -> (Pair, Endpoint, Endpoint) {
    common::connected(7, &o)
}

/// NAK syndromes and the requester's completion status they end in.
const REM_ACCESS: (u8, WcStatus) = (0x62, WcStatus::RemAccessErr);
const INV_REQ: (u8, WcStatus) = (0x61, WcStatus::RemInvReqErr);
const REM_OP: (u8, WcStatus) = (0x63, WcStatus::RemOpErr);

/// An RDMA WRITE to `remote_addr` under `rkey`.
fn write_op(remote_addr: u64, rkey: Rkey) -> WrOp {
    WrOp::Write { remote_addr, rkey }
}

/// Posts `op` with `sge` (WR 1) and a WRITE behind it (WR 2) from A, runs until idle and
/// checks A's completions: the first with `status`, the second flushed, nothing else.
fn fail_then_flush(p: &mut Pair, a: &Endpoint, b: &Endpoint, op: WrOp, sge: Sge, status: WcStatus) {
    p.post(0, a, 1, op, &[sge]);
    p.post(0, a, 2, b.write_to(0), &[a.sge(0, 8)]);
    p.run_until_idle(SEC);
    let c = p.cqes(0, a);
    assert_eq!(c.len(), 2, "{c:?}");
    assert_eq!((c[0].wr_id, c[0].status), (1, status));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(p.qp_state(0, a), QpState::Err);
}

/// Posts one operation of `len` bytes from A, runs, and checks: the one NAK B sent, A's
/// completion status (`nak` gives both), and that both QPs ended in ERR.
fn expect_nak(p: &mut Pair, a: &Endpoint, b: &Endpoint, op: WrOp, len: u32, nak: (u8, WcStatus)) {
    fail_then_flush(p, a, b, op, a.sge(0, len), nak.1);
    let n = p.naks(1);
    assert_eq!(n.len(), 1, "one NAK expected, saw {n:x?}");
    assert_eq!(n[0].1, nak.0, "NAK syndrome");
    assert_eq!(
        p.qp_state(1, b),
        QpState::Err,
        "the responder moves to ERR too"
    );
}

/// Registers 4096 bytes of `mem` at 0x5000_0000 in `pd` on B with `access`; the rkey.
fn extra_mr(p: &mut Pair, pd: PdId, mem: Arc<HeapMemory>, access: Access) -> Rkey {
    let (_, rkey) = p.b.dev.reg_mr(pd, mem, 0, EXTRA, 4096, access).unwrap();
    rkey.unwrap()
}

/// Where [`extra_mr`] registers.
const EXTRA: u64 = 0x5000_0000;

// ---- remote access errors (NAK 0x62 -> REM_ACCESS_ERR) ----

#[test]
fn stale_rkey_is_remote_access_error() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let bad = Rkey(b.rkey.0.wrapping_add(1));
    expect_nak(&mut p, &a, &b, write_op(b.addr, bad), 64, REM_ACCESS);
    assert_eq!(p.b.dev.poll_event(), Some(AsyncEvent::QpAccessError(b.qpn)));
    let kb = p.b.dev.qp_counters(b.qpn).unwrap();
    assert_eq!(kb.resp_remote_access_errors, 1);
    let ka = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!(ka.req_remote_access_errors, 1);
}

#[test]
fn rkey_of_another_protection_domain_is_remote_access_error() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    // An MR in a second PD on B: its rkey must not be honoured on B's QP (rxe's rule).
    let pd2 = p.b.dev.alloc_pd().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let rkey2 = extra_mr(&mut p, pd2, HeapMemory::shared(4096), access);
    expect_nak(&mut p, &a, &b, write_op(EXTRA, rkey2), 64, REM_ACCESS);
}

#[test]
fn write_out_of_bounds_is_remote_access_error() {
    let o = ConnectOpts::default();
    let (mut p, a, b) = setup(o);
    let end = o.mem_len as u64;
    expect_nak(&mut p, &a, &b, b.write_to(end - 32), 64, REM_ACCESS);
}

#[test]
fn mr_without_remote_write_is_remote_access_error() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let rkey = extra_mr(&mut p, b.pd, b.mem.clone(), Access::REMOTE_READ);
    expect_nak(&mut p, &a, &b, write_op(EXTRA, rkey), 64, REM_ACCESS);
}

#[test]
fn mr_without_remote_read_is_remote_access_error() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let rkey = extra_mr(&mut p, b.pd, b.mem.clone(), access);
    let read = WrOp::Read {
        remote_addr: EXTRA,
        rkey,
    };
    expect_nak(&mut p, &a, &b, read, 64, REM_ACCESS);
}

// ---- invalid request (NAK 0x61 -> REM_INV_REQ_ERR) ----

/// IBA 9.4.5 requires an 8-byte aligned ATOMIC VA; rxe answers a misaligned one with NAK
/// Invalid Request (RESPST_ERR_MISALIGNED_ATOMIC), and so does ferroce (mlx5 reports a remote
/// access error instead; interoperating with rxe decides).
#[test]
fn misaligned_atomic_is_invalid_request() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let faa = WrOp::FetchAdd {
        remote_addr: b.addr + 4,
        rkey: b.rkey,
        add: 1,
    };
    expect_nak(&mut p, &a, &b, faa, 8, INV_REQ);
    assert_eq!(b.mem.to_vec(0, 16), vec![0; 16], "nothing executed");
}

#[test]
fn qp_without_remote_write_access_is_invalid_request() {
    let o = ConnectOpts {
        access: Access::LOCAL_WRITE | Access::REMOTE_READ,
        ..Default::default()
    };
    let (mut p, a, b) = setup(o);
    expect_nak(&mut p, &a, &b, b.write_to(0), 64, INV_REQ);
    assert_eq!(
        p.b.dev.poll_event(),
        Some(AsyncEvent::QpRequestError(b.qpn))
    );
}

#[test]
fn payload_over_the_path_mtu_is_invalid_request() {
    // The requester believes the path MTU is 2048, the responder 1024.
    let (mut r, ra, rb) = connect_mtus(Mtu::M2048, Mtu::M1024);
    r.recv(1, &rb, 9, &[rb.sge(0, 4096)]);
    expect_nak(&mut r, &ra, &rb, WrOp::Send, 1500, INV_REQ);
    let c = r.cqes(1, &rb);
    assert_eq!(c[0].wr_id, 9);
    assert_eq!(
        c[0].status,
        WcStatus::RemInvReqErr,
        "the receive WQE completes with the error"
    );
}

/// A pair connected with a different path MTU on each side (a misconfiguration the responder
/// must catch).
fn connect_mtus(mtu_a: Mtu, mtu_b: Mtu) -> (Pair, Endpoint, Endpoint) {
    let mut p = recording_pair_of(cfg(), cfg(), 7);
    let o = |mtu| ConnectOpts {
        mtu,
        ..Default::default()
    };
    let (a, b) = connect_each(&mut p, &o(mtu_a), &o(mtu_b));
    (p, a, b)
}

#[test]
fn first_packet_shorter_than_the_mtu_is_invalid_request() {
    // A segments at 512, B expects FIRST/MIDDLE packets of exactly 1024 (IBA 9.7.5.1.4).
    let (mut p, a, b) = connect_mtus(Mtu::M512, Mtu::M1024);
    expect_nak(&mut p, &a, &b, b.write_to(0), 3000, INV_REQ);
}

#[test]
fn receive_buffer_too_small_is_local_length_error_and_invalid_request() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    p.recv(1, &b, 5, &[b.sge(0, 100)]);
    expect_nak(&mut p, &a, &b, WrOp::Send, 200, INV_REQ);
    let c = p.cqes(1, &b);
    assert_eq!((c[0].wr_id, c[0].status), (5, WcStatus::LocLenErr));
    assert_eq!(
        p.b.dev.qp_counters(b.qpn).unwrap().resp_local_length_error,
        1
    );
}

#[test]
fn out_of_sequence_opcode_is_invalid_request() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    p.recv(1, &b, 5, &[b.sge(0, 4096)]);
    // A SEND_MIDDLE at B's expected PSN with no SEND_FIRST before it.
    let t = TransportRepr::new(BthRepr::new(Opcode(0x01), b.qpn, a.sq_psn));
    let f = p.craft(0, t, &[0u8; 1024]);
    p.inject(1, &f);
    p.run_until_idle(SEC);
    assert_eq!(p.naks(1), vec![(a.sq_psn, 0x61)]);
    assert_eq!(p.qp_state(1, &b), QpState::Err);
    assert_eq!(
        p.b.dev.poll_event(),
        Some(AsyncEvent::QpRequestError(b.qpn))
    );
    // A never sent that PSN: its completer ignores the NAK.
    assert_eq!(p.a.dev.qp_counters(a.qpn).unwrap().unexpected_responses, 1);
    assert_eq!(p.qp_state(0, &a), QpState::Rts);
}

#[test]
fn write_shorter_than_its_reth_length_is_invalid_request() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let mut t = TransportRepr::new(BthRepr::new(Opcode(0x0a), b.qpn, a.sq_psn));
    t.bth.ack_req = true;
    t.ext.reth = Some(RethRepr {
        va: b.addr,
        rkey: b.rkey,
        len: 100,
    });
    let f = p.craft(0, t, &[7u8; 60]);
    p.inject(1, &f);
    p.run_until_idle(SEC);
    assert_eq!(p.naks(1), vec![(a.sq_psn, 0x61)]);
    assert_eq!(b.mem.to_vec(0, 60), vec![0; 60], "nothing written");
}

// ---- remote operational error (NAK 0x63 -> REM_OP_ERR) ----

#[test]
fn receive_sge_with_a_bad_lkey_is_remote_operational_error() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let bad = Sge {
        addr: b.addr,
        length: 4096,
        lkey: Lkey(b.lkey.0 ^ 0x100),
    };
    p.recv(1, &b, 5, &[bad]);
    expect_nak(&mut p, &a, &b, WrOp::Send, 200, REM_OP);
    let c = p.cqes(1, &b);
    assert_eq!((c[0].wr_id, c[0].status), (5, WcStatus::LocProtErr));
}

// ---- local errors at the requester ----

/// Posts the operation `op` makes (given B) from A with the SGE `sg` makes (given A, whose
/// MR is first replaced by one with only `access_a`, if given); checks that it fails locally
/// with LOC_PROT_ERR before anything goes on the wire, and that B's QP is left alone.
fn expect_local(
    op: fn(&Endpoint) -> WrOp,
    sg: impl Fn(&Endpoint) -> Sge,
    access_a: Option<Access>,
) {
    let (mut p, mut a, b) = setup(ConnectOpts::default());
    if let Some(acc) = access_a {
        let (lkey, _) =
            p.a.dev
                .reg_mr(a.pd, a.mem.clone(), 0, 0x7000_0000, 4096, acc)
                .unwrap();
        a.lkey = lkey;
        a.addr = 0x7000_0000;
    }
    fail_then_flush(&mut p, &a, &b, op(&b), sg(&a), WcStatus::LocProtErr);
    assert!(p.recorded_frames(0).is_empty(), "nothing went on the wire");
    assert_eq!(p.qp_state(1, &b), QpState::Rts);
}

#[test]
fn send_sge_with_a_bad_lkey_is_local_protection_error() {
    let bad_lkey = |a: &Endpoint| Sge {
        lkey: Lkey(a.lkey.0 + 1),
        ..a.sge(0, 64)
    };
    expect_local(|_| WrOp::Send, bad_lkey, None);
}

#[test]
fn send_sge_out_of_bounds_is_local_protection_error() {
    expect_local(|_| WrOp::Send, |a| a.sge((1 << 20) - 10, 64), None);
}

#[test]
fn read_into_memory_without_local_write_is_local_protection_error() {
    let only_remote_read = Some(Access::REMOTE_READ);
    expect_local(|b| b.read_from(0), |a| a.sge(0, 64), only_remote_read);
}

/// The INLINE flag means nothing to a READ or an ATOMIC (they carry no data out) and must
/// not skip their SGEs' check: with a bad lkey they fail before the request leaves, as
/// without the flag (an ATOMIC that left would change the remote memory first).
#[test]
fn an_inline_flag_on_a_read_or_atomic_still_checks_its_sges() {
    type MakeOp = fn(&Endpoint) -> WrOp;
    let ops: [(&str, MakeOp); 2] = [
        ("READ", |b| b.read_from(0)),
        ("FETCH_ADD", |b| WrOp::FetchAdd {
            remote_addr: b.addr,
            rkey: b.rkey,
            add: 5,
        }),
    ];
    for (what, op) in ops {
        let (mut p, a, b) = setup(ConnectOpts::default());
        let bad = Sge {
            lkey: Lkey(a.lkey.0 + 1),
            ..a.sge(0, 8)
        };
        let flags = SendFlags::SIGNALED | SendFlags::INLINE;
        p.post_flags(0, &a, 1, op(&b), &[bad], flags);
        p.run_until_idle(SEC);
        let c = p.cqes(0, &a);
        assert_eq!(
            (c[0].wr_id, c[0].status),
            (1, WcStatus::LocProtErr),
            "{what}"
        );
        assert!(
            p.recorded_frames(0).is_empty(),
            "{what}: a request went out"
        );
        assert_eq!(b.mem.to_vec(0, 8), vec![0; 8], "{what}");
    }
}

// ---- bad response ----

/// A NAK or RNR NAK for a PSN already acknowledged is stale (delayed or duplicated by the
/// link) and ignored: with no RNR retries left it used to fail the QP, idle as it was.
#[test]
fn stale_naks_are_ignored() {
    let o = ConnectOpts {
        rnr_retry: 0,
        ..Default::default()
    };
    let (mut p, a, b) = setup(o);
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 64)]);
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
    for aeth in [
        AethRepr::rnr_nak(1, Msn::new(0)),
        AethRepr::nak(NakCode::RemoteAccessError, Msn::new(0)),
    ] {
        let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_ACK, a.qpn, a.sq_psn));
        t.ext.aeth = Some(aeth);
        let f = p.craft(1, t, &[]);
        p.inject(0, &f);
        p.run_until_idle(SEC);
        assert_eq!(p.qp_state(0, &a), QpState::Rts, "{aeth:?}");
        assert!(p.cqes(0, &a).is_empty(), "{aeth:?}");
    }
    p.post(0, &a, 2, b.write_to(0), &[a.sge(0, 64)]);
    p.run_until_idle(SEC);
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
}

#[test]
fn read_response_of_the_wrong_length_is_bad_response() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    // Swallow B's real responses, then answer the READ with a too-short RESPONSE_ONLY.
    p.drop_if = Some(Box::new(|side, f| {
        side == 1 && f.info().op == Operation::ReadResponse
    }));
    p.post(0, &a, 1, b.read_from(0), &[a.sge(0, 800)]);
    p.run_until_idle(1000);
    let mut t = TransportRepr::new(BthRepr::new(Opcode(0x10), a.qpn, a.sq_psn));
    t.ext.aeth = Some(AethRepr::ack(31, Msn::new(1)));
    let f = p.craft(1, t, &[1u8; 100]);
    p.inject(0, &f);
    p.run_until_idle(SEC);
    let c = p.cqes(0, &a);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::BadRespErr));
    assert_eq!(p.qp_state(0, &a), QpState::Err);
    assert_eq!(
        a.mem.to_vec(0, 100),
        vec![0; 100],
        "no data placed from a bad response"
    );
}

// ---- RNR ----

/// Connection options whose responder asks for an RNR wait of `min_rnr_timer` (the IBA's
/// table index) and whose requester retries RNR NAKs `rnr_retry` times (7: for ever).
fn rnr_opts(min_rnr_timer: u8, rnr_retry: u8) -> ConnectOpts {
    ConnectOpts {
        min_rnr_timer,
        rnr_retry,
        ..Default::default()
    }
}

/// Connection options with `rd_atomic` READ/ATOMICs outstanding (and as many responder
/// resources).
fn rd_atomic_opts(rd_atomic: u8) -> ConnectOpts {
    ConnectOpts {
        rd_atomic,
        ..Default::default()
    }
}

#[test]
fn rnr_nak_waits_the_timer_then_succeeds() {
    // B asks for 1.28 ms between RNR retries; A retries for ever.
    let (mut p, a, b) = setup(rnr_opts(14, 7));
    a.mem.write(0, &[5; 300]).unwrap();
    p.post(0, &a, 1, WrOp::Send, &[a.sge(0, 300)]);
    // B has no receive WQE yet: RNR NAKs until one is posted at t = 5 ms.
    p.run(5_000_000, |_| false);
    p.recv(1, &b, 8, &[b.sge(0, 4096)]);
    p.run_until_idle(SEC);
    let n = p.naks(1);
    assert!(!n.is_empty());
    assert!(
        n.iter().all(|&(psn, s)| psn == a.sq_psn && s == 0x20 | 14),
        "{n:x?}"
    );
    // Retries are spaced by at least the advertised RNR timer.
    let sends: Vec<u64> = p
        .recorded
        .iter()
        .filter(|(s, _, _)| *s == 0)
        .map(|(_, t, _)| *t)
        .collect();
    for w in sends.windows(2) {
        assert!(
            w[1] - w[0] >= RNR_TIMER_NS[14],
            "retry after {} ns",
            w[1] - w[0]
        );
    }
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
    let c = p.cqes(1, &b);
    assert_eq!((c[0].wr_id, c[0].byte_len), (8, 300));
    assert_eq!(
        p.a.dev.qp_counters(a.qpn).unwrap().rcvd_rnr_err,
        n.len() as u64
    );
    assert_eq!(
        p.b.dev.qp_counters(b.qpn).unwrap().send_rnr_err,
        n.len() as u64
    );
}

/// After an RNR NAK the responder answers only a request at the expected PSN (IBA
/// 9.7.5.2.8): the rest of a multi-packet SEND the requester had already sent behind its
/// FIRST earns no PSN sequence error NAK, which would start a go-back-N at once, ahead of
/// the RNR wait.
#[test]
fn an_rnr_nak_is_not_followed_by_a_sequence_error_nak() {
    let (mut p, a, b) = setup(rnr_opts(14, 7));
    // Three packets at MTU 4096: FIRST, MIDDLE, LAST all leave before the RNR NAK comes.
    p.post(0, &a, 1, WrOp::Send, &[a.sge(0, 10_000)]);
    p.run(1_000_000, |_| false);
    p.recv(1, &b, 8, &[b.sge(0, 16384)]);
    p.run_until_idle(SEC);
    let n = p.naks(1);
    assert!(!n.is_empty());
    assert!(
        n.iter().all(|&(_, s)| s == 0x20 | 14),
        "only RNR NAKs: {n:x?}"
    );
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
}

/// A LAST packet carries 1..=MTU bytes (C9-92, rxe's check_length): a WRITE whose LAST is
/// empty is an invalid request, not a WRITE completed short of nothing.
#[test]
fn an_empty_last_packet_is_an_invalid_request() {
    let o = ConnectOpts::default();
    let mtu = o.mtu.bytes();
    let (mut p, a, b) = setup(o);
    let mut first = TransportRepr::new(BthRepr::new(Opcode(0x06), b.qpn, a.sq_psn));
    first.ext.reth = Some(RethRepr {
        va: b.addr,
        rkey: b.rkey,
        len: mtu,
    });
    let f = p.craft(0, first, &vec![7; mtu as usize]);
    p.inject(1, &f);
    let mut last = TransportRepr::new(BthRepr::new(Opcode(0x08), b.qpn, a.sq_psn.add(1)));
    last.bth.ack_req = true;
    let f = p.craft(0, last, &[]);
    p.inject(1, &f);
    p.run_until_idle(SEC);
    assert_eq!(p.naks(1), vec![(a.sq_psn.add(1), INV_REQ.0)]);
    assert_eq!(p.qp_state(1, &b), QpState::Err);
}

/// A duplicate WRITE is acknowledged with the PSN of the last SEND/WRITE/ATOMIC executed,
/// not with that of a READ after it: an ACK at the READ's PSN tells the requester the READ's
/// response was lost (implied NAK) and retries it (rxe's resp.ack_psn).
#[test]
fn a_duplicate_write_is_not_acknowledged_with_a_reads_psn() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 64)]);
    p.post(0, &a, 2, b.read_from(0), &[a.sge(4096, 64)]);
    p.run_until_idle(SEC);
    assert!(p.cqes(0, &a).iter().all(|c| c.status == WcStatus::Success));
    let write = p
        .recorded
        .iter()
        .find(|(s, _, f)| {
            *s == 0 && roce::wire::frame::parse(f).unwrap().info().op == Operation::Write
        })
        .map(|(_, _, f)| f.clone())
        .expect("the WRITE");
    p.recorded.clear();
    p.inject(1, &write);
    p.run_until_idle(SEC);
    let acks: Vec<Psn> = p
        .recorded_frames(1)
        .iter()
        .filter(|f| f.repr.transport.bth.opcode == Opcode::RC_ACK)
        .map(|f| f.repr.transport.bth.psn)
        .collect();
    assert_eq!(acks, vec![a.sq_psn], "the WRITE's PSN, not the READ's");
    assert_eq!(p.b.dev.qp_counters(b.qpn).unwrap().duplicate_request, 1);
}

#[test]
fn rnr_retries_exhausted_is_rnr_retry_exceeded() {
    let (mut p, a, b) = setup(rnr_opts(1, 2));
    p.post(0, &a, 1, WrOp::Send, &[a.sge(0, 10)]);
    p.post(0, &a, 2, WrOp::Send, &[a.sge(0, 10)]);
    p.run_until_idle(SEC);
    let rnr = p
        .naks(1)
        .into_iter()
        .filter(|&(_, s)| s & 0x60 == 0x20)
        .count();
    assert_eq!(rnr, 3, "the first try and two retries");
    let c = p.cqes(0, &a);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RnrRetryExcErr));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    assert_eq!(p.qp_state(0, &a), QpState::Err);
    assert_eq!(
        p.qp_state(1, &b),
        QpState::Rts,
        "RNR is not an error for the responder"
    );
    assert_eq!(p.a.dev.qp_counters(a.qpn).unwrap().rnr_nak_retry_err, 1);
}

// ---- timeouts and retries ----

#[test]
fn silent_peer_exhausts_retries() {
    let o = ConnectOpts {
        timeout: 10, // 4.2 ms
        retry_cnt: 3,
        ..Default::default()
    };
    let (mut p, a, b) = setup(o);
    p.drop_if = Some(Box::new(|side, _| side == 0));
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 64)]);
    p.post(0, &a, 2, b.write_to(0), &[a.sge(0, 64)]);
    p.run_until_idle(10 * SEC);
    let sent = p.recorded_frames(0);
    assert_eq!(
        sent.len(),
        2 * 4,
        "each WRITE sent once and retried 3 times"
    );
    let c = p.cqes(0, &a);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::RetryExcErr));
    assert_eq!((c[1].wr_id, c[1].status), (2, WcStatus::WrFlushErr));
    let k = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!(k.local_ack_timeout_err, 4);
    assert_eq!(k.retry_exceeded_err, 1);
    // The timeout doubles nothing: retries are one timeout apart (4.096 us x 2^10).
    assert!(p.now >= 4 * (4096 << 10));
}

#[test]
fn one_lost_packet_gets_one_nak_and_is_resent() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let mut dropped = false;
    p.drop_if = Some(Box::new(move |side, f| {
        // Lose the second packet of the first WRITE, once.
        if side == 0 && !dropped && f.repr.transport.bth.opcode == Opcode(0x07) {
            dropped = true;
            return true;
        }
        false
    }));
    let data: Vec<u8> = (0..5000u32).map(|i| i as u8).collect();
    a.mem.write(0, &data).unwrap();
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 5000)]);
    p.run_until_idle(SEC);
    let n = p.naks(1);
    assert_eq!(
        n,
        vec![(a.sq_psn.add(1), 0x60)],
        "one NAK for the gap despite 3 packets after it"
    );
    assert_eq!(p.cqes(0, &a)[0].status, WcStatus::Success);
    assert_eq!(b.mem.to_vec(0, 5000), data);
    let kb = p.b.dev.qp_counters(b.qpn).unwrap();
    assert_eq!(kb.out_of_sequence, 3);
    let ka = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!(ka.packet_seq_err, 1);
    assert_eq!(ka.retransmitted_pkts, 4);
}

#[test]
fn lost_read_response_is_found_by_an_implied_nak() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    let mut dropped = false;
    p.drop_if = Some(Box::new(move |side, f| {
        if side == 1 && !dropped && f.info().op == Operation::ReadResponse {
            dropped = true;
            return true;
        }
        false
    }));
    b.mem.write(0, &[9u8; 512]).unwrap();
    p.recv(1, &b, 3, &[b.sge(8192, 64)]);
    p.post(0, &a, 1, b.read_from(0), &[a.sge(0, 512)]);
    p.post(0, &a, 2, WrOp::Send, &[a.sge(4096, 64)]);
    p.run_until_idle(SEC);
    let ka = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!(ka.implied_nak_seq_err, 1, "the SEND's ACK passed the READ");
    assert_eq!(
        ka.local_ack_timeout_err, 0,
        "recovered without waiting for the timer"
    );
    let c = p.cqes(0, &a);
    assert!(c.iter().all(|c| c.status == WcStatus::Success));
    assert_eq!(a.mem.to_vec(0, 512), vec![9u8; 512]);
    assert_eq!(
        p.b.dev.qp_counters(b.qpn).unwrap().duplicate_request,
        2,
        "READ and SEND again"
    );
}

/// ACKs that arrive after the ACK timer rewound the requester acknowledge packets sent before
/// the rewind: they complete what they cover and move the send point past it, so nothing they
/// acknowledged is sent again (IBA 9.7.5.2.2; rxe compares with the WQE's last PSN).
#[test]
fn late_acks_after_a_rewind_complete_and_skip_what_they_cover() {
    let o = ConnectOpts {
        timeout: 8, // ~1 ms
        ..Default::default()
    };
    let (mut p, a, b) = setup(o);
    let hold = std::rc::Rc::new(std::cell::Cell::new(true));
    let h = hold.clone();
    // Hold back B's ACKs (they are recorded, not delivered) until A's timer has fired.
    p.drop_if = Some(Box::new(move |side, _| side == 1 && h.get()));
    for i in 0..4u64 {
        p.post(0, &a, i + 1, b.write_to(i * 1024), &[a.sge(i * 1024, 1024)]);
    }
    let aq = a.qpn;
    p.run(SEC, |p| {
        p.a.dev.qp_counters(aq).unwrap().local_ack_timeout_err == 1
    });
    let late: Vec<Vec<u8>> = p
        .recorded
        .iter()
        .filter(|(s, _, _)| *s == 1)
        .map(|(_, _, f)| f.clone())
        .collect();
    assert_eq!(late.len(), 4, "one ACK per WRITE, all held back");
    hold.set(false);
    for f in &late {
        p.inject(0, f);
    }
    // A WRITE posted now must get the next new PSN (not one the late ACKs already covered,
    // which B would take for a duplicate and acknowledge without writing).
    a.mem.write(8192, &[0x5a; 256]).unwrap();
    p.post(0, &a, 5, b.write_to(8192), &[a.sge(8192, 256)]);
    p.run_until_idle(SEC);
    assert_eq!(b.mem.to_vec(8192, 256), vec![0x5a; 256]);
    let c = p.cqes(0, &a);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        (1..=5).map(|i| (i, WcStatus::Success)).collect::<Vec<_>>()
    );
    let ka = p.a.dev.qp_counters(a.qpn).unwrap();
    assert_eq!(ka.unexpected_responses, 0, "the late ACKs were accepted");
    assert_eq!(
        ka.retransmitted_pkts, 0,
        "nothing they acknowledged went again"
    );
    assert_eq!(p.b.dev.qp_counters(b.qpn).unwrap().duplicate_request, 0);
}

// ---- duplicates ----

#[test]
fn duplicate_atomic_is_replayed_not_executed_again() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    b.mem.write(64, &100u64.to_ne_bytes()).unwrap();
    p.post(
        0,
        &a,
        1,
        WrOp::FetchAdd {
            remote_addr: b.addr + 64,
            rkey: b.rkey,
            add: 5,
        },
        &[a.sge(0, 8)],
    );
    p.run_until_idle(SEC);
    assert_eq!(b.mem.to_vec(64, 8), 105u64.to_ne_bytes());
    let req = p.first_frame(0);
    p.recorded.clear();
    p.inject(1, &req);
    p.run_until_idle(SEC);
    assert_eq!(
        b.mem.to_vec(64, 8),
        105u64.to_ne_bytes(),
        "not executed twice"
    );
    let replies = p.recorded_frames(1);
    assert_eq!(replies.len(), 1);
    assert_eq!(
        replies[0].repr.transport.ext.atomic_ack.unwrap().orig,
        100,
        "the saved result"
    );
    assert_eq!(p.b.dev.qp_counters(b.qpn).unwrap().duplicate_request, 1);
}

#[test]
fn duplicate_read_is_read_again_from_memory() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    b.mem.write(0, &[1u8; 100]).unwrap();
    p.post(0, &a, 1, b.read_from(0), &[a.sge(0, 100)]);
    p.run_until_idle(SEC);
    let req = p.first_frame(0);
    b.mem.write(0, &[2u8; 100]).unwrap();
    p.recorded.clear();
    p.inject(1, &req);
    p.run_until_idle(SEC);
    let replies = p.recorded_frames(1);
    assert_eq!(replies.len(), 1);
    let f = &p.first_frame(1);
    assert_eq!(replies[0].payload(f), &[2u8; 100][..]);
}

#[test]
fn duplicate_write_is_acknowledged_again() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 100)]);
    p.run_until_idle(SEC);
    let req = p.first_frame(0);
    p.recorded.clear();
    p.inject(1, &req);
    p.run_until_idle(SEC);
    let acks = p.recorded_frames(1);
    assert_eq!(acks.len(), 1);
    let t = &acks[0].repr.transport;
    assert_eq!(t.bth.psn, a.sq_psn);
    assert!(matches!(t.ext.aeth.unwrap().kind(), AethKind::Ack { .. }));
}

/// The request frames A sent, in order (recorded).
fn requests_sent(p: &Pair) -> Vec<Vec<u8>> {
    p.recorded
        .iter()
        .filter(|(s, _, f)| {
            *s == 0 && roce::wire::frame::parse(f).is_ok_and(|pf| pf.info().is_request)
        })
        .map(|(_, _, f)| f.clone())
        .collect()
}

/// A READ repeated ten thousand times before the responder sends anything restarts the one
/// reply of its resource: one reply goes out, not ten thousand (the responses are produced
/// from the resource on demand, never queued per request).
#[test]
fn duplicate_read_flood_restarts_one_reply() {
    let (mut p, a, b) = setup(ConnectOpts::default()); // path MTU 1024
    p.post(0, &a, 1, b.read_from(0), &[a.sge(0, 16384)]);
    p.run_until_idle(SEC);
    assert_eq!(p.recorded_frames(1).len(), 16, "16 response packets");
    let req = requests_sent(&p).remove(0);
    p.recorded.clear();
    for _ in 0..10_000 {
        p.inject(1, &req);
    }
    p.run_until_idle(SEC);
    let replies = p.recorded_frames(1);
    assert_eq!(replies.len(), 16, "one reply for the whole flood");
    let ops: Vec<u8> = replies
        .iter()
        .map(|f| f.repr.transport.bth.opcode.0)
        .collect();
    assert_eq!(ops[0], 0x0d);
    assert_eq!(ops[15], 0x0f);
    let kb = p.b.dev.qp_counters(b.qpn).unwrap();
    assert_eq!(kb.duplicate_request, 10_000);
}

/// With 4 responder resources, READs older than the last 4 are forgotten: their duplicates
/// are dropped (class D), while duplicates of the last 4 are answered again.
#[test]
fn only_the_last_max_dest_rd_atomic_reads_are_replayed() {
    let (mut p, a, b) = setup(rd_atomic_opts(4));
    for i in 0..200u64 {
        p.post(0, &a, i, b.read_from(64 * i), &[a.sge(64 * i, 64)]);
    }
    p.run_until_idle(SEC);
    assert!(p.cqes(0, &a).iter().all(|c| c.status == WcStatus::Success));
    let reqs = requests_sent(&p);
    assert_eq!(reqs.len(), 200);
    p.recorded.clear();
    for r in &reqs[..50] {
        p.inject(1, r);
    }
    p.run_until_idle(SEC);
    assert_eq!(
        p.recorded_frames(1).len(),
        0,
        "forgotten READs get no reply"
    );
    for r in &reqs[196..] {
        p.inject(1, r);
    }
    p.run_until_idle(SEC);
    assert_eq!(p.recorded_frames(1).len(), 4, "the last 4 are replayed");
    let kb = p.b.dev.qp_counters(b.qpn).unwrap();
    assert_eq!(kb.resp_duplicates_dropped, 50);
    assert_eq!(kb.duplicate_request, 54);
}

/// A duplicate READ may ask for the original range or a part of it, under the same R_Key
/// (rxe's rule); a larger range or another key is dropped. A part from inside the original is
/// answered from its PSN with MIDDLE/LAST responses, as rxe replays it.
#[test]
fn duplicate_read_may_ask_only_for_a_part_of_the_original() {
    let (mut p, a, b) = setup(ConnectOpts::default()); // path MTU 1024
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    b.mem.write(0, &data).unwrap();
    // A second MR over the same memory, with its own key.
    let (_, other) =
        p.b.dev
            .reg_mr(
                b.pd,
                b.mem.clone(),
                0,
                b.addr,
                8192,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
    p.post(0, &a, 1, b.read_from(0), &[a.sge(0, 2048)]);
    p.run_until_idle(SEC);
    p.recorded.clear();
    let dup = |p: &Pair, psn: Psn, va: u64, rkey: Rkey, len: u32| {
        let mut t = TransportRepr::new(BthRepr::new(Opcode(0x0c), b.qpn, psn));
        t.ext.reth = Some(RethRepr { va, rkey, len });
        p.craft(0, t, &[])
    };
    for f in [
        dup(&p, a.sq_psn, b.addr, b.rkey, 4096),
        dup(&p, a.sq_psn, b.addr, other.unwrap(), 2048),
        dup(&p, a.sq_psn.add(1), b.addr + 1024, b.rkey, 2048),
    ] {
        p.inject(1, &f);
    }
    p.run_until_idle(SEC);
    assert_eq!(p.recorded_frames(1).len(), 0, "all three dropped");
    assert_eq!(
        p.b.dev.qp_counters(b.qpn).unwrap().resp_duplicates_dropped,
        3
    );
    let f = dup(&p, a.sq_psn.add(1), b.addr + 1024, b.rkey, 1024);
    p.inject(1, &f);
    p.run_until_idle(SEC);
    let replies = p.recorded_frames(1);
    assert_eq!(replies.len(), 1);
    let t = &replies[0].repr.transport;
    assert_eq!((t.bth.opcode, t.bth.psn), (Opcode(0x0f), a.sq_psn.add(1)));
    let frame = &p.first_frame(1);
    assert_eq!(replies[0].payload(frame), &data[1024..2048]);
}

/// A requester with more READ/ATOMIC outstanding than the responder resources it was given
/// (here 4) gets NAK Invalid Request for the one that does not fit, instead of making the
/// responder forget a reply it still owes.
#[test]
fn reads_beyond_the_responder_resources_are_invalid_requests() {
    let (mut p, a, b) = setup(rd_atomic_opts(4));
    for i in 0..5u32 {
        let mut t = TransportRepr::new(BthRepr::new(Opcode(0x0c), b.qpn, a.sq_psn.add(i)));
        t.ext.reth = Some(RethRepr {
            va: b.addr,
            rkey: b.rkey,
            len: 64,
        });
        let f = p.craft(0, t, &[]);
        p.inject(1, &f);
    }
    p.run_until_idle(SEC);
    assert_eq!(p.naks(1), vec![(a.sq_psn.add(4), 0x61)]);
    let kb = p.b.dev.qp_counters(b.qpn).unwrap();
    assert_eq!(kb.resp_rd_atomic_exceeded, 1);
    assert_eq!(p.qp_state(1, &b), QpState::Err);
    let replies = p.recorded_frames(1);
    let reads = replies
        .iter()
        .filter(|f| f.repr.transport.bth.opcode == Opcode(0x10))
        .count();
    assert_eq!(reads, 4, "the four that fit are still answered");
}

// ---- flush ----

#[test]
fn entering_error_flushes_every_outstanding_wr() {
    let (mut p, a, b) = setup(ConnectOpts::default());
    for i in 0..3 {
        p.recv(0, &a, 100 + i, &[a.sge(0, 64)]);
    }
    // Nothing reaches B, so the WRITEs stay outstanding.
    p.drop_if = Some(Box::new(|_, _| true));
    for i in 0..4 {
        p.post(0, &a, i, b.write_to(0), &[a.sge(0, 64)]);
    }
    p.run(10_000, |_| false);
    p.set_qp_state(0, &a, QpState::Err);
    let c = p.cqes(0, &a);
    let sends: Vec<_> = c
        .iter()
        .filter(|c| c.opcode == WcOpcode::RdmaWrite)
        .collect();
    let recvs: Vec<_> = c.iter().filter(|c| c.opcode == WcOpcode::Recv).collect();
    assert_eq!(
        sends.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
    assert_eq!(
        recvs.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        vec![100, 101, 102]
    );
    assert!(c.iter().all(|c| c.status == WcStatus::WrFlushErr));
    // WRs posted in ERR complete at once, flushed.
    p.post(0, &a, 9, WrOp::Send, &[a.sge(0, 1)]);
    p.recv(0, &a, 10, &[a.sge(0, 1)]);
    let c = p.cqes(0, &a);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(9, WcStatus::WrFlushErr), (10, WcStatus::WrFlushErr)]
    );
}

// ---- end-to-end credits ----

#[test]
fn sends_beyond_advertised_credits_wait_except_one_probe() {
    let o = rnr_opts(10, 7);
    let mut cb = cfg();
    cb.credits = CreditMode::FromReceiveQueue;
    let mut p = recording_pair_of(cfg(), cb, 7);
    let (a, b) = connect(&mut p, &o);
    p.recv(1, &b, 1, &[b.sge(0, 64)]);
    p.post(0, &a, 1, WrOp::Send, &[a.sge(0, 8)]);
    p.run_until_idle(SEC);
    // B's ACK advertised 0 credits (its RQ is empty now).
    let ack = p
        .recorded_frames(1)
        .last()
        .unwrap()
        .repr
        .transport
        .ext
        .aeth
        .unwrap();
    assert_eq!(ack.kind(), AethKind::Ack { credits: 0 });
    p.recorded.clear();
    p.post(0, &a, 2, WrOp::Send, &[a.sge(0, 8)]);
    p.post(0, &a, 3, WrOp::Send, &[a.sge(0, 8)]);
    p.run(3_000_000, |_| false);
    // Only the probe (SEND 2) went out, again after each RNR NAK; SEND 3 waited.
    let psns: Vec<Psn> = p
        .recorded_frames(0)
        .iter()
        .map(|f| f.repr.transport.bth.psn)
        .collect();
    assert!(
        psns.len() >= 2 && psns.iter().all(|&x| x == a.sq_psn.add(1)),
        "{psns:x?}"
    );
    p.recv(1, &b, 2, &[b.sge(0, 64)]);
    p.recv(1, &b, 3, &[b.sge(0, 64)]);
    p.run_until_idle(SEC);
    let c = p.cqes(0, &a);
    assert_eq!(
        c.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![
            (1, WcStatus::Success),
            (2, WcStatus::Success),
            (3, WcStatus::Success)
        ]
    );
}

// ---- a WR the host interface took but the engine refused ----

/// A send WR refused after the application counted it as posted still takes its place in
/// the send queue: it completes LOC_QP_OP_ERR in order (after the WR before it), the QP goes
/// to ERR as for a WQE the RNIC cannot execute, and the queue position advances past it, so
/// the application's count of free places stays right.
#[test]
fn a_rejected_post_completes_in_order_and_frees_its_place() {
    let (mut p, a, b) = setup(ConnectOpts {
        depth: 4,
        ..Default::default()
    });
    p.post(0, &a, 1, b.write_to(0), &[a.sge(0, 64)]);
    p.run_until_idle(SEC);
    let before = p.a.dev.queue_positions(a.qpn).unwrap().0;
    for i in 0..10 {
        let wr = SendWr {
            wr_id: 10 + i,
            op: WrOp::Send,
            sg_list: &[],
            flags: SendFlags::SIGNALED,
            ud: None,
        };
        p.a.dev.handle_event(DeviceEvent::SendRejected {
            qpn: a.qpn,
            wr: &wr,
        });
        p.run_until_idle(SEC);
    }
    let c = p.cqes(0, &a);
    assert_eq!((c[0].wr_id, c[0].status), (1, WcStatus::Success), "{c:?}");
    assert_eq!((c[1].wr_id, c[1].status), (10, WcStatus::LocQpOpErr));
    assert_eq!(c[1].vendor_err, roce::verbs::vendor_err::REJECTED_AT_POST);
    assert!(
        c[2..].iter().all(|c| c.status == WcStatus::WrFlushErr),
        "{c:?}"
    );
    assert_eq!(c.len(), 11, "every rejected WR completes: {c:?}");
    assert_eq!(p.qp_state(0, &a), QpState::Err);
    assert_eq!(
        p.a.dev.queue_positions(a.qpn).unwrap().0,
        before + 10,
        "ten rejected WRs on a queue of four: every place came back"
    );
}
