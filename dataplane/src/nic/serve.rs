//! The RNIC serving its clients: the posts and control calls that [`HostEnd`]s decode from
//! their clients' rings and sockets are applied to the [`Device`] here, so the device has one
//! driver (the [`Nic`]: frames, timers, posts and calls all reach it through the Nic's
//! methods), and what a call creates or releases is recorded in the client's ledger. Then the
//! Nic publishes the device's outputs (queue positions, completions, events) to the rings of
//! the clients that own the objects (`Nic::publish`).
//!
//! Program order: a control call first executes the posts already in the client's ring.

use std::sync::Arc;

use ferroce_host::abi::area::Area;
use ferroce_host::abi::ring::{ring_bytes, Producer};
use ferroce_host::abi::slots::{CqeSlot, Post, MAX_HOST_SGE};
use ferroce_host::abi::{CmEventData, Command, PortAttrData, ReplyData, POST_RING};
use roce::cm::{reason, CmError, CmEvent, ConnId, SIDR_VALID};
use roce::engine::{CqId, Device, DeviceAttr, DeviceEvent, SrqId, VerbsError, VerbsResult};
use roce::types::{Lkey, Qpn, Rkey};
use roce::verbs::{AsyncEvent, QpAttr, QpState, RecvWr, SendWr};

use super::Nic;
use crate::host::{
    populate_later, HostEnd, Owners, QueueKind, MAX_CM_EVENTS, MAX_CM_LISTENS, NOBODY,
};

/// Device attributes as applications see them: work requests cross the host rings with at
/// most `MAX_HOST_SGE` SGEs.
pub(super) fn device_attr(dev: &Device) -> DeviceAttr {
    let mut a = dev.attr();
    a.limits.max_sge = a.limits.max_sge.min(MAX_HOST_SGE as u32);
    a.max_srq_sge = a.max_srq_sge.min(MAX_HOST_SGE as u32);
    a
}

/// Port attributes as the host protocol carries them.
pub(super) fn port_attr(dev: &Device) -> PortAttrData {
    let p = dev.port_attr();
    PortAttrData {
        active: p.active,
        max_mtu: p.max_mtu,
        active_mtu: p.active_mtu,
        gid_tbl_len: p.gid_tbl_len,
        pkey_tbl_len: p.pkey_tbl_len,
    }
}

impl Nic {
    /// Executes up to `budget` posts from client `id`'s ring; returns how many it took. A
    /// client that breaks the protocol (a post that does not decode, corrupted ring
    /// indices) gets the device-fatal event and is closed, its objects released.
    pub(super) fn serve_posts(&mut self, id: usize, budget: usize) -> usize {
        let mut n = 0;
        // Every post of the batch is decoded into this one buffer and applied by reference:
        // a decoded post is some 600 bytes, and moving it showed in the per-message profile.
        let mut buf = self.post_buf.take().unwrap_or_default();
        // A spread context's home: posts to its QPs on other shards go to their queues; one
        // that had no room holds the rest back (program order).
        let home = self
            .hosts
            .get(id)
            .is_some_and(|h| matches!(h.spread, Some(crate::host::Spread::Home { .. })));
        while n < budget {
            if home && self.spread_backlog() {
                break;
            }
            let Some(h) = self.hosts.get_mut(id) else {
                break;
            };
            let token = h.token;
            let Some(next) = h.next_post(&mut buf) else {
                break;
            };
            n += 1;
            match next {
                Ok(()) => {
                    if home {
                        let qpn = match buf.post() {
                            Some(Post::Send { qpn, .. }) | Some(Post::Recv { qpn, .. }) => {
                                Some(qpn)
                            }
                            _ => None,
                        };
                        if let Some(qpn) = qpn {
                            if self.forward_post(id, token, qpn, &mut buf) {
                                continue;
                            }
                        }
                    }
                    if let Some(post) = buf.post() {
                        self.execute_post(id, post);
                    }
                }
                Err(e) => {
                    let Some(h) = self.hosts.get_mut(id) else {
                        break;
                    };
                    h.counters.bad_slots += 1;
                    tracing::warn!(client = %h.label, error = %e, "closing the client");
                    h.deliver_event(&AsyncEvent::DeviceFatal);
                    close(&mut self.dev, &mut self.owners, h, self.now);
                    self.close_satellites(id, token);
                    break;
                }
            }
        }
        self.post_buf = Some(buf);
        n
    }

    /// Whether the live QP `qpn` is client `id`'s (see [`owns`]).
    fn owns_qp(&self, id: usize, qpn: Qpn) -> bool {
        owns_id(&self.dev, &self.owners, id, qpn)
    }

    /// Applies one decoded post of client `id`. A post the device refuses on arrival (the
    /// QP went to the error state, its queue is full) completes in order with LOC_QP_OP_ERR
    /// and frees its queue place when it retires: the application counted it as posted. A
    /// post naming another client's object is counted and dropped.
    pub(super) fn execute_post(&mut self, id: usize, post: Post<'_>) {
        let refused = match post {
            Post::Send { qpn, wr } => {
                let own = self.owns_qp(id, qpn);
                let r = if !own {
                    Err(VerbsError::NotFound("queue pair"))
                } else {
                    match wr.inline() {
                        Some(bytes) => {
                            let bare = SendWr {
                                sg_list: &[],
                                ..wr.as_wr()
                            };
                            self.dev.post_send_inline(qpn, &bare, bytes)
                        }
                        None => self.dev.post_send(qpn, &wr.as_wr()),
                    }
                };
                if r.is_err() && own {
                    self.dev.handle_event(DeviceEvent::SendRejected {
                        qpn,
                        wr: &wr.as_wr(),
                    });
                }
                r.is_err()
            }
            Post::Recv { qpn, wr_id, sges } => {
                let own = self.owns_qp(id, qpn);
                let r = if own {
                    let wr = RecvWr {
                        wr_id,
                        sg_list: sges,
                    };
                    self.dev.post_recv(qpn, &wr)
                } else {
                    Err(VerbsError::NotFound("queue pair"))
                };
                if r.is_err() && own {
                    self.dev
                        .handle_event(DeviceEvent::RecvRejected { qpn, wr_id });
                }
                r.is_err()
            }
            Post::SrqRecv { srq, wr_id, sges } => {
                let srq = SrqId(srq);
                // No QP to complete a refused one on: counted (the application checked
                // fullness before posting, so this means the SRQ went away meanwhile).
                if self.owners.srq(srq) == Some(id) {
                    let wr = RecvWr {
                        wr_id,
                        sg_list: sges,
                    };
                    self.dev.post_srq_recv(srq, &wr).is_err()
                } else {
                    true
                }
            }
        };
        if refused {
            if let Some(h) = self.hosts.get_mut(id) {
                h.counters.failed_posts += 1;
            }
        }
    }

    /// Executes a control call of client `id`: first the posts already in its ring (program
    /// order), then the call. A closed client gets `DeviceFatal`.
    pub(super) fn serve_call(
        &mut self,
        id: usize,
        cmd: Command,
        area: Option<Arc<Area>>,
    ) -> VerbsResult<ReplyData> {
        // One ring's worth: all that was posted before the call fits; a client refilling its
        // ring meanwhile cannot hold the worker here.
        self.serve_posts(id, POST_RING);
        let Some(h) = self.hosts.get_mut(id) else {
            return Err(VerbsError::DeviceFatal);
        };
        // A context closed for breaking the protocol is dead to its client: device fatal.
        if h.is_closed() {
            return Err(VerbsError::DeviceFatal);
        }
        h.reap_areas();
        if let Command::ResolveNeighbor { dgid } = cmd {
            return Ok(ReplyData::Neighbor(self.reach(dgid)));
        }
        // A connected QP given its destination: resolve the next hop now, as an RNIC's driver
        // resolves the destination MAC when the QP moves to RTR (Linux: ib_resolve_eth_dmac
        // in modify_qp), so its first packets leave at once instead of waiting for ARP/ND.
        let dgid = match &cmd {
            Command::ModifyQp { attr, .. } => attr.av.filter(|av| av.dmac.is_none()),
            _ => None,
        }
        .map(|av| av.dgid);
        let r = execute(&mut self.dev, &mut self.owners, h, self.now, cmd, area);
        if let (Ok(_), Some(dgid)) = (&r, dgid) {
            self.prime_next_hop(dgid);
        }
        r
    }

    /// Releases everything client `id` created (its process died or it closed the context).
    pub(super) fn release_host(&mut self, id: usize) {
        if let Some(h) = self.hosts.get_mut(id) {
            close(&mut self.dev, &mut self.owners, h, self.now);
            let token = h.token;
            self.close_satellites(id, token);
        }
    }

    /// The device is going away: every QP of client `id` moves to the error state (its
    /// outstanding work requests complete as flushed) before the device-fatal event.
    pub(super) fn fail_host(&mut self, id: usize) {
        let Some(h) = self.hosts.get(id) else { return };
        let err = QpAttr {
            state: Some(QpState::Err),
            ..Default::default()
        };
        for &q in &h.qps {
            let _ = self.dev.modify_qp(q, &err);
        }
    }

    /// Moves CQ `cq`'s completions to the ring of client `id`; if the ring is full the rest
    /// stays in the engine's CQ (which reports an overflow if it fills) and is retried.
    /// Returns how many moved.
    pub(super) fn move_completions(&mut self, id: usize, cq: CqId) -> usize {
        let Some(h) = self.hosts.get_mut(id) else {
            return 0;
        };
        if h.satellite_of().is_some() {
            // A spread context's replica of the CQ: its completions go home.
            return self.forward_completions(id, cq);
        }
        let dev = &mut self.dev;
        let moved = h.fill_cq_ring(cq, |out| dev.poll_cq(cq, out).unwrap_or(0));
        h.set_cq_pending(cq, dev.cq_has_entries(cq));
        moved
    }

    /// Retries client `id`'s CQs whose ring was full; returns how many completions moved.
    pub(super) fn retry_host_cqs(&mut self, id: usize) -> usize {
        let mut moved = 0;
        let n = self.hosts.get(id).map_or(0, |h| h.pending_cq_count());
        // Backwards: a CQ that empties leaves the list.
        for i in (0..n).rev() {
            if let Some(cq) = self.hosts.get(id).and_then(|h| h.pending_cq(i)) {
                moved += self.move_completions(id, cq);
            }
        }
        moved
    }
}

/// Publishes a QP's queue positions (its WQEs retired) in its client's index area.
pub(super) fn publish_qp(dev: &Device, h: &HostEnd, qpn: Qpn) {
    if let (Some(positions), Some(slot)) = (dev.queue_positions(qpn), dev.qp_index(qpn)) {
        h.publish_qp_positions(slot, positions);
    }
}

/// Publishes how many WQEs an SRQ has handed out.
pub(super) fn publish_srq(dev: &Device, h: &HostEnd, srq: SrqId) {
    if let Some(pos) = dev.srq_position(srq) {
        h.publish_srq_position(srq, pos);
    }
}

/// Releases everything client `h` created, in dependency order ([`HostEnd::release_all`]),
/// as the kernel does for a process that exits without cleaning up.
fn close(dev: &mut Device, owners: &mut Owners, h: &mut HostEnd, now: u64) {
    let held = h.release_all();
    // rdma_cm first, as rdma_destroy_id does: no more REQs for the client, its connections
    // disconnected (established) or rejected (waiting for it); the rest end by timeout.
    for sid in held.cm_listens {
        dev.cm().unlisten(sid);
        owners.remove_listener(sid);
    }
    for id in held.cm_ids {
        let _ = dev.cm().destroy(now, ConnId(id));
        owners.cm_conns.remove(&id);
    }
    for q in held.qps {
        if let Some(s) = dev.qp_index(q) {
            owners.release_qp(s);
        }
        let _ = dev.destroy_qp(q);
    }
    for s in held.srqs {
        Owners::set(&mut owners.srq, s.0 as usize, NOBODY);
        let _ = dev.destroy_srq(s);
    }
    for c in held.cqs {
        Owners::set(&mut owners.cq, c.0 as usize, NOBODY);
        let _ = dev.destroy_cq(c);
    }
    for k in held.mws {
        let _ = dev.dealloc_mw(k);
    }
    for k in held.mrs {
        let _ = dev.dereg_mr(k);
    }
    for pd in held.pds {
        let _ = dev.dealloc_pd(pd);
    }
}

/// Executes one control call of client `h` against the device: ownership and the client's
/// limits are checked first (objects are named by small numbers another application could
/// guess: a client may only use the ones it created), then the device acts, then the ledger
/// records what the client now holds and is charged.
fn execute(
    dev: &mut Device,
    owners: &mut Owners,
    h: &mut HostEnd,
    now: u64,
    cmd: Command,
    area: Option<Arc<Area>>,
) -> VerbsResult<ReplyData> {
    match cmd {
        Command::CmListen { .. }
        | Command::CmUnlisten { .. }
        | Command::CmConnect { .. }
        | Command::CmAccept { .. }
        | Command::CmReject { .. }
        | Command::CmRtu { .. }
        | Command::CmEstablished { .. }
        | Command::CmDisconnect { .. }
        | Command::CmDestroy { .. }
        | Command::CmGetEvent
        | Command::CmSidrRequest { .. }
        | Command::CmSidrReply { .. } => execute_cm(dev, owners, h, now, cmd),
        // The port's neighbour table answers it (`Nic::serve_call`, before this).
        Command::ResolveNeighbor { .. } => Err(VerbsError::InvalidArgument(
            "resolve_neighbor needs the port".into(),
        )),
        Command::QueryDevice => Ok(ReplyData::Device(device_attr(dev))),
        Command::QueryPort => Ok(ReplyData::Port(port_attr(dev))),
        Command::QueryGid { index } => dev
            .gids()
            .get(index as usize)
            .copied()
            .map(ReplyData::Gid)
            .ok_or_else(|| VerbsError::InvalidArgument(format!("GID index {index} out of range"))),
        Command::AllocPd => {
            if h.pds.len() as u32 >= h.client_limits.max_pds {
                return Err(VerbsError::NoResources("protection domains (host.max_pds)"));
            }
            let pd = dev.alloc_pd()?;
            h.pds.push(pd);
            Ok(ReplyData::Pd(pd))
        }
        Command::DeallocPd { pd } => {
            h.check_owned(h.pds.contains(&pd), "protection domain")?;
            dev.dealloc_pd(pd)?;
            h.pds.retain(|p| *p != pd);
            Ok(ReplyData::None)
        }
        Command::AddArea { id } => {
            let area = area.ok_or_else(|| {
                VerbsError::InvalidArgument("add_area without a memory area".into())
            })?;
            if h.areas.contains_key(&id) {
                return Err(VerbsError::InvalidArgument(format!(
                    "area {id} already exists"
                )));
            }
            h.reap_areas();
            h.check_area_count()?;
            h.charge(area.len() as u64)?;
            h.areas.insert(id, area);
            Ok(ReplyData::None)
        }
        Command::RemoveArea { id } => match h.areas.remove(&id) {
            Some(a) => {
                // Counted until the last MR on it goes and the worker unmaps it.
                h.retired.push(a);
                h.reap_areas();
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
            h.check_owned(h.pds.contains(&pd), "protection domain")?;
            h.check_mr_room()?;
            let mem = h.area(area)?;
            let offset = usize::try_from(offset)
                .map_err(|_| VerbsError::InvalidArgument("offset too large".into()))?;
            let (lkey, rkey) = dev.reg_mr(pd, mem.clone(), offset, iova, len, access)?;
            // Registration pins memory on an RNIC; here it faults the pages in.
            populate_later(&mem, offset, len as usize);
            h.mrs.push(lkey);
            Ok(ReplyData::Keys { lkey, rkey })
        }
        Command::ReregMr {
            lkey,
            pd,
            translation,
            access,
        } => {
            let owned = h.mrs.contains(&lkey);
            h.check_owned(owned, "memory region")?;
            if let Some(pd) = pd {
                h.check_owned(h.pds.contains(&pd), "protection domain")?;
            }
            let (lkey, rkey) = rereg(dev, h, lkey, pd, translation, access)?;
            Ok(ReplyData::Keys { lkey, rkey })
        }
        Command::AllocMw { pd, ty } => {
            h.check_owned(h.pds.contains(&pd), "protection domain")?;
            h.check_mr_room()?;
            let k = dev.alloc_mw(pd, ty)?;
            h.mws.push(k);
            Ok(ReplyData::Mw(k))
        }
        Command::DeallocMw { rkey } => {
            let index = rkey.index();
            release_key(&mut h.mws, index, Rkey::index, "memory window", || {
                dev.dealloc_mw(rkey)
            })
        }
        Command::AllocMr { pd, area } => {
            h.check_owned(h.pds.contains(&pd), "protection domain")?;
            h.check_mr_room()?;
            let mem = h.area(area)?;
            let lkey = dev.alloc_mr(pd, mem)?;
            h.mrs.push(lkey);
            Ok(ReplyData::Keys { lkey, rkey: None })
        }
        Command::DeregMr { lkey } => {
            let index = lkey.index();
            release_key(&mut h.mrs, index, Lkey::index, "memory region", || {
                dev.dereg_mr(lkey)
            })
        }
        Command::CreateCq { cqe, capacity } => {
            let ring =
                area.ok_or_else(|| VerbsError::InvalidArgument("create_cq without a ring".into()))?;
            if !capacity.is_power_of_two() || ring.len() < ring_bytes::<CqeSlot>(capacity as usize)
            {
                return Err(VerbsError::InvalidArgument("CQ ring too small".into()));
            }
            let owned = h.cqs.len() as u32;
            if owned >= h.client_limits.max_cqs {
                return Err(VerbsError::NoResources("completion queues (host.max_cqs)"));
            }
            h.check_area_count()?;
            let qbytes = roce::engine::cq_queue_bytes(cqe);
            h.check_queue(qbytes)?;
            let ring_len = ring.len() as u64;
            h.charge(ring_len)?;
            let cq = match dev.create_cq(cqe) {
                Ok(c) => c,
                Err(e) => {
                    h.area_bytes -= ring_len;
                    return Err(e);
                }
            };
            if let Err(e) = keep_cq_ring(dev, owners, h, cq, ring, capacity) {
                h.area_bytes -= ring_len;
                return Err(e);
            }
            h.charge_queue(QueueKind::Cq, cq.0, qbytes);
            Ok(ReplyData::Cq(cq))
        }
        Command::ResizeCq { cq, cqe } => {
            h.check_owned(h.owns_cq(cq), "completion queue")?;
            let old = h
                .queue_charges
                .get(&(QueueKind::Cq, cq.0))
                .copied()
                .unwrap_or(0);
            let new = roce::engine::cq_queue_bytes(cqe);
            h.check_queue(new.saturating_sub(old))?;
            // A CQ cannot shrink below the completions it holds (rxe_cq_chk_attr: EINVAL):
            // those in the application's ring count as well as those the engine holds.
            let in_ring = h.cqs.get_mut(cq.0 as usize).map_or(0, |(p, _)| p.held());
            let held = in_ring + dev.cq_len(cq);
            if held > cqe as usize {
                return Err(VerbsError::InvalidArgument(format!(
                    "the CQ holds {held} completions, more than {cqe}"
                )));
            }
            let size = dev.resize_cq(cq, cqe)?;
            h.uncharge_queue(QueueKind::Cq, cq.0);
            h.charge_queue(QueueKind::Cq, cq.0, new);
            Ok(ReplyData::Cqe(size))
        }
        Command::DestroyCq { cq } => {
            h.check_owned(h.owns_cq(cq), "completion queue")?;
            dev.destroy_cq(cq)?;
            if let Some(p) = forget_cq(owners, h, cq) {
                h.area_bytes -= p.area().len() as u64;
            }
            h.uncharge_queue(QueueKind::Cq, cq.0);
            Ok(ReplyData::None)
        }
        Command::CreateSrq { pd, attr } => {
            h.check_owned(h.pds.contains(&pd), "protection domain")?;
            if h.srqs.len() as u32 >= h.client_limits.max_srqs {
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
            h.check_queue(qbytes)?;
            let s = if matches!(h.spread, Some(crate::host::Spread::Home { .. })) {
                // Taken from by every worker its QPs are on (nic/spread.rs).
                let wqes = Arc::new(super::spread::SpreadSrq::new(&attr));
                dev.create_srq_shared(None, pd, wqes)?
            } else {
                dev.create_srq(pd, &attr)?
            };
            if s.0 >= h.limits.max_srq {
                let _ = dev.destroy_srq(s);
                return Err(VerbsError::NoResources("shared receive queues"));
            }
            h.charge_queue(QueueKind::Srq, s.0, qbytes);
            h.srqs.push(s);
            Owners::set(&mut owners.srq, s.0 as usize, h.id);
            h.reset_srq_position(s);
            Ok(ReplyData::Srq(s))
        }
        Command::ModifySrq { srq, limit } => {
            h.check_owned(h.srqs.contains(&srq), "shared receive queue")?;
            dev.modify_srq(srq, limit).map(|_| ReplyData::None)
        }
        Command::QuerySrq { srq } => {
            h.check_owned(h.srqs.contains(&srq), "shared receive queue")?;
            dev.query_srq(srq).map(ReplyData::SrqAttr)
        }
        Command::DestroySrq { srq } => {
            h.check_owned(h.srqs.contains(&srq), "shared receive queue")?;
            dev.destroy_srq(srq)?;
            h.srqs.retain(|s| *s != srq);
            Owners::set(&mut owners.srq, srq.0 as usize, NOBODY);
            h.uncharge_queue(QueueKind::Srq, srq.0);
            Ok(ReplyData::None)
        }
        Command::CreateQp { init } => {
            for (ok, what) in [
                (h.pds.contains(&init.pd), "protection domain"),
                (h.owns_cq(init.send_cq), "completion queue"),
                (h.owns_cq(init.recv_cq), "completion queue"),
                (
                    init.srq.is_none_or(|s| h.srqs.contains(&s)),
                    "shared receive queue",
                ),
            ] {
                h.check_owned(ok, what)?;
            }
            if h.qps.len() as u32 >= h.client_limits.max_qps {
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
            h.check_queue(qbytes)?;
            let q = dev.create_qp(&init)?;
            let slot = dev.qp_index(q).expect("just created");
            if slot >= h.limits.max_qp as usize {
                let _ = dev.destroy_qp(q);
                return Err(VerbsError::NoResources("queue pairs"));
            }
            h.charge_queue(QueueKind::Qp, q.value(), qbytes);
            h.qps.push(q);
            Owners::set(&mut owners.qp, slot, h.id);
            publish_qp(dev, h, q);
            Ok(ReplyData::Qp(q, slot as u32))
        }
        Command::ModifyQp { qpn, attr } => {
            h.check_owned(owns(dev, owners, h, qpn), "queue pair")?;
            // A Q_Key with the high bit is a privileged one (IBA 10.2.5: QP1's 0x80010000
            // among them): a QP holding it can speak to other hosts' management QPs, so
            // only a privileged client may set one (root; in-process clients own the
            // RNIC), as Linux asks CAP_NET_RAW for it (uverbs, since 6.5).
            if attr.qkey.is_some_and(|q| q.is_privileged()) && h.uid != 0 {
                return Err(VerbsError::PermissionDenied(format!(
                    "a privileged Q_Key ({:#x}) needs root",
                    attr.qkey.map_or(0, |q| q.0)
                )));
            }
            dev.modify_qp(qpn, &attr)?;
            publish_qp(dev, h, qpn);
            Ok(ReplyData::None)
        }
        Command::QueryQp { qpn } => {
            h.check_owned(owns(dev, owners, h, qpn), "queue pair")?;
            dev.query_qp(qpn).map(ReplyData::QpInfo)
        }
        Command::DestroyQp { qpn } => {
            h.check_owned(owns(dev, owners, h, qpn), "queue pair")?;
            let slot = dev.qp_index(qpn);
            dev.destroy_qp(qpn)?;
            h.qps.retain(|q| *q != qpn);
            if let Some(s) = slot {
                owners.release_qp(s);
            }
            h.uncharge_queue(QueueKind::Qp, qpn.value());
            Ok(ReplyData::None)
        }
        Command::Counters { qpn } => {
            let (devc, total) = dev.counters();
            let qc = match qpn {
                Some(q) => {
                    h.check_owned(owns(dev, owners, h, q), "queue pair")?;
                    dev.qp_counters(q)
                        .ok_or(VerbsError::NotFound("queue pair"))?
                }
                None => total,
            };
            let vals = qc
                .iter()
                .map(|(_, v)| v)
                .chain(devc.iter().map(|(_, v)| v))
                .chain(h.counters.values())
                .collect();
            Ok(ReplyData::Counters(vals))
        }
        Command::Close => {
            close(dev, owners, h, now);
            Ok(ReplyData::None)
        }
    }
}

/// Re-registers the client's MR `lkey` (`ReregMr`): its new memory, if any, is the client's
/// area, faulted in as at registration.
pub(super) fn rereg(
    dev: &mut Device,
    h: &HostEnd,
    lkey: Lkey,
    pd: Option<roce::memory::PdId>,
    translation: Option<ferroce_host::abi::Translation>,
    access: Option<roce::verbs::Access>,
) -> VerbsResult<(Lkey, Option<Rkey>)> {
    let mut area = None;
    let translation = match translation {
        None => None,
        Some(t) => {
            let mem = h.area(t.area)?;
            let mem_offset = usize::try_from(t.offset)
                .map_err(|_| VerbsError::InvalidArgument("offset too large".into()))?;
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
    let keys = dev.rereg_mr(lkey, change)?;
    if let Some((mem, off, len)) = area {
        populate_later(&mem, off, len);
    }
    Ok(keys)
}

/// Records the ring of the client's new CQ `cq` (destroying the CQ if the client's table
/// has no room for it).
pub(super) fn keep_cq_ring(
    dev: &mut Device,
    owners: &mut Owners,
    h: &mut HostEnd,
    cq: CqId,
    ring: Arc<Area>,
    capacity: u32,
) -> VerbsResult<()> {
    let entry = (Producer::attach(ring, capacity as usize), false);
    if h.cqs.insert_at(cq.0 as usize, entry).is_err() {
        let _ = dev.destroy_cq(cq);
        return Err(VerbsError::NoResources("completion queues"));
    }
    Owners::set(&mut owners.cq, cq.0 as usize, h.id);
    Ok(())
}

/// Forgets the client's destroyed CQ `cq`; returns its ring.
pub(super) fn forget_cq(
    owners: &mut Owners,
    h: &mut HostEnd,
    cq: CqId,
) -> Option<Producer<CqeSlot>> {
    h.pending_cqs.retain(|c| *c != cq);
    Owners::set(&mut owners.cq, cq.0 as usize, NOBODY);
    h.cqs.remove(cq.0 as usize).map(|(p, _)| p)
}

/// Releases a key the client holds (an MR or a window, found by its table index: a key
/// another client could guess is refused as not found) with `release`, then forgets it.
fn release_key<K: Copy>(
    keys: &mut Vec<K>,
    index: u32,
    index_of: fn(K) -> u32,
    what: &'static str,
    release: impl FnOnce() -> VerbsResult<()>,
) -> VerbsResult<ReplyData> {
    if !keys.iter().any(|&k| index_of(k) == index) {
        return Err(VerbsError::NotFound(what));
    }
    release()?;
    keys.retain(|&k| index_of(k) != index);
    Ok(ReplyData::None)
}

/// Client `h` no longer holds rdma_cm connection `id` (it is gone, or the client gave it
/// up): neither its list nor the owners table names it, so no later event reaches it.
fn release_conn(owners: &mut Owners, h: &mut HostEnd, id: u32) {
    h.cm_ids.retain(|c| *c != id);
    owners.cm_conns.remove(&id);
}

/// The connection manager's refusals as verbs errors (rdma_cm reports them as errnos).
fn cm_error(call: &str, e: CmError) -> VerbsError {
    match e {
        CmError::NotFound => VerbsError::NotFound("rdma_cm connection"),
        CmError::WrongState => {
            VerbsError::InvalidArgument(format!("{call}: the connection is not in a state for it"))
        }
        CmError::Busy => VerbsError::NoResources("rdma_cm connections"),
        CmError::TooLong => VerbsError::InvalidArgument(format!("{call}: private data too long")),
    }
}

/// Refuses a new connection or SIDR request of client `h` past its limit (one per QP it may
/// hold) or from a GID that is not the device's.
fn check_new_request(
    dev: &Device,
    h: &HostEnd,
    local: &roce::types::Gid,
    call: &str,
) -> VerbsResult<()> {
    if h.cm_ids.len() as u32 >= h.client_limits.max_qps {
        return Err(VerbsError::NoResources(
            "rdma_cm connections (host.max_qps)",
        ));
    }
    if !dev.gids().contains(local) {
        return Err(VerbsError::InvalidArgument(format!(
            "{call}: the local GID is not the device's"
        )));
    }
    Ok(())
}

/// Records the connection (or SIDR request) the agent opened for client `h`.
fn opened(
    owners: &mut Owners,
    h: &mut HostEnd,
    r: Result<ConnId, CmError>,
    call: &str,
) -> VerbsResult<ReplyData> {
    let id = r.map_err(|e| cm_error(call, e))?;
    h.cm_ids.push(id.0);
    owners.cm_conns.insert(id.0, h.id);
    Ok(ReplyData::CmId(id.0))
}

/// Executes an rdma_cm call of client `h`: the connection it names must be its own.
fn execute_cm(
    dev: &mut Device,
    owners: &mut Owners,
    h: &mut HostEnd,
    now: u64,
    cmd: Command,
) -> VerbsResult<ReplyData> {
    let own = |h: &HostEnd, id: u32| h.check_owned(h.cm_ids.contains(&id), "rdma_cm connection");
    let none =
        |r: Result<(), CmError>, call| r.map(|_| ReplyData::None).map_err(|e| cm_error(call, e));
    match cmd {
        Command::CmListen { service_id } => {
            if h.cm_listens.len() >= MAX_CM_LISTENS {
                return Err(VerbsError::NoResources("rdma_cm listens per client"));
            }
            dev.cm()
                .listen(service_id)
                .map_err(|_| VerbsError::Busy("service ID"))?;
            if !owners.add_listener(service_id, h.id) {
                dev.cm().unlisten(service_id);
                return Err(VerbsError::Busy("service ID"));
            }
            h.cm_listens.push(service_id);
            Ok(ReplyData::None)
        }
        Command::CmUnlisten { service_id } => {
            h.check_owned(h.cm_listens.contains(&service_id), "rdma_cm listen")?;
            dev.cm().unlisten(service_id);
            h.cm_listens.retain(|s| *s != service_id);
            owners.remove_listener(service_id);
            Ok(ReplyData::None)
        }
        Command::CmConnect { params } => {
            h.check_owned(
                owns_anywhere(dev, owners, h, Qpn::new(params.qpn)),
                "queue pair",
            )?;
            check_new_request(dev, h, &params.local_gid, "cm_connect")?;
            let r = dev.cm().connect(now, &params);
            opened(owners, h, r, "cm_connect")
        }
        Command::CmAccept { id, params } => {
            own(h, id)?;
            h.check_owned(
                owns_anywhere(dev, owners, h, Qpn::new(params.qpn)),
                "queue pair",
            )?;
            none(dev.cm().accept(now, ConnId(id), &params), "cm_accept")
        }
        Command::CmReject { id, private_data } => {
            own(h, id)?;
            let r = dev
                .cm()
                .reject(ConnId(id), reason::CONSUMER_DEFINED, &private_data);
            if r.is_ok() {
                // The connection is gone: no event will name it again.
                release_conn(owners, h, id);
            }
            none(r, "cm_reject")
        }
        Command::CmRtu { id } => {
            own(h, id)?;
            none(dev.cm().rtu(ConnId(id)), "cm_rtu")
        }
        Command::CmEstablished { id } => {
            own(h, id)?;
            none(dev.cm().established(ConnId(id)), "cm_established")
        }
        Command::CmDisconnect { id } => {
            own(h, id)?;
            none(dev.cm().disconnect(now, ConnId(id)), "cm_disconnect")
        }
        Command::CmDestroy { id } => {
            own(h, id)?;
            let r = dev.cm().destroy(now, ConnId(id));
            // Its events stop here: an ID the client destroyed is named by none.
            release_conn(owners, h, id);
            h.cm_events.retain(|e| e.id() != id);
            none(r, "cm_destroy")
        }
        Command::CmGetEvent => Ok(ReplyData::CmEvent(h.cm_events.pop_front())),
        Command::CmSidrRequest { params } => {
            check_new_request(dev, h, &params.local_gid, "cm_sidr_request")?;
            let r = dev.cm().sidr_request(now, &params);
            opened(owners, h, r, "cm_sidr_request")
        }
        Command::CmSidrReply {
            id,
            status,
            qpn,
            qkey,
            private_data,
        } => {
            own(h, id)?;
            if status == SIDR_VALID {
                h.check_owned(owns_anywhere(dev, owners, h, Qpn::new(qpn)), "queue pair")?;
            }
            let r = dev
                .cm()
                .sidr_reply(ConnId(id), status, qpn, qkey, &private_data);
            if r.is_ok() {
                // Answered: the request is gone.
                release_conn(owners, h, id);
            }
            none(r, "cm_sidr_reply")
        }
        _ => unreachable!("execute hands only rdma_cm calls here"),
    }
}

/// The connection manager's event as a client receives it.
fn cm_event_data(ev: &CmEvent) -> CmEventData {
    match *ev {
        CmEvent::ConnectRequest { id, peer, req } => CmEventData::ConnectRequest {
            id: id.0,
            service_id: req.service_id,
            peer,
            local: req.primary.remote_gid,
            qpn: Qpn::new(req.local_qpn),
            starting_psn: req.starting_psn,
            responder_resources: req.responder_resources,
            initiator_depth: req.initiator_depth,
            path_mtu: req.path_mtu,
            retry_count: req.retry_count,
            rnr_retry_count: req.rnr_retry_count,
            private_data: req.private_data.0.to_vec(),
        },
        CmEvent::RepReceived { id, rep } => CmEventData::RepReceived {
            id: id.0,
            qpn: Qpn::new(rep.local_qpn),
            starting_psn: rep.starting_psn,
            responder_resources: rep.responder_resources,
            initiator_depth: rep.initiator_depth,
            rnr_retry_count: rep.rnr_retry_count,
            private_data: rep.private_data.0.to_vec(),
        },
        CmEvent::Established { id } => CmEventData::Established { id: id.0 },
        CmEvent::Rejected {
            id,
            reason,
            private_data,
        } => CmEventData::Rejected {
            id: id.0,
            reason,
            private_data: private_data.0.to_vec(),
        },
        CmEvent::TimedOut { id } => CmEventData::TimedOut { id: id.0 },
        CmEvent::Disconnected { id } => CmEventData::Disconnected { id: id.0 },
        CmEvent::Released { id } => CmEventData::Released { id: id.0 },
        CmEvent::SidrRequest {
            id,
            peer,
            local,
            req,
        } => CmEventData::SidrRequest {
            id: id.0,
            service_id: req.service_id,
            peer,
            local,
            private_data: req.private_data.0.to_vec(),
        },
        CmEvent::SidrReply { id, rep } => CmEventData::SidrReply {
            id: id.0,
            status: rep.status,
            qpn: Qpn::new(rep.qpn),
            qkey: rep.qkey,
            private_data: rep.private_data.0.to_vec(),
        },
    }
}

impl Nic {
    /// Routes the connection manager's events to the clients they concern: a connect
    /// request to the client listening to its service ID (which then owns the connection;
    /// refused if nobody listens any more or the client has no room), the rest to the
    /// connection's owner. Returns how many were delivered.
    pub(super) fn route_cm_events(&mut self) -> usize {
        let mut n = 0;
        while let Some(ev) = self.dev.cm().poll_event() {
            let data = cm_event_data(&ev);
            let id = data.id();
            // A connect or SIDR request goes to the listener of its service.
            let requested = match &ev {
                CmEvent::ConnectRequest { req, .. } => Some(req.service_id),
                CmEvent::SidrRequest { req, .. } => Some(req.service_id),
                _ => None,
            };
            let owner = match requested {
                Some(sid) => {
                    let owner = self.owners.cm_listeners.get(&sid).copied();
                    let room = owner
                        .and_then(|o| self.hosts.get(o as usize))
                        .is_some_and(|h| {
                            h.cm_events.len() < MAX_CM_EVENTS
                                && (h.cm_ids.len() as u32) < h.client_limits.max_qps
                        });
                    if !room {
                        let r = if owner.is_some() {
                            reason::NO_RESOURCES
                        } else {
                            reason::INVALID_SERVICE_ID
                        };
                        let _ = self.dev.cm().reject(ConnId(id), r, &[]);
                        continue;
                    }
                    if let Some(h) = owner.and_then(|o| self.hosts.get_mut(o as usize)) {
                        h.cm_ids.push(id);
                    }
                    if let Some(o) = owner {
                        self.owners.cm_conns.insert(id, o);
                    }
                    owner
                }
                None => self.owners.cm_conns.get(&id).copied(),
            };
            let done = matches!(
                ev,
                CmEvent::Rejected { .. }
                    | CmEvent::TimedOut { .. }
                    | CmEvent::Released { .. }
                    | CmEvent::SidrReply { .. }
            );
            let Some(h) = owner.and_then(|o| self.hosts.get_mut(o as usize)) else {
                // The REP of a REQ whose client is gone (it went while the REQ was out):
                // rejected, as the kernel's CM does for an ID destroyed in REQ_SENT, so the
                // peer does not retry its REP for a minute.
                if matches!(ev, CmEvent::RepReceived { .. }) {
                    let _ = self
                        .dev
                        .cm()
                        .reject(ConnId(id), reason::CONSUMER_DEFINED, &[]);
                }
                continue;
            };
            if done {
                release_conn(&mut self.owners, h, id);
            }
            if h.cm_events.len() >= MAX_CM_EVENTS {
                h.counters.events_dropped += 1;
                continue;
            }
            h.cm_events.push_back(data);
            n += 1;
        }
        n
    }
}

/// Whether the live QP `qpn` is client `id`'s, in O(1) through [`Owners`]: the check of
/// every post and every call naming a QP (QP numbers are small and guessable; a client's
/// list of its QPs would make each check grow with its QPs).
fn owns_id(dev: &Device, owners: &Owners, id: usize, qpn: Qpn) -> bool {
    dev.qp_index(qpn).and_then(|s| owners.qp(s)) == Some(id)
}

/// [`owns_id`] for client `h`.
fn owns(dev: &Device, owners: &Owners, h: &HostEnd, qpn: Qpn) -> bool {
    owns_id(dev, owners, h.id as usize, qpn)
}

/// [`owns`], or (a spread context's home) one of the client's QPs on another worker: what
/// rdma_cm names. Its connection manager carries only the QP's number in its messages (the
/// client brings the QP up itself), so the home's agent serves QPs on every worker.
fn owns_anywhere(dev: &Device, owners: &Owners, h: &HostEnd, qpn: Qpn) -> bool {
    owns(dev, owners, h, qpn) || h.remote_qps().is_some_and(|r| r.contains_key(&qpn))
}
