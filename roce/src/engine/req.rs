//! Requester: turns send WQEs into request packets (rxe_req.c's role).
//!
//! Segmentation by path MTU (FIRST/MIDDLE/LAST/ONLY), PSN assignment with 24-bit wrap, AckReq
//! on every last/only packet and at least every `ack_every` packets, the send window of
//! `max_unacked_psns`, the outstanding READ/ATOMIC limit, fences, end-to-end credits, and
//! go-back-N rewinding for the completer.

use super::qp::Qp;
use super::queues::{SendWqe, WqeState};
use super::transmit::{Path, Payload, Transmit};
use super::Shared;
use crate::memory::KeyError;
use crate::types::Psn;
use crate::verbs::{Access, QpState, QpType, SendFlags, WcStatus, WrOp};
use crate::wire::atomic_eth::AtomicEthRepr;
use crate::wire::bth::BthRepr;
use crate::wire::deth::DethRepr;
use crate::wire::frame::TransportRepr;
use crate::wire::ieth::IethRepr;
use crate::wire::imm::ImmRepr;
use crate::wire::opcode::{Opcode, Operation, Transport};
use crate::wire::reth::RethRepr;

/// Number of packets a READ of `len` bytes takes at `mtu` (at least one).
pub(crate) fn read_pkts(len: u32, mtu: u32) -> u32 {
    len.div_ceil(mtu).max(1)
}

fn transport_of(t: QpType) -> Transport {
    match t {
        QpType::Rc => Transport::Rc,
        QpType::Uc => Transport::Uc,
        QpType::Ud => Transport::Ud,
    }
}

/// Outcome of one attempt to produce a request packet.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ReqStep {
    /// A packet is in `tx`.
    Sent,
    /// Nothing to send now (empty, blocked by window/fence/limit/credits, or state).
    Idle,
}

impl Qp {
    /// Produces the next request packet, if any may be sent now.
    pub(crate) fn next_request(&mut self, sh: &mut Shared, now: u64, tx: &mut Transmit) -> ReqStep {
        self.take_requester_events();
        loop {
            if self.req.next == self.sq.tail || !self.can_send() {
                return ReqStep::Idle;
            }
            if self.comp.rnr_deadline.is_some() {
                return ReqStep::Idle;
            }
            let idx = self.req.next;
            let w = self.sq.get(idx).clone();
            match w.state {
                WqeState::Done(_) => {
                    self.req.next += 1;
                    continue;
                }
                WqeState::Sent => {
                    // Already fully sent (a rewind stopped before it): move on.
                    self.req.next += 1;
                    continue;
                }
                WqeState::Posted | WqeState::Sending => {}
            }
            if w.rejected {
                // A WR the host interface could not post: a local QP operation error in its
                // turn (what an RNIC reports for a WQE it cannot execute).
                self.error_cause = crate::verbs::vendor_err::REJECTED_AT_POST;
                self.sq.get_mut(idx).state = WqeState::Done(WcStatus::LocQpOpErr);
                self.req.next += 1;
                self.send_queue_error(sh);
                return ReqStep::Idle;
            }
            if !w.op.is_remote() {
                if w.state == WqeState::Posted && self.state == QpState::Sqd {
                    return ReqStep::Idle;
                }
                if self.fenced(&w, idx) {
                    return ReqStep::Idle;
                }
                self.execute_local(sh, idx);
                self.req.next += 1;
                self.ev.retire = true;
                continue;
            }
            if w.state == WqeState::Posted {
                // A draining send queue starts nothing new (IBA 10.3.1: SQD), but finishes
                // what it started: a WQE a rewind put back (a retry after a NAK, a timeout
                // or an RNR NAK) goes again.
                if self.state == QpState::Sqd && !w.started {
                    return ReqStep::Idle;
                }
                if self.fenced(&w, idx) {
                    return ReqStep::Idle;
                }
                let max_rd = self.attr.max_rd_atomic.unwrap_or(0).max(1) as u32;
                if w.op.is_read_or_atomic() && self.req.rd_atomic_inflight >= max_rd {
                    return ReqStep::Idle;
                }
                if self.qp_type == QpType::Rc && self.consumes_recv_wqe(&w.op) {
                    if let Some(lsn) = self.comp.lsn {
                        // End-to-end credits (IBA 9.7.7.2): a message beyond the limit may
                        // only go out as a single probe while nothing is outstanding.
                        let beyond = ((w.ssn.wrapping_sub(lsn)) << 8) as i32 > 0;
                        let outstanding = self.req.psn != self.comp.psn;
                        if beyond && outstanding {
                            return ReqStep::Idle;
                        }
                    }
                }
                if let Err(status) = self.check_local_sges(sh, idx) {
                    self.sq.get_mut(idx).state = WqeState::Done(status);
                    self.req.next += 1;
                    self.send_queue_error(sh);
                    return ReqStep::Idle;
                }
            }
            // The send window: rxe stops when req.psn passes comp.psn + RXE_MAX_UNACKED_PSNS.
            if self.qp_type == QpType::Rc
                && self.req.psn.diff(self.comp.psn) > sh.cfg.max_unacked_psns as i32
            {
                return ReqStep::Idle;
            }
            if self.build_request(sh, now, idx, tx) {
                return ReqStep::Sent;
            }
            return ReqStep::Idle;
        }
    }

    fn consumes_recv_wqe(&self, op: &WrOp) -> bool {
        matches!(
            op,
            WrOp::Send
                | WrOp::SendWithImm { .. }
                | WrOp::SendWithInv { .. }
                | WrOp::WriteWithImm { .. }
        )
    }

    /// Verifies every SGE of a WQE before its first packet (rxe checks them as it copies):
    /// the lkey must name a valid MR of the QP's PD covering the range, with LOCAL_WRITE where
    /// the response writes into it (READ, ATOMIC).
    fn check_local_sges(&self, sh: &Shared, idx: u64) -> Result<(), WcStatus> {
        let w = self.sq.get(idx);
        // Inline data has no SGEs to check; the INLINE flag on a READ or ATOMIC (which
        // carry no data out) is ignored, as `check_send` ignores it, and their SGEs are
        // checked like any others.
        if w.inline_len > 0 || (w.flags.contains(SendFlags::INLINE) && !w.op.is_read_or_atomic()) {
            return Ok(());
        }
        let need = if w.op.is_read_or_atomic() {
            Access::LOCAL_WRITE
        } else {
            Access(0)
        };
        for sge in self.sq.sges(idx) {
            if sge.length == 0 {
                continue;
            }
            sh.mrs
                .check_local(sge.lkey, self.pd, sge.addr, sge.length as u64, need)
                .map_err(|_: KeyError| WcStatus::LocProtErr)?;
        }
        Ok(())
    }

    /// Fills `tx` with the next packet of WQE `idx` and advances the requester.
    fn build_request(&mut self, sh: &mut Shared, now: u64, idx: u64, tx: &mut Transmit) -> bool {
        let mtu = if self.qp_type == QpType::Ud {
            sh.cfg.port_mtu.bytes()
        } else {
            self.mtu()
        };
        let w = self.sq.get(idx).clone();
        let psn = self.req.psn;
        let transport = transport_of(self.qp_type);
        tx.payload.clear();
        tx.qpn = self.qpn;
        let mut dest_qp = self.dest_qp();
        tx.path = if let Some(ud) = &w.ud {
            dest_qp = ud.remote_qpn;
            Path {
                sgid: sh.gid(ud.ah.sgid_index),
                dgid: ud.ah.dgid,
                udp_sport: self.udp_sport,
                traffic_class: ud.ah.traffic_class,
                flow_label: ud.ah.flow_label,
                hop_limit: ud.ah.hop_limit,
                sl: ud.ah.sl,
                dmac: ud.ah.dmac,
            }
        } else {
            self.connected_path(sh)
        };
        // Built where it is sent from: the transport headers are some 180 bytes, and a copy
        // built aside and moved in showed per packet.
        tx.transport = TransportRepr::new(BthRepr::new(Opcode(0), dest_qp, psn));
        let t = &mut tx.transport;
        let last;
        match w.op {
            WrOp::Read { remote_addr, rkey } => {
                // A re-request after a partial response asks only for what is missing; the
                // PSNs it covers are the ones the original request assigned to that part.
                let done = w.recv_bytes;
                let len = w.length - done;
                t.bth.opcode = Opcode::RC_READ_REQUEST;
                t.ext.reth = Some(RethRepr {
                    va: remote_addr + done as u64,
                    rkey,
                    len,
                });
                let n = read_pkts(len, mtu);
                let wm = self.sq.get_mut(idx);
                wm.first_psn = psn.sub(done / mtu);
                wm.last_psn = psn.add(n - 1);
                // For READ, `sent_bytes` records where the current request started, so the
                // completer knows which response is a FIRST.
                wm.sent_bytes = done;
                wm.state = WqeState::Sent;
                wm.started = true;
                wm.last_sent = true;
                self.req.psn = psn.add(n);
                self.req.rd_atomic_inflight += 1;
                last = true;
            }
            WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                t.bth.opcode = Opcode::RC_COMPARE_SWAP;
                t.ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: swap,
                    compare,
                });
                self.finish_single(idx, psn);
                last = true;
            }
            WrOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                t.bth.opcode = Opcode::RC_FETCH_ADD;
                t.ext.atomic_eth = Some(AtomicEthRepr {
                    va: remote_addr,
                    rkey,
                    swap_add: add,
                    compare: 0,
                });
                self.finish_single(idx, psn);
                last = true;
            }
            _ => {
                let off = w.sent_bytes;
                let n = (w.length - off).min(mtu);
                let first = off == 0;
                last = off + n == w.length;
                let (op, imm, inv) = match w.op {
                    WrOp::Send => (Operation::Send, None, None),
                    WrOp::SendWithImm { imm } => (Operation::Send, Some(imm), None),
                    WrOp::SendWithInv { rkey } => (Operation::Send, None, Some(rkey)),
                    WrOp::Write { .. } => (Operation::Write, None, None),
                    WrOp::WriteWithImm { imm, .. } => (Operation::Write, Some(imm), None),
                    _ => unreachable!("remote send/write ops only"),
                };
                let opcode = Opcode::find(
                    transport,
                    op,
                    first,
                    last,
                    imm.is_some() && last,
                    inv.is_some() && last,
                )
                .expect("every SEND/WRITE position has an opcode");
                t.bth.opcode = opcode;
                if first {
                    if let WrOp::Write { remote_addr, rkey }
                    | WrOp::WriteWithImm {
                        remote_addr, rkey, ..
                    } = w.op
                    {
                        t.ext.reth = Some(RethRepr {
                            va: remote_addr,
                            rkey,
                            len: w.length,
                        });
                    }
                }
                if last {
                    if let Some(imm) = imm {
                        t.ext.imm = Some(ImmRepr { imm });
                    }
                    if let Some(rkey) = inv {
                        t.ext.ieth = Some(IethRepr { rkey });
                    }
                    t.bth.se = w.flags.contains(SendFlags::SOLICITED);
                }
                if let Some(ud) = &w.ud {
                    // A Q_Key with the high bit set means "use the QP's own" (IBA 10.2.5).
                    let qkey = if ud.remote_qkey.is_privileged() {
                        self.qkey()
                    } else {
                        ud.remote_qkey
                    };
                    t.ext.deth = Some(DethRepr {
                        qkey,
                        src_qp: self.qpn,
                        resv: 0,
                    });
                }
                if let Err(status) = self.gather(sh, idx, off, n, &mut tx.payload) {
                    self.sq.get_mut(idx).state = WqeState::Done(status);
                    self.req.next = idx + 1;
                    self.send_queue_error(sh);
                    tx.payload.clear();
                    return false;
                }
                let wm = self.sq.get_mut(idx);
                if first {
                    wm.first_psn = psn;
                    wm.started = true;
                }
                wm.sent_bytes = off + n;
                if last {
                    wm.last_psn = psn;
                    wm.last_sent = true;
                    wm.state = WqeState::Sent;
                } else {
                    wm.state = WqeState::Sending;
                }
                self.req.psn = psn.add(1);
            }
        }
        // AckReq on every last packet, and on the first packet after more than `ack_every`
        // without one (rxe_req.c: `END || noack_pkts++ > RXE_MAX_PKT_PER_ACK`), and before the
        // send window closes: a window of W lets W + 1 PSNs out, so with `ack_every` at W or
        // more a message longer than the window would never draw an ACK and stall until its
        // retries ran out (rxe's 64 and 128 are unaffected). RC only.
        if self.qp_type == QpType::Rc {
            let every = sh
                .cfg
                .ack_every
                .min(sh.cfg.max_unacked_psns.saturating_sub(1));
            let ack_req = last || {
                let n = self.req.noack_pkts;
                self.req.noack_pkts += 1;
                n > every
            };
            if ack_req {
                t.bth.ack_req = true;
                self.req.noack_pkts = 0;
            }
        }
        self.counters.sent_pkts += 1;
        // A packet below the high-water mark was sent before: go-back-N resends it.
        if psn.before(self.req.psn_hw) {
            self.counters.retransmitted_pkts += 1;
        }
        if self.req.psn.after(self.req.psn_hw) {
            self.req.psn_hw = self.req.psn;
        }
        match self.qp_type {
            QpType::Rc => {
                if self.comp.ack_deadline.is_none() {
                    self.restart_ack_timer(sh, now);
                }
            }
            QpType::Uc | QpType::Ud => {
                // Unreliable: complete when the last packet leaves.
                if self.sq.get(idx).state == WqeState::Sent {
                    self.sq.get_mut(idx).state = WqeState::Done(WcStatus::Success);
                }
            }
        }
        let wstate = self.sq.get(idx).state;
        if matches!(wstate, WqeState::Sent | WqeState::Done(_)) {
            self.req.next = idx + 1;
        }
        if self.qp_type != QpType::Rc {
            // Unreliable: nothing comes back, so the completer retires what left.
            self.ev.retire = true;
        }
        true
    }

    fn finish_single(&mut self, idx: u64, psn: Psn) {
        let wm = self.sq.get_mut(idx);
        wm.first_psn = psn;
        wm.last_psn = psn;
        wm.started = true;
        wm.last_sent = true;
        wm.state = WqeState::Sent;
        self.req.psn = psn.add(1);
        self.req.rd_atomic_inflight += 1;
    }

    /// Describes payload bytes `off..off+n` of WQE `idx` in `tx.payload`.
    fn gather(
        &self,
        sh: &Shared,
        idx: u64,
        off: u32,
        n: u32,
        payload: &mut Payload,
    ) -> Result<(), WcStatus> {
        if n == 0 {
            return Ok(());
        }
        let inline = self.sq.inline(idx);
        if !inline.is_empty() {
            payload.set_inline(&inline[off as usize..(off + n) as usize]);
            return Ok(());
        }
        let mut skip = off as u64;
        let mut left = n as u64;
        for sge in self.sq.sges(idx) {
            if left == 0 {
                break;
            }
            let l = sge.length as u64;
            if skip >= l {
                skip -= l;
                continue;
            }
            let take = (l - skip).min(left);
            // Checked when the WQE started; it fails only if the MR was deregistered while
            // the WQE was in flight, which completes it with a protection error.
            let (mr, offset) = sh
                .mrs
                .check_local(sge.lkey, self.pd, sge.addr + skip, take, Access(0))
                .map_err(|_| WcStatus::LocProtErr)?;
            payload.push_seg(super::transmit::PayloadSeg {
                mr: mr.as_ref(),
                offset,
                len: take as u32,
            });
            left -= take;
            skip = 0;
        }
        if left != 0 {
            return Err(WcStatus::LocLenErr);
        }
        Ok(())
    }

    /// Whether WQE `w` (at `idx`) must wait for those before it. A LOCAL_INV waits until
    /// every WQE before it has completed (the local invalidate fence, IBA 10.6.5.1, which
    /// rxe makes mandatory): a READ response still to come must not find its buffer
    /// unregistered. Any other WQE with FENCE, local or remote, waits for outstanding
    /// READ/ATOMIC (IBA 10.8.3.3).
    fn fenced(&self, w: &SendWqe, idx: u64) -> bool {
        match w.op {
            WrOp::LocalInv { .. } => {
                (self.sq.head..idx).any(|i| !matches!(self.sq.get(i).state, WqeState::Done(_)))
            }
            _ => w.flags.contains(SendFlags::FENCE) && self.req.rd_atomic_inflight > 0,
        }
    }

    /// Executes a local operation (LOCAL_INV, REG_MR) when the requester reaches it.
    fn execute_local(&mut self, sh: &mut Shared, idx: u64) {
        // The operation only (the WQE is some 100 bytes).
        let op = self.sq.get(idx).op;
        let status = match op {
            // A key that cannot be invalidated is a local QP operation error (rxe).
            WrOp::LocalInv { rkey } => match sh.invalidate(rkey.0, self.pd, None) {
                WcStatus::Success => WcStatus::Success,
                _ => WcStatus::LocQpOpErr,
            },
            WrOp::BindMw { .. } => sh.bind_mw(self.qpn, self.pd, &op),
            WrOp::RegMr {
                lkey,
                key,
                addr,
                length,
                access,
            } => sh.fast_register(lkey, key, addr, length, access, self.pd),
            _ => WcStatus::Success,
        };
        self.sq.get_mut(idx).state = WqeState::Done(status);
        if status != WcStatus::Success {
            self.send_queue_error(sh);
        }
    }

    /// Acts on what the completer asked for since the requester last ran (a go-back-N
    /// rewind, or a resume after ACKs overtook the send point), and skips WQEs the completer
    /// retired meanwhile.
    fn take_requester_events(&mut self) {
        if std::mem::take(&mut self.ev.rewind) {
            self.ev.resume = false;
            self.rewind();
        } else if std::mem::take(&mut self.ev.resume) {
            self.resume_partial();
        }
        if self.req.next < self.sq.head {
            self.req.next = self.sq.head;
        }
    }

    /// Go-back-N: resend from the oldest unacknowledged PSN (IBA 9.7.6.1). WQEs after it are
    /// sent again from scratch; a partially acknowledged SEND/WRITE resumes at the first
    /// unacknowledged packet; a partially answered READ re-requests only what is missing.
    /// Resent packets are counted as they go out (`retransmitted_pkts`).
    fn rewind(&mut self) {
        let from = self.comp.next;
        // Everything from the oldest incomplete WQE up to the last one with packets out
        // (including one only partly sent) goes again; the first WQE never started ends the
        // range, since WQEs are sent in order.
        for idx in from..self.sq.tail {
            let w = self.sq.get_mut(idx);
            match w.state {
                WqeState::Done(_) => continue,
                _ if !w.started => break,
                _ => {}
            }
            match w.op {
                WrOp::Read { .. } => w.state = WqeState::Sending,
                WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => w.state = WqeState::Posted,
                op if op.is_remote() => {
                    w.sent_bytes = 0;
                    w.state = WqeState::Posted;
                }
                _ => {}
            }
        }
        self.req.next = from;
        self.req.psn = self.comp.psn;
        self.req.rd_atomic_inflight = 0;
        self.resume_partial();
    }

    /// Points the requester at `comp.psn`, the oldest unacknowledged PSN, after a rewind or
    /// after ACKs for packets sent before a rewind moved `comp.psn` past the send point: a
    /// SEND/WRITE acknowledged part way (a coalesced ACK inside the message) resumes at its
    /// first unacknowledged packet. PSNs are re-derived in order from there, so every packet
    /// gets the PSN it had the first time.
    fn resume_partial(&mut self) {
        let mtu = self.mtu();
        self.req.next = self.comp.next;
        self.req.psn = self.comp.psn;
        self.req.noack_pkts = 0;
        if self.comp.next >= self.sq.tail {
            return;
        }
        let psn = self.comp.psn;
        let w = self.sq.get_mut(self.comp.next);
        if w.started
            && w.op.is_remote()
            && !w.op.is_read_or_atomic()
            && !matches!(w.state, WqeState::Done(_))
            && psn.after(w.first_psn)
        {
            let acked_pkts = psn.diff(w.first_psn) as u32;
            w.sent_bytes = (acked_pkts * mtu).min(w.length);
            w.state = WqeState::Sending;
        }
    }
}
