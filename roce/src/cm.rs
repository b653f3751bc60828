//! The communication manager (IBA chapter 12) of one port, sans-IO: the state machines of
//! both sides of a connection (active: REQ sent, REP received, RTU; passive: REQ received,
//! REP sent, RTU received), disconnection (DREQ, DREP, time wait), rejection, retries and
//! timeouts as Linux's ib_cm computes them, and transaction IDs as it forms them, so an
//! unmodified rdma_cm peer sees the exchange it would see from another Linux host.
//!
//! Inputs: the consumer's calls ([`CmAgent::listen`], [`CmAgent::connect`],
//! [`CmAgent::accept`], [`CmAgent::reject`], [`CmAgent::rtu`], [`CmAgent::disconnect`],
//! [`CmAgent::established`]), MADs that arrived on QP1 ([`CmAgent::handle_mad`]) and time
//! ([`CmAgent::handle_timeout`]). Outputs: MADs to send to a peer's QP1
//! ([`CmAgent::poll_mad`]), events for the consumer ([`CmAgent::poll_event`]) and the next
//! deadline ([`CmAgent::poll_timeout`]). The agent never touches a QP: as in Linux, the
//! consumer (rdma_cm) moves its QP through INIT, RTR and RTS with what the events carry.
//!
//! Everything a peer can make the agent hold is bounded: connections by `max_conns` (a REQ
//! past it is rejected, "no resources"), queued MADs and events by fixed limits (past them
//! a counted drop; the peer's retries recover a lost MAD).

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use crate::types::Gid;
use crate::wire::cm::{
    Cm, Dreq, IdsOnly, Mra, PrivateData, Rej, Rep, Req, SidrRep, SidrReq, METHOD_SEND,
};
use crate::wire::mad::{MadHeader, CLASS_CM, HEADER_LEN, MAD_LEN};

/// MADs waiting to be sent, at most.
const MAX_OUT: usize = 4096;
/// Events waiting for the consumer, at most.
const MAX_EVENTS: usize = 4096;
/// Connection slots are numbered in the low 20 bits of a communication ID.
const SLOT_BITS: u32 = 20;

/// REJ reasons (IBA Table 109) the agent sends or names.
pub mod reason {
    /// No QP available.
    pub const NO_QP: u16 = 1;
    /// Insufficient resources.
    pub const NO_RESOURCES: u16 = 3;
    /// Timeout.
    pub const TIMEOUT: u16 = 4;
    /// Invalid communication ID.
    pub const INVALID_COMM_ID: u16 = 6;
    /// Invalid service ID: nobody listens (as Linux answers a REQ without a listener).
    pub const INVALID_SERVICE_ID: u16 = 8;
    /// Stale connection.
    pub const STALE_CONN: u16 = 10;
    /// Consumer defined (rdma_reject).
    pub const CONSUMER_DEFINED: u16 = 28;
}

/// A REJ's "message rejected" field (IBA Table 108): a REQ, a REP, anything else.
const REJECTS_REQ: u8 = 0;
const REJECTS_REP: u8 = 1;
const REJECTS_OTHER: u8 = 2;

/// Timing and identity of the agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmConfig {
    /// The port's CA GUID (REQ and REP carry it).
    pub ca_guid: u64,
    /// The CM response timeout this side advertises and expects (IBA encoding, 4.096 us x
    /// 2^t; Linux's rdma_cm uses 20: about 4.3 s).
    pub cm_response_timeout: u8,
    /// Retries of a REQ, REP or DREQ before giving up (Linux's rdma_cm: 15).
    pub max_cm_retries: u8,
    /// Packet lifetime of the path (IBA encoding; RoCE routes use 18 in Linux, and the REQ's
    /// local ACK timeout is one more).
    pub packet_life_time: u8,
    /// Connections held at once, at most.
    pub max_conns: usize,
    /// High 32 bits of the transaction IDs this agent starts (Linux: the MAD agent's number).
    pub tid_high: u32,
    /// How long a REQ or SIDR_REQ for a service nobody listens to is held for a listener that
    /// may come, in milliseconds, before it is rejected ("invalid service ID", or SIDR "not
    /// supported"); 0 rejects at once, as Linux does. An application that answers its peer
    /// and only then listens (perftest's `-R` server, between its key round and its
    /// `rdma_listen`) otherwise loses the race to a quick client, whose retry perftest
    /// does not survive.
    pub unclaimed_hold_ms: u64,
    /// The communication IDs this agent hands out: those whose generation (the bits above
    /// the slot) is `index` modulo `count`, so that, on an RNIC running one agent per worker
    /// (`QpnStripe`), a MAD naming one of ours tells which worker's agent it is for
    /// ([`comm_id_owner`]).
    pub id_stripe: crate::engine::QpnStripe,
}

impl Default for CmConfig {
    fn default() -> Self {
        CmConfig {
            ca_guid: 0,
            cm_response_timeout: 20,
            max_cm_retries: 15,
            packet_life_time: 18,
            max_conns: 4096,
            tid_high: 2,
            unclaimed_hold_ms: 100,
            id_stripe: crate::engine::QpnStripe::ALL,
        }
    }
}

/// The agent of `count` (one per worker, [`CmConfig::id_stripe`]) that handed out
/// communication ID `id`.
pub fn comm_id_owner(id: u32, count: u32) -> u32 {
    (id >> SLOT_BITS) % count.max(1)
}

/// What a received CM MAD names on this side: a service (REQ, SIDR_REQ) or one of our
/// connections by its communication ID (every other message).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadRoute {
    /// The service a request is for (its listener's).
    Service(u64),
    /// Our communication ID (SIDR_REP: our request ID).
    Conn(u32),
}

/// Where a CM MAD (a QP1 payload) goes on an RNIC with one agent per worker; `None` for one
/// that is not a CM message ferroce speaks (any agent drops it, counted).
pub fn mad_route(mad: &[u8]) -> Option<MadRoute> {
    let h = MadHeader::parse(mad).ok()?;
    if h.class != CLASS_CM {
        return None;
    }
    Some(
        match Cm::parse(h.attr_id, &mad[HEADER_LEN.min(mad.len())..]).ok()?? {
            Cm::Req(r) => MadRoute::Service(r.service_id),
            Cm::SidrReq(r) => MadRoute::Service(r.service_id),
            Cm::Rep(r) => MadRoute::Conn(r.remote_comm_id),
            Cm::Rej(r) => MadRoute::Conn(r.remote_comm_id),
            Cm::Mra(r) => MadRoute::Conn(r.remote_comm_id),
            Cm::Dreq(r) => MadRoute::Conn(r.remote_comm_id),
            Cm::Rtu(r) | Cm::Drep(r) => MadRoute::Conn(r.remote_comm_id),
            Cm::SidrRep(r) => MadRoute::Conn(r.request_id),
        },
    )
}

/// Milliseconds of an IBA time value as ib_cm rounds it (`cm_convert_to_ms`: 4.096 us x
/// 2^t is about 2^(t-8) ms, at least 1 ms).
fn iba_ms(t: u8) -> u64 {
    1u64 << (t.saturating_sub(8)).min(31)
}

const MS: u64 = 1_000_000;

/// A connection's number on this side: its local communication ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

impl ConnId {
    fn slot(self) -> usize {
        (self.0 & ((1 << SLOT_BITS) - 1)) as usize
    }
}

/// What the active side asks for (the REQ's fields it chooses; the rest are the agent's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct ConnectParams {
    /// Service ID (rdma_cm: [`crate::wire::cm::service_id`]).
    pub service_id: u64,
    /// This side's GID (the source address).
    pub local_gid: Gid,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// This side's QPN.
    pub qpn: u32,
    /// Where the peer's requests start (its starting PSN as this side's responder expects).
    pub starting_psn: u32,
    /// READ/atomic requests this side accepts at once.
    pub responder_resources: u8,
    /// READ/atomic requests this side issues at once.
    pub initiator_depth: u8,
    /// Path MTU (IBA encoding).
    pub path_mtu: u8,
    /// Transport retry count.
    pub retry_count: u8,
    /// RNR retry count.
    pub rnr_retry_count: u8,
    /// Flow label of the path.
    pub flow_label: u32,
    /// Hop limit of the path.
    pub hop_limit: u8,
    /// Traffic class of the path.
    pub traffic_class: u8,
    /// The QP has an SRQ.
    pub srq: bool,
    /// Private data (rdma_cm: its addressing header, then the consumer's).
    pub private_data: PrivateData<92>,
}

/// What the passive side answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AcceptParams {
    /// This side's QPN.
    pub qpn: u32,
    /// Where the peer's requests start.
    pub starting_psn: u32,
    /// READ/atomic requests this side accepts at once.
    pub responder_resources: u8,
    /// READ/atomic requests this side issues at once.
    pub initiator_depth: u8,
    /// RNR retry count the peer should use.
    pub rnr_retry_count: u8,
    /// The QP has an SRQ.
    pub srq: bool,
    /// Private data.
    pub private_data: PrivateData<196>,
}

/// A SIDR request: which UD service the active side asks for (rdma_cm over UDP).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SidrParams {
    /// Service ID.
    pub service_id: u64,
    /// This side's GID.
    pub local_gid: Gid,
    /// The peer's GID.
    pub remote_gid: Gid,
    /// Private data (rdma_cm: its addressing header first).
    pub private_data: PrivateData<216>,
}

/// SIDR_REP status: the service's QP is named (IBA Table 121).
pub const SIDR_VALID: u8 = 0;
/// SIDR_REP status: nobody serves the service ID.
pub const SIDR_UNSUPPORTED: u8 = 1;
/// SIDR_REP status: the service rejected the request.
pub const SIDR_REJECTED: u8 = 2;

/// What the agent tells its consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEvent {
    /// Passive: a REQ for a service being listened to. Answer with `accept` or `reject`.
    ConnectRequest {
        /// The new connection.
        id: ConnId,
        /// Who asks.
        peer: Gid,
        /// The REQ.
        req: Req,
    },
    /// Active: the peer accepted. Move the QP to RTR and RTS with what the REP says, then
    /// call `rtu`.
    RepReceived {
        /// The connection.
        id: ConnId,
        /// The REP.
        rep: Rep,
    },
    /// The connection is up (active: RTU sent; passive: RTU received, or the QP saw the
    /// first packet).
    Established {
        /// The connection.
        id: ConnId,
    },
    /// The peer rejected the REQ or REP.
    Rejected {
        /// The connection (now gone).
        id: ConnId,
        /// Reason (IBA Table 109; see [`reason`]).
        reason: u16,
        /// The REJ's private data.
        private_data: PrivateData<148>,
    },
    /// No answer after every retry (REQ or REP).
    TimedOut {
        /// The connection (now gone).
        id: ConnId,
    },
    /// The connection is down (DREQ received and answered, DREP received, or no DREP after
    /// every retry): move the QP to the error state. The ID stays in time wait a while.
    Disconnected {
        /// The connection.
        id: ConnId,
    },
    /// The ID left time wait and is free.
    Released {
        /// The connection.
        id: ConnId,
    },
    /// Passive: a SIDR request for a service being listened to. Answer with `sidr_reply`.
    SidrRequest {
        /// The request (an ID only until it is answered).
        id: ConnId,
        /// Who asks.
        peer: Gid,
        /// The address it asked (this side's GID).
        local: Gid,
        /// The request.
        req: SidrReq,
    },
    /// Active: the service answered a SIDR request (the request is done).
    SidrReply {
        /// The request.
        id: ConnId,
        /// The answer.
        rep: SidrRep,
    },
}

/// A MAD for a peer's QP1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutMad {
    /// This side's GID (the source address).
    pub src: Gid,
    /// The peer's GID.
    pub dest: Gid,
    /// The whole MAD.
    pub mad: [u8; MAD_LEN],
}

/// Why a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmError {
    /// No such connection.
    NotFound,
    /// The connection is not in a state where this call means anything.
    WrongState,
    /// Too many connections, or the service is already listened to.
    Busy,
    /// More private data than the message holds.
    TooLong,
}

/// The agent's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CmCounters {
    /// CM MADs received.
    pub rx_mads: u64,
    /// Received MADs that did not parse or were not CM SENDs.
    pub rx_bad: u64,
    /// Received messages for no known connection, or out of state (dropped).
    pub rx_unmatched: u64,
    /// Duplicate messages answered again (REQ, REP, DREQ).
    pub rx_duplicates: u64,
    /// MADs queued to send.
    pub tx_mads: u64,
    /// MADs dropped because the send queue was full.
    pub tx_dropped: u64,
    /// Retransmissions after a timeout.
    pub retries: u64,
    /// REJs sent.
    pub rej_sent: u64,
    /// Events dropped because the consumer did not take them.
    pub events_dropped: u64,
    /// Requests held for a listener that had not come yet (`CmConfig::unclaimed_hold_ms`).
    pub held: u64,
}

/// Requests held for a listener at once, at most: past it a request for a service nobody
/// listens to is answered at once as Linux answers it, so held requests cannot take the
/// connections' room (`max_conns`) from real ones.
pub const MAX_HELD: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Active: REQ sent, waiting for REP.
    ReqSent,
    /// Active: REP received, waiting for the consumer's RTU.
    RepRcvd,
    /// Passive: REQ received, waiting for the consumer.
    ReqRcvd,
    /// Passive: REP sent, waiting for RTU.
    RepSent,
    Established,
    DreqSent,
    TimeWait,
    /// Active: SIDR_REQ sent, waiting for SIDR_REP.
    SidrSent,
    /// Passive: SIDR_REQ received, waiting for the consumer.
    SidrRcvd,
    /// Passive: a REQ or SIDR_REQ for a service nobody listens to yet, held until a listener
    /// comes or `unclaimed_hold_ms` passes.
    Unclaimed,
}

/// Where a request came from: its sender, the GID it was sent to, its transaction ID, and
/// the key its duplicates are known by (the sender's ID and CA GUID).
struct Passive {
    from: Gid,
    to: Gid,
    tid: u64,
    key: (u32, u64),
}

/// The request an `Unclaimed` connection holds.
#[derive(Debug, Clone)]
enum Held {
    Req(Req),
    Sidr(SidrReq),
}

#[derive(Debug, Clone)]
struct Conn {
    id: ConnId,
    state: State,
    peer: Gid,
    /// This side's GID on the connection.
    local: Gid,
    remote_comm_id: u32,
    remote_guid: u64,
    remote_qpn: u32,
    /// The connection's transaction ID (the REQ's; REP and RTU echo it).
    tid: u64,
    /// The last request sent and the TID it went with, resent on timeout.
    last: Option<(u64, Cm)>,
    tries: u8,
    deadline: Option<u64>,
    /// Milliseconds to wait for an answer (per try).
    wait_ms: u64,
    /// The service a SIDR request (or a held request) named.
    service_id: u64,
    /// `Unclaimed`: the request waiting for a listener.
    held: Option<Box<Held>>,
    /// An MRA extended the wait for the current answer: a second one does not (as the
    /// kernel's CM, which leaves `MRA_REQ_RCVD` / `MRA_REP_RCVD` only for the answer), so a
    /// peer cannot hold the connection for ever with MRAs.
    mra_taken: bool,
}

/// The CM of one port.
#[derive(Debug)]
pub struct CmAgent {
    cfg: CmConfig,
    conns: Vec<Option<Conn>>,
    free: VecDeque<usize>,
    /// Times each slot was reused, for the high bits of its next communication ID.
    generation: Vec<u16>,
    listening: HashSet<u64>,
    /// Requests held now (`State::Unclaimed`).
    held_now: usize,
    /// Passive connections by (the peer's communication ID, its CA GUID): duplicate REQs.
    by_remote: HashMap<(u32, u64), ConnId>,
    timers: BTreeSet<(u64, ConnId)>,
    out: VecDeque<OutMad>,
    events: VecDeque<CmEvent>,
    /// Counters.
    pub counters: CmCounters,
}

impl CmAgent {
    /// An agent with no connection and no listener.
    pub fn new(cfg: CmConfig) -> CmAgent {
        CmAgent {
            cfg,
            conns: Vec::new(),
            free: VecDeque::new(),
            generation: Vec::new(),
            listening: HashSet::new(),
            held_now: 0,
            by_remote: HashMap::new(),
            timers: BTreeSet::new(),
            out: VecDeque::new(),
            events: VecDeque::new(),
            counters: CmCounters::default(),
        }
    }

    /// Connections held (time wait included).
    pub fn conn_count(&self) -> usize {
        self.conns.len() - self.free.len()
    }

    /// Accepts REQs for `service_id` from now on, and those held for it
    /// (`CmConfig::unclaimed_hold_ms`) now.
    pub fn listen(&mut self, service_id: u64) -> Result<(), CmError> {
        if !self.listening.insert(service_id) {
            return Err(CmError::Busy);
        }
        if self.held_now == 0 {
            return Ok(());
        }
        let held: Vec<ConnId> = self
            .conns
            .iter()
            .flatten()
            .filter(|c| c.state == State::Unclaimed && c.service_id == service_id)
            .map(|c| c.id)
            .collect();
        for id in held {
            self.clear_timer(id);
            let plt = self.cfg.packet_life_time;
            let Ok(c) = self.conn_mut(id) else { continue };
            let Some(h) = c.held.take() else { continue };
            let (peer, local) = (c.peer, c.local);
            match *h {
                Held::Req(req) => {
                    c.state = State::ReqRcvd;
                    // The DREQ names it; Linux drops a DREQ whose QPN is not the one it knows.
                    c.remote_qpn = req.local_qpn;
                    c.wait_ms = 2 * iba_ms(plt) + iba_ms(req.local_cm_response_timeout);
                    self.event(CmEvent::ConnectRequest { id, peer, req });
                }
                Held::Sidr(req) => {
                    c.state = State::SidrRcvd;
                    self.event(CmEvent::SidrRequest {
                        id,
                        peer,
                        local,
                        req,
                    });
                }
            }
            self.held_now -= 1;
        }
        Ok(())
    }

    /// Stops accepting REQs for `service_id` (connections already made stay).
    pub fn unlisten(&mut self, service_id: u64) {
        self.listening.remove(&service_id);
    }

    /// Active: sends a REQ; the answer comes as `RepReceived`, `Rejected` or `TimedOut`.
    pub fn connect(&mut self, now: u64, p: &ConnectParams) -> Result<ConnId, CmError> {
        let id = self.alloc().ok_or(CmError::Busy)?;
        let c = &self.cfg;
        let path = crate::wire::cm::CmPath {
            local_lid: 0xffff,
            remote_lid: 0xffff,
            local_gid: p.local_gid,
            remote_gid: p.remote_gid,
            flow_label: p.flow_label,
            hop_limit: p.hop_limit,
            traffic_class: p.traffic_class,
            local_ack_timeout: c.packet_life_time + 1,
            ..Default::default()
        };
        let req = Req {
            local_comm_id: id.0,
            service_id: p.service_id,
            local_ca_guid: c.ca_guid,
            local_qpn: p.qpn & 0xff_ffff,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            remote_cm_response_timeout: c.cm_response_timeout,
            starting_psn: p.starting_psn & 0xff_ffff,
            local_cm_response_timeout: c.cm_response_timeout,
            retry_count: p.retry_count,
            pkey: 0xffff,
            path_mtu: p.path_mtu,
            rnr_retry_count: p.rnr_retry_count,
            max_cm_retries: c.max_cm_retries,
            srq: p.srq,
            primary: path,
            private_data: p.private_data,
            ..Default::default()
        };
        let tid = self.start_active(id, State::ReqSent, p.local_gid, p.remote_gid, 0);
        self.send_request(now, id, tid, Cm::Req(req));
        Ok(id)
    }

    /// Passive: accepts a `ConnectRequest` with a REP; `Established` follows the RTU.
    pub fn accept(&mut self, now: u64, id: ConnId, p: &AcceptParams) -> Result<(), CmError> {
        let c = self.conn_in(id, State::ReqRcvd)?;
        let rep = Rep {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            local_qpn: p.qpn & 0xff_ffff,
            starting_psn: p.starting_psn & 0xff_ffff,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            target_ack_delay: 15,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq,
            local_ca_guid: self.cfg.ca_guid,
            private_data: p.private_data,
            ..Default::default()
        };
        let tid = c.tid;
        self.conn_mut(id)?.state = State::RepSent;
        self.send_request(now, id, tid, Cm::Rep(rep));
        Ok(())
    }

    /// Rejects the connection (REJ with `reason` and private data); it is gone. Passive:
    /// a `ConnectRequest` (rdma_reject), or the REP it sent while the RTU has not come.
    /// Active: the REP it received (`RepReceived`) before its RTU. The last two are what the
    /// kernel's CM does when the consumer destroys its ID in those states (its process
    /// died): the peer hears `Rejected` at once instead of retrying for a minute.
    pub fn reject(&mut self, id: ConnId, reason: u16, private_data: &[u8]) -> Result<(), CmError> {
        let c = self.conn(id)?;
        // IBA 12.6.7, Table 108: the message the REJ answers.
        let message = match c.state {
            // A SIDR request is refused with a SIDR_REP.
            State::SidrRcvd => return self.sidr_reply(id, SIDR_REJECTED, 0, 0, private_data),
            State::ReqRcvd => REJECTS_REQ,
            State::RepRcvd => REJECTS_REP,
            State::RepSent => REJECTS_OTHER,
            _ => return Err(CmError::WrongState),
        };
        let rej = Rej {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            message,
            reason,
            private_data: PrivateData::from_bytes(private_data).ok_or(CmError::TooLong)?,
            ..Default::default()
        };
        self.send_rej_and_remove(id, rej)
    }

    /// Sends `rej` on connection `id`, which is then gone.
    fn send_rej_and_remove(&mut self, id: ConnId, rej: Rej) -> Result<(), CmError> {
        let c = self.conn(id)?;
        let (local, peer, tid) = (c.local, c.peer, c.tid);
        self.push_mad(local, peer, tid, &Cm::Rej(rej));
        self.counters.rej_sent += 1;
        self.remove(id);
        Ok(())
    }

    /// The consumer destroyed the connection's ID (rdma_destroy_id, or its process went
    /// away), whatever its state, as the kernel's `cm_destroy_id`: an established
    /// connection is disconnected (DREQ); one in its handshake is refused (REJ, consumer
    /// defined) and gone; a REQ of ours still unanswered is withdrawn with a REJ (reason
    /// timeout, our CA GUID as its information, the kernel's) so that the peer lets its
    /// request go at once; a SIDR request of ours is dropped. A disconnection already under
    /// way (DREQ sent, time wait) ends on its own.
    pub fn destroy(&mut self, now: u64, id: ConnId) -> Result<(), CmError> {
        let c = self.conn(id)?;
        match c.state {
            State::Established => self.disconnect(now, id),
            State::ReqRcvd | State::RepRcvd | State::RepSent | State::SidrRcvd => {
                self.reject(id, reason::CONSUMER_DEFINED, &[])
            }
            State::ReqSent => {
                let rej = Rej {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_comm_id,
                    message: REJECTS_REQ,
                    reason: reason::TIMEOUT,
                    info_length: 8,
                    ari: PrivateData::from_bytes(&self.cfg.ca_guid.to_be_bytes())
                        .ok_or(CmError::TooLong)?,
                    ..Default::default()
                };
                self.send_rej_and_remove(id, rej)
            }
            State::SidrSent => {
                self.remove(id);
                Ok(())
            }
            State::DreqSent | State::TimeWait | State::Unclaimed => Ok(()),
        }
    }

    /// Active: after `RepReceived` (and the QP moved to RTS), sends the RTU; the connection
    /// is established.
    pub fn rtu(&mut self, id: ConnId) -> Result<(), CmError> {
        let c = self.conn_in(id, State::RepRcvd)?;
        let rtu = IdsOnly {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            ..Default::default()
        };
        let (local, peer, tid) = (c.local, c.peer, c.tid);
        self.push_mad(local, peer, tid, &Cm::Rtu(rtu));
        self.conn_mut(id)?.state = State::Established;
        self.event(CmEvent::Established { id });
        Ok(())
    }

    /// Passive: the QP received its first packet before the RTU (IBA's communication
    /// established event): the connection is up.
    pub fn established(&mut self, id: ConnId) -> Result<(), CmError> {
        let c = self.conn_mut(id)?;
        if c.state != State::RepSent {
            return Err(CmError::WrongState);
        }
        c.state = State::Established;
        self.clear_timer(id);
        self.event(CmEvent::Established { id });
        Ok(())
    }

    /// Sends a DREQ on an established connection; `Disconnected` follows.
    pub fn disconnect(&mut self, now: u64, id: ConnId) -> Result<(), CmError> {
        let c = self.conn_in(id, State::Established)?;
        let dreq = Dreq {
            local_comm_id: id.0,
            remote_comm_id: c.remote_comm_id,
            remote_qpn: c.remote_qpn,
            ..Default::default()
        };
        // The side that sent the REQ keeps its TID; the other starts one of its own (as
        // ib_cm does for every new request it sends).
        let tid = if c.tid as u32 == id.0.swap_bytes() {
            c.tid
        } else {
            (self.cfg.tid_high as u64) << 32 | id.0.swap_bytes() as u64
        };
        let c = self.conn_mut(id)?;
        c.state = State::DreqSent;
        c.tries = 0;
        self.send_request(now, id, tid, Cm::Dreq(dreq));
        Ok(())
    }

    /// Active: asks for a UD service (SIDR_REQ); the answer comes as `SidrReply` or
    /// `TimedOut`.
    pub fn sidr_request(&mut self, now: u64, p: &SidrParams) -> Result<ConnId, CmError> {
        let id = self.alloc().ok_or(CmError::Busy)?;
        let tid = self.start_active(id, State::SidrSent, p.local_gid, p.remote_gid, p.service_id);
        let req = SidrReq {
            request_id: id.0,
            pkey: 0xffff,
            service_id: p.service_id,
            private_data: p.private_data,
        };
        self.send_request(now, id, tid, Cm::SidrReq(req));
        Ok(id)
    }

    /// Passive: answers a `SidrRequest` (`status` [`SIDR_VALID`] with the service's QP and
    /// Q_Key, or a refusal); the request is done.
    pub fn sidr_reply(
        &mut self,
        id: ConnId,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> Result<(), CmError> {
        let c = self.conn_in(id, State::SidrRcvd)?;
        let rep = SidrRep {
            request_id: c.remote_comm_id,
            status,
            qpn: qpn & 0xff_ffff,
            service_id: c.service_id,
            qkey,
            private_data: PrivateData::from_bytes(private_data).ok_or(CmError::TooLong)?,
            ..Default::default()
        };
        let (local, peer, tid) = (c.local, c.peer, c.tid);
        self.push_mad(local, peer, tid, &Cm::SidrRep(rep));
        self.remove(id);
        Ok(())
    }

    /// Takes the next MAD to send.
    pub fn poll_mad(&mut self) -> Option<OutMad> {
        self.out.pop_front()
    }

    /// Whether events wait for the consumer.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Takes the next event for the consumer.
    pub fn poll_event(&mut self) -> Option<CmEvent> {
        self.events.pop_front()
    }

    /// The earliest deadline.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.timers.first().map(|(t, _)| *t)
    }

    /// Retries or gives up what timed out by `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        while let Some(&(t, id)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            let max = self.cfg.max_cm_retries;
            let Ok(c) = self.conn_mut(id) else { continue };
            c.deadline = None;
            match c.state {
                State::ReqSent | State::RepSent | State::DreqSent | State::SidrSent
                    if c.tries < max =>
                {
                    c.tries += 1;
                    let Some((tid, m)) = c.last else { continue };
                    let (local, peer) = (c.local, c.peer);
                    self.counters.retries += 1;
                    self.push_mad(local, peer, tid, &m);
                    self.arm(now, id);
                }
                State::ReqSent | State::RepSent | State::SidrSent => {
                    self.event(CmEvent::TimedOut { id });
                    self.remove(id);
                }
                State::DreqSent => {
                    // No DREP: the connection is down all the same.
                    self.event(CmEvent::Disconnected { id });
                    self.enter_timewait(now, id);
                }
                State::TimeWait => {
                    self.event(CmEvent::Released { id });
                    self.remove(id);
                }
                State::Unclaimed => {
                    // Nobody came to listen: the answer Linux gives at once.
                    let (local, peer, tid, held) = (c.local, c.peer, c.tid, c.held.take());
                    self.remove(id);
                    match held.map(|h| *h) {
                        Some(Held::Req(req)) => {
                            self.send_rej(local, peer, tid, 0, &req, reason::INVALID_SERVICE_ID)
                        }
                        Some(Held::Sidr(req)) => {
                            self.refuse_sidr(local, peer, tid, &req, SIDR_UNSUPPORTED)
                        }
                        None => {}
                    }
                }
                State::RepRcvd | State::ReqRcvd | State::Established | State::SidrRcvd => {}
            }
        }
    }

    /// A MAD that arrived on QP1 from `from`, addressed to this side's `to` (untrusted:
    /// anything that is not a CM SEND this agent can match is counted and dropped).
    pub fn handle_mad(&mut self, now: u64, from: Gid, to: Gid, mad: &[u8]) {
        let Ok(h) = MadHeader::parse(mad) else {
            self.counters.rx_bad += 1;
            return;
        };
        if h.class != CLASS_CM || h.method != METHOD_SEND || h.response {
            self.counters.rx_bad += 1;
            return;
        }
        let Ok(Some(m)) = Cm::parse(h.attr_id, &mad[HEADER_LEN.min(mad.len())..]) else {
            self.counters.rx_bad += 1;
            return;
        };
        self.counters.rx_mads += 1;
        match m {
            Cm::Req(req) => self.on_req(now, from, to, h.tid, req),
            Cm::Rep(rep) => self.on_rep(from, to, rep),
            Cm::Rtu(rtu) => self.on_rtu(rtu),
            Cm::Rej(rej) => self.on_rej(from, rej),
            Cm::Mra(mra) => self.on_mra(now, from, mra),
            Cm::Dreq(dreq) => self.on_dreq(now, from, to, h.tid, dreq),
            Cm::SidrReq(req) => self.on_sidr_req(now, from, to, h.tid, req),
            // Like a REP: it names our request ID and must come from where the request went.
            Cm::SidrRep(rep) => match self.local(rep.request_id) {
                Some(id)
                    if self.state(id) == Some(State::SidrSent)
                        && self.conn(id).is_ok_and(|c| c.peer == from) =>
                {
                    self.event(CmEvent::SidrReply { id, rep });
                    self.remove(id);
                }
                _ => self.counters.rx_unmatched += 1,
            },
            Cm::Drep(drep) => match self.matched(drep.remote_comm_id, drep.local_comm_id) {
                Some(id) if self.state(id) == Some(State::DreqSent) => {
                    self.event(CmEvent::Disconnected { id });
                    self.enter_timewait(now, id);
                }
                _ => self.counters.rx_unmatched += 1,
            },
        }
    }

    fn on_req(&mut self, now: u64, from: Gid, to: Gid, tid: u64, req: Req) {
        let key = (req.local_comm_id, req.local_ca_guid);
        if let Some(&id) = self.by_remote.get(&key) {
            // A duplicate: our answer was lost, or the peer is slow.
            self.counters.rx_duplicates += 1;
            match self.conns[id.slot()].as_ref().map(|c| (c.state, c.last)) {
                Some((State::RepSent, Some((t, m)))) => self.push_mad(to, from, t, &m),
                Some((State::TimeWait, _)) => {
                    self.send_rej(to, from, tid, 0, &req, reason::STALE_CONN)
                }
                _ => {}
            }
            return;
        }
        let listened = self.listening.contains(&req.service_id);
        if !listened && !self.may_hold() {
            self.send_rej(to, from, tid, 0, &req, reason::INVALID_SERVICE_ID);
            return;
        }
        let Some(id) = self.alloc() else {
            self.send_rej(to, from, tid, 0, &req, reason::NO_RESOURCES);
            return;
        };
        if !listened {
            let p = Passive { from, to, tid, key };
            self.hold(now, id, &p, req.service_id, Held::Req(req));
            return;
        }
        // The REP waits as long as the REQ's sender says it takes to answer one.
        let wait_ms = 2 * iba_ms(self.cfg.packet_life_time) + iba_ms(req.local_cm_response_timeout);
        self.insert(Conn {
            id,
            state: State::ReqRcvd,
            peer: from,
            local: to,
            remote_comm_id: req.local_comm_id,
            remote_guid: req.local_ca_guid,
            remote_qpn: req.local_qpn,
            tid,
            last: None,
            tries: 0,
            deadline: None,
            wait_ms,
            service_id: 0,
            held: None,
            mra_taken: false,
        });
        self.by_remote.insert(key, id);
        self.event(CmEvent::ConnectRequest {
            id,
            peer: from,
            req,
        });
    }

    fn on_sidr_req(&mut self, now: u64, from: Gid, to: Gid, tid: u64, req: SidrReq) {
        // A request is named by its ID and its sender (SIDR carries no CA GUID).
        let key = (
            req.request_id,
            u64::from_be_bytes(from.0[8..].try_into().expect("8")),
        );
        if self.by_remote.contains_key(&key) {
            // The consumer has not answered yet; the answer goes to the retry too.
            self.counters.rx_duplicates += 1;
            return;
        }
        let listened = self.listening.contains(&req.service_id);
        if !listened && !self.may_hold() {
            self.refuse_sidr(to, from, tid, &req, SIDR_UNSUPPORTED);
            return;
        }
        let Some(id) = self.alloc() else {
            self.refuse_sidr(to, from, tid, &req, SIDR_REJECTED);
            return;
        };
        if !listened {
            let p = Passive { from, to, tid, key };
            self.hold(now, id, &p, req.service_id, Held::Sidr(req));
            return;
        }
        let p = Passive { from, to, tid, key };
        self.insert_passive(id, State::SidrRcvd, &p, req.service_id, None);
        self.event(CmEvent::SidrRequest {
            id,
            peer: from,
            local: to,
            req,
        });
    }

    fn on_rep(&mut self, from: Gid, to: Gid, rep: Rep) {
        // The REP names our ID; its own ID is new to us. Our IDs are not secret (a slot and
        // a generation), so it must also come from the peer the REQ went to: another host
        // naming our ID would otherwise have the QP programmed with its QPN and PSN.
        let Some(id) = self.local(rep.remote_comm_id) else {
            self.counters.rx_unmatched += 1;
            return;
        };
        let Ok(c) = self.conn_mut(id) else { return };
        if c.peer != from {
            self.counters.rx_unmatched += 1;
            return;
        }
        match c.state {
            State::ReqSent => {
                c.state = State::RepRcvd;
                c.remote_comm_id = rep.local_comm_id;
                c.remote_guid = rep.local_ca_guid;
                c.remote_qpn = rep.local_qpn;
                self.clear_timer(id);
                self.event(CmEvent::RepReceived { id, rep });
            }
            State::Established if c.remote_comm_id == rep.local_comm_id => {
                // Our RTU was lost and the peer sent its REP again: the RTU again.
                let rtu = IdsOnly {
                    local_comm_id: id.0,
                    remote_comm_id: c.remote_comm_id,
                    ..Default::default()
                };
                let tid = c.tid;
                self.counters.rx_duplicates += 1;
                self.push_mad(to, from, tid, &Cm::Rtu(rtu));
            }
            _ => self.counters.rx_unmatched += 1,
        }
    }

    fn on_rtu(&mut self, rtu: IdsOnly) {
        match self.matched(rtu.remote_comm_id, rtu.local_comm_id) {
            Some(id) if self.state(id) == Some(State::RepSent) => {
                if let Ok(c) = self.conn_mut(id) {
                    c.state = State::Established;
                }
                self.clear_timer(id);
                self.event(CmEvent::Established { id });
            }
            _ => self.counters.rx_unmatched += 1,
        }
    }

    fn on_mra(&mut self, now: u64, from: Gid, mra: Mra) {
        // The peer needs longer: wait its service timeout more for this try. Only a
        // REQ or REP of ours waiting for its answer waits longer (IBA 12.6.6: an MRA
        // answers a REQ, REP or LAP; a held request must not be kept alive by its
        // sender), once, and only from the peer the request went to. An MRA of our
        // REQ names the peer's new ID, which we do not know yet: it is matched by ours
        // alone, as the kernel's cm_mra_handler does.
        let waiting = |c: &Conn| match c.state {
            State::ReqSent => true,
            State::RepSent => c.remote_comm_id == mra.local_comm_id,
            _ => false,
        };
        match self.local(mra.remote_comm_id) {
            Some(id)
                if self
                    .conn(id)
                    .is_ok_and(|c| waiting(c) && c.peer == from && !c.mra_taken) =>
            {
                let extra = iba_ms(mra.service_timeout) + 2 * iba_ms(self.cfg.packet_life_time);
                if let Ok(c) = self.conn_mut(id) {
                    c.mra_taken = true;
                }
                self.clear_timer(id);
                self.set_timer(id, now + extra * MS);
            }
            _ => self.counters.rx_unmatched += 1,
        }
    }

    fn on_rej(&mut self, from: Gid, rej: Rej) {
        // A requester withdrawing its REQ (its ID destroyed before an answer) does not know
        // our ID: it names its own, with its CA GUID as the REJ's information, and is found
        // as its duplicates are (the kernel's cm_acquire_rejected_id), if it comes from
        // where the request came from.
        let withdrawn =
            (rej.message == REJECTS_REQ && rej.reason == reason::TIMEOUT && rej.info_length >= 8)
                .then(|| {
                    let guid = u64::from_be_bytes(rej.ari.0[..8].try_into().expect("8 bytes"));
                    self.by_remote.get(&(rej.local_comm_id, guid)).copied()
                })
                .flatten()
                .filter(|&id| self.conn(id).is_ok_and(|c| c.peer == from));
        let Some(id) = withdrawn.or_else(|| self.local(rej.remote_comm_id)) else {
            self.counters.rx_unmatched += 1;
            return;
        };
        let state = self.state(id);
        // A REJ of our REQ does not know the peer's ID yet: only ours must match. A
        // withdrawn REQ ends the request its consumer was given.
        let taken = matches!(
            state,
            Some(State::ReqSent | State::RepRcvd | State::RepSent)
        ) || (withdrawn.is_some() && state == Some(State::ReqRcvd));
        if taken {
            self.event(CmEvent::Rejected {
                id,
                reason: rej.reason,
                private_data: rej.private_data,
            });
            self.remove(id);
        } else if withdrawn.is_some() && state == Some(State::Unclaimed) {
            // A request held for a listener goes quietly: no consumer knows it.
            self.remove(id);
        } else {
            self.counters.rx_unmatched += 1;
        }
    }

    fn on_dreq(&mut self, now: u64, from: Gid, to: Gid, tid: u64, dreq: Dreq) {
        let id = self.matched(dreq.remote_comm_id, dreq.local_comm_id);
        let state = id.and_then(|id| self.state(id));
        let drep = |local: u32, remote| {
            Cm::Drep(IdsOnly {
                local_comm_id: local,
                remote_comm_id: remote,
                ..Default::default()
            })
        };
        let (Some(id), Some(state)) = (id, state) else {
            // Gone already (time wait over, or never known): answered all the same, as ib_cm
            // does, so a peer whose DREP was lost stops retrying. Nothing is held for it.
            self.counters.rx_unmatched += 1;
            self.push_mad(
                to,
                from,
                tid,
                &drep(dreq.remote_comm_id, dreq.local_comm_id),
            );
            return;
        };
        match state {
            // Both sides sent a DREQ: answer and finish as if ours was answered.
            State::Established | State::DreqSent | State::RepSent => {
                self.push_mad(to, from, tid, &drep(id.0, dreq.local_comm_id));
                self.event(CmEvent::Disconnected { id });
                self.enter_timewait(now, id);
            }
            State::TimeWait => {
                // Our DREP was lost: again.
                self.counters.rx_duplicates += 1;
                self.push_mad(to, from, tid, &drep(id.0, dreq.local_comm_id));
            }
            _ => self.counters.rx_unmatched += 1,
        }
    }

    /// A SIDR_REP from `local` refusing `req` from `peer` with `status`.
    fn refuse_sidr(&mut self, local: Gid, peer: Gid, tid: u64, req: &SidrReq, status: u8) {
        let rep = SidrRep {
            request_id: req.request_id,
            status,
            service_id: req.service_id,
            ..Default::default()
        };
        self.counters.rej_sent += 1;
        self.push_mad(local, peer, tid, &Cm::SidrRep(rep));
    }

    /// Whether a request nobody listens for may be held (see [`MAX_HELD`]).
    fn may_hold(&self) -> bool {
        self.cfg.unclaimed_hold_ms > 0 && self.held_now < MAX_HELD
    }

    /// Holds request `held` as connection `id` until a listener for `service_id` comes or
    /// `unclaimed_hold_ms` passes.
    fn hold(&mut self, now: u64, id: ConnId, p: &Passive, service_id: u64, held: Held) {
        self.insert_passive(id, State::Unclaimed, p, service_id, Some(held));
        self.counters.held += 1;
        self.held_now += 1;
        self.set_timer(id, now + self.cfg.unclaimed_hold_ms * MS);
    }

    /// A passive connection `id` in `state` for a request (its duplicates known by its key).
    fn insert_passive(
        &mut self,
        id: ConnId,
        state: State,
        p: &Passive,
        service_id: u64,
        held: Option<Held>,
    ) {
        self.insert(Conn {
            id,
            state,
            peer: p.from,
            local: p.to,
            remote_comm_id: p.key.0,
            remote_guid: p.key.1,
            remote_qpn: 0,
            tid: p.tid,
            last: None,
            tries: 0,
            deadline: None,
            wait_ms: 0,
            service_id,
            held: held.map(Box::new),
            mra_taken: false,
        });
        self.by_remote.insert(p.key, id);
    }

    /// A REJ from `local` answering `req` from `peer` (for which nothing is held).
    fn send_rej(&mut self, local: Gid, peer: Gid, tid: u64, local_id: u32, req: &Req, reason: u16) {
        let rej = Rej {
            local_comm_id: local_id,
            remote_comm_id: req.local_comm_id,
            message: REJECTS_REQ,
            reason,
            ..Default::default()
        };
        self.counters.rej_sent += 1;
        self.push_mad(local, peer, tid, &Cm::Rej(rej));
    }

    /// Holds a new active-side request `id` in `state` and returns its transaction ID (as
    /// ib_cm forms it: the agent's number above the communication ID's bytes); its answer is
    /// awaited for 2 x packet lifetime + the response timeout, per try.
    fn start_active(
        &mut self,
        id: ConnId,
        state: State,
        local: Gid,
        peer: Gid,
        service_id: u64,
    ) -> u64 {
        let tid = (self.cfg.tid_high as u64) << 32 | id.0.swap_bytes() as u64;
        let wait_ms = 2 * iba_ms(self.cfg.packet_life_time) + iba_ms(self.cfg.cm_response_timeout);
        self.insert(Conn {
            id,
            state,
            peer,
            local,
            remote_comm_id: 0,
            remote_guid: 0,
            remote_qpn: 0,
            tid,
            last: None,
            tries: 0,
            deadline: None,
            wait_ms,
            service_id,
            held: None,
            mra_taken: false,
        });
        tid
    }

    fn send_request(&mut self, now: u64, id: ConnId, tid: u64, m: Cm) {
        let Ok(c) = self.conn_mut(id) else { return };
        c.last = Some((tid, m));
        let (local, peer) = (c.local, c.peer);
        self.push_mad(local, peer, tid, &m);
        self.arm(now, id);
    }

    fn enter_timewait(&mut self, now: u64, id: ConnId) {
        self.clear_timer(id);
        if let Ok(c) = self.conn_mut(id) {
            c.state = State::TimeWait;
            c.last = None;
        }
        let wait = iba_ms(self.cfg.packet_life_time + 1);
        self.set_timer(id, now + wait * MS);
    }

    fn arm(&mut self, now: u64, id: ConnId) {
        let Some(wait) = self.conns[id.slot()].as_ref().map(|c| c.wait_ms) else {
            return;
        };
        self.clear_timer(id);
        self.set_timer(id, now + wait * MS);
    }

    fn set_timer(&mut self, id: ConnId, at: u64) {
        if let Ok(c) = self.conn_mut(id) {
            c.deadline = Some(at);
            self.timers.insert((at, id));
        }
    }

    fn clear_timer(&mut self, id: ConnId) {
        if let Ok(c) = self.conn_mut(id) {
            if let Some(t) = c.deadline.take() {
                self.timers.remove(&(t, id));
            }
        }
    }

    fn push_mad(&mut self, src: Gid, dest: Gid, tid: u64, m: &Cm) {
        if self.out.len() >= MAX_OUT {
            self.counters.tx_dropped += 1;
            return;
        }
        let mad = m.to_mad(tid);
        self.counters.tx_mads += 1;
        self.out.push_back(OutMad { src, dest, mad });
    }

    fn event(&mut self, e: CmEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.counters.events_dropped += 1;
            return;
        }
        self.events.push_back(e);
    }

    /// Our connection `local` if it exists (the ID the peer named as ours).
    fn local(&self, local: u32) -> Option<ConnId> {
        let id = ConnId(local);
        self.conns
            .get(id.slot())?
            .as_ref()
            .filter(|c| c.id == id)
            .map(|c| c.id)
    }

    /// Our connection `local` if the peer's ID `remote` is the one it holds.
    fn matched(&self, local: u32, remote: u32) -> Option<ConnId> {
        let id = self.local(local)?;
        (self.conns[id.slot()].as_ref()?.remote_comm_id == remote).then_some(id)
    }

    fn state(&self, id: ConnId) -> Option<State> {
        self.conns.get(id.slot())?.as_ref().map(|c| c.state)
    }

    fn conn(&self, id: ConnId) -> Result<&Conn, CmError> {
        self.conns
            .get(id.slot())
            .and_then(|c| c.as_ref())
            .filter(|c| c.id == id)
            .ok_or(CmError::NotFound)
    }

    /// The connection `id` if it is in `state` (the calls that move a connection on from one
    /// state: WrongState from any other).
    fn conn_in(&self, id: ConnId, state: State) -> Result<&Conn, CmError> {
        let c = self.conn(id)?;
        if c.state != state {
            return Err(CmError::WrongState);
        }
        Ok(c)
    }

    fn conn_mut(&mut self, id: ConnId) -> Result<&mut Conn, CmError> {
        self.conns
            .get_mut(id.slot())
            .and_then(|c| c.as_mut())
            .filter(|c| c.id == id)
            .ok_or(CmError::NotFound)
    }

    /// A free communication ID: a slot (FIFO reuse) and its generation, so an ID comes back
    /// only after its slot has been reused 4096 times.
    fn alloc(&mut self) -> Option<ConnId> {
        if self.conn_count() >= self.cfg.max_conns.min(1 << SLOT_BITS) {
            return None;
        }
        let slot = match self.free.pop_front() {
            Some(s) => s,
            None => {
                self.conns.push(None);
                self.generation.push(0);
                self.conns.len() - 1
            }
        };
        let g = &mut self.generation[slot];
        // The next generation of this agent's stripe. Generation 0 is skipped so no ID is 0
        // (a REJ to an unknown REQ names 0).
        let stripe = self.cfg.id_stripe;
        loop {
            *g = (*g + 1) & 0xfff;
            if *g != 0 && comm_id_owner((*g as u32) << SLOT_BITS, stripe.count) == stripe.index {
                break;
            }
        }
        Some(ConnId((*g as u32) << SLOT_BITS | slot as u32))
    }

    fn insert(&mut self, c: Conn) {
        let slot = c.id.slot();
        self.conns[slot] = Some(c);
    }

    fn remove(&mut self, id: ConnId) {
        self.clear_timer(id);
        if let Some(c) = self.conns.get_mut(id.slot()).and_then(|c| c.take()) {
            if c.state == State::Unclaimed {
                self.held_now -= 1;
            }
            let key = (c.remote_comm_id, c.remote_guid);
            if self.by_remote.get(&key) == Some(&id) {
                self.by_remote.remove(&key);
            }
            self.free.push_back(id.slot());
        }
    }
}
