//! rdma_cm for applications: connecting QPs through the port's connection manager (IB CM
//! over QP1, as Linux's rdma_cm does on RoCEv2). The worker runs the protocol; these calls
//! listen, connect, accept, reject and disconnect, take the connection's events, and move a
//! QP through INIT, RTR and RTS with what the exchange agreed on (what librdmacm does with
//! `rdma_init_qp_attr`).

use std::time::{Duration, Instant};

use roce::engine::{VerbsError, VerbsResult};
use roce::types::{Gid, Psn, Qpn};
use roce::verbs::{Access, AddressVector, Mtu, QpAttr, QpState};

use super::Client;
use crate::abi::{CmEventData, Command, Reach, ReplyData};
use crate::app::Channel;
use roce::cm::{AcceptParams, ConnectParams, SidrParams};

/// What a QP needs to reach RTS on a connection the CM made (both sides compute it from
/// the REQ and REP: see [`RdmaCm::cm_bring_up`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmQpPath {
    /// The peer's GID.
    pub peer_gid: Gid,
    /// This side's GID index (the one of the address the connection uses).
    pub sgid_index: u8,
    /// The peer's QPN.
    pub peer_qpn: Qpn,
    /// Path MTU.
    pub path_mtu: Mtu,
    /// Where the peer's requests start (this QP's receive PSN).
    pub rq_psn: u32,
    /// Where this QP's requests start.
    pub sq_psn: u32,
    /// READ/atomic requests this QP issues at once (the peer's responder resources).
    pub max_rd_atomic: u8,
    /// READ/atomic requests this QP accepts at once.
    pub max_dest_rd_atomic: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Local ACK timeout (4.096 us x 2^t).
    pub timeout: u8,
}

/// rdma_cm for applications (see the module documentation); [`Client`] implements it, in
/// the same process as the RNIC or through rnicd.
pub trait RdmaCm: crate::app::Verbs {
    /// REQs for `service_id` (rdma_cm: `roce::wire::cm::service_id(port space, port)`) come
    /// to this client as `ConnectRequest` events.
    fn cm_listen(&mut self, service_id: u64) -> VerbsResult<()>;
    /// No more REQs for `service_id`.
    fn cm_unlisten(&mut self, service_id: u64) -> VerbsResult<()>;
    /// Sends a REQ for the client's QP; the answer comes as `RepReceived`, `Rejected` or
    /// `TimedOut`. Returns the connection's ID.
    fn cm_connect(&mut self, params: ConnectParams) -> VerbsResult<u32>;
    /// Accepts a `ConnectRequest` with a REP (the QP already at RTS: [`Self::cm_bring_up`]).
    fn cm_accept(&mut self, id: u32, params: AcceptParams) -> VerbsResult<()>;
    /// Rejects a `ConnectRequest` (consumer defined, with `private_data`).
    fn cm_reject(&mut self, id: u32, private_data: &[u8]) -> VerbsResult<()>;
    /// After `RepReceived` and the QP at RTS: the RTU; the connection is established.
    fn cm_rtu(&mut self, id: u32) -> VerbsResult<()>;
    /// The passive side's QP received its first packet before the RTU.
    fn cm_established(&mut self, id: u32) -> VerbsResult<()>;
    /// Disconnects an established connection (DREQ); `Disconnected` follows.
    fn cm_disconnect(&mut self, id: u32) -> VerbsResult<()>;
    /// Gives the connection up, whatever its state (rdma_destroy_id): disconnected if
    /// established, refused if in its handshake, withdrawn if its REQ is unanswered. No
    /// event names it afterwards.
    fn cm_destroy(&mut self, id: u32) -> VerbsResult<()>;
    /// Asks for a UD service (SIDR, rdma_cm over UDP); the answer comes as `SidrReply` (or
    /// `TimedOut`). Returns the request's ID.
    fn cm_sidr_request(&mut self, params: SidrParams) -> VerbsResult<u32>;
    /// Answers a `SidrRequest`: status 0 with the UD QP and Q_Key that serve it, or a
    /// refusal (2: rejected).
    fn cm_sidr_reply(
        &mut self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> VerbsResult<()>;
    /// The next connection event, if one is waiting.
    fn cm_get_event(&mut self) -> VerbsResult<Option<CmEventData>>;
    /// Whether the RNIC reaches `dgid` (rdma_resolve_addr): its next hop known, being
    /// resolved (ARP / neighbour discovery started by this call if needed), or unreachable.
    fn resolve_neighbor(&mut self, dgid: Gid) -> VerbsResult<Reach>;
    /// Waits up to `timeout` for the next connection event (`None` when none came). An
    /// in-process client drives the worker meanwhile; a remote one asks again after a
    /// growing pause (1 us doubling to 1 ms).
    fn cm_wait_event(&mut self, timeout: Duration) -> VerbsResult<Option<CmEventData>>;
    /// Moves `qpn` from RESET through INIT and RTR to RTS for the connection `p` describes,
    /// with `access` for remote operations: what librdmacm does with the attributes
    /// `rdma_init_qp_attr` returns.
    fn cm_bring_up(&mut self, qpn: Qpn, access: Access, p: &CmQpPath) -> VerbsResult<()> {
        let init = QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(access),
            ..Default::default()
        };
        self.modify_qp(qpn, &init)?;
        let rtr = QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AddressVector::new(p.peer_gid, p.sgid_index)),
            path_mtu: Some(p.path_mtu),
            dest_qp: Some(p.peer_qpn),
            rq_psn: Some(Psn::new(p.rq_psn)),
            max_dest_rd_atomic: Some(p.max_dest_rd_atomic),
            min_rnr_timer: Some(12),
            ..Default::default()
        };
        self.modify_qp(qpn, &rtr)?;
        let rts = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(p.sq_psn)),
            timeout: Some(p.timeout),
            retry_cnt: Some(p.retry_cnt),
            rnr_retry: Some(p.rnr_retry),
            max_rd_atomic: Some(p.max_rd_atomic),
            ..Default::default()
        };
        self.modify_qp(qpn, &rts)
    }
}

impl<C: Channel> RdmaCm for Client<C> {
    fn cm_listen(&mut self, service_id: u64) -> VerbsResult<()> {
        self.call_ok(Command::CmListen { service_id })
    }

    fn cm_unlisten(&mut self, service_id: u64) -> VerbsResult<()> {
        self.call_ok(Command::CmUnlisten { service_id })
    }

    fn cm_connect(&mut self, params: ConnectParams) -> VerbsResult<u32> {
        self.call_cm_id(Command::CmConnect {
            params: Box::new(params),
        })
    }

    fn cm_accept(&mut self, id: u32, params: AcceptParams) -> VerbsResult<()> {
        self.call_ok(Command::CmAccept {
            id,
            params: Box::new(params),
        })
    }

    fn cm_reject(&mut self, id: u32, private_data: &[u8]) -> VerbsResult<()> {
        let private_data = private_data.to_vec();
        self.call_ok(Command::CmReject { id, private_data })
    }

    fn cm_rtu(&mut self, id: u32) -> VerbsResult<()> {
        self.call_ok(Command::CmRtu { id })
    }

    fn cm_established(&mut self, id: u32) -> VerbsResult<()> {
        self.call_ok(Command::CmEstablished { id })
    }

    fn cm_disconnect(&mut self, id: u32) -> VerbsResult<()> {
        self.call_ok(Command::CmDisconnect { id })
    }

    fn cm_destroy(&mut self, id: u32) -> VerbsResult<()> {
        self.call_ok(Command::CmDestroy { id })
    }

    fn cm_sidr_request(&mut self, params: SidrParams) -> VerbsResult<u32> {
        self.call_cm_id(Command::CmSidrRequest {
            params: Box::new(params),
        })
    }

    fn cm_sidr_reply(
        &mut self,
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: &[u8],
    ) -> VerbsResult<()> {
        let private_data = private_data.to_vec();
        self.call_ok(Command::CmSidrReply {
            id,
            status,
            qpn,
            qkey,
            private_data,
        })
    }

    fn resolve_neighbor(&mut self, dgid: Gid) -> VerbsResult<Reach> {
        match self.call(Command::ResolveNeighbor { dgid })? {
            ReplyData::Neighbor(r) => Ok(r),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn cm_get_event(&mut self) -> VerbsResult<Option<CmEventData>> {
        match self.call(Command::CmGetEvent)? {
            ReplyData::CmEvent(e) => Ok(e),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn cm_wait_event(&mut self, timeout: Duration) -> VerbsResult<Option<CmEventData>> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(1);
        loop {
            if let Some(e) = self.cm_get_event()? {
                return Ok(Some(e));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            if !self.chan.progress() {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(1));
            }
        }
    }
}

impl<C: Channel> Client<C> {
    /// A call whose reply carries nothing.
    fn call_ok(&mut self, cmd: Command) -> VerbsResult<()> {
        self.call(cmd).map(|_| ())
    }

    /// A call that opens a connection or request and answers its ID.
    fn call_cm_id(&mut self, cmd: Command) -> VerbsResult<u32> {
        match self.call(cmd)? {
            ReplyData::CmId(id) => Ok(id),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }
}
