//! [`Client`]: the application's end of one context, [`Verbs`] over a [`Channel`] and the
//! context's rings.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use roce::engine::{
    qp_slot, CqId, DeviceAttr, QpInit, SrqAttr, SrqId, VerbsError, VerbsResult, MAX_INLINE,
};
use roce::memory::PdId;
use roce::table::Table;
use roce::types::{Gid, Qpn, Rkey};
use roce::verbs::{
    Access, AsyncEvent, Completion, QpAttr, QpCaps, QpInfo, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge,
};

use super::{Buffer, BufferInner, Channel, Mr, Released, Verbs};
use crate::abi::area::Area;
use crate::abi::ring::{ring, Consumer, Producer};
use crate::abi::slots::{post_kind, CqeSlot, EventSlot, PostCell, PostCells, MAX_HOST_SGE};
use crate::abi::{
    counter_names, Command, HostLimits, PortAttrData, ReplyData, Translation, CONTEXT_FATAL,
    EVENT_RING, POST_RING, QP_INDEX_BYTES,
};

struct QpLocal {
    qpn: Qpn,
    caps: QpCaps,
    qp_type: QpType,
    state: QpState,
    srq: bool,
    sq_posted: u64,
    rq_posted: u64,
}

/// A CQ of this client: its ring and the notification sequence when it was last armed.
struct CqLocal {
    ring: Consumer<CqeSlot>,
    seen: u32,
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
    posts: Producer<PostCell>,
    events: Consumer<EventSlot>,
    index: Arc<Area>,
    limits: HostLimits,
    /// CQ rings by CQ id (a mirror of the device's ids).
    cqs: Table<CqLocal>,
    /// QPs by slot (`qp_slot`).
    qps: Table<QpLocal>,
    /// SRQs by id.
    srqs: Table<SrqLocal>,
    /// This client's buffers and moved ranges by address (for inline data), with their area
    /// ids.
    buffers: BTreeMap<u64, (Weak<Area>, u32)>,
    /// Moved ranges ([`crate::app::shadow`]) this context registers within, by the address of
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
    /// Inside [`Client::batch`]: posts are staged, published together at its end.
    batching: bool,
}

/// A moved range of application pages ([`crate::app::shadow`]) as one context uses it: added to
/// the worker as an area while the context has MRs within it.
struct Shadow {
    area: Arc<Area>,
    /// The area's id on the worker.
    id: u32,
    /// This context's live MRs in it (each also one user of the process-wide move).
    mrs: u32,
}

/// The word the worker published at `off` of the index area (WQEs retired, or the
/// context's state); 0 past its end.
fn published(index: &Area, off: usize) -> u64 {
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
            cqs: Table::new(limits.max_cq as usize),
            qps: Table::new(limits.max_qp as usize),
            srqs: Table::new(limits.max_srq as usize),
            buffers: BTreeMap::new(),
            shadows: HashMap::new(),
            shadow_mrs: BTreeMap::new(),
            next_area: 1,
            released: Arc::new(Mutex::new(Vec::new())),
            fatal_reported: false,
            closed: false,
            empty_polls: 0,
            batching: false,
        }
    }

    /// This process's mapping of the context's post ring (the memory the worker reads posts
    /// from; the worker treats every byte of it as untrusted). For tools and tests that look
    /// at, or deliberately damage, what the client publishes; the mapping stays while the
    /// `Arc` is held.
    pub fn post_ring(&self) -> &Arc<Area> {
        self.posts.area()
    }

    /// Whether the context is usable: its channel is up and the worker has not declared it
    /// device-fatal in the index area's state word.
    fn alive(&self) -> bool {
        self.chan.alive() && published(&self.index, self.limits.state_off()) != CONTEXT_FATAL
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

    /// Puts a post's cells into the post ring, waiting while it has no room for them, and
    /// publishes them at once (the worker never sees part of a post) - or, inside
    /// [`Client::batch`], with the batch's other posts at its end.
    fn push(&mut self, post: &PostCells<'_>) -> VerbsResult<()> {
        let mut spins = 0u32;
        while !self.posts.room(post.cells()) {
            // What is staged goes first: the worker makes the room by taking it.
            self.publish_posts();
            if !self.alive() {
                return Err(VerbsError::DeviceFatal);
            }
            spins += 1;
            backoff(spins);
        }
        let posts = &mut self.posts;
        post.write(|c| {
            let staged = posts.stage(c);
            debug_assert!(staged, "room was checked");
        });
        if !self.batching {
            self.publish_posts();
        }
        Ok(())
    }

    /// Publishes the staged posts (one store of the ring's producer index) and, if the
    /// worker went to sleep and armed the ring, wakes it (otherwise one fence and one load).
    fn publish_posts(&mut self) {
        self.posts.publish();
        self.posts.notify(true);
    }

    /// Runs `f` (which posts) with the posts it makes published together when it returns:
    /// one ring doorbell for a list of work requests, as `ibv_post_send` with chained WRs
    /// rings one. A post that fails inside does not undo the ones before it (verbs' `bad_wr`
    /// semantics: those are posted).
    pub fn batch<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        let outer = std::mem::replace(&mut self.batching, true);
        let r = f(self);
        self.batching = outer;
        if !outer {
            self.publish_posts();
        }
        r
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

    /// Pops up to `max` completions of `cq`, handing each to `f` with its index as the
    /// ring's slot, checked ([`CqeSlot::sanitized`]) and otherwise as the worker wrote it:
    /// the C libraries fill `ibv_wc` / `ferroce_wc` straight from it, with no intermediate
    /// form (as liburing hands out the ring's CQE). [`Verbs::poll_cq`] decodes the same
    /// slots into [`Completion`]s.
    pub fn poll_cq_slots(
        &mut self,
        cq: CqId,
        max: usize,
        mut f: impl FnMut(usize, &CqeSlot),
    ) -> VerbsResult<usize> {
        let ring = &mut self
            .cqs
            .get_mut(cq.0 as usize)
            .ok_or(VerbsError::NotFound("completion queue"))?
            .ring;
        let mut n = ring.pop_each(max, |i, slot| f(i, &slot.sanitized()));
        if n == 0 && self.chan.progress() {
            // This thread ran the RNIC (in process): what it completed is there now.
            let ring = &mut self
                .cqs
                .get_mut(cq.0 as usize)
                .expect("looked up above")
                .ring;
            n = ring.pop_each(max, |i, slot| f(i, &slot.sanitized()));
            if n == 0 {
                // It did work, so it was not idle: no reason to give up the CPU yet.
                self.empty_polls = 0;
                return Ok(0);
            }
        }
        if n == 0 {
            if !self.alive() {
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
        let c = self
            .cqs
            .get_mut(cq.0 as usize)
            .ok_or(VerbsError::NotFound("completion queue"))?;
        c.seen = c.ring.notify_seq();
        c.ring.arm(solicited_only);
        Ok(())
    }

    /// One more MR of this context within the moved range holding `[addr, addr + len)` (made
    /// now if there is none): its `shadows` key, this context's area id for it, its start.
    ///
    /// # Safety
    /// As [`Verbs::reg_mr_addr`].
    unsafe fn use_shadow(&mut self, addr: u64, len: usize) -> VerbsResult<(usize, u32, u64)> {
        let (start, end) = crate::app::shadow::page_range(addr, len).ok_or_else(|| {
            VerbsError::InvalidArgument(format!("no memory at {addr:#x} (+{len})"))
        })?;
        // The process-wide move containing the range (made now if there is none): one more
        // user of it.
        // SAFETY: the caller guarantees no other thread writes the range now.
        let (base, area) = unsafe { crate::app::shadow::acquire(start, end) }
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
                    unsafe { crate::app::shadow::release(&area) };
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
        unsafe { crate::app::shadow::release(&area) };
    }

    /// A handle that waits for `cq`'s notifications from another thread (a completion
    /// channel), independent of this client's borrow.
    pub fn cq_notifier(&self, cq: CqId) -> Option<CqNotifier> {
        self.cqs.get(cq.0 as usize).map(|c| CqNotifier {
            ring: Consumer::attach(c.ring.area().clone(), 1),
            armed_at: c.seen,
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
                unsafe { crate::app::shadow::release(&sh.area) };
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

    /// The checks of a send WR on `qpn` that need no queue room (the QP's state, and the
    /// engine's own checks, made here so a bad WR is refused at once, rdma-core's EINVAL with
    /// bad_wr, instead of taking a place in the send queue); the QP's capabilities and its
    /// count of posted WRs, for the post that follows.
    fn checked_qp(
        &mut self,
        qpn: Qpn,
        wr: &SendWr<'_>,
        inline_len: Option<usize>,
    ) -> VerbsResult<(QpCaps, u64)> {
        let port_mtu = self.limits.port_mtu;
        let q = self.qp_mut(qpn)?;
        if matches!(q.state, QpState::Reset | QpState::Init | QpState::Rtr) {
            return Err(VerbsError::InvalidState(q.state));
        }
        roce::engine::check_send(q.qp_type, &q.caps, port_mtu, wr, inline_len)?;
        Ok((q.caps, q.sq_posted))
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
        let (caps, sq_posted) = self.checked_qp(qpn, wr, inline.map(|d| d.len()))?;
        let sq_retired = published(&self.index, slot * QP_INDEX_BYTES);
        if sq_posted.wrapping_sub(sq_retired) >= caps.max_send_wr as u64 {
            return Err(VerbsError::QueueFull);
        }
        let is_inline = wr.flags.contains(SendFlags::INLINE) && !wr.op.is_read_or_atomic();
        if is_inline {
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
            PostCells::send(qpn, &bare, Some(data))
                .map_err(|e| VerbsError::InvalidArgument(e.to_string()))
                .and_then(|p| self.push(&p))?;
        } else {
            if inline.is_some() {
                return Err(VerbsError::InvalidArgument(
                    "inline data needs the INLINE flag on a SEND or WRITE".into(),
                ));
            }
            let p = PostCells::send(qpn, wr, None)
                .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
            self.push(&p)?;
        }
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
        // have to map it too: moved pages, `crate::app::shadow`).
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
        // A new ring's notification sequence starts at 0; the id may have named an earlier
        // CQ (ids are reused), and a waiter must not take that one's for a notification of
        // this one.
        let seen = cons.notify_seq();
        match self
            .cqs
            .insert_at(cq.0 as usize, CqLocal { ring: cons, seen })
        {
            Ok(_) => Ok(cq),
            Err(_) => {
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
        self.cqs.remove(cq.0 as usize);
        Ok(())
    }

    #[inline]
    fn poll_cq(&mut self, cq: CqId, out: &mut [Completion]) -> VerbsResult<usize> {
        self.poll_cq_slots(cq, out.len(), |i, s| out[i] = s.completion())
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
        let local = QpLocal {
            qpn,
            caps,
            qp_type: init.qp_type,
            state: QpState::Reset,
            srq: init.srq.is_some(),
            sq_posted: 0,
            rq_posted: 0,
        };
        if self.qps.insert_at(slot as usize, local).is_err() {
            let _ = self.call(Command::DestroyQp { qpn });
            return Err(VerbsError::NoResources("queue pairs"));
        }
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
        if let Some(slot) = qp_slot(qpn, self.limits.max_qp) {
            self.qps.remove(slot);
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

    fn check_send(
        &mut self,
        qpn: Qpn,
        wr: &SendWr<'_>,
        inline_len: Option<usize>,
    ) -> VerbsResult<()> {
        self.checked_qp(qpn, wr, inline_len).map(|_| ())
    }

    fn sq_room(&mut self, qpn: Qpn) -> VerbsResult<u32> {
        let slot = qp_slot(qpn, self.limits.max_qp).unwrap_or(usize::MAX);
        let q = self.qp_mut(qpn)?;
        let (cap, posted) = (q.caps.max_send_wr as u64, q.sq_posted);
        let used = posted.wrapping_sub(published(&self.index, slot * QP_INDEX_BYTES));
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
        let rq_retired = published(&index, slot * QP_INDEX_BYTES + 8);
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
        let p = PostCells::recv(post_kind::RECV, qpn.value(), wr.wr_id, wr.sg_list)
            .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        self.push(&p)?;
        if let Ok(q) = self.qp_mut(qpn) {
            q.rq_posted += 1;
        }
        Ok(())
    }

    fn create_srq(&mut self, pd: PdId, attr: &SrqAttr) -> VerbsResult<SrqId> {
        let s = expect_reply!(self.call(Command::CreateSrq { pd, attr: *attr }), ReplyData::Srq(s) => s)?;
        let local = SrqLocal {
            max_wr: attr.max_wr,
            max_sge: attr.max_sge,
            posted: 0,
        };
        match self.srqs.insert_at(s.0 as usize, local) {
            Ok(_) => Ok(s),
            Err(_) => {
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
        self.srqs.remove(srq.0 as usize);
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
        if s.posted.wrapping_sub(published(&index, off)) >= s.max_wr as u64 {
            return Err(VerbsError::QueueFull);
        }
        let p = PostCells::recv(post_kind::SRQ_RECV, srq.0, wr.wr_id, wr.sg_list)
            .map_err(|e| VerbsError::InvalidArgument(e.to_string()))?;
        self.push(&p)?;
        if let Some(s) = self.srqs.get_mut(srq.0 as usize) {
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
        let c = self
            .cqs
            .get(cq.0 as usize)
            .ok_or(VerbsError::NotFound("completion queue"))?;
        let (ring, seen) = (&c.ring, c.seen);
        // Wait in slices, so a device that goes away ends the wait.
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if !self.alive() {
                return Err(VerbsError::DeviceFatal);
            }
            let slice = match deadline {
                Some(d) => d
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100)),
                None => Duration::from_millis(100),
            };
            if ring.wait_notify(seen, Some(slice)) {
                let now_seq = ring.notify_seq();
                if let Some(c) = self.cqs.get_mut(cq.0 as usize) {
                    c.seen = now_seq;
                }
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

mod cm;
pub use cm::{CmQpPath, RdmaCm};
