//! The application interface: a verbs-style API ([`Verbs`], implemented by [`Context`]) over
//! single-producer/single-consumer rings between an application thread and the worker that
//! owns the device.
//!
//! Per context: a command ring (application -> worker) and a reply ring (worker -> application)
//! for verbs calls; a ring per CQ (worker -> application) for completions; an event ring; and a
//! small area where the worker publishes each work queue's consumer index, so `post_send` and
//! `post_recv` can tell "queue full" synchronously without a round trip, as with a hardware
//! RNIC's doorbell rings. Control calls (create/modify/query...) wait for their reply; posts
//! do not. Slots are fixed-size plain data (no pointers); memory is named by area id.
//!
//! The multi-process client library of the next milestone implements the same [`Verbs`]
//! trait over the same rings, placed in shared memory.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use roce::engine::{
    CqId, Device, DeviceAttr, PortAttr, QpInit, SrqAttr, SrqId, VerbsError, VerbsResult,
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

/// A send WR as it travels through the command ring.
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
    /// SGE count.
    pub nsge: u8,
    /// SGEs.
    pub sges: [Sge; MAX_HOST_SGE],
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
    Device(DeviceAttrData),
    Port(PortAttrData),
    Counters {
        n: u8,
        vals: [u64; 64],
    },
}

/// `DeviceAttr` without the string.
#[derive(Debug, Clone, Copy)]
#[allow(missing_docs)]
pub struct DeviceAttrData {
    pub max_qp: u32,
    pub max_qp_wr: u32,
    pub max_sge: u32,
    pub max_cq: u32,
    pub max_cqe: u32,
    pub max_mr: u32,
    pub max_pd: u32,
    pub max_qp_rd_atom: u8,
    pub max_srq: u32,
    pub max_srq_wr: u32,
    pub max_srq_sge: u32,
    pub atomic_cap: u32,
    pub max_inline_data: u32,
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
            };
            let text = e.to_string();
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

/// Per-QP published indices: (send WQEs retired, receive WQEs retired), 16 bytes per QP slot.
const QP_INDEX_BYTES: usize = 16;

/// The worker's end of a context.
pub struct HostEnd {
    reg: Arc<AreaRegistry>,
    cmds: Consumer<Req>,
    replies: Producer<Resp>,
    events: Producer<AsyncEvent>,
    cqs: Vec<(CqId, Producer<Completion>)>,
    qp_index: Arc<Area>,
    qps: Vec<Qpn>,
    srqs: Vec<SrqId>,
    scratch: Vec<Completion>,
    /// Posts that failed on the worker side (reported as error completions).
    pub failed_posts: u64,
}

/// Application memory a context allocated (registered as MRs, advertised to peers).
#[derive(Debug, Clone)]
pub struct Buffer {
    area: Arc<Area>,
}

impl Buffer {
    /// Length.
    pub fn len(&self) -> usize {
        self.area.len()
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.area.is_empty()
    }

    /// Address (what MRs are registered at and peers are told).
    pub fn addr(&self) -> u64 {
        self.area.addr()
    }

    /// Copies bytes in.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.area
            .write_at(off, data)
            .expect("Buffer::write in bounds");
    }

    /// Copies bytes out.
    pub fn read(&self, off: usize, out: &mut [u8]) {
        self.area.read_at(off, out).expect("Buffer::read in bounds");
    }

    /// A copy of `len` bytes at `off`.
    pub fn to_vec(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.read(off, &mut v);
        v
    }

    /// Reads one byte with acquire ordering (poll for an incoming WRITE's last byte).
    pub fn load_u8(&self, off: usize) -> u8 {
        self.area.load_u8(off)
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
        self.area.id()
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
    fn query_device(&mut self) -> VerbsResult<DeviceAttrData>;
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
    /// `ibv_post_send` (one WR).
    fn post_send(&mut self, qpn: Qpn, wr: &SendWr<'_>) -> VerbsResult<()>;
    /// `ibv_post_recv` (one WR).
    fn post_recv(&mut self, qpn: Qpn, wr: &RecvWr<'_>) -> VerbsResult<()>;
    /// `ibv_create_srq`.
    fn create_srq(&mut self, pd: PdId, attr: &SrqAttr) -> VerbsResult<SrqId>;
    /// `ibv_post_srq_recv`.
    fn post_srq_recv(&mut self, srq: SrqId, wr: &RecvWr<'_>) -> VerbsResult<()>;
    /// Next asynchronous event.
    fn poll_event(&mut self) -> Option<AsyncEvent>;
    /// Counters of a QP, or of the whole device (QP counters summed plus device ones).
    fn counters(&mut self, qpn: Option<Qpn>) -> VerbsResult<Vec<(&'static str, u64)>>;
}

struct QpLocal {
    slot: usize,
    caps: QpCaps,
    qp_type: QpType,
    state: QpState,
    srq: bool,
    sq_posted: u64,
    rq_posted: u64,
}

/// An application's handle on an RNIC (in-process backend of [`Verbs`]).
pub struct Context {
    reg: Arc<AreaRegistry>,
    cmds: Producer<Req>,
    replies: Consumer<Resp>,
    events: Consumer<AsyncEvent>,
    qp_index: Arc<Area>,
    seq: u64,
    cqs: HashMap<u32, Consumer<Completion>>,
    qps: HashMap<u32, QpLocal>,
    srqs: HashMap<u32, (u64, u32, usize)>,
    alive: Arc<AtomicBool>,
    max_qps: usize,
}

/// Creates both ends of a context. `alive` is cleared by the worker when it stops, so calls
/// fail instead of waiting forever.
pub fn context(
    reg: Arc<AreaRegistry>,
    max_qps: usize,
    alive: Arc<AtomicBool>,
) -> std::io::Result<(Context, HostEnd)> {
    let (_, cmd_p, cmd_c) = ring::<Req>(&reg, CMD_RING)?;
    let (_, rep_p, rep_c) = ring::<Resp>(&reg, 256)?;
    let (_, ev_p, ev_c) = ring::<AsyncEvent>(&reg, 1024)?;
    let qp_index = reg.create(max_qps * QP_INDEX_BYTES)?;
    Ok((
        Context {
            reg: reg.clone(),
            cmds: cmd_p,
            replies: rep_c,
            events: ev_c,
            qp_index: qp_index.clone(),
            seq: 0,
            cqs: HashMap::new(),
            qps: HashMap::new(),
            srqs: HashMap::new(),
            alive,
            max_qps,
        },
        HostEnd {
            reg,
            cmds: cmd_c,
            replies: rep_p,
            events: ev_p,
            cqs: Vec::new(),
            qp_index,
            qps: Vec::new(),
            srqs: Vec::new(),
            scratch: Vec::with_capacity(64),
            failed_posts: 0,
        },
    ))
}

impl Context {
    fn push(&mut self, cmd: Command) -> VerbsResult<u64> {
        self.seq += 1;
        let req = Req { seq: self.seq, cmd };
        let mut spins = 0u32;
        while !self.cmds.push(&req) {
            if !self.alive.load(Ordering::Acquire) {
                return Err(VerbsError::InvalidState(QpState::Err));
            }
            spins += 1;
            backoff(spins);
        }
        Ok(self.seq)
    }

    fn call(&mut self, cmd: Command) -> VerbsResult<ReplyData> {
        let seq = self.push(cmd)?;
        let mut spins = 0u32;
        loop {
            if let Some(r) = self.replies.pop() {
                if r.seq == seq {
                    return from_reply(r.reply);
                }
                continue; // a stale reply (cannot happen with in-order rings)
            }
            if !self.alive.load(Ordering::Acquire) {
                return Err(VerbsError::NotFound("worker (the dataplane stopped)"));
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
            area: buf.area.id(),
            offset: offset as u64,
            len: len as u64,
            access,
            iova,
        };
        match self.call(cmd)? {
            ReplyData::Keys { lkey, rkey } => Ok(Mr {
                lkey,
                rkey,
                addr: iova.unwrap_or(buf.addr() + offset as u64),
                len: len as u64,
            }),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    /// Waits until the worker has processed every command sent so far.
    pub fn sync(&mut self) -> VerbsResult<()> {
        self.call(Command::QueryPort).map(|_| ())
    }
}

/// How many WQEs of a QP's send (`queue` 0) or receive (`queue` 1) queue the worker has
/// retired, as it publishes them in the index area.
fn retired(index: &Area, slot: usize, queue: usize) -> u64 {
    index
        .atomic_u64(slot * QP_INDEX_BYTES + 8 * queue)
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

impl Verbs for Context {
    fn query_device(&mut self) -> VerbsResult<DeviceAttrData> {
        match self.call(Command::QueryDevice)? {
            ReplyData::Device(d) => Ok(d),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn query_port(&mut self) -> VerbsResult<PortAttrData> {
        match self.call(Command::QueryPort)? {
            ReplyData::Port(p) => Ok(p),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn query_gid(&mut self, index: u8) -> VerbsResult<Gid> {
        match self.call(Command::QueryGid { index })? {
            ReplyData::Gid(g) => Ok(g),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn alloc_pd(&mut self) -> VerbsResult<PdId> {
        match self.call(Command::AllocPd)? {
            ReplyData::Pd(p) => Ok(p),
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn dealloc_pd(&mut self, pd: PdId) -> VerbsResult<()> {
        self.call(Command::DeallocPd { pd }).map(|_| ())
    }

    fn alloc_buffer(&mut self, len: usize) -> VerbsResult<Buffer> {
        let area = self.reg.create(len).map_err(|e| {
            VerbsError::InvalidArgument(format!("cannot allocate {len} bytes: {e}"))
        })?;
        Ok(Buffer { area })
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
        match self.call(Command::CreateCq {
            cqe,
            ring: ring_id,
            capacity: capacity as u32,
        }) {
            Ok(ReplyData::Cq(cq)) => {
                self.cqs.insert(cq.0, cons);
                Ok(cq)
            }
            Ok(o) => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
            Err(e) => {
                self.reg.remove(ring_id);
                Err(e)
            }
        }
    }

    fn destroy_cq(&mut self, cq: CqId) -> VerbsResult<()> {
        self.call(Command::DestroyCq { cq })?;
        self.cqs.remove(&cq.0);
        Ok(())
    }

    #[inline]
    fn poll_cq(&mut self, cq: CqId, out: &mut [Completion]) -> VerbsResult<usize> {
        let ring = self
            .cqs
            .get_mut(&cq.0)
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
        match self.call(Command::CreateQp { init: *init })? {
            ReplyData::Qp(qpn, slot) => {
                let slot = slot as usize;
                if slot >= self.max_qps {
                    return Err(VerbsError::NoResources("queue pairs"));
                }
                let caps = match self.call(Command::QueryQp { qpn })? {
                    ReplyData::QpInfo(i) => i.caps,
                    _ => init.caps,
                };
                self.qps.insert(
                    qpn.value(),
                    QpLocal {
                        slot,
                        caps,
                        qp_type: init.qp_type,
                        state: QpState::Reset,
                        srq: init.srq.is_some(),
                        sq_posted: 0,
                        rq_posted: 0,
                    },
                );
                Ok(qpn)
            }
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn modify_qp(&mut self, qpn: Qpn, attr: &QpAttr) -> VerbsResult<()> {
        self.call(Command::ModifyQp { qpn, attr: *attr })?;
        if let Some(q) = self.qps.get_mut(&qpn.value()) {
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
        match self.call(Command::QueryQp { qpn })? {
            ReplyData::QpInfo(i) => {
                if let Some(q) = self.qps.get_mut(&qpn.value()) {
                    q.state = i.state;
                }
                Ok(i)
            }
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn destroy_qp(&mut self, qpn: Qpn) -> VerbsResult<()> {
        self.call(Command::DestroyQp { qpn })?;
        self.qps.remove(&qpn.value());
        Ok(())
    }

    #[inline]
    fn post_send(&mut self, qpn: Qpn, wr: &SendWr<'_>) -> VerbsResult<()> {
        let q = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(VerbsError::NotFound("queue pair"))?;
        let sq_retired = retired(&self.qp_index, q.slot, 0);
        // The checks the engine would make at post time, made here so the call is synchronous
        // without a round trip (the worker re-checks; a failure there becomes an error
        // completion).
        if matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(q.state));
        }
        if q.sq_posted.wrapping_sub(sq_retired) >= q.caps.max_send_wr as u64 {
            return Err(VerbsError::QueueFull);
        }
        if wr.sg_list.len() > q.caps.max_send_sge as usize {
            return Err(VerbsError::InvalidArgument(format!(
                "{} SGEs exceed max_send_sge {}",
                wr.sg_list.len(),
                q.caps.max_send_sge
            )));
        }
        if wr.flags.contains(SendFlags::INLINE) {
            let n: u64 = wr.sg_list.iter().map(|s| s.length as u64).sum();
            if n > q.caps.max_inline_data as u64 {
                return Err(VerbsError::InvalidArgument(format!(
                    "{n} inline bytes exceed {}",
                    q.caps.max_inline_data
                )));
            }
        }
        if q.qp_type == QpType::Ud && wr.ud.is_none() {
            return Err(VerbsError::InvalidArgument(
                "UD sends need an address handle".into(),
            ));
        }
        let (nsge, sges) = pack_sges(wr.sg_list)?;
        q.sq_posted += 1;
        let data = SendWrData {
            wr_id: wr.wr_id,
            op: wr.op,
            flags: wr.flags,
            ud: wr.ud,
            nsge,
            sges,
        };
        self.push(Command::PostSend { qpn, wr: data }).map(|_| ())
    }

    #[inline]
    fn post_recv(&mut self, qpn: Qpn, wr: &RecvWr<'_>) -> VerbsResult<()> {
        let q = self
            .qps
            .get_mut(&qpn.value())
            .ok_or(VerbsError::NotFound("queue pair"))?;
        let rq_retired = retired(&self.qp_index, q.slot, 1);
        if q.srq {
            return Err(VerbsError::InvalidArgument(
                "the QP uses an SRQ: post to the SRQ".into(),
            ));
        }
        if q.state == QpState::Reset {
            return Err(VerbsError::InvalidState(q.state));
        }
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
        q.rq_posted += 1;
        self.push(Command::PostRecv {
            qpn,
            wr: RecvWrData {
                wr_id: wr.wr_id,
                nsge,
                sges,
            },
        })
        .map(|_| ())
    }

    fn create_srq(&mut self, pd: PdId, attr: &SrqAttr) -> VerbsResult<SrqId> {
        match self.call(Command::CreateSrq { pd, attr: *attr })? {
            ReplyData::Srq(s) => {
                self.srqs
                    .insert(s.0, (0, attr.max_wr, attr.max_sge as usize));
                Ok(s)
            }
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }

    fn post_srq_recv(&mut self, srq: SrqId, wr: &RecvWr<'_>) -> VerbsResult<()> {
        let (nsge, sges) = pack_sges(wr.sg_list)?;
        let s = self
            .srqs
            .get_mut(&srq.0)
            .ok_or(VerbsError::NotFound("shared receive queue"))?;
        if wr.sg_list.len() > s.2 {
            return Err(VerbsError::InvalidArgument(format!(
                "{} SGEs exceed the SRQ's {}",
                wr.sg_list.len(),
                s.2
            )));
        }
        s.0 += 1;
        self.push(Command::PostSrqRecv {
            srq,
            wr: RecvWrData {
                wr_id: wr.wr_id,
                nsge,
                sges,
            },
        })
        .map(|_| ())
    }

    fn poll_event(&mut self) -> Option<AsyncEvent> {
        self.events.pop()
    }

    fn counters(&mut self, qpn: Option<Qpn>) -> VerbsResult<Vec<(&'static str, u64)>> {
        match self.call(Command::Counters { qpn })? {
            ReplyData::Counters { n, vals } => {
                let names = roce::engine::QpCounters::NAMES
                    .iter()
                    .chain(roce::engine::DeviceCounters::NAMES);
                Ok(names
                    .copied()
                    .zip(vals[..n as usize].iter().copied())
                    .collect())
            }
            o => Err(VerbsError::InvalidArgument(format!(
                "unexpected reply {o:?}"
            ))),
        }
    }
}

impl HostEnd {
    /// Executes up to `budget` commands against `dev`; returns how many.
    pub fn process(&mut self, dev: &mut Device, budget: usize) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(req) = self.cmds.pop() else { break };
            n += 1;
            let post = req.cmd.is_post();
            let r = self.execute(dev, req.cmd);
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

    fn execute(&mut self, dev: &mut Device, cmd: Command) -> VerbsResult<ReplyData> {
        match cmd {
            Command::QueryDevice => {
                let a: DeviceAttr = dev.attr();
                Ok(ReplyData::Device(DeviceAttrData {
                    max_qp: a
                        .max_qp
                        .min(self.qp_index.len() as u32 / QP_INDEX_BYTES as u32),
                    max_qp_wr: a.max_qp_wr,
                    max_sge: a.max_sge.min(MAX_HOST_SGE as u32),
                    max_cq: a.max_cq,
                    max_cqe: a.max_cqe,
                    max_mr: a.max_mr,
                    max_pd: a.max_pd,
                    max_qp_rd_atom: a.max_qp_rd_atom,
                    max_srq: a.max_srq,
                    max_srq_wr: a.max_srq_wr,
                    max_srq_sge: a.max_srq_sge.min(MAX_HOST_SGE as u32),
                    atomic_cap: a.atomic_cap,
                    max_inline_data: a.max_inline_data,
                }))
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
            Command::AllocPd => dev.alloc_pd().map(ReplyData::Pd),
            Command::DeallocPd { pd } => dev.dealloc_pd(pd).map(|_| ReplyData::None),
            Command::RegMr {
                pd,
                area,
                offset,
                len,
                access,
                iova,
            } => {
                let mem = self
                    .reg
                    .get(area)
                    .ok_or_else(|| VerbsError::InvalidArgument(format!("no buffer {area}")))?;
                let addr = iova.unwrap_or(mem.addr() + offset);
                dev.reg_mr(pd, mem, offset as usize, addr, len, access)
                    .map(|(lkey, rkey)| ReplyData::Keys { lkey, rkey })
            }
            Command::AllocMr { pd, area } => {
                let mem = self
                    .reg
                    .get(area)
                    .ok_or_else(|| VerbsError::InvalidArgument(format!("no buffer {area}")))?;
                dev.alloc_mr(pd, mem)
                    .map(|lkey| ReplyData::Keys { lkey, rkey: None })
            }
            Command::DeregMr { lkey } => dev.dereg_mr(lkey).map(|_| ReplyData::None),
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
                self.cqs
                    .push((cq, Producer::attach(area, capacity as usize)));
                Ok(ReplyData::Cq(cq))
            }
            Command::DestroyCq { cq } => {
                dev.destroy_cq(cq)?;
                self.cqs.retain(|(c, _)| *c != cq);
                Ok(ReplyData::None)
            }
            Command::CreateSrq { pd, attr } => {
                let s = dev.create_srq(pd, &attr)?;
                self.srqs.push(s);
                Ok(ReplyData::Srq(s))
            }
            Command::ModifySrq { srq, limit } => {
                dev.modify_srq(srq, limit).map(|_| ReplyData::None)
            }
            Command::QuerySrq { srq } => dev.query_srq(srq).map(ReplyData::SrqAttr),
            Command::DestroySrq { srq } => {
                dev.destroy_srq(srq)?;
                self.srqs.retain(|s| *s != srq);
                Ok(ReplyData::None)
            }
            Command::PostSrqRecv { srq, wr } => {
                let r = dev.post_srq_recv(
                    srq,
                    &RecvWr {
                        wr_id: wr.wr_id,
                        sg_list: &wr.sges[..wr.nsge as usize],
                    },
                );
                if r.is_err() {
                    self.failed_posts += 1;
                }
                r.map(|_| ReplyData::None)
            }
            Command::CreateQp { init } => {
                let q = dev.create_qp(&init)?;
                let slot = dev.qp_index(q).expect("just created");
                if (slot + 1) * QP_INDEX_BYTES > self.qp_index.len() {
                    let _ = dev.destroy_qp(q);
                    return Err(VerbsError::NoResources("queue pairs"));
                }
                self.qps.push(q);
                self.publish_qp(dev, q);
                Ok(ReplyData::Qp(q, slot as u32))
            }
            Command::ModifyQp { qpn, attr } => {
                dev.modify_qp(qpn, &attr)?;
                self.publish_qp(dev, qpn);
                Ok(ReplyData::None)
            }
            Command::QueryQp { qpn } => dev.query_qp(qpn).map(ReplyData::QpInfo),
            Command::DestroyQp { qpn } => {
                dev.destroy_qp(qpn)?;
                self.qps.retain(|q| *q != qpn);
                Ok(ReplyData::None)
            }
            Command::PostSend { qpn, wr } => {
                let sw = SendWr {
                    wr_id: wr.wr_id,
                    op: wr.op,
                    sg_list: &wr.sges[..wr.nsge as usize],
                    flags: wr.flags,
                    ud: wr.ud,
                };
                let r = dev.post_send(qpn, &sw);
                if r.is_err() {
                    self.failed_posts += 1;
                    dev.fail_posted_wr(qpn, wr.wr_id, wr.op.wc_opcode(), false);
                }
                r.map(|_| ReplyData::None)
            }
            Command::PostRecv { qpn, wr } => {
                let r = dev.post_recv(
                    qpn,
                    &RecvWr {
                        wr_id: wr.wr_id,
                        sg_list: &wr.sges[..wr.nsge as usize],
                    },
                );
                if r.is_err() {
                    self.failed_posts += 1;
                    dev.fail_posted_wr(qpn, wr.wr_id, WcOpcode::Recv, true);
                }
                r.map(|_| ReplyData::None)
            }
            Command::Counters { qpn } => {
                let mut vals = [0u64; 64];
                let mut n = 0;
                let (devc, total) = dev.counters();
                let qc = match qpn {
                    Some(q) => dev
                        .qp_counters(q)
                        .ok_or(VerbsError::NotFound("queue pair"))?,
                    None => total,
                };
                for (_, v) in qc.iter().chain(devc.iter()) {
                    if n < vals.len() {
                        vals[n] = v;
                        n += 1;
                    }
                }
                Ok(ReplyData::Counters { n: n as u8, vals })
            }
        }
    }

    fn publish_qp(&self, dev: &Device, qpn: Qpn) {
        if let (Some(positions), Some(slot)) = (dev.queue_positions(qpn), dev.qp_index(qpn)) {
            for (queue, pos) in [positions.0, positions.1].into_iter().enumerate() {
                if let Ok(a) = self.qp_index.atomic_u64(slot * QP_INDEX_BYTES + 8 * queue) {
                    // This worker is the only writer, so its last store is what a relaxed load
                    // sees. Storing only changes keeps the line in the application's cache:
                    // the application reads it on every post and this runs every iteration.
                    if a.load(Ordering::Relaxed) != pos {
                        a.store(pos, Ordering::Release);
                    }
                }
            }
        }
    }

    /// Moves completions to the applications' CQ rings, publishes queue indices and events.
    /// Returns how many completions and events were delivered.
    pub fn publish(&mut self, dev: &mut Device) -> usize {
        let mut moved = 0;
        // Queue positions first: an application that polls a completion may at once post
        // into the slot it freed (ibv semantics), so the slot must already read as retired.
        // Queues also retire without completions (unsignaled WRs): publish every time.
        for &q in &self.qps {
            self.publish_qp(dev, q);
        }
        for (cq, ring) in self.cqs.iter_mut() {
            if !dev.cq_has_entries(*cq) {
                continue;
            }
            let room = ring.free();
            if room == 0 {
                continue; // the engine's CQ holds them; it reports an overflow if it fills
            }
            self.scratch.resize(room.min(64), Completion::default());
            let n = dev.poll_cq(*cq, &mut self.scratch).unwrap_or(0);
            for c in &self.scratch[..n] {
                ring.push(c);
            }
            moved += n;
        }
        while let Some(ev) = dev.poll_event() {
            if self.events.push(&ev) {
                moved += 1;
            }
        }
        moved
    }
}
