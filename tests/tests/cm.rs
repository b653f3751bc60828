//! rdma_cm between two applications on two ferroce RNICs in one process (joined by a DPDK
//! ring pair): the connection manager's MADs cross the wire on QP1 through the dataplane,
//! the QPs come up from what the REQ and REP carry, data flows, and the connection is torn
//! down; a REQ nobody listens for, a rejection with private data, and a client that goes
//! away with its connections, all through the host interface.

use dataplane::runtime::{test_config, Runtime};
use dataplane::Context;
use ferroce_host::abi::CmEventData;
use ferroce_host::app::{CmQpPath, RdmaCm};
use ferroce_tests::{
    cm_accept_request, cm_connect, cm_event, cm_path, post_signaled, side, wait_cq, wait_until,
    Side,
};
use roce::cm::{reason, AcceptParams};
use roce::verbs::*;
use roce::wire::cm::{service_id, CmaHeader, PrivateData, PS_TCP};

fn rnics(name: &str) -> (Runtime, Side, Side) {
    let rt = Runtime::loopback(name, test_config(3, 1024), test_config(4, 1024)).expect("rnics");
    let a = side(rt.open(0).unwrap(), QpType::Rc, 1 << 20, 64);
    let b = side(rt.open(1).unwrap(), QpType::Rc, 1 << 20, 64);
    (rt, a, b)
}

#[test]
fn rdma_cm_connects_two_applications_and_data_flows() {
    let (_rt, mut a, mut b) = rnics("cm-connect");
    let sid = service_id(PS_TCP, 7174);
    b.ctx.cm_listen(sid).unwrap();
    assert!(
        b.ctx.cm_listen(sid).is_err(),
        "a service is listened to once"
    );
    let a_id = cm_connect(&mut a, &b, 7174);
    // B: the REQ, with the requester's address in rdma_cm's header.
    let CmEventData::ConnectRequest {
        id: b_id,
        peer,
        local,
        qpn,
        starting_psn,
        responder_resources,
        private_data,
        ..
    } = cm_event(&mut b)
    else {
        panic!("not a connect request");
    };
    assert_eq!((peer, local, qpn), (a.gid, b.gid, a.qpn));
    let hdr = CmaHeader::parse(&private_data).expect("rdma_cm header");
    assert_eq!(
        hdr.src.ip(),
        std::net::IpAddr::from(a.gid.to_ipv4().unwrap())
    );
    // B's QP to RTS from the REQ (it sends from the REQ's starting PSN), then the REP.
    let b_rq_psn = 0x8d06b3;
    let path = cm_path(peer, qpn, (b_rq_psn, starting_psn), responder_resources);
    b.ctx.cm_bring_up(b.qpn, Access::ALL, &path).unwrap();
    let accept = AcceptParams {
        qpn: b.qpn.value(),
        starting_psn: b_rq_psn,
        responder_resources: 16,
        initiator_depth: 16,
        rnr_retry_count: 7,
        private_data: PrivateData::from_bytes(b"welcome").unwrap(),
        ..Default::default()
    };
    b.ctx.cm_accept(b_id, accept).unwrap();
    // A: the REP, its QP to RTS, the RTU.
    let CmEventData::RepReceived {
        id,
        qpn,
        starting_psn,
        responder_resources,
        private_data,
        ..
    } = cm_event(&mut a)
    else {
        panic!("not a REP");
    };
    assert_eq!((id, qpn), (a_id, b.qpn));
    assert_eq!(&private_data[..7], b"welcome");
    let path = CmQpPath {
        peer_gid: b.gid,
        peer_qpn: qpn,
        rq_psn: 0x58642a,
        sq_psn: starting_psn,
        max_rd_atomic: responder_resources,
        ..path
    };
    a.ctx.cm_bring_up(a.qpn, Access::ALL, &path).unwrap();
    a.ctx.cm_rtu(a_id).unwrap();
    assert_eq!(cm_event(&mut a), CmEventData::Established { id: a_id });
    assert_eq!(cm_event(&mut b), CmEventData::Established { id: b_id });
    // Data both ways over the connection the CM made: WRITE A -> B, READ it back.
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 13 + 7) as u8).collect();
    a.buf.write(0, &data);
    let op = WrOp::Write {
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey.unwrap(),
    };
    post_signaled(&mut a, 1, op, 0, data.len() as u32);
    let c = wait_cq(&mut a, 1, 10);
    assert_eq!(
        c.first().map(|c| c.status),
        Some(WcStatus::Success),
        "{c:?}"
    );
    assert_eq!(b.buf.to_vec(0, data.len()), data);
    let op = WrOp::Read {
        remote_addr: b.mr.addr,
        rkey: b.mr.rkey.unwrap(),
    };
    post_signaled(&mut a, 2, op, 1 << 19, data.len() as u32);
    let c = wait_cq(&mut a, 1, 10);
    assert_eq!(
        c.first().map(|c| c.status),
        Some(WcStatus::Success),
        "{c:?}"
    );
    assert_eq!(a.buf.to_vec(1 << 19, data.len()), data);
    // Another client cannot name B's connection (IDs are small numbers anyone can guess).
    let mut other: Context = _rt.open(1).unwrap();
    assert!(other.cm_disconnect(b_id).is_err());
    assert!(other.cm_reject(b_id, &[]).is_err());
    assert_eq!(other.cm_get_event().unwrap(), None);
    // Disconnect from B: both see it; the QPs go to error as rdma_cm's consumers do.
    b.ctx.cm_disconnect(b_id).unwrap();
    assert_eq!(cm_event(&mut b), CmEventData::Disconnected { id: b_id });
    assert_eq!(cm_event(&mut a), CmEventData::Disconnected { id: a_id });
    assert!(
        b.ctx.cm_disconnect(b_id).is_err(),
        "a connection is disconnected once"
    );
}

/// B's answer to the newest connect request: its QP to RTS, then the REP.
fn accept_request(b: &mut Side) -> u32 {
    cm_accept_request(b, 0x1234, None).0
}

/// A client that goes away in the middle of a handshake (its process killed) leaves its peer
/// a `Rejected` at once, as the kernel's CM does when it destroys the ID, instead of a REP
/// retried for a minute and a `TimedOut` (the real soak found an rdma_cm server waiting for
/// ever for a client killed there).
#[test]
fn a_client_gone_mid_handshake_is_rejected_at_once() {
    let (rt, mut a, mut b) = rnics("cm-gone");
    // The later cases each start over (the one before dropped a side): two new sides, B
    // listening on `port`.
    let fresh = |port| {
        let mut b = side(rt.open(1).unwrap(), QpType::Rc, 4096, 4);
        b.ctx.cm_listen(service_id(PS_TCP, port)).unwrap();
        (side(rt.open(0).unwrap(), QpType::Rc, 4096, 4), b)
    };
    let sid = service_id(PS_TCP, 11);
    b.ctx.cm_listen(sid).unwrap();
    // 1. The active side goes after the REP, before its RTU.
    let _ = cm_connect(&mut a, &b, 11);
    let b_id = accept_request(&mut b);
    assert!(matches!(cm_event(&mut a), CmEventData::RepReceived { .. }));
    drop(a);
    assert!(
        matches!(cm_event(&mut b), CmEventData::Rejected { id, .. } if id == b_id),
        "the passive side was not told"
    );
    // 2. The active side goes while its REQ is out: it withdraws the REQ (a REJ, reason
    // timeout, as the kernel's cm_destroy_id in REQ_SENT), so the passive side hears
    // Rejected for the request it was given, before it answers.
    let (mut a, mut b) = fresh(12);
    let _ = cm_connect(&mut a, &b, 12);
    drop(a);
    let CmEventData::ConnectRequest { id: b_id, .. } = cm_event(&mut b) else {
        panic!("the passive side got no connect request");
    };
    assert!(
        matches!(cm_event(&mut b), CmEventData::Rejected { id, reason: reason::TIMEOUT, .. } if id == b_id),
        "the passive side was not told"
    );
    // 3. The passive side goes after its REP: the active side is told.
    let (mut a, mut b) = fresh(13);
    let a_id = cm_connect(&mut a, &b, 13);
    accept_request(&mut b);
    assert!(matches!(cm_event(&mut a), CmEventData::RepReceived { .. }));
    drop(b);
    assert!(
        matches!(cm_event(&mut a), CmEventData::Rejected { id, .. } if id == a_id),
        "the active side was not told"
    );
}

#[test]
fn no_listener_rejection_and_a_client_that_goes_away() {
    let (rt, mut a, mut b) = rnics("cm-reject");
    // Nobody listens on port 9: the REQ is rejected as an invalid service ID.
    let id = cm_connect(&mut a, &b, 9);
    assert_eq!(
        cm_event(&mut a),
        CmEventData::Rejected {
            id,
            reason: reason::INVALID_SERVICE_ID,
            private_data: vec![0; 148],
        }
    );
    // The application rejects with its own private data.
    let sid = service_id(PS_TCP, 10);
    b.ctx.cm_listen(sid).unwrap();
    let id = cm_connect(&mut a, &b, 10);
    let CmEventData::ConnectRequest { id: b_id, .. } = cm_event(&mut b) else {
        panic!()
    };
    b.ctx.cm_reject(b_id, b"go away").unwrap();
    let CmEventData::Rejected {
        id: rid,
        reason: r,
        private_data,
    } = cm_event(&mut a)
    else {
        panic!()
    };
    assert_eq!((rid, r), (id, reason::CONSUMER_DEFINED));
    assert_eq!(&private_data[..7], b"go away");
    // A listening client that exits: its service is free again, and a REQ arriving for it
    // meanwhile is rejected rather than left waiting.
    drop(b);
    let dropped_at = std::time::Instant::now();
    let id = cm_connect(&mut a, &side(rt.open(1).unwrap(), QpType::Rc, 4096, 4), 10);
    let e = cm_event(&mut a);
    assert_eq!(
        e,
        CmEventData::Rejected {
            id,
            reason: reason::INVALID_SERVICE_ID,
            private_data: vec![0; 148],
        },
        "after {:?}",
        dropped_at.elapsed()
    );
    let mut c = side(rt.open(1).unwrap(), QpType::Rc, 4096, 4);
    assert!(wait_until(5, || c.ctx.cm_listen(sid).is_ok()));
}
