//! Completer: processes ACKs, NAKs, READ responses and ATOMIC acknowledgements, completes send
//! WQEs in order, and drives retransmission (rxe_comp.c's role).
//!
//! Rules (IBA 9.7.5.2, roce-wire.md "PSN rules"):
//! * an ACK acknowledges every PSN up to its own: coalesced ACKs that jump over SEND/WRITE
//!   packets complete them all;
//! * only an ACK or READ response whose PSN passes an outstanding READ or ATOMIC implies that
//!   request was lost (implied NAK: retry from it);
//! * a PSN sequence error NAK retries from its PSN; an RNR NAK pauses and retries after the
//!   timer; other NAKs complete the WQE with the matching error and move the QP to ERR;
//! * the local ACK timeout retries from the oldest unacknowledged PSN, `retry_cnt` times.

use super::qp::Qp;
use super::queues::{SendWqe, WqeState};
use super::{scatter, Pkt, Shared};
use crate::types::Psn;
use crate::verbs::{Completion, QpState, WcFlags, WcStatus, WrOp};
use crate::wire::aeth::{AethKind, AethRepr, NakCode, CREDITS_INVALID, CREDIT_TABLE, RNR_TIMER_NS};
use crate::wire::opcode::Operation;

impl Qp {
    /// Handles a response packet (ACK/NAK, READ response, ATOMIC ACK) addressed to this QP.
    pub(crate) fn handle_response(&mut self, sh: &mut Shared, now: u64, pkt: &Pkt<'_>) {
        if !matches!(self.state, QpState::Rts | QpState::Sqd | QpState::Sqe) {
            self.counters.rx_dropped_state += 1;
            return;
        }
        let psn = pkt.bth.psn;
        // A response must be for a PSN we sent (comp.psn - 2^23 .. the highest PSN sent). A
        // rewind moves req.psn back, but ACKs for what went out before it are still valid and
        // must complete what they cover (rxe compares with the WQE's last PSN).
        if !psn.before(self.req.psn_hw) {
            self.counters.unexpected_responses += 1;
            tracing::trace!(qpn = ?self.qpn, ?psn, "response for a PSN never sent: dropped");
            return;
        }
        if let Some(aeth) = pkt.ext.aeth {
            self.update_credits(aeth);
        }
        match pkt.info.op {
            Operation::Acknowledge => {
                let aeth = pkt.ext.aeth.expect("ACK carries an AETH");
                match aeth.kind() {
                    AethKind::Ack { .. } => {
                        self.counters.acks_rcvd += 1;
                        self.ack_upto(sh, now, psn);
                    }
                    // A NAK or RNR NAK for a PSN already acknowledged is stale (the link
                    // delayed or duplicated it): ignored, as rxe's check_psn ignores any
                    // response before comp.psn. Acted on, an RNR NAK spent a retry and paused
                    // the queue, and with none left failed the QP.
                    AethKind::RnrNak { .. } | AethKind::Nak(_) if psn.before(self.comp.psn) => {
                        self.counters.duplicate_responses += 1;
                    }
                    AethKind::RnrNak { timer } => self.on_rnr_nak(sh, now, psn, timer),
                    AethKind::Nak(code) => self.on_nak(sh, now, psn, code),
                    AethKind::Reserved => {
                        self.counters.unexpected_responses += 1;
                    }
                }
            }
            Operation::ReadResponse => self.on_read_response(sh, now, pkt),
            Operation::AtomicAcknowledge => self.on_atomic_ack(sh, now, pkt),
            _ => self.counters.unexpected_responses += 1,
        }
        self.retire(sh);
    }

    /// End-to-end credits from an AETH (IBA 9.7.7.2): the responder has receive WQEs for
    /// `credits` more messages after MSN, so SENDs with SSN up to MSN + credits may go.
    fn update_credits(&mut self, aeth: AethRepr) {
        let AethKind::Ack { credits: code } = aeth.kind() else {
            return; // NAKs carry no credits
        };
        let msn = aeth.msn.value();
        self.comp.lsn = if code == CREDITS_INVALID || self.srq_peer_unlimited() {
            None
        } else {
            Some(msn.wrapping_add(CREDIT_TABLE[code as usize]) & crate::types::MASK24)
        };
    }

    fn srq_peer_unlimited(&self) -> bool {
        false
    }

    /// Completes every SEND/WRITE WQE whose last PSN is at or before `psn`. An ACK whose PSN
    /// passes an outstanding READ/ATOMIC means that request (or its response) was lost:
    /// implied NAK, retry from it.
    pub(crate) fn ack_upto(&mut self, sh: &mut Shared, now: u64, psn: Psn) {
        let mut progressed = false;
        // WQEs a rewind put back to be resent still count: their PSNs were sent before.
        while let Some(idx) = self.next_sent_remote() {
            let w = self.sq.get(idx);
            if w.op.is_read_or_atomic() {
                if !psn.before(w.first_psn) {
                    self.counters.implied_nak_seq_err += 1;
                    self.comp.psn = self.resume_psn(idx);
                    self.retry(sh, now, false);
                    return;
                }
                break;
            }
            if w.last_sent && !psn.before(w.last_psn) {
                self.sq.get_mut(idx).state = WqeState::Done(WcStatus::Success);
                self.comp.next += 1;
                progressed = true;
                continue;
            }
            break;
        }
        // Coalesced ACKs inside a multi-packet message move comp.psn too.
        let before = self.comp.psn;
        self.complete_before_psn_inclusive(psn.next());
        progressed |= self.comp.psn != before;
        if progressed {
            self.on_progress(sh, now);
        }
    }

    /// Forward progress: reset the retry budget and restart (or stop) the ACK timer.
    fn on_progress(&mut self, sh: &mut Shared, now: u64) {
        if self.comp.psn.after(self.req.psn) {
            // ACKs for packets sent before a rewind: do not send again what they covered.
            self.ev.resume = true;
        }
        if self.comp.retry_from.is_some_and(|p| self.comp.psn.after(p)) {
            self.comp.retry_from = None;
        }
        self.comp.retry_left = self.attr.retry_cnt.unwrap_or(7);
        self.comp.rnr_left = self.attr.rnr_retry.unwrap_or(7);
        if self.comp.psn == self.req.psn {
            self.stop_ack_timer();
        } else {
            self.restart_ack_timer(sh, now);
        }
    }

    /// The oldest outstanding WQE a READ response or ATOMIC ACK at `psn` answers, after
    /// completing what the response implicitly acknowledges before it; `None` (counted as
    /// unexpected) when nothing is outstanding.
    fn response_head(&mut self, psn: Psn) -> Option<u64> {
        self.complete_before(psn);
        let idx = self.outstanding_head();
        if idx.is_none() {
            self.counters.unexpected_responses += 1;
        }
        idx
    }

    /// A response at `psn` that is not for WQE `idx` (`w`): past an outstanding READ or
    /// ATOMIC it means the responses in between were lost, an implied NAK, so the request
    /// goes again from that WQE; otherwise it is unexpected and dropped.
    fn response_mismatch(&mut self, sh: &mut Shared, now: u64, idx: u64, w: &SendWqe, psn: Psn) {
        if w.op.is_read_or_atomic() && psn.after(w.first_psn) {
            self.counters.implied_nak_seq_err += 1;
            self.comp.psn = self.resume_psn(idx);
            self.retry(sh, now, false);
        } else {
            self.counters.unexpected_responses += 1;
        }
    }

    /// WQE `idx`, a READ or ATOMIC, has all its data: it succeeds and frees its
    /// outstanding-request slot.
    fn read_or_atomic_done(&mut self, idx: u64) {
        self.sq.get_mut(idx).state = WqeState::Done(WcStatus::Success);
        self.req.rd_atomic_inflight = self.req.rd_atomic_inflight.saturating_sub(1);
        self.comp.next = idx + 1;
    }

    fn on_read_response(&mut self, sh: &mut Shared, now: u64, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        // Everything before the READ is implicitly acknowledged by its response.
        let Some(idx) = self.response_head(psn) else {
            return;
        };
        let w = self.sq.get(idx).clone();
        let WrOp::Read { .. } = w.op else {
            // The response skipped an outstanding ATOMIC: implied NAK.
            self.response_mismatch(sh, now, idx, &w, psn);
            return;
        };
        let mtu = self.mtu();
        let expected = w.first_psn.add(w.recv_bytes / mtu);
        if psn.before(expected) {
            // Duplicate response (we already have it).
            self.counters.duplicate_responses += 1;
            return;
        }
        if psn.after(expected) {
            // Responses missing in the middle: re-request from the first missing one.
            self.counters.implied_nak_seq_err += 1;
            self.comp.psn = expected;
            self.retry(sh, now, false);
            return;
        }
        // PSN and length identify the bytes: a MIDDLE of the original response stream and a
        // FIRST of a re-request carry the same data, so either is accepted at this PSN. The
        // last packet, and only it, must be LAST/ONLY with the remaining length.
        let remaining = w.length - w.recv_bytes;
        let last = remaining <= mtu;
        let info = pkt.info;
        let want_len = remaining.min(mtu) as usize;
        if info.last != last || pkt.payload_len != want_len {
            // IBA 9.7.5.2.x: an unexpected opcode or length is a bad response.
            self.counters.unexpected_responses += 1;
            self.fail_wqe(sh, idx, WcStatus::BadRespErr);
            return;
        }
        if let Err(status) = scatter(
            &sh.mrs,
            self.pd,
            self.sq.sges(idx),
            w.recv_bytes as u64,
            pkt,
        ) {
            self.fail_wqe(sh, idx, status);
            return;
        }
        self.sq.get_mut(idx).recv_bytes += pkt.payload_len as u32;
        if last {
            self.read_or_atomic_done(idx);
        }
        self.comp.psn = psn.next();
        self.on_progress(sh, now);
    }

    fn on_atomic_ack(&mut self, sh: &mut Shared, now: u64, pkt: &Pkt<'_>) {
        let psn = pkt.bth.psn;
        let Some(idx) = self.response_head(psn) else {
            return;
        };
        let w = self.sq.get(idx).clone();
        if !matches!(w.op, WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. }) || w.first_psn != psn {
            self.response_mismatch(sh, now, idx, &w, psn);
            return;
        }
        let orig = pkt.ext.atomic_ack.map(|a| a.orig).unwrap_or(0);
        // The original value lands in the local buffer in host byte order (verbs semantics).
        let bytes = orig.to_ne_bytes();
        if let Err(status) = super::scatter_bytes(&sh.mrs, self.pd, self.sq.sges(idx), 0, &bytes) {
            self.fail_wqe(sh, idx, status);
            return;
        }
        self.read_or_atomic_done(idx);
        self.comp.psn = psn.next();
        self.on_progress(sh, now);
    }

    /// Completes SEND/WRITE WQEs entirely before `psn` (a response for a later request
    /// acknowledges them, IBA 9.7.5.2.6).
    fn complete_before(&mut self, psn: Psn) {
        while let Some(idx) = self.next_sent_remote() {
            let w = self.sq.get(idx);
            if !w.op.is_read_or_atomic() && w.last_sent && w.last_psn.before(psn) {
                self.sq.get_mut(idx).state = WqeState::Done(WcStatus::Success);
                self.comp.next += 1;
                continue;
            }
            break;
        }
    }

    /// Moves the completion point past WQEs already done and returns the WQE there if it is
    /// a remote operation that has been sent (one an ACK or response can complete).
    fn next_sent_remote(&mut self) -> Option<u64> {
        while self.comp.next < self.sq.tail {
            let idx = self.comp.next;
            let w = self.sq.get(idx);
            if let WqeState::Done(_) = w.state {
                self.comp.next += 1;
                continue;
            }
            return (w.started && w.op.is_remote()).then_some(idx);
        }
        None
    }

    /// The oldest WQE still waiting for a response (after `complete_before`).
    fn outstanding_head(&self) -> Option<u64> {
        // The oldest remote WR not completed is the one the peer failed to answer, whether it
        // is in flight or was rewound by a retry and waits to be sent again (IBA 9.7.5.1: the
        // WQE whose retries ran out completes with the error).
        let mut idx = self.comp.next.max(self.sq.head);
        while idx < self.sq.tail {
            let w = self.sq.get(idx);
            match w.state {
                WqeState::Done(_) => idx += 1,
                _ if !w.op.is_remote() => idx += 1,
                // Never sent: nothing can answer it (and its PSNs are not assigned).
                _ if !w.started => return None,
                _ => return Some(idx),
            }
        }
        None
    }

    fn on_nak(&mut self, sh: &mut Shared, now: u64, psn: Psn, code: NakCode) {
        tracing::debug!(qpn = ?self.qpn, ?psn, ?code, "NAK received");
        // The NAK's PSN is the failing request: everything before it succeeded.
        self.complete_before_psn_inclusive(psn);
        match code {
            NakCode::PsnSequenceError => {
                self.counters.packet_seq_err += 1;
                self.counters.rcvd_seq_err += 1;
                self.retry(sh, now, false);
            }
            other => {
                let status = match other {
                    NakCode::InvalidRequest => {
                        self.counters.req_remote_invalid_request += 1;
                        WcStatus::RemInvReqErr
                    }
                    NakCode::RemoteAccessError => {
                        self.counters.req_remote_access_errors += 1;
                        WcStatus::RemAccessErr
                    }
                    NakCode::RemoteOperationalError => {
                        self.counters.req_remote_operational_error += 1;
                        WcStatus::RemOpErr
                    }
                    NakCode::InvalidRdRequest => WcStatus::RemInvRdReqErr,
                    _ => WcStatus::RemOpErr,
                };
                match self.outstanding_head() {
                    Some(idx) => self.fail_wqe(sh, idx, status),
                    None => self.counters.unexpected_responses += 1,
                }
            }
        }
    }

    /// Completes SEND/WRITE WQEs that end before `psn` and moves comp.psn to `psn`, but not
    /// past a READ/ATOMIC still waiting for its response: retransmission must restart there
    /// (the response is what was lost), so PSNs are re-derived exactly as first assigned.
    fn complete_before_psn_inclusive(&mut self, psn: Psn) {
        self.complete_before(psn);
        let target = match self.outstanding_head() {
            Some(idx) if self.sq.get(idx).op.is_read_or_atomic() => {
                let r = self.resume_psn(idx);
                if r.before(psn) {
                    r
                } else {
                    psn
                }
            }
            _ => psn,
        };
        if target.after(self.comp.psn) {
            self.comp.psn = target;
        }
    }

    /// The PSN a READ/ATOMIC resumes at: the first response not yet received.
    fn resume_psn(&self, idx: u64) -> Psn {
        let w = self.sq.get(idx);
        match w.op {
            WrOp::Read { .. } => w.first_psn.add(w.recv_bytes / self.mtu()),
            _ => w.first_psn,
        }
    }

    fn on_rnr_nak(&mut self, sh: &mut Shared, now: u64, psn: Psn, timer: u8) {
        self.counters.rcvd_rnr_err += 1;
        tracing::debug!(qpn = ?self.qpn, ?psn, timer, rnr_left = self.comp.rnr_left, "RNR NAK received");
        self.complete_before_psn_inclusive(psn);
        let infinite = self.attr.rnr_retry.unwrap_or(0) == 7;
        if !infinite {
            if self.comp.rnr_left == 0 {
                self.counters.rnr_nak_retry_err += 1;
                match self.outstanding_head() {
                    Some(idx) => self.fail_wqe(sh, idx, WcStatus::RnrRetryExcErr),
                    None => self.enter_error(sh),
                }
                return;
            }
            self.comp.rnr_left -= 1;
        }
        self.ev.rewind = true;
        // Wait the RNR timer the responder asked for, then resend (IBA 9.7.5.2.8).
        let delay = RNR_TIMER_NS[(timer & 0x1f) as usize];
        self.comp.rnr_deadline = Some(now + delay);
        self.stop_ack_timer();
        self.arm_timer(sh, now + delay);
    }

    /// Starts a go-back-N retransmission from comp.psn. `timeout` = the local ACK timer
    /// expired (always retries); otherwise a NAK or implied NAK, ignored while a retry from
    /// this PSN is already under way.
    fn retry(&mut self, sh: &mut Shared, now: u64, timeout: bool) {
        if !timeout
            && self
                .comp
                .retry_from
                .is_some_and(|p| !self.comp.psn.after(p))
        {
            return;
        }
        self.comp.retry_from = Some(self.comp.psn);
        self.counters.completer_retry_err += 1;
        tracing::debug!(
            qpn = ?self.qpn,
            from_psn = ?self.comp.psn,
            timeout,
            retries_left = self.comp.retry_left,
            "go-back-N retransmission"
        );
        self.ev.rewind = true;
        self.restart_ack_timer(sh, now);
    }

    /// A heap entry for this QP fired at `now` (`fired` = the entry's time): handles the due
    /// deadline (ACK timeout, end of an RNR back-off, a paced packet's turn, a DCQCN rate
    /// event) and re-queues the next one.
    pub(crate) fn on_timer(&mut self, sh: &mut Shared, now: u64, fired: u64) {
        if self.timer_queued == Some(fired) {
            self.timer_queued = None;
        }
        let mtu = self.mtu();
        if let Some(cc) = self.cc.as_mut() {
            cc.on_timer(now, mtu);
        }
        self.expire_timers(sh, now);
        if let Some(next) = self.next_deadline() {
            self.arm_timer(sh, next);
        }
    }

    fn expire_timers(&mut self, sh: &mut Shared, now: u64) {
        if let Some(t) = self.comp.rnr_deadline {
            if now >= t {
                self.comp.rnr_deadline = None;
                self.restart_ack_timer(sh, now);
            }
        }
        if let Some(t) = self.comp.ack_deadline {
            if now >= t {
                self.stop_ack_timer();
                if self.comp.psn == self.req.psn
                    || !matches!(self.state, QpState::Rts | QpState::Sqd)
                {
                    return;
                }
                if self.held_for.is_some() {
                    // Nothing left: the packets wait for the next hop's address. Wait again
                    // rather than spend a retry on packets the peer never saw.
                    self.counters.ack_timeouts_held += 1;
                    self.restart_ack_timer(sh, now);
                    return;
                }
                self.counters.local_ack_timeout_err += 1;
                if self.comp.retry_left == 0 {
                    self.counters.retry_exceeded_err += 1;
                    tracing::debug!(qpn = ?self.qpn, psn = ?self.comp.psn, "retries exhausted");
                    match self.outstanding_head() {
                        Some(idx) => self.fail_wqe(sh, idx, WcStatus::RetryExcErr),
                        None => self.enter_error(sh),
                    }
                    return;
                }
                self.comp.retry_left -= 1;
                self.retry(sh, now, true);
            }
        }
    }

    /// Completes WQE `idx` with an error and moves the QP to ERR (flushing the rest).
    pub(crate) fn fail_wqe(&mut self, sh: &mut Shared, idx: u64, status: WcStatus) {
        self.sq.get_mut(idx).state = WqeState::Done(status);
        self.enter_error(sh);
    }

    /// Runs the completer for what the requester asked since it last ran: retiring WQEs
    /// that finished without a response ([`super::qp::RoleEvents::retire`]).
    pub(crate) fn take_completer_events(&mut self, sh: &mut Shared) {
        if std::mem::take(&mut self.ev.retire) {
            self.retire(sh);
        }
    }

    /// Retires completed WQEs from the head of the send queue in order, generating their
    /// completions (always for errors; for successes when signaled).
    pub(crate) fn retire(&mut self, sh: &mut Shared) {
        while self.sq.head < self.sq.tail {
            let idx = self.sq.head;
            let w = self.sq.get(idx);
            let WqeState::Done(status) = w.state else {
                break;
            };
            if status != WcStatus::Success || w.signaled {
                let c = Completion {
                    wr_id: w.wr_id,
                    status,
                    opcode: w.op.wc_opcode(),
                    vendor_err: if status == WcStatus::Success {
                        0
                    } else {
                        self.error_cause
                    },
                    byte_len: w.length,
                    imm_data: 0,
                    invalidated_rkey: 0,
                    qp_num: self.qpn,
                    src_qp: crate::types::Qpn::new(0),
                    // A sent SEND or WRITE with immediate says so, as rxe's make_send_cqe.
                    wc_flags: if status == WcStatus::Success
                        && matches!(w.op, WrOp::SendWithImm { .. } | WrOp::WriteWithImm { .. })
                    {
                        WcFlags::WITH_IMM
                    } else {
                        WcFlags::default()
                    },
                    pkey_index: 0,
                    sl: 0,
                    solicited: false,
                };
                sh.complete(self.send_cq, c);
            }
            self.sq.head += 1;
            if self.comp.next < self.sq.head {
                self.comp.next = self.sq.head;
            }
        }
        self.check_sq_drained(sh);
    }
}
