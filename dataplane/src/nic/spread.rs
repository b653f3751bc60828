//! One context over several workers (`worker.spread`; docs/ARCHITECTURE.md, "One context
//! over several workers"): an RNIC spread over n shards (`shard.rs`) whose contexts each
//! place their QPs on every shard in turn, with CQs and SRQs shared by QPs on different
//! shards.
//!
//! Every context is *homed* on the first shard: its rings are there, so every control call
//! and post reaches the RNIC there, and the first shard alone allocates its PD, CQ and SRQ
//! ids and MR keys. Each other shard holds a *satellite* of it: a replica of its PDs, CQs
//! and SRQs under the same ids and of its MRs under the same keys (`Device::alloc_pd_at`,
//! `create_cq_at`, `create_srq_shared`, `reg_mr_at`), so a post's lkeys and a peer's rkeys
//! mean the same on every shard, and the QPs placed there. The home talks to each satellite
//! through one FIFO queue, in program order: the replicas of calls, the calls on the
//! satellite's QPs and the posts to them, so a post is applied after the calls before it
//! and a call after the posts before it. A call the satellites replicate is answered once
//! every shard applied it (an rkey the application hands its peer is valid on every shard
//! from then on); a call on a satellite's QP is answered through the home, which keeps what
//! each remote QP uses (a PD, CQ or SRQ in use on any shard cannot go).
//!
//! A satellite's QPs complete into their CQ's replica, whose completions go home through
//! one queue shared by the satellites, in order: the home queues them on its CQ
//! (`Device::complete_foreign`), whose one ring the application polls. Per-QP order holds
//! because a QP's completions come from one shard through one FIFO (a call's answer after
//! the completions it produced); none is lost (what the queue has no room for waits in
//! order with the satellite) or doubled (each is taken once from the replica). A
//! satellite's QP positions go straight into the home's index area (each QP's words have
//! one writer), its events home through the same queue.
//!
//! An SRQ of a spread context is one bounded lock-free queue of WQEs all shards take from
//! ([`SpreadSrq`]: each WQE taken once, its limit fired once), held by every shard's
//! device under the same id (`Device::create_srq_shared`).
//!
//! rdma_cm works as on one worker: the home's connection manager serves the context's
//! connections whichever worker their QP is on (its messages carry only the QP's number;
//! the client brings the QP up with calls relayed like any).
//!
//! What a spread context refuses (`InvalidArgument`): memory windows and MRs for fast
//! registration (so no work request changes a key on one shard only).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;
use ferroce_host::abi::area::Area;
use ferroce_host::abi::slots::{PostBuf, MAX_HOST_SGE};
use ferroce_host::abi::{Command, ReplyData, POST_RING};
use roce::engine::{CqId, QpnStripe, SharedWqes, VerbsError, VerbsResult};
use roce::types::Qpn;
use roce::verbs::{AsyncEvent, Completion, Sge};

use super::Nic;
use crate::host::{populate_later, HostEnd, Owners, QpUses, Spread};

/// Where a call's result goes.
pub type Reply = std::sync::mpsc::SyncSender<VerbsResult<ReplyData>>;

/// The context a message between the home and a satellite is about: its host id, the same
/// on every shard (a satellite is attached under its home's id), and its token (a host id is
/// reused after a close; tokens never are).
#[derive(Debug, Clone, Copy)]
pub(super) struct Ctx {
    id: u16,
    token: u64,
}

/// From the home (the first shard) to a satellite, in program order.
pub(super) enum ToSatellite {
    /// A context's satellite to attach.
    Attach(Box<HostEnd>),
    /// A post to one of the satellite's QPs.
    Post { ctx: Ctx, post: Box<PostBuf> },
    /// A call on one of its QPs, answered through the home.
    Call {
        ctx: Ctx,
        cmd: Command,
        reply: Reply,
    },
    /// A call the home executed, to replicate (`made`: its result there).
    Replica {
        ctx: Ctx,
        cmd: Command,
        area: Option<Arc<Area>>,
        /// An SRQ's shared WQEs (`CreateSrq`).
        srq: Option<Arc<dyn SharedWqes>>,
        made: ReplyData,
        done: Arc<Gather>,
    },
    /// The context closed.
    Close { ctx: Ctx },
}

/// From a satellite to the home.
pub(super) enum ToHome {
    /// A completion of one of the context's CQs.
    Cqe {
        home: u16,
        token: u64,
        cq: CqId,
        c: Completion,
    },
    /// An asynchronous event of the context.
    Event {
        home: u16,
        token: u64,
        ev: AsyncEvent,
    },
    /// A call's result, and the QP it made or destroyed.
    Done {
        home: u16,
        token: u64,
        reply: Reply,
        result: VerbsResult<ReplyData>,
        change: QpChange,
    },
    /// A replica could not be applied: the shards no longer agree on the context's
    /// objects, and the context is closed.
    Diverged { home: u16, token: u64 },
}

/// What a call on a satellite did to its QPs.
pub(super) enum QpChange {
    None,
    /// A create answered: the QP made, if it was.
    Created(QpUses, Option<Qpn>),
    Gone(Qpn),
}

/// A spread context's call waiting for the posts before it (`Nic::spread_call`).
pub(super) struct Deferred {
    token: u64,
    cmd: Command,
    area: Option<Arc<Area>>,
    reply: Reply,
}

/// A replicated call's answer, sent once every shard applied it.
pub(super) struct Gather {
    left: AtomicUsize,
    failed: AtomicBool,
    reply: Mutex<Option<(Reply, VerbsResult<ReplyData>)>>,
}

impl Gather {
    fn new(shards: usize, reply: Reply, result: VerbsResult<ReplyData>) -> Gather {
        Gather {
            left: AtomicUsize::new(shards),
            failed: AtomicBool::new(false),
            reply: Mutex::new(Some((reply, result))),
        }
    }

    /// One shard applied it (`ok`) or could not; the last one answers.
    fn done(&self, ok: bool) {
        if !ok {
            self.failed.store(true, Ordering::Release);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let taken = self.reply.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some((reply, result)) = taken {
                let r = if self.failed.load(Ordering::Acquire) {
                    Err(VerbsError::DeviceFatal)
                } else {
                    result
                };
                let _ = reply.try_send(r);
            }
        }
    }
}

/// Calls a spread context cannot make (see the module documentation).
fn refused(cmd: &Command) -> Option<&'static str> {
    Some(match cmd {
        Command::AllocMw { .. } => "memory windows",
        Command::AllocMr { .. } => "MRs for fast registration",
        _ => return None,
    })
}

/// Calls every shard applies (the home first, the satellites after it in order).
fn replicated(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::AllocPd
            | Command::DeallocPd { .. }
            | Command::AddArea { .. }
            | Command::RemoveArea { .. }
            | Command::RegMr { .. }
            | Command::ReregMr { .. }
            | Command::DeregMr { .. }
            | Command::CreateCq { .. }
            | Command::ResizeCq { .. }
            | Command::DestroyCq { .. }
            | Command::CreateSrq { .. }
            | Command::DestroySrq { .. }
    )
}

/// The QP a call is on, if it is on one.
fn call_qp(cmd: &Command) -> Option<Qpn> {
    match cmd {
        Command::ModifyQp { qpn, .. }
        | Command::QueryQp { qpn }
        | Command::DestroyQp { qpn }
        | Command::Counters { qpn: Some(qpn) } => Some(*qpn),
        _ => None,
    }
}

impl Nic {
    /// Whether contexts spread over this RNIC's shards, and there are several.
    pub(super) fn spreads(&self) -> bool {
        self.shard.as_ref().is_some_and(|s| s.spread)
    }

    /// The device's objects, for tools: a shard holding spread contexts' satellites counts
    /// only its QPs (their PDs, MRs, CQs and SRQs are the home's, counted there).
    pub fn object_counts(&self) -> roce::engine::ObjectCounts {
        let mut o = self.dev.object_counts();
        if self.spreads() && self.shard().0 != 0 {
            o = roce::engine::ObjectCounts {
                qps: o.qps,
                ..Default::default()
            };
        }
        o
    }

    /// Attaches an application context. On a spread RNIC (the first shard: every
    /// context's home) its satellites go to the other shards.
    ///
    /// Clients are numbered by 16 bits in the owner tables, `u16::MAX` meaning "nobody": past
    /// 65 535 attached clients a new one is refused (dropped, so its calls fail with
    /// `DeviceFatal`) rather than numbered like another and handed that one's objects.
    /// Returns whether it was attached.
    pub fn add_host(&mut self, mut h: HostEnd) -> bool {
        if self.hosts.is_full() {
            tracing::warn!(client = %h.label, "refused: every client number is in use");
            return false;
        }
        let home = self.spreads() && h.spread.is_none();
        if home {
            h.spread = Some(Spread::Home {
                remote: Default::default(),
                creating: Vec::new(),
                made: 0,
            });
        }
        let id = if h.satellite_of().is_some() {
            // Under its home's id, so every message names it without a search. The close
            // of an earlier context with that id came first (the queue from the home is in
            // order); one still there is released all the same rather than dropped.
            let id = h.id as usize;
            if self.hosts.contains(id) {
                self.release_host(id);
                self.hosts.remove(id);
            }
            self.hosts.insert_at(id, h).ok().map(|_| id)
        } else {
            self.hosts.insert_with(|id| {
                h.id = id as u16;
                h
            })
        };
        if let (true, Some(id)) = (home, id) {
            let count = self.shard().1 as usize;
            for k in 1..count {
                match self.hosts.get(id).map(|h| h.satellite()) {
                    Some(Ok(sat)) => self.tell_satellite(k, ToSatellite::Attach(Box::new(sat))),
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "cannot make a context's satellite");
                        if let Some(h) = self.hosts.get_mut(id) {
                            h.deliver_event(&AsyncEvent::DeviceFatal);
                        }
                        self.release_host(id);
                        break;
                    }
                    None => break,
                }
            }
        }
        id.is_some()
    }

    /// Executes a control call of the client `token` and sends its result to `reply`: at
    /// once, or (a spread context's call that other shards take part in) once they did.
    pub fn dispatch(&mut self, token: u64, cmd: Command, area: Option<Arc<Area>>, reply: Reply) {
        let home = self.host_id(token).filter(|&id| {
            matches!(
                self.hosts.get(id).and_then(|h| h.spread.as_ref()),
                Some(Spread::Home { .. })
            )
        });
        match home {
            Some(_) => {
                let call = Deferred {
                    token,
                    cmd,
                    area,
                    reply,
                };
                // Calls that waited go first.
                if self.shard.as_ref().is_some_and(|s| !s.deferred.is_empty()) {
                    if let Some(s) = self.shard.as_mut() {
                        s.deferred.push_back(call);
                    }
                    self.run_deferred();
                } else if let Some(call) = self.spread_call(call) {
                    if let Some(s) = self.shard.as_mut() {
                        s.deferred.push_back(call);
                    }
                }
            }
            None => {
                let _ = reply.try_send(self.call(token, cmd, area));
            }
        }
    }

    /// Runs the calls that waited for the posts before them, in order, while they can go.
    fn run_deferred(&mut self) {
        while let Some(call) = self.shard.as_mut().and_then(|s| s.deferred.pop_front()) {
            if let Some(call) = self.spread_call(call) {
                if let Some(s) = self.shard.as_mut() {
                    s.deferred.push_front(call);
                }
                break;
            }
        }
    }

    /// A spread context's call at its home: refused, executed here, replicated to every
    /// shard, or passed to the shard of the QP it is on. Gives the call back when it must
    /// wait: posts made before it are still in the ring, held back by a full queue to
    /// a satellite (it then runs once they went, `run_deferred`).
    fn spread_call(&mut self, call: Deferred) -> Option<Deferred> {
        let Some(id) = self.host_id(call.token) else {
            let _ = call.reply.try_send(Err(VerbsError::DeviceFatal));
            return None;
        };
        // Program order: the posts before the call go first (to their shards' queues, ahead
        // of what this call sends there).
        self.serve_posts(id, POST_RING);
        if self.spread_backlog() && self.hosts.get(id).is_some_and(|h| h.has_posts()) {
            return Some(call);
        }
        let Deferred {
            token,
            cmd,
            area,
            reply,
        } = call;
        if let Some(what) = refused(&cmd) {
            let _ = reply.try_send(Err(VerbsError::InvalidArgument(format!(
                "{what}: not in a context spread over several workers (worker.spread)"
            ))));
            return None;
        }
        let count = self.shard().1;
        let Some(h) = self.hosts.get_mut(id) else {
            let _ = reply.try_send(Err(VerbsError::DeviceFatal));
            return None;
        };
        if h.is_closed() {
            let _ = reply.try_send(Err(VerbsError::DeviceFatal));
            return None;
        }
        let Some(Spread::Home {
            remote,
            creating,
            made,
        }) = &mut h.spread
        else {
            let _ = reply.try_send(Err(VerbsError::DeviceFatal));
            return None;
        };
        // Which shard the call's QP is (to be) on.
        let target = match &cmd {
            Command::CreateQp { init } => {
                let held = h.qps.len() + remote.len() + creating.len();
                if held as u32 >= h.client_limits.max_qps {
                    let _ =
                        reply.try_send(Err(VerbsError::NoResources("queue pairs (host.max_qps)")));
                    return None;
                }
                let k = *made % count;
                *made = made.wrapping_add(1);
                if k != 0 {
                    // What it will use counts from now (a destroy racing the create from
                    // another thread is Busy), until the satellite answers.
                    creating.push(QpUses::of(init));
                }
                k
            }
            c => call_qp(c).map_or(0, |q| QpnStripe::owner(q, count)),
        };
        let ctx = Ctx {
            id: id as u16,
            token,
        };
        if target != 0 {
            self.tell_satellite(target as usize, ToSatellite::Call { ctx, cmd, reply });
            return None;
        }
        // A PD, CQ or SRQ a QP on another shard uses (or is being created with) stays, as
        // the device keeps one its own QPs use.
        let mut uses = remote.values().chain(creating.iter());
        let busy = match &cmd {
            Command::DeallocPd { pd } => uses.any(|u| u.pd == *pd).then_some("protection domain"),
            Command::DestroyCq { cq } => uses
                .any(|u| u.send_cq == *cq || u.recv_cq == *cq)
                .then_some("completion queue"),
            Command::DestroySrq { srq } => uses
                .any(|u| u.srq == Some(*srq))
                .then_some("shared receive queue"),
            _ => None,
        };
        if let Some(what) = busy {
            let _ = reply.try_send(Err(VerbsError::Busy(what)));
            return None;
        }
        let copy = replicated(&cmd).then(|| (cmd.clone(), area.clone()));
        let r = self.call(token, cmd, area);
        match (copy, r) {
            (Some((cmd, area)), Ok(made)) if count > 1 => {
                let srq = match made {
                    ReplyData::Srq(s) => self.dev.srq_shared(s),
                    _ => None,
                };
                let done = Arc::new(Gather::new(count as usize - 1, reply, Ok(made.clone())));
                for k in 1..count as usize {
                    self.tell_satellite(
                        k,
                        ToSatellite::Replica {
                            ctx,
                            cmd: cmd.clone(),
                            area: area.clone(),
                            srq: srq.clone(),
                            made: made.clone(),
                            done: done.clone(),
                        },
                    );
                }
            }
            (_, r) => {
                let _ = reply.try_send(r);
            }
        }
        None
    }

    /// A post of the spread context `id` for one of its QPs on another shard: queued for
    /// that shard (the post is taken from `buf`). Returns false otherwise (the post is then
    /// applied, or refused, here).
    pub(super) fn forward_post(
        &mut self,
        id: usize,
        token: u64,
        qpn: Qpn,
        buf: &mut Box<PostBuf>,
    ) -> bool {
        let count = self.shard().1;
        let k = QpnStripe::owner(qpn, count);
        // Only to the context's own QPs there: a post naming any other is refused here, as
        // one naming another context's QP on this shard is (it cannot fill a satellite's
        // queue for everyone).
        let mine = self
            .hosts
            .get(id)
            .and_then(|h| h.remote_qps())
            .is_some_and(|r| r.contains_key(&qpn));
        if k == 0 || !mine {
            return false;
        }
        let spare = self.shard.as_ref().and_then(|s| s.links.spare_posts.pop());
        let post = std::mem::replace(buf, spare.unwrap_or_default());
        let ctx = Ctx {
            id: id as u16,
            token,
        };
        self.tell_satellite(k as usize, ToSatellite::Post { ctx, post });
        true
    }

    /// Whether the home holds messages for satellites their queues had no room for (it
    /// then takes no more posts until they went).
    pub(super) fn spread_backlog(&self) -> bool {
        self.shard
            .as_ref()
            .is_some_and(|s| s.out_sat.iter().any(|q| !q.is_empty()) || !s.out_home.is_empty())
    }

    fn tell_satellite(&mut self, k: usize, m: ToSatellite) {
        let Some(s) = self.shard.as_mut() else {
            return;
        };
        s.due |= 1 << k;
        let out = &mut s.out_sat[k];
        if !out.is_empty() {
            out.push_back(m);
            return;
        }
        if let Err(m) = s.links.to_sat[k].push(m) {
            out.push_back(m);
        }
    }

    fn tell_home(&mut self, m: ToHome) {
        let Some(s) = self.shard.as_mut() else {
            return;
        };
        s.due |= 1;
        if !s.out_home.is_empty() {
            s.out_home.push_back(m);
            return;
        }
        if let Err(m) = s.links.to_home.push(m) {
            s.out_home.push_back(m);
        }
    }

    /// Sends what waited for room, in order.
    fn flush_spread(&mut self) {
        let Some(s) = self.shard.as_mut() else {
            return;
        };
        for (k, out) in s.out_sat.iter_mut().enumerate() {
            while let Some(m) = out.pop_front() {
                s.due |= 1 << k;
                if let Err(m) = s.links.to_sat[k].push(m) {
                    out.push_front(m);
                    break;
                }
            }
        }
        while let Some(m) = s.out_home.pop_front() {
            s.due |= 1;
            if let Err(m) = s.links.to_home.push(m) {
                s.out_home.push_front(m);
                break;
            }
        }
    }

    /// Whether messages between the shards of spread contexts wait for this one.
    pub(super) fn spread_busy(&self) -> bool {
        self.shard.as_ref().is_some_and(|s| {
            s.spread
                && (if s.index == 0 {
                    !s.links.to_home.is_empty()
                } else {
                    !s.links.to_sat[s.index as usize].is_empty()
                } || s.out_sat.iter().any(|q| !q.is_empty())
                    || !s.out_home.is_empty()
                    || !s.deferred.is_empty())
        })
    }

    /// Moves the messages between a spread context's home and its satellites: a satellite
    /// applies what its home sent, the home takes its satellites' completions, events and
    /// answers. Returns how many it handled.
    pub(super) fn serve_spread(&mut self) -> usize {
        if !self.spreads() {
            return 0;
        }
        self.flush_spread();
        let Some(s) = self.shard.as_ref() else {
            return 0;
        };
        let (index, links) = (s.index as usize, s.links.clone());
        let mut work = 0;
        if index == 0 {
            while work < 4 * super::BURST {
                let Some(m) = links.to_home.pop() else { break };
                work += 1;
                self.at_home(m);
            }
            if self.shard.as_ref().is_some_and(|s| !s.deferred.is_empty()) {
                self.flush_spread();
                self.run_deferred();
                work += 1;
            }
        } else {
            while work < 4 * super::BURST {
                let Some(m) = links.to_sat[index].pop() else {
                    break;
                };
                work += 1;
                self.at_satellite(m);
            }
            work += self.send_satellite_events();
        }
        work
    }

    /// The home's side: a satellite's message for the context `home` (if it is still the
    /// context with `token`: a host id is reused after a close).
    fn at_home(&mut self, m: ToHome) {
        let live = |nic: &Nic, home: u16, token: u64| {
            nic.hosts
                .get(home as usize)
                .is_some_and(|h| h.token == token && !h.is_closed())
        };
        match m {
            ToHome::Cqe { home, token, cq, c } => {
                if live(self, home, token) && self.owners.cq(cq) == Some(home as usize) {
                    self.dev.complete_foreign(cq, c);
                } else {
                    self.counters.spread_dropped += 1;
                }
            }
            ToHome::Event { home, token, ev } => {
                if live(self, home, token) {
                    if let Some(h) = self.hosts.get_mut(home as usize) {
                        h.deliver_event(&ev);
                    }
                }
            }
            ToHome::Done {
                home,
                token,
                reply,
                result,
                change,
            } => {
                if live(self, home, token) {
                    if let Some(Spread::Home {
                        remote, creating, ..
                    }) = self
                        .hosts
                        .get_mut(home as usize)
                        .and_then(|h| h.spread.as_mut())
                    {
                        match change {
                            QpChange::None => {}
                            QpChange::Created(u, q) => {
                                if let Some(i) = creating.iter().position(|c| *c == u) {
                                    creating.swap_remove(i);
                                }
                                if let Some(q) = q {
                                    remote.insert(q, u);
                                }
                            }
                            QpChange::Gone(q) => {
                                remote.remove(&q);
                            }
                        }
                    }
                }
                // The positions and completions the call produced reached the application
                // first (the satellite published them before answering).
                self.publish();
                let _ = reply.try_send(result);
            }
            ToHome::Diverged { home, token } => {
                if live(self, home, token) {
                    tracing::warn!("a spread context's shards disagree: closing it");
                    if let Some(h) = self.hosts.get_mut(home as usize) {
                        h.deliver_event(&AsyncEvent::DeviceFatal);
                    }
                    self.release_host(home as usize);
                }
            }
        }
    }

    /// A satellite's side: a message from the home.
    fn at_satellite(&mut self, m: ToSatellite) {
        match m {
            ToSatellite::Attach(h) => {
                let (token, home) = (h.token, h.id);
                if !self.add_host(*h) {
                    self.tell_home(ToHome::Diverged { home, token });
                }
            }
            ToSatellite::Post { ctx, post } => {
                if let Some(id) = self.satellite_id(ctx) {
                    if let Some(p) = post.post() {
                        self.execute_post(id, p);
                    }
                }
                self.post_buf_spare(post);
            }
            ToSatellite::Call { ctx, cmd, reply } => {
                let made = match &cmd {
                    Command::CreateQp { init } => Some(QpUses::of(init)),
                    _ => None,
                };
                let gone = match &cmd {
                    Command::DestroyQp { qpn } => Some(*qpn),
                    _ => None,
                };
                let Ctx { id: home, token } = ctx;
                let result = match self.satellite_id(ctx) {
                    Some(_) => self.call(token, cmd, None),
                    None => Err(VerbsError::DeviceFatal),
                };
                let change = match (&result, made, gone) {
                    (Ok(ReplyData::Qp(q, _)), Some(u), _) => {
                        QpChange::Created(u, Some(q.to_owned()))
                    }
                    (_, Some(u), _) => QpChange::Created(u, None),
                    (Ok(_), _, Some(q)) => QpChange::Gone(q),
                    _ => QpChange::None,
                };
                // Events the call raised go first.
                self.send_satellite_events();
                self.tell_home(ToHome::Done {
                    home,
                    token,
                    reply,
                    result,
                    change,
                });
            }
            ToSatellite::Replica {
                ctx,
                cmd,
                area,
                srq,
                made,
                done,
            } => {
                let ok = match self.satellite_id(ctx) {
                    Some(id) => {
                        let r = self.hosts.get_mut(id).map(|h| {
                            let given = Given { area, srq };
                            replicate(&mut self.dev, &mut self.owners, h, cmd, given, &made)
                        });
                        match r {
                            Some(Ok(())) => true,
                            Some(Err(e)) => {
                                tracing::warn!(error = %e, "a replica failed");
                                self.tell_home(ToHome::Diverged {
                                    home: ctx.id,
                                    token: ctx.token,
                                });
                                false
                            }
                            None => false,
                        }
                    }
                    // Closed meanwhile: nothing to keep in step.
                    None => true,
                };
                done.done(ok);
            }
            ToSatellite::Close { ctx } => {
                if let Some(id) = self.satellite_id(ctx) {
                    self.release_host(id);
                    self.hosts.remove(id);
                }
                self.forget_freed_qps();
            }
        }
    }

    /// A forwarded post's buffer, applied: back to the home for another post.
    fn post_buf_spare(&mut self, b: Box<PostBuf>) {
        if let Some(s) = &self.shard {
            let _ = s.links.spare_posts.push(b);
        }
    }

    /// A satellite: its contexts' events, home.
    pub(super) fn send_satellite_events(&mut self) -> usize {
        let mut out = Vec::new();
        for h in self.hosts.values_mut() {
            let (home, token) = (h.id, h.token);
            if let Some(Spread::Satellite { events }) = &mut h.spread {
                for ev in events.drain(..) {
                    out.push(ToHome::Event { home, token, ev });
                }
            }
        }
        let n = out.len();
        for m in out {
            self.tell_home(m);
        }
        n
    }

    /// A satellite: CQ `cq`'s completions (a replica) home, in order.
    pub(super) fn forward_completions(&mut self, id: usize, cq: CqId) -> usize {
        let Some((home, token)) = self
            .hosts
            .get(id)
            .and_then(|h| h.satellite_of().map(|home| (home, h.token)))
        else {
            return 0;
        };
        let mut moved = 0;
        let mut one = [Completion::default()];
        // All of them, in order: a call's answer sent after this (`ToHome::Done`) must not
        // overtake its completions. What the queue has no room for waits in `out_home`,
        // bounded by the WQEs the satellite's QPs hold.
        while self.dev.poll_cq(cq, &mut one).unwrap_or(0) == 1 {
            let c = std::mem::take(&mut one[0]);
            self.tell_home(ToHome::Cqe { home, token, cq, c });
            moved += 1;
        }
        let left = self.dev.cq_has_entries(cq);
        if let Some(h) = self.hosts.get_mut(id) {
            h.set_cq_pending(cq, left);
        }
        moved
    }

    /// The spread context `id` (`token`) closed at its home: its satellites close too
    /// (after what was sent before).
    pub(super) fn close_satellites(&mut self, id: usize, token: u64) {
        if !self.spreads() || self.shard().0 != 0 {
            return;
        }
        let ctx = Ctx {
            id: id as u16,
            token,
        };
        for k in 1..self.shard().1 as usize {
            self.tell_satellite(k, ToSatellite::Close { ctx });
        }
    }

    /// A satellite: the host id of the context `ctx` names, if it is still attached here.
    fn satellite_id(&self, ctx: Ctx) -> Option<usize> {
        let id = ctx.id as usize;
        self.hosts
            .get(id)
            .is_some_and(|h| h.token == ctx.token)
            .then_some(id)
    }
}

/// What a replicated call carries besides the command.
struct Given {
    /// The area or ring it names.
    area: Option<Arc<Area>>,
    /// An SRQ's shared WQEs.
    srq: Option<Arc<dyn SharedWqes>>,
}

/// Applies on a satellite the call its home executed with the result `made`: the same
/// objects under the same ids and keys. Limits and charges are the home's (it refused
/// what went past them).
fn replicate(
    dev: &mut roce::engine::Device,
    owners: &mut Owners,
    h: &mut HostEnd,
    cmd: Command,
    given: Given,
    made: &ReplyData,
) -> VerbsResult<()> {
    let Given { area, srq } = given;
    let mismatch = || VerbsError::InvalidArgument("replica of a different result".into());
    match (cmd, made) {
        (Command::AllocPd, ReplyData::Pd(pd)) => {
            dev.alloc_pd_at(*pd)?;
            h.pds.push(*pd);
        }
        (Command::DeallocPd { pd }, _) => {
            dev.dealloc_pd(pd)?;
            h.pds.retain(|p| *p != pd);
        }
        (Command::AddArea { id }, _) => {
            let a = area.ok_or_else(mismatch)?;
            h.areas.insert(id, a);
        }
        (Command::RemoveArea { id }, _) => {
            // MRs on it keep it mapped (they hold it).
            h.areas.remove(&id);
        }
        (
            Command::RegMr {
                pd,
                area,
                offset,
                len,
                access,
                iova,
            },
            ReplyData::Keys { lkey, rkey },
        ) => {
            let mem = h.area(area)?;
            let offset = usize::try_from(offset).map_err(|_| mismatch())?;
            let got = dev.reg_mr_at(*lkey, pd, mem.clone(), offset, iova, len, access)?;
            if got != (*lkey, *rkey) {
                let _ = dev.dereg_mr(got.0);
                return Err(mismatch());
            }
            populate_later(&mem, offset, len as usize);
            h.mrs.push(*lkey);
        }
        (
            Command::ReregMr {
                lkey,
                pd,
                translation,
                access,
            },
            ReplyData::Keys { .. },
        ) => {
            super::serve::rereg(dev, h, lkey, pd, translation, access)?;
        }
        (Command::DeregMr { lkey }, _) => {
            dev.dereg_mr(lkey)?;
            h.mrs.retain(|k| k.index() != lkey.index());
        }
        (Command::CreateCq { cqe, capacity }, ReplyData::Cq(cq)) => {
            let ring = area.ok_or_else(mismatch)?;
            dev.create_cq_at(*cq, cqe)?;
            // The home's ring: never written here (completions go home), held so the
            // satellite's CQ table mirrors the home's.
            super::serve::keep_cq_ring(dev, owners, h, *cq, ring, capacity)?;
        }
        (Command::ResizeCq { cq, cqe }, _) => {
            // The replica only holds completions on their way home: its size matters for
            // nothing else, and one holding more than `cqe` keeps its size.
            let _ = dev.resize_cq(cq, cqe);
        }
        (Command::DestroyCq { cq }, _) => {
            // Its completions not yet home go with it, as the home's do.
            dev.destroy_cq(cq)?;
            super::serve::forget_cq(owners, h, cq);
        }
        (Command::CreateSrq { pd, .. }, ReplyData::Srq(s)) => {
            let wqes = srq.ok_or_else(mismatch)?;
            dev.create_srq_shared(Some(*s), pd, wqes)?;
            h.srqs.push(*s);
            Owners::set(&mut owners.srq, s.0 as usize, h.id);
        }
        (Command::DestroySrq { srq }, _) => {
            dev.destroy_srq(srq)?;
            h.srqs.retain(|s| *s != srq);
            Owners::set(&mut owners.srq, srq.0 as usize, crate::host::NOBODY);
        }
        _ => return Err(mismatch()),
    }
    Ok(())
}

/// One WQE of a spread context's SRQ.
#[derive(Clone, Copy)]
struct SrqWqe {
    wr_id: u64,
    n: u8,
    sges: [Sge; MAX_HOST_SGE],
}

/// A spread context's SRQ: its WQEs in one bounded lock-free queue every shard takes from
/// (`crossbeam_queue::ArrayQueue`, multi-producer multi-consumer: each WQE is taken once),
/// its limit armed and fired through one atomic (one taker wins the disarm, so the event
/// fires once), and how many were taken (the position every shard publishes).
pub(crate) struct SpreadSrq {
    q: ArrayQueue<SrqWqe>,
    limit: AtomicU32,
    taken: AtomicU64,
    max_wr: u32,
    max_sge: u32,
}

impl SpreadSrq {
    /// An empty SRQ of `attr`'s shape with its limit armed.
    pub(crate) fn new(attr: &roce::engine::SrqAttr) -> SpreadSrq {
        SpreadSrq {
            q: ArrayQueue::new(attr.max_wr.max(1) as usize),
            limit: AtomicU32::new(attr.srq_limit),
            taken: AtomicU64::new(0),
            max_wr: attr.max_wr,
            max_sge: attr.max_sge.max(1),
        }
    }
}

impl SharedWqes for SpreadSrq {
    fn push(&self, wr_id: u64, sges: &[Sge]) -> bool {
        if sges.len() > MAX_HOST_SGE {
            return false;
        }
        let mut w = SrqWqe {
            wr_id,
            n: sges.len() as u8,
            sges: [Sge::default(); MAX_HOST_SGE],
        };
        w.sges[..sges.len()].copy_from_slice(sges);
        self.q.push(w).is_ok()
    }

    fn pop(&self, out: &mut Vec<Sge>) -> Option<(u64, bool)> {
        let w = self.q.pop()?;
        self.taken.fetch_add(1, Ordering::AcqRel);
        out.clear();
        out.extend_from_slice(&w.sges[..w.n as usize]);
        let limit = self.limit.load(Ordering::Acquire);
        let fired = limit > 0
            && (self.q.len() as u32) < limit
            && self
                .limit
                .compare_exchange(limit, 0, Ordering::AcqRel, Ordering::Acquire)
                .is_ok();
        Some((w.wr_id, fired))
    }

    fn arm(&self, limit: u32) {
        self.limit.store(limit, Ordering::Release);
    }

    fn limit(&self) -> u32 {
        self.limit.load(Ordering::Acquire)
    }

    fn taken(&self) -> u64 {
        self.taken.load(Ordering::Acquire)
    }

    fn shape(&self) -> (u32, u32) {
        (self.max_wr, self.max_sge)
    }

    fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

impl QpUses {
    /// What a QP created with `init` uses.
    fn of(init: &roce::engine::QpInit) -> QpUses {
        QpUses {
            pd: init.pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
        }
    }
}
