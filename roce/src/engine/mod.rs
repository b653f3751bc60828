//! The transport engine, sans-IO (quinn-proto style): [`Device`] owns protection domains,
//! memory regions, completion queues, shared receive queues and queue pairs; it takes frames
//! (`handle_frame`) and timeouts (`handle_timeout`) with `now` passed in, and returns packets
//! (`poll_transmit`), deadlines (`poll_timeout`), completions (`poll_cq`) and asynchronous
//! events (`poll_event`). It reads no clock, spawns no thread and does no I/O.
//!
//! Roles are split by file as in Linux rxe: `req.rs` (requester), `resp.rs` (responder),
//! `comp.rs` (completer); `qp.rs` holds the QP state machine.

pub mod cc;
mod comp;
pub mod counters;
pub mod qp;
mod queues;
mod req;
mod resp;
pub mod transmit;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

pub use counters::{DeviceCounters, QpCounters};
pub use qp::ModifyError;
pub use transmit::{
    Path, Payload, PayloadSeg, PriorityMap, Transmit, Trust, MAX_INLINE, MAX_PAYLOAD_SEGS,
};

use crate::memory::{
    KeyError, Memory, MemoryError, MemoryRegion, MrRef, MrTable, MwType, PdId, Window,
};
use crate::table::Table;
use crate::types::{Gid, Lkey, Psn, Qkey, Qpn, Rkey};
use crate::verbs::{
    Access, AsyncEvent, Completion, Mtu, QpAttr, QpCaps, QpInfo, QpState, QpType, RecvWr,
    SendFlags, SendWr, Sge, WcStatus, WrOp,
};
use crate::wire::ethernet::VlanTag;
use crate::wire::frame::{
    self, ExtHeaders, FrameLayout, FrameRepr, HeaderTemplate, ParsedFrame, SegmentRange,
};
use crate::wire::icrc::{self, Icrc};
use crate::wire::opcode::{Opcode, OpcodeInfo, Transport};
use crate::wire::{bth::BthRepr, ipv4::Ecn};
use qp::Qp;
use queues::{CompletionQueue, RecvQueue, SendWqe};

/// First QP number handed out (QP0 is unused on RoCE and QP1 is the GSI; rxe starts at 17).
pub const QPN_BASE: u32 = 0x11;
/// How many QP numbers there are from `QPN_BASE` up to the largest 24-bit one.
const QPN_SPACE: u32 = (1 << 24) - QPN_BASE;

/// The slot a QP number maps to on a device with `max_qp` QPs: `(qpn - QPN_BASE) mod
/// max_qp`, a dense index below `max_qp` (QP numbers are handed out cyclically, see
/// `Device::create_qp`). Host interfaces index per-QP tables with it and check that the entry
/// is the QP they asked for.
pub fn qp_slot(qpn: Qpn, max_qp: u32) -> Option<usize> {
    let seq = qpn.value().checked_sub(QPN_BASE)?;
    Some(queues::ring_slot(seq as u64, max_qp as usize))
}

/// How the responder fills the credit field of its ACKs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditMode {
    /// Advertise the receive WQEs really available (IBA 9.7.7.2; hardware RNICs do).
    FromReceiveQueue,
    /// Always "no credits advertised" (0x1F), as Linux rxe does.
    Unlimited,
}

/// A device's object limits: what the engine enforces and `query_device` reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceLimits {
    /// Maximum QPs.
    pub max_qp: u32,
    /// Maximum WRs per queue (send, receive, SRQ).
    pub max_qp_wr: u32,
    /// Maximum SGEs per WR.
    pub max_sge: u32,
    /// Maximum CQs.
    pub max_cq: u32,
    /// Maximum CQEs per CQ.
    pub max_cqe: u32,
    /// Maximum MRs.
    pub max_mr: u32,
    /// Maximum memory windows (`max_mw`; they share the MRs' key space).
    #[cfg_attr(feature = "serde", serde(default = "default_max_mw"))]
    pub max_mw: u32,
    /// Maximum PDs.
    pub max_pd: u32,
    /// Maximum outstanding READ/ATOMIC per QP, both directions.
    pub max_qp_rd_atom: u8,
    /// Maximum SRQs.
    pub max_srq: u32,
}

fn default_max_mw() -> u32 {
    4096
}

/// Outstanding READ/ATOMIC a QP may have (`max_qp_rd_atom`, `max_qp_init_rd_atom`) on a
/// device with the default limits.
pub const MAX_QP_RD_ATOM: u8 = 128;

impl Default for DeviceLimits {
    fn default() -> Self {
        DeviceLimits {
            max_qp: 16384,
            max_qp_wr: 4096,
            max_sge: transmit::MAX_PAYLOAD_SEGS as u32,
            max_cq: 1024,
            max_cqe: 65536,
            max_mr: 4096,
            max_mw: default_max_mw(),
            max_pd: 256,
            max_qp_rd_atom: MAX_QP_RD_ATOM,
            max_srq: 256,
        }
    }
}

/// Entries of a port's GID table. Like rxe's (and a ConnectX's), the table is larger than
/// what a port's addresses populate: the populated entries come first, the rest are empty
/// (`ibv_query_gid_ex` answers ENODATA for them), and an address added later has room.
pub const GID_TABLE_LEN: u32 = 16;

/// What [`Device::rereg_mr`] changes; `None` keeps the MR's own.
#[derive(Clone, Default)]
pub struct MrChange {
    /// A new protection domain.
    pub pd: Option<PdId>,
    /// A new translation.
    pub translation: Option<MrTranslation>,
    /// New access flags.
    pub access: Option<Access>,
}

/// The memory an MR translates to: `length` bytes of `mem` from `mem_offset`, seen at
/// `addr`.
#[derive(Clone)]
pub struct MrTranslation {
    /// The memory.
    pub mem: Arc<dyn Memory>,
    /// Offset of `addr` in it.
    pub mem_offset: usize,
    /// The first address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u64,
}

/// Device configuration.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// GID table (index 0 first).
    pub gids: Vec<Gid>,
    /// Active MTU of the port (UD message limit; upper bound for path MTUs).
    pub port_mtu: Mtu,
    /// Object limits.
    pub limits: DeviceLimits,
    /// Unacknowledged PSNs a requester may have outstanding (rxe: 128).
    pub max_unacked_psns: u32,
    /// A requester sets AckReq at least every this many packets (rxe: 64).
    pub ack_every: u32,
    /// Credit advertisement.
    pub credits: CreditMode,
    /// Merge ACKs generated in the same batch of received packets into the last one (an ACK
    /// acknowledges every earlier PSN). Off: one ACK per AckReq packet, as rxe sends them.
    pub coalesce_acks: bool,
    /// ECN congestion control (DCQCN notification and reaction points; off by default, as
    /// in rxe).
    pub cc: cc::CongestionConfig,
    /// How a QP's packets get their priority (PFC class).
    pub priorities: transmit::PriorityMap,
    /// Enhanced Transmission Selection between traffic classes (priority -> class, strict or
    /// a bandwidth share, IEEE 802.1Qaz), validated (`EtsConfig::validate`); `None`: every QP
    /// in one round robin.
    pub ets: Option<dcb::ets::EtsConfig>,
    /// The node GUID (the EUI-64 of the port's MAC, [`crate::types::eui64`]): the CA GUID
    /// the connection manager advertises.
    pub node_guid: u64,
    /// The QP numbers this device hands out (all of them unless the RNIC is spread over
    /// several workers).
    pub qpn_stripe: QpnStripe,
}

/// Which QP numbers a device hands out: those whose sequence number (`qpn - QPN_BASE`) is
/// `index` modulo `count`. An RNIC spread over several workers runs one device per worker,
/// each with its own stripe, so that a QP number alone names the worker that owns the QP
/// ([`QpnStripe::owner`]): a received frame is steered by its BTH's destination QP without a
/// table lookup. A stripe holds `max_qp / count` QPs, so the RNIC as a whole holds `max_qp`
/// (every slot `seq mod max_qp` of a stripe is `index` modulo `count` when `count` divides
/// `max_qp`, which the configuration ensures).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpnStripe {
    /// This device's stripe, below `count`.
    pub index: u32,
    /// How many stripes (devices) share the QP number space.
    pub count: u32,
}

impl QpnStripe {
    /// The whole number space: one device.
    pub const ALL: QpnStripe = QpnStripe { index: 0, count: 1 };

    /// The stripe of `count` that owns QP number `qpn`: the special QPs below `QPN_BASE`
    /// (QP1, the GSI) belong to stripe 0.
    pub fn owner(qpn: Qpn, count: u32) -> u32 {
        match qpn.value().checked_sub(QPN_BASE) {
            Some(seq) if count > 1 => seq % count,
            _ => 0,
        }
    }
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            gids: Vec::new(),
            port_mtu: Mtu::M1024,
            limits: DeviceLimits::default(),
            max_unacked_psns: 128,
            ack_every: 64,
            credits: CreditMode::FromReceiveQueue,
            coalesce_acks: true,
            cc: cc::CongestionConfig::default(),
            priorities: transmit::PriorityMap::default(),
            ets: None,
            node_guid: 0,
            qpn_stripe: QpnStripe::ALL,
        }
    }
}

/// The firmware version `query_device` reports.
pub const FW_VERSION: &str = concat!("ferroce ", env!("CARGO_PKG_VERSION"));

/// What `query_device` reports (`ibv_device_attr`; the firmware version is [`FW_VERSION`]).
/// Plain data, so host interfaces pass it as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceAttr {
    /// Vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Largest MR.
    pub max_mr_size: u64,
    /// The object limits (`max_qp_rd_atom`: outstanding READ/ATOMIC a QP accepts).
    pub limits: DeviceLimits,
    /// Outstanding READ/ATOMIC a QP initiates.
    pub max_qp_init_rd_atom: u8,
    /// Maximum WRs per SRQ.
    pub max_srq_wr: u32,
    /// Maximum SGEs per SRQ WR.
    pub max_srq_sge: u32,
    /// Atomic guarantee: 1 = `IBV_ATOMIC_HCA` (atomic with respect to this device's other
    /// atomics; memory is accessed with CPU atomics, so also to other CPUs' atomics).
    pub atomic_cap: u32,
    /// Inline data per send WR.
    pub max_inline_data: u32,
}

/// What `query_port` reports (`ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Port up.
    pub active: bool,
    /// Largest MTU the port supports.
    pub max_mtu: Mtu,
    /// MTU in use.
    pub active_mtu: Mtu,
    /// GID table length.
    pub gid_tbl_len: u32,
    /// P_Key table length.
    pub pkey_tbl_len: u32,
    /// Always "Ethernet" for RoCE.
    pub link_layer: &'static str,
}

/// How a next hop that held packets ended ([`Device::handle_event`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HopOutcome {
    /// Resolved, and the held packets left at this time.
    Left(u64),
    /// Resolved, the held packets still wait (for a PFC pause).
    Known,
    /// Not resolvable.
    Failed,
}

/// Why [`Device::emit_frame`] built no frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EmitError {
    /// The frame buffer does not fit the frame (or the headers cannot be written).
    #[error("frame: {0}")]
    Wire(#[from] crate::wire::Error),
    /// The payload's memory region went away (or shrank) while the packet was queued.
    #[error("payload: {0}")]
    Memory(#[from] MemoryError),
}

/// Verbs call failures.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbsError {
    /// An argument is out of range or inconsistent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A limit of the device was reached.
    #[error("out of resources: {0}")]
    NoResources(&'static str),
    /// The handle does not exist.
    #[error("no such {0}")]
    NotFound(&'static str),
    /// The object is in use (e.g. a PD with MRs).
    #[error("{0} is in use")]
    Busy(&'static str),
    /// The work queue is full.
    #[error("work queue full")]
    QueueFull,
    /// The QP's state does not allow the call.
    #[error("QP state {0:?} does not allow this")]
    InvalidState(QpState),
    /// `modify_qp` refused.
    #[error("modify_qp: {0}")]
    Modify(#[from] ModifyError),
    /// The device stopped working (its worker ended or died): nothing more can be done on
    /// it (IBV_EVENT_DEVICE_FATAL; verbs calls fail with EIO).
    #[error("the RNIC stopped (device fatal)")]
    DeviceFatal,
    /// The caller may not do this (EPERM), e.g. a privileged Q_Key without privilege.
    #[error("not permitted: {0}")]
    PermissionDenied(String),
}

/// Result of verbs calls.
pub type VerbsResult<T> = Result<T, VerbsError>;

/// How many objects of each kind a device holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ObjectCounts {
    /// Protection domains.
    pub pds: u32,
    /// Memory regions.
    pub mrs: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Queue pairs.
    pub qps: u32,
    /// Shared receive queues.
    pub srqs: u32,
}

/// A completion queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct CqId(pub u32);

/// A shared receive queue handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SrqId(pub u32);

/// Parameters of `create_qp` (`ibv_qp_init_attr`).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpInit {
    /// Protection domain.
    pub pd: PdId,
    /// Transport.
    pub qp_type: QpType,
    /// CQ for send completions.
    pub send_cq: CqId,
    /// CQ for receive completions.
    pub recv_cq: CqId,
    /// Shared receive queue, if any.
    pub srq: Option<SrqId>,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Every send WR generates a completion.
    pub sq_sig_all: bool,
}

impl QpInit {
    /// An RC QP of `pd` with `cq` for both its send and receive completions, default queue
    /// sizes, no SRQ and no implicit signaling: the common case, to adjust with `..`.
    pub fn rc(pd: PdId, cq: CqId) -> QpInit {
        QpInit {
            pd,
            qp_type: QpType::Rc,
            send_cq: cq,
            recv_cq: cq,
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
        }
    }
}

/// SRQ attributes (`ibv_srq_attr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SrqAttr {
    /// Depth.
    pub max_wr: u32,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Limit: an SRQ_LIMIT_REACHED event fires when fewer WQEs remain (0 = disarmed).
    pub srq_limit: u32,
}

pub(crate) struct Srq {
    pub pd: PdId,
    pub rq: RecvQueue,
    pub limit: u32,
    pub users: u32,
    /// In `Shared::moved_srqs`.
    pub moved_noted: bool,
    /// The WQEs, limit and position of an SRQ shared with other devices (`rq` and `limit`
    /// then unused).
    pub shared: Option<Arc<dyn SharedWqes>>,
}

/// The receive WQEs of one SRQ shared by the devices of an RNIC spread over several
/// workers (each device holds the SRQ under the same id, backed by this one queue): every
/// WQE is taken by exactly one device, and the limit fires once. The device stays free of
/// threads; the driver supplies a queue safe to share between them.
pub trait SharedWqes: Send + Sync {
    /// Queues a WQE; false if the SRQ is full.
    fn push(&self, wr_id: u64, sges: &[Sge]) -> bool;
    /// Takes the oldest WQE, its SGEs into `out` (cleared first); returns its wr_id and
    /// whether taking it fired the armed limit (fewer WQEs left than the limit, IBA
    /// 10.2.9.3), which it then disarmed: exactly one taker sees it fire.
    fn pop(&self, out: &mut Vec<Sge>) -> Option<(u64, bool)>;
    /// Arms the limit (0 disarms).
    fn arm(&self, limit: u32);
    /// The armed limit (0: none).
    fn limit(&self) -> u32;
    /// How many WQEs were taken so far (the SRQ's consumer position).
    fn taken(&self) -> u64;
    /// Its depth (`max_wr`) and SGEs per WQE.
    fn shape(&self) -> (u32, u32);
    /// Whether it holds no WQE.
    fn is_empty(&self) -> bool;
}

/// The bytes an inline send WR carries: `data` as given, or gathered from its SGEs now (verbs
/// semantics: the SGEs need not stay valid after the post). Each SGE gets the checks of any
/// local access (key, the QP's PD, bounds): an inline SGE naming another PD's MR must not
/// copy that memory into a packet. `check_send` bounded the length by max_inline_data <=
/// MAX_INLINE.
fn inline_bytes(
    mrs: &MrTable,
    pd: PdId,
    wr: &SendWr<'_>,
    data: Option<&[u8]>,
) -> VerbsResult<([u8; MAX_INLINE], usize)> {
    let mut buf = [0u8; MAX_INLINE];
    let mut len = 0;
    if let Some(d) = data {
        buf[..d.len()].copy_from_slice(d);
        len = d.len();
    }
    for sge in wr.sg_list {
        let (mr, off) = mrs
            .check_local(sge.lkey, pd, sge.addr, sge.length as u64, Access(0))
            .map_err(|e| {
                VerbsError::InvalidArgument(format!(
                    "inline SGE (lkey {:#x}): {}",
                    sge.lkey.0,
                    match e {
                        KeyError::BadKey => "no such MR",
                        KeyError::WrongPd => "MR of another protection domain",
                        KeyError::Access => "access not granted",
                        KeyError::Bounds => "outside its MR",
                    }
                ))
            })?;
        mr.mem
            .read(off, &mut buf[len..len + sge.length as usize])
            .map_err(|_| VerbsError::InvalidArgument("inline SGE unreadable".into()))?;
        len += sge.length as usize;
    }
    Ok((buf, len))
}

/// The checks of a send work request that need only the QP's type and capabilities (not its
/// state or queue): SGE count, operation allowed on the QP type, address handle for UD,
/// message length (2^31, the port MTU for UD, 8 bytes for an ATOMIC), inline length. One
/// function, so that a host interface refusing a post synchronously (`ibv_post_send`'s EINVAL
/// with `bad_wr`) and the engine agree exactly. `inline_len` is the length of inline data
/// already copied (`post_send_inline`); otherwise the SGEs' lengths count. Returns the
/// message length.
pub fn check_send(
    qp_type: QpType,
    caps: &QpCaps,
    port_mtu: u32,
    wr: &SendWr<'_>,
    inline_len: Option<usize>,
) -> VerbsResult<u64> {
    if wr.sg_list.len() > caps.max_send_sge as usize {
        return Err(VerbsError::InvalidArgument(format!(
            "{} SGEs exceed max_send_sge {}",
            wr.sg_list.len(),
            caps.max_send_sge
        )));
    }
    let allowed = match qp_type {
        QpType::Rc => true,
        QpType::Uc => matches!(
            wr.op,
            WrOp::Send
                | WrOp::SendWithImm { .. }
                | WrOp::Write { .. }
                | WrOp::WriteWithImm { .. }
                | WrOp::LocalInv { .. }
                | WrOp::RegMr { .. }
                | WrOp::BindMw { .. }
        ),
        QpType::Ud => matches!(wr.op, WrOp::Send | WrOp::SendWithImm { .. }),
    };
    if !allowed {
        return Err(VerbsError::InvalidArgument(format!(
            "{:?} is not available on a {:?} QP",
            wr.op, qp_type
        )));
    }
    if qp_type == QpType::Ud && wr.ud.is_none() {
        return Err(VerbsError::InvalidArgument(
            "UD sends need an address handle".into(),
        ));
    }
    // A bind carries no data (rxe's provider refuses SGEs on it at post).
    if matches!(wr.op, WrOp::BindMw { .. }) && (!wr.sg_list.is_empty() || inline_len.is_some()) {
        return Err(VerbsError::InvalidArgument(
            "a memory window bind carries no data".into(),
        ));
    }
    let length: u64 = match inline_len {
        Some(n) => n as u64,
        None => wr.sg_list.iter().map(|s| s.length as u64).sum(),
    };
    if length > 1 << 31 {
        return Err(VerbsError::InvalidArgument(format!(
            "message of {length} bytes exceeds 2^31"
        )));
    }
    if qp_type == QpType::Ud && length > port_mtu as u64 {
        return Err(VerbsError::InvalidArgument(format!(
            "UD message of {length} bytes exceeds the port MTU {port_mtu}"
        )));
    }
    if matches!(wr.op, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. }) && length != 8 {
        return Err(VerbsError::InvalidArgument(
            "an ATOMIC needs an 8-byte local buffer".into(),
        ));
    }
    let inline = wr.flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic();
    if inline && length > caps.max_inline_data as u64 {
        return Err(VerbsError::InvalidArgument(format!(
            "{length} inline bytes exceed max_inline_data {}",
            caps.max_inline_data
        )));
    }
    Ok(length)
}

/// Bytes of queue memory the engine allocates for a QP created with `caps` (its send queue,
/// and its receive queue unless it uses an SRQ), so a host interface can count them against
/// the client that asks (rnicd's `host.max_queue_bytes`) before creating it.
pub fn qp_queue_bytes(caps: &QpCaps, srq: bool) -> u64 {
    let sq = queues::send_queue_bytes(
        caps.max_send_wr as usize,
        caps.max_send_sge.max(1) as usize,
        caps.max_inline_data as usize,
    );
    let rq = if srq {
        0
    } else {
        queues::recv_queue_bytes(caps.max_recv_wr as usize, caps.max_recv_sge.max(1) as usize)
    };
    sq.saturating_add(rq)
        .saturating_add(std::mem::size_of::<Qp>() as u64)
}

/// Bytes of queue memory of a CQ of `cqe` entries.
pub fn cq_queue_bytes(cqe: u32) -> u64 {
    queues::completion_queue_bytes(cqe as usize)
}

/// Bytes of queue memory of an SRQ created with `attr`.
pub fn srq_queue_bytes(attr: &SrqAttr) -> u64 {
    queues::recv_queue_bytes(attr.max_wr as usize, attr.max_sge.max(1) as usize)
}

/// State shared by every QP: the parts a role needs besides its own QP.
pub(crate) struct Shared {
    pub cfg: DeviceConfig,
    pub mrs: MrTable,
    pub cqs: Table<CompletionQueue>,
    pub srqs: Table<Srq>,
    pub events: VecDeque<AsyncEvent>,
    pub counters: DeviceCounters,
    pub timers: BinaryHeap<Reverse<(u64, u32)>>,
    /// CQs that just overflowed: their QPs are moved to ERR with a QP_FATAL event.
    pub overflowed: Vec<u32>,
    /// QPs whose queue positions moved since a host last took them (`take_moved`).
    pub moved_qps: Vec<Qpn>,
    /// SRQs that handed out WQEs since a host last took them.
    pub moved_srqs: Vec<SrqId>,
    /// CQs that received completions since a host last took them.
    pub ready_cqs: Vec<CqId>,
}

impl Shared {
    pub fn gid(&self, idx: u8) -> Gid {
        self.cfg.gids.get(idx as usize).copied().unwrap_or_default()
    }

    /// Queues a completion; an overflowing CQ raises CQ_ERR once (IBA 11.4.2.1).
    pub fn complete(&mut self, cq: u32, c: Completion) {
        if let Some(q) = self.cqs.get_mut(cq as usize) {
            if !q.ready_noted {
                q.ready_noted = true;
                self.ready_cqs.push(CqId(cq));
            }
            let was = q.overflowed;
            if !q.push(c) {
                self.counters.cq_overflows += 1;
                if !was {
                    self.events.push_back(AsyncEvent::CqError(cq));
                    self.overflowed.push(cq);
                }
            }
        }
    }

    pub fn srq_pop(&mut self, srq: u32, out: &mut Vec<Sge>) -> Option<u64> {
        let s = self.srqs.get_mut(srq as usize)?;
        let (id, fired) = match &s.shared {
            Some(w) => w.pop(out)?,
            None => {
                let id = s.rq.pop_into(out)?;
                // The limit is a one-shot trigger; the application re-arms it (IBA
                // 10.2.9.3).
                let fired = s.limit > 0 && (s.rq.len() as u32) < s.limit;
                if fired {
                    s.limit = 0;
                }
                (id, fired)
            }
        };
        if !s.moved_noted {
            s.moved_noted = true;
            self.moved_srqs.push(SrqId(srq));
        }
        if fired {
            self.events.push_back(AsyncEvent::SrqLimitReached(srq));
        }
        Some(id)
    }

    /// Invalidates the MR or memory window whose rkey (or lkey) is `key`, if it belongs to
    /// `pd` (LOCAL_INV; or SEND with Invalidate from the peer, received on the QP `remote`).
    /// Only a fast-registration MR (`alloc_mr`) can be invalidated, as rxe's
    /// `rxe_invalidate_mr` refuses any MR that is not of type IB_MR_TYPE_MEM_REG: an MR from
    /// `reg_mr` is revoked only by deregistering it, so a peer cannot take it away with SEND
    /// with Invalidate; nor can an MR with windows bound to it. Of windows, only a bound type
    /// 2 window can be invalidated (a type 1 window is unbound by binding it with length 0,
    /// IBA o10-37.2.26), remotely only through the QP it is bound to; it becomes FREE and
    /// keeps its key. The status: Success, or the one the caller reports
    /// (LOC_QP_OP_ERR locally, the receive's REM_INV_REQ_ERR remotely).
    pub fn invalidate(&mut self, key: u32, pd: PdId, remote: Option<Qpn>) -> WcStatus {
        let idx = key >> 8;
        let reg = self.mrs.take_reg();
        let Some(mr) = self.mrs.get_mut_by_index(idx) else {
            return WcStatus::LocProtErr;
        };
        let keyed = mr.lkey.0 == key || mr.rkey.map(|r| r.0) == Some(key);
        if let Some(w) = mr.window {
            let ok = keyed
                && mr.pd == pd
                && mr.valid
                && w.ty == MwType::Two
                && remote.is_none_or(|q| w.qp == Some(q));
            if !ok {
                return WcStatus::LocProtErr;
            }
            mr.valid = false;
            mr.reg = reg;
            mr.length = 0;
            mr.access = Access(0);
            mr.window = Some(Window {
                qp: None,
                mr: None,
                ..w
            });
            if let Some(under) = w.mr {
                self.unbound_from(under.lkey);
            }
            return WcStatus::Success;
        }
        if mr.pd == pd && mr.fast_reg && keyed && mr.windows == 0 {
            if !mr.valid {
                return WcStatus::LocProtErr;
            }
            mr.valid = false;
            return WcStatus::Success;
        }
        WcStatus::LocProtErr
    }

    /// A window bound to the MR `lkey` let go of it.
    fn unbound_from(&mut self, lkey: Lkey) {
        if let Some(m) = self.mrs.get_mut_by_index(lkey.index()) {
            m.windows = m.windows.saturating_sub(1);
        }
    }

    /// Executes the memory window bind `bind` (a `WrOp::BindMw`; IBA 10.6.7.2;
    /// rxe_check_bind_mw, rxe_do_bind_mw) from the QP `qpn` of protection domain `pd`:
    /// MW_BIND_ERR for any rule broken, and then the caller moves the QP to the error state.
    pub fn bind_mw(&mut self, qpn: Qpn, pd: PdId, bind: &WrOp) -> WcStatus {
        const ERR: WcStatus = WcStatus::MwBindErr;
        let WrOp::BindMw {
            mw,
            rkey: new_key,
            mr: mr_lkey,
            addr,
            length,
            access,
        } = *bind
        else {
            return ERR;
        };
        // The window, by its exact current key (a stale key fails).
        let Some(win) = self
            .mrs
            .get_mut_by_index(mw.index())
            .filter(|m| m.rkey == Some(mw))
            .map(|m| (m.window, m.valid, m.pd))
        else {
            return ERR;
        };
        let (Some(w), valid, mw_pd) = win else {
            return ERR;
        };
        if access.0 & !Access::MW_ALLOWED.0 != 0 {
            return ERR;
        }
        let zero_based = access.contains(Access::ZERO_BASED);
        match w.ty {
            // A type 1 window is VALID from allocation on; it cannot be zero-based. It is
            // bound from a QP of its own PD, as its MR must be of it (C10-73): the QP, the
            // window and the MR share one PD (IBA 10.6.7.2). rxe checks the QP's PD for type
            // 2 only, leaving type 1 to the kernel's object lookup, which finds only the
            // caller's own windows; here the key names the window, so without this check a
            // tenant could rebind another's window over the other's memory.
            MwType::One if !valid || zero_based || pd != mw_pd => return ERR,
            // A type 2 window must be FREE, bound from a QP of its own PD, with an MR and a
            // length (o10-37.2.30, C10-72, o10-37.2.40).
            MwType::Two if valid || pd != mw_pd || length == 0 => return ERR,
            _ => {}
        }
        // The MR (when binding, not unbinding a type 1 window).
        let target = if length == 0 {
            None
        } else {
            let Some(mr) = self.mrs.get(mr_lkey) else {
                return ERR;
            };
            // The window is the MR's range addr..addr+length, zero-based or not (with
            // ZERO_BASED only the addresses peers use start at 0; rxe checks just the length
            // then, ferroce the range).
            let range_ok = mr.offset_of(addr, length).is_some();
            let needs_local =
                access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
            if !mr.valid
                || mr.window.is_some()
                || mr.pd != mw_pd
                || !mr.access.contains(Access::MW_BIND)
                || (needs_local && !mr.access.contains(Access::LOCAL_WRITE))
                || !range_ok
            {
                return ERR;
            }
            let off = mr.offset_of(addr, length).expect("checked");
            Some((mr.as_ref(), mr.mem.clone(), off))
        };
        let reg = self.mrs.take_reg();
        if let Some(old) = w.mr {
            self.unbound_from(old.lkey);
        }
        if let Some((r, _, _)) = &target {
            if let Some(m) = self.mrs.get_mut_by_index(r.lkey.index()) {
                m.windows += 1;
            }
        }
        let m = self
            .mrs
            .get_mut_by_index(mw.index())
            .expect("looked up above");
        // Only the key byte comes from the work request (rxe_do_bind_mw).
        let key = Rkey((mw.0 & !0xff) | (new_key.0 & 0xff));
        m.lkey = Lkey(key.0);
        m.rkey = Some(key);
        m.reg = reg;
        m.valid = true;
        m.access = Access(access.0 & !(Access::ZERO_BASED.0 | Access::LOCAL_WRITE.0));
        m.length = length;
        // Zero-based: peers address the window from 0.
        m.addr = if zero_based { 0 } else { addr };
        match target {
            Some((r, mem, off)) => {
                m.mem = mem;
                m.mem_offset = off;
                m.window = Some(Window {
                    ty: w.ty,
                    qp: (w.ty == MwType::Two).then_some(qpn),
                    mr: Some(r),
                });
            }
            None => {
                m.window = Some(Window {
                    ty: w.ty,
                    qp: None,
                    mr: None,
                });
            }
        }
        WcStatus::Success
    }

    /// Fast registration (IBA 10.6.3.6): re-binds an MR allocated for it to a new range,
    /// access and key byte; it must be invalid (freshly allocated or invalidated).
    pub fn fast_register(
        &mut self,
        lkey: Lkey,
        key: u8,
        addr: u64,
        length: u64,
        access: Access,
        pd: PdId,
    ) -> WcStatus {
        let reg = self.mrs.take_reg();
        let Some(mr) = self.mrs.get_mut_by_index(lkey.index()) else {
            return WcStatus::LocProtErr;
        };
        if mr.pd != pd || !mr.fast_reg || mr.valid || mr.lkey.index() != lkey.index() {
            return WcStatus::LocProtErr;
        }
        // The backing memory bounds the new range, and the range may not wrap.
        if length > mr.mem.len() as u64 {
            return WcStatus::LocLenErr;
        }
        if addr.checked_add(length).is_none() {
            return WcStatus::LocQpOpErr;
        }
        // The same access rules as reg_mr: only known flags, and remote write or atomic needs
        // local write (IBA 10.6.3.1). rxe completes any refused REG_MR with LOC_QP_OP_ERR.
        if !access_is_valid(access) {
            return WcStatus::LocQpOpErr;
        }
        let new = (lkey.index() << 8) | key as u32;
        // A new binding is a new registration: references to the old one stay dead.
        mr.reg = reg;
        mr.lkey = Lkey(new);
        mr.rkey = access.any_remote().then_some(Rkey(new));
        mr.addr = addr;
        mr.length = length;
        mr.access = access;
        mr.mem_offset = 0;
        mr.valid = true;
        WcStatus::Success
    }
}

/// Whether an MR's access flags are a valid combination: only flags ferroce implements, and
/// remote write or atomic only with local write (IBA 10.6.3.1).
fn access_is_valid(access: Access) -> bool {
    let needs_local =
        access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_ATOMIC);
    access.0 & !Access::ALL.0 == 0 && (!needs_local || access.contains(Access::LOCAL_WRITE))
}

/// A request or response packet as the roles see it.
///
/// It borrows the parsed headers rather than copying them: a packet is handed to the roles
/// once per frame, and the extended headers alone are some 150 bytes.
pub(crate) struct Pkt<'a> {
    pub bth: &'a BthRepr,
    pub ext: &'a ExtHeaders,
    pub info: &'static OpcodeInfo,
    pub segs: &'a [&'a [u8]],
    pub payload_off: usize,
    pub payload_len: usize,
    /// Where the IP header lies in the segments, and its length.
    l3_off: usize,
    l3_len: usize,
}

impl<'a> Pkt<'a> {
    /// The payload, as slices of the frame's segments.
    pub fn payload(&self) -> SegmentRange<'a, 'a> {
        SegmentRange::new(
            self.segs,
            self.payload_off,
            self.payload_off + self.payload_len,
        )
    }

    /// Copies the IP header into `out` (for the UD GRH; only a UD receive needs it, so it is
    /// gathered then and not for every packet); returns its length.
    pub fn l3_header(&self, out: &mut [u8; 60]) -> usize {
        frame::copy_range(self.segs, self.l3_off, self.l3_off + self.l3_len, out)
    }

    /// Writes the payload to `mem` at `offset`, in ascending order.
    pub fn write_payload(&self, mem: &dyn Memory, offset: usize) -> Result<(), MemoryError> {
        let mut at = offset;
        for piece in self.payload() {
            mem.write(at, piece)?;
            at += piece.len();
        }
        Ok(())
    }
}

/// Scatters the packet payload into `sges` starting `msg_off` bytes into the message. The
/// MRs must grant LOCAL_WRITE in `pd`.
pub(crate) fn scatter(
    mrs: &MrTable,
    pd: PdId,
    sges: &[Sge],
    msg_off: u64,
    pkt: &Pkt<'_>,
) -> Result<(), WcStatus> {
    scatter_iter(mrs, pd, sges, msg_off, pkt.payload())
}

/// Scatters `bytes` into `sges` at `msg_off`.
pub(crate) fn scatter_bytes(
    mrs: &MrTable,
    pd: PdId,
    sges: &[Sge],
    msg_off: u64,
    bytes: &[u8],
) -> Result<(), WcStatus> {
    scatter_iter(mrs, pd, sges, msg_off, std::iter::once(bytes))
}

fn scatter_iter<'b>(
    mrs: &MrTable,
    pd: PdId,
    sges: &[Sge],
    msg_off: u64,
    pieces: impl Iterator<Item = &'b [u8]>,
) -> Result<(), WcStatus> {
    let mut sge_idx = 0;
    let mut within = msg_off;
    // Find the SGE where `msg_off` falls.
    while sge_idx < sges.len() && within >= sges[sge_idx].length as u64 {
        within -= sges[sge_idx].length as u64;
        sge_idx += 1;
    }
    for mut piece in pieces {
        while !piece.is_empty() {
            let Some(sge) = sges.get(sge_idx) else {
                return Err(WcStatus::LocLenErr);
            };
            let room = sge.length as u64 - within;
            if room == 0 {
                sge_idx += 1;
                within = 0;
                continue;
            }
            let n = (piece.len() as u64).min(room);
            let (mr, off) = mrs
                .check_local(sge.lkey, pd, sge.addr + within, n, Access::LOCAL_WRITE)
                .map_err(|_: KeyError| WcStatus::LocProtErr)?;
            mr.mem
                .write(off, &piece[..n as usize])
                .map_err(|_| WcStatus::LocProtErr)?;
            piece = &piece[n as usize..];
            within += n;
        }
    }
    Ok(())
}

/// What the driver of a [`Device`] tells it about conditions of its own (next hops, posts
/// it took from an application but could not hand over): [`Device::handle_event`].
#[derive(Debug, Clone, Copy)]
pub enum DeviceEvent<'a> {
    /// The driver holds `qpn`'s packet while it resolves the next hop towards `dgid`: until
    /// `PathResolved`, an RC QP's ACK timeouts cost no retry (the packets have not left),
    /// and a UD or UC QP sends nothing more (its next sends wait in its send queue).
    PathHeld {
        /// The QP.
        qpn: Qpn,
        /// The held packet's destination.
        dgid: Gid,
    },
    /// The next hop towards `dgid` is resolved and the held packets left at `now`: QPs
    /// holding for it count their ACK timeout from then.
    PathResolved {
        /// The destination.
        dgid: Gid,
        /// When the held packets left.
        now: u64,
    },
    /// The next hop towards `dgid` is resolved but the held packets cannot leave yet (their
    /// priority is paused by PFC): UD and UC QPs held for it go on with their other sends (a
    /// UD QP's datagrams on an unpaused priority need not wait for the pause; anything on
    /// the paused one waits for it as usual), while RC QPs stay held until `PathResolved`
    /// says their packets left, which is what their ACK timers count from.
    PathKnown {
        /// The destination.
        dgid: Gid,
    },
    /// The next hop towards `dgid` cannot be resolved: every connected QP on that path goes
    /// to ERR with a QP_FATAL event (vendor_err PEER_UNREACHABLE), so applications get a
    /// clear error instead of waiting for the retry counter. A UD QP held for it goes on
    /// (its datagram is lost, as on a network); a UC QP goes to ERR like an RC one.
    PathUnreachable {
        /// The destination.
        dgid: Gid,
    },
    /// A send WR the driver took from an application but `post_send` refused (a check the
    /// application side could not make, or a dishonest client). It still takes its place in
    /// the send queue - so the position the application counts on advances when it retires -
    /// and completes with LOC_QP_OP_ERR in order, moving the QP to the error state as a WQE
    /// the RNIC cannot execute does. Where it cannot be queued (the send queue is full or
    /// the QP not ready to send) it completes at once, out of order.
    SendRejected {
        /// The QP.
        qpn: Qpn,
        /// The work request as posted.
        wr: &'a SendWr<'a>,
    },
    /// A receive WR the driver took but `post_recv` refused: completes with LOC_QP_OP_ERR
    /// on the QP's receive CQ.
    RecvRejected {
        /// The QP.
        qpn: Qpn,
        /// The work request's id.
        wr_id: u64,
    },
}

/// The RDMA engine of one device (see the module documentation).
pub struct Device {
    sh: Shared,
    qps: Vec<Option<Box<Qp>>>,
    /// Sequence number of the next QP number to try (cyclic, see `create_qp`).
    next_qpn_seq: u32,
    /// The counters of QPs already destroyed, summed (part of the port totals).
    destroyed_qp_counters: QpCounters,
    /// Port totals of the QP counters kept up to date a slice of QPs at a time
    /// (`counters_incremental`): every QP's `counted`, plus the destroyed QPs'.
    running_qp_counters: QpCounters,
    /// Where `counters_incremental` goes on.
    running_cursor: usize,
    /// QPs that exist.
    live_qps: u32,
    /// PDs by id - 1 (PD ids start at 1).
    pds: Table<()>,
    /// Memory windows allocated (they share the MR table).
    mws: usize,
    /// QPs with something to send: one round-robin queue per traffic class (only the first
    /// without ETS).
    ready: [VecDeque<u32>; dcb::ets::TCS],
    /// The ETS scheduler between the classes' queues.
    ets: Option<dcb::ets::Ets>,
    /// Priorities the peer paused (PFC; bit n = priority n) and the QPs held for it.
    paused: u8,
    parked: Vec<u32>,
    /// QPs that owe a CNP, in the order they came to owe it: CNPs go ahead of every ETS
    /// class (dcb.md: CNPs travel on strict priority). An entry per CNP owed; an entry left
    /// by a QP reset or destroyed meanwhile sends nothing, or what its slot's QP owes now.
    cnp_due: VecDeque<u32>,
    port_active: bool,
    /// The connection manager of the port, fed by the GSI (QP1).
    cm: crate::cm::CmAgent,
    /// PSN of the next MAD the GSI sends (UD: it only counts).
    gsi_psn: Psn,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("gids", &self.sh.cfg.gids)
            .field("qps", &self.qps.iter().flatten().count())
            .field("mrs", &self.sh.mrs.len())
            .finish()
    }
}

/// The priority CNPs travel on (`np_cnp_dscp` / `np_cnp_prio` through the priority map),
/// whatever their QP's data priority.
fn cnp_priority(cfg: &DeviceConfig) -> u8 {
    cfg.priorities
        .priority(cfg.cc.cnp_dscp << 2, cfg.cc.cnp_prio)
}

/// The ETS traffic class a ready QP waits in: that of its next packet's priority (class 0
/// for all without ETS). A free function so that it can be called with a QP borrowed from
/// the device.
fn traffic_class(ets: &Option<dcb::ets::Ets>, qp: &Qp, sh: &Shared) -> usize {
    ets.as_ref().map_or(0, |e| e.tc_of(qp.tx_priority(sh)))
}

/// The slot of the live QP numbered `qpn` among `qps` (see `Device::slot_of`).
fn live_slot(qps: &[Option<Box<Qp>>], max_qp: u32, qpn: Qpn) -> Option<usize> {
    let slot = qp_slot(qpn, max_qp)?;
    match qps.get(slot) {
        Some(Some(q)) if q.qpn == qpn => Some(slot),
        _ => None,
    }
}

/// The slot and the QP of the live QP numbered `qpn` among `qps`; a function of the table
/// alone, so that the caller may still use the device's other fields while holding the QP.
fn live_qp_mut(
    qps: &mut [Option<Box<Qp>>],
    max_qp: u32,
    qpn: Qpn,
) -> VerbsResult<(usize, &mut Qp)> {
    let slot = live_slot(qps, max_qp, qpn).ok_or(VerbsError::NotFound("queue pair"))?;
    let qp = qps[slot].as_deref_mut().expect("a live slot holds its QP");
    Ok((slot, qp))
}

/// Queues QP `slot` for the CNP turn. A QP owes at most one CNP at a time, but one reset or
/// destroyed (and its slot reused) while the CNP priority is paused leaves an entry behind
/// that owes nothing: past one entry per slot the queue drops those and repeats, so it stays
/// within about the QP table's size however long the pause.
fn owe_cnp(due: &mut VecDeque<u32>, qps: &[Option<Box<Qp>>], slot: u32) {
    if due.len() >= qps.len() {
        let mut seen = vec![false; qps.len()];
        due.retain(|&s| {
            let owes = matches!(qps.get(s as usize), Some(Some(q)) if q.owes_cnp());
            owes && !std::mem::replace(&mut seen[s as usize], true)
        });
    }
    due.push_back(slot);
}

/// Inserts `v` into a resource table; a full table is the verbs' "no resources" for `what`.
fn insert_or_exhausted<T>(t: &mut Table<T>, v: T, what: &'static str) -> VerbsResult<usize> {
    t.insert(v).ok_or(VerbsError::NoResources(what))
}

/// Stores `v` under the id `id` another device chose (a replica): `Busy` if it is taken here,
/// `NoResources` if it is past the table.
fn insert_given<T>(t: &mut Table<T>, id: usize, v: T, what: &'static str) -> VerbsResult<()> {
    if t.contains(id) {
        return Err(VerbsError::Busy(what));
    }
    t.insert_at(id, v)
        .map(|_| ())
        .map_err(|_| VerbsError::NoResources(what))
}

/// The live entry `id` of a resource table; a free slot is the verbs' "not found" for `what`.
fn lookup_mut<'t, T>(t: &'t mut Table<T>, id: u32, what: &'static str) -> VerbsResult<&'t mut T> {
    t.get_mut(id as usize).ok_or(VerbsError::NotFound(what))
}

impl Device {
    /// A device with the given configuration.
    pub fn new(cfg: DeviceConfig) -> Device {
        let max_mr = cfg.limits.max_mr as usize + cfg.limits.max_mw as usize;
        let l = cfg.limits;
        let cfg_ets = cfg.ets;
        let cfg_stripe = cfg.qpn_stripe;
        let node_guid = cfg.node_guid;
        Device {
            sh: Shared {
                cfg,
                mrs: MrTable::new(max_mr),
                cqs: Table::new(l.max_cq as usize),
                srqs: Table::new(l.max_srq as usize),
                events: VecDeque::new(),
                counters: DeviceCounters::default(),
                timers: BinaryHeap::new(),
                overflowed: Vec::new(),
                moved_qps: Vec::with_capacity(64),
                moved_srqs: Vec::with_capacity(16),
                ready_cqs: Vec::with_capacity(16),
            },
            qps: Vec::new(),
            next_qpn_seq: cfg_stripe.index,
            destroyed_qp_counters: QpCounters::default(),
            running_qp_counters: QpCounters::default(),
            running_cursor: 0,
            live_qps: 0,
            pds: Table::new(l.max_pd as usize),
            mws: 0,
            ready: Default::default(),
            ets: cfg_ets.and_then(|c| dcb::ets::Ets::new(c).ok()),
            paused: 0,
            parked: Vec::new(),
            cnp_due: VecDeque::new(),
            port_active: true,
            // One agent per device: on an RNIC over several workers, each worker's agent
            // hands out communication IDs of its own stripe, as its device does QP numbers.
            cm: crate::cm::CmAgent::new(crate::cm::CmConfig {
                ca_guid: node_guid,
                id_stripe: cfg_stripe,
                ..Default::default()
            }),
            gsi_psn: Psn::new(0),
        }
    }

    /// The port's connection manager: the consumer (rdma_cm) listens, connects, accepts
    /// and disconnects through it and takes its events; its MADs go out with
    /// [`Device::poll_transmit`] and come in with the frames to QP1.
    pub fn cm(&mut self) -> &mut crate::cm::CmAgent {
        &mut self.cm
    }

    /// The configuration.
    pub fn config(&self) -> &DeviceConfig {
        &self.sh.cfg
    }

    /// The GID table.
    pub fn gids(&self) -> &[Gid] {
        &self.sh.cfg.gids
    }

    /// Replaces the GID table (addresses configured or changed by the dataplane).
    pub fn set_gids(&mut self, gids: Vec<Gid>) {
        self.sh.cfg.gids = gids;
    }

    /// Whether `gid` is one of ours.
    pub fn is_our_gid(&self, gid: &Gid) -> bool {
        self.sh.cfg.gids.contains(gid)
    }

    /// `query_device`.
    pub fn attr(&self) -> DeviceAttr {
        let l = self.sh.cfg.limits;
        DeviceAttr {
            vendor_id: 0xffffff,
            vendor_part_id: 0,
            max_mr_size: u64::MAX,
            limits: l,
            max_qp_init_rd_atom: l.max_qp_rd_atom,
            max_srq_wr: l.max_qp_wr,
            max_srq_sge: l.max_sge,
            atomic_cap: 1,
            max_inline_data: MAX_INLINE as u32,
        }
    }

    /// `query_port` (port 1).
    pub fn port_attr(&self) -> PortAttr {
        PortAttr {
            active: self.port_active,
            max_mtu: Mtu::M4096,
            active_mtu: self.sh.cfg.port_mtu,
            gid_tbl_len: (self.sh.cfg.gids.len() as u32).max(GID_TABLE_LEN),
            pkey_tbl_len: 1,
            link_layer: "Ethernet",
        }
    }

    /// Link state changes, reported by the dataplane; raises PORT_ACTIVE / PORT_ERR.
    pub fn set_port_active(&mut self, active: bool) {
        if active != self.port_active {
            self.port_active = active;
            self.sh.events.push_back(if active {
                AsyncEvent::PortActive
            } else {
                AsyncEvent::PortError
            });
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&mut self) -> VerbsResult<PdId> {
        let i = insert_or_exhausted(&mut self.pds, (), "protection domains")?;
        Ok(PdId(i as u32 + 1))
    }

    /// Allocates the protection domain `pd` (the replica of one another worker's device
    /// allocated: see [`Device::reg_mr_at`]); `Busy` if it exists here.
    pub fn alloc_pd_at(&mut self, pd: PdId) -> VerbsResult<()> {
        let i = (pd.0 as usize)
            .checked_sub(1)
            .ok_or(VerbsError::NotFound("protection domain"))?;
        insert_given(&mut self.pds, i, (), "protection domain")
    }

    fn pd_ok(&self, pd: PdId) -> bool {
        pd.0 >= 1 && self.pds.contains(pd.0 as usize - 1)
    }

    /// Deallocates a PD; it must have no MRs, QPs or SRQs.
    pub fn dealloc_pd(&mut self, pd: PdId) -> VerbsResult<()> {
        if !self.pd_ok(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        let in_use = self.sh.mrs.count_in_pd(pd) > 0
            || self.qps.iter().flatten().any(|q| q.pd == pd)
            || self.sh.srqs.values().any(|s| s.pd == pd);
        if in_use {
            return Err(VerbsError::Busy("protection domain"));
        }
        self.pds.remove(pd.0 as usize - 1);
        Ok(())
    }

    /// Registers `length` bytes of `mem` starting at `mem_offset` as an MR at address
    /// `addr`. Returns the lkey and, with remote access, the rkey (equal to the lkey, as rxe).
    pub fn reg_mr(
        &mut self,
        pd: PdId,
        mem: Arc<dyn Memory>,
        mem_offset: usize,
        addr: u64,
        length: u64,
        access: Access,
    ) -> VerbsResult<(Lkey, Option<Rkey>)> {
        self.reg_mr_keyed(None, pd, mem, mem_offset, addr, length, access)
    }

    /// [`Device::reg_mr`] under exactly the key `lkey` (with remote access, the rkey equal
    /// to it): the replica, on another worker's device, of a registration made by
    /// [`Device::reg_mr`] (an RNIC spread over several workers keeps every context's MRs
    /// on each of them under the same keys, which the context's peers hold).
    /// `NoResources` if the key's index is in use here or the table is full.
    #[allow(clippy::too_many_arguments)]
    pub fn reg_mr_at(
        &mut self,
        lkey: Lkey,
        pd: PdId,
        mem: Arc<dyn Memory>,
        mem_offset: usize,
        addr: u64,
        length: u64,
        access: Access,
    ) -> VerbsResult<(Lkey, Option<Rkey>)> {
        self.reg_mr_keyed(Some(lkey), pd, mem, mem_offset, addr, length, access)
    }

    #[allow(clippy::too_many_arguments)]
    fn reg_mr_keyed(
        &mut self,
        at: Option<Lkey>,
        pd: PdId,
        mem: Arc<dyn Memory>,
        mem_offset: usize,
        addr: u64,
        length: u64,
        access: Access,
    ) -> VerbsResult<(Lkey, Option<Rkey>)> {
        if !self.pd_ok(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if access.0 & !Access::ALL.0 != 0 {
            return Err(VerbsError::InvalidArgument(format!(
                "unknown access flags {:#x}",
                access.0
            )));
        }
        if !access_is_valid(access) {
            return Err(VerbsError::InvalidArgument(
                "REMOTE_WRITE and REMOTE_ATOMIC require LOCAL_WRITE".into(),
            ));
        }
        if self.sh.mrs.len() - self.mws >= self.sh.cfg.limits.max_mr as usize {
            return Err(VerbsError::NoResources("memory regions"));
        }
        let end = (mem_offset as u64).checked_add(length);
        if end.is_none_or(|e| e > mem.len() as u64) || addr.checked_add(length).is_none() {
            return Err(VerbsError::InvalidArgument(format!(
                "region of {length} bytes at offset {mem_offset} exceeds its memory ({} bytes)",
                mem.len()
            )));
        }
        let make = |lkey: Lkey| MemoryRegion {
            rkey: access.any_remote().then_some(Rkey(lkey.0)),
            access,
            addr,
            length,
            mem_offset,
            ..MemoryRegion::blank(pd, lkey, mem)
        };
        let lkey = match at {
            None => self.sh.mrs.insert(make),
            Some(k) => self.sh.mrs.insert_at(k, make),
        }
        .ok_or(VerbsError::NoResources("memory regions"))?;
        Ok((lkey, self.sh.mrs.get(lkey).and_then(|m| m.rkey)))
    }

    /// Allocates an MR for fast registration (`ibv_alloc_mr`): invalid until a REG_MR work
    /// request binds it to a range of `mem`.
    pub fn alloc_mr(&mut self, pd: PdId, mem: Arc<dyn Memory>) -> VerbsResult<Lkey> {
        if !self.pd_ok(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if self.sh.mrs.len() - self.mws >= self.sh.cfg.limits.max_mr as usize {
            return Err(VerbsError::NoResources("memory regions"));
        }
        self.sh
            .mrs
            .insert(|lkey| MemoryRegion {
                fast_reg: true,
                valid: false,
                ..MemoryRegion::blank(pd, lkey, mem)
            })
            .ok_or(VerbsError::NoResources("memory regions"))
    }

    /// Re-registers the MR `lkey` (`ibv_rereg_mr`): a new protection domain, translation
    /// (memory, offset, address, length) and/or access, keeping its keys, as mlx5 does (test
    /// suites and programs written for hardware keep using the keys they sent their peers).
    /// It is a new registration all the same: references held across packets to the old one
    /// (a WRITE or READ in progress) fail from now on, so the old translation and access are
    /// never reachable afterwards. Nothing changes if a check fails. An MR allocated for fast
    /// registration is re-bound by REG_MR work requests instead (`InvalidArgument`).
    pub fn rereg_mr(&mut self, lkey: Lkey, change: MrChange) -> VerbsResult<(Lkey, Option<Rkey>)> {
        match self.sh.mrs.get(lkey) {
            Some(mr) if mr.fast_reg => {
                return Err(VerbsError::InvalidArgument(
                    "an MR for fast registration is re-bound by REG_MR work requests".into(),
                ))
            }
            Some(mr) if mr.windows > 0 => {
                return Err(VerbsError::InvalidArgument(
                    "memory windows are bound to the MR".into(),
                ))
            }
            Some(mr) if mr.window.is_none() => {}
            _ => return Err(VerbsError::NotFound("memory region")),
        }
        if let Some(pd) = change.pd {
            if !self.pd_ok(pd) {
                return Err(VerbsError::NotFound("protection domain"));
            }
        }
        if let Some(access) = change.access {
            if !access_is_valid(access) {
                return Err(VerbsError::InvalidArgument(format!(
                    "access {:#x}: unknown flags, or REMOTE_WRITE/REMOTE_ATOMIC without \
                     LOCAL_WRITE",
                    access.0
                )));
            }
        }
        if let Some(t) = &change.translation {
            let end = (t.mem_offset as u64).checked_add(t.length);
            if end.is_none_or(|e| e > t.mem.len() as u64) || t.addr.checked_add(t.length).is_none()
            {
                return Err(VerbsError::InvalidArgument(format!(
                    "region of {} bytes at offset {} exceeds its memory ({} bytes)",
                    t.length,
                    t.mem_offset,
                    t.mem.len()
                )));
            }
        }
        let reg = self.sh.mrs.take_reg();
        let mr = self
            .sh
            .mrs
            .get_mut_by_index(lkey.index())
            .expect("checked above");
        mr.reg = reg;
        if let Some(pd) = change.pd {
            mr.pd = pd;
        }
        if let Some(access) = change.access {
            mr.access = access;
            mr.rkey = access.any_remote().then_some(Rkey(lkey.0));
        }
        if let Some(t) = change.translation {
            mr.mem = t.mem;
            mr.mem_offset = t.mem_offset;
            mr.addr = t.addr;
            mr.length = t.length;
        }
        Ok((mr.lkey, mr.rkey))
    }

    /// Allocates a memory window of type `ty` in `pd` (`ibv_alloc_mw`); returns its key. A
    /// type 1 window starts valid with nothing bound (length 0, so unusable), a type 2
    /// window FREE (rxe_alloc_mw). They count against `max_mw`.
    pub fn alloc_mw(&mut self, pd: PdId, ty: MwType) -> VerbsResult<Rkey> {
        if !self.pd_ok(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if self.mws >= self.sh.cfg.limits.max_mw as usize {
            return Err(VerbsError::NoResources("memory windows"));
        }
        let mem: Arc<dyn Memory> = Arc::new(crate::memory::HeapMemory::new(0));
        let key = self
            .sh
            .mrs
            .insert(|lkey| MemoryRegion {
                rkey: Some(Rkey(lkey.0)),
                // A type 1 window is valid from allocation on (bound with length 0).
                valid: ty == MwType::One,
                window: Some(Window {
                    ty,
                    qp: None,
                    mr: None,
                }),
                ..MemoryRegion::blank(pd, lkey, mem)
            })
            .ok_or(VerbsError::NoResources("memory windows"))?;
        self.mws += 1;
        Ok(Rkey(key.0))
    }

    /// Deallocates a memory window (`ibv_dealloc_mw`) by its index (any key byte: its key
    /// changes with each bind); a bound window is unbound first (IBA 10.6.7.1).
    pub fn dealloc_mw(&mut self, mw: Rkey) -> VerbsResult<()> {
        let (key, under) = match self.sh.mrs.get_mut_by_index(mw.index()) {
            Some(m) if m.window.is_some() => (m.lkey, m.window.and_then(|w| w.mr)),
            _ => return Err(VerbsError::NotFound("memory window")),
        };
        if let Some(u) = under {
            self.sh.unbound_from(u.lkey);
        }
        self.sh.mrs.remove(key);
        self.mws -= 1;
        Ok(())
    }

    /// The window with index `mw.index()`: its current key and whether it is bound.
    pub fn mw_key(&self, mw: Rkey) -> Option<(Rkey, bool)> {
        self.sh
            .mrs
            .by_index(mw.index())
            .filter(|m| m.window.is_some())
            .map(|m| (Rkey(m.lkey.0), m.valid))
    }

    /// Deregisters an MR (by its current lkey, or for fast-registration MRs any key of it).
    /// An MR with memory windows bound to it cannot go (IBA 10.6.7.2.6; rxe answers EINVAL).
    pub fn dereg_mr(&mut self, lkey: Lkey) -> VerbsResult<()> {
        let key = match self.sh.mrs.get_mut_by_index(lkey.index()) {
            Some(mr) if mr.window.is_some() => return Err(VerbsError::NotFound("memory region")),
            Some(mr) if mr.windows > 0 => {
                return Err(VerbsError::InvalidArgument(format!(
                    "{} memory window(s) bound to the MR",
                    mr.windows
                )))
            }
            Some(mr) if mr.lkey == lkey || mr.fast_reg => mr.lkey,
            _ => return Err(VerbsError::NotFound("memory region")),
        };
        self.sh
            .mrs
            .remove(key)
            .map(|_| ())
            .ok_or(VerbsError::NotFound("memory region"))
    }

    /// The MR with this lkey.
    pub fn mr(&self, lkey: Lkey) -> Option<&MemoryRegion> {
        self.sh.mrs.get(lkey)
    }

    /// The memory behind a payload segment's registration (`PayloadSeg::mr`), if that very
    /// registration still exists.
    pub fn memory(&self, mr: MrRef) -> Option<&Arc<dyn Memory>> {
        self.sh.mrs.memory_of(mr)
    }

    /// Creates a CQ of at least `cqe` entries.
    pub fn create_cq(&mut self, cqe: u32) -> VerbsResult<CqId> {
        self.check_cqe(cqe)?;
        let id = insert_or_exhausted(
            &mut self.sh.cqs,
            CompletionQueue::new(cqe as usize),
            "completion queues",
        )?;
        Ok(CqId(id as u32))
    }

    /// Creates the CQ `cq` of at least `cqe` entries (the replica of one another worker's
    /// device created: see [`Device::reg_mr_at`]); `Busy` if it exists here.
    pub fn create_cq_at(&mut self, cq: CqId, cqe: u32) -> VerbsResult<()> {
        self.check_cqe(cqe)?;
        let q = CompletionQueue::new(cqe as usize);
        insert_given(&mut self.sh.cqs, cq.0 as usize, q, "completion queue")
    }

    /// A CQ size the device takes.
    fn check_cqe(&self, cqe: u32) -> VerbsResult<()> {
        let max = self.sh.cfg.limits.max_cqe;
        if cqe == 0 || cqe > max {
            return Err(VerbsError::InvalidArgument(format!(
                "cqe {cqe} not in 1..={max}"
            )));
        }
        Ok(())
    }

    /// Queues a completion produced elsewhere (by a QP on another worker of an RNIC spread
    /// over several) on CQ `cq`, as the device's own QPs do: in order, and an overflow
    /// raises CQ_ERR once. False if there is no such CQ.
    pub fn complete_foreign(&mut self, cq: CqId, c: Completion) -> bool {
        if !self.sh.cqs.contains(cq.0 as usize) {
            return false;
        }
        self.sh.complete(cq.0, c);
        true
    }

    fn cq_mut(&mut self, cq: CqId) -> VerbsResult<&mut CompletionQueue> {
        lookup_mut(&mut self.sh.cqs, cq.0, "completion queue")
    }

    /// Resizes a CQ (`ibv_resize_cq`) to hold `cqe` completions, keeping those it holds;
    /// fewer than it holds now is refused (as verbs specify). Returns the new size.
    pub fn resize_cq(&mut self, cq: CqId, cqe: u32) -> VerbsResult<u32> {
        let max = self.sh.cfg.limits.max_cqe;
        let q = self.cq_mut(cq)?;
        if cqe == 0 || cqe > max {
            return Err(VerbsError::InvalidArgument(format!(
                "cqe {cqe} not in 1..={max}"
            )));
        }
        if (cqe as usize) < q.entries.len() {
            return Err(VerbsError::InvalidArgument(format!(
                "the CQ holds {} completions, more than {cqe}",
                q.entries.len()
            )));
        }
        q.capacity = cqe as usize;
        // Grown storage now, so pushing completions still never allocates.
        let more = q.capacity.saturating_sub(q.entries.len());
        q.entries.reserve_exact(more);
        q.entries.shrink_to(q.capacity);
        Ok(cqe)
    }

    /// Destroys a CQ no QP uses.
    pub fn destroy_cq(&mut self, cq: CqId) -> VerbsResult<()> {
        match self.sh.cqs.get(cq.0 as usize) {
            Some(c) if c.users > 0 => Err(VerbsError::Busy("completion queue")),
            Some(_) => {
                self.sh.cqs.remove(cq.0 as usize);
                Ok(())
            }
            None => Err(VerbsError::NotFound("completion queue")),
        }
    }

    /// Takes up to `out.len()` completions; returns how many.
    pub fn poll_cq(&mut self, cq: CqId, out: &mut [Completion]) -> VerbsResult<usize> {
        let q = self.cq_mut(cq)?;
        let mut n = 0;
        while n < out.len() {
            match q.entries.pop_front() {
                Some(c) => {
                    out[n] = c;
                    n += 1;
                }
                None => break,
            }
        }
        Ok(n)
    }

    /// Takes one completion.
    pub fn poll_completion(&mut self, cq: CqId) -> Option<Completion> {
        self.sh.cqs.get_mut(cq.0 as usize)?.entries.pop_front()
    }

    /// Whether a CQ has overflowed (it then stays in error).
    pub fn cq_overflowed(&self, cq: CqId) -> bool {
        matches!(self.sh.cqs.get(cq.0 as usize), Some(c) if c.overflowed)
    }

    fn cq_ok(&self, cq: CqId) -> bool {
        self.sh.cqs.contains(cq.0 as usize)
    }

    /// Creates a QP in RESET.
    pub fn create_qp(&mut self, init: &QpInit) -> VerbsResult<Qpn> {
        if !self.pd_ok(init.pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if !self.cq_ok(init.send_cq) || !self.cq_ok(init.recv_cq) {
            return Err(VerbsError::NotFound("completion queue"));
        }
        let c = &self.sh.cfg.limits;
        let caps = init.caps;
        if caps.max_send_wr == 0 || caps.max_send_wr > c.max_qp_wr {
            return Err(VerbsError::InvalidArgument(format!(
                "max_send_wr {} not in 1..={}",
                caps.max_send_wr, c.max_qp_wr
            )));
        }
        if init.srq.is_none() && (caps.max_recv_wr == 0 || caps.max_recv_wr > c.max_qp_wr) {
            return Err(VerbsError::InvalidArgument(format!(
                "max_recv_wr {} not in 1..={}",
                caps.max_recv_wr, c.max_qp_wr
            )));
        }
        if caps.max_send_sge > c.max_sge || caps.max_recv_sge > c.max_sge {
            return Err(VerbsError::InvalidArgument(format!(
                "SGEs per WR limited to {}",
                c.max_sge
            )));
        }
        if caps.max_inline_data as usize > MAX_INLINE {
            return Err(VerbsError::InvalidArgument(format!(
                "max_inline_data {} exceeds {MAX_INLINE}",
                caps.max_inline_data
            )));
        }
        if let Some(s) = init.srq {
            match self.sh.srqs.get(s.0 as usize) {
                Some(srq) if srq.pd == init.pd => {}
                Some(_) => {
                    return Err(VerbsError::InvalidArgument(
                        "SRQ belongs to another PD".into(),
                    ))
                }
                _ => return Err(VerbsError::NotFound("shared receive queue")),
            }
        }
        // QP numbers are handed out cyclically over the 24-bit space (as rxe's pool does), so
        // a late packet for a destroyed QP does not land on the next QP created: a number
        // comes back only after 2^24 creations. The slot is the number modulo max_qp. A
        // device with a stripe of the number space (`QpnStripe`) steps over the others'.
        let max_qp = self.sh.cfg.limits.max_qp as usize;
        let stripe = self.sh.cfg.qpn_stripe;
        let step = stripe.count.max(1);
        if self.live_qps as usize >= max_qp / step as usize {
            return Err(VerbsError::NoResources("queue pairs"));
        }
        let (seq, slot) = loop {
            let seq = self.next_qpn_seq;
            self.next_qpn_seq = match seq + step {
                n if n >= QPN_SPACE => stripe.index,
                n => n,
            };
            let slot = seq as usize % max_qp;
            if self.qps.get(slot).is_none_or(|q| q.is_none()) {
                break (seq, slot);
            }
        };
        if self.qps.len() <= slot {
            self.qps.resize_with(slot + 1, || None);
        }
        let slot = slot as u32;
        let qpn = Qpn::new(QPN_BASE + seq);
        // Even a zero-sized request gets one SGE, so empty WRs still have room.
        let mut caps = caps;
        caps.max_send_sge = caps.max_send_sge.max(1);
        caps.max_recv_sge = caps.max_recv_sge.max(1);
        let qp = Qp::new(qpn, &QpInit { caps, ..*init });
        self.qps[slot as usize] = Some(Box::new(qp));
        self.live_qps += 1;
        for cq in [init.send_cq, init.recv_cq] {
            if let Some(c) = self.sh.cqs.get_mut(cq.0 as usize) {
                c.users += 1;
            }
        }
        if let Some(s) = init.srq {
            if let Some(srq) = self.sh.srqs.get_mut(s.0 as usize) {
                srq.users += 1;
            }
        }
        Ok(qpn)
    }

    /// The slot of a live QP numbered `qpn` (a number whose QP was destroyed has none, even
    /// if its slot holds a newer QP).
    fn slot_of(&self, qpn: Qpn) -> Option<usize> {
        live_slot(&self.qps, self.sh.cfg.limits.max_qp, qpn)
    }

    /// A dense index for a live QP, below `max_qp`: host interfaces use it to index per-QP
    /// tables without hashing.
    pub fn qp_index(&self, qpn: Qpn) -> Option<usize> {
        self.slot_of(qpn)
    }

    fn qp_ref(&self, qpn: Qpn) -> VerbsResult<&Qp> {
        self.slot_of(qpn)
            .and_then(|s| self.qps.get(s))
            .and_then(|q| q.as_deref())
            .ok_or(VerbsError::NotFound("queue pair"))
    }

    /// Modifies a QP (`ibv_modify_qp`); invalid attributes leave it unchanged.
    pub fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> VerbsResult<()> {
        let max_rd = self.sh.cfg.limits.max_qp_rd_atom;
        let ngids = self.sh.cfg.gids.len();
        let port_mtu = self.sh.cfg.port_mtu;
        let (slot, qp) = live_qp_mut(&mut self.qps, self.sh.cfg.limits.max_qp, qpn)?;
        if let Some(m) = attr.path_mtu {
            if m > port_mtu {
                return Err(VerbsError::Modify(ModifyError::Invalid(format!(
                    "path MTU {} exceeds the port's active MTU {}",
                    m.bytes(),
                    port_mtu.bytes()
                ))));
            }
        }
        let (from, to) = qp.modify(attr, max_rd, ngids)?;
        match to {
            QpState::Err if from != QpState::Err => {
                qp.state = from;
                qp.enter_error(&mut self.sh);
            }
            QpState::Reset => qp.reset(),
            // Entering SQD with nothing outstanding is already drained.
            QpState::Sqd => qp.check_sq_drained(&mut self.sh),
            _ => {}
        }
        self.mark_ready(slot as u32);
        Ok(())
    }

    /// `query_qp`.
    pub fn query_qp(&self, qpn: Qpn) -> VerbsResult<QpInfo> {
        let qp = self.qp_ref(qpn)?;
        let mut attr = qp.attr;
        attr.state = Some(qp.state);
        if qp.state != QpState::Reset {
            attr.sq_psn = Some(qp.req.psn);
            attr.rq_psn = Some(qp.resp.epsn);
        }
        Ok(QpInfo {
            qpn,
            qp_type: qp.qp_type,
            state: qp.state,
            caps: qp.caps,
            attr,
            sq_sig_all: qp.sq_sig_all,
            rate_kbps: qp
                .cc
                .as_ref()
                .and_then(|c| c.rate())
                .map(|r| (r * 1000.0) as u64),
            sq_draining: qp.state == QpState::Sqd && !qp.sq_drained(),
        })
    }

    /// Destroys a QP. Outstanding WRs are discarded without completions (verbs semantics).
    pub fn destroy_qp(&mut self, qpn: Qpn) -> VerbsResult<()> {
        let slot = self
            .slot_of(qpn)
            .ok_or(VerbsError::NotFound("queue pair"))?;
        let qp = self
            .qps
            .get_mut(slot)
            .and_then(|q| q.take())
            .ok_or(VerbsError::NotFound("queue pair"))?;
        self.destroyed_qp_counters.add(&qp.counters);
        // What the running totals have not taken in yet of this QP.
        self.running_qp_counters.add(&qp.counters);
        self.running_qp_counters.sub(&qp.counted);
        self.live_qps -= 1;
        // Type 2 windows bound to the QP are invalidated with it: none may keep serving a
        // QP number that could come back for another QP.
        let bound: Vec<u32> = self
            .sh
            .mrs
            .windows_of(qpn)
            .map(|m| m.rkey.map_or(0, |k| k.0))
            .collect();
        for k in bound {
            let _ = self.sh.invalidate(k, qp.pd, None);
        }
        for cq in [qp.send_cq, qp.recv_cq] {
            if let Some(c) = self.sh.cqs.get_mut(cq as usize) {
                c.users = c.users.saturating_sub(1);
            }
        }
        if let Some(s) = qp.srq {
            if let Some(srq) = self.sh.srqs.get_mut(s as usize) {
                srq.users = srq.users.saturating_sub(1);
            }
        }
        for q in self.ready.iter_mut() {
            q.retain(|&s| s != slot as u32);
        }
        self.parked.retain(|&s| s != slot as u32);
        Ok(())
    }

    /// Creates an SRQ.
    pub fn create_srq(&mut self, pd: PdId, attr: &SrqAttr) -> VerbsResult<SrqId> {
        self.check_srq(pd, attr)?;
        let srq = Srq {
            pd,
            rq: RecvQueue::new(attr.max_wr as usize, attr.max_sge.max(1) as usize),
            limit: attr.srq_limit,
            users: 0,
            moved_noted: false,
            shared: None,
        };
        let id = insert_or_exhausted(&mut self.sh.srqs, srq, "shared receive queues")?;
        Ok(SrqId(id as u32))
    }

    /// Creates an SRQ whose WQEs are `wqes`, shared with other devices (an RNIC spread over
    /// several workers: see [`SharedWqes`]): under a free id, or (`at`) under the id another
    /// device gave it. Its depth, SGEs and limit are the queue's.
    pub fn create_srq_shared(
        &mut self,
        at: Option<SrqId>,
        pd: PdId,
        wqes: Arc<dyn SharedWqes>,
    ) -> VerbsResult<SrqId> {
        let (max_wr, max_sge) = wqes.shape();
        let attr = SrqAttr {
            max_wr,
            max_sge,
            srq_limit: wqes.limit(),
        };
        self.check_srq(pd, &attr)?;
        let srq = Srq {
            pd,
            // The WQEs are the shared queue's.
            rq: RecvQueue::new(1, 1),
            limit: 0,
            users: 0,
            moved_noted: false,
            shared: Some(wqes),
        };
        let id = match at {
            None => insert_or_exhausted(&mut self.sh.srqs, srq, "shared receive queues")?,
            Some(s) => {
                insert_given(&mut self.sh.srqs, s.0 as usize, srq, "shared receive queue")?;
                s.0 as usize
            }
        };
        Ok(SrqId(id as u32))
    }

    /// Refuses an SRQ of `attr` in `pd` past the device's limits.
    fn check_srq(&self, pd: PdId, attr: &SrqAttr) -> VerbsResult<()> {
        if !self.pd_ok(pd) {
            return Err(VerbsError::NotFound("protection domain"));
        }
        if attr.max_wr == 0
            || attr.max_wr > self.sh.cfg.limits.max_qp_wr
            || attr.max_sge > self.sh.cfg.limits.max_sge
        {
            return Err(VerbsError::InvalidArgument(format!(
                "SRQ of {} WRs x {} SGEs exceeds the device limits",
                attr.max_wr, attr.max_sge
            )));
        }
        if attr.srq_limit > attr.max_wr {
            return Err(VerbsError::InvalidArgument(
                "srq_limit exceeds max_wr".into(),
            ));
        }
        Ok(())
    }

    /// The shared WQE queue of SRQ `srq`, if it has one.
    pub fn srq_shared(&self, srq: SrqId) -> Option<Arc<dyn SharedWqes>> {
        self.sh.srqs.get(srq.0 as usize)?.shared.clone()
    }

    fn srq_mut(&mut self, srq: SrqId) -> VerbsResult<&mut Srq> {
        lookup_mut(&mut self.sh.srqs, srq.0, "shared receive queue")
    }

    /// Arms the SRQ limit (`ibv_modify_srq` with IBV_SRQ_LIMIT; resizing is not supported).
    pub fn modify_srq(&mut self, srq: SrqId, limit: u32) -> VerbsResult<()> {
        let s = self.srq_mut(srq)?;
        let depth = match &s.shared {
            Some(w) => w.shape().0,
            None => s.rq.depth() as u32,
        };
        if limit > depth {
            return Err(VerbsError::InvalidArgument(
                "srq_limit exceeds max_wr".into(),
            ));
        }
        match &s.shared {
            Some(w) => w.arm(limit),
            None => s.limit = limit,
        }
        Ok(())
    }

    /// `ibv_query_srq`.
    pub fn query_srq(&mut self, srq: SrqId) -> VerbsResult<SrqAttr> {
        let s = self.srq_mut(srq)?;
        Ok(match &s.shared {
            Some(w) => SrqAttr {
                max_wr: w.shape().0,
                max_sge: w.shape().1,
                srq_limit: w.limit(),
            },
            None => SrqAttr {
                max_wr: s.rq.depth() as u32,
                max_sge: s.rq.max_sge as u32,
                srq_limit: s.limit,
            },
        })
    }

    /// Destroys an SRQ no QP uses.
    pub fn destroy_srq(&mut self, srq: SrqId) -> VerbsResult<()> {
        if self.srq_mut(srq)?.users > 0 {
            return Err(VerbsError::Busy("shared receive queue"));
        }
        self.sh.srqs.remove(srq.0 as usize);
        Ok(())
    }

    /// Posts a receive WR to an SRQ.
    pub fn post_srq_recv(&mut self, srq: SrqId, wr: &RecvWr<'_>) -> VerbsResult<()> {
        let s = self.srq_mut(srq)?;
        if let Some(w) = &s.shared {
            let max_sge = w.shape().1 as usize;
            if wr.sg_list.len() > max_sge {
                return Err(VerbsError::InvalidArgument(format!(
                    "{} SGEs exceed the SRQ's {max_sge}",
                    wr.sg_list.len()
                )));
            }
            return if w.push(wr.wr_id, wr.sg_list) {
                Ok(())
            } else {
                Err(VerbsError::QueueFull)
            };
        }
        let rq = &mut s.rq;
        let max_sge = rq.max_sge;
        rq.post(wr, max_sge, "the SRQ's")
    }

    /// Posts a send WR (`ibv_post_send`).
    pub fn post_send(&mut self, qpn: Qpn, wr: &SendWr<'_>) -> VerbsResult<()> {
        self.post_send_inner(qpn, wr, None)
    }

    /// Posts a send WR whose inline payload the caller already copied (a host interface
    /// copies it when the application posts, as verbs allows the buffer to be reused at once);
    /// `wr.sg_list` must be empty and `wr.flags` must contain INLINE.
    pub fn post_send_inline(&mut self, qpn: Qpn, wr: &SendWr<'_>, data: &[u8]) -> VerbsResult<()> {
        if !wr.sg_list.is_empty()
            || !wr.flags.contains(SendFlags::INLINE)
            || wr.op.is_read_or_atomic()
        {
            return Err(VerbsError::InvalidArgument(
                "inline data goes without SGEs, with the INLINE flag, on a SEND or WRITE".into(),
            ));
        }
        self.post_send_inner(qpn, wr, Some(data))
    }

    fn post_send_inner(
        &mut self,
        qpn: Qpn,
        wr: &SendWr<'_>,
        inline_data: Option<&[u8]>,
    ) -> VerbsResult<()> {
        let port_mtu = self.sh.cfg.port_mtu.bytes();
        let (slot, qp) = live_qp_mut(&mut self.qps, self.sh.cfg.limits.max_qp, qpn)?;
        if matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(qp.state));
        }
        if qp.sq.is_full() {
            return Err(VerbsError::QueueFull);
        }
        let length = check_send(
            qp.qp_type,
            &qp.caps,
            port_mtu,
            wr,
            inline_data.map(|d| d.len()),
        )?;
        let inline = wr.flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic();
        // Only an inline WR has bytes to hold: a WR with SGEs does not zero a buffer for them.
        let inline_copy = if inline {
            Some(inline_bytes(&self.sh.mrs, qp.pd, wr, inline_data)?)
        } else {
            None
        };
        let mut wqe = SendWqe::EMPTY;
        wqe.wr_id = wr.wr_id;
        wqe.op = wr.op;
        wqe.flags = wr.flags;
        wqe.ud = wr.ud;
        wqe.length = length as u32;
        wqe.signaled = qp.sq_sig_all || wr.flags.contains(SendFlags::SIGNALED);
        if wr.op.is_remote() {
            qp.req.ssn = qp.req.ssn.wrapping_add(1) & crate::types::MASK24;
            wqe.ssn = qp.req.ssn;
        }
        let idx = match &inline_copy {
            Some((bytes, n)) => qp.sq.push(wqe, &[], &bytes[..*n]),
            None => qp.sq.push(wqe, wr.sg_list, &[]),
        };
        if matches!(inline_copy, Some((_, 0))) {
            // A zero-length inline WR still counts as inline (no SGEs to check).
            qp.sq.get_mut(idx).flags = wr.flags;
        }
        match qp.state {
            QpState::Err => qp.flush(&mut self.sh),
            QpState::Sqe => qp.flush_sq(&mut self.sh),
            _ => {}
        }
        self.mark_ready(slot as u32);
        Ok(())
    }

    /// Posts a receive WR (`ibv_post_recv`).
    pub fn post_recv(&mut self, qpn: Qpn, wr: &RecvWr<'_>) -> VerbsResult<()> {
        let (slot, qp) = live_qp_mut(&mut self.qps, self.sh.cfg.limits.max_qp, qpn)?;
        if qp.srq.is_some() {
            return Err(VerbsError::InvalidArgument(
                "the QP uses an SRQ: post to the SRQ".into(),
            ));
        }
        if qp.state == QpState::Reset {
            return Err(VerbsError::InvalidState(qp.state));
        }
        qp.rq
            .post(wr, qp.caps.max_recv_sge as usize, "max_recv_sge")?;
        if qp.state == QpState::Err {
            qp.flush(&mut self.sh);
            self.note_moved(slot);
        }
        Ok(())
    }

    /// IBA 11.4.2.1: a CQ overrun is a CQ error and an affiliated QP error for every QP using
    /// the CQ: those QPs go to ERR with a QP_FATAL event.
    fn handle_cq_overflows(&mut self) {
        while let Some(cq) = self.sh.overflowed.pop() {
            for slot in 0..self.qps.len() {
                let Some(qp) = self.qps[slot].as_deref_mut() else {
                    continue;
                };
                if (qp.send_cq == cq || qp.recv_cq == cq) && qp.state != QpState::Err {
                    self.sh.events.push_back(AsyncEvent::QpFatal(qp.qpn));
                    qp.enter_error(&mut self.sh);
                    self.note_moved(slot);
                }
            }
        }
    }

    fn mark_ready(&mut self, slot: u32) {
        if let Some(Some(qp)) = self.qps.get_mut(slot as usize) {
            if !qp.queued {
                qp.queued = true;
                self.ready[traffic_class(&self.ets, qp, &self.sh)].push_back(slot);
            }
        }
        self.note_moved(slot as usize);
    }

    /// Notes a QP whose queue positions changed since a host last published them (every
    /// path that can retire WQEs ends here), so hosts publish only what moved.
    fn note_moved(&mut self, slot: usize) {
        if let Some(Some(qp)) = self.qps.get_mut(slot) {
            if !qp.moved_noted && (qp.sq.head, qp.rq.head) != qp.positions_taken {
                qp.moved_noted = true;
                self.sh.moved_qps.push(qp.qpn);
            }
        }
    }

    /// Hands the host interface what changed since its last call, swapping into the given
    /// vectors (cleared first; no allocation once they have grown): QPs whose queue positions
    /// moved, SRQs that handed out WQEs, and CQs that received completions. A CQ a host
    /// could not drain completely must be retried by the host.
    pub fn take_moved(&mut self, qps: &mut Vec<Qpn>, srqs: &mut Vec<SrqId>, cqs: &mut Vec<CqId>) {
        qps.clear();
        srqs.clear();
        cqs.clear();
        std::mem::swap(qps, &mut self.sh.moved_qps);
        std::mem::swap(srqs, &mut self.sh.moved_srqs);
        std::mem::swap(cqs, &mut self.sh.ready_cqs);
        for &q in qps.iter() {
            if let Some(slot) = self.slot_of(q) {
                if let Some(Some(qp)) = self.qps.get_mut(slot) {
                    qp.moved_noted = false;
                    qp.positions_taken = (qp.sq.head, qp.rq.head);
                }
            }
        }
        for s in srqs.iter() {
            if let Some(srq) = self.sh.srqs.get_mut(s.0 as usize) {
                srq.moved_noted = false;
            }
        }
        for c in cqs.iter() {
            if let Some(cq) = self.sh.cqs.get_mut(c.0 as usize) {
                cq.ready_noted = false;
            }
        }
    }

    /// Takes a frame off the wire (one contiguous slice).
    pub fn handle_frame(&mut self, now: u64, frame: &[u8]) {
        self.handle_frame_segments(now, &[frame]);
    }

    /// Takes a frame held in several segments (an mbuf chain).
    pub fn handle_frame_segments(&mut self, now: u64, segs: &[&[u8]]) {
        match frame::parse_segments(segs) {
            Ok(p) => self.handle_parsed(now, &p, segs),
            Err(e) => self.reject_frame(&e),
        }
    }

    /// Counts a RoCE frame that did not parse (`frame::parse_segments` failed where the
    /// caller parsed it): it has no effect beyond the counter (IBA: a packet with a bad
    /// ICRC is dropped silently).
    pub fn reject_frame(&mut self, e: &crate::wire::Error) {
        self.sh.counters.rx_engine_frames += 1;
        if let crate::wire::Error::BadIcrc { .. } = e {
            self.sh.counters.rx_icrc_encapsulated += 1;
            tracing::trace!("frame dropped: bad ICRC");
        } else {
            self.sh.counters.rx_malformed += 1;
            tracing::trace!(error = %e, "frame dropped: malformed");
        }
    }

    /// A packet to QP1, the GSI: a MAD for the connection manager if it is what the GSI
    /// takes (UD SEND-only with QP1's Q_Key, IBA 10.2.4.1 and 13.5.1; a whole 256-byte
    /// MAD); anything else is counted and dropped.
    fn handle_gsi(
        &mut self,
        now: u64,
        p: &ParsedFrame,
        segs: &[&[u8]],
        src_gid: Gid,
        dst_gid: Gid,
    ) {
        let t = &p.repr.transport;
        let ok = t.bth.opcode == Opcode::UD_SEND_ONLY
            && t.ext.deth.is_some_and(|d| d.qkey == Qkey::GSI)
            && p.payload_len == crate::wire::mad::MAD_LEN;
        if !ok {
            self.cm.counters.rx_bad += 1;
            return;
        }
        let mut mad = [0u8; crate::wire::mad::MAD_LEN];
        let mut n = 0;
        let start = p.payload_offset;
        for piece in SegmentRange::new(segs, start, start + mad.len()) {
            mad[n..n + piece.len()].copy_from_slice(piece);
            n += piece.len();
        }
        self.cm.handle_mad(now, src_gid, dst_gid, &mad[..n]);
    }

    /// Builds the next MAD the connection manager has for a peer, as QP1 sends it: UD
    /// SEND-only to the peer's QP1 with QP1's Q_Key, P_Key 0xffff, the GSI's own PSN
    /// sequence and UDP source port (as rxe's QP1 does).
    fn next_gsi(&mut self, tx: &mut Transmit) -> bool {
        let Some(m) = self.cm.poll_mad() else {
            return false;
        };
        let psn = self.gsi_psn;
        self.gsi_psn = psn.next();
        let mut bth = BthRepr::new(Opcode::UD_SEND_ONLY, Qpn::GSI, psn);
        bth.pkey = crate::types::Pkey::DEFAULT;
        let mut t = frame::TransportRepr::new(bth);
        t.ext.deth = Some(crate::wire::deth::DethRepr {
            qkey: Qkey::GSI,
            src_qp: Qpn::GSI,
            resv: 0,
        });
        tx.qpn = Qpn::GSI;
        tx.path = Path {
            sgid: m.src,
            dgid: m.dest,
            udp_sport: transmit::udp_sport_ud(Qpn::GSI.value()),
            ..Path::default()
        };
        tx.transport = t;
        tx.payload.set_inline(&m.mad);
        self.sh.counters.tx_gsi_mads += 1;
        true
    }

    /// Takes a frame the caller already parsed and verified (`frame::parse_segments`, with
    /// `segs` the segments it parsed): the dataplane parses each frame once and hands over
    /// the headers.
    pub fn handle_parsed(&mut self, now: u64, p: &ParsedFrame, segs: &[&[u8]]) {
        self.sh.counters.rx_engine_frames += 1;
        let t = &p.repr.transport;
        let (src_gid, dst_gid) = p.repr.ip.gids();
        if !self.is_our_gid(&dst_gid) {
            self.sh.counters.rx_dropped_not_ours += 1;
            return;
        }
        let info = p.info();
        if info.transport == Transport::Cnp {
            self.sh.counters.rx_cnp += 1;
            self.handle_cnp(now, t.bth.dest_qp, &src_gid);
            return;
        }
        if t.bth.dest_qp == Qpn::GSI {
            self.sh.counters.rx_gsi_mads += 1;
            self.handle_gsi(now, p, segs, src_gid, dst_gid);
            return;
        }
        let Some(slot) = self.slot_of(t.bth.dest_qp) else {
            self.sh.counters.rx_dropped_no_qp += 1;
            tracing::trace!(qpn = ?t.bth.dest_qp, "packet dropped: no such QP");
            return;
        };
        let Some(Some(qp)) = self.qps.get_mut(slot) else {
            self.sh.counters.rx_dropped_no_qp += 1;
            return;
        };
        let qp: &mut Qp = qp;
        let matches_transport = matches!(
            (info.transport, qp.qp_type),
            (Transport::Rc, QpType::Rc) | (Transport::Uc, QpType::Uc) | (Transport::Ud, QpType::Ud)
        );
        if !matches_transport {
            self.sh.counters.rx_dropped_wrong_transport += 1;
            tracing::trace!(qpn = ?qp.qpn, opcode = ?t.bth.opcode, "packet dropped: wrong transport");
            return;
        }
        // P_Key: the table holds the default full-membership key (IBA 10.9.3).
        if t.bth.pkey.0 & 0x7fff != 0x7fff {
            qp.counters.rx_dropped_pkey += 1;
            return;
        }
        if qp.qp_type != QpType::Ud {
            // rxe drops RC/UC packets whose addresses do not match the QP's path.
            let ok = qp.attr.av.is_some_and(|av| {
                av.dgid == src_gid && self.sh.cfg.gids.get(av.sgid_index as usize) == Some(&dst_gid)
            });
            if !ok {
                qp.counters.rx_dropped_path += 1;
                tracing::trace!(qpn = ?qp.qpn, ?src_gid, "packet dropped: not from the QP's path");
                return;
            }
        }
        let pkt = Pkt {
            bth: &t.bth,
            ext: &t.ext,
            info,
            segs,
            payload_off: p.payload_offset,
            payload_len: p.payload_len,
            l3_off: p.l3_offset,
            l3_len: p.repr.ip.header_len(),
        };
        let owes_cnp = p.repr.ip.ecn() == Ecn::Ce && qp.on_ce(&self.sh, now);
        if info.is_request {
            qp.handle_request(&mut self.sh, now, &pkt);
        } else {
            qp.handle_response(&mut self.sh, now, &pkt);
        }
        if owes_cnp {
            owe_cnp(&mut self.cnp_due, &self.qps, slot as u32);
        }
        self.mark_ready(slot as u32);
        if !self.sh.overflowed.is_empty() {
            self.handle_cq_overflows();
        }
    }

    /// A CNP for `qpn` from `src` (a connected QP takes them only from its peer, so a third
    /// party cannot slow it down; a UD QP, whose peers are anyone, only counts them, as this
    /// RNIC sends no CNP for UD traffic either).
    fn handle_cnp(&mut self, now: u64, qpn: Qpn, src: &Gid) {
        let Some(Some(qp)) = self.slot_of(qpn).and_then(|s| self.qps.get_mut(s)) else {
            self.sh.counters.rx_dropped_no_qp += 1;
            return;
        };
        let qp: &mut Qp = qp;
        if qp.qp_type == QpType::Ud {
            qp.counters.rp_cnp_ignored += 1;
            return;
        }
        if qp.attr.av.is_none_or(|av| av.dgid != *src) {
            qp.counters.rx_dropped_path += 1;
            return;
        }
        qp.on_cnp(&mut self.sh, now);
    }

    /// Produces the next packet to send into `tx`; false when there is nothing to send. QPs
    /// are served round robin (CNPs owed go before all of them, `next_due_cnp`); within a
    /// QP, responses (ACKs, READ responses) go first, then requests. A QP that DCQCN
    /// throttled sends data (requests, READ responses) only when its pacer allows, and its
    /// timer wakes it for the next packet.
    pub fn poll_transmit(&mut self, now: u64, tx: &mut Transmit) -> bool {
        // Management datagrams first: few, and a connection's setup waits on them.
        if self.next_gsi(tx) || self.next_due_cnp(tx) {
            return true;
        }
        while let Some(tc) = self.next_class() {
            let Some(slot) = self.ready[tc].pop_front() else {
                break;
            };
            let Some(Some(qp)) = self.qps.get_mut(slot as usize) else {
                continue;
            };
            let qp: &mut Qp = qp;
            let paused = self.paused != 0 && self.paused & (1 << qp.tx_priority(&self.sh)) != 0;
            // An RC QP held for its next hop still sends (its packets wait in the driver's
            // hold list, and its ACK timer costs no retry meanwhile).
            if paused || (qp.held_for.is_some() && qp.qp_type != QpType::Rc) {
                // Its class is paused: every packet of the QP waits (ACKs and READ
                // responses travel in their QP's class), the other classes go on. Or a
                // UD or UC QP waits for a next hop (`hold_path`). (A CNP it owes is not
                // its class's: `next_due_cnp`.)
                qp.queued = false;
                if !qp.parked {
                    qp.parked = true;
                    self.parked.push(slot);
                }
                continue;
            }
            let may_data = qp.cc.as_mut().is_none_or(|c| c.may_send(now));
            let sent = qp.next_response(&mut self.sh, tx, may_data)
                || (may_data && qp.next_request(&mut self.sh, now, tx) == req::ReqStep::Sent);
            if let Some(cc) = qp.cc.as_mut() {
                if sent && tx.is_paced() {
                    cc.on_data_sent(now, tx.payload.len() as u64);
                }
                if let Some(d) = qp.next_deadline() {
                    qp.arm_timer(&mut self.sh, d);
                }
            }
            // What the requester finished without a response completes now, in order.
            qp.take_completer_events(&mut self.sh);
            if sent {
                // Back in line, in the class of its next packet (a UD QP's may differ).
                self.ready[traffic_class(&self.ets, qp, &self.sh)].push_back(slot);
                self.note_moved(slot as usize);
                if !self.sh.overflowed.is_empty() {
                    self.handle_cq_overflows();
                }
                return true;
            }
            qp.queued = false;
        }
        if !self.sh.overflowed.is_empty() {
            self.handle_cq_overflows();
        }
        false
    }

    /// The next CNP owed, ahead of every ETS class: CNPs travel on their own priority
    /// (`np_cnp_prio`, 6 by default) as a strict class (dcb.md), so neither a paused data
    /// priority nor a busy stricter class holds back the notification that would relieve
    /// the congestion. They wait only while their own priority is paused.
    fn next_due_cnp(&mut self, tx: &mut Transmit) -> bool {
        if self.cnp_due.is_empty() || self.paused & (1 << cnp_priority(&self.sh.cfg)) != 0 {
            return false;
        }
        while let Some(slot) = self.cnp_due.pop_front() {
            // A slot whose QP was destroyed (or replaced, owing nothing) produces nothing.
            if let Some(Some(qp)) = self.qps.get_mut(slot as usize) {
                if qp.next_cnp(&self.sh, tx) {
                    return true;
                }
            }
        }
        false
    }

    /// The class whose next QP goes now: ETS between the classes with QPs ready (strict
    /// classes first, DWRR between the others, charged the QP's path MTU as the estimate of
    /// its packet), or the one queue without ETS. `None`: nothing is ready.
    fn next_class(&mut self) -> Option<usize> {
        let Some(ets) = self.ets.as_mut() else {
            return (!self.ready[0].is_empty()).then_some(0);
        };
        let mut head = [None; dcb::ets::TCS];
        for (tc, q) in self.ready.iter().enumerate() {
            if let Some(&slot) = q.front() {
                let mtu = match self.qps.get(slot as usize) {
                    Some(Some(qp)) => qp.mtu(),
                    _ => 0,
                };
                head[tc] = Some(mtu + transmit::WIRE_HEADERS);
            }
        }
        // Paused priorities are held by parking their QPs, not here. A class with neither
        // strict priority nor a share gets what the others leave (work-conserving).
        ets.pick(&head, 0)
            .or_else(|| head.iter().position(Option::is_some))
    }

    /// Sets the priorities the link partner has paused (PFC / PAUSE, bit n = priority n):
    /// QPs whose packets go on a paused priority produce nothing until it is resumed, and
    /// resumed QPs are ready again at once. The driver decides what is paused (received
    /// frames, their expiry, the storm watchdog); the engine only holds QPs.
    pub fn set_paused(&mut self, mask: u8) {
        let resumed = self.paused & !mask;
        self.paused = mask;
        if resumed == 0 {
            return;
        }
        for slot in std::mem::take(&mut self.parked) {
            if let Some(Some(qp)) = self.qps.get_mut(slot as usize) {
                qp.parked = false;
            }
            // Still-paused ones park again on their next turn.
            self.mark_ready(slot);
        }
    }

    /// The priorities currently paused ([`Device::set_paused`]).
    pub fn paused(&self) -> u8 {
        self.paused
    }

    /// The earliest deadline at which `handle_timeout` must be called.
    pub fn poll_timeout(&mut self) -> Option<u64> {
        let qp = self.qp_timeout();
        match (qp, self.cm.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The earliest QP deadline.
    fn qp_timeout(&mut self) -> Option<u64> {
        if self.sh.timers.len() > 2 * self.live_qps as usize + 64 {
            self.compact_timers();
        }
        // Drop entries whose QP no longer needs them (its deadline moved or was cancelled), so
        // callers never wake for nothing.
        while let Some(&Reverse((t, qpn))) = self.sh.timers.peek() {
            let qp = self
                .slot_of(Qpn::new(qpn))
                .and_then(|s| self.qps.get_mut(s))
                .and_then(|q| q.as_deref_mut());
            let Some(qp) = qp else {
                self.sh.timers.pop();
                continue;
            };
            match qp.next_deadline() {
                Some(d) if d <= t => return Some(t),
                next => {
                    self.sh.timers.pop();
                    if qp.timer_queued == Some(t) {
                        qp.timer_queued = None;
                    }
                    if let Some(d) = next {
                        qp.arm_timer(&mut self.sh, d);
                    }
                }
            }
        }
        None
    }

    /// Drops the heap entries no live QP waits for. A QP keeps one live entry (its
    /// `timer_queued`); an earlier deadline pushes a new one and leaves the old behind, and a
    /// destroyed QP leaves its own. Those are dropped when they surface, but behind a live
    /// entry far ahead (an ACK timeout of hours) they would pile up: a peer's RNR NAKs with
    /// ever shorter timers, or a client creating and destroying QPs. Run when the heap holds
    /// more than twice the live QPs, it keeps the heap within that at amortised O(1) a push.
    fn compact_timers(&mut self) {
        let qps = &self.qps;
        let max_qp = self.sh.cfg.limits.max_qp;
        let mut entries = std::mem::take(&mut self.sh.timers).into_vec();
        entries.retain(|&Reverse((t, qpn))| {
            live_slot(qps, max_qp, Qpn::new(qpn))
                .and_then(|s| qps[s].as_deref())
                .is_some_and(|q| q.timer_queued == Some(t))
        });
        self.sh.timers = BinaryHeap::from(entries);
    }

    /// Entries in the QP timer heap, live and stale (`compact_timers`): for diagnostics and
    /// tests of its bound.
    pub fn timer_entries(&self) -> usize {
        self.sh.timers.len()
    }

    /// Runs the timers due at `now` (ACK timeouts, RNR back-off ends, the connection
    /// manager's retries and time waits).
    pub fn handle_timeout(&mut self, now: u64) {
        self.cm.handle_timeout(now);
        while let Some(&Reverse((t, qpn))) = self.sh.timers.peek() {
            if t > now {
                break;
            }
            self.sh.timers.pop();
            let Some(slot) = self.slot_of(Qpn::new(qpn)) else {
                continue;
            };
            if let Some(Some(qp)) = self.qps.get_mut(slot) {
                qp.on_timer(&mut self.sh, now, t);
                self.mark_ready(slot as u32);
            }
        }
        if !self.sh.overflowed.is_empty() {
            self.handle_cq_overflows();
        }
    }

    /// Takes the next asynchronous event.
    pub fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.sh.events.pop_front()
    }

    /// How many send and receive WQEs of a QP have been retired (completed or flushed) since
    /// it was created or reset: the consumer indices of its work queues, which a host
    /// interface publishes so applications can tell when a queue has room.
    pub fn queue_positions(&self, qpn: Qpn) -> Option<(u64, u64)> {
        let qp = self.qp_ref(qpn).ok()?;
        let rq = if qp.srq.is_some() { 0 } else { qp.rq.head };
        Some((qp.sq.head, rq))
    }

    /// How many WQEs an SRQ has handed out.
    pub fn srq_position(&self, srq: SrqId) -> Option<u64> {
        self.sh.srqs.get(srq.0 as usize).map(|s| match &s.shared {
            Some(w) => w.taken(),
            None => s.rq.head,
        })
    }

    /// Takes something the driver tells the device besides frames, posts and verbs calls
    /// (one input for the dataplane's own conditions, as quinn-proto's `handle_event`);
    /// returns how many QPs it affected.
    pub fn handle_event(&mut self, ev: DeviceEvent<'_>) -> usize {
        match ev {
            DeviceEvent::PathHeld { qpn, dgid } => {
                self.hold_path(qpn, dgid);
                1
            }
            DeviceEvent::PathResolved { dgid, now } => {
                self.release_held(&dgid, HopOutcome::Left(now))
            }
            DeviceEvent::PathKnown { dgid } => self.release_held(&dgid, HopOutcome::Known),
            DeviceEvent::PathUnreachable { dgid } => {
                self.release_held(&dgid, HopOutcome::Failed);
                self.fail_qps_to(&dgid)
            }
            DeviceEvent::SendRejected { qpn, wr } => {
                self.reject_posted_send(qpn, wr);
                1
            }
            DeviceEvent::RecvRejected { qpn, wr_id } => {
                self.fail_posted_wr(qpn, wr_id, crate::verbs::WcOpcode::Recv, true);
                1
            }
        }
    }

    /// A send WR a host interface took from an application but the engine refused
    /// (`post_send` failed: a check the application side could not make, or a dishonest
    /// client). It still takes its place in the send queue - so the queue position the
    /// application counts on advances when it retires - and completes with LOC_QP_OP_ERR in
    /// order, moving the QP to the error state as a WQE the RNIC cannot execute does. Where
    /// it cannot be queued (the send queue is full or the QP is not ready to send: the
    /// application did not count or order its posts) it completes at once, out of order.
    fn reject_posted_send(&mut self, qpn: Qpn, wr: &SendWr<'_>) {
        let Some(slot) = self.slot_of(qpn) else {
            return;
        };
        let Some(qp) = self.qps.get_mut(slot).and_then(|q| q.as_deref_mut()) else {
            return;
        };
        if qp.sq.is_full() || matches!(qp.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            self.fail_posted_wr(qpn, wr.wr_id, wr.op.wc_opcode(), false);
            return;
        }
        let mut wqe = SendWqe::EMPTY;
        wqe.wr_id = wr.wr_id;
        wqe.op = wr.op;
        wqe.signaled = true;
        wqe.rejected = true;
        qp.sq.push(wqe, &[], &[]);
        match qp.state {
            QpState::Err => qp.flush(&mut self.sh),
            QpState::Sqe => qp.flush_sq(&mut self.sh),
            _ => {}
        }
        self.mark_ready(slot as u32);
        self.note_moved(slot);
    }

    /// Completes a work request the host interface could not post (e.g. it arrived for a QP
    /// that was meanwhile destroyed or reset) with LOC_QP_OP_ERR on the QP's send CQ, so the
    /// application learns about it in order.
    fn fail_posted_wr(&mut self, qpn: Qpn, wr_id: u64, opcode: crate::verbs::WcOpcode, recv: bool) {
        let Ok(qp) = self.qp_ref(qpn) else { return };
        let cq = if recv { qp.recv_cq } else { qp.send_cq };
        let mut c = qp.recv_completion(wr_id, WcStatus::LocQpOpErr, opcode, 0);
        c.src_qp = Qpn::new(0);
        self.sh.complete(cq, c);
    }

    /// Whether a UD message for `qpn` would now be dropped for want of a receive WQE (the
    /// QP is a UD QP able to receive, and neither its receive queue nor its SRQ has one). A
    /// dataplane may hold such a message a little while instead (see the RNIC's
    /// `roce.ud_rx_hold_us`).
    pub fn ud_lacks_recv_wqe(&self, qpn: Qpn) -> bool {
        self.ud_receiver(qpn, None)
            .is_some_and(|qp| self.lacks_recv_wqe(qp))
    }

    /// For a UD message to `qpn` whose DETH carries `qkey`: `None` if the QP would drop it
    /// anyway (not a UD QP able to receive, or another Q_Key: IBA 10.2.5), else whether it
    /// lacks a receive WQE now. A dataplane holding UD messages for a receive WQE holds
    /// only those the QP would take: a peer that does not know the Q_Key cannot fill the
    /// wait.
    pub fn ud_wait_for_wqe(&self, qpn: Qpn, qkey: Qkey) -> Option<bool> {
        self.ud_receiver(qpn, Some(qkey))
            .map(|qp| self.lacks_recv_wqe(qp))
    }

    /// `qpn` if it is a UD QP able to receive (with the Q_Key `qkey`, when given).
    fn ud_receiver(&self, qpn: Qpn, qkey: Option<Qkey>) -> Option<&Qp> {
        self.qp_ref(qpn).ok().filter(|qp| {
            qp.qp_type == QpType::Ud && qp.can_receive() && qkey.is_none_or(|k| k == qp.qkey())
        })
    }

    /// Whether neither `qp`'s receive queue nor its SRQ holds a receive WQE.
    fn lacks_recv_wqe(&self, qp: &Qp) -> bool {
        match qp.srq {
            Some(s) => matches!(self.sh.srqs.get(s as usize), Some(srq) if match &srq.shared {
                Some(w) => w.is_empty(),
                None => srq.rq.is_empty(),
            }),
            None => qp.rq.is_empty(),
        }
    }

    /// The dataplane holds `qpn`'s packet until the next hop towards `dgid` is resolved
    /// (`Qp::held_for`): an RC QP's ACK timeouts meanwhile cost no retries (the packets have
    /// not left); a UD or UC QP sends nothing more.
    fn hold_path(&mut self, qpn: Qpn, dgid: Gid) {
        if let Some(slot) = self.slot_of(qpn) {
            if let Some(Some(qp)) = self.qps.get_mut(slot) {
                qp.held_for = Some(dgid);
            }
        }
    }

    /// QPs held for `dgid` go on: when the held packets left (an RC QP counts its ACK
    /// timeout from then), when they were dropped, or - UD and UC QPs only - when the address
    /// is known but the packets wait for a pause. A UD or UC QP comes off the parked list,
    /// back in line. Returns how many QPs were released.
    fn release_held(&mut self, dgid: &Gid, outcome: HopOutcome) -> usize {
        let mut unparked = Vec::new();
        let mut n = 0;
        for (slot, qp) in self.qps.iter_mut().enumerate() {
            let Some(qp) = qp.as_deref_mut() else {
                continue;
            };
            if qp.held_for != Some(*dgid)
                || (qp.qp_type == QpType::Rc && outcome == HopOutcome::Known)
            {
                continue;
            }
            qp.held_for = None;
            n += 1;
            if qp.qp_type == QpType::Rc {
                if let (HopOutcome::Left(now), Some(_)) = (outcome, qp.comp.ack_deadline) {
                    qp.restart_ack_timer(&mut self.sh, now);
                }
            } else if qp.parked {
                // One not parked yet is still in line and sends on its turn.
                qp.parked = false;
                unparked.push(slot as u32);
            }
        }
        if !unparked.is_empty() {
            self.parked.retain(|s| !unparked.contains(s));
            for slot in unparked {
                self.mark_ready(slot);
            }
        }
        n
    }

    /// Moves every connected QP whose path leads to `dgid` to ERR with a QP_FATAL event: the
    /// dataplane calls this when the peer's MAC cannot be resolved, so applications get a clear
    /// error instead of waiting for the retry counter. Returns how many QPs it failed.
    fn fail_qps_to(&mut self, dgid: &Gid) -> usize {
        let mut n = 0;
        for slot in 0..self.qps.len() {
            let Some(qp) = self.qps[slot].as_deref_mut() else {
                continue;
            };
            let to_peer = qp.qp_type != QpType::Ud && qp.attr.av.is_some_and(|av| av.dgid == *dgid);
            if to_peer && !matches!(qp.state, QpState::Err | QpState::Reset | QpState::Init) {
                self.sh.events.push_back(AsyncEvent::QpFatal(qp.qpn));
                qp.error_cause = crate::verbs::vendor_err::PEER_UNREACHABLE;
                qp.enter_error(&mut self.sh);
                self.note_moved(slot);
                n += 1;
            }
        }
        n
    }

    /// Completions CQ `cq` holds that the dataplane has not taken yet (0 for no such CQ).
    pub fn cq_len(&self, cq: CqId) -> usize {
        self.sh
            .cqs
            .get(cq.0 as usize)
            .map_or(0, |c| c.entries.len())
    }

    /// Every CQ id that has completions waiting.
    pub fn cq_has_entries(&self, cq: CqId) -> bool {
        matches!(self.sh.cqs.get(cq.0 as usize), Some(c) if !c.entries.is_empty())
    }

    /// How many objects of each kind exist (for tools, and to check that a departed
    /// application's objects were released).
    pub fn object_counts(&self) -> ObjectCounts {
        ObjectCounts {
            pds: self.pds.len() as u32,
            mrs: self.sh.mrs.len() as u32,
            cqs: self.sh.cqs.len() as u32,
            qps: self.live_qps,
            srqs: self.sh.srqs.len() as u32,
        }
    }

    /// Counters of one QP.
    pub fn qp_counters(&self, qpn: Qpn) -> Option<QpCounters> {
        self.qp_ref(qpn).ok().map(|q| q.counters)
    }

    /// Device counters, and the port totals of every QP counter: every QP's since the device
    /// started, destroyed ones included (as `rdma statistic` shows port counters), so a run's
    /// retransmissions stay visible after its QPs are gone.
    pub fn counters(&self) -> (DeviceCounters, QpCounters) {
        let mut total = self.destroyed_qp_counters;
        for q in self.qps.iter().flatten() {
            total.add(&q.counters);
        }
        (self.sh.counters, total)
    }

    /// As [`Device::counters`], at a cost bounded however many QPs exist: the port totals
    /// are kept running and brought up to date for at most `budget` live QPs per call, in
    /// turn from where the last call stopped (empty slots are passed over: a pointer each).
    /// With more QPs than `budget`, a QP's latest counts show within (QPs / `budget`) calls;
    /// with fewer, the totals are exact. For a snapshot taken every millisecond: summing 16K
    /// QPs' counters each time took most of a worker's cycles (their cache lines, scattered
    /// over the QPs).
    pub fn counters_incremental(&mut self, budget: usize) -> (DeviceCounters, QpCounters) {
        let n = self.qps.len();
        let (mut visited, mut taken) = (0, 0);
        while visited < n && taken < budget {
            if self.running_cursor >= n {
                self.running_cursor = 0;
            }
            if let Some(q) = self.qps[self.running_cursor].as_deref_mut() {
                self.running_qp_counters.add(&q.counters);
                self.running_qp_counters.sub(&q.counted);
                q.counted = q.counters;
                taken += 1;
            }
            self.running_cursor += 1;
            visited += 1;
        }
        (self.sh.counters, self.running_qp_counters)
    }

    /// Copies the payload of `tx` into `out` (which must hold `tx.payload.len()` bytes), and
    /// with `icrc` feeds it to that ICRC computation too ([`Memory::read_summed`]).
    pub fn gather(
        &self,
        tx: &Transmit,
        out: &mut [u8],
        mut icrc: Option<&mut Icrc>,
    ) -> Result<(), MemoryError> {
        let inline = tx.payload.inline();
        if !inline.is_empty() {
            let out = &mut out[..inline.len()];
            match icrc {
                Some(c) => c.copy_from(out, inline),
                None => out.copy_from_slice(inline),
            }
            return Ok(());
        }
        let mut at = 0;
        for seg in tx.payload.segs() {
            let mem = self.memory(seg.mr).ok_or(MemoryError::OutOfBounds)?;
            let out = &mut out[at..at + seg.len as usize];
            match icrc.as_deref_mut() {
                Some(c) => mem.read_summed(seg.offset, out, c)?,
                None => mem.read(seg.offset, out)?,
            }
            at += seg.len as usize;
        }
        Ok(())
    }

    /// Writes the frame for `tx` (headers from `repr`, the gathered payload, pad and ICRC)
    /// into `frame`, which holds exactly `repr.frame_len(payload)` bytes.
    pub fn emit_frame(
        &self,
        tx: &Transmit,
        repr: &FrameRepr,
        frame: &mut [u8],
    ) -> Result<(), EmitError> {
        repr.emit_headers(frame, tx.payload.len())?;
        self.emit_payload(tx, repr.layout()?, frame)
    }

    /// [`Device::emit_frame`] with the Ethernet, IP and UDP headers from a template of the
    /// QP's path (the dataplane keeps one per QP) and IPv4 identification `ident`: the same
    /// frame for less work per packet. `frame` holds exactly
    /// `tmpl.frame_len(&tx.transport, payload)` bytes.
    pub fn emit_frame_from(
        &self,
        tx: &Transmit,
        tmpl: &HeaderTemplate,
        ident: u16,
        frame: &mut [u8],
    ) -> Result<(), EmitError> {
        let layout = tmpl.emit_headers(&tx.transport, ident, tx.payload.len(), frame)?;
        self.emit_payload(tx, layout, frame)
    }

    /// The payload and trailer of a frame whose headers are written: the one place a
    /// transmitted packet's payload is gathered. A payload of [`icrc::FUSED_MIN`] bytes or
    /// more is copied and summed in one pass; a shorter one is copied, then the whole frame
    /// is summed in one CRC call ([`FrameLayout::emit_trailer_in_place`]), which costs less
    /// per packet than the three calls of the other way.
    fn emit_payload(
        &self,
        tx: &Transmit,
        layout: FrameLayout,
        frame: &mut [u8],
    ) -> Result<(), EmitError> {
        let plen = tx.payload.len();
        let hlen = layout.header_len;
        let need = crate::wire::Error::BufferTooSmall { need: hlen + plen };
        if plen >= icrc::FUSED_MIN {
            let (hdr, rest) = frame.split_at_mut_checked(hlen).ok_or(need)?;
            let (payload, trailer) = rest.split_at_mut_checked(plen).ok_or(need)?;
            let mut c = layout.header_icrc(hdr)?;
            self.gather(tx, payload, Some(&mut c))?;
            layout.finish_trailer(c, plen, trailer)?;
        } else {
            let payload = frame.get_mut(hlen..hlen + plen).ok_or(need)?;
            self.gather(tx, payload, None)?;
            layout.emit_trailer_in_place(frame, plen)?;
        }
        Ok(())
    }

    /// Writes the whole frame for `tx` into `buf` (headers, gathered payload, pad, ICRC);
    /// returns its length. For tests, simulations and simple callers; the dataplane builds
    /// frames straight into mbufs with [`Device::emit_frame`].
    pub fn write_frame(
        &self,
        tx: &Transmit,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        vlan: Option<VlanTag>,
        ip_ident: u16,
        buf: &mut [u8],
    ) -> Result<usize, crate::wire::Error> {
        let repr = tx.frame_repr(src_mac, dst_mac, vlan, ip_ident);
        let total = repr.frame_len(tx.payload.len())?;
        if buf.len() < total {
            return Err(crate::wire::Error::BufferTooSmall { need: total });
        }
        self.emit_frame(tx, &repr, &mut buf[..total])
            .map_err(|e| match e {
                EmitError::Wire(w) => w,
                EmitError::Memory(_) => {
                    crate::wire::Error::Malformed(crate::wire::Layer::ExtHeaders)
                }
            })?;
        Ok(total)
    }

    /// Opcode name helper for logs.
    pub fn opcode_name(op: Opcode) -> &'static str {
        op.name()
    }
}
