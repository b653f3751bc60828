//! The worker's side of the host interface: [`HostEnd`] is the worker's end of one client
//! (the only place that reads what an application wrote into shared memory: post slots are
//! copied out and decoded with every field checked, [`ferroce_host::abi::slots`]), [`Owners`]
//! routes queue positions, completions and events to the client that created each object, and
//! the in-process [`crate::local::LocalChannel`] is in `local`.
//!
//! The shared layout is [`ferroce_host::abi`]; the application's side is
//! [`ferroce_host::app`] (whose `Client` an in-process [`crate::Context`] is). Control calls are
//! executed in `HostEnd::execute` after the posts already in the ring, so program order
//! holds. Memory is named per client: another client's area ids mean nothing in its table.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use ferroce_host::abi::area::Area;
use ferroce_host::abi::ring::{ring, ring_bytes, Consumer, Producer};
use ferroce_host::abi::slots::{CqeSlot, EventSlot, Post, PostSlot, MAX_HOST_SGE};
use ferroce_host::abi::{
    ClientLimits, Command, HostCounters, HostLimits, PortAttrData, ReplyData, EVENT_RING,
    POST_RING, QP_INDEX_BYTES,
};
use ferroce_host::app::ClientRings;
use roce::engine::{
    CqId, Device, DeviceAttr, DeviceEvent, PortAttr, SrqId, VerbsError, VerbsResult,
};
use roce::memory::PdId;
use roce::table::Table;
use roce::types::{Lkey, Qpn, Rkey};
use roce::verbs::{AsyncEvent, Completion, QpAttr, QpState, RecvWr, SendWr};

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
/// How many clients one RNIC can number (every u16 but `NOBODY`).
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

/// Faults a just-registered MR's pages in ([`Area::populate`], as an RNIC pins memory at
/// registration) on a helper thread, not the worker's: a client registering large regions in
/// a loop would otherwise pause every RNIC on the worker for the page faults. The worker does
/// not wait: an RDMA that comes first takes its page faults as before. At most 1024 requests
/// wait; more are dropped (the memory is then faulted in as it is used).
fn populate_later(mem: &Arc<Area>, off: usize, len: usize) {
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
    /// Its CQs' rings by CQ id (a mirror of the device's ids), with whether completions wait.
    cqs: Table<(Producer<CqeSlot>, bool)>,
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
            scratch: Vec::with_capacity(64),
            counters: HostCounters::default(),
            closed: false,
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
                        dev.handle_event(DeviceEvent::SendRejected {
                            qpn,
                            wr: &wr.as_wr(),
                        });
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
                        dev.handle_event(DeviceEvent::RecvRejected { qpn, wr_id });
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
        self.areas.len() + self.retired.len() + self.cqs.len()
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
                let (lkey, rkey) = dev.reg_mr(pd, mem.clone(), offset, iova, len, access)?;
                // Registration pins memory on an RNIC; here it faults the pages in.
                populate_later(&mem, offset, len as usize);
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
                let mut area = None;
                let translation = match translation {
                    None => None,
                    Some(t) => {
                        let mem = self
                            .areas
                            .get(&t.area)
                            .cloned()
                            .ok_or(VerbsError::NotFound("memory area"))?;
                        let mem_offset = usize::try_from(t.offset)
                            .map_err(|_| VerbsError::InvalidArgument("offset too large".into()))?;
                        // The new memory is faulted in as at registration.
                        area = Some((mem.clone(), mem_offset, t.len as usize));
                        Some(roce::engine::MrTranslation {
                            mem,
                            mem_offset,
                            addr: t.iova,
                            length: t.len,
                        })
                    }
                };
                let change = roce::engine::MrChange {
                    pd,
                    translation,
                    access,
                };
                let (lkey, rkey) = dev.rereg_mr(lkey, change)?;
                if let Some((mem, off, len)) = area {
                    populate_later(&mem, off, len);
                }
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
                let owned = self.cqs.len() as u32;
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
                let entry = (Producer::attach(ring, capacity as usize), false);
                if self.cqs.insert_at(cq.0 as usize, entry).is_err() {
                    let _ = dev.destroy_cq(cq);
                    self.area_bytes -= ring_len;
                    return Err(VerbsError::NoResources("completion queues"));
                }
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
                if let Some((p, _)) = self.cqs.remove(cq.0 as usize) {
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
        self.cqs.contains(cq.0 as usize)
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
        self.cqs.retain(|i, _| {
            Owners::set(&mut owners.cq, i, NOBODY);
            let _ = dev.destroy_cq(CqId(i as u32));
            false
        });
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
        let Some((ring, pending)) = self.cqs.get_mut(cq.0 as usize) else {
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
