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
use ferroce_host::abi::{Command, PortAttrData, ReplyData, POST_RING};
use roce::engine::{CqId, Device, DeviceAttr, DeviceEvent, SrqId, VerbsError, VerbsResult};
use roce::types::Qpn;
use roce::verbs::{AsyncEvent, QpAttr, QpState, RecvWr, SendWr};

use super::Nic;
use crate::host::{populate_later, HostEnd, Owners, QueueKind, NOBODY};

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
    /// client that breaks the protocol (a slot that does not decode, corrupted ring indices)
    /// gets the device-fatal event and is closed, its objects released.
    pub(super) fn serve_posts(&mut self, id: usize, budget: usize) -> usize {
        let mut n = 0;
        while n < budget {
            let Some(h) = self.hosts.get_mut(id) else {
                break;
            };
            let Some(next) = h.next_post() else { break };
            n += 1;
            match next {
                Ok(post) => self.execute_post(id, post),
                Err(e) => {
                    h.counters.bad_slots += 1;
                    tracing::warn!(client = %h.label, error = %e, "closing the client");
                    h.deliver_event(&AsyncEvent::DeviceFatal);
                    close(&mut self.dev, &mut self.owners, h);
                    break;
                }
            }
        }
        n
    }

    /// Whether the live QP `qpn` is client `id`'s, in O(1) through [`Owners`]: the check of
    /// every post (QP numbers are small and guessable).
    fn owns_qp(&self, id: usize, qpn: Qpn) -> bool {
        self.dev.qp_index(qpn).and_then(|s| self.owners.qp(s)) == Some(id)
    }

    /// Applies one decoded post of client `id`. A post the device refuses on arrival (the
    /// QP went to the error state, its queue is full) completes in order with LOC_QP_OP_ERR
    /// and frees its queue place when it retires: the application counted it as posted. A
    /// post naming another client's object is counted and dropped.
    fn execute_post(&mut self, id: usize, post: Post) {
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
            Post::Recv {
                qpn,
                wr_id,
                nsge,
                sges,
            } => {
                let own = self.owns_qp(id, qpn);
                let r = if own {
                    let wr = RecvWr {
                        wr_id,
                        sg_list: &sges[..nsge],
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
            Post::SrqRecv {
                srq,
                wr_id,
                nsge,
                sges,
            } => {
                let srq = SrqId(srq);
                // No QP to complete a refused one on: counted (the application checked
                // fullness before posting, so this means the SRQ went away meanwhile).
                if self.owners.srq(srq) == Some(id) {
                    let wr = RecvWr {
                        wr_id,
                        sg_list: &sges[..nsge],
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
        execute(&mut self.dev, &mut self.owners, h, cmd, area)
    }

    /// Releases everything client `id` created (its process died or it closed the context).
    pub(super) fn release_host(&mut self, id: usize) {
        if let Some(h) = self.hosts.get_mut(id) {
            close(&mut self.dev, &mut self.owners, h);
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
fn close(dev: &mut Device, owners: &mut Owners, h: &mut HostEnd) {
    let held = h.release_all();
    for q in held.qps {
        if let Some(s) = dev.qp_index(q) {
            Owners::set(&mut owners.qp, s, NOBODY);
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
    cmd: Command,
    area: Option<Arc<Area>>,
) -> VerbsResult<ReplyData> {
    match cmd {
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
            let mut area = None;
            let translation = match translation {
                None => None,
                Some(t) => {
                    let mem = h.area(t.area)?;
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
            h.check_owned(h.pds.contains(&pd), "protection domain")?;
            h.check_mr_room()?;
            let k = dev.alloc_mw(pd, ty)?;
            h.mws.push(k);
            Ok(ReplyData::Mw(k))
        }
        Command::DeallocMw { rkey } => {
            let owned = h.mws.iter().any(|k| k.index() == rkey.index());
            h.check_owned(owned, "memory window")?;
            dev.dealloc_mw(rkey)?;
            h.mws.retain(|k| k.index() != rkey.index());
            Ok(ReplyData::None)
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
            let owned = h.mrs.iter().any(|k| k.index() == lkey.index());
            h.check_owned(owned, "memory region")?;
            dev.dereg_mr(lkey)?;
            h.mrs.retain(|k| k.index() != lkey.index());
            Ok(ReplyData::None)
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
            let entry = (Producer::attach(ring, capacity as usize), false);
            if h.cqs.insert_at(cq.0 as usize, entry).is_err() {
                let _ = dev.destroy_cq(cq);
                h.area_bytes -= ring_len;
                return Err(VerbsError::NoResources("completion queues"));
            }
            Owners::set(&mut owners.cq, cq.0 as usize, h.id);
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
            let size = dev.resize_cq(cq, cqe)?;
            h.uncharge_queue(QueueKind::Cq, cq.0);
            h.charge_queue(QueueKind::Cq, cq.0, new);
            Ok(ReplyData::Cqe(size))
        }
        Command::DestroyCq { cq } => {
            h.check_owned(h.owns_cq(cq), "completion queue")?;
            dev.destroy_cq(cq)?;
            if let Some((p, _)) = h.cqs.remove(cq.0 as usize) {
                h.area_bytes -= p.area().len() as u64;
            }
            h.pending_cqs.retain(|c| *c != cq);
            Owners::set(&mut owners.cq, cq.0 as usize, NOBODY);
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
            let s = dev.create_srq(pd, &attr)?;
            if s.0 >= h.limits.max_srq {
                let _ = dev.destroy_srq(s);
                return Err(VerbsError::NoResources("shared receive queues"));
            }
            h.charge_queue(QueueKind::Srq, s.0, qbytes);
            h.srqs.push(s);
            Owners::set(&mut owners.srq, s.0 as usize, h.id);
            publish_srq(dev, h, s);
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
            h.check_owned(h.qps.contains(&qpn), "queue pair")?;
            dev.modify_qp(qpn, &attr)?;
            publish_qp(dev, h, qpn);
            Ok(ReplyData::None)
        }
        Command::QueryQp { qpn } => {
            h.check_owned(h.qps.contains(&qpn), "queue pair")?;
            dev.query_qp(qpn).map(ReplyData::QpInfo)
        }
        Command::DestroyQp { qpn } => {
            h.check_owned(h.qps.contains(&qpn), "queue pair")?;
            let slot = dev.qp_index(qpn);
            dev.destroy_qp(qpn)?;
            h.qps.retain(|q| *q != qpn);
            if let Some(s) = slot {
                Owners::set(&mut owners.qp, s, NOBODY);
            }
            h.uncharge_queue(QueueKind::Qp, qpn.value());
            Ok(ReplyData::None)
        }
        Command::Counters { qpn } => {
            let (devc, total) = dev.counters();
            let qc = match qpn {
                Some(q) => {
                    h.check_owned(h.qps.contains(&q), "queue pair")?;
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
            close(dev, owners, h);
            Ok(ReplyData::None)
        }
    }
}
