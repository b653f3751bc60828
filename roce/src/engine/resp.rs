//! Responder: executes incoming requests and produces ACKs, NAKs, READ responses and ATOMIC
//! acknowledgements (rxe_resp.c's role).
//!
//! RC requests are checked in the spec's order (IBA 9.7.5.1; rxe's responder states): PSN,
//! operation sequence, operation allowed on the QP, resources (receive WQE, responder
//! resources), length, R_Key, then execution. Errors are handled by class:
//! * PSN ahead: one PSN-sequence-error NAK per gap, then silence until the expected PSN;
//! * PSN behind: duplicate, re-ACK / re-read / replay the saved ATOMIC result;
//! * no receive WQE for a SEND: RNR NAK with the QP's min_rnr_timer (class B);
//! * invalid request, remote access, remote operational errors: NAK, complete the receive WQE
//!   in progress with the error, move the QP to ERR (class C).
//!
//! UC drops a broken message and resumes at the next FIRST/ONLY; UD checks the Q_Key and
//! writes the 40-byte GRH before the payload. Neither sends ACKs.

use super::qp::{InMsg, Qp, RdAtomicRes, ResKind, RespItem, RespState};
use super::req::read_pkts;
use super::transmit::{PayloadSeg, Transmit};
use super::{scatter, scatter_bytes, CreditMode, Pkt, Shared};
use crate::memory::MrRef;
use crate::types::Psn;
use crate::verbs::{Access, AsyncEvent, Completion, QpType, WcFlags, WcOpcode, WcStatus};
use crate::wire::aeth::{credits_to_code, AethRepr, NakCode, CREDITS_INVALID};
use crate::wire::atomic_ack_eth::AtomicAckEthRepr;
use crate::wire::bth::BthRepr;
use crate::wire::frame::TransportRepr;
use crate::wire::opcode::{Opcode, Operation};
use crate::wire::reth::RethRepr;

/// Largest RDMA message (IBA: 2^31 bytes).
const MAX_MSG: u32 = 1 << 31;

/// Why the responder rejected an RC request (its NAK and the receive WQE's status).
#[derive(Debug, Clone, Copy)]
struct Reject {
    nak: NakCode,
    recv_status: WcStatus,
    event: Option<fn(crate::types::Qpn) -> AsyncEvent>,
}

const INVALID: Reject = Reject {
    nak: NakCode::InvalidRequest,
    recv_status: WcStatus::RemInvReqErr,
    event: Some(AsyncEvent::QpRequestError),
};
const ACCESS: Reject = Reject {
    nak: NakCode::RemoteAccessError,
    recv_status: WcStatus::RemAccessErr,
    event: Some(AsyncEvent::QpAccessError),
};

impl Qp {
    /// Handles a request packet addressed to this QP.
    pub(crate) fn handle_request(&mut self, sh: &mut Shared, now: u64, pkt: &Pkt<'_>) {
        let _ = now;
        if !self.can_receive() {
            self.counters.rx_dropped_state += 1;
            tracing::trace!(qpn = ?self.qpn, state = ?self.state, "request dropped: QP state");
            return;
        }
        self.counters.rcvd_pkts += 1;
        match self.qp_type {
            QpType::Rc => self.rc_request(sh, pkt),
            QpType::Uc => self.uc_request(sh, pkt),
            QpType::Ud => self.ud_request(sh, pkt),
        }
    }

    /// The credit field of an ACK: receive WQEs available (IBA 9.7.7.2), or "invalid" with an
    /// SRQ or when configured like rxe.
    fn credit_code(&self, sh: &Shared) -> u8 {
        if self.srq.is_some() || sh.cfg.credits == CreditMode::Unlimited {
            CREDITS_INVALID
        } else {
            credits_to_code(self.rq.len() as u32)
        }
    }

    /// Queues an ACK for `psn`, merging it with an ACK already waiting (coalescing).
    fn queue_ack(&mut self, sh: &Shared, psn: Psn) {
        let aeth = AethRepr::ack(self.credit_code(sh), self.resp.msn);
        if let Some(RespItem::Ack { psn: p, aeth: a }) = self.resp.out.back_mut() {
            if a.is_ack() && sh.cfg.coalesce_acks {
                (*p, *a) = (psn, aeth);
                return;
            }
        }
        self.push_ack(RespItem::Ack { psn, aeth });
    }

    fn queue_nak(&mut self, psn: Psn, code: NakCode) {
        self.counters.naks_sent += 1;
        tracing::debug!(qpn = ?self.qpn, ?psn, ?code, "NAK sent");
        let aeth = AethRepr::nak(code, self.resp.msn);
        self.push_ack(RespItem::Ack { psn, aeth });
    }

    /// The SEND, WRITE or ATOMIC packet at `psn` was executed: the next is expected, and a
    /// duplicate is acknowledged with this one (`RespState::ack_psn`).
    fn executed(&mut self, psn: Psn) {
        self.resp.epsn = psn.next();
        self.resp.ack_psn = self.resp.epsn;
    }

    fn queue_rnr_nak(&mut self, psn: Psn) {
        self.counters.send_rnr_err += 1;
        tracing::debug!(qpn = ?self.qpn, ?psn, "RNR NAK sent: no receive WQE");
        let timer = self.attr.min_rnr_timer.unwrap_or(0);
        let aeth = AethRepr::rnr_nak(timer, self.resp.msn);
        self.push_ack(RespItem::Ack { psn, aeth });
        // The requester resends from this PSN after its RNR wait: the packets it already
        // sent behind it earn no sequence error NAK meanwhile (IBA 9.7.5.2.8: after an RNR
        // NAK only a request at the expected PSN is answered), which would start a
        // go-back-N retry at once and spend its retry count past the RNR back-off.
        self.resp.nak_sent = true;
    }

    /// Queues an ACK/NAK item unless the same one is already last in line (a repeated
    /// request earns one answer, not one each) or `OUT_LIMIT` ACK/NAKs are waiting.
    fn push_ack(&mut self, item: RespItem) {
        if self.resp.out.back() == Some(&item) {
            return;
        }
        let acks = self.resp.out.len() - self.resp_items_queued();
        if acks >= RespState::OUT_LIMIT {
            self.counters.resp_acks_dropped += 1;
            return;
        }
        self.resp.out.push_back(item);
    }

    /// How many READ/ATOMIC replies are in the output queue.
    fn resp_items_queued(&self) -> usize {
        self.resp.resources.iter().filter(|r| r.queued).count()
    }

    /// Class C error: NAK, complete the receive WQE in progress with the error, event, ERR.
    fn reject(&mut self, sh: &mut Shared, psn: Psn, r: Reject) {
        match r.nak {
            NakCode::RemoteAccessError => self.counters.resp_remote_access_errors += 1,
            NakCode::InvalidRequest => self.counters.resp_remote_invalid_request += 1,
            _ => {}
        }
        self.queue_nak(psn, r.nak);
        self.fail_recv(sh, r.recv_status);
        if let Some(ev) = r.event {
            sh.events.push_back(ev(self.qpn));
        }
        self.resp.in_msg = InMsg::None;
        self.enter_error(sh);
    }

    /// Scatters a SEND packet's payload into the receive WQE in progress, at its offset.
    fn scatter_recv(&self, sh: &Shared, pkt: &Pkt<'_>) -> Result<(), WcStatus> {
        scatter(
            &sh.mrs,
            self.pd,
            &self.resp.recv_sges,
            self.resp.recv_offset as u64,
            pkt,
        )
    }

    /// Completes the receive WQE in progress (if any) with the error `status` and lets go of
    /// it.
    fn fail_recv(&mut self, sh: &mut Shared, status: WcStatus) {
        if self.resp.have_recv {
            self.resp.have_recv = false;
            let c = self.recv_completion(
                self.resp.recv_wr_id,
                status,
                WcOpcode::Recv,
                self.resp.recv_offset,
            );
            sh.complete(self.recv_cq, c);
        }
    }

    /// Takes the next receive WQE (from the SRQ if the QP has one). False if none.
    fn take_recv(&mut self, sh: &mut Shared) -> bool {
        let wr_id = match self.srq {
            Some(s) => sh.srq_pop(s, &mut self.resp.recv_sges),
            None => self.rq.pop_into(&mut self.resp.recv_sges),
        };
        match wr_id {
            Some(id) => {
                self.resp.recv_wr_id = id;
                self.resp.recv_offset = 0;
                self.resp.have_recv = true;
                true
            }
            None => false,
        }
    }

    /// What the current receive WQE takes: its SGEs' total, but never more than the
    /// largest message (2^31 bytes, `max_msg_sz`, which the send side enforces in
    /// `check_send`): a WQE with more room (up to 16 SGEs of 4 GiB) must not let a peer's
    /// SEND run past it, which would also overflow the 32-bit offset into the WQE.
    fn recv_capacity(&self) -> u64 {
        let sum: u64 = self.resp.recv_sges.iter().map(|s| s.length as u64).sum();
        sum.min(MAX_MSG as u64)
    }

    fn rc_request(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        let info = pkt.info;
        // 1. PSN (IBA 9.7.5.1.2).
        let d = psn.diff(self.resp.epsn);
        if d > 0 {
            self.counters.out_of_sequence += 1;
            self.counters.out_of_seq_request += 1;
            if !self.resp.nak_sent {
                self.resp.nak_sent = true;
                let epsn = self.resp.epsn;
                self.queue_nak(epsn, NakCode::PsnSequenceError);
            }
            return;
        }
        if d < 0 {
            self.counters.duplicate_request += 1;
            self.rc_duplicate(sh, pkt);
            return;
        }
        self.resp.nak_sent = false;
        // 2. Operation sequence (IBA 9.7.5.1.7).
        let seq_ok = match self.resp.in_msg {
            InMsg::Send => info.op == Operation::Send && !info.first,
            InMsg::Write => info.op == Operation::Write && !info.first,
            InMsg::None => info.first,
        };
        if !seq_ok {
            self.reject(sh, psn, INVALID);
            return;
        }
        // 3. Operation allowed on this QP (rxe: RESPST_ERR_UNSUPPORTED_OPCODE, class C).
        let access = self.access();
        let allowed = match info.op {
            Operation::Send => true,
            Operation::Write => access.contains(Access::REMOTE_WRITE),
            Operation::ReadRequest => access.contains(Access::REMOTE_READ),
            Operation::CompareSwap | Operation::FetchAdd => access.contains(Access::REMOTE_ATOMIC),
            _ => false,
        };
        if !allowed {
            self.reject(sh, psn, INVALID);
            return;
        }
        match info.op {
            Operation::Send => self.rc_send(sh, pkt),
            Operation::Write => self.rc_write(sh, pkt),
            Operation::ReadRequest => self.rc_read(sh, pkt),
            _ => self.rc_atomic(sh, pkt),
        }
    }

    /// Length rules shared by SEND and WRITE packets (IBA 9.7.5.1.4): no more than the path
    /// MTU; FIRST and MIDDLE exactly the MTU.
    fn bad_packet_length(&self, pkt: &Pkt<'_>) -> bool {
        let mtu = self.mtu() as usize;
        let info = pkt.info;
        // A LAST carries 1..=MTU bytes (C9-92; rxe's check_length): a message whose
        // length is a multiple of the MTU ends with a full LAST, never an empty one.
        pkt.payload_len > mtu
            || (!info.last && pkt.payload_len != mtu)
            || (info.last && !info.first && pkt.payload_len == 0)
    }

    fn rc_send(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        let info = pkt.info;
        if info.first {
            self.counters.rx_send_requests += 1;
            // 4. Resources: a receive WQE, else RNR NAK (class B; IBA 9.7.5.1.5).
            if !self.resp.have_recv && !self.take_recv(sh) {
                self.queue_rnr_nak(psn);
                return;
            }
        }
        // 5. Length.
        if self.bad_packet_length(pkt) {
            self.reject(sh, psn, INVALID);
            return;
        }
        if self.resp.recv_offset as u64 + pkt.payload_len as u64 > self.recv_capacity() {
            self.counters.resp_local_length_error += 1;
            self.reject(
                sh,
                psn,
                Reject {
                    nak: NakCode::InvalidRequest,
                    recv_status: WcStatus::LocLenErr,
                    event: None,
                },
            );
            return;
        }
        // 7. Execute: scatter into the receive WQE.
        if let Err(status) = self.scatter_recv(sh, pkt) {
            self.reject(
                sh,
                psn,
                Reject {
                    nak: NakCode::RemoteOperationalError,
                    recv_status: status,
                    event: None,
                },
            );
            return;
        }
        self.resp.recv_offset += pkt.payload_len as u32;
        self.executed(psn);
        if info.last {
            let invalidated = match pkt.ext.ieth {
                Some(ieth)
                    if sh.invalidate(ieth.rkey.0, self.pd, Some(self.qpn)) != WcStatus::Success =>
                {
                    // rxe: RESPST_ERR_INVALIDATE_RKEY (class J).
                    self.reject(sh, psn, INVALID);
                    return;
                }
                other => other.map(|i| i.rkey.0),
            };
            let mut c = self.finish_recv_message(pkt, WcOpcode::Recv, self.resp.recv_offset);
            if let Some(rkey) = invalidated {
                c.invalidated_rkey = rkey;
                c.wc_flags.insert(WcFlags::WITH_INV);
            }
            sh.complete(self.recv_cq, c);
        } else {
            self.resp.in_msg = InMsg::Send;
        }
        if pkt.bth.ack_req {
            self.queue_ack(sh, psn);
        }
    }

    fn rc_write(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        let info = pkt.info;
        if self.bad_packet_length(pkt) {
            self.reject(sh, psn, INVALID);
            return;
        }
        if info.first {
            self.counters.rx_write_requests += 1;
            let reth = pkt.ext.reth.expect("WRITE FIRST/ONLY carries a RETH");
            if reth.len > MAX_MSG {
                self.reject(sh, psn, INVALID);
                return;
            }
            // 6. R_Key.
            if !self.begin_write(sh, reth) {
                self.reject(sh, psn, ACCESS);
                return;
            }
        }
        // Length against the RETH: never more than announced, and exactly all at the end.
        let n = pkt.payload_len as u32;
        if n > self.resp.write_left || (info.last && n != self.resp.write_left) {
            self.reject(sh, psn, INVALID);
            return;
        }
        // WRITE with immediate consumes a receive WQE on its last packet.
        if info.last && info.has_imm && !self.resp.have_recv && !self.take_recv(sh) {
            self.queue_rnr_nak(psn);
            return;
        }
        if !self.place_write(sh, pkt) {
            self.reject(sh, psn, ACCESS);
            return;
        }
        self.executed(psn);
        self.end_write_packet(sh, pkt);
        if pkt.bth.ack_req {
            self.queue_ack(sh, psn);
        }
    }

    /// WRITE FIRST/ONLY (RC and UC): checks the R_Key over the announced range - a zero-length
    /// WRITE is not checked (IBA 9.4.2: rkey ignored) - and starts the message. False: the
    /// access is not allowed.
    fn begin_write(&mut self, sh: &Shared, reth: RethRepr) -> bool {
        if reth.len > 0 {
            match sh.mrs.check_remote(
                reth.rkey,
                self.pd,
                self.qpn,
                reth.va,
                reth.len as u64,
                Access::REMOTE_WRITE,
            ) {
                Ok((mr, off)) => {
                    self.resp.write_mr = mr.as_ref();
                    self.resp.write_mem_offset = off;
                }
                Err(_) => return false,
            }
        }
        self.resp.write_left = reth.len;
        self.resp.write_total = reth.len;
        true
    }

    /// Places a WRITE packet's payload after what the message wrote so far. False: the
    /// registration the FIRST packet was checked against is gone (deregistered, invalidated,
    /// re-bound), whatever now holds its key, or the range is outside it. Every packet
    /// resolves the registration again, with the QP's PD: a key that came back for another
    /// MR - of this or any other protection domain - never receives the rest of a message.
    fn place_write(&self, sh: &Shared, pkt: &Pkt<'_>) -> bool {
        if pkt.payload_len == 0 {
            return true;
        }
        let done = self.resp.write_total - self.resp.write_left;
        match sh.mrs.resolve(self.resp.write_mr, self.pd) {
            Some(mr) => pkt
                .write_payload(&*mr.mem, self.resp.write_mem_offset + done as usize)
                .is_ok(),
            None => false,
        }
    }

    /// Accounts a placed WRITE packet: on the last one the message ends and a WRITE with
    /// immediate completes the receive WQE it took; otherwise the message continues.
    fn end_write_packet(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        self.resp.write_left -= pkt.payload_len as u32;
        if !pkt.info.last {
            self.resp.in_msg = InMsg::Write;
            return;
        }
        if pkt.ext.imm.is_some() {
            let total = self.resp.write_total;
            let c = self.finish_recv_message(pkt, WcOpcode::RecvRdmaWithImm, total);
            sh.complete(self.recv_cq, c);
        } else {
            self.resp.in_msg = InMsg::None;
            self.resp.msn = self.resp.msn.next();
        }
    }

    /// Ends a message that consumed a receive WQE (SEND, WRITE with immediate; RC and UC):
    /// the WQE's successful completion with the message's immediate data and solicited bit,
    /// the WQE released, the MSN advanced. One place, so RC and UC cannot drift apart.
    fn finish_recv_message(&mut self, pkt: &Pkt<'_>, opcode: WcOpcode, len: u32) -> Completion {
        let mut c = self.recv_completion(self.resp.recv_wr_id, WcStatus::Success, opcode, len);
        // Every RoCE packet carries a GRH (its IP header stands for it): rxe flags it on each
        // successful receive, RC and UC as UD (do_complete); only UD's buffer holds it.
        c.wc_flags.insert(WcFlags::GRH);
        if let Some(imm) = pkt.ext.imm {
            c.imm_data = imm.imm;
            c.wc_flags.insert(WcFlags::WITH_IMM);
        }
        c.solicited = pkt.bth.se;
        self.resp.have_recv = false;
        self.resp.in_msg = InMsg::None;
        self.resp.msn = self.resp.msn.next();
        c
    }

    /// Takes the oldest responder resource for a new READ/ATOMIC and queues its reply.
    /// None: the oldest resource's first reply is still being sent, so the requester has more
    /// READ/ATOMIC outstanding than the `max_dest_rd_atomic` it was given (a compliant
    /// requester cannot: its oldest READ/ATOMIC completes only after the whole reply was
    /// sent). A replay queued for a duplicate of the oldest does not hold the slot: a new
    /// request means the requester completed that one (the link may deliver a copy of an old
    /// request late, and the requester has moved on), so the replay is abandoned.
    fn take_resource(&mut self, kind: ResKind, psn: Psn, npkts: u32) -> Option<usize> {
        let n = self.resp.resources.len();
        if n == 0 {
            return None;
        }
        if self.oldest_resource_busy() {
            return None;
        }
        let slot = self.resp.res_head;
        let r = &mut self.resp.resources[slot];
        self.resp.res_head = (slot + 1) % n;
        self.resp.msn = self.resp.msn.next();
        *r = RdAtomicRes {
            kind,
            gen: r.gen.wrapping_add(1),
            first_psn: psn,
            last_psn: psn.add(npkts - 1),
            msn: self.resp.msn,
            queued: true,
            ..RdAtomicRes::default()
        };
        let item = match kind {
            ResKind::Read => RespItem::Read {
                slot: slot as u16,
                gen: r.gen,
            },
            _ => RespItem::Atomic {
                slot: slot as u16,
                gen: r.gen,
            },
        };
        self.resp.out.push_back(item);
        Some(slot)
    }

    /// Whether the oldest responder resource, the one a new READ/ATOMIC takes, still has its
    /// first reply to send (a replay for a duplicate does not count: see `take_resource`).
    fn oldest_resource_busy(&self) -> bool {
        self.resp
            .resources
            .get(self.resp.res_head)
            .is_some_and(|r| r.queued && !r.replay)
    }

    /// A READ or ATOMIC beyond the responder resources (see `take_resource`).
    fn too_many_rd_atomic(&mut self, sh: &mut Shared, psn: Psn) {
        self.counters.resp_rd_atomic_exceeded += 1;
        self.reject(sh, psn, INVALID);
    }

    fn rc_read(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        self.counters.rx_read_requests += 1;
        let reth = pkt.ext.reth.expect("READ carries a RETH");
        if self.resp.resources.is_empty() || reth.len > MAX_MSG {
            self.reject(sh, psn, INVALID);
            return;
        }
        let Some((mr, off)) = self.check_read(sh, reth) else {
            self.reject(sh, psn, ACCESS);
            return;
        };
        let npkts = read_pkts(reth.len, self.mtu());
        // The MSN counts the READ as complete when it is accepted (rxe; responses carry it).
        let Some(slot) = self.take_resource(ResKind::Read, psn, npkts) else {
            self.too_many_rd_atomic(sh, psn);
            return;
        };
        let r = &mut self.resp.resources[slot];
        r.rkey = reth.rkey;
        r.va_org = reth.va;
        r.len_org = reth.len;
        r.mr = mr;
        r.mem_offset = off;
        r.resid = reth.len;
        r.cur_psn = psn;
        r.starts = true;
        self.resp.epsn = psn.add(npkts);
    }

    /// The R_Key check of a READ over its whole range (a zero-length READ is not checked,
    /// IBA 9.4.3). Returns the registration and the memory offset of the first byte.
    fn check_read(&self, sh: &Shared, reth: RethRepr) -> Option<(MrRef, usize)> {
        if reth.len == 0 {
            return Some((MrRef::default(), 0));
        }
        sh.mrs
            .check_remote(
                reth.rkey,
                self.pd,
                self.qpn,
                reth.va,
                reth.len as u64,
                Access::REMOTE_READ,
            )
            .ok()
            .map(|(mr, off)| (mr.as_ref(), off))
    }

    fn rc_atomic(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        self.counters.rx_atomic_requests += 1;
        let a = pkt.ext.atomic_eth.expect("ATOMIC carries an AtomicETH");
        if self.resp.resources.is_empty() {
            self.reject(sh, psn, INVALID);
            return;
        }
        // A misaligned target is an invalid request (IBA 9.4.5: the VA must be 8-byte
        // aligned; rxe's RESPST_ERR_MISALIGNED_ATOMIC answers NAK Invalid Request).
        if !a.va.is_multiple_of(8) {
            self.reject(sh, psn, INVALID);
            return;
        }
        let (mem, off) =
            match sh
                .mrs
                .check_remote(a.rkey, self.pd, self.qpn, a.va, 8, Access::REMOTE_ATOMIC)
            {
                Ok((mr, off)) => (mr.mem.clone(), off),
                Err(_) => {
                    self.reject(sh, psn, ACCESS);
                    return;
                }
            };
        // Take the resource before executing: an ATOMIC that cannot be remembered must not
        // change memory (its duplicate could not be answered without executing it again).
        if self.oldest_resource_busy() {
            self.too_many_rd_atomic(sh, psn);
            return;
        }
        let r = if pkt.info.op == Operation::CompareSwap {
            mem.compare_swap(off, a.compare, a.swap_add)
        } else {
            mem.fetch_add(off, a.swap_add)
        };
        let Ok(orig) = r else {
            self.reject(sh, psn, ACCESS);
            return;
        };
        let slot = self
            .take_resource(ResKind::Atomic, psn, 1)
            .expect("checked free above");
        self.resp.resources[slot].orig = orig;
        self.executed(psn);
    }

    /// Duplicate request (IBA 9.7.5.1.2, C9-105..C9-108).
    fn rc_duplicate(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        match pkt.info.op {
            Operation::Send | Operation::Write => {
                // Acknowledge again (C9-105), with the PSN of the last SEND, WRITE or
                // ATOMIC packet executed: not a READ's, whose response the requester may
                // still be waiting for (an ACK past it would be an implied NAK).
                let last = self.resp.ack_psn.sub(1);
                self.queue_ack(sh, last);
            }
            Operation::ReadRequest => self.replay_read(sh, pkt),
            Operation::CompareSwap | Operation::FetchAdd => {
                // Replay the saved result; never execute an ATOMIC twice.
                let found = self
                    .resp
                    .resources
                    .iter()
                    .position(|r| r.kind == ResKind::Atomic && r.first_psn == psn);
                let Some(slot) = found else {
                    // Not among the resources any more: drop (class D).
                    self.counters.resp_duplicates_dropped += 1;
                    return;
                };
                let r = &mut self.resp.resources[slot];
                if !r.queued {
                    r.queued = true;
                    r.replay = true;
                    let item = RespItem::Atomic {
                        slot: slot as u16,
                        gen: r.gen,
                    };
                    self.resp.out.push_back(item);
                }
            }
            _ => {}
        }
    }

    /// A duplicate READ: restarts the reply of the resource whose PSNs contain it, from its
    /// PSN, for the range it asks - which must be the original's or a part of it under the
    /// same R_Key (rxe's rule; anything else is dropped). It never takes a new resource, so
    /// however often a peer repeats a READ, one reply at most is waiting.
    fn replay_read(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        let Some(reth) = pkt.ext.reth else { return };
        let found = self.resp.resources.iter().position(|r| {
            r.kind == ResKind::Read && !psn.before(r.first_psn) && !psn.after(r.last_psn)
        });
        let Some(slot) = found else {
            // Not among the resources any more: drop (class D).
            self.counters.resp_duplicates_dropped += 1;
            return;
        };
        let r = self.resp.resources[slot];
        let end = reth.va.checked_add(reth.len as u64);
        let inside = reth.va >= r.va_org
            && end.is_some_and(|e| e <= r.va_org + r.len_org as u64)
            && reth.rkey == r.rkey;
        if !inside {
            self.counters.resp_duplicates_dropped += 1;
            return;
        }
        // The MR may have been deregistered or invalidated since (rxe re-checks the R_Key:
        // RESPST_ERR_RKEY_VIOLATION).
        let Some((mr, off)) = self.check_read(sh, reth) else {
            self.reject(sh, psn, ACCESS);
            return;
        };
        let gen = r.gen;
        let r = &mut self.resp.resources[slot];
        r.mr = mr;
        r.mem_offset = off;
        r.resid = reth.len;
        r.cur_psn = psn;
        r.starts = psn == r.first_psn;
        if !r.queued {
            r.queued = true;
            r.replay = true;
            self.resp.out.push_back(RespItem::Read {
                slot: slot as u16,
                gen,
            });
        }
    }

    fn uc_request(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        let info = pkt.info;
        // A gap breaks the message in progress: drop it and resume at the next FIRST/ONLY
        // (IBA 9.8.2). The receive WQE of a broken SEND is kept for the next message.
        if psn != self.resp.epsn && self.resp.in_msg != InMsg::None {
            self.counters.rx_dropped_unreliable += 1;
            self.resp.in_msg = InMsg::None;
            self.resp.recv_offset = 0;
        }
        self.resp.epsn = psn.next();
        let seq_ok = match self.resp.in_msg {
            InMsg::Send => info.op == Operation::Send && !info.first,
            InMsg::Write => info.op == Operation::Write && !info.first,
            InMsg::None => info.first,
        };
        if !seq_ok {
            self.counters.rx_dropped_unreliable += 1;
            self.resp.in_msg = InMsg::None;
            self.resp.recv_offset = 0;
            return;
        }
        let drop_msg = |q: &mut Qp| {
            q.counters.rx_dropped_unreliable += 1;
            q.resp.in_msg = InMsg::None;
            q.resp.recv_offset = 0;
        };
        if self.bad_packet_length(pkt) {
            drop_msg(self);
            return;
        }
        match info.op {
            Operation::Send => {
                if info.first {
                    self.counters.rx_send_requests += 1;
                    if !self.resp.have_recv && !self.take_recv(sh) {
                        drop_msg(self);
                        return;
                    }
                    self.resp.recv_offset = 0;
                }
                if self.resp.recv_offset as u64 + pkt.payload_len as u64 > self.recv_capacity() {
                    // Too long for the WQE (IBA 9.9.3.1, as rxe's RESPST_ERR_LENGTH): with an
                    // SRQ the WQE completes with the error (class E); with the QP's own
                    // receive queue the message is dropped and the WQE kept for the next
                    // (class D).
                    drop_msg(self);
                    if self.srq.is_some() {
                        self.fail_recv(sh, WcStatus::RemInvReqErr);
                    }
                    return;
                }
                if let Err(status) = self.scatter_recv(sh, pkt) {
                    // A WQE whose buffers the data cannot go into (a bad or deregistered
                    // lkey, a range outside its MR): class A, as rxe's
                    // RESPST_ERR_MALFORMED_WQE. It completes with the error and the QP goes
                    // to the error state; kept instead, it would swallow every later message
                    // without a word.
                    drop_msg(self);
                    self.fail_recv(sh, status);
                    self.enter_error(sh);
                    return;
                }
                self.resp.recv_offset += pkt.payload_len as u32;
                if info.last {
                    let c = self.finish_recv_message(pkt, WcOpcode::Recv, self.resp.recv_offset);
                    sh.complete(self.recv_cq, c);
                } else {
                    self.resp.in_msg = InMsg::Send;
                }
            }
            Operation::Write => {
                if !self.access().contains(Access::REMOTE_WRITE) {
                    drop_msg(self);
                    return;
                }
                if info.first {
                    self.counters.rx_write_requests += 1;
                    let reth = pkt.ext.reth.expect("WRITE FIRST/ONLY carries a RETH");
                    if !self.begin_write(sh, reth) {
                        drop_msg(self);
                        return;
                    }
                }
                let n = pkt.payload_len as u32;
                if n > self.resp.write_left || (info.last && n != self.resp.write_left) {
                    drop_msg(self);
                    return;
                }
                if info.last && info.has_imm && !self.resp.have_recv && !self.take_recv(sh) {
                    drop_msg(self);
                    return;
                }
                if !self.place_write(sh, pkt) {
                    drop_msg(self);
                    return;
                }
                self.end_write_packet(sh, pkt);
            }
            _ => drop_msg(self),
        }
    }

    fn ud_request(&mut self, sh: &mut Shared, pkt: &Pkt<'_>) {
        let Some(deth) = pkt.ext.deth else {
            self.counters.rx_dropped_unreliable += 1;
            return;
        };
        // Q_Key check (IBA 10.2.5).
        if deth.qkey != self.qkey() {
            self.counters.rx_dropped_qkey += 1;
            return;
        }
        if pkt.payload_len > sh.cfg.port_mtu.bytes() as usize {
            self.counters.rx_dropped_unreliable += 1;
            return;
        }
        self.counters.rx_send_requests += 1;
        if !self.take_recv(sh) {
            self.counters.rx_dropped_unreliable += 1;
            return;
        }
        let total = 40 + pkt.payload_len as u64;
        let wr_id = self.resp.recv_wr_id;
        self.resp.have_recv = false;
        if total > self.recv_capacity() {
            self.counters.resp_local_length_error += 1;
            let c = self.recv_completion(wr_id, WcStatus::LocLenErr, WcOpcode::Recv, 0);
            sh.complete(self.recv_cq, c);
            return;
        }
        // The 40-byte GRH area: the IPv6 header, or 20 zero bytes and the IPv4 header (rxe).
        let mut grh = [0u8; 40];
        let mut l3 = [0u8; 60];
        let l3_len = pkt.l3_header(&mut l3);
        let l3 = &l3[..l3_len];
        if l3.len() == 40 {
            grh.copy_from_slice(l3);
        } else {
            grh[20..20 + l3.len().min(20)].copy_from_slice(&l3[..l3.len().min(20)]);
        }
        let placed = scatter_bytes(&sh.mrs, self.pd, &self.resp.recv_sges, 0, &grh)
            .and_then(|_| scatter(&sh.mrs, self.pd, &self.resp.recv_sges, 40, pkt));
        let mut c = match placed {
            Ok(()) => self.recv_completion(wr_id, WcStatus::Success, WcOpcode::Recv, total as u32),
            Err(status) => {
                // A receive WQE the data cannot go into (a bad lkey, a range outside its
                // MR): class A for every transport, as rxe's RESPST_ERR_MALFORMED_WQE and
                // the UC path here: it completes with the error and the QP goes to ERR.
                let c = self.recv_completion(wr_id, status, WcOpcode::Recv, 0);
                sh.complete(self.recv_cq, c);
                self.enter_error(sh);
                return;
            }
        };
        c.src_qp = deth.src_qp;
        c.wc_flags.insert(WcFlags::GRH);
        if let Some(imm) = pkt.ext.imm {
            c.imm_data = imm.imm;
            c.wc_flags.insert(WcFlags::WITH_IMM);
        }
        c.solicited = pkt.bth.se;
        sh.complete(self.recv_cq, c);
    }

    /// Produces the next responder packet (ACK/NAK, READ response, ATOMIC ACK); a READ
    /// response waits while `may_data` is false (the QP's pacer holds its data back).
    pub(crate) fn next_response(
        &mut self,
        sh: &mut Shared,
        tx: &mut Transmit,
        may_data: bool,
    ) -> bool {
        let mtu = self.attr.path_mtu.map(|m| m.bytes()).unwrap_or(1024);
        let dest = self.attr.dest_qp.unwrap_or(crate::types::Qpn::new(0));
        let pd = self.pd;
        let t = loop {
            let Some(&item) = self.resp.out.front() else {
                return false;
            };
            tx.payload.clear();
            match item {
                RespItem::Ack { psn, aeth } => {
                    self.resp.out.pop_front();
                    let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_ACK, dest, psn));
                    if aeth.is_ack() {
                        self.counters.acks_sent += 1;
                    }
                    t.ext.aeth = Some(aeth);
                    break t;
                }
                RespItem::Atomic { slot, gen } | RespItem::Read { slot, gen } => {
                    let Some(r) = self
                        .resp
                        .resources
                        .get_mut(slot as usize)
                        .filter(|r| r.gen == gen && r.queued)
                    else {
                        // The ring was re-sized meanwhile: nothing to send for it.
                        self.resp.out.pop_front();
                        continue;
                    };
                    if r.kind == ResKind::Atomic {
                        r.queued = false;
                        self.resp.out.pop_front();
                        let mut t = TransportRepr::new(BthRepr::new(
                            Opcode::RC_ATOMIC_ACK,
                            dest,
                            r.first_psn,
                        ));
                        t.ext.aeth = Some(AethRepr::ack(CREDITS_INVALID, r.msn));
                        t.ext.atomic_ack = Some(AtomicAckEthRepr { orig: r.orig });
                        break t;
                    }
                    if !may_data {
                        return false;
                    }
                    // One packet of the READ reply, from where the resource stands.
                    let n = r.resid.min(mtu);
                    let last = r.resid <= mtu;
                    // The registration the request was checked against must still be there,
                    // in this QP's PD (rxe re-checks the R_Key for every reply packet after
                    // the first: rxe_recheck_mr). If it went - deregistered, invalidated,
                    // its key reused - the reply stops with a remote access NAK (class C).
                    if n > 0 && sh.mrs.resolve(r.mr, pd).is_none() {
                        let psn = r.cur_psn;
                        r.queued = false;
                        self.resp.out.pop_front();
                        self.reject(sh, psn, ACCESS);
                        continue;
                    }
                    let op = match (r.starts, last) {
                        (true, true) => Opcode::RC_READ_RESPONSE_ONLY,
                        (true, false) => Opcode::RC_READ_RESPONSE_FIRST,
                        (false, false) => Opcode::RC_READ_RESPONSE_MIDDLE,
                        (false, true) => Opcode::RC_READ_RESPONSE_LAST,
                    };
                    let mut t = TransportRepr::new(BthRepr::new(op, dest, r.cur_psn));
                    if r.starts || last {
                        t.ext.aeth = Some(AethRepr::ack(CREDITS_INVALID, r.msn));
                    }
                    tx.payload.push_seg(PayloadSeg {
                        mr: r.mr,
                        offset: r.mem_offset,
                        len: n,
                    });
                    r.mem_offset += n as usize;
                    r.resid -= n;
                    r.cur_psn = r.cur_psn.next();
                    r.starts = false;
                    if last {
                        r.queued = false;
                        self.resp.out.pop_front();
                    }
                    break t;
                }
            }
        };
        let mut t = t;
        // Responses carry the credit field like ACKs do (except NAKs).
        if let Some(aeth) = t.ext.aeth.as_mut() {
            if aeth.is_ack() {
                *aeth = AethRepr::ack(self.credit_code(sh), aeth.msn);
            }
        }
        tx.qpn = self.qpn;
        tx.path = self.connected_path(sh);
        tx.transport = t;
        self.counters.sent_pkts += 1;
        true
    }
}
