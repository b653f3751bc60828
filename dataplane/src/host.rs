//! The worker's side of the host interface: [`HostEnd`] is the worker's end of one client,
//! the only place that reads what an application wrote into shared memory (post slots are
//! copied out and decoded with every field checked, [`ferroce_host::abi::slots`]), and the
//! client's ledger: the objects it created, the memory it mapped and what is charged against
//! its limits. [`Owners`] routes queue positions, completions and events to the client that
//! created each object.
//!
//! A host end never touches the engine: it hands decoded posts and calls to the RNIC
//! (`nic::serve`), which applies them to its `Device` (the device's one driver) and records
//! the outcome here. The shared layout is [`ferroce_host::abi`]; the application's side is
//! [`ferroce_host::app`] (whose `Client` an in-process [`crate::Context`] is, with its
//! [`crate::local::LocalChannel`]). Memory is named per client: another client's area ids
//! mean nothing in its table.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ferroce_host::abi::area::Area;
use ferroce_host::abi::ring::{ring, Consumer, Producer};
pub use ferroce_host::abi::slots::PostError;
use ferroce_host::abi::slots::{next_post, CqeSlot, EventSlot, PostBuf, PostCell};
use ferroce_host::abi::{
    ClientLimits, CmEventData, HostCounters, HostLimits, CONTEXT_FATAL, EVENT_RING, POST_RING,
    QP_INDEX_BYTES,
};
use ferroce_host::app::ClientRings;
use roce::engine::{CqId, SrqId, VerbsError, VerbsResult};
use roce::memory::PdId;
use roce::table::Table;
use roce::types::{Lkey, Qpn, Rkey};
use roce::verbs::{AsyncEvent, Completion};

static TOKENS: AtomicU64 = AtomicU64::new(1);

/// Makes a client's rings (named after `who`) and the worker's end attached to them; returns
/// the rings (to attach a client to) and the host end.
pub fn host_end(
    limits: HostLimits,
    client_limits: ClientLimits,
    who: &str,
) -> std::io::Result<(ClientRings, HostEnd)> {
    let (posts, _, post_c) = ring::<PostCell>(POST_RING, &format!("{who}-posts"))?;
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

/// Which host interface owns each QP (by slot), CQ and SRQ of a device, so the worker routes
/// queue positions, completions and events to the application that created the object.
#[derive(Debug, Clone)]
pub struct Owners {
    pub(crate) qp: Vec<u16>,
    pub(crate) cq: Vec<u16>,
    pub(crate) srq: Vec<u16>,
    /// rdma_cm connections by communication ID, and listened service IDs.
    pub(crate) cm_conns: HashMap<u32, u16>,
    pub(crate) cm_listeners: HashMap<u64, u16>,
    /// On an RNIC over several workers: the services listened to on any of them, by worker
    /// (shared by the workers; the port's owner steers REQs by it), and this one's index.
    pub(crate) services: Option<(ServiceMap, u32)>,
    /// QP slots released since the RNIC last looked ([`Owners::release_qp`]), for it to drop
    /// what it keeps per slot (header templates).
    pub(crate) freed_qp_slots: Vec<usize>,
}

/// Listened service IDs and the worker whose client listens, shared by an RNIC's workers
/// (`worker.count`). Taken by a listen or unlisten and, on the port's owner, by a received
/// REQ or SIDR_REQ: never by a data packet.
pub type ServiceMap = std::sync::Arc<std::sync::Mutex<HashMap<u64, u32>>>;

/// No owner.
pub(crate) const NOBODY: u16 = u16::MAX;
/// How many clients one RNIC can number (every u16 but `NOBODY`).
pub const MAX_HOST_IDS: usize = NOBODY as usize;

impl Owners {
    /// Empty tables for a device with `limits`.
    pub fn new(limits: HostLimits) -> Owners {
        Owners {
            qp: vec![NOBODY; limits.max_qp as usize],
            cq: vec![NOBODY; limits.max_cq as usize],
            srq: vec![NOBODY; limits.max_srq as usize],
            cm_conns: HashMap::new(),
            cm_listeners: HashMap::new(),
            services: None,
            freed_qp_slots: Vec::new(),
        }
    }

    /// The QP in `slot` is gone: nobody owns the slot, and the RNIC is told to forget what
    /// it kept for it.
    pub(crate) fn release_qp(&mut self, slot: usize) {
        Owners::set(&mut self.qp, slot, NOBODY);
        self.freed_qp_slots.push(slot);
    }

    /// Records that client `host` listens to `sid`; false (nothing recorded) if a client on
    /// another worker of the RNIC does already: one listener per service per RNIC, as on a
    /// device with one connection manager.
    pub(crate) fn add_listener(&mut self, sid: u64, host: u16) -> bool {
        if let Some((map, me)) = &self.services {
            let mut m = map.lock().unwrap_or_else(|e| e.into_inner());
            if m.get(&sid).is_some_and(|w| w != me) {
                return false;
            }
            m.insert(sid, *me);
        }
        self.cm_listeners.insert(sid, host);
        true
    }

    /// Forgets the listener of `sid`.
    pub(crate) fn remove_listener(&mut self, sid: u64) {
        self.cm_listeners.remove(&sid);
        if let Some((map, me)) = &self.services {
            let mut m = map.lock().unwrap_or_else(|e| e.into_inner());
            if m.get(&sid) == Some(me) {
                m.remove(&sid);
            }
        }
    }

    pub(crate) fn set(table: &mut [u16], i: usize, host: u16) {
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
pub(crate) enum QueueKind {
    Qp,
    Srq,
    Cq,
}

/// Faults a just-registered MR's pages in ([`Area::populate`], as an RNIC pins memory at
/// registration) on a helper thread, not the worker's: a client registering large regions in
/// a loop would otherwise pause every RNIC on the worker for the page faults. The worker does
/// not wait: an RDMA that comes first takes its page faults as before. At most 1024 requests
/// wait; more are dropped (the memory is then faulted in as it is used).
pub(crate) fn populate_later(mem: &Arc<Area>, off: usize, len: usize) {
    type Job = (Arc<Area>, usize, usize);
    static JOBS: OnceLock<Option<std::sync::mpsc::SyncSender<Job>>> = OnceLock::new();
    let tx = JOBS.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::sync_channel::<Job>(1024);
        std::thread::Builder::new()
            .name("ferroce-populate".into())
            .spawn(move || {
                for (mem, off, len) in rx {
                    mem.populate(off, len);
                }
            })
            .ok()
            .map(|_| tx)
    });
    if let Some(tx) = tx {
        let _ = tx.try_send((mem.clone(), off, len));
    }
}

/// Everything a closing client held, in the order the RNIC releases it
/// ([`HostEnd::release_all`]).
#[derive(Debug, Default)]
pub struct Released {
    /// QPs.
    pub qps: Vec<Qpn>,
    /// SRQs.
    pub srqs: Vec<SrqId>,
    /// CQs.
    pub cqs: Vec<CqId>,
    /// Memory windows.
    pub mws: Vec<Rkey>,
    /// MRs (their lkeys).
    pub mrs: Vec<Lkey>,
    /// PDs.
    pub pds: Vec<PdId>,
    /// rdma_cm connections.
    pub cm_ids: Vec<u32>,
    /// rdma_cm listened service IDs.
    pub cm_listens: Vec<u64>,
}

/// rdma_cm events waiting for a client, at most (past it a connect request is rejected and
/// other events are counted as dropped).
pub const MAX_CM_EVENTS: usize = 1024;
/// Service IDs one client may listen to.
pub const MAX_CM_LISTENS: usize = 64;

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
    posts: Consumer<PostCell>,
    events: Producer<EventSlot>,
    /// CQ rings by CQ id; `true` while the CQ has completions the ring had no room for.
    /// Its CQs' rings by CQ id (a mirror of the device's ids), with whether completions wait.
    pub(crate) cqs: Table<(Producer<CqeSlot>, bool)>,
    pub(crate) pending_cqs: Vec<CqId>,
    index: Arc<Area>,
    pub(crate) limits: HostLimits,
    pub(crate) client_limits: ClientLimits,
    pub(crate) areas: HashMap<u32, Arc<Area>>,
    /// Areas the client forgot that MRs still keep mapped (still counted).
    pub(crate) retired: Vec<Arc<Area>>,
    /// Bytes of the client's areas and CQ rings mapped on the worker.
    pub(crate) area_bytes: u64,
    /// Bytes of queue memory the engine holds for the client's QPs, SRQs and CQs.
    pub(crate) queue_bytes: u64,
    /// What each of those objects was charged, by kind and id.
    pub(crate) queue_charges: HashMap<(QueueKind, u32), u64>,
    pub(crate) qps: Vec<Qpn>,
    pub(crate) srqs: Vec<SrqId>,
    pub(crate) mrs: Vec<Lkey>,
    /// Memory windows, by their key at allocation (the index names them).
    pub(crate) mws: Vec<Rkey>,
    pub(crate) pds: Vec<PdId>,
    /// rdma_cm connections and listens the client made, and its events waiting.
    pub(crate) cm_ids: Vec<u32>,
    pub(crate) cm_listens: Vec<u64>,
    pub(crate) cm_events: VecDeque<CmEventData>,
    scratch: Vec<Completion>,
    /// Counters.
    pub counters: HostCounters,
    closed: bool,
    /// Its place in a context spread over several workers (`worker.spread`; None: the
    /// context is on this worker alone).
    pub(crate) spread: Option<Spread>,
}

/// What a QP on another worker uses of its context's objects (kept by the context's home,
/// which must not destroy them under it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QpUses {
    pub pd: PdId,
    pub send_cq: CqId,
    pub recv_cq: CqId,
    pub srq: Option<SrqId>,
}

/// Events a satellite keeps for its home at most (past it they are counted as dropped, as
/// with a full event ring).
pub(crate) const MAX_RELAYED_EVENTS: usize = 1024;

/// A host end's role in a context spread over the workers of its RNIC (docs/
/// ARCHITECTURE.md, "One context over several workers").
#[derive(Debug)]
pub(crate) enum Spread {
    /// The context's home, which holds its rings: every control call and post reaches the
    /// RNIC here, and the other workers' completions and events come back here.
    Home {
        /// The context's QPs on other workers and what each uses.
        remote: HashMap<Qpn, QpUses>,
        /// What the QPs being created on other workers (not answered yet) will use.
        creating: Vec<QpUses>,
        /// How many QPs the context created (the next goes to worker `made mod count`).
        made: u32,
    },
    /// The replica on another worker: the context's PDs, MRs (under the same keys) and CQs
    /// (whose completions go home), and the QPs placed here.
    /// It has its home's host id.
    Satellite {
        /// Events for the home, not yet sent.
        events: Vec<AsyncEvent>,
    },
}

impl HostEnd {
    /// A host end over the worker's ends of a client's rings.
    pub fn new(
        posts: Consumer<PostCell>,
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
            cqs: Table::new(limits.max_cq as usize),
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
            cm_ids: Vec::new(),
            cm_listens: Vec::new(),
            cm_events: VecDeque::new(),
            scratch: Vec::with_capacity(64),
            counters: HostCounters::default(),
            closed: false,
            spread: None,
        }
    }

    /// The replica of this (home) client for another worker of its RNIC: the same token,
    /// owner and limits, the home's index area (where the satellite publishes its QPs'
    /// queue positions: each QP's words have one writer), and rings of its own that nothing
    /// uses (its posts come from the home, its events go there).
    pub(crate) fn satellite(&self) -> std::io::Result<HostEnd> {
        let (_, _, posts) = ring::<PostCell>(1, "ferroce-satellite-posts")?;
        let (_, events, _) = ring::<EventSlot>(1, "ferroce-satellite-events")?;
        let mut h = HostEnd::new(
            posts,
            events,
            self.index.clone(),
            self.limits,
            self.client_limits,
        );
        h.token = self.token;
        // Attached under its home's id on every worker.
        h.id = self.id;
        h.label = self.label.clone();
        h.pid = self.pid;
        h.uid = self.uid;
        h.comm = self.comm.clone();
        h.spread = Some(Spread::Satellite { events: Vec::new() });
        Ok(h)
    }

    /// The home's id on the first worker, for a satellite.
    pub(crate) fn satellite_of(&self) -> Option<u16> {
        matches!(self.spread, Some(Spread::Satellite { .. })).then_some(self.id)
    }

    /// The context's QPs on other workers (a home; empty otherwise).
    pub(crate) fn remote_qps(&self) -> Option<&HashMap<Qpn, QpUses>> {
        match &self.spread {
            Some(Spread::Home { remote, .. }) => Some(remote),
            _ => None,
        }
    }

    /// Before the worker sleeps: arms the post ring so the client's next post wakes it, adds
    /// the word to wait on to `out`, and says whether posts are already waiting (then the
    /// worker must not sleep).
    pub fn prepare_sleep(&self, out: &mut Vec<ferroce_host::abi::ring::WaitWord>) -> bool {
        if self.closed {
            return false;
        }
        out.push(self.posts.prepare_wait());
        !self.posts.is_empty()
    }

    /// Whether posts wait in the client's ring.
    pub(crate) fn has_posts(&self) -> bool {
        !self.closed && !self.posts.is_empty()
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
            cqs: self.cqs.iter().map(|(i, _)| CqId(i as u32)).collect(),
            qps: self.qps.clone(),
            srqs: self.srqs.clone(),
            area_bytes: self.area_bytes,
        }
    }

    /// Takes the client's next post out of its ring and decodes it into `buf`, with every
    /// field checked: each cell is copied out of shared memory before it is read. `None`
    /// once the ring is empty (or the client is closed); `Some(Err)` for a post that breaks
    /// the protocol (a head that does not check, fewer cells published than it calls for),
    /// or for producer indices that claim more than the ring holds (a corrupted or hostile
    /// client).
    pub fn next_post(&mut self, buf: &mut PostBuf) -> Option<Result<(), PostError>> {
        if self.closed {
            return None;
        }
        next_post(&mut self.posts, buf)
    }

    /// Stops counting retired areas once no MR holds them any more (they are unmapped).
    pub(crate) fn reap_areas(&mut self) {
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
    pub(crate) fn area_count(&self) -> usize {
        self.areas.len() + self.retired.len() + self.cqs.len()
    }

    /// Refuses one more mapping past `host.max_areas`.
    pub(crate) fn check_area_count(&self) -> VerbsResult<()> {
        if self.area_count() >= self.client_limits.max_areas as usize {
            return Err(VerbsError::NoResources("memory areas (host.max_areas)"));
        }
        Ok(())
    }

    /// Refuses `bytes` more of queue memory past `host.max_queue_bytes` (checked before the
    /// engine allocates anything).
    pub(crate) fn check_queue(&self, bytes: u64) -> VerbsResult<()> {
        if self.queue_bytes.saturating_add(bytes) > self.client_limits.max_queue_bytes {
            return Err(VerbsError::NoResources(
                "queue memory (host.max_queue_bytes)",
            ));
        }
        Ok(())
    }

    pub(crate) fn charge_queue(&mut self, kind: QueueKind, id: u32, bytes: u64) {
        self.queue_bytes += bytes;
        self.queue_charges.insert((kind, id), bytes);
    }

    pub(crate) fn uncharge_queue(&mut self, kind: QueueKind, id: u32) {
        if let Some(b) = self.queue_charges.remove(&(kind, id)) {
            self.queue_bytes -= b;
        }
    }

    /// Bytes of queue memory charged to the client.
    pub fn queue_bytes(&self) -> u64 {
        self.queue_bytes
    }

    /// Counts `bytes` more of shared memory against the client's limit.
    pub(crate) fn charge(&mut self, bytes: u64) -> VerbsResult<()> {
        if self.area_bytes.saturating_add(bytes) > self.client_limits.max_area_bytes {
            return Err(VerbsError::NoResources(
                "shared memory (host.max_area_bytes)",
            ));
        }
        self.area_bytes += bytes;
        Ok(())
    }

    /// Refuses one more MR or memory window past `host.max_mrs` (they share the key space).
    pub(crate) fn check_mr_room(&self) -> VerbsResult<()> {
        if (self.mrs.len() + self.mws.len()) as u32 >= self.client_limits.max_mrs {
            return Err(VerbsError::NoResources("memory regions (host.max_mrs)"));
        }
        Ok(())
    }

    /// The client's area `id`.
    pub(crate) fn area(&self, id: u32) -> VerbsResult<Arc<Area>> {
        self.areas
            .get(&id)
            .cloned()
            .ok_or(VerbsError::NotFound("memory area"))
    }

    /// Objects are named by small numbers another application could guess: a client may
    /// only use the ones it created.
    pub(crate) fn check_owned(&self, owned: bool, what: &'static str) -> VerbsResult<()> {
        if owned {
            Ok(())
        } else {
            Err(VerbsError::NotFound(what))
        }
    }

    pub(crate) fn owns_cq(&self, cq: CqId) -> bool {
        self.cqs.contains(cq.0 as usize)
    }

    /// Marks the client closed and hands back everything it created, for the RNIC to
    /// release in this order (as the kernel does for a process that exits without cleaning
    /// up): QPs (they stop touching memory), SRQs, CQs, windows (a bound window holds its MR),
    /// MRs (they hold the areas mapped), PDs. The client's accounting is cleared.
    pub fn release_all(&mut self) -> Released {
        let mut cqs = Vec::new();
        self.cqs.retain(|i, _| {
            cqs.push(CqId(i as u32));
            false
        });
        self.pending_cqs.clear();
        self.cm_events.clear();
        self.areas.clear();
        self.retired.clear();
        self.area_bytes = 0;
        self.queue_charges.clear();
        self.queue_bytes = 0;
        self.closed = true;
        Released {
            qps: std::mem::take(&mut self.qps),
            srqs: std::mem::take(&mut self.srqs),
            cqs,
            mws: std::mem::take(&mut self.mws),
            mrs: std::mem::take(&mut self.mrs),
            pds: std::mem::take(&mut self.pds),
            cm_ids: std::mem::take(&mut self.cm_ids),
            cm_listens: std::mem::take(&mut self.cm_listens),
        }
    }

    /// Publishes the queue positions (WQEs retired from the send and receive queues) of the
    /// QP in `slot` in the index area, where the application reads its free room.
    pub fn publish_qp_positions(&self, slot: usize, positions: (u64, u64)) {
        for (queue, pos) in [positions.0, positions.1].into_iter().enumerate() {
            if let Ok(a) = self.index.atomic_u64(slot * QP_INDEX_BYTES + 8 * queue) {
                a.store(pos, Ordering::Release);
            }
        }
    }

    /// Starts a new SRQ's position at 0 (a plain store: its id may be a destroyed SRQ's,
    /// whose position was further on).
    pub fn reset_srq_position(&self, srq: SrqId) {
        if let Some(a) = self.srq_position_word(srq) {
            a.store(0, Ordering::Release);
        }
    }

    /// Publishes how many WQEs an SRQ has handed out.
    pub fn publish_srq_position(&self, srq: SrqId, pos: u64) {
        if let Some(a) = self.srq_position_word(srq) {
            // The position only grows; several workers publish a spread context's SRQ
            // (`SpreadSrq`), and one that read it earlier must not store it back smaller.
            a.fetch_max(pos, Ordering::AcqRel);
        }
    }

    /// The index area's word holding SRQ `srq`'s position.
    fn srq_position_word(&self, srq: SrqId) -> Option<&AtomicU64> {
        self.index
            .atomic_u64(self.limits.srq_index_off(srq.0 as usize))
            .ok()
    }

    /// Fills the application's ring of CQ `cq` with what `poll` takes from the engine's CQ,
    /// while the ring has room, and wakes a waiting application (solicited or error
    /// completions wake a solicited-only wait). Returns how many moved; 0 for a CQ that is
    /// not this client's.
    pub fn fill_cq_ring(
        &mut self,
        cq: CqId,
        mut poll: impl FnMut(&mut [Completion]) -> usize,
    ) -> usize {
        let Some((ring, _)) = self.cqs.get_mut(cq.0 as usize) else {
            return 0;
        };
        let mut moved = 0;
        let mut solicited = false;
        loop {
            // The client writes the ring's HEAD: the room is read once, and staging checks
            // against that same reading, so every completion taken from the engine below
            // has its slot whatever the client does to HEAD meanwhile.
            let room = ring.room_left();
            if room == 0 {
                break;
            }
            self.scratch.resize(room.min(64), Completion::default());
            let n = poll(&mut self.scratch);
            // Staged and published together: one release store of the producer index per
            // batch, not per completion.
            for c in &self.scratch[..n] {
                // Cannot fail: `stage` checks against the HEAD `room_left` read, with at
                // most `room` entries staged.
                let _ = ring.stage(&CqeSlot::encode(c));
                solicited |= c.solicited || c.status != roce::verbs::WcStatus::Success;
            }
            ring.publish();
            moved += n;
            if n < self.scratch.len() {
                break;
            }
        }
        if moved > 0 {
            ring.notify(solicited);
        }
        moved
    }

    /// Records whether CQ `cq` still has completions its ring had no room for (they are
    /// retried from [`HostEnd::pending_cq`]).
    pub fn set_cq_pending(&mut self, cq: CqId, left: bool) {
        let Some((_, pending)) = self.cqs.get_mut(cq.0 as usize) else {
            return;
        };
        if left != *pending {
            *pending = left;
            if left {
                self.pending_cqs.push(cq);
            } else {
                self.pending_cqs.retain(|c| *c != cq);
            }
        }
    }

    /// The `i`th of the CQs whose completions wait for room in their ring.
    pub fn pending_cq(&self, i: usize) -> Option<CqId> {
        self.pending_cqs.get(i).copied()
    }

    /// How many CQs have completions waiting for room in their ring.
    pub fn pending_cq_count(&self) -> usize {
        self.pending_cqs.len()
    }

    /// Queues an asynchronous event for the application; counted if its ring is full.
    pub fn deliver_event(&mut self, ev: &AsyncEvent) -> bool {
        if let Some(Spread::Satellite { events, .. }) = &mut self.spread {
            // The home delivers it (`Nic::serve_spread`).
            if events.len() >= MAX_RELAYED_EVENTS {
                self.counters.events_dropped += 1;
                return false;
            }
            events.push(*ev);
            return true;
        }
        if *ev == AsyncEvent::DeviceFatal {
            // Also where the application's post path looks (the event may wait unread, or
            // be dropped from a full ring).
            if let Ok(a) = self.index.atomic_u64(self.limits.state_off()) {
                a.store(CONTEXT_FATAL, Ordering::Release);
            }
        }
        if self.events.push(&EventSlot::encode(ev)) {
            true
        } else {
            self.counters.events_dropped += 1;
            false
        }
    }
}
