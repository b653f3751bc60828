//! The application side of the host interface: a verbs-style API ([`Verbs`], implemented by
//! [`Client`]) over shared-memory rings between an application and the worker that owns the
//! device. This is the producer of posts and the consumer of completions and events; it
//! trusts nothing it reads back beyond what the worker is (rnicd, or this process's own
//! runtime).
//!
//! Per client (application context) there are, in shared memory (memfd
//! `Area`s, layouts in [`crate::abi`]):
//! - a post ring (application -> worker) of 64-byte [`PostCell`](crate::abi::slots::PostCell)s:
//!   send, receive and SRQ receive work requests, one to seven cells each (a one-SGE WRITE
//!   is one), with inline data copied in when posted;
//! - one completion ring per CQ (worker -> application);
//! - an event ring (worker -> application);
//! - an index area where the worker publishes each QP's send/receive and each SRQ's consumer
//!   position, so `post_send`, `post_recv` and `post_srq_recv` know "queue full" without a
//!   round trip, as with a hardware RNIC's doorbell rings.
//!
//! Control calls (create/modify/query/destroy, registration) are
//! `Command`s that travel over a [`Channel`]: in the same process a
//! queue into the worker (`dataplane::local::LocalChannel`); from another process, rnicd's Unix
//! socket ([`remote`]). Either way the worker executes them after the posts already in the
//! ring, so program order holds. Memory is named per client: the client gives each area an id,
//! and another client's ids mean nothing in its table.
//!
//! Lookups on the post and poll paths are array indexing (QPs by `roce::engine::qp_slot`, CQs
//! and SRQs by id), never hashing.
//!
//! Lifetimes: dropping a [`Client`] releases everything it created on the worker (QPs, SRQs,
//! CQs, MRs, PDs, areas); dropping the last handle of a [`Buffer`] forgets its area (it is
//! unmapped once no MR uses it). If the worker stops - cleanly or by a panic - every call
//! fails with `VerbsError::DeviceFatal` and `poll_event` reports `AsyncEvent::DeviceFatal`
//! once, instead of waiting forever.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use roce::engine::{CqId, DeviceAttr, QpInit, SrqAttr, SrqId, VerbsResult};
use roce::memory::PdId;
use roce::types::{Gid, Lkey, Qpn, Rkey};
use roce::verbs::{Access, AsyncEvent, Completion, QpAttr, QpInfo, RecvWr, SendWr, Sge};

use crate::abi::area::Area;
use crate::abi::{Command, PortAttrData, ReplyData};

mod client;
pub mod remote;
pub mod shadow;

pub use client::{Client, ClientRings, CmQpPath, CqNotifier, RdmaCm};

/// How control calls reach the worker.
pub trait Channel: Send {
    /// Executes `cmd` on the worker (with the area it names, for `AddArea` and `CreateCq`)
    /// and returns its result; with a `deadline`, gives up then (DeviceFatal).
    fn exchange(
        &mut self,
        cmd: Command,
        area: Option<Arc<Area>>,
        deadline: Option<Instant>,
    ) -> VerbsResult<ReplyData>;
    /// Executes `cmd` on the worker (with the area it names, for `AddArea` and `CreateCq`)
    /// and returns its result.
    fn call(&mut self, cmd: Command, area: Option<Arc<Area>>) -> VerbsResult<ReplyData> {
        self.exchange(cmd, area, None)
    }
    /// Like `call`, but gives up (DeviceFatal) at `deadline`.
    fn call_until(&mut self, cmd: Command, deadline: Instant) -> VerbsResult<ReplyData> {
        self.exchange(cmd, None, Some(deadline))
    }
    /// Whether the device is still there.
    fn alive(&self) -> bool;
    /// Lets the device make progress in the calling thread, if this channel can (an
    /// in-process worker the caller may run: run-to-completion); true if it did work. The
    /// client calls it when a poll finds nothing, before it gives up its CPU.
    fn progress(&mut self) -> bool {
        false
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
    /// addresses, keeping their contents ([`crate::app::shadow`]), while any registration in any
    /// context of the process lies within them; when the last one is deregistered they become
    /// private anonymous memory again. Memory that cannot move (read-only file mappings,
    /// shared, hugetlbfs, the stack, pages moved for a registered range that does not contain
    /// this one) is refused with `InvalidArgument` saying why; a program's static buffers
    /// (.data, .bss: private writable file mappings) move like malloc'd memory.
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
    /// The checks `post_send` makes of a WR (the QP's state, the WR against the QP's type
    /// and capabilities; `inline_len`: the length of inline data given apart from the
    /// SGEs), without posting it: a batch whose every WR passes, and that fits, is posted
    /// whole (`ibv_wr_complete`).
    fn check_send(
        &mut self,
        qpn: Qpn,
        wr: &SendWr<'_>,
        inline_len: Option<usize>,
    ) -> VerbsResult<()>;
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
