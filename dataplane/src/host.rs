//! The application interface: a verbs-style API ([`Verbs`], implemented by [`Client`]) over
//! shared-memory rings between an application and the worker that owns the device.
//!
//! Per client (application context) there are, in shared memory (memfd [`Area`]s):
//! - a post ring (application -> worker) of [`PostSlot`]s: send, receive and SRQ receive work
//!   requests, with inline data copied in when posted;
//! - one completion ring per CQ (worker -> application) of [`CqeSlot`]s;
//! - an event ring (worker -> application) of [`EventSlot`]s;
//! - an index area where the worker publishes each QP's send/receive and each SRQ's consumer
//!   position, so `post_send`, `post_recv` and `post_srq_recv` know "queue full" without a
//!   round trip, as with a hardware RNIC's doorbell rings.
//!
//! Slots are `repr(C)` integers checked when read ([`crate::slots`]): the worker never trusts
//! what an application wrote. Control calls (create/modify/query/destroy, registration) are
//! [`Command`]s that travel over a [`Channel`]: in the same process a queue into the worker
//! ([`LocalChannel`]); from another process, rnicd's Unix socket (`crate::client`). Either way
//! the worker executes them in [`HostEnd::execute`] after the posts already in the ring, so
//! program order holds. Memory is named per client: the client gives each area an id, and
//! another client's ids mean nothing in its table.
//!
//! Lookups on the post and poll paths are array indexing (QPs by `roce::engine::qp_slot`,
//! CQs and SRQs by id), never hashing.
//!
//! Lifetimes: dropping a [`Client`] releases everything it created on the worker (QPs, SRQs,
//! CQs, MRs, PDs, areas); dropping the last handle of a [`Buffer`] forgets its area (it is
//! unmapped once no MR uses it). If the worker stops - cleanly or by a panic - every call
//! fails with `VerbsError::DeviceFatal` and `poll_event` reports `AsyncEvent::DeviceFatal`
//! once, instead of waiting forever.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use crossbeam_queue::SegQueue;
use roce::engine::{
    qp_slot, CqId, Device, DeviceAttr, DeviceConfig, PortAttr, QpInit, SrqAttr, SrqId, VerbsError,
    VerbsResult, MAX_INLINE,
};
use roce::memory::PdId;
use roce::types::{Gid, Lkey, Qpn, Rkey};
use roce::verbs::{
    Access, AsyncEvent, Completion, QpAttr, QpCaps, QpInfo, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, WcOpcode,
};

use crate::area::Area;
use crate::ring::{ring, ring_bytes, Consumer, Plain, Producer};
pub use crate::slots::MAX_HOST_SGE;
use crate::slots::{post_kind, CqeSlot, EventSlot, Post, PostSlot};
use crate::worker::Control;

/// Post ring depth.
pub const POST_RING: usize = 4096;
/// Event ring depth.
pub const EVENT_RING: usize = 1024;
/// Per-QP published indices: (send WQEs retired, receive WQEs retired).
const QP_INDEX_BYTES: usize = 16;
/// Per-SRQ published index: receive WQEs handed out.
const SRQ_INDEX_BYTES: usize = 8;

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

    /// Bytes of the index area.
    pub fn index_bytes(&self) -> usize {
        self.max_qp as usize * QP_INDEX_BYTES + self.max_srq as usize * SRQ_INDEX_BYTES
    }

    fn srq_index_off(&self, srq: usize) -> usize {
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

/// A control call, executed by the worker in [`HostEnd::execute`]. Plain data (rnicd's
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
    /// The application is going away: release everything it created.
    Close,
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

/// How control calls reach the worker.
pub trait Channel: Send {
    /// Executes `cmd` on the worker (with the area it names, for `AddArea` and `CreateCq`)
    /// and returns its result.
    fn call(&mut self, cmd: Command, area: Option<Arc<Area>>) -> VerbsResult<ReplyData>;
    /// Like `call`, but gives up (DeviceFatal) at `deadline`.
    fn call_until(&mut self, cmd: Command, deadline: Instant) -> VerbsResult<ReplyData>;
    /// Whether the device is still there.
    fn alive(&self) -> bool;
}

/// A client in the same process as the worker: control calls go through the runtime's
/// control queue and wait for the worker's reply.
pub struct LocalChannel {
    control: Arc<SegQueue<Control>>,
    nic: usize,
    token: u64,
    alive: Arc<AtomicBool>,
}

impl LocalChannel {
    /// A channel to the host `token` of RNIC `nic`.
    pub fn new(
        control: Arc<SegQueue<Control>>,
        nic: usize,
        token: u64,
        alive: Arc<AtomicBool>,
    ) -> Self {
        LocalChannel {
            control,
            nic,
            token,
            alive,
        }
    }

    /// The token of the host end this channel calls.
    pub fn token(&self) -> u64 {
        self.token
    }

    fn wait(
        &self,
        cmd: Command,
        area: Option<Arc<Area>>,
        deadline: Option<Instant>,
    ) -> VerbsResult<ReplyData> {
        if !self.alive() {
            return Err(VerbsError::DeviceFatal);
        }
        let (tx, rx) = mpsc::sync_channel(1);
        self.control.push(Control::Call {
            nic: self.nic,
            token: self.token,
            cmd,
            area,
            reply: tx,
        });
        loop {
            match rx.recv_timeout(Duration::from_millis(20)) {
                Ok(r) => return r,
                Err(mpsc::RecvTimeoutError::Disconnected) => return Err(VerbsError::DeviceFatal),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if !self.alive() || deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(VerbsError::DeviceFatal);
                    }
                }
            }
        }
    }
}

impl Channel for LocalChannel {
    fn call(&mut self, cmd: Command, area: Option<Arc<Area>>) -> VerbsResult<ReplyData> {
        self.wait(cmd, area, None)
    }

    fn call_until(&mut self, cmd: Command, deadline: Instant) -> VerbsResult<ReplyData> {
        self.wait(cmd, None, Some(deadline))
    }

    fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }
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

/// Ids of buffers dropped by the application, for the client to forget on the worker.
type Released = Arc<Mutex<Vec<u32>>>;

struct BufferInner {
    area: Arc<Area>,
    id: u32,
    released: Weak<Mutex<Vec<u32>>>,
}

impl Drop for BufferInner {
    fn drop(&mut self) {
        // The client tells the worker to forget it at its next call; MRs still registered on
        // the area keep it mapped until they are deregistered.
        if let Some(r) = self.released.upgrade() {
            if let Ok(mut v) = r.lock() {
                v.push(self.id);
            }
        }
    }
}

/// Application memory shared with the RNIC (registered as MRs, advertised to peers). Clones
/// share the memory; when the last one is dropped the memory is released (once no MR uses it
/// any more).
#[derive(Clone)]
pub struct Buffer {
    inner: Arc<BufferInner>,
}

impl std::fmt::Debug for Buffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Buffer#{}({:?})", self.inner.id, self.inner.area)
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

    /// Address in this process (what MRs are registered at and peers are told).
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

    /// The client's id of the area.
    pub fn area_id(&self) -> u32 {
        self.inner.id
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

/// The verbs API applications use; [`Client`] implements it over a [`Channel`], in the same
/// process as the RNIC or through rnicd, so tools run either way.
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
    /// `ibv_reg_mr` on ordinary memory of this process (malloc'd, anonymous mmap), zero
    /// copy: the pages holding `[addr, addr + len)` move onto shared memory at the same
    /// addresses, keeping their contents ([`crate::shadow`]), while any registration in any
    /// context of the process lies within them; when the last one is deregistered they become
    /// private anonymous memory again. Memory that cannot move (file-backed, shared,
    /// hugetlbfs, the stack, pages moved for a registered range that does not contain this
    /// one) is refused with `InvalidArgument` saying why.
    ///
    /// # Safety
    /// `[addr, addr + len)` must be memory of this process that no other thread writes
    /// during the call, nor during the `dereg_mr` (or the context's close) that ends the last
    /// registration within its pages.
    unsafe fn reg_mr_addr(
        &mut self,
        pd: PdId,
        addr: u64,
        len: usize,
        access: Access,
    ) -> VerbsResult<Mr>;
    /// `ibv_rereg_mr`: gives `mr` a new protection domain, translation (`memory`: a range of
    /// one of this client's buffers, or of ordinary memory, moved as for `reg_mr_addr`) and/or
    /// access (`None` keeps each), keeping its keys as mlx5 does. It is a new registration
    /// all the same: an RDMA operation of a peer in progress against the old translation
    /// fails. On failure the MR is unchanged.
    ///
    /// # Safety
    /// As [`Verbs::reg_mr_addr`], for the new range and (when this was the last
    /// registration within them) the old range's pages.
    unsafe fn rereg_mr(
        &mut self,
        mr: &Mr,
        pd: Option<PdId>,
        memory: Option<(u64, usize)>,
        access: Option<Access>,
    ) -> VerbsResult<Mr>;
    /// `ibv_dereg_mr`.
    fn dereg_mr(&mut self, mr: &Mr) -> VerbsResult<()>;
    /// `ibv_alloc_mw`: a memory window of type `ty` in `pd`; returns its key. A window is
    /// bound with a `WrOp::BindMw` work request on a send queue (type 2; type 1 too, as
    /// `ibv_bind_mw` does) and counts against `host.max_mrs`.
    fn alloc_mw(&mut self, pd: PdId, ty: roce::memory::MwType) -> VerbsResult<Rkey>;
    /// `ibv_dealloc_mw` (any key the window had: its index names it); a bound window is
    /// unbound.
    fn dealloc_mw(&mut self, mw: Rkey) -> VerbsResult<()>;
    /// `ibv_create_cq`.
    fn create_cq(&mut self, cqe: u32) -> VerbsResult<CqId>;
    /// `ibv_destroy_cq`.
    fn destroy_cq(&mut self, cq: CqId) -> VerbsResult<()>;
    /// `ibv_resize_cq`: `cq` holds `cqe` completions from now on (not fewer than it holds
    /// now); returns the new size.
    fn resize_cq(&mut self, cq: CqId, cqe: u32) -> VerbsResult<u32>;
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
    /// the call returns (they must lie in buffers of this client, registered or not).
    fn post_send(&mut self, qpn: Qpn, wr: &SendWr<'_>) -> VerbsResult<()>;
    /// `ibv_post_send` of an inline SEND or WRITE whose payload is `data` (any memory): the
    /// bytes are copied before the call returns; `wr.sg_list` must be empty.
    fn post_send_inline(&mut self, qpn: Qpn, wr: &SendWr<'_>, data: &[u8]) -> VerbsResult<()>;
    /// How many more WRs the send queue of `qpn` takes now (`max_send_wr` less those posted
    /// and not yet retired): a batch that fits is posted whole (`ibv_wr_complete`).
    fn sq_room(&mut self, qpn: Qpn) -> VerbsResult<u32>;
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
    /// `ibv_req_notify_cq(cq, 0)`: the next completion added to `cq` wakes
    /// [`Verbs::wait_cq`].
    fn req_notify_cq(&mut self, cq: CqId) -> VerbsResult<()>;
    /// `ibv_req_notify_cq(cq, 1)`: the next solicited completion (a message whose sender set
    /// the solicited-event bit) or unsuccessful one wakes [`Verbs::wait_cq`] (IBA 11.4.2.2).
    fn req_notify_cq_solicited(&mut self, cq: CqId) -> VerbsResult<()>;
    /// Blocks until the CQ notifies after [`Verbs::req_notify_cq`] or `timeout` passes
    /// (`ibv_get_cq_event` on a completion channel); true if it notified. Arm, poll the CQ
    /// once more, then wait: a completion that arrived before arming does not notify.
    fn wait_cq(&mut self, cq: CqId, timeout: Option<Duration>) -> VerbsResult<bool>;
    /// Counters of a QP, or of the whole device (QP counters summed plus device ones, plus
    /// this client's host counters).
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

/// The rings a client's host end uses, made by the client (in shared memory).
pub struct ClientRings {
    /// Post ring (client produces).
    pub posts: Arc<Area>,
    /// Event ring (worker produces).
    pub events: Arc<Area>,
    /// Index area (worker writes).
    pub index: Arc<Area>,
}

/// Waits for a CQ's notifications ([`Client::cq_notifier`]); only reads the ring's
/// notification word.
pub struct CqNotifier {
    ring: Consumer<CqeSlot>,
    armed_at: u32,
}

impl CqNotifier {
    /// The sequence when the CQ was last armed (`req_notify_cq`): a waiter that starts
    /// from it also sees a notification that came before it started.
    pub fn armed_at(&self) -> u32 {
        self.armed_at
    }

    /// The notification sequence now.
    pub fn seq(&self) -> u32 {
        self.ring.notify_seq()
    }

    /// Waits up to `timeout` for the sequence to move past `seen`; true if it did.
    pub fn wait(&self, seen: u32, timeout: Duration) -> bool {
        self.ring.wait_notify(seen, Some(timeout))
    }
}

/// An application's handle on an RNIC: [`Verbs`] over a [`Channel`].
pub struct Client<C: Channel> {
    chan: C,
    posts: Producer<PostSlot>,
    events: Consumer<EventSlot>,
    index: Arc<Area>,
    limits: HostLimits,
    /// CQ rings by CQ id.
    cqs: Vec<Option<Consumer<CqeSlot>>>,
    /// The notification sequence of each CQ when it was last armed.
    cq_seen: Vec<u32>,
    /// QPs by slot (`qp_slot`).
    qps: Vec<Option<QpLocal>>,
    /// SRQs by id.
    srqs: Vec<Option<SrqLocal>>,
    /// This client's buffers and moved ranges by address (for inline data), with their area
    /// ids.
    buffers: BTreeMap<u64, (Weak<Area>, u32)>,
    /// Moved ranges ([`crate::shadow`]) this context registers within, by the address of
    /// their area (a process-wide move, shared with other contexts): this context's area id
    /// for each, and its MRs in it.
    shadows: HashMap<usize, Shadow>,
    /// The moved range (`shadows` key) each MR of `reg_mr_addr` lies in, by lkey.
    shadow_mrs: BTreeMap<u32, usize>,
    next_area: u32,
    released: Released,
    fatal_reported: bool,
    closed: bool,
    /// Consecutive polls that found a CQ empty.
    empty_polls: u32,
}

/// An application's handle on an RNIC in the same process (the in-process backend).
pub type Context = Client<LocalChannel>;

/// A moved range of application pages ([`crate::shadow`]) as one context uses it: added to
/// the worker as an area while the context has MRs within it.
struct Shadow {
    area: Arc<Area>,
    /// The area's id on the worker.
    id: u32,
    /// This context's live MRs in it (each also one user of the process-wide move).
    mrs: u32,
}

static TOKENS: AtomicU64 = AtomicU64::new(1);

/// Makes a client's rings (named after `who`) and the worker's end attached to them; returns
/// the rings (to attach a client to) and the host end.
pub fn host_end(
    limits: HostLimits,
    client_limits: ClientLimits,
    who: &str,
) -> std::io::Result<(ClientRings, HostEnd)> {
    let (posts, _, post_c) = ring::<PostSlot>(POST_RING, &format!("{who}-posts"))?;
    let (events, ev_p, _) = ring::<EventSlot>(EVENT_RING, &format!("{who}-events"))?;
    let index = Arc::new(Area::new(limits.index_bytes(), &format!("{who}-index"))?);
    let host = HostEnd::new(post_c, ev_p, index.clone(), limits, client_limits);
    Ok((
        ClientRings {
            posts,
            events,
            index,
        },
        host,
    ))
}

/// Creates both ends of an in-process client on RNIC `nic` of a worker fed by `control`:
/// the client and the host end to attach to the RNIC (`Nic::add_host`).
pub fn context(
    control: Arc<SegQueue<Control>>,
    nic: usize,
    limits: HostLimits,
    alive: Arc<AtomicBool>,
) -> std::io::Result<(Context, HostEnd)> {
    let (rings, host) = host_end(limits, ClientLimits::default(), "ferroce")?;
    let chan = LocalChannel::new(control, nic, host.token, alive);
    Ok((Client::attach(chan, rings, limits), host))
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
        std::thread::sleep(Duration::from_micros(20));
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

impl<C: Channel> Client<C> {
    /// A client over `chan` using `rings` (whose worker end is attached to the RNIC).
    pub fn attach(chan: C, rings: ClientRings, limits: HostLimits) -> Client<C> {
        Client {
            chan,
            posts: Producer::attach(rings.posts, POST_RING),
            events: Consumer::attach(rings.events, EVENT_RING),
            index: rings.index,
            limits,
            cqs: (0..limits.max_cq).map(|_| None).collect(),
            cq_seen: vec![0; limits.max_cq as usize],
            qps: (0..limits.max_qp).map(|_| None).collect(),
            srqs: (0..limits.max_srq).map(|_| None).collect(),
            buffers: BTreeMap::new(),
            shadows: HashMap::new(),
            shadow_mrs: BTreeMap::new(),
            next_area: 1,
            released: Arc::new(Mutex::new(Vec::new())),
            fatal_reported: false,
            closed: false,
            empty_polls: 0,
        }
    }

    fn alive(&self) -> bool {
        self.chan.alive()
    }

    /// A control call (after telling the worker about buffers the application dropped).
    fn call(&mut self, cmd: Command) -> VerbsResult<ReplyData> {
        self.call_with(cmd, None)
    }

    fn call_with(&mut self, cmd: Command, area: Option<Arc<Area>>) -> VerbsResult<ReplyData> {
        let gone: Vec<u32> = match self.released.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => Vec::new(),
        };
        for id in gone {
            let _ = self.chan.call(Command::RemoveArea { id }, None);
        }
        self.chan.call(cmd, area)
    }

    /// Pushes a slot into the post ring, waiting while it is full.
    fn push(&mut self, slot: &PostSlot) -> VerbsResult<()> {
        let mut spins = 0u32;
        while !self.posts.push(slot) {
            if !self.alive() {
                return Err(VerbsError::DeviceFatal);
            }
            spins += 1;
            backoff(spins);
        }
        Ok(())
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
        let addr = iova.unwrap_or(buf.addr() + offset as u64);
        let cmd = Command::RegMr {
            pd,
            area: buf.area_id(),
            offset: offset as u64,
            len: len as u64,
            access,
            iova: addr,
        };
        expect_reply!(self.call(cmd), ReplyData::Keys { lkey, rkey } => Mr {
            lkey,
            rkey,
            addr,
            len: len as u64,
        })
    }

    /// Registers a shared area this client made (the remote client's raw-memory MRs).
    pub fn add_area(&mut self, area: Arc<Area>) -> VerbsResult<u32> {
        let id = self.next_area;
        self.next_area += 1;
        self.call_with(Command::AddArea { id }, Some(area))?;
        Ok(id)
    }

    /// Registers `len` bytes at `offset` of the client's area `id` at address `iova`.
    pub fn reg_area(
        &mut self,
        pd: PdId,
        id: u32,
        offset: u64,
        len: u64,
        iova: u64,
        access: Access,
    ) -> VerbsResult<Mr> {
        let cmd = Command::RegMr {
            pd,
            area: id,
            offset,
            len,
            access,
            iova,
        };
        expect_reply!(self.call(cmd), ReplyData::Keys { lkey, rkey } => Mr {
            lkey,
            rkey,
            addr: iova,
            len,
        })
    }

    /// Forgets the client's area `id` on the worker.
    pub fn remove_area(&mut self, id: u32) -> VerbsResult<()> {
        self.call(Command::RemoveArea { id }).map(|_| ())
    }

    /// Pops up to `max` completions of `cq`, handing each to `f` with its index: no
    /// intermediate array (the C libraries write them straight into the application's).
    /// [`Verbs::poll_cq`] is this into a slice.
    pub fn poll_cq_each(
        &mut self,
        cq: CqId,
        max: usize,
        mut f: impl FnMut(usize, Completion),
    ) -> VerbsResult<usize> {
        let ring = self
            .cqs
            .get_mut(cq.0 as usize)
            .and_then(|r| r.as_mut())
            .ok_or(VerbsError::NotFound("completion queue"))?;
        let mut n = 0;
        while n < max {
            match ring.pop() {
                Some(c) => {
                    f(n, c.decode());
                    n += 1;
                }
                None => break,
            }
        }
        if n == 0 {
            if !self.chan.alive() {
                return Err(VerbsError::DeviceFatal);
            }
            // The RNIC is software on the same cores: an application spinning on an empty
            // CQ must leave it CPU time, or on a busy machine every completion waits for a
            // scheduler tick (measured: 3 ms per ping-pong round trip instead of tens of us).
            self.empty_polls = self.empty_polls.saturating_add(1);
            if self.empty_polls > 64 {
                std::thread::yield_now();
            }
        } else {
            self.empty_polls = 0;
        }
        Ok(n)
    }

    /// Arms `cq`'s ring (the notification sequence read first, for `wait_cq`).
    fn arm_cq(&mut self, cq: CqId, solicited_only: bool) -> VerbsResult<()> {
        let ring = self
            .cqs
            .get(cq.0 as usize)
            .and_then(|r| r.as_ref())
            .ok_or(VerbsError::NotFound("completion queue"))?;
        self.cq_seen[cq.0 as usize] = ring.notify_seq();
        ring.arm(solicited_only);
        Ok(())
    }

    /// One more MR of this context within the moved range holding `[addr, addr + len)` (made
    /// now if there is none): its `shadows` key, this context's area id for it, its start.
    ///
    /// # Safety
    /// As [`Verbs::reg_mr_addr`].
    unsafe fn use_shadow(&mut self, addr: u64, len: usize) -> VerbsResult<(usize, u32, u64)> {
        let (start, end) = crate::shadow::page_range(addr, len).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("no memory at {addr:#x} (+{len})"))
        })?;
        // The process-wide move containing the range (made now if there is none): one more
        // user of it.
        // SAFETY: the caller guarantees no other thread writes the range now.
        let (base, area) = unsafe { crate::shadow::acquire(start, end) }
            .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        let key = Arc::as_ptr(&area) as usize;
        let id = match self.shadows.get(&key) {
            Some(sh) => sh.id,
            None => match self.add_area(area.clone()) {
                Ok(id) => {
                    self.buffers.insert(base, (Arc::downgrade(&area), id));
                    self.shadows.insert(
                        key,
                        Shadow {
                            area: area.clone(),
                            id,
                            mrs: 0,
                        },
                    );
                    id
                }
                Err(e) => {
                    // SAFETY: as above.
                    unsafe { crate::shadow::release(&area) };
                    return Err(e);
                }
            },
        };
        if let Some(sh) = self.shadows.get_mut(&key) {
            sh.mrs += 1;
        }
        Ok((key, id, base))
    }

    /// One MR of this context within the moved range `key` is gone: with its last one the
    /// context forgets the area; the process-wide move loses a user (and with its last one the
    /// pages become private again).
    fn unuse_shadow(&mut self, key: usize) {
        let Some(sh) = self.shadows.get_mut(&key) else {
            return;
        };
        sh.mrs = sh.mrs.saturating_sub(1);
        let area = sh.area.clone();
        if sh.mrs == 0 {
            let id = sh.id;
            self.shadows.remove(&key);
            if self
                .buffers
                .get(&area.addr())
                .is_some_and(|(w, _)| w.as_ptr() == Arc::as_ptr(&area))
            {
                self.buffers.remove(&area.addr());
            }
            let _ = self.remove_area(id);
        }
        // SAFETY: `reg_mr_addr`'s contract: the application does not write memory it
        // registers or deregisters while the call runs.
        unsafe { crate::shadow::release(&area) };
    }

    /// A handle that waits for `cq`'s notifications from another thread (a completion
    /// channel), independent of this client's borrow.
    pub fn cq_notifier(&self, cq: CqId) -> Option<CqNotifier> {
        self.cqs
            .get(cq.0 as usize)
            .and_then(|r| r.as_ref())
            .map(|r| CqNotifier {
                ring: Consumer::attach(r.area().clone(), 1),
                armed_at: self.cq_seen.get(cq.0 as usize).copied().unwrap_or(0),
            })
    }

    /// Waits until the worker has processed every command sent so far.
    pub fn sync(&mut self) -> VerbsResult<()> {
        self.call(Command::QueryPort).map(|_| ())
    }

    /// The channel (for transports with more to say, e.g. rnicd's admin requests).
    pub fn channel(&mut self) -> &mut C {
        &mut self.chan
    }

    /// Releases everything on the worker now (as dropping does).
    pub fn close(&mut self) {
        if self.closed {
            return;
        }
        self.closed = true;
        // The context's MRs go with it: each was a user of its moved range.
        for (_, sh) in std::mem::take(&mut self.shadows) {
            for _ in 0..sh.mrs {
                // SAFETY: as in `unuse_shadow`.
                unsafe { crate::shadow::release(&sh.area) };
            }
        }
        self.shadow_mrs.clear();
        if self.alive() {
            // A worker that is alive but not polling (stopped by its owner) must not hang
            // the application: wait a bounded time.
            let deadline = Instant::now() + Duration::from_secs(2);
            let _ = self.chan.call_until(Command::Close, deadline);
        }
    }

    fn qp_mut(&mut self, qpn: Qpn) -> VerbsResult<&mut QpLocal> {
        qp_slot(qpn, self.limits.max_qp)
            .and_then(|s| self.qps.get_mut(s))
            .and_then(|q| q.as_mut())
            .filter(|q| q.qpn == qpn)
            .ok_or(VerbsError::NotFound("queue pair"))
    }

    /// Copies `sges`' bytes out of this client's buffers into `out` (inline data).
    fn gather_inline(&self, sges: &[Sge], out: &mut [u8]) -> VerbsResult<usize> {
        let mut n = 0;
        for sge in sges {
            let len = sge.length as usize;
            let area = self
                .buffers
                .range(..=sge.addr)
                .next_back()
                .and_then(|(_, (w, _))| w.upgrade())
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
        let (caps, qp_type, sq_posted) = (q.caps, q.qp_type, q.sq_posted);
        let sq_retired = retired(&self.index, slot * QP_INDEX_BYTES);
        if sq_posted.wrapping_sub(sq_retired) >= caps.max_send_wr as u64 {
            return Err(VerbsError::QueueFull);
        }
        // The engine's own checks, made here so a bad WR is refused at once (rdma-core's
        // EINVAL with bad_wr) instead of taking a place in the send queue.
        roce::engine::check_send(
            qp_type,
            &caps,
            self.limits.port_mtu,
            wr,
            inline.map(|d| d.len()),
        )?;
        let is_inline = wr.flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic();
        let slot = if is_inline {
            let mut bytes = [0u8; MAX_INLINE];
            let data: &[u8] = match inline {
                Some(d) => d,
                None => {
                    let k = self.gather_inline(wr.sg_list, &mut bytes)?;
                    &bytes[..k]
                }
            };
            let bare = SendWr {
                sg_list: &[],
                ..wr.clone()
            };
            PostSlot::send(qpn, &bare, Some(data))
        } else {
            if inline.is_some() {
                return Err(VerbsError::InvalidArgument(
                    "inline data needs the INLINE flag on a SEND or WRITE".into(),
                ));
            }
            PostSlot::send(qpn, wr, None)
        }
        .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        self.push(&slot)?;
        if let Ok(q) = self.qp_mut(qpn) {
            q.sq_posted += 1;
        }
        Ok(())
    }
}

impl<C: Channel> Drop for Client<C> {
    /// Releases what the application created on the worker.
    fn drop(&mut self) {
        self.close();
    }
}

impl<C: Channel> Verbs for Client<C> {
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
        let area = Arc::new(Area::new(len, "ferroce-buffer").map_err(|e| {
            VerbsError::InvalidArgument(format!("cannot allocate {len} bytes: {e}"))
        })?);
        let id = self.add_area(area.clone())?;
        // A buffer belongs to this context only: once sent, its fd is not needed (the
        // process keeps one descriptor per shared range only where another context may
        // have to map it too: moved pages, `crate::shadow`).
        area.close_fd();
        self.buffers.retain(|_, (w, _)| w.strong_count() > 0);
        self.buffers
            .insert(area.addr(), (Arc::downgrade(&area), id));
        Ok(Buffer {
            inner: Arc::new(BufferInner {
                area,
                id,
                released: Arc::downgrade(&self.released),
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

    unsafe fn reg_mr_addr(
        &mut self,
        pd: PdId,
        addr: u64,
        len: usize,
        access: Access,
    ) -> VerbsResult<Mr> {
        let (key, id, base) = self.use_shadow(addr, len)?;
        match self.reg_area(pd, id, addr - base, len as u64, addr, access) {
            Ok(mr) => {
                self.shadow_mrs.insert(mr.lkey.0, key);
                Ok(mr)
            }
            Err(e) => {
                self.unuse_shadow(key);
                Err(e)
            }
        }
    }

    unsafe fn rereg_mr(
        &mut self,
        mr: &Mr,
        pd: Option<PdId>,
        memory: Option<(u64, usize)>,
        access: Option<Access>,
    ) -> VerbsResult<Mr> {
        let mut new_shadow = None;
        let translation = match memory {
            None => None,
            Some((addr, len)) => {
                let end = addr.checked_add(len as u64);
                // Within one of this client's buffers: that area. Otherwise ordinary memory,
                // moved as for reg_mr_addr (one more user of its move).
                let buffer = self
                    .buffers
                    .range(..=addr)
                    .next_back()
                    .and_then(|(_, (w, id))| Some((w.upgrade()?, *id)))
                    .filter(|(a, _)| {
                        !self.shadows.contains_key(&(Arc::as_ptr(a) as usize))
                            && end.is_some_and(|e| e <= a.addr() + a.len() as u64)
                    });
                let (id, base) = match buffer {
                    Some((a, id)) => (id, a.addr()),
                    None => {
                        let (key, id, base) = self.use_shadow(addr, len)?;
                        new_shadow = Some(key);
                        (id, base)
                    }
                };
                Some(Translation {
                    area: id,
                    offset: addr - base,
                    len: len as u64,
                    iova: addr,
                })
            }
        };
        let r = self.call(Command::ReregMr {
            lkey: mr.lkey,
            pd,
            translation,
            access,
        });
        match r {
            Ok(ReplyData::Keys { lkey, rkey }) => {
                if memory.is_some() {
                    if let Some(old) = self.shadow_mrs.remove(&mr.lkey.0) {
                        self.unuse_shadow(old);
                    }
                    if let Some(k) = new_shadow {
                        self.shadow_mrs.insert(lkey.0, k);
                    }
                }
                let (addr, len) = memory.map_or((mr.addr, mr.len), |(a, l)| (a, l as u64));
                Ok(Mr {
                    lkey,
                    rkey,
                    addr,
                    len,
                })
            }
            other => {
                if let Some(k) = new_shadow {
                    self.unuse_shadow(k);
                }
                match other {
                    Err(e) => Err(e),
                    Ok(o) => Err(VerbsError::InvalidArgument(format!(
                        "unexpected reply {o:?}"
                    ))),
                }
            }
        }
    }

    fn alloc_mw(&mut self, pd: PdId, ty: roce::memory::MwType) -> VerbsResult<Rkey> {
        expect_reply!(self.call(Command::AllocMw { pd, ty }), ReplyData::Mw(k) => k)
    }

    fn dealloc_mw(&mut self, mw: Rkey) -> VerbsResult<()> {
        self.call(Command::DeallocMw { rkey: mw }).map(|_| ())
    }

    fn dereg_mr(&mut self, mr: &Mr) -> VerbsResult<()> {
        self.call(Command::DeregMr { lkey: mr.lkey })?;
        if let Some(key) = self.shadow_mrs.remove(&mr.lkey.0) {
            self.unuse_shadow(key);
        }
        Ok(())
    }

    fn create_cq(&mut self, cqe: u32) -> VerbsResult<CqId> {
        let capacity = (cqe.max(1) as usize).next_power_of_two();
        let (area, prod, cons) = ring::<CqeSlot>(capacity, "ferroce-cq").map_err(|e| {
            VerbsError::InvalidArgument(format!("cannot allocate the CQ ring: {e}"))
        })?;
        drop(prod); // the worker attaches its own producer end
        let r = self.call_with(
            Command::CreateCq {
                cqe,
                capacity: capacity as u32,
            },
            Some(area.clone()),
        );
        // Sent (or refused): the ring is never sent again, so its fd can go.
        area.close_fd();
        let cq = expect_reply!(r, ReplyData::Cq(cq) => cq)?;
        match self.cqs.get_mut(cq.0 as usize) {
            Some(slot) => {
                // A new ring's notification sequence starts at 0; the slot may have held an
                // earlier CQ's (ids are reused), and a waiter must not take that for a
                // notification of this one.
                self.cq_seen[cq.0 as usize] = cons.notify_seq();
                *slot = Some(cons);
                Ok(cq)
            }
            None => {
                let _ = self.call(Command::DestroyCq { cq });
                Err(VerbsError::NoResources("completion queues"))
            }
        }
    }

    fn resize_cq(&mut self, cq: CqId, cqe: u32) -> VerbsResult<u32> {
        expect_reply!(self.call(Command::ResizeCq { cq, cqe }), ReplyData::Cqe(n) => n)
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
        self.poll_cq_each(cq, out.len(), |i, c| out[i] = c)
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

    fn sq_room(&mut self, qpn: Qpn) -> VerbsResult<u32> {
        let slot = qp_slot(qpn, self.limits.max_qp).unwrap_or(usize::MAX);
        let q = self.qp_mut(qpn)?;
        let (cap, posted) = (q.caps.max_send_wr as u64, q.sq_posted);
        let used = posted.wrapping_sub(retired(&self.index, slot * QP_INDEX_BYTES));
        Ok(cap.saturating_sub(used) as u32)
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
        let s = PostSlot::recv(post_kind::RECV, qpn.value(), wr.wr_id, wr.sg_list)
            .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        self.push(&s)?;
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
        let slot = PostSlot::recv(post_kind::SRQ_RECV, srq.0, wr.wr_id, wr.sg_list)
            .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        self.push(&slot)?;
        if let Some(Some(s)) = self.srqs.get_mut(srq.0 as usize) {
            s.posted += 1;
        }
        Ok(())
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        while let Some(e) = self.events.pop() {
            if let Some(ev) = e.decode() {
                if ev == AsyncEvent::DeviceFatal {
                    // Reported once, whether from the ring or from the channel.
                    if self.fatal_reported {
                        continue;
                    }
                    self.fatal_reported = true;
                }
                return Some(ev);
            }
        }
        if !self.fatal_reported && !self.alive() {
            self.fatal_reported = true;
            return Some(AsyncEvent::DeviceFatal);
        }
        None
    }

    fn req_notify_cq(&mut self, cq: CqId) -> VerbsResult<()> {
        self.arm_cq(cq, false)
    }

    fn req_notify_cq_solicited(&mut self, cq: CqId) -> VerbsResult<()> {
        self.arm_cq(cq, true)
    }

    fn wait_cq(&mut self, cq: CqId, timeout: Option<Duration>) -> VerbsResult<bool> {
        let seen = *self
            .cq_seen
            .get(cq.0 as usize)
            .ok_or(VerbsError::NotFound("completion queue"))?;
        let ring = self
            .cqs
            .get(cq.0 as usize)
            .and_then(|r| r.as_ref())
            .ok_or(VerbsError::NotFound("completion queue"))?;
        // Wait in slices, so a device that goes away ends the wait.
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if !self.chan.alive() {
                return Err(VerbsError::DeviceFatal);
            }
            let slice = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
                None => Duration::from_millis(100),
            };
            if ring.wait_notify(seen, Some(slice)) {
                self.cq_seen[cq.0 as usize] = ring.notify_seq();
                return Ok(true);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    fn counters(&mut self, qpn: Option<Qpn>) -> VerbsResult<Vec<(&'static str, u64)>> {
        let vals =
            expect_reply!(self.call(Command::Counters { qpn }), ReplyData::Counters(v) => v)?;
        Ok(counter_names().zip(vals).collect())
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
/// How many clients one RNIC can number (every u16 but [`NOBODY`]).
pub const MAX_HOST_IDS: usize = NOBODY as usize;

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

/// What one client holds, for `rnic-ctl res`.
#[derive(Debug, Clone, Default)]
pub struct HostObjects {
    /// PDs.
    pub pds: Vec<PdId>,
    /// MRs (their lkeys).
    pub mrs: Vec<Lkey>,
    /// CQs.
    pub cqs: Vec<CqId>,
    /// QPs.
    pub qps: Vec<Qpn>,
    /// SRQs.
    pub srqs: Vec<SrqId>,
    /// Bytes of shared areas.
    pub area_bytes: u64,
}

/// The kinds of object whose queue memory is charged to a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum QueueKind {
    Qp,
    Srq,
    Cq,
}

/// The worker's end of a client.
pub struct HostEnd {
    /// Identifies this client to the worker's control calls.
    pub token: u64,
    /// Its index among the RNIC's hosts (set when attached).
    pub id: u16,
    /// Who it is (pid and command name for rnicd clients), for logs and rnic-ctl.
    pub label: String,
    /// The owning process (0: this one).
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its command name.
    pub comm: String,
    posts: Consumer<PostSlot>,
    events: Producer<EventSlot>,
    /// CQ rings by CQ id; `true` while the CQ has completions the ring had no room for.
    cqs: Vec<Option<(Producer<CqeSlot>, bool)>>,
    pending_cqs: Vec<CqId>,
    index: Arc<Area>,
    limits: HostLimits,
    client_limits: ClientLimits,
    areas: HashMap<u32, Arc<Area>>,
    /// Areas the client forgot that MRs still keep mapped (still counted).
    retired: Vec<Arc<Area>>,
    /// Bytes of the client's areas and CQ rings mapped on the worker.
    area_bytes: u64,
    /// Bytes of queue memory the engine holds for the client's QPs, SRQs and CQs.
    queue_bytes: u64,
    /// What each of those objects was charged, by kind and id.
    queue_charges: HashMap<(QueueKind, u32), u64>,
    qps: Vec<Qpn>,
    srqs: Vec<SrqId>,
    mrs: Vec<Lkey>,
    /// Memory windows, by their key at allocation (the index names them).
    mws: Vec<Rkey>,
    pds: Vec<PdId>,
    scratch: Vec<Completion>,
    /// Counters.
    pub counters: HostCounters,
    closed: bool,
}

impl HostEnd {
    /// A host end over the worker's ends of a client's rings.
    pub fn new(
        posts: Consumer<PostSlot>,
        events: Producer<EventSlot>,
        index: Arc<Area>,
        limits: HostLimits,
        client_limits: ClientLimits,
    ) -> HostEnd {
        HostEnd {
            token: TOKENS.fetch_add(1, Ordering::Relaxed),
            id: u16::MAX,
            label: String::new(),
            pid: 0,
            uid: 0,
            comm: String::new(),
            posts,
            events,
            cqs: (0..limits.max_cq).map(|_| None).collect(),
            pending_cqs: Vec::new(),
            index,
            limits,
            client_limits,
            areas: HashMap::new(),
            retired: Vec::new(),
            area_bytes: 0,
            queue_bytes: 0,
            queue_charges: HashMap::new(),
            qps: Vec::new(),
            srqs: Vec::new(),
            mrs: Vec::new(),
            mws: Vec::new(),
            pds: Vec::new(),
            scratch: Vec::with_capacity(64),
            counters: HostCounters::default(),
            closed: false,
        }
    }

    /// Whether the client closed (or lost) its context (the RNIC then drops this end).
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// Bytes of the client's areas (rings included) mapped on the worker.
    pub fn area_bytes(&self) -> u64 {
        self.area_bytes
    }

    /// What the client holds.
    pub fn objects(&self) -> HostObjects {
        HostObjects {
            pds: self.pds.clone(),
            mrs: self.mrs.clone(),
            cqs: (0..self.cqs.len())
                .filter(|&i| self.cqs[i].is_some())
                .map(|i| CqId(i as u32))
                .collect(),
            qps: self.qps.clone(),
            srqs: self.srqs.clone(),
            area_bytes: self.area_bytes,
        }
    }

    /// Executes up to `budget` posts from the client's ring against `dev`; returns how
    /// many. A slot that does not decode ends the client (its objects are released).
    pub fn process(&mut self, dev: &mut Device, owners: &mut Owners, budget: usize) -> usize {
        let mut n = 0;
        while n < budget && !self.closed {
            // Copied out of shared memory first, then decoded and checked.
            let Some(slot) = self.posts.pop() else { break };
            n += 1;
            match slot.decode() {
                Ok(post) => self.post(dev, owners, post),
                Err(e) => {
                    self.counters.bad_slots += 1;
                    tracing::warn!(client = %self.label, error = %e, "bad post slot: closing the client");
                    self.deliver_event(&AsyncEvent::DeviceFatal);
                    self.close(dev, owners);
                }
            }
        }
        if self.posts.rejected > 0 && !self.closed {
            self.counters.bad_slots += 1;
            tracing::warn!(client = %self.label, "post ring indices corrupted: closing the client");
            self.deliver_event(&AsyncEvent::DeviceFatal);
            self.close(dev, owners);
        }
        n
    }

    /// Whether the live QP `qpn` is this client's, in O(1) through [`Owners`] (kept with
    /// `self.qps`, which the control calls use): the check of every post.
    fn posts_to_own_qp(&self, dev: &Device, owners: &Owners, qpn: Qpn) -> bool {
        dev.qp_index(qpn).and_then(|s| owners.qp(s)) == Some(usize::from(self.id))
    }

    fn post(&mut self, dev: &mut Device, owners: &Owners, post: Post) {
        match post {
            Post::Send { qpn, wr } => {
                let own = self.posts_to_own_qp(dev, owners, qpn);
                let r = if !own {
                    Err(VerbsError::NotFound("queue pair"))
                } else {
                    match wr.inline() {
                        Some(bytes) => {
                            let bare = SendWr {
                                sg_list: &[],
                                ..wr.as_wr()
                            };
                            dev.post_send_inline(qpn, &bare, bytes)
                        }
                        None => dev.post_send(qpn, &wr.as_wr()),
                    }
                };
                if r.is_err() {
                    self.counters.failed_posts += 1;
                    if own {
                        // Completed in order with LOC_QP_OP_ERR, its send queue place freed
                        // when it retires (the application counted it as posted).
                        dev.reject_posted_send(qpn, &wr.as_wr());
                    }
                }
            }
            Post::Recv {
                qpn,
                wr_id,
                nsge,
                sges,
            } => {
                let own = self.posts_to_own_qp(dev, owners, qpn);
                let r = if own {
                    dev.post_recv(
                        qpn,
                        &RecvWr {
                            wr_id,
                            sg_list: &sges[..nsge],
                        },
                    )
                } else {
                    Err(VerbsError::NotFound("queue pair"))
                };
                if r.is_err() {
                    self.counters.failed_posts += 1;
                    if own {
                        dev.fail_posted_wr(qpn, wr_id, WcOpcode::Recv, true);
                    }
                }
            }
            Post::SrqRecv {
                srq,
                wr_id,
                nsge,
                sges,
            } => {
                let srq = SrqId(srq);
                let r = if owners.srq(srq) == Some(usize::from(self.id)) {
                    dev.post_srq_recv(
                        srq,
                        &RecvWr {
                            wr_id,
                            sg_list: &sges[..nsge],
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
            }
        }
    }

    /// Executes a control call: first the posts already in the ring (program order), then
    /// the call.
    pub fn call(
        &mut self,
        dev: &mut Device,
        owners: &mut Owners,
        cmd: Command,
        area: Option<Arc<Area>>,
    ) -> VerbsResult<ReplyData> {
        // A context closed for breaking the protocol is dead to its client: device fatal.
        if self.closed {
            return Err(VerbsError::DeviceFatal);
        }
        // The posts already in the ring come first (program order). One ring's worth: all
        // that was posted before the call fits; a client refilling its ring meanwhile
        // cannot hold the worker here.
        self.process(dev, owners, POST_RING);
        if self.closed {
            return Err(VerbsError::DeviceFatal);
        }
        self.reap_areas();
        self.execute(dev, owners, cmd, area)
    }

    /// Stops counting retired areas once no MR holds them any more (they are unmapped).
    fn reap_areas(&mut self) {
        let mut freed = 0u64;
        self.retired.retain(|a| {
            let held = Arc::strong_count(a) > 1;
            if !held {
                freed += a.len() as u64;
            }
            held
        });
        self.area_bytes -= freed;
    }

    /// Mappings the client has on the worker: its areas (live or retired) and CQ rings.
    fn area_count(&self) -> usize {
        self.areas.len() + self.retired.len() + self.cqs.iter().flatten().count()
    }

    /// Refuses one more mapping past `host.max_areas`.
    fn check_area_count(&self) -> VerbsResult<()> {
        if self.area_count() >= self.client_limits.max_areas as usize {
            return Err(VerbsError::NoResources("memory areas (host.max_areas)"));
        }
        Ok(())
    }

    /// Refuses `bytes` more of queue memory past `host.max_queue_bytes` (checked before the
    /// engine allocates anything).
    fn check_queue(&self, bytes: u64) -> VerbsResult<()> {
        if self.queue_bytes.saturating_add(bytes) > self.client_limits.max_queue_bytes {
            return Err(VerbsError::NoResources(
                "queue memory (host.max_queue_bytes)",
            ));
        }
        Ok(())
    }

    fn charge_queue(&mut self, kind: QueueKind, id: u32, bytes: u64) {
        self.queue_bytes += bytes;
        self.queue_charges.insert((kind, id), bytes);
    }

    fn uncharge_queue(&mut self, kind: QueueKind, id: u32) {
        if let Some(b) = self.queue_charges.remove(&(kind, id)) {
            self.queue_bytes -= b;
        }
    }

    /// Bytes of queue memory charged to the client.
    pub fn queue_bytes(&self) -> u64 {
        self.queue_bytes
    }

    /// Counts `bytes` more of shared memory against the client's limit.
    fn charge(&mut self, bytes: u64) -> VerbsResult<()> {
        if self.area_bytes.saturating_add(bytes) > self.client_limits.max_area_bytes {
            return Err(VerbsError::NoResources(
                "shared memory (host.max_area_bytes)",
            ));
        }
        self.area_bytes += bytes;
        Ok(())
    }

    fn execute(
        &mut self,
        dev: &mut Device,
        owners: &mut Owners,
        cmd: Command,
        area: Option<Arc<Area>>,
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
                if self.pds.len() as u32 >= self.client_limits.max_pds {
                    return Err(VerbsError::NoResources("protection domains (host.max_pds)"));
                }
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
            Command::AddArea { id } => {
                let area = area.ok_or_else(|| {
                    VerbsError::InvalidArgument("add_area without a memory area".into())
                })?;
                if self.areas.contains_key(&id) {
                    return Err(VerbsError::InvalidArgument(format!(
                        "area {id} already exists"
                    )));
                }
                self.reap_areas();
                self.check_area_count()?;
                self.charge(area.len() as u64)?;
                self.areas.insert(id, area);
                Ok(ReplyData::None)
            }
            Command::RemoveArea { id } => match self.areas.remove(&id) {
                Some(a) => {
                    // Counted until the last MR on it goes and the worker unmaps it.
                    self.retired.push(a);
                    self.reap_areas();
                    Ok(ReplyData::None)
                }
                None => Err(VerbsError::NotFound("memory area")),
            },
            Command::RegMr {
                pd,
                area,
                offset,
                len,
                access,
                iova,
            } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                if (self.mrs.len() + self.mws.len()) as u32 >= self.client_limits.max_mrs {
                    return Err(VerbsError::NoResources("memory regions (host.max_mrs)"));
                }
                let mem = self
                    .areas
                    .get(&area)
                    .cloned()
                    .ok_or(VerbsError::NotFound("memory area"))?;
                let offset = usize::try_from(offset)
                    .map_err(|_| VerbsError::InvalidArgument("offset too large".into()))?;
                let (lkey, rkey) = dev.reg_mr(pd, mem, offset, iova, len, access)?;
                self.mrs.push(lkey);
                Ok(ReplyData::Keys { lkey, rkey })
            }
            Command::ReregMr {
                lkey,
                pd,
                translation,
                access,
            } => {
                let owned = self.mrs.contains(&lkey);
                self.check_owned(owned, "memory region")?;
                if let Some(pd) = pd {
                    self.check_owned(self.pds.contains(&pd), "protection domain")?;
                }
                let translation = match translation {
                    None => None,
                    Some(t) => Some(roce::engine::MrTranslation {
                        mem: self
                            .areas
                            .get(&t.area)
                            .cloned()
                            .ok_or(VerbsError::NotFound("memory area"))?,
                        mem_offset: usize::try_from(t.offset)
                            .map_err(|_| VerbsError::InvalidArgument("offset too large".into()))?,
                        addr: t.iova,
                        length: t.len,
                    }),
                };
                let change = roce::engine::MrChange {
                    pd,
                    translation,
                    access,
                };
                let (lkey, rkey) = dev.rereg_mr(lkey, change)?;
                Ok(ReplyData::Keys { lkey, rkey })
            }
            Command::AllocMw { pd, ty } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                if (self.mrs.len() + self.mws.len()) as u32 >= self.client_limits.max_mrs {
                    return Err(VerbsError::NoResources("memory regions (host.max_mrs)"));
                }
                let k = dev.alloc_mw(pd, ty)?;
                self.mws.push(k);
                Ok(ReplyData::Mw(k))
            }
            Command::DeallocMw { rkey } => {
                let owned = self.mws.iter().any(|k| k.index() == rkey.index());
                self.check_owned(owned, "memory window")?;
                dev.dealloc_mw(rkey)?;
                self.mws.retain(|k| k.index() != rkey.index());
                Ok(ReplyData::None)
            }
            Command::AllocMr { pd, area } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                if (self.mrs.len() + self.mws.len()) as u32 >= self.client_limits.max_mrs {
                    return Err(VerbsError::NoResources("memory regions (host.max_mrs)"));
                }
                let mem = self
                    .areas
                    .get(&area)
                    .cloned()
                    .ok_or(VerbsError::NotFound("memory area"))?;
                let lkey = dev.alloc_mr(pd, mem)?;
                self.mrs.push(lkey);
                Ok(ReplyData::Keys { lkey, rkey: None })
            }
            Command::DeregMr { lkey } => {
                let owned = self.mrs.iter().any(|k| k.index() == lkey.index());
                self.check_owned(owned, "memory region")?;
                dev.dereg_mr(lkey)?;
                self.mrs.retain(|k| k.index() != lkey.index());
                Ok(ReplyData::None)
            }
            Command::CreateCq { cqe, capacity } => {
                let ring = area.ok_or_else(|| {
                    VerbsError::InvalidArgument("create_cq without a ring".into())
                })?;
                if !capacity.is_power_of_two()
                    || ring.len() < ring_bytes::<CqeSlot>(capacity as usize)
                {
                    return Err(VerbsError::InvalidArgument("CQ ring too small".into()));
                }
                let owned = self.cqs.iter().flatten().count() as u32;
                if owned >= self.client_limits.max_cqs {
                    return Err(VerbsError::NoResources("completion queues (host.max_cqs)"));
                }
                self.check_area_count()?;
                let qbytes = roce::engine::cq_queue_bytes(cqe);
                self.check_queue(qbytes)?;
                let ring_len = ring.len() as u64;
                self.charge(ring_len)?;
                let cq = match dev.create_cq(cqe) {
                    Ok(c) => c,
                    Err(e) => {
                        self.area_bytes -= ring_len;
                        return Err(e);
                    }
                };
                let Some(slot) = self.cqs.get_mut(cq.0 as usize) else {
                    let _ = dev.destroy_cq(cq);
                    self.area_bytes -= ring_len;
                    return Err(VerbsError::NoResources("completion queues"));
                };
                *slot = Some((Producer::attach(ring, capacity as usize), false));
                Owners::set(&mut owners.cq, cq.0 as usize, self.id);
                self.charge_queue(QueueKind::Cq, cq.0, qbytes);
                Ok(ReplyData::Cq(cq))
            }
            Command::ResizeCq { cq, cqe } => {
                self.check_owned(self.owns_cq(cq), "completion queue")?;
                let old = self
                    .queue_charges
                    .get(&(QueueKind::Cq, cq.0))
                    .copied()
                    .unwrap_or(0);
                let new = roce::engine::cq_queue_bytes(cqe);
                self.check_queue(new.saturating_sub(old))?;
                let size = dev.resize_cq(cq, cqe)?;
                self.uncharge_queue(QueueKind::Cq, cq.0);
                self.charge_queue(QueueKind::Cq, cq.0, new);
                Ok(ReplyData::Cqe(size))
            }
            Command::DestroyCq { cq } => {
                self.check_owned(self.owns_cq(cq), "completion queue")?;
                dev.destroy_cq(cq)?;
                if let Some((p, _)) = self.cqs[cq.0 as usize].take() {
                    self.area_bytes -= p.area().len() as u64;
                }
                self.pending_cqs.retain(|c| *c != cq);
                Owners::set(&mut owners.cq, cq.0 as usize, NOBODY);
                self.uncharge_queue(QueueKind::Cq, cq.0);
                Ok(ReplyData::None)
            }
            Command::CreateSrq { pd, attr } => {
                self.check_owned(self.pds.contains(&pd), "protection domain")?;
                if self.srqs.len() as u32 >= self.client_limits.max_srqs {
                    return Err(VerbsError::NoResources(
                        "shared receive queues (host.max_srqs)",
                    ));
                }
                if attr.max_sge as usize > MAX_HOST_SGE {
                    return Err(VerbsError::InvalidArgument(format!(
                        "at most {MAX_HOST_SGE} SGEs per WR"
                    )));
                }
                let qbytes = roce::engine::srq_queue_bytes(&attr);
                self.check_queue(qbytes)?;
                let s = dev.create_srq(pd, &attr)?;
                if s.0 >= self.limits.max_srq {
                    let _ = dev.destroy_srq(s);
                    return Err(VerbsError::NoResources("shared receive queues"));
                }
                self.charge_queue(QueueKind::Srq, s.0, qbytes);
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
                self.uncharge_queue(QueueKind::Srq, srq.0);
                Ok(ReplyData::None)
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
                if self.qps.len() as u32 >= self.client_limits.max_qps {
                    return Err(VerbsError::NoResources("queue pairs (host.max_qps)"));
                }
                // Work requests cross the post ring with at most MAX_HOST_SGE SGEs.
                if init.caps.max_send_sge as usize > MAX_HOST_SGE
                    || init.caps.max_recv_sge as usize > MAX_HOST_SGE
                {
                    return Err(VerbsError::InvalidArgument(format!(
                        "at most {MAX_HOST_SGE} SGEs per WR"
                    )));
                }
                let qbytes = roce::engine::qp_queue_bytes(&init.caps, init.srq.is_some());
                self.check_queue(qbytes)?;
                let q = dev.create_qp(&init)?;
                let slot = dev.qp_index(q).expect("just created");
                if slot >= self.limits.max_qp as usize {
                    let _ = dev.destroy_qp(q);
                    return Err(VerbsError::NoResources("queue pairs"));
                }
                self.charge_queue(QueueKind::Qp, q.value(), qbytes);
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
                self.uncharge_queue(QueueKind::Qp, qpn.value());
                Ok(ReplyData::None)
            }
            Command::Counters { qpn } => {
                let (devc, total) = dev.counters();
                let qc = match qpn {
                    Some(q) => {
                        self.check_owned(self.qps.contains(&q), "queue pair")?;
                        dev.qp_counters(q)
                            .ok_or(VerbsError::NotFound("queue pair"))?
                    }
                    None => total,
                };
                let vals = qc
                    .iter()
                    .map(|(_, v)| v)
                    .chain(devc.iter().map(|(_, v)| v))
                    .chain(self.counters.values())
                    .collect();
                Ok(ReplyData::Counters(vals))
            }
            Command::Close => {
                self.close(dev, owners);
                Ok(ReplyData::None)
            }
        }
    }

    /// Objects are named by small numbers another application could guess: a client may
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

    /// Releases everything the client created, in dependency order (QPs, SRQs, CQs, MRs,
    /// PDs, areas), as the kernel does for a process that exits without cleaning up. QPs go
    /// first: they stop touching memory; then the MRs, which hold the areas mapped.
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
        // Windows before MRs: a bound window holds its MR.
        for k in std::mem::take(&mut self.mws) {
            let _ = dev.dealloc_mw(k);
        }
        for k in std::mem::take(&mut self.mrs) {
            let _ = dev.dereg_mr(k);
        }
        for pd in std::mem::take(&mut self.pds) {
            let _ = dev.dealloc_pd(pd);
        }
        self.areas.clear();
        self.retired.clear();
        self.area_bytes = 0;
        self.queue_charges.clear();
        self.queue_bytes = 0;
        self.closed = true;
    }

    /// The device is going away: moves every QP of the client to the error state (its
    /// outstanding work requests complete as flushed) before the device-fatal event.
    pub fn fail_all(&mut self, dev: &mut Device) {
        let err = QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        };
        for &q in &self.qps {
            let _ = dev.modify_qp(q, &err);
        }
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
        let mut solicited = false;
        loop {
            let room = ring.free();
            if room == 0 {
                break;
            }
            self.scratch.resize(room.min(64), Completion::default());
            let n = dev.poll_cq(cq, &mut self.scratch).unwrap_or(0);
            for c in &self.scratch[..n] {
                ring.push(&CqeSlot::encode(c));
                solicited |= c.solicited || c.status != roce::verbs::WcStatus::Success;
            }
            moved += n;
            if n < self.scratch.len() {
                break;
            }
        }
        if moved > 0 {
            ring.notify(solicited);
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
        if self.events.push(&EventSlot::encode(ev)) {
            true
        } else {
            self.counters.events_dropped += 1;
            false
        }
    }
}

// Kept so slot types can be named alongside the host interface.
#[doc(hidden)]
pub fn _assert_plain<T: Plain>() {}
