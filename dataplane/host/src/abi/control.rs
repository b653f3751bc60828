//! The control protocol's types and the sizes both ends agree on: ring depths, the index
//! area's layout, the limits a device announces and a client is held to, and the
//! [`Command`]s an application sends to the worker with their [`ReplyData`].

use roce::cm::{AcceptParams, ConnectParams, SidrParams};
use roce::engine::{CqId, DeviceAttr, DeviceConfig, QpInit, SrqAttr, SrqId};
use roce::memory::PdId;
use roce::types::{Gid, Lkey, Qpn, Rkey};
use roce::verbs::{Access, QpAttr, QpInfo};

/// Post ring depth, in 64-byte cells (a post takes one to seven).
pub const POST_RING: usize = 8192;
/// Event ring depth.
pub const EVENT_RING: usize = 1024;
/// Per-QP published indices: (send WQEs retired, receive WQEs retired).
pub const QP_INDEX_BYTES: usize = 16;
/// Per-SRQ published index: receive WQEs handed out.
pub const SRQ_INDEX_BYTES: usize = 8;
/// The value of the index area's state word once the context is device-fatal
/// ([`HostLimits::state_off`]).
pub const CONTEXT_FATAL: u64 = 1;

/// The sizes a host interface needs from its device: its per-object tables are indexed by
/// QP slot, CQ id and SRQ id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostLimits {
    /// The device's `max_qp` (QP slots).
    pub max_qp: u32,
    /// The device's `max_cq`.
    pub max_cq: u32,
    /// The device's `max_srq`.
    pub max_srq: u32,
    /// The port's MTU in bytes (the largest UD message), for the send checks an application
    /// makes before posting.
    #[serde(default = "default_port_mtu")]
    pub port_mtu: u32,
}

fn default_port_mtu() -> u32 {
    4096
}

impl HostLimits {
    /// The limits of a device with this configuration.
    pub fn of(cfg: &DeviceConfig) -> HostLimits {
        HostLimits {
            max_qp: cfg.limits.max_qp,
            max_cq: cfg.limits.max_cq,
            max_srq: cfg.limits.max_srq,
            port_mtu: cfg.port_mtu.bytes(),
        }
    }

    /// Bytes of the index area: the QPs' positions, the SRQs' positions, then the context's
    /// state word.
    pub fn index_bytes(&self) -> usize {
        self.state_off() + 8
    }

    /// Offset in the index area of the context's state word, which the worker sets to
    /// [`CONTEXT_FATAL`] when it declares the context device-fatal (closed for breaking the
    /// protocol, or the RNIC stopped), so the application's posts fail at once with
    /// `DeviceFatal` instead of finding their queues full forever. Only the application
    /// reads it; the worker never does.
    pub fn state_off(&self) -> usize {
        self.max_qp as usize * QP_INDEX_BYTES + self.max_srq as usize * SRQ_INDEX_BYTES
    }

    /// Whether limits announced by the other end are plausible (a client checks rnicd's
    /// before sizing its tables by them).
    pub fn check_sane(&self) -> Result<(), roce::engine::VerbsError> {
        if self.max_qp == 0
            || self.max_qp > 1 << 24
            || self.max_cq > 1 << 24
            || self.max_srq > 1 << 24
        {
            return Err(roce::engine::VerbsError::InvalidArgument(format!(
                "rnicd announced implausible limits {self:?}"
            )));
        }
        Ok(())
    }

    /// Offset in the index area of a QP's published positions (send retired, then receive
    /// retired; `slot` is `roce::engine::qp_slot`).
    pub fn qp_index_off(slot: usize) -> usize {
        slot * QP_INDEX_BYTES
    }

    /// Offset in the index area of an SRQ's published position.
    pub fn srq_index_off(&self, srq: usize) -> usize {
        self.max_qp as usize * QP_INDEX_BYTES + srq * SRQ_INDEX_BYTES
    }
}

/// Limits on what one client may hold (rnicd's `host.*` keys); a request past one fails
/// with `NoResources` naming it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClientLimits {
    /// QPs.
    pub max_qps: u32,
    /// CQs.
    pub max_cqs: u32,
    /// MRs.
    pub max_mrs: u32,
    /// PDs.
    pub max_pds: u32,
    /// SRQs.
    pub max_srqs: u32,
    /// Bytes of memory shared with the RNIC: buffers, registered memory and CQ rings,
    /// counted until the worker unmaps them.
    pub max_area_bytes: u64,
    /// Shared memory areas mapped on the worker (buffers, moved pages, CQ rings): each is a
    /// mapping in rnicd, a resource of its own besides the bytes.
    pub max_areas: u32,
    /// Bytes of queue memory the RNIC allocates for the client's QPs, SRQs and CQs (their
    /// work queue entries, SGE arrays, inline buffers and completions).
    pub max_queue_bytes: u64,
}

impl Default for ClientLimits {
    fn default() -> Self {
        ClientLimits {
            max_qps: u32::MAX,
            max_cqs: u32::MAX,
            max_mrs: u32::MAX,
            max_pds: u32::MAX,
            max_srqs: u32::MAX,
            max_area_bytes: u64::MAX,
            max_areas: u32::MAX,
            max_queue_bytes: u64::MAX,
        }
    }
}

/// A new translation for `rereg_mr`: `len` bytes at `offset` of the client's area `area`,
/// seen at `iova`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Translation {
    /// The client's area id.
    pub area: u32,
    /// Offset in the area.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
    /// The address peers and SGEs use for the first byte.
    pub iova: u64,
}

/// A control call, executed by the worker (`dataplane::host::HostEnd`). Plain data (rnicd's
/// clients send it as JSON, docs/host-protocol.md); the memory area of `AddArea` and the ring
/// of `CreateCq` travel beside it (in process as an `Arc<Area>`, over the socket as a file
/// descriptor).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum Command {
    QueryDevice,
    QueryPort,
    QueryGid {
        index: u8,
    },
    AllocPd,
    DeallocPd {
        pd: PdId,
    },
    /// Makes the area sent with the call known to the worker as this client's area `id`.
    AddArea {
        id: u32,
    },
    /// Forgets area `id` (MRs on it keep it mapped until deregistered).
    RemoveArea {
        id: u32,
    },
    RegMr {
        pd: PdId,
        area: u32,
        offset: u64,
        len: u64,
        access: Access,
        iova: u64,
    },
    /// `ibv_rereg_mr`: the MR keeps its keys; `null` fields keep what it has.
    ReregMr {
        lkey: Lkey,
        pd: Option<PdId>,
        translation: Option<Translation>,
        access: Option<Access>,
    },
    AllocMr {
        pd: PdId,
        area: u32,
    },
    /// `ibv_alloc_mw`.
    AllocMw {
        pd: PdId,
        ty: roce::memory::MwType,
    },
    /// `ibv_dealloc_mw` (by the window's key; its index names it).
    DeallocMw {
        rkey: Rkey,
    },
    DeregMr {
        lkey: Lkey,
    },
    /// A CQ whose completions go to the ring sent with the call (`capacity` slots).
    CreateCq {
        cqe: u32,
        capacity: u32,
    },
    DestroyCq {
        cq: CqId,
    },
    /// `ibv_resize_cq`: the engine's CQ holds `cqe` completions from now on (the ring keeps
    /// its capacity: completions it has no room for wait in the engine's CQ).
    ResizeCq {
        cq: CqId,
        cqe: u32,
    },
    CreateSrq {
        pd: PdId,
        attr: SrqAttr,
    },
    ModifySrq {
        srq: SrqId,
        limit: u32,
    },
    QuerySrq {
        srq: SrqId,
    },
    DestroySrq {
        srq: SrqId,
    },
    CreateQp {
        init: QpInit,
    },
    ModifyQp {
        qpn: Qpn,
        attr: QpAttr,
    },
    QueryQp {
        qpn: Qpn,
    },
    DestroyQp {
        qpn: Qpn,
    },
    Counters {
        qpn: Option<Qpn>,
    },
    /// rdma_cm: REQs for `service_id` come to this client (as `CmEventData::ConnectRequest`).
    CmListen {
        service_id: u64,
    },
    /// rdma_cm: no more REQs for `service_id`.
    CmUnlisten {
        service_id: u64,
    },
    /// rdma_cm: a REQ for the client's QP (reply: `CmId`).
    CmConnect {
        params: Box<ConnectParams>,
    },
    /// rdma_cm: accept a connect request with a REP (the QP is at RTS already).
    CmAccept {
        id: u32,
        params: Box<AcceptParams>,
    },
    /// rdma_cm: reject a connect request (consumer defined, with private data).
    CmReject {
        id: u32,
        private_data: Vec<u8>,
    },
    /// rdma_cm: after `RepReceived` (the QP at RTS), the RTU: the connection is up.
    CmRtu {
        id: u32,
    },
    /// rdma_cm: the passive side's QP saw its first packet before the RTU.
    CmEstablished {
        id: u32,
    },
    /// rdma_cm: a DREQ on an established connection.
    CmDisconnect {
        id: u32,
    },
    /// rdma_cm's address resolution (rdma_resolve_addr): whether the RNIC reaches `dgid`,
    /// starting ARP / neighbour discovery for it if its next hop is not known (reply:
    /// `Neighbor`); asked again until it is known or fails.
    ResolveNeighbor {
        dgid: Gid,
    },
    /// rdma_cm: the client destroyed the connection's ID (rdma_destroy_id): whatever its
    /// state, the connection is ended as the kernel's CM ends it (`CmAgent::destroy`) and
    /// the ID is no longer the client's.
    CmDestroy {
        id: u32,
    },
    /// rdma_cm: the client's next connection event, if any (reply: `CmEvent`).
    CmGetEvent,
    /// rdma_cm over UDP: a SIDR request for a UD service (reply: `CmId`).
    CmSidrRequest {
        params: Box<SidrParams>,
    },
    /// rdma_cm over UDP: answers a `sidr_request` event (status 0: the QP and Q_Key serve).
    CmSidrReply {
        id: u32,
        status: u8,
        qpn: u32,
        qkey: u32,
        private_data: Vec<u8>,
    },
    /// The application is going away: release everything it created.
    Close,
}

/// A connection event for the client (`roce::cm::CmEvent` as plain data).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum CmEventData {
    /// A REQ for a service the client listens to: `accept` or `reject` it.
    ConnectRequest {
        id: u32,
        service_id: u64,
        /// The requester's GID and this side's (the address it was sent to).
        peer: Gid,
        local: Gid,
        qpn: Qpn,
        /// Where the requester's responder expects this side's requests to start.
        starting_psn: u32,
        responder_resources: u8,
        initiator_depth: u8,
        path_mtu: u8,
        retry_count: u8,
        rnr_retry_count: u8,
        private_data: Vec<u8>,
    },
    /// The peer accepted: bring the QP up with this, then `rtu`.
    RepReceived {
        id: u32,
        qpn: Qpn,
        /// Where the peer's responder expects this side's requests to start.
        starting_psn: u32,
        responder_resources: u8,
        initiator_depth: u8,
        rnr_retry_count: u8,
        private_data: Vec<u8>,
    },
    Established {
        id: u32,
    },
    Rejected {
        id: u32,
        reason: u16,
        private_data: Vec<u8>,
    },
    TimedOut {
        id: u32,
    },
    Disconnected {
        id: u32,
    },
    Released {
        id: u32,
    },
    /// A SIDR request for a UD service the client listens to: `cm_sidr_reply` to it.
    SidrRequest {
        id: u32,
        service_id: u64,
        peer: Gid,
        local: Gid,
        private_data: Vec<u8>,
    },
    /// The service's answer to the client's SIDR request (status 0: its QP and Q_Key).
    SidrReply {
        id: u32,
        status: u8,
        qpn: Qpn,
        qkey: u32,
        private_data: Vec<u8>,
    },
}

impl CmEventData {
    /// The connection it is about.
    pub fn id(&self) -> u32 {
        match self {
            CmEventData::ConnectRequest { id, .. }
            | CmEventData::RepReceived { id, .. }
            | CmEventData::Established { id }
            | CmEventData::Rejected { id, .. }
            | CmEventData::TimedOut { id }
            | CmEventData::Disconnected { id }
            | CmEventData::Released { id }
            | CmEventData::SidrRequest { id, .. }
            | CmEventData::SidrReply { id, .. } => *id,
        }
    }
}

impl Command {
    /// A short name (logs, rnic-ctl).
    pub fn name(&self) -> &'static str {
        match self {
            Command::QueryDevice => "query_device",
            Command::QueryPort => "query_port",
            Command::QueryGid { .. } => "query_gid",
            Command::AllocPd => "alloc_pd",
            Command::DeallocPd { .. } => "dealloc_pd",
            Command::AddArea { .. } => "add_area",
            Command::RemoveArea { .. } => "remove_area",
            Command::RegMr { .. } => "reg_mr",
            Command::ReregMr { .. } => "rereg_mr",
            Command::AllocMw { .. } => "alloc_mw",
            Command::DeallocMw { .. } => "dealloc_mw",
            Command::AllocMr { .. } => "alloc_mr",
            Command::DeregMr { .. } => "dereg_mr",
            Command::CreateCq { .. } => "create_cq",
            Command::DestroyCq { .. } => "destroy_cq",
            Command::ResizeCq { .. } => "resize_cq",
            Command::CreateSrq { .. } => "create_srq",
            Command::ModifySrq { .. } => "modify_srq",
            Command::QuerySrq { .. } => "query_srq",
            Command::DestroySrq { .. } => "destroy_srq",
            Command::CreateQp { .. } => "create_qp",
            Command::ModifyQp { .. } => "modify_qp",
            Command::QueryQp { .. } => "query_qp",
            Command::DestroyQp { .. } => "destroy_qp",
            Command::Counters { .. } => "counters",
            Command::CmListen { .. } => "cm_listen",
            Command::CmUnlisten { .. } => "cm_unlisten",
            Command::CmConnect { .. } => "cm_connect",
            Command::CmAccept { .. } => "cm_accept",
            Command::CmReject { .. } => "cm_reject",
            Command::CmRtu { .. } => "cm_rtu",
            Command::CmEstablished { .. } => "cm_established",
            Command::CmDisconnect { .. } => "cm_disconnect",
            Command::CmDestroy { .. } => "cm_destroy",
            Command::ResolveNeighbor { .. } => "resolve_neighbor",
            Command::CmGetEvent => "cm_get_event",
            Command::CmSidrRequest { .. } => "cm_sidr_request",
            Command::CmSidrReply { .. } => "cm_sidr_reply",
            Command::Close => "close",
        }
    }
}

/// `PortAttr` as plain data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[allow(missing_docs)]
pub struct PortAttrData {
    pub active: bool,
    pub max_mtu: roce::verbs::Mtu,
    pub active_mtu: roce::verbs::Mtu,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u32,
}

/// What a control call returns.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
#[allow(missing_docs)]
pub enum ReplyData {
    None,
    Pd(PdId),
    Keys {
        lkey: Lkey,
        rkey: Option<Rkey>,
    },
    Cq(CqId),
    Srq(SrqId),
    SrqAttr(SrqAttr),
    /// A new QP and its slot in the index area.
    Qp(Qpn, u32),
    QpInfo(QpInfo),
    Gid(Gid),
    Device(DeviceAttr),
    Port(PortAttrData),
    /// Counter values, in the order `counter_names` gives.
    Counters(Vec<u64>),
    /// A new memory window's key.
    Mw(Rkey),
    /// A CQ's new size.
    Cqe(u32),
    /// A new rdma_cm connection (its local communication ID).
    CmId(u32),
    /// The client's next connection event.
    CmEvent(Option<CmEventData>),
    /// How the next hop towards a GID stands (`resolve_neighbor`).
    Neighbor(Reach),
}

/// How the RNIC reaches a destination (`resolve_neighbor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reach {
    /// Its next hop's MAC is known (or it is one of the RNIC's own addresses).
    Resolved,
    /// ARP / neighbour discovery is under way.
    Pending,
    /// No route, or the next hop did not answer.
    Unreachable,
}

/// The names of the values a `Counters` reply carries: the QP (or port total) counters, the
/// device counters, then the client's own.
pub fn counter_names() -> impl Iterator<Item = &'static str> {
    roce::engine::QpCounters::NAMES
        .iter()
        .chain(roce::engine::DeviceCounters::NAMES)
        .chain(HostCounters::NAMES.iter())
        .copied()
}

/// Counters of one host interface (one application context), reported with the device's
/// counters as `host_*`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Posts that failed on the worker (a WQE for a QP completes with LOC_QP_OP_ERR; an SRQ
    /// WQE is dropped).
    pub failed_posts: u64,
    /// Asynchronous events dropped because the application's event ring was full.
    pub events_dropped: u64,
    /// Post slots that did not decode (the client then loses its context).
    pub bad_slots: u64,
}

impl HostCounters {
    /// Counter names, in the order of `values`.
    pub const NAMES: [&'static str; 3] =
        ["host_failed_posts", "host_events_dropped", "host_bad_slots"];

    /// Values, in the order of `NAMES`.
    pub fn values(&self) -> [u64; 3] {
        [self.failed_posts, self.events_dropped, self.bad_slots]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rdma_cm calls cross rnicd's socket as JSON: private data as bytes without its zero
    /// padding, and more than a message holds is refused when the call is read, before the
    /// worker sees it.
    #[test]
    fn cm_calls_in_json_and_private_data_bounds() {
        let mut params = ConnectParams {
            service_id: 0x0106_1c06,
            qpn: 17,
            ..Default::default()
        };
        params.private_data.0[..3].copy_from_slice(&[1, 2, 3]);
        let json = serde_json::to_string(&Command::CmConnect {
            params: Box::new(params),
        })
        .unwrap();
        assert!(json.contains("\"private_data\":[1,2,3]"), "{json}");
        let back: Command = serde_json::from_str(&json).unwrap();
        assert!(matches!(back, Command::CmConnect { params: p } if *p == params));
        let too_long = json.replace("[1,2,3]", &format!("{:?}", vec![7u8; 93]));
        let e = serde_json::from_str::<Command>(&too_long).unwrap_err();
        assert!(
            e.to_string()
                .contains("93 bytes of private data (at most 92)"),
            "{e}"
        );
        let accept = format!(
            "{{\"cm_accept\":{{\"id\":5,\"params\":{{\"qpn\":17,\"starting_psn\":1,\
             \"responder_resources\":0,\"initiator_depth\":0,\"rnr_retry_count\":7,\
             \"srq\":false,\"private_data\":{:?}}}}}}}",
            vec![1u8; 196]
        );
        assert!(serde_json::from_str::<Command>(&accept).is_ok());
        let accept = accept.replace(
            &format!("{:?}", vec![1u8; 196]),
            &format!("{:?}", vec![1u8; 197]),
        );
        assert!(serde_json::from_str::<Command>(&accept).is_err());
    }
}
