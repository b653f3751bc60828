//! The application interface: a verbs-style API ([`Verbs`], implemented by [`Context`]) over
//! single-producer/single-consumer rings between an application thread and the worker that
//! owns the device.
//!
//! Per context: a command ring (application -> worker) and a reply ring (worker -> application)
//! for verbs calls; a ring per CQ (worker -> application) for completions; an event ring; and a
//! small area where the worker publishes each work queue's consumer index (QPs' send and
//! receive queues, SRQs), so `post_send`, `post_recv` and `post_srq_recv` can tell "queue
//! full" synchronously without a round trip, as with a hardware RNIC's doorbell rings.
//! Control calls (create/modify/query...) wait for their reply; posts do not. Slots are
//! fixed-size plain data (no pointers); memory is named by area id.
//!
//! Lookups on the post and poll paths are array indexing (QPs by `roce::engine::qp_slot`,
//! CQs and SRQs by id), never hashing. Inline data is copied into the work request when it
//! is posted (verbs lets the application reuse the buffer as soon as the call returns).
//!
//! Lifetimes: dropping a [`Context`] releases everything it created on the worker (QPs,
//! SRQs, CQs, MRs, PDs) and its ring areas; dropping the last handle of a [`Buffer`] forgets
//! its area (it is unmapped once no MR uses it). If the worker stops - cleanly or by a
//! panic - every call fails with `VerbsError::DeviceFatal` and `poll_event` reports
//! `AsyncEvent::DeviceFatal` once, instead of waiting forever.
//!
//! The multi-process client library of the next milestone implements the same [`Verbs`]
//! trait over the same rings, placed in shared memory.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use roce::engine::{
    qp_slot, CqId, Device, DeviceAttr, DeviceConfig, PortAttr, QpInit, SrqAttr, SrqId, VerbsError,
    VerbsResult, MAX_INLINE,
};
use roce::memory::PdId;
use roce::types::{Gid, Lkey, Qpn, Rkey};
use roce::verbs::{
    Access, AsyncEvent, Completion, QpAttr, QpCaps, QpInfo, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, UdDest, WcOpcode, WrOp,
};

use crate::area::{Area, AreaRegistry};
use crate::ring::{ring, Consumer, Plain, Producer};

/// Most SGEs a work request can carry through the host interface.
pub const MAX_HOST_SGE: usize = 16;
/// Command ring depth.
const CMD_RING: usize = 4096;
/// Event ring depth.
const EVENT_RING: usize = 1024;
/// Per-QP published indices: (send WQEs retired, receive WQEs retired).
const QP_INDEX_BYTES: usize = 16;
/// Per-SRQ published index: receive WQEs handed out.
const SRQ_INDEX_BYTES: usize = 8;

/// Bytes a send WR carries for its SGEs (16 bytes each) or, in their place, inline data.
const SEND_PAYLOAD: usize = MAX_HOST_SGE * 16;
const _: () = assert!(
    MAX_INLINE <= SEND_PAYLOAD,
    "inline data fits where the SGEs go"
);

/// A send WR as it travels through the command ring: its SGEs, or for an inline WR its
/// data, in one payload area (an inline WR has no SGEs), so a slot is no larger than either.
#[derive(Debug, Clone, Copy)]
pub struct SendWrData {
    /// Work request id.
    pub wr_id: u64,
    /// Operation.
    pub op: WrOp,
    /// Flags.
    pub flags: SendFlags,
    /// UD destination.
    pub ud: Option<UdDest>,
    /// SGE count (0 for inline data).
    pub nsge: u8,
    /// Inline payload bytes (0 unless inline).
    pub inline_len: u16,
    /// SGEs (address, length, lkey; little-endian) or inline bytes.
    pub payload: [u8; SEND_PAYLOAD],
}

impl SendWrData {
    fn new(wr: &SendWr<'_>) -> SendWrData {
        SendWrData {
            wr_id: wr.wr_id,
            op: wr.op,
            flags: wr.flags,
            ud: wr.ud,
            nsge: 0,
            inline_len: 0,
            payload: [0; SEND_PAYLOAD],
        }
    }

    fn set_sges(&mut self, list: &[Sge]) -> VerbsResult<()> {
        if list.len() > MAX_HOST_SGE {
            return Err(VerbsError::InvalidArgument(format!(
                "{} SGEs exceed {MAX_HOST_SGE}",
                list.len()
            )));
        }
        for (sge, b) in list.iter().zip(self.payload.chunks_exact_mut(16)) {
            b[..8].copy_from_slice(&sge.addr.to_le_bytes());
            b[8..12].copy_from_slice(&sge.length.to_le_bytes());
            b[12..].copy_from_slice(&sge.lkey.0.to_le_bytes());
        }
        self.nsge = list.len() as u8;
        Ok(())
    }

    /// The SGEs, decoded into `out` (a count beyond the maximum is clamped).
    pub fn sges<'a>(&self, out: &'a mut [Sge; MAX_HOST_SGE]) -> &'a [Sge] {
        let n = (self.nsge as usize).min(MAX_HOST_SGE);
        for (o, b) in out.iter_mut().zip(self.payload.chunks_exact(16)).take(n) {
            let word = |r: std::ops::Range<usize>| {
                let mut a = [0u8; 4];
                a.copy_from_slice(&b[r]);
                u32::from_le_bytes(a)
            };
            let mut addr = [0u8; 8];
            addr.copy_from_slice(&b[..8]);
            *o = Sge {
                addr: u64::from_le_bytes(addr),
                length: word(8..12),
                lkey: Lkey(word(12..16)),
            };
        }
        &out[..n]
    }

    /// The inline data (a length beyond the maximum is clamped).
    pub fn inline(&self) -> &[u8] {
        &self.payload[..(self.inline_len as usize).min(MAX_INLINE)]
    }
}

/// A receive WR as it travels through the command ring.
#[derive(Debug, Clone, Copy)]
pub struct RecvWrData {
    /// Work request id.
    pub wr_id: u64,
    /// SGE count.
    pub nsge: u8,
    /// SGEs.
    pub sges: [Sge; MAX_HOST_SGE],
}

fn pack_sges(list: &[Sge]) -> VerbsResult<(u8, [Sge; MAX_HOST_SGE])> {
    if list.len() > MAX_HOST_SGE {
        return Err(VerbsError::InvalidArgument(format!(
            "{} SGEs exceed {MAX_HOST_SGE}",
            list.len()
        )));
    }
    let mut a = [Sge::default(); MAX_HOST_SGE];
    a[..list.len()].copy_from_slice(list);
    Ok((list.len() as u8, a))
}

/// The sizes a host interface needs from its device: its per-object tables are indexed by
/// QP slot, CQ id and SRQ id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLimits {
    /// The device's `max_qp` (QP slots).
    pub max_qp: u32,
    /// The device's `max_cq`.
    pub max_cq: u32,
    /// The device's `max_srq`.
    pub max_srq: u32,
}

impl HostLimits {
    /// The limits of a device with this configuration.
    pub fn of(cfg: &DeviceConfig) -> HostLimits {
        HostLimits {
            max_qp: cfg.limits.max_qp,
            max_cq: cfg.limits.max_cq,
            max_srq: cfg.limits.max_srq,
        }
    }

    fn index_bytes(&self) -> usize {
        self.max_qp as usize * QP_INDEX_BYTES + self.max_srq as usize * SRQ_INDEX_BYTES
    }

    fn srq_index_off(&self, srq: usize) -> usize {
        self.max_qp as usize * QP_INDEX_BYTES + srq * SRQ_INDEX_BYTES
    }
}

/// A verbs call.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
#[allow(clippy::large_enum_variant)] // fixed-size ring slot, see ReplyData
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
    RegMr {
        pd: PdId,
        area: u32,
        offset: u64,
        len: u64,
        access: Access,
        iova: Option<u64>,
    },
    AllocMr {
        pd: PdId,
        area: u32,
    },
    DeregMr {
        lkey: Lkey,
    },
    CreateCq {
        cqe: u32,
        ring: u32,
        capacity: u32,
    },
    DestroyCq {
        cq: CqId,
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
    PostSrqRecv {
        srq: SrqId,
        wr: RecvWrData,
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
    PostSend {
        qpn: Qpn,
        wr: SendWrData,
    },
    PostRecv {
        qpn: Qpn,
        wr: RecvWrData,
    },
    Counters {
        qpn: Option<Qpn>,
    },
    /// The application is going away: release everything it created.
    Close,
}

impl Command {
    fn is_post(&self) -> bool {
        matches!(
            self,
            Command::PostSend { .. } | Command::PostRecv { .. } | Command::PostSrqRecv { .. }
        )
    }
}

/// Device attributes as plain data (the firmware string is fixed).
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
// Ring slots are fixed-size by design: boxing a variant would put a pointer in the slot.
#[allow(clippy::large_enum_variant)]
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
    Counters {
        n: u8,
        vals: [u64; 64],
    },
}

/// `PortAttr` as plain data.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct PortAttrData {
    pub active: bool,
    pub max_mtu: roce::verbs::Mtu,
    pub active_mtu: roce::verbs::Mtu,
    pub gid_tbl_len: u32,
    pub pkey_tbl_len: u32,
}

/// Error kinds (mirrors `VerbsError` without its strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum ErrKind {
    InvalidArgument,
    NoResources,
    NotFound,
    Busy,
    QueueFull,
    InvalidState(QpState),
    Modify,
    DeviceFatal,
}

/// A reply.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
#[allow(clippy::large_enum_variant)] // fixed-size ring slot, see ReplyData
pub enum Reply {
    Ok(ReplyData),
    Err {
        kind: ErrKind,
        len: u8,
        msg: [u8; 160],
    },
}

/// A numbered command.
#[derive(Debug, Clone, Copy)]
pub struct Req {
    /// Sequence number (replies carry it back).
    pub seq: u64,
    /// The call.
    pub cmd: Command,
}

/// A numbered reply.
#[derive(Debug, Clone, Copy)]
pub struct Resp {
    /// Sequence number of the command.
    pub seq: u64,
    /// Result.
    pub reply: Reply,
}

// SAFETY: plain data: integers, arrays, Copy enums of them; no pointers.
unsafe impl Plain for Req {}
// SAFETY: as Req.
unsafe impl Plain for Resp {}
// SAFETY: Completion holds integers and Copy newtypes only.
unsafe impl Plain for Completion {}
// SAFETY: AsyncEvent holds integers and Copy newtypes only.
unsafe impl Plain for AsyncEvent {}

fn to_reply(r: VerbsResult<ReplyData>) -> Reply {
    match r {
        Ok(d) => Reply::Ok(d),
        Err(e) => {
            let kind = match &e {
                VerbsError::InvalidArgument(_) => ErrKind::InvalidArgument,
                VerbsError::NoResources(_) => ErrKind::NoResources,
                VerbsError::NotFound(_) => ErrKind::NotFound,
                VerbsError::Busy(_) => ErrKind::Busy,
                VerbsError::QueueFull => ErrKind::QueueFull,
                VerbsError::InvalidState(s) => ErrKind::InvalidState(*s),
                VerbsError::Modify(_) => ErrKind::Modify,
                VerbsError::DeviceFatal => ErrKind::DeviceFatal,
            };
            // The detail only: the receiving side rebuilds the error from `kind`, whose
            // Display adds the prefix ("invalid argument: ...") once.
            let text = match &e {
                VerbsError::InvalidArgument(t) => t.clone(),
                other => other.to_string(),
            };
            let mut msg = [0u8; 160];
            let n = text.len().min(160);
            msg[..n].copy_from_slice(&text.as_bytes()[..n]);
            Reply::Err {
                kind,
                len: n as u8,
                msg,
            }
        }
    }
}

fn from_reply(r: Reply) -> VerbsResult<ReplyData> {
    match r {
        Reply::Ok(d) => Ok(d),
        Reply::Err { kind, len, msg } => {
            let text = String::from_utf8_lossy(&msg[..len as usize]).into_owned();
            Err(match kind {
                ErrKind::QueueFull => VerbsError::QueueFull,
                ErrKind::DeviceFatal => VerbsError::DeviceFatal,
                ErrKind::InvalidState(s) => VerbsError::InvalidState(s),
                ErrKind::NotFound => VerbsError::NotFound(leak_name(&text)),
                ErrKind::Busy => VerbsError::Busy(leak_name(&text)),
                ErrKind::NoResources => VerbsError::NoResources(leak_name(&text)),
                ErrKind::InvalidArgument | ErrKind::Modify => VerbsError::InvalidArgument(text),
            })
        }
    }
}

/// `VerbsError` carries `&'static str` object names; map the few known ones back.
fn leak_name(text: &str) -> &'static str {
    for n in [
        "protection domain",
        "memory regions",
        "memory region",
        "completion queues",
        "completion queue",
        "shared receive queues",
        "shared receive queue",
        "queue pairs",
        "queue pair",
    ] {
        if text.contains(n) {
            return n;
        }
    }
    "object"
}

/// Counters of one host interface (one application context), reported with the device's
/// counters as `host_*`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounters {
    /// Posts that passed the application-side checks but failed on the worker (a WQE for a
    /// QP completes with LOC_QP_OP_ERR; an SRQ WQE is dropped).
    pub failed_posts: u64,
    /// Asynchronous events dropped because the application's event ring was full.
    pub events_dropped: u64,
}

impl HostCounters {
    /// Counter names, in the order of `values`.
    pub const NAMES: [&'static str; 2] = ["host_failed_posts", "host_events_dropped"];

    /// Values, in the order of `NAMES`.
    pub fn values(&self) -> [u64; 2] {
        [self.failed_posts, self.events_dropped]
    }
}

struct BufferInner {
    area: Arc<Area>,
    reg: Weak<AreaRegistry>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // Forget the area; MRs still registered on it keep it mapped until deregistered.
        if let Some(r) = self.reg.upgrade() {
            r.remove(self.area.id());
        }
    }
}

/// Application memory a context allocated (registered as MRs, advertised to peers). Clones
/// share the memory; when the last one is dropped the memory is released (once no MR uses
/// it any more).
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer({:?})", self.inner.area)
    }
}

impl Buffer {
    fn area(&self) -> &Arc<Area> {
        &self.inner.area
    }

    /// Length.
    pub fn len(&self) -> usize {
        self.area().len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.area().is_empty()
    }

    /// Address (what MRs are registered at and peers are told).
    pub fn addr(&self) -> u64 {
        self.area().addr()
    }

    /// Copies bytes in.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.area()
            .write_at(off, data)
            .expect("Buffer::write in bounds");
    }

    /// Copies bytes out.
    pub fn read(&self, off: usize, out: &mut [u8]) {
        self.area()
            .read_at(off, out)
            .expect("Buffer::read in bounds");
    }

    /// A copy of `len` bytes at `off`.
    pub fn to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read(off, &mut v);
        v
    }

    /// Reads one byte with acquire ordering (poll for an incoming WRITE's last byte).
    pub fn load_u8(&self, off: usize) -> u8 {
        self.area().load_u8(off)
    }

    /// Fills the buffer with `b`.
    pub fn fill(&self, b: u8) {
        let chunk = vec![b; 65536.min(self.len().max(1))];
        let mut off = 0;
        while off < self.len() {
            let n = chunk.len().min(self.len() - off);
            self.write(off, &chunk[..n]);
            off += n;
        }
    }

    /// Area id (for the multi-process interface).
    pub fn area_id(&self) -> u32 {
        self.area().id()
    }
}

/// A registered memory region, as the application sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mr {
    /// Local key.
    pub lkey: Lkey,
    /// Remote key (with remote access).
    pub rkey: Option<Rkey>,
    /// First address.
    pub addr: u64,
    /// Length.
    pub len: u64,
}

impl Mr {
    /// An SGE of `len` bytes at offset `off` of this MR.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + off,
            length: len,
            lkey: self.lkey,
        }
    }
}

/// The verbs API applications use; the in-process [`Context`] implements it, and the
/// multi-process client library will too, so tools run either way.
pub trait Verbs {
    /// `ibv_query_device`.
    fn query_device(&mut self) -> VerbsResult<DeviceAttr>;
    /// `ibv_query_port` (port 1).
    fn query_port(&mut self) -> VerbsResult<PortAttrData>;
    /// `ibv_query_gid`.
    fn query_gid(&mut self, index: u8) -> VerbsResult<Gid>;
    /// `ibv_alloc_pd`.
    fn alloc_pd(&mut self) -> VerbsResult<PdId>;
    /// `ibv_dealloc_pd`.
    fn dealloc_pd(&mut self, pd: PdId) -> VerbsResult<()>;
    /// Allocates application memory the RNIC can reach.
    fn alloc_buffer(&mut self, len: usize) -> VerbsResult<Buffer>;
    /// `ibv_reg_mr` over `len` bytes at `offset` of `buf`.
    fn reg_mr(
        &mut self,
        pd: PdId,
        buf: &Buffer,
        offset: usize,
        len: usize,
        access: Access,
    ) -> VerbsResult<Mr>;
    /// `ibv_reg_mr_iova`: like `reg_mr`, but peers address the region from `iova` instead of
    /// the buffer's address.
    fn reg_mr_iova(
        &mut self,
        pd: PdId,
        buf: &Buffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> VerbsResult<Mr>;
    /// `ibv_dereg_mr`.
    fn dereg_mr(&mut self, mr: &Mr) -> VerbsResult<()>;
    /// `ibv_create_cq`.
    fn create_cq(&mut self, cqe: u32) -> VerbsResult<CqId>;
    /// `ibv_destroy_cq`.
    fn destroy_cq(&mut self, cq: CqId) -> VerbsResult<()>;
    /// `ibv_poll_cq`: fills `out`, returns how many.
    fn poll_cq(&mut self, cq: CqId, out: &mut [Completion]) -> VerbsResult<usize>;
    /// `ibv_create_qp`.
    fn create_qp(&mut self, init: &QpInit) -> VerbsResult<Qpn>;
    /// `ibv_modify_qp`.
    fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> VerbsResult<()>;
    /// `ibv_query_qp`.
    fn query_qp(&mut self, qpn: Qpn) -> VerbsResult<QpInfo>;
    /// `ibv_destroy_qp`.
    fn destroy_qp(&mut self, qpn: Qpn) -> VerbsResult<()>;
    /// `ibv_post_send` (one WR). With `SendFlags::INLINE` the SGEs' bytes are copied before
    /// the call returns (they must lie in buffers of this context, registered or not).
    fn post_send(&mut self, qpn: Qpn, wr: &SendWr<'_>) -> VerbsResult<()>;
    /// `ibv_post_send` of an inline SEND or WRITE whose payload is `data` (any memory): the
    /// bytes are copied before the call returns; `wr.sg_list` must be empty.
    fn post_send_inline(&mut self, qpn: Qpn, wr: &SendWr<'_>, data: &[u8]) -> VerbsResult<()>;
    /// `ibv_post_recv` (one WR).
    fn post_recv(&mut self, qpn: Qpn, wr: &RecvWr<'_>) -> VerbsResult<()>;
    /// `ibv_create_srq`.
    fn create_srq(&mut self, pd: PdId, attr: &SrqAttr) -> VerbsResult<SrqId>;
    /// `ibv_modify_srq` with IBV_SRQ_LIMIT: arms the limit event (0 disarms).
    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> VerbsResult<()>;
    /// `ibv_query_srq`.
    fn query_srq(&mut self, srq: SrqId) -> VerbsResult<SrqAttr>;
    /// `ibv_destroy_srq`.
    fn destroy_srq(&mut self, srq: SrqId) -> VerbsResult<()>;
    /// `ibv_post_srq_recv`.
    fn post_srq_recv(&mut self, srq: SrqId, wr: &RecvWr<'_>) -> VerbsResult<()>;
    /// Next asynchronous event.
    fn poll_event(&mut self) -> Option<AsyncEvent>;
    /// Counters of a QP, or of the whole device (QP counters summed plus device ones, plus
    /// this context's host counters).
    fn counters(&mut self, qpn: Option<Qpn>) -> VerbsResult<Vec<(&'static str, u64)>>;
}

struct QpLocal {
    qpn: Qpn,
    caps: QpCaps,
    qp_type: QpType,
    state: QpState,
    srq: bool,
    sq_posted: u64,
    rq_posted: u64,
}

struct SrqLocal {
    max_wr: u32,
    max_sge: u32,
    posted: u64,
}

/// An application's handle on an RNIC (in-process backend of [`Verbs`]).
pub struct Context {
    reg: Arc<AreaRegistry>,
    cmds: Producer<Req>,
    replies: Consumer<Resp>,
    events: Consumer<AsyncEvent>,
    index: Arc<Area>,
    limits: HostLimits,
    seq: u64,
    /// CQ rings by CQ id.
    cqs: Vec<Option<Consumer<Completion>>>,
    /// QPs by slot (`qp_slot`).
    qps: Vec<Option<QpLocal>>,
    /// SRQs by id.
    srqs: Vec<Option<SrqLocal>>,
    /// This context's buffers by address (for inline data).
    buffers: BTreeMap<u64, Weak<Area>>,
    /// Ring areas this context created (forgotten when it is dropped).
    own_areas: Vec<u32>,
    alive: Arc<AtomicBool>,
    fatal_reported: bool,
}

/// Creates both ends of a context for a device with `limits`. `alive` is cleared when the
/// worker stops (also by a panic), so calls fail instead of waiting forever.
pub fn context(
    reg: Arc<AreaRegistry>,
    limits: HostLimits,
    alive: Arc<AtomicBool>,
) -> std::io::Result<(Context, HostEnd)> {
    let (cmd_id, cmd_p, cmd_c) = ring::<Req>(&reg, CMD_RING)?;
    let (rep_id, rep_p, rep_c) = ring::<Resp>(&reg, 256)?;
    let (ev_id, ev_p, ev_c) = ring::<AsyncEvent>(&reg, EVENT_RING)?;
    let index = reg.create(limits.index_bytes())?;
    let own_areas = vec![cmd_id, rep_id, ev_id, index.id()];
    Ok((
        Context {
            reg: reg.clone(),
            cmds: cmd_p,
            replies: rep_c,
            events: ev_c,
            index: index.clone(),
            limits,
            seq: 0,
            cqs: (0..limits.max_cq).map(|_| None).collect(),
            qps: (0..limits.max_qp).map(|_| None).collect(),
            srqs: (0..limits.max_srq).map(|_| None).collect(),
            buffers: BTreeMap::new(),
            own_areas,
            alive,
            fatal_reported: false,
        },
        HostEnd {
            reg,
            cmds: cmd_c,
            replies: rep_p,
            events: ev_p,
            cqs: (0..limits.max_cq).map(|_| None).collect(),
            pending_cqs: Vec::new(),
            index,
            limits,
            qps: Vec::new(),
            srqs: Vec::new(),
            mrs: Vec::new(),
            pds: Vec::new(),
            scratch: Vec::with_capacity(64),
            counters: HostCounters::default(),
            id: u16::MAX,
            closed: false,
        },
    ))
}

/// How many WQEs the worker published as retired at `off` of the index area.
fn retired(index: &Area, off: usize) -> u64 {
    index
        .atomic_u64(off)
        .map(|a| a.load(Ordering::Acquire))
        .unwrap_or(0)
}

fn backoff(spins: u32) {
    if spins < 200 {
        std::hint::spin_loop();
    } else if spins < 1000 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(20));
    }
}

/// Unwraps the reply variant a call expects; any other is a protocol error.
macro_rules! expect_reply {
    ($r:expr, $pat:pat => $v:expr) => {
        match $r? {
            $pat => Ok($v),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    };
}

impl Context {
    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    fn push(&mut self, cmd: Command) -> VerbsResult<u64> {
        if !self.alive() {
            return Err(VerbsError::DeviceFatal);
        }
        self.seq += 1;
        let req = Req { seq: self.seq, cmd };
        let mut spins = 0u32;
        while !self.cmds.push(&req) {
            if !self.alive() {
                return Err(VerbsError::DeviceFatal);
            }
            spins += 1;
            backoff(spins);
        }
        Ok(self.seq)
    }

    fn call(&mut self, cmd: Command) -> VerbsResult<ReplyData> {
        self.call_until(cmd, None)
    }

    /// A call that gives up (DeviceFatal) at `deadline`, if one is given.
    fn call_until(&mut self, cmd: Command, deadline: Option<Instant>) -> VerbsResult<ReplyData> {
        let seq = self.push(cmd)?;
        let mut spins = 0u32;
        loop {
            if let Some(r) = self.replies.pop() {
                if r.seq == seq {
                    return from_reply(r.reply);
                }
                continue; // a stale reply (cannot happen with in-order rings)
            }
            if !self.alive() || deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(VerbsError::DeviceFatal);
            }
            spins += 1;
            backoff(spins);
        }
    }

    fn reg_at(
        &mut self,
        pd: PdId,
        buf: &Buffer,
        offset: usize,
        len: usize,
        iova: Option<u64>,
        access: Access,
    ) -> VerbsResult<Mr> {
        let cmd = Command::RegMr {
            pd,
            area: buf.area_id(),
            offset: offset as u64,
            len: len as u64,
            access,
            iova,
        };
        expect_reply!(self.call(cmd), ReplyData::Keys { lkey, rkey } => Mr {
            lkey,
            rkey,
            addr: iova.unwrap_or(buf.addr() + offset as u64),
            len: len as u64,
        })
    }

    /// Waits until the worker has processed every command sent so far.
    pub fn sync(&mut self) -> VerbsResult<()> {
        self.call(Command::QueryPort).map(|_| ())
    }

    fn qp_mut(&mut self, qpn: Qpn) -> VerbsResult<&mut QpLocal> {
        qp_slot(qpn, self.limits.max_qp)
            .and_then(|s| self.qps.get_mut(s))
            .and_then(|q| q.as_mut())
            .filter(|q| q.qpn == qpn)
            .ok_or(VerbsError::NotFound("queue pair"))
    }

    /// Copies `sges`' bytes out of this context's buffers into `out` (inline data).
    fn gather_inline(&self, sges: &[Sge], out: &mut [u8]) -> VerbsResult<usize> {
        let mut n = 0;
        for sge in sges {
            let len = sge.length as usize;
            let area = self
                .buffers
                .range(..=sge.addr)
                .next_back()
                .and_then(|(_, w)| w.upgrade())
                .filter(|a| sge.addr + len as u64 <= a.addr() + a.len() as u64)
                .ok_or_else(|| {
                    VerbsError::InvalidArgument(format!(
                        "inline SGE at {:#x} (+{len}) is not in a buffer of this context",
                        sge.addr
                    ))
                })?;
            area.read_at((sge.addr - area.addr()) as usize, &mut out[n..n + len])
                .map_err(|_| VerbsError::InvalidArgument("inline SGE unreadable".into()))?;
            n += len;
        }
        Ok(n)
    }

    /// The application-side checks of a send post (synchronous, no round trip; the worker
    /// re-checks and turns a late failure into an error completion), then the post.
    fn post_send_data(
        &mut self,
        qpn: Qpn,
        wr: &SendWr<'_>,
        inline: Option<&[u8]>,
    ) -> VerbsResult<()> {
        if !self.alive() {
            return Err(VerbsError::DeviceFatal);
        }
        let slot = qp_slot(qpn, self.limits.max_qp).unwrap_or(usize::MAX);
        let q = self.qp_mut(qpn)?;
        if matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(q.state));
        }
        let (caps, qp_type) = (q.caps, q.qp_type);
        let sq_posted = q.sq_posted;
        let sq_retired = retired(&self.index, slot * QP_INDEX_BYTES);
        if sq_posted.wrapping_sub(sq_retired) >= caps.max_send_wr as u64 {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > caps.max_send_sge as usize {
            return Err(VerbsError::InvalidArgument(format!(
                "{} SGEs exceed max_send_sge {}",
                wr.sg_list.len(),
                caps.max_send_sge
            )));
        }
        if qp_type == QpType::Ud && wr.ud.is_none() {
            return Err(VerbsError::InvalidArgument(
                "UD sends need an address handle".into(),
            ));
        }
        let mut data = SendWrData::new(wr);
        let is_inline = wr.flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic();
        if is_inline {
            let n: u64 = match inline {
                Some(d) => d.len() as u64,
                None => wr.sg_list.iter().map(|s| s.length as u64).sum(),
            };
            if n > caps.max_inline_data as u64 {
                return Err(VerbsError::InvalidArgument(format!(
                    "{n} inline bytes exceed max_inline_data {}",
                    caps.max_inline_data
                )));
            }
            let copied = match inline {
                Some(d) => {
                    data.payload[..d.len()].copy_from_slice(d);
                    d.len()
                }
                None => self.gather_inline(wr.sg_list, &mut data.payload[..MAX_INLINE])?,
            };
            data.inline_len = copied as u16;
        } else {
            if inline.is_some() {
                return Err(VerbsError::InvalidArgument(
                    "inline data needs the INLINE flag on a SEND or WRITE".into(),
                ));
            }
            data.set_sges(wr.sg_list)?;
        }
        self.push(Command::PostSend { qpn, wr: data })?;
        if let Ok(q) = self.qp_mut(qpn) {
            q.sq_posted += 1;
        }
        Ok(())
    }
}

impl Drop for Context {
    /// Releases what the application created on the worker, then the context's ring areas.
    fn drop(&mut self) {
        if self.alive() {
            // A worker that is alive but not polling (stopped by its owner) must not hang
            // the application: wait a bounded time.
            let deadline = Instant::now() + std::time::Duration::from_secs(2);
            let _ = self.call_until(Command::Close, Some(deadline));
        }
        for id in self.own_areas.drain(..) {
            self.reg.remove(id);
        }
    }
}

impl Verbs for Context {
    fn query_device(&mut self) -> VerbsResult<DeviceAttr> {
        expect_reply!(self.call(Command::QueryDevice), ReplyData::Device(d) => d)
    }

    fn query_port(&mut self) -> VerbsResult<PortAttrData> {
        expect_reply!(self.call(Command::QueryPort), ReplyData::Port(p) => p)
    }

    fn query_gid(&mut self, index: u8) -> VerbsResult<Gid> {
        expect_reply!(self.call(Command::QueryGid { index }), ReplyData::Gid(g) => g)
    }

    fn alloc_pd(&mut self) -> VerbsResult<PdId> {
        expect_reply!(self.call(Command::AllocPd), ReplyData::Pd(p) => p)
    }

    fn dealloc_pd(&mut self, pd: PdId) -> VerbsResult<()> {
        self.call(Command::DeallocPd { pd }).map(|_| ())
    }

    fn alloc_buffer(&mut self, len: usize) -> VerbsResult<Buffer> {
        let area = self.reg.create(len).map_err(|e| {
            VerbsError::InvalidArgument(format!("cannot allocate {len} bytes: {e}"))
        })?;
        self.buffers.retain(|_, w| w.strong_count() > 0);
        self.buffers.insert(area.addr(), Arc::downgrade(&area));
        Ok(Buffer {
            inner: Arc::new(BufferInner {
                area,
                reg: Arc::downgrade(&self.reg),
            }),
        })
    }

    fn reg_mr(
        &mut self,
        pd: PdId,
        buf: &Buffer,
        offset: usize,
        len: usize,
        access: Access,
    ) -> VerbsResult<Mr> {
        self.reg_at(pd, buf, offset, len, None, access)
    }

    fn reg_mr_iova(
        &mut self,
        pd: PdId,
        buf: &Buffer,
        offset: usize,
        len: usize,
        iova: u64,
        access: Access,
    ) -> VerbsResult<Mr> {
        self.reg_at(pd, buf, offset, len, Some(iova), access)
    }

    fn dereg_mr(&mut self, mr: &Mr) -> VerbsResult<()> {
        self.call(Command::DeregMr { lkey: mr.lkey }).map(|_| ())
    }

    fn create_cq(&mut self, cqe: u32) -> VerbsResult<CqId> {
        let capacity = (cqe.max(1) as usize).next_power_of_two();
        let (ring_id, prod, cons) = ring::<Completion>(&self.reg, capacity).map_err(|e| {
            VerbsError::InvalidArgument(format!("cannot allocate the CQ ring: {e}"))
        })?;
        drop(prod); // the worker attaches its own producer end
        let r = self.call(Command::CreateCq {
            cqe,
            ring: ring_id,
            capacity: capacity as u32,
        });
        match expect_reply!(r, ReplyData::Cq(cq) => cq) {
            Ok(cq) => match self.cqs.get_mut(cq.0 as usize) {
                Some(slot) => {
                    *slot = Some(cons);
                    self.own_areas.push(ring_id);
                    Ok(cq)
                }
                None => {
                    let _ = self.call(Command::DestroyCq { cq });
                    self.reg.remove(ring_id);
                    Err(VerbsError::NoResources("completion queues"))
                }
            },
            Err(e) => {
                self.reg.remove(ring_id);
                Err(e)
            }
        }
    }

    fn destroy_cq(&mut self, cq: CqId) -> VerbsResult<()> {
        self.call(Command::DestroyCq { cq })?;
        if let Some(slot) = self.cqs.get_mut(cq.0 as usize) {
            *slot = None;
        }
        Ok(())
    }

    #[inline]
    fn poll_cq(&mut self, cq: CqId, out: &mut [Completion]) -> VerbsResult<usize> {
        let ring = self
            .cqs
            .get_mut(cq.0 as usize)
            .and_then(|r| r.as_mut())
            .ok_or(VerbsError::NotFound("completion queue"))?;
        let mut n = 0;
        while n < out.len() {
            match ring.pop() {
                Some(c) => {
                    out[n] = c;
                    n += 1;
                }
                None => break,
            }
        }
        if n == 0 && !self.alive.load(Ordering::Acquire) {
            return Err(VerbsError::DeviceFatal);
        }
        Ok(n)
    }

    fn create_qp(&mut self, init: &QpInit) -> VerbsResult<Qpn> {
        if init.caps.max_send_sge as usize > MAX_HOST_SGE
            || init.caps.max_recv_sge as usize > MAX_HOST_SGE
        {
            return Err(VerbsError::InvalidArgument(format!(
                "at most {MAX_HOST_SGE} SGEs per WR"
            )));
        }
        let (qpn, slot) = expect_reply!(self.call(Command::CreateQp { init: *init }), ReplyData::Qp(q, s) => (q, s))?;
        if qp_slot(qpn, self.limits.max_qp) != Some(slot as usize) {
            let _ = self.call(Command::DestroyQp { qpn });
            return Err(VerbsError::InvalidArgument(format!(
                "QP {qpn:?} came back in slot {slot}, not its own"
            )));
        }
        let caps = match self.call(Command::QueryQp { qpn })? {
            ReplyData::QpInfo(i) => i.caps,
            _ => init.caps,
        };
        self.qps[slot as usize] = Some(QpLocal {
            qpn,
            caps,
            qp_type: init.qp_type,
            state: QpState::Reset,
            srq: init.srq.is_some(),
            sq_posted: 0,
            rq_posted: 0,
        });
        Ok(qpn)
    }

    fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> VerbsResult<()> {
        self.call(Command::ModifyQp { qpn, attr: *attr })?;
        if let Ok(q) = self.qp_mut(qpn) {
            if let Some(s) = attr.state {
                q.state = s;
                if s == QpState::Reset {
                    q.sq_posted = 0;
                    q.rq_posted = 0;
                }
            }
        }
        Ok(())
    }

    fn query_qp(&mut self, qpn: Qpn) -> VerbsResult<QpInfo> {
        let i = expect_reply!(self.call(Command::QueryQp { qpn }), ReplyData::QpInfo(i) => i)?;
        if let Ok(q) = self.qp_mut(qpn) {
            q.state = i.state;
        }
        Ok(i)
    }

    fn destroy_qp(&mut self, qpn: Qpn) -> VerbsResult<()> {
        self.call(Command::DestroyQp { qpn })?;
        if let Some(slot) = qp_slot(qpn, self.limits.max_qp).and_then(|s| self.qps.get_mut(s)) {
            *slot = None;
        }
        Ok(())
    }

    #[inline]
    fn post_send(&mut self, qpn: Qpn, wr: &SendWr<'_>) -> VerbsResult<()> {
        self.post_send_data(qpn, wr, None)
    }

    fn post_send_inline(&mut self, qpn: Qpn, wr: &SendWr<'_>, data: &[u8]) -> VerbsResult<()> {
        if !wr.sg_list.is_empty() {
            return Err(VerbsError::InvalidArgument(
                "an inline post carries its data, not SGEs".into(),
            ));
        }
        self.post_send_data(qpn, wr, Some(data))
    }

    #[inline]
    fn post_recv(&mut self, qpn: Qpn, wr: &RecvWr<'_>) -> VerbsResult<()> {
        if !self.alive() {
            return Err(VerbsError::DeviceFatal);
        }
        let slot = qp_slot(qpn, self.limits.max_qp).unwrap_or(usize::MAX);
        let index = self.index.clone();
        let q = self.qp_mut(qpn)?;
        if q.srq {
            return Err(VerbsError::InvalidArgument(
                "the QP uses an SRQ: post to the SRQ".into(),
            ));
        }
        if q.state == QpState::Reset {
            return Err(VerbsError::InvalidState(q.state));
        }
        let rq_retired = retired(&index, slot * QP_INDEX_BYTES + 8);
        if q.rq_posted.wrapping_sub(rq_retired) >= q.caps.max_recv_wr as u64 {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > q.caps.max_recv_sge as usize {
            return Err(VerbsError::InvalidArgument(format!(
                "{} SGEs exceed max_recv_sge {}",
                wr.sg_list.len(),
                q.caps.max_recv_sge
            )));
        }
        let (nsge, sges) = pack_sges(wr.sg_list)?;
        self.push(Command::PostRecv {
            qpn,
            wr: RecvWrData {
                wr_id: wr.wr_id,
                nsge,
                sges,
            },
        })?;
        if let Ok(q) = self.qp_mut(qpn) {
            q.rq_posted += 1;
        }
        Ok(())
    }

    fn create_srq(&mut self, pd: PdId, attr: &SrqAttr) -> VerbsResult<SrqId> {
        let s = expect_reply!(self.call(Command::CreateSrq { pd, attr: *attr }), ReplyData::Srq(s) => s)?;
        match self.srqs.get_mut(s.0 as usize) {
            Some(slot) => {
                *slot = Some(SrqLocal {
                    max_wr: attr.max_wr,
                    max_sge: attr.max_sge,
                    posted: 0,
                });
                Ok(s)
            }
            None => {
                let _ = self.call(Command::DestroySrq { srq: s });
                Err(VerbsError::NoResources("shared receive queues"))
            }
        }
    }

    fn modify_srq(&mut self, srq: SrqId, limit: u32) -> VerbsResult<()> {
        self.call(Command::ModifySrq { srq, limit }).map(|_| ())
    }

    fn query_srq(&mut self, srq: SrqId) -> VerbsResult<SrqAttr> {
        expect_reply!(self.call(Command::QuerySrq { srq }), ReplyData::SrqAttr(a) => a)
    }

    fn destroy_srq(&mut self, srq: SrqId) -> VerbsResult<()> {
        self.call(Command::DestroySrq { srq })?;
        if let Some(slot) = self.srqs.get_mut(srq.0 as usize) {
            *slot = None;
        }
        Ok(())
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr: &RecvWr<'_>) -> VerbsResult<()> {
        if !self.alive() {
            return Err(VerbsError::DeviceFatal);
        }
        let off = self.limits.srq_index_off(srq.0 as usize);
        let index = self.index.clone();
        let s = self
            .srqs
            .get_mut(srq.0 as usize)
            .and_then(|s| s.as_mut())
            .ok_or(VerbsError::NotFound("shared receive queue"))?;
        if wr.sg_list.len() > s.max_sge as usize {
            return Err(VerbsError::InvalidArgument(format!(
                "{} SGEs exceed the SRQ's {}",
                wr.sg_list.len(),
                s.max_sge
            )));
        }
        // Full when every WQE posted is still waiting to be handed out (IBA: post to a full
        // SRQ fails; ibv_post_srq_recv returns ENOMEM).
        if s.posted.wrapping_sub(retired(&index, off)) >= s.max_wr as u64 {
            return Err(VerbsError::QueueFull);
        }
        let (nsge, sges) = pack_sges(wr.sg_list)?;
        self.push(Command::PostSrqRecv {
            srq,
            wr: RecvWrData {
                wr_id: wr.wr_id,
                nsge,
                sges,
            },
        })?;
        if let Some(Some(s)) = self.srqs.get_mut(srq.0 as usize) {
            s.posted += 1;
        }
        Ok(())
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        if let Some(e) = self.events.pop() {
            return Some(e);
        }
        if !self.fatal_reported && !self.alive() {
            self.fatal_reported = true;
            return Some(AsyncEvent::DeviceFatal);
        }
        None
    }

    fn counters(&mut self, qpn: Option<Qpn>) -> VerbsResult<Vec<(&'static str, u64)>> {
        let (n, vals) = expect_reply!(self.call(Command::Counters { qpn }), ReplyData::Counters { n, vals } => (n, vals))?;
        let names = roce::engine::QpCounters::NAMES
            .iter()
            .chain(roce::engine::DeviceCounters::NAMES)
            .chain(HostCounters::NAMES.iter());
        Ok(names
            .copied()
            .zip(vals[..n as usize].iter().copied())
            .collect())
    }
}

/// Which host interface owns each QP (by slot), CQ and SRQ of a device, so the worker routes
/// queue positions, completions and events to the application that created the object.
#[derive(Debug, Clone)]
pub struct Owners {
    qp: Vec<u16>,
    cq: Vec<u16>,
    srq: Vec<u16>,
}

/// No owner.
const NOBODY: u16 = u16::MAX;

impl Owners {
    /// Empty tables for a device with `limits`.
    pub fn new(limits: HostLimits) -> Owners {
        Owners {
            qp: vec![NOBODY; limits.max_qp as usize],
            cq: vec![NOBODY; limits.max_cq as usize],
            srq: vec![NOBODY; limits.max_srq as usize],
        }
    }

    fn set(table: &mut [u16], i: usize, host: u16) {
        if let Some(e) = table.get_mut(i) {
            *e = host;
        }
    }

    fn get(table: &[u16], i: usize) -> Option<usize> {
        table
            .get(i)
            .copied()
            .filter(|&h| h != NOBODY)
            .map(usize::from)
    }

    /// The host owning the QP in `slot`.
    pub fn qp(&self, slot: usize) -> Option<usize> {
        Self::get(&self.qp, slot)
    }

    /// The host owning a CQ.
    pub fn cq(&self, cq: CqId) -> Option<usize> {
        Self::get(&self.cq, cq.0 as usize)
    }

    /// The host owning an SRQ.
    pub fn srq(&self, srq: SrqId) -> Option<usize> {
        Self::get(&self.srq, srq.0 as usize)
    }
}

/// The worker's end of a context.
pub struct HostEnd {
    reg: Arc<AreaRegistry>,
    cmds: Consumer<Req>,
    replies: Producer<Resp>,
    events: Producer<AsyncEvent>,
    /// CQ rings by CQ id; `true` while the CQ has completions the ring had no room for.
    cqs: Vec<Option<(Producer<Completion>, bool)>>,
    pending_cqs: Vec<CqId>,
    index: Arc<Area>,
    limits: HostLimits,
    qps: Vec<Qpn>,
    srqs: Vec<SrqId>,
    mrs: Vec<Lkey>,
    pds: Vec<PdId>,
    scratch: Vec<Completion>,
    /// Counters.
    pub counters: HostCounters,
    /// Its index among the RNIC's hosts (set when attached).
    pub id: u16,
    closed: bool,
}

impl HostEnd {
    /// Whether the application closed its context (the RNIC then drops this end).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Executes up to `budget` commands against `dev`; returns how many.
    pub fn process(&mut self, dev: &mut Device, owners: &mut Owners, budget: usize) -> usize {
        let mut n = 0;
        while n < budget && !self.closed {
            let Some(req) = self.cmds.pop() else { break };
            n += 1;
            let post = req.cmd.is_post();
            let r = self.execute(dev, owners, req.cmd);
            if !post {
                let resp = Resp {
                    seq: req.seq,
                    reply: to_reply(r),
                };
                // The application waits for this reply and reads it before sending another
                // control call, so the reply ring has room.
                let _ = self.replies.push(&resp);
            }
        }
        n
    }

    fn execute(
        &mut self,
        dev: &mut Device,
        owners: &mut Owners,
        cmd: Command,
    ) -> VerbsResult<ReplyData> {
        match cmd {
            Command::QueryDevice => {
                let mut a: DeviceAttr = dev.attr();
                // Work requests cross the rings with at most MAX_HOST_SGE SGEs.
                a.limits.max_sge = a.limits.max_sge.min(MAX_HOST_SGE as u32);
                a.max_srq_sge = a.max_srq_sge.min(MAX_HOST_SGE as u32);
                Ok(ReplyData::Device(a))
            }
            Command::QueryPort => {
                let p: PortAttr = dev.port_attr();
                Ok(ReplyData::Port(PortAttrData {
                    active: p.active,
                    max_mtu: p.max_mtu,
                    active_mtu: p.active_mtu,
                    gid_tbl_len: p.gid_tbl_len,
                    pkey_tbl_len: p.pkey_tbl_len,
                }))
            }
            Command::QueryGid { index } => dev
                .gids()
                .get(index as usize)
                .copied()
                .map(ReplyData::Gid)
                .ok_or_else(|| {
                    VerbsError::InvalidArgument(format!("GID index {index} out of range"))
                }),
            Command::AllocPd => {
                let pd = dev.alloc_pd()?;
                self.pds.push(pd);
                Ok(ReplyData::Pd(pd))
            }
            Command::DeallocPd { pd } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                dev.dealloc_pd(pd)?;
                self.pds.retain(|p| *p != pd);
                Ok(ReplyData::None)
            }
            Command::RegMr {
                pd,
                area,
                offset,
                len,
                access,
                iova,
            } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                let mem = self
                    .reg
                    .get(area)
                    .ok_or_else(|| VerbsError::InvalidArgument(format!("no buffer {area}")))?;
                let addr = iova.unwrap_or(mem.addr() + offset);
                let (lkey, rkey) = dev.reg_mr(pd, mem, offset as usize, addr, len, access)?;
                self.mrs.push(lkey);
                Ok(ReplyData::Keys { lkey, rkey })
            }
            Command::AllocMr { pd, area } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                let mem = self
                    .reg
                    .get(area)
                    .ok_or_else(|| VerbsError::InvalidArgument(format!("no buffer {area}")))?;
                let lkey = dev.alloc_mr(pd, mem)?;
                self.mrs.push(lkey);
                Ok(ReplyData::Keys { lkey, rkey: None })
            }
            Command::DeregMr { lkey } => {
                let i = self.mrs.iter().position(|k| k.index() == lkey.index());
                self.check_owned(i.is_some(), "memory region")?;
                dev.dereg_mr(lkey)?;
                self.mrs.retain(|k| k.index() != lkey.index());
                Ok(ReplyData::None)
            }
            Command::CreateCq {
                cqe,
                ring,
                capacity,
            } => {
                let area = self
                    .reg
                    .get(ring)
                    .ok_or_else(|| VerbsError::InvalidArgument(format!("no ring area {ring}")))?;
                if !capacity.is_power_of_two()
                    || area.len() < crate::ring::ring_bytes::<Completion>(capacity as usize)
                {
                    return Err(VerbsError::InvalidArgument("CQ ring too small".into()));
                }
                let cq = dev.create_cq(cqe)?;
                let Some(slot) = self.cqs.get_mut(cq.0 as usize) else {
                    let _ = dev.destroy_cq(cq);
                    return Err(VerbsError::NoResources("completion queues"));
                };
                *slot = Some((Producer::attach(area, capacity as usize), false));
                Owners::set(&mut owners.cq, cq.0 as usize, self.id);
                Ok(ReplyData::Cq(cq))
            }
            Command::DestroyCq { cq } => {
                self.check_owned(self.owns_cq(cq), "completion queue")?;
                dev.destroy_cq(cq)?;
                self.cqs[cq.0 as usize] = None;
                self.pending_cqs.retain(|c| *c != cq);
                Owners::set(&mut owners.cq, cq.0 as usize, NOBODY);
                Ok(ReplyData::None)
            }
            Command::CreateSrq { pd, attr } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                let s = dev.create_srq(pd, &attr)?;
                if s.0 >= self.limits.max_srq {
                    let _ = dev.destroy_srq(s);
                    return Err(VerbsError::NoResources("shared receive queues"));
                }
                self.srqs.push(s);
                Owners::set(&mut owners.srq, s.0 as usize, self.id);
                self.publish_srq(dev, s);
                Ok(ReplyData::Srq(s))
            }
            Command::ModifySrq { srq, limit } => {
                self.check_owned(self.srqs.contains(&srq), "shared receive queue")?;
                dev.modify_srq(srq, limit).map(|_| ReplyData::None)
            }
            Command::QuerySrq { srq } => {
                self.check_owned(self.srqs.contains(&srq), "shared receive queue")?;
                dev.query_srq(srq).map(ReplyData::SrqAttr)
            }
            Command::DestroySrq { srq } => {
                self.check_owned(self.srqs.contains(&srq), "shared receive queue")?;
                dev.destroy_srq(srq)?;
                self.srqs.retain(|s| *s != srq);
                Owners::set(&mut owners.srq, srq.0 as usize, NOBODY);
                Ok(ReplyData::None)
            }
            Command::PostSrqRecv { srq, wr } => {
                let r = if self.srqs.contains(&srq) {
                    dev.post_srq_recv(
                        srq,
                        &RecvWr {
                            wr_id: wr.wr_id,
                            sg_list: &wr.sges[..(wr.nsge as usize).min(MAX_HOST_SGE)],
                        },
                    )
                } else {
                    Err(VerbsError::NotFound("shared receive queue"))
                };
                if r.is_err() {
                    // No QP to complete it on: counted (the application checked fullness
                    // before posting, so this means the SRQ went away meanwhile).
                    self.counters.failed_posts += 1;
                }
                r.map(|_| ReplyData::None)
            }
            Command::CreateQp { init } => {
                for (ok, what) in [
                    (self.pds.contains(&init.pd), "protection domain"),
                    (self.owns_cq(init.send_cq), "completion queue"),
                    (self.owns_cq(init.recv_cq), "completion queue"),
                    (
                        init.srq.is_none_or(|s| self.srqs.contains(&s)),
                        "shared receive queue",
                    ),
                ] {
                    self.check_owned(ok, what)?;
                }
                let q = dev.create_qp(&init)?;
                let slot = dev.qp_index(q).expect("just created");
                if slot >= self.limits.max_qp as usize {
                    let _ = dev.destroy_qp(q);
                    return Err(VerbsError::NoResources("queue pairs"));
                }
                self.qps.push(q);
                Owners::set(&mut owners.qp, slot, self.id);
                self.publish_qp(dev, q);
                Ok(ReplyData::Qp(q, slot as u32))
            }
            Command::ModifyQp { qpn, attr } => {
                self.check_owned(self.qps.contains(&qpn), "queue pair")?;
                dev.modify_qp(qpn, &attr)?;
                self.publish_qp(dev, qpn);
                Ok(ReplyData::None)
            }
            Command::QueryQp { qpn } => {
                self.check_owned(self.qps.contains(&qpn), "queue pair")?;
                dev.query_qp(qpn).map(ReplyData::QpInfo)
            }
            Command::DestroyQp { qpn } => {
                self.check_owned(self.qps.contains(&qpn), "queue pair")?;
                let slot = dev.qp_index(qpn);
                dev.destroy_qp(qpn)?;
                self.qps.retain(|q| *q != qpn);
                if let Some(s) = slot {
                    Owners::set(&mut owners.qp, s, NOBODY);
                }
                Ok(ReplyData::None)
            }
            Command::PostSend { qpn, wr } => {
                let mut sges = [Sge::default(); MAX_HOST_SGE];
                let inline = wr.inline();
                let sw = SendWr {
                    wr_id: wr.wr_id,
                    op: wr.op,
                    sg_list: wr.sges(&mut sges),
                    flags: wr.flags,
                    ud: wr.ud,
                };
                let r = if !self.qps.contains(&qpn) {
                    Err(VerbsError::NotFound("queue pair"))
                } else if wr.flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic() {
                    dev.post_send_inline(qpn, &sw, inline)
                } else {
                    dev.post_send(qpn, &sw)
                };
                if r.is_err() {
                    self.counters.failed_posts += 1;
                    dev.fail_posted_wr(qpn, wr.wr_id, wr.op.wc_opcode(), false);
                }
                r.map(|_| ReplyData::None)
            }
            Command::PostRecv { qpn, wr } => {
                let r = if self.qps.contains(&qpn) {
                    dev.post_recv(
                        qpn,
                        &RecvWr {
                            wr_id: wr.wr_id,
                            sg_list: &wr.sges[..(wr.nsge as usize).min(MAX_HOST_SGE)],
                        },
                    )
                } else {
                    Err(VerbsError::NotFound("queue pair"))
                };
                if r.is_err() {
                    self.counters.failed_posts += 1;
                    dev.fail_posted_wr(qpn, wr.wr_id, WcOpcode::Recv, true);
                }
                r.map(|_| ReplyData::None)
            }
            Command::Counters { qpn } => {
                let mut vals = [0u64; 64];
                let mut n = 0;
                let (devc, total) = dev.counters();
                let qc = match qpn {
                    Some(q) => {
                        self.check_owned(self.qps.contains(&q), "queue pair")?;
                        dev.qp_counters(q)
                            .ok_or(VerbsError::NotFound("queue pair"))?
                    }
                    None => total,
                };
                let host = self.counters.values();
                for v in qc
                    .iter()
                    .map(|(_, v)| v)
                    .chain(devc.iter().map(|(_, v)| v))
                    .chain(host)
                {
                    if n < vals.len() {
                        vals[n] = v;
                        n += 1;
                    }
                }
                Ok(ReplyData::Counters { n: n as u8, vals })
            }
            Command::Close => {
                self.close(dev, owners);
                Ok(ReplyData::None)
            }
        }
    }

    /// Objects are named by small numbers another application could guess: a context may
    /// only use the ones it created.
    fn check_owned(&self, owned: bool, what: &'static str) -> VerbsResult<()> {
        if owned {
            Ok(())
        } else {
            Err(VerbsError::NotFound(what))
        }
    }

    fn owns_cq(&self, cq: CqId) -> bool {
        matches!(self.cqs.get(cq.0 as usize), Some(Some(_)))
    }

    /// Releases everything the application created, in dependency order (QPs, SRQs, CQs,
    /// MRs, PDs), as the kernel does for a process that exits without cleaning up.
    pub fn close(&mut self, dev: &mut Device, owners: &mut Owners) {
        for q in std::mem::take(&mut self.qps) {
            if let Some(s) = dev.qp_index(q) {
                Owners::set(&mut owners.qp, s, NOBODY);
            }
            let _ = dev.destroy_qp(q);
        }
        for s in std::mem::take(&mut self.srqs) {
            Owners::set(&mut owners.srq, s.0 as usize, NOBODY);
            let _ = dev.destroy_srq(s);
        }
        for (i, c) in self.cqs.iter_mut().enumerate() {
            if c.take().is_some() {
                Owners::set(&mut owners.cq, i, NOBODY);
                let _ = dev.destroy_cq(CqId(i as u32));
            }
        }
        self.pending_cqs.clear();
        for k in std::mem::take(&mut self.mrs) {
            let _ = dev.dereg_mr(k);
        }
        for pd in std::mem::take(&mut self.pds) {
            let _ = dev.dealloc_pd(pd);
        }
        self.closed = true;
    }

    /// Publishes a QP's queue positions (its WQEs retired) in the index area.
    pub fn publish_qp(&self, dev: &Device, qpn: Qpn) {
        let (Some(positions), Some(slot)) = (dev.queue_positions(qpn), dev.qp_index(qpn)) else {
            return;
        };
        for (queue, pos) in [positions.0, positions.1].into_iter().enumerate() {
            if let Ok(a) = self.index.atomic_u64(slot * QP_INDEX_BYTES + 8 * queue) {
                a.store(pos, Ordering::Release);
            }
        }
    }

    /// Publishes how many WQEs an SRQ has handed out.
    pub fn publish_srq(&self, dev: &Device, srq: SrqId) {
        if let Some(pos) = dev.srq_position(srq) {
            if let Ok(a) = self
                .index
                .atomic_u64(self.limits.srq_index_off(srq.0 as usize))
            {
                a.store(pos, Ordering::Release);
            }
        }
    }

    /// Moves a CQ's completions to the application's ring; if the ring is full the rest
    /// stays in the engine's CQ (which reports an overflow if it fills) and is retried.
    /// Returns how many were moved.
    pub fn move_completions(&mut self, dev: &mut Device, cq: CqId) -> usize {
        let Some(Some((ring, pending))) = self.cqs.get_mut(cq.0 as usize) else {
            return 0;
        };
        let mut moved = 0;
        loop {
            let room = ring.free();
            if room == 0 {
                break;
            }
            self.scratch.resize(room.min(64), Completion::default());
            let n = dev.poll_cq(cq, &mut self.scratch).unwrap_or(0);
            for c in &self.scratch[..n] {
                ring.push(c);
            }
            moved += n;
            if n < self.scratch.len() {
                break;
            }
        }
        let left = dev.cq_has_entries(cq);
        if left != *pending {
            *pending = left;
            if left {
                self.pending_cqs.push(cq);
            } else {
                self.pending_cqs.retain(|c| *c != cq);
            }
        }
        moved
    }

    /// Retries CQs whose ring was full; returns how many completions moved.
    pub fn retry_pending(&mut self, dev: &mut Device) -> usize {
        let mut moved = 0;
        for i in (0..self.pending_cqs.len()).rev() {
            if let Some(&cq) = self.pending_cqs.get(i) {
                moved += self.move_completions(dev, cq);
            }
        }
        moved
    }

    /// Queues an asynchronous event for the application; counted if its ring is full.
    pub fn deliver_event(&mut self, ev: &AsyncEvent) -> bool {
        if self.events.push(ev) {
            true
        } else {
            self.counters.events_dropped += 1;
            false
        }
    }
}
