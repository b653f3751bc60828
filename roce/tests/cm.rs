//! The connection manager's state machines on simulated time: two agents joined by a link
//! that can lose chosen MADs, every handshake step, its losses and retries, rejection,
//! disconnection, peers that vanish, bounds, and the REQ/REP ferroce builds compared byte
//! for byte with what Linux's ib_cm sent in the corpus.

use roce::cm::{
    comm_id_owner, mad_route, reason, AcceptParams, CmAgent, CmConfig, CmEvent, ConnId,
    ConnectParams, MadRoute, OutMad,
};
use roce::engine::QpnStripe;
use roce::types::Gid;
use roce::wire::cm::{service_id, Cm, PrivateData, CM_DATA_LEN, PS_TCP};
use roce::wire::mad::{attr, MadHeader, HEADER_LEN};

const A_GID: Gid = Gid::from_ipv4([10, 99, 0, 2]);
const B_GID: Gid = Gid::from_ipv4([10, 99, 0, 4]);
const SID: u64 = 0x0106_1c06; // RDMA_PS_TCP, port 7174 (rping)
const MS: u64 = 1_000_000;

/// Two agents, A (active) at `A_GID` and B (passive) at `B_GID`, and the MADs in flight.
struct Link {
    a: CmAgent,
    b: CmAgent,
    now: u64,
    /// Attribute IDs to lose, once each, in order of their sending.
    lose: Vec<u16>,
    /// Lose everything from A or from B.
    a_gone: bool,
    b_gone: bool,
    /// What crossed, by attribute, as (from A, attr).
    seen: Vec<(bool, u16)>,
    a_events: Vec<CmEvent>,
    b_events: Vec<CmEvent>,
    /// The communication IDs each agent hands out (each as one of an RNIC's workers).
    stripes: (QpnStripe, QpnStripe),
}

fn cfg(guid: u64, id_stripe: QpnStripe) -> CmConfig {
    CmConfig {
        ca_guid: guid,
        id_stripe,
        ..CmConfig::default()
    }
}

impl Link {
    fn new() -> Link {
        Link::striped(QpnStripe::ALL, QpnStripe::ALL)
    }

    /// A link whose agents hand out the communication IDs of stripes `a` and `b`.
    fn striped(a: QpnStripe, b: QpnStripe) -> Link {
        let mut bb = CmAgent::new(cfg(0x5054_00ff_fe99_0004, b));
        bb.listen(SID).unwrap();
        Link {
            a: CmAgent::new(cfg(0x5054_00ff_fe99_0002, a)),
            b: bb,
            stripes: (a, b),
            now: 0,
            lose: Vec::new(),
            a_gone: false,
            b_gone: false,
            seen: Vec::new(),
            a_events: Vec::new(),
            b_events: Vec::new(),
        }
    }

    fn deliver(&mut self, from_a: bool, m: OutMad) {
        let attr = MadHeader::parse(&m.mad).unwrap().attr_id;
        self.seen.push((from_a, attr));
        // What a receiver with one agent per worker would steer it by: a request by its
        // service, anything else by the receiver's own communication ID, of its stripe.
        let to = if from_a {
            self.stripes.1
        } else {
            self.stripes.0
        };
        match mad_route(&m.mad) {
            Some(MadRoute::Service(sid)) => assert_eq!(sid, SID, "{attr:#x}"),
            Some(MadRoute::Conn(id)) => {
                assert_eq!(comm_id_owner(id, to.count), to.index, "{attr:#x} {id:#x}")
            }
            None => panic!("a CM MAD without a route: {attr:#x}"),
        }
        if (from_a && self.a_gone) || (!from_a && self.b_gone) {
            return;
        }
        if let Some(i) = self.lose.iter().position(|&x| x == attr) {
            self.lose.remove(i);
            return;
        }
        assert_eq!(m.src, if from_a { A_GID } else { B_GID });
        if from_a {
            assert_eq!(m.dest, B_GID);
            self.b.handle_mad(self.now, A_GID, B_GID, &m.mad);
        } else {
            assert_eq!(m.dest, A_GID);
            self.a.handle_mad(self.now, B_GID, A_GID, &m.mad);
        }
    }

    /// Moves MADs and events until nothing is in flight; with `wait`, also lets time run to
    /// the next deadline while one is armed, up to `limit` of simulated time.
    fn run(&mut self, wait: bool, limit: u64) {
        let end = self.now + limit;
        loop {
            let mut moved = false;
            while let Some(m) = self.a.poll_mad() {
                self.deliver(true, m);
                moved = true;
            }
            while let Some(m) = self.b.poll_mad() {
                self.deliver(false, m);
                moved = true;
            }
            while let Some(e) = self.a.poll_event() {
                self.a_events.push(e);
            }
            while let Some(e) = self.b.poll_event() {
                self.b_events.push(e);
            }
            if moved {
                continue;
            }
            if !wait {
                return;
            }
            let next = [self.a.poll_timeout(), self.b.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if t <= end => {
                    self.now = self.now.max(t);
                    self.a.handle_timeout(self.now);
                    self.b.handle_timeout(self.now);
                }
                _ => return,
            }
        }
    }

    fn connect(&mut self) -> ConnId {
        let p = ConnectParams {
            service_id: SID,
            local_gid: A_GID,
            remote_gid: B_GID,
            qpn: 0x31,
            starting_psn: 0x58642a,
            responder_resources: 1,
            initiator_depth: 1,
            path_mtu: 3,
            retry_count: 7,
            rnr_retry_count: 7,
            hop_limit: 64,
            ..Default::default()
        };
        self.a.connect(self.now, &p).unwrap()
    }

    /// B's newest connect request.
    fn request(&self) -> ConnId {
        self.b_events
            .iter()
            .rev()
            .find_map(|e| match e {
                CmEvent::ConnectRequest { id, .. } => Some(*id),
                _ => None,
            })
            .expect("a connect request at B")
    }

    fn accept(&mut self, id: ConnId) {
        let p = AcceptParams {
            qpn: 0x38,
            starting_psn: 0x8d06b3,
            responder_resources: 1,
            initiator_depth: 1,
            rnr_retry_count: 7,
            ..Default::default()
        };
        self.b.accept(self.now, id, &p).unwrap();
    }

    /// A link that loses the first MAD with attribute `attr`.
    fn losing(attr: u16) -> Link {
        let mut l = Link::new();
        l.lose = vec![attr];
        l
    }

    /// A's REQ, and the link run until nothing moves; A's connection ID.
    fn send_req(&mut self) -> ConnId {
        let a = self.connect();
        self.run(false, 0);
        a
    }

    /// B's REP for its connection `b`, and the link run until nothing moves.
    fn send_rep(&mut self, b: ConnId) {
        self.accept(b);
        self.run(false, 0);
    }

    /// A's RTU for its connection `a`, and the link run until nothing moves.
    fn send_rtu(&mut self, a: ConnId) {
        self.a.rtu(a).unwrap();
        self.run(false, 0);
    }

    /// A full handshake; the two IDs.
    fn establish(&mut self) -> (ConnId, ConnId) {
        let a = self.send_req();
        let b = self.request();
        self.send_rep(b);
        assert!(matches!(self.a_events.last(), Some(CmEvent::RepReceived { id, .. }) if *id == a));
        self.send_rtu(a);
        (a, b)
    }

    fn attrs(&self) -> Vec<(bool, u16)> {
        self.seen.clone()
    }
}

fn names(events: &[CmEvent]) -> Vec<&'static str> {
    events
        .iter()
        .map(|e| match e {
            CmEvent::ConnectRequest { .. } => "request",
            CmEvent::RepReceived { .. } => "rep",
            CmEvent::Established { .. } => "established",
            CmEvent::Rejected { .. } => "rejected",
            CmEvent::TimedOut { .. } => "timed out",
            CmEvent::Disconnected { .. } => "disconnected",
            CmEvent::Released { .. } => "released",
            CmEvent::SidrRequest { .. } => "sidr request",
            CmEvent::SidrReply { .. } => "sidr reply",
        })
        .collect()
}

#[test]
fn connect_accept_establish_disconnect_and_release() {
    let mut l = Link::new();
    let (a, b) = l.establish();
    let CmEvent::ConnectRequest { req, peer, .. } = l.b_events[0] else {
        panic!()
    };
    assert_eq!(
        (peer, req.local_qpn, req.starting_psn),
        (A_GID, 0x31, 0x58642a)
    );
    let CmEvent::RepReceived { rep, .. } = l.a_events[0] else {
        panic!()
    };
    assert_eq!((rep.local_qpn, rep.starting_psn), (0x38, 0x8d06b3));
    assert_eq!(rep.remote_comm_id, a.0);
    assert_eq!(names(&l.a_events), ["rep", "established"]);
    assert_eq!(names(&l.b_events), ["request", "established"]);
    l.a.disconnect(l.now, a).unwrap();
    l.run(true, 60_000 * MS);
    assert_eq!(
        l.attrs().iter().map(|x| x.1).collect::<Vec<_>>(),
        [attr::REQ, attr::REP, attr::RTU, attr::DREQ, attr::DREP]
    );
    assert_eq!(names(&l.a_events)[2..], ["disconnected", "released"]);
    assert_eq!(names(&l.b_events)[2..], ["disconnected", "released"]);
    assert!(matches!(l.b_events[3], CmEvent::Released { id } if id == b));
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    assert_eq!((l.a.poll_timeout(), l.b.poll_timeout()), (None, None));
    assert_eq!(l.a.counters.retries + l.b.counters.retries, 0);
}

/// A REP names the active side's communication ID, which is no secret (a slot and a
/// generation): one from any host but the peer the REQ went to is ignored and counted (it
/// would program the QP with that host's QPN and PSN), and the peer's own still connects.
#[test]
fn a_rep_from_another_host_is_ignored() {
    let mut l = Link::new();
    let a = l.send_req();
    let b = l.request();
    l.accept(b);
    let rep = l.b.poll_mad().expect("B's REP");
    let spoofer = Gid::from_ipv4([10, 99, 0, 66]);
    l.a.handle_mad(l.now, spoofer, A_GID, &rep.mad);
    assert!(
        l.a.poll_event().is_none(),
        "a REP from another host was taken"
    );
    assert_eq!(l.a.counters.rx_unmatched, 1);
    l.a.handle_mad(l.now, B_GID, A_GID, &rep.mad);
    assert!(matches!(l.a.poll_event(), Some(CmEvent::RepReceived { id, .. }) if id == a));
}

#[test]
fn a_lost_req_is_sent_again_after_the_cm_timeout() {
    let mut l = Link::losing(attr::REQ);
    let a = l.send_req();
    assert!(l.b_events.is_empty());
    // Linux's wait: 2 x packet lifetime (2^(18-8) ms) + response timeout (2^(20-8) ms).
    assert_eq!(l.a.poll_timeout(), Some((2 * 1024 + 4096) * MS));
    l.run(true, 10_000 * MS);
    assert_eq!(l.a.counters.retries, 1);
    let b = l.request();
    l.send_rep(b);
    l.send_rtu(a);
    assert_eq!(names(&l.b_events), ["request", "established"]);
}

#[test]
fn a_lost_rep_is_answered_again_when_the_req_repeats() {
    let mut l = Link::losing(attr::REP);
    let a = l.send_req();
    let b = l.request();
    // B answers a second later, so its own REP retry would come a second after A's REQ
    // retry: the REP A gets is the answer to the duplicate.
    l.now += 1000 * MS;
    l.accept(b);
    // A times out, sends the REQ again; B knows it and sends its REP again, once, as a
    // duplicate (not a second connection).
    l.run(true, 5_500 * MS);
    assert_eq!(l.b.counters.rx_duplicates, 1);
    assert_eq!(l.b.counters.retries, 0, "B's own REP retry is not due yet");
    assert_eq!(l.b.conn_count(), 1);
    assert_eq!(names(&l.b_events), ["request"]);
    assert_eq!(names(&l.a_events), ["rep"]);
    l.send_rtu(a);
    assert_eq!(names(&l.b_events), ["request", "established"]);
}

#[test]
fn a_lost_rtu_is_sent_again_when_the_rep_repeats() {
    let mut l = Link::losing(attr::RTU);
    let (_a, _b) = l.establish();
    assert_eq!(names(&l.b_events), ["request"]);
    l.run(true, 10_000 * MS);
    assert_eq!(l.a.counters.rx_duplicates, 1);
    assert_eq!(names(&l.b_events), ["request", "established"]);
    // Or the QP's first packet establishes it before any RTU.
    let mut l = Link::losing(attr::RTU);
    let (_, b) = l.establish();
    l.b.established(b).unwrap();
    l.run(false, 0);
    assert_eq!(names(&l.b_events), ["request", "established"]);
    assert_eq!(l.b.poll_timeout(), None, "no REP retry once established");
}

#[test]
fn no_listener_is_rejected_as_an_invalid_service_id() {
    let mut l = Link::new();
    l.b.unlisten(SID);
    let a = l.connect();
    // Held for a listener that may come, then rejected as Linux rejects it at once.
    l.run(false, 0);
    assert!(l.a_events.is_empty(), "{:?}", l.a_events);
    assert_eq!((l.b.conn_count(), l.b.counters.held), (1, 1));
    l.run(true, 60_000 * MS);
    let CmEvent::Rejected { id, reason: r, .. } = l.a_events[0] else {
        panic!("{:?}", l.a_events)
    };
    assert_eq!((id, r), (a, reason::INVALID_SERVICE_ID));
    assert_eq!(l.now, CmConfig::default().unclaimed_hold_ms * MS);
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    assert!(l.b_events.is_empty());
    assert_eq!(l.b.poll_timeout(), None);
    // With no hold, at once.
    let mut l = Link::new();
    l.b = CmAgent::new(CmConfig {
        unclaimed_hold_ms: 0,
        ..cfg(0x5054_00ff_fe99_0004, QpnStripe::ALL)
    });
    let a = l.send_req();
    assert!(
        matches!(l.a_events[..], [CmEvent::Rejected { id, reason: reason::INVALID_SERVICE_ID, .. }] if id == a),
        "{:?}",
        l.a_events
    );
    assert_eq!(l.b.conn_count(), 0);
}

/// A REQ (or SIDR request) that comes before its listener, as perftest's -R client's does
/// when its server answers a key round and only then listens: held, handed to the listener
/// when it comes, and the connection (or service) is made.
#[test]
fn a_request_that_comes_before_its_listener_waits_for_it() {
    let mut l = Link::new();
    l.b.unlisten(SID);
    let a = l.connect();
    l.now += 10 * MS;
    l.run(false, 0);
    assert!(l.b_events.is_empty() && l.a_events.is_empty());
    l.b.listen(SID).unwrap();
    assert_eq!(l.b.poll_timeout(), None, "the hold ended");
    l.run(false, 0);
    let b = l.request();
    l.send_rep(b);
    let Some(CmEvent::RepReceived { id, .. }) = l.a_events.first().copied() else {
        panic!("{:?}", l.a_events)
    };
    assert_eq!(id, a);
    l.send_rtu(a);
    assert_eq!(names(&l.b_events), ["request", "established"]);
    // B's DREQ names A's QP, as the held REQ gave it (Linux drops a DREQ for another QPN).
    let b = l.request();
    l.b.disconnect(l.now, b).unwrap();
    let m = l.b.poll_mad().expect("a DREQ");
    let h = MadHeader::parse(&m.mad).unwrap();
    let Ok(Some(Cm::Dreq(dreq))) = Cm::parse(h.attr_id, &m.mad[HEADER_LEN..]) else {
        panic!("not a DREQ")
    };
    assert_eq!(dreq.remote_qpn, 0x31);
    l.deliver(false, m);
    l.run(false, 0);
    // SIDR the same way.
    use roce::cm::{SidrParams, SIDR_VALID};
    l.b.unlisten(SID);
    let p = SidrParams {
        service_id: SID,
        local_gid: A_GID,
        remote_gid: B_GID,
        private_data: PrivateData([0; 216]),
    };
    let r = l.a.sidr_request(l.now, &p).unwrap();
    l.run(false, 0);
    l.b.listen(SID).unwrap();
    l.run(false, 0);
    let Some(CmEvent::SidrRequest { id, .. }) = l.b_events.last().copied() else {
        panic!("{:?}", l.b_events)
    };
    l.b.sidr_reply(id, SIDR_VALID, 0x42, 0x0123_4567, b"")
        .unwrap();
    l.run(false, 0);
    assert!(
        matches!(l.a_events.last(), Some(CmEvent::SidrReply { id, rep }) if *id == r && rep.qpn == 0x42),
        "{:?}",
        l.a_events
    );
}

#[test]
fn the_consumer_rejects_with_its_private_data() {
    let mut l = Link::new();
    let a = l.send_req();
    let b = l.request();
    l.b.reject(b, reason::CONSUMER_DEFINED, b"busy").unwrap();
    l.run(false, 0);
    let CmEvent::Rejected {
        id,
        reason: r,
        private_data,
    } = l.a_events[0]
    else {
        panic!("{:?}", l.a_events)
    };
    assert_eq!((id, r), (a, reason::CONSUMER_DEFINED));
    assert_eq!(&private_data.0[..4], b"busy");
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    assert_eq!(
        l.b.reject(b, reason::CONSUMER_DEFINED, &[]),
        Err(roce::cm::CmError::NotFound),
        "the rejected connection is gone"
    );
}

/// A consumer that goes away before the RTU (its process killed: the kernel's CM rejects in
/// cm_destroy_id) rejects the REP it received (active) or the one it sent (passive): the
/// peer hears `Rejected` at once instead of retrying its REP for a minute (the real soak
/// found an rdma_cm server waiting for ever for a client killed mid-handshake).
#[test]
fn a_side_that_goes_before_the_rtu_rejects_and_the_peer_hears_at_once() {
    // Active: REP received, then rejected instead of the RTU.
    let mut l = Link::new();
    let a = l.send_req();
    let b = l.request();
    l.send_rep(b);
    assert_eq!(names(&l.a_events), ["rep"]);
    l.a.reject(a, reason::CONSUMER_DEFINED, &[]).unwrap();
    l.run(false, 0);
    assert_eq!(names(&l.b_events), ["request", "rejected"]);
    assert!(matches!(l.b_events[1], CmEvent::Rejected { id, .. } if id == b));
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    assert_eq!(l.b.poll_timeout(), None, "no REP retry left armed");
    // Passive: REP sent, then rejected while the RTU has not come (it was lost).
    let mut l = Link::losing(attr::RTU);
    let a = l.send_req();
    let b = l.request();
    l.send_rep(b);
    l.send_rtu(a);
    assert_eq!(names(&l.b_events), ["request"]);
    l.b.reject(b, reason::CONSUMER_DEFINED, &[]).unwrap();
    l.run(false, 0);
    // B is gone at once. A took its connection for established when it sent the RTU, and
    // an established connection ends by DREQ, not REJ: its QP notices when it retries.
    assert_eq!(names(&l.b_events), ["request"]);
    assert_eq!(l.b.conn_count(), 0);
    assert_eq!(names(&l.a_events), ["rep", "established"]);
    // Neither side can reject what is established, or a REQ it sent itself.
    let mut l = Link::new();
    let (a, b) = l.establish();
    assert!(l.a.reject(a, reason::CONSUMER_DEFINED, &[]).is_err());
    assert!(l.b.reject(b, reason::CONSUMER_DEFINED, &[]).is_err());
    let a = l.connect();
    assert!(l.a.reject(a, reason::CONSUMER_DEFINED, &[]).is_err());
}

#[test]
fn lost_dreq_and_lost_drep_are_retried_and_answered_again() {
    for lost in [attr::DREQ, attr::DREP] {
        let mut l = Link::new();
        let (a, _b) = l.establish();
        l.lose = vec![lost];
        l.a.disconnect(l.now, a).unwrap();
        l.run(true, 60_000 * MS);
        assert_eq!(l.a.counters.retries, 1, "lost {lost:#x}");
        assert_eq!(names(&l.a_events)[2..], ["disconnected", "released"]);
        assert_eq!(names(&l.b_events)[2..], ["disconnected", "released"]);
        if lost == attr::DREP {
            // B's time wait (2^(19-8) ms) ends before A's retry (6 s): B answers a DREQ for
            // a connection it no longer holds, as ib_cm does, so A stops retrying.
            let dreps = l.seen.iter().filter(|x| **x == (false, attr::DREP)).count();
            assert_eq!(dreps, 2);
        }
        assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    }
}

#[test]
fn a_peer_gone_mid_handshake_times_out_after_every_retry() {
    // B vanishes before answering: A sends the REQ 1 + 15 times, then gives up.
    let mut l = Link::new();
    l.b_gone = true;
    let a = l.send_req();
    l.run(true, 3_600_000 * MS);
    assert_eq!(names(&l.a_events), ["timed out"]);
    assert!(matches!(l.a_events[0], CmEvent::TimedOut { id } if id == a));
    let reqs = l.seen.iter().filter(|x| **x == (true, attr::REQ)).count();
    assert_eq!(reqs, 16);
    assert_eq!(l.now, 16 * (2 * 1024 + 4096) * MS);
    assert_eq!(l.a.conn_count(), 0);
    // A vanishes after its REQ: B's REP goes 16 times, then B gives up.
    let mut l = Link::new();
    l.connect();
    l.run(false, 0);
    l.a_gone = true;
    let b = l.request();
    l.accept(b);
    l.run(true, 3_600_000 * MS);
    assert_eq!(names(&l.b_events), ["request", "timed out"]);
    assert_eq!(l.b.conn_count(), 0);
}

/// An MRA extends the wait for an answer once, and only from the peer the request went
/// to; none is taken once a DREQ is out (IBA 12.6.6: an MRA answers a REQ, REP or LAP). A
/// peer repeating MRAs with the longest service timeout (2^31 x 4.096 us, 2.4 hours) used to
/// hold a connection, and its slot, for as long as it liked.
#[test]
fn an_mra_extends_the_wait_once_and_only_from_the_peer() {
    let mut l = Link::new();
    l.b_gone = true;
    let a = l.send_req();
    let first = l.a.poll_timeout().unwrap();
    // As Linux sends it: its own new communication ID, which A does not know yet.
    let mra = Cm::Mra(roce::wire::cm::Mra {
        local_comm_id: 0x1234_5678,
        remote_comm_id: a.0,
        service_timeout: 31,
        ..Default::default()
    });
    let bytes = mra.to_mad(1);
    let spoofer = Gid::from_ipv4([10, 99, 0, 66]);
    l.a.handle_mad(l.now, spoofer, A_GID, &bytes);
    assert_eq!(l.a.poll_timeout(), Some(first), "an MRA from a third party");
    l.a.handle_mad(l.now, B_GID, A_GID, &bytes);
    let extended = l.a.poll_timeout().unwrap();
    assert!(
        extended > first + 3_600_000 * MS,
        "the peer's MRA extends the wait"
    );
    l.now = extended - 1;
    l.a.handle_mad(l.now, B_GID, A_GID, &bytes);
    assert_eq!(l.a.poll_timeout(), Some(extended), "a second MRA");
    assert_eq!(l.a.counters.rx_unmatched, 2);
    // In DREQ_SENT: the DREQ's retries run their course.
    let mut l = Link::new();
    let (a, b) = l.establish();
    l.b_gone = true;
    l.a.disconnect(l.now, a).unwrap();
    l.run(false, 0);
    let retry = l.a.poll_timeout().unwrap();
    let mra = Cm::Mra(roce::wire::cm::Mra {
        local_comm_id: b.0,
        remote_comm_id: a.0,
        service_timeout: 31,
        ..Default::default()
    });
    l.a.handle_mad(l.now, B_GID, A_GID, &mra.to_mad(2));
    assert_eq!(l.a.poll_timeout(), Some(retry), "an MRA for a DREQ");
}

/// Destroying an ID ends its connection as the kernel's cm_destroy_id does, in every state
/// the peer can be waiting in: a REQ not yet answered is withdrawn with a REJ (reason
/// timeout) and the peer drops its request at once (it used to hold it, and the requester
/// its slot, until the handshake timed out); an established connection is disconnected.
#[test]
fn destroying_an_id_ends_its_connection_in_every_state() {
    let mut l = Link::new();
    let a = l.send_req();
    let b = l.request();
    // The same REJ from another host withdraws nothing (REQ IDs and CA GUIDs are easy to
    // learn).
    let rej = Cm::Rej(roce::wire::cm::Rej {
        local_comm_id: a.0,
        message: 0,
        reason: reason::TIMEOUT,
        info_length: 8,
        ari: PrivateData::from_bytes(&0x5054_00ff_fe99_0002u64.to_be_bytes()).unwrap(),
        ..Default::default()
    });
    let spoofer = Gid::from_ipv4([10, 99, 0, 66]);
    l.b.handle_mad(l.now, spoofer, B_GID, &rej.to_mad(3));
    assert_eq!(l.b.conn_count(), 1);
    l.a.destroy(l.now, a).unwrap();
    l.run(false, 0);
    assert_eq!(names(&l.b_events), ["request", "rejected"]);
    assert!(matches!(l.b_events[1], CmEvent::Rejected { id, .. } if id == b));
    assert!(l.seen.contains(&(true, attr::REJ)));
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    // Handshake states of either side: refused, as `reject` does.
    let mut l = Link::new();
    let a = l.send_req();
    let b = l.request();
    l.send_rep(b);
    l.a.destroy(l.now, a).unwrap();
    l.run(false, 0);
    assert_eq!(names(&l.b_events), ["request", "rejected"]);
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    // Established: disconnected, both sides released after the time wait.
    let mut l = Link::new();
    let (a, _) = l.establish();
    l.a.destroy(l.now, a).unwrap();
    l.a.destroy(l.now, a).unwrap();
    l.run(true, 60_000 * MS);
    assert_eq!(names(&l.b_events)[2..], ["disconnected", "released"]);
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
}

#[test]
fn both_sides_disconnecting_at_once_end_cleanly() {
    let mut l = Link::new();
    let (a, b) = l.establish();
    l.a.disconnect(l.now, a).unwrap();
    l.b.disconnect(l.now, b).unwrap();
    l.run(true, 60_000 * MS);
    assert_eq!(names(&l.a_events)[2..], ["disconnected", "released"]);
    assert_eq!(names(&l.b_events)[2..], ["disconnected", "released"]);
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
}

#[test]
fn a_thousand_connections_opened_and_closed_leave_nothing_behind() {
    a_thousand_connections(Link::new());
}

/// As one worker of two RNICs running an agent per worker: every ID an agent hands out is of
/// its stripe, every MAD names the receiver's stripe (checked as each is delivered), and IDs
/// still come back only after many reuses.
#[test]
fn agents_of_several_workers_hand_out_ids_of_their_stripe() {
    let a = QpnStripe { index: 1, count: 2 };
    let b = QpnStripe { index: 0, count: 3 };
    a_thousand_connections(Link::striped(a, b));
}

fn a_thousand_connections(mut l: Link) {
    for i in 0..1000 {
        let (a, _) = l.establish();
        if i % 2 == 0 {
            l.a.disconnect(l.now, a).unwrap();
        } else {
            let b = l.request();
            l.b.disconnect(l.now, b).unwrap();
        }
        l.run(true, 60_000 * MS);
        assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0), "round {i}");
    }
    assert_eq!((l.a.poll_timeout(), l.b.poll_timeout()), (None, None));
    let ids: std::collections::HashSet<_> = l
        .a_events
        .iter()
        .filter_map(|e| match e {
            CmEvent::Established { id } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(ids.len(), 1000, "no communication ID reused too soon");
}

#[test]
fn a_req_flood_is_bounded_and_garbage_is_counted() {
    let mut b = CmAgent::new(CmConfig {
        max_conns: 8,
        ..cfg(4, QpnStripe::ALL)
    });
    b.listen(SID).unwrap();
    let mut a = CmAgent::new(cfg(2, QpnStripe::ALL));
    let p = ConnectParams {
        service_id: SID,
        local_gid: A_GID,
        remote_gid: B_GID,
        ..Default::default()
    };
    for _ in 0..20 {
        a.connect(0, &p).unwrap();
    }
    while let Some(m) = a.poll_mad() {
        b.handle_mad(0, A_GID, B_GID, &m.mad);
    }
    assert_eq!(b.conn_count(), 8);
    let mut rejected = 0;
    while let Some(m) = b.poll_mad() {
        if let Ok(Some(Cm::Rej(r))) = Cm::parse(
            MadHeader::parse(&m.mad).unwrap().attr_id,
            &m.mad[HEADER_LEN..],
        ) {
            assert_eq!(r.reason, reason::NO_RESOURCES);
            rejected += 1;
        }
    }
    assert_eq!(rejected, 12);
    // Not MADs, not CM, responses, unknown IDs: counted, nothing held.
    let before = b.conn_count();
    b.handle_mad(0, A_GID, B_GID, &[1, 2, 3]);
    let mut not_cm = [0u8; 256];
    not_cm[0] = 1;
    not_cm[1] = 0x04;
    b.handle_mad(0, A_GID, B_GID, &not_cm);
    let mut rtu = [0u8; 256];
    rtu[..4].copy_from_slice(&[1, 7, 2, 3]);
    rtu[16..18].copy_from_slice(&attr::RTU.to_be_bytes());
    rtu[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&0x1234u32.to_be_bytes());
    b.handle_mad(0, A_GID, B_GID, &rtu);
    assert_eq!(b.counters.rx_bad, 2);
    assert_eq!(b.counters.rx_unmatched, 1);
    assert_eq!(b.conn_count(), before);
}

/// The REQ and REP this agent builds for the parameters rping used are the bytes Linux's
/// ib_cm sent (communication IDs, the TID and the path's flow label aside, which are
/// chosen per connection).
#[test]
fn req_and_rep_match_what_linux_sent_in_the_corpus() {
    let data = std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/corpus/rping.pcap"),
    )
    .unwrap();
    let mut linux = Vec::new();
    for rec in roce::pcap::Reader::new(&data).unwrap() {
        let f = rec.unwrap().data;
        let Ok(p) = roce::wire::frame::parse(f) else {
            continue;
        };
        if p.repr.transport.bth.dest_qp.value() == 1 {
            linux.push(p.payload(f).to_vec());
        }
    }
    let (lreq, lrep) = (&linux[0], &linux[1]);
    let Ok(Some(Cm::Req(req))) = Cm::parse(attr::REQ, &lreq[HEADER_LEN..]) else {
        panic!()
    };
    let Ok(Some(Cm::Rep(rep))) = Cm::parse(attr::REP, &lrep[HEADER_LEN..]) else {
        panic!()
    };
    let mut a = CmAgent::new(cfg(req.local_ca_guid, QpnStripe::ALL));
    let mut b = CmAgent::new(cfg(rep.local_ca_guid, QpnStripe::ALL));
    b.listen(req.service_id).unwrap();
    assert_eq!(req.service_id, service_id(PS_TCP, 7174));
    let p = ConnectParams {
        service_id: req.service_id,
        local_gid: req.primary.local_gid,
        remote_gid: req.primary.remote_gid,
        qpn: req.local_qpn,
        starting_psn: req.starting_psn,
        responder_resources: req.responder_resources,
        initiator_depth: req.initiator_depth,
        path_mtu: req.path_mtu,
        retry_count: req.retry_count,
        rnr_retry_count: req.rnr_retry_count,
        flow_label: req.primary.flow_label,
        hop_limit: req.primary.hop_limit,
        traffic_class: req.primary.traffic_class,
        srq: req.srq,
        private_data: req.private_data,
    };
    a.connect(0, &p).unwrap();
    let mut ours = a.poll_mad().unwrap().mad;
    // Linux's communication ID and TID in ours, then every byte must match.
    ours[8..16].copy_from_slice(&lreq[8..16]);
    ours[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&lreq[HEADER_LEN..HEADER_LEN + 4]);
    assert_eq!(hex(&ours), hex(lreq), "REQ");
    b.handle_mad(0, req.primary.local_gid, req.primary.remote_gid, lreq);
    let Some(CmEvent::ConnectRequest { id, .. }) = b.poll_event() else {
        panic!()
    };
    let ap = AcceptParams {
        qpn: rep.local_qpn,
        starting_psn: rep.starting_psn,
        responder_resources: rep.responder_resources,
        initiator_depth: rep.initiator_depth,
        rnr_retry_count: rep.rnr_retry_count,
        srq: rep.srq,
        private_data: PrivateData::default(),
    };
    b.accept(0, id, &ap).unwrap();
    let mut ours = b.poll_mad().unwrap().mad;
    assert_eq!(ours[8..16], lrep[8..16], "the REP echoes the REQ's TID");
    ours[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&lrep[HEADER_LEN..HEADER_LEN + 4]);
    assert_eq!(hex(&ours), hex(lrep), "REP");
    assert_eq!(ours.len(), HEADER_LEN + CM_DATA_LEN);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Two transport engines connected by their connection managers over QP1, on simulated
/// time, the way rdma_cm drives them: the passive side brings its QP up from the REQ and
/// accepts, the active side from the REP and sends the RTU; then an RDMA WRITE crosses the
/// connection and lands. The MADs on the wire are UD SEND-only to QP1 with QP1's Q_Key and
/// UDP source port, as rxe sends them.
#[test]
fn the_cm_connects_two_engines_over_qp1_and_data_flows() {
    use roce::sim::{bring_up, endpoint, node_gid, ConnectOpts, Pair};
    use roce::types::{Qkey, Qpn};
    use roce::verbs::WcStatus;
    use roce::wire::opcode::Opcode;
    let mut p = Pair::lossless();
    p.record = true;
    let o = ConnectOpts::default();
    let ea = endpoint(&mut p.a.dev, &o, 0x10_0000_0000);
    let eb = endpoint(&mut p.b.dev, &o, 0x20_0000_0000);
    p.b.dev.cm().listen(SID).unwrap();
    let (a_rq_psn, b_rq_psn) = (0x58642a, 0x8d06b3);
    let params = ConnectParams {
        service_id: SID,
        local_gid: node_gid(0),
        remote_gid: node_gid(1),
        qpn: ea.qpn.value(),
        starting_psn: a_rq_psn,
        responder_resources: 16,
        initiator_depth: 16,
        path_mtu: 3,
        retry_count: 7,
        rnr_retry_count: 7,
        hop_limit: 64,
        ..Default::default()
    };
    let a_id = p.a.dev.cm().connect(p.now, &params).unwrap();
    let deadline = p.now + 1_000 * MS;
    assert!(p.run(deadline, |p| p.b.dev.cm().has_events()));
    let Some(CmEvent::ConnectRequest { id, req, peer }) = p.b.dev.cm().poll_event() else {
        panic!("no connect request");
    };
    assert_eq!((peer, req.local_qpn), (node_gid(0), ea.qpn.value()));
    let b_id = id;
    // As rdma_cm's passive side: the QP to RTS from the REQ, then the REP.
    bring_up(
        &mut p.b.dev,
        &eb,
        Qpn::new(req.local_qpn),
        peer,
        &o,
        req.starting_psn,
        b_rq_psn,
    );
    let accept = AcceptParams {
        qpn: eb.qpn.value(),
        starting_psn: b_rq_psn,
        responder_resources: 16,
        initiator_depth: 16,
        rnr_retry_count: 7,
        ..Default::default()
    };
    p.b.dev.cm().accept(p.now, id, &accept).unwrap();
    let deadline = p.now + 1_000 * MS;
    assert!(p.run(deadline, |p| p.a.dev.cm().has_events()));
    let Some(CmEvent::RepReceived { id, rep }) = p.a.dev.cm().poll_event() else {
        panic!("no REP");
    };
    assert_eq!(id, a_id);
    bring_up(
        &mut p.a.dev,
        &ea,
        Qpn::new(rep.local_qpn),
        node_gid(1),
        &o,
        rep.starting_psn,
        a_rq_psn,
    );
    p.a.dev.cm().rtu(id).unwrap();
    let deadline = p.now + 1_000 * MS;
    assert!(p.run(deadline, |p| p.b.dev.cm().has_events()));
    assert_eq!(
        p.b.dev.cm().poll_event(),
        Some(CmEvent::Established { id: b_id })
    );
    // Data over the connection the CM set up.
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(
        p.write_status(&ea, eb.addr, eb.rkey, &data),
        WcStatus::Success
    );
    let mut landed = vec![0u8; data.len()];
    roce::memory::Memory::read(&*eb.mem, 0, &mut landed).unwrap();
    assert_eq!(landed, data);
    // What crossed to QP1.
    let mads: Vec<_> = p
        .recorded
        .iter()
        .filter_map(|(_, _, f)| roce::wire::frame::parse(f).ok().map(|x| (x, f.clone())))
        .filter(|(x, _)| x.repr.transport.bth.dest_qp == Qpn::GSI)
        .collect();
    assert_eq!(mads.len(), 3, "REQ, REP, RTU");
    for (x, f) in &mads {
        let t = &x.repr.transport;
        assert_eq!(t.bth.opcode, Opcode::UD_SEND_ONLY);
        let d = t.ext.deth.unwrap();
        assert_eq!((d.qkey, d.src_qp), (Qkey::GSI, Qpn::GSI));
        assert_eq!(x.payload_len, 256);
        assert_eq!(
            u16::from_be_bytes([f[34], f[35]]),
            55410,
            "QP1's UDP source port"
        );
    }
    assert_eq!(p.a.dev.counters().0.tx_gsi_mads, 2);
    assert_eq!(p.b.dev.counters().0.rx_gsi_mads, 2);
}

/// SIDR (UD services, rdma_cm over UDP): a request answered with the service's QP and
/// Q_Key, a lost request sent again, and a request nobody listens for answered "not
/// supported"; nothing held afterwards.
#[test]
fn sidr_requests_are_answered_retried_and_refused() {
    use roce::cm::{SidrParams, SIDR_UNSUPPORTED, SIDR_VALID};
    let mut l = Link::losing(attr::SIDR_REQ);
    let mut pd = [0u8; 216];
    pd[..5].copy_from_slice(b"hello");
    let p = SidrParams {
        service_id: SID,
        local_gid: A_GID,
        remote_gid: B_GID,
        private_data: PrivateData(pd),
    };
    let a = l.a.sidr_request(l.now, &p).unwrap();
    l.run(true, 10_000 * MS);
    assert_eq!(l.a.counters.retries, 1, "the lost request went again");
    let Some(CmEvent::SidrRequest { id, peer, req, .. }) = l.b_events.first().copied() else {
        panic!("{:?}", l.b_events)
    };
    assert_eq!(
        (peer, req.service_id, &req.private_data.0[..5]),
        (A_GID, SID, &b"hello"[..])
    );
    l.b.sidr_reply(id, SIDR_VALID, 0x42, 0x0123_4567, b"ok")
        .unwrap();
    l.run(false, 0);
    let Some(CmEvent::SidrReply { id: got, rep }) = l.a_events.first().copied() else {
        panic!("{:?}", l.a_events)
    };
    assert_eq!(got, a);
    assert_eq!(
        (rep.status, rep.qpn, rep.qkey),
        (SIDR_VALID, 0x42, 0x0123_4567)
    );
    assert_eq!(&rep.private_data.0[..2], b"ok");
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    // Nobody listens: "service ID not supported" once the hold for a listener ends.
    l.b.unlisten(SID);
    l.a.sidr_request(l.now, &p).unwrap();
    l.run(true, 60_000 * MS);
    let Some(CmEvent::SidrReply { rep, .. }) = l.a_events.last().copied() else {
        panic!("{:?}", l.a_events)
    };
    assert_eq!(rep.status, SIDR_UNSUPPORTED);
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    assert_eq!(l.a.poll_timeout(), None);
}

/// Hostile MADs: random bytes under every CM attribute (some of them REQs and SIDR requests
/// for the service listened to, so they make connections), of every length, fed to an agent
/// that listens: it never panics and never holds more than `max_conns` (requests nobody
/// answers wait for the consumer, as in Linux; the dataplane rejects them when their client
/// goes).
#[test]
fn random_mads_never_panic_and_hold_nothing_unbounded() {
    use roce::sim::Rng;
    let mut rng = Rng::new(7);
    let mut b = CmAgent::new(CmConfig {
        max_conns: 16,
        ..cfg(4, QpnStripe::ALL)
    });
    b.listen(SID).unwrap();
    let attrs: Vec<u16> = attr::CM_MESSAGES
        .into_iter()
        .chain([attr::LAP, attr::APR, 0x7777])
        .collect();
    let mut now = 0;
    for i in 0..20_000u64 {
        let mut mad = [0u8; 256];
        for x in mad.iter_mut() {
            *x = rng.next_u64() as u8;
        }
        // A valid CM SEND header most of the time, so the messages get past it.
        if i % 8 != 0 {
            mad[0] = 1;
            mad[1] = 0x07;
            mad[3] = 0x03;
        }
        let a = attrs[(rng.next_u64() % attrs.len() as u64) as usize];
        mad[16..18].copy_from_slice(&a.to_be_bytes());
        if i % 5 == 0 {
            // Our service (at byte 8 of both REQ and SIDR_REQ), so requests make connections.
            mad[HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&SID.to_be_bytes());
        }
        let n = (rng.next_u64() % 257) as usize;
        b.handle_mad(
            now,
            A_GID,
            B_GID,
            &mad[..n.max(if i % 3 == 0 { 256 } else { n })],
        );
        while b.poll_mad().is_some() {}
        while b.poll_event().is_some() {}
        assert!(b.conn_count() <= 16);
        now += 1_000_000;
        b.handle_timeout(now);
    }
    now += 3_600_000 * MS;
    b.handle_timeout(now);
    assert!(b.conn_count() <= 16);
    assert!(
        b.counters.rx_bad > 0 && b.counters.rx_mads > 0,
        "{:?}",
        b.counters
    );
}

/// Requests held for a listener are bounded (`MAX_HELD`): past it a request for a service
/// nobody listens to is rejected at once, and the held ones still get theirs when their
/// hold ends; nothing stays behind.
#[test]
fn held_requests_are_bounded() {
    use roce::cm::MAX_HELD;
    let mut l = Link::new();
    l.b.unlisten(SID);
    for _ in 0..MAX_HELD + 10 {
        l.connect();
    }
    l.run(false, 0);
    let rejected = |e: &Vec<CmEvent>| {
        e.iter()
            .filter(|e| {
                matches!(
                    e,
                    CmEvent::Rejected {
                        reason: reason::INVALID_SERVICE_ID,
                        ..
                    }
                )
            })
            .count()
    };
    assert_eq!(rejected(&l.a_events), 10, "past the bound: at once");
    assert_eq!(l.b.conn_count(), MAX_HELD);
    l.run(true, 60_000 * MS);
    assert_eq!(rejected(&l.a_events), MAX_HELD + 10);
    assert_eq!((l.a.conn_count(), l.b.conn_count()), (0, 0));
    // And holding works again afterwards.
    l.connect();
    l.run(false, 0);
    assert_eq!(l.b.conn_count(), 1);
}
