//! Queue pair state: the state machine with per-transition attribute rules, and the state each
//! role (requester, responder, completer) keeps.

use std::collections::VecDeque;

use super::counters::QpCounters;
use super::queues::{RecvQueue, SendQueue, WqeState};
use super::transmit::{udp_sport_connected, udp_sport_ud, Transmit};
use super::Shared;
use crate::memory::PdId;
use crate::types::{Msn, Psn, Qkey, Qpn};
use crate::verbs::{
    Access, Completion, Mtu, QpAttr, QpCaps, QpState, QpType, Sge, WcFlags, WcOpcode, WcStatus,
};
use crate::wire::aeth::AethRepr;
use crate::wire::bth::BthRepr;
use crate::wire::cnp::CnpRepr;
use crate::wire::frame::TransportRepr;
use crate::wire::opcode::Opcode;

/// Why `modify_qp` refused (the QP is left unchanged).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModifyError {
    /// The transition is not allowed from the current state.
    #[error("transition {from:?} -> {to:?} is not allowed")]
    BadTransition {
        /// Current state.
        from: QpState,
        /// Requested state.
        to: QpState,
    },
    /// `cur_state` does not match the QP's state.
    #[error("cur_state {given:?} does not match the QP state {actual:?}")]
    CurStateMismatch {
        /// Given.
        given: QpState,
        /// Actual.
        actual: QpState,
    },
    /// A required attribute is missing.
    #[error("{0} is required for this transition")]
    Missing(&'static str),
    /// An attribute is not allowed for this transition or QP type.
    #[error("{0} may not be set in this transition")]
    NotAllowed(&'static str),
    /// An attribute's value is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// Attribute bits, as `ibv_qp_attr_mask`.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Mask(u32);

impl Mask {
    const STATE: u32 = 1 << 0;
    const CUR_STATE: u32 = 1 << 1;
    const EN_SQD: u32 = 1 << 2;
    const ACCESS: u32 = 1 << 3;
    const PKEY: u32 = 1 << 4;
    const PORT: u32 = 1 << 5;
    const QKEY: u32 = 1 << 6;
    const AV: u32 = 1 << 7;
    const MTU: u32 = 1 << 8;
    const TIMEOUT: u32 = 1 << 9;
    const RETRY: u32 = 1 << 10;
    const RNR_RETRY: u32 = 1 << 11;
    const RQ_PSN: u32 = 1 << 12;
    const MAX_RD: u32 = 1 << 13;
    const MIN_RNR: u32 = 1 << 15;
    const SQ_PSN: u32 = 1 << 16;
    const MAX_DEST_RD: u32 = 1 << 17;
    const DEST_QPN: u32 = 1 << 20;

    const NAMES: [(u32, &'static str); 17] = [
        (Self::STATE, "qp_state"),
        (Self::CUR_STATE, "cur_qp_state"),
        (Self::EN_SQD, "en_sqd_async_notify"),
        (Self::ACCESS, "qp_access_flags"),
        (Self::PKEY, "pkey_index"),
        (Self::PORT, "port_num"),
        (Self::QKEY, "qkey"),
        (Self::AV, "ah_attr"),
        (Self::MTU, "path_mtu"),
        (Self::TIMEOUT, "timeout"),
        (Self::RETRY, "retry_cnt"),
        (Self::RNR_RETRY, "rnr_retry"),
        (Self::RQ_PSN, "rq_psn"),
        (Self::MAX_RD, "max_rd_atomic"),
        (Self::MIN_RNR, "min_rnr_timer"),
        (Self::SQ_PSN, "sq_psn"),
        (Self::MAX_DEST_RD, "max_dest_rd_atomic"),
    ];

    fn of(a: &QpAttr) -> Mask {
        let mut m = 0;
        let mut set = |b: bool, bit: u32| {
            if b {
                m |= bit;
            }
        };
        set(a.state.is_some(), Self::STATE);
        set(a.cur_state.is_some(), Self::CUR_STATE);
        set(a.en_sqd_async_notify.is_some(), Self::EN_SQD);
        set(a.access.is_some(), Self::ACCESS);
        set(a.pkey_index.is_some(), Self::PKEY);
        set(a.port.is_some(), Self::PORT);
        set(a.qkey.is_some(), Self::QKEY);
        set(a.av.is_some(), Self::AV);
        set(a.path_mtu.is_some(), Self::MTU);
        set(a.timeout.is_some(), Self::TIMEOUT);
        set(a.retry_cnt.is_some(), Self::RETRY);
        set(a.rnr_retry.is_some(), Self::RNR_RETRY);
        set(a.rq_psn.is_some(), Self::RQ_PSN);
        set(a.max_rd_atomic.is_some(), Self::MAX_RD);
        set(a.min_rnr_timer.is_some(), Self::MIN_RNR);
        set(a.sq_psn.is_some(), Self::SQ_PSN);
        set(a.max_dest_rd_atomic.is_some(), Self::MAX_DEST_RD);
        set(a.dest_qp.is_some(), Self::DEST_QPN);
        Mask(m)
    }

    fn name(bit: u32) -> &'static str {
        if bit == Self::DEST_QPN {
            return "dest_qp_num";
        }
        Self::NAMES
            .iter()
            .find(|(b, _)| *b == bit)
            .map(|(_, n)| *n)
            .unwrap_or("attribute")
    }
}

/// Required and optional attributes of a transition (IBA Table 94-ish; the same table as
/// `ib_modify_qp_is_ok` in the Linux kernel).
fn transition_rules(t: QpType, from: QpState, to: QpState) -> Option<(u32, u32)> {
    use QpState::*;
    type M = Mask;
    let (rc, uc, ud) = (t == QpType::Rc, t == QpType::Uc, t == QpType::Ud);
    let pick = |rcv: u32, ucv: u32, udv: u32| {
        if rc {
            rcv
        } else if uc {
            ucv
        } else {
            udv
        }
    };
    let _ = ud;
    Some(match (from, to) {
        (_, Reset) => (0, 0),
        (_, Err) => (0, 0),
        (Reset, Init) => (
            pick(
                M::PKEY | M::PORT | M::ACCESS,
                M::PKEY | M::PORT | M::ACCESS,
                M::PKEY | M::PORT | M::QKEY,
            ),
            0,
        ),
        (Init, Init) => (
            0,
            pick(
                M::PKEY | M::PORT | M::ACCESS,
                M::PKEY | M::PORT | M::ACCESS,
                M::PKEY | M::PORT | M::QKEY,
            ),
        ),
        (Init, Rtr) => (
            pick(
                M::AV | M::MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD | M::MIN_RNR,
                M::AV | M::MTU | M::DEST_QPN | M::RQ_PSN,
                0,
            ),
            pick(M::ACCESS | M::PKEY, M::ACCESS | M::PKEY, M::PKEY | M::QKEY),
        ),
        (Rtr, Rts) => (
            pick(
                M::SQ_PSN | M::TIMEOUT | M::RETRY | M::RNR_RETRY | M::MAX_RD,
                M::SQ_PSN,
                M::SQ_PSN,
            ),
            pick(
                M::CUR_STATE | M::ACCESS | M::MIN_RNR,
                M::CUR_STATE | M::ACCESS,
                M::CUR_STATE | M::QKEY,
            ),
        ),
        (Rts, Rts) => (
            0,
            pick(
                M::CUR_STATE | M::ACCESS | M::MIN_RNR,
                M::CUR_STATE | M::ACCESS,
                M::CUR_STATE | M::QKEY,
            ),
        ),
        (Rts, Sqd) => (0, M::EN_SQD),
        (Sqd, Rts) => (
            0,
            pick(
                M::CUR_STATE | M::ACCESS | M::MIN_RNR,
                M::CUR_STATE | M::ACCESS,
                M::CUR_STATE | M::QKEY,
            ),
        ),
        (Sqd, Sqd) => (
            0,
            pick(
                M::PKEY
                    | M::PORT
                    | M::AV
                    | M::MAX_RD
                    | M::MAX_DEST_RD
                    | M::ACCESS
                    | M::MIN_RNR
                    | M::TIMEOUT
                    | M::RETRY
                    | M::RNR_RETRY,
                M::AV | M::ACCESS | M::PKEY,
                M::PKEY | M::QKEY,
            ),
        ),
        (Sqe, Rts) => (0, pick(0, M::CUR_STATE | M::ACCESS, M::CUR_STATE | M::QKEY)),
        _ => return None,
    })
}

/// What a responder is in the middle of (for the op-sequence check, IBA 9.7.5.1.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InMsg {
    /// Between messages.
    None,
    /// Inside a multi-packet SEND; the receive WQE is `resp.recv_wr_id`.
    Send,
    /// Inside a multi-packet RDMA WRITE.
    Write,
}

/// A packet (or, for a READ, a reply of several packets) the responder still has to send, in
/// the order the requests arrived. READ and ATOMIC items name a slot of the responder's
/// resource ring, which holds the reply's progress: a READ reply is produced one packet at a
/// time from it, so the queue never holds more than one item per resource, however large the
/// READ or however often the peer repeats it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RespItem {
    /// ACK, NAK or RNR NAK (`aeth`) for `psn`.
    Ack { psn: Psn, aeth: AethRepr },
    /// The READ reply of resource `slot` (while its generation is `gen`).
    Read { slot: u16, gen: u32 },
    /// The ATOMIC acknowledge of resource `slot` (while its generation is `gen`).
    Atomic { slot: u16, gen: u32 },
}

/// What a responder resource holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum ResKind {
    /// Unused.
    #[default]
    Free,
    /// An RDMA READ.
    Read,
    /// An ATOMIC and its result.
    Atomic,
}

/// A responder resource (IBA 9.7.5.1.6; rxe's `struct resp_res`): a READ or ATOMIC the
/// responder executed, kept so that a duplicate is answered from it - a READ is read again
/// from memory, an ATOMIC's saved result is replayed and never executed twice. The QP has
/// `max_dest_rd_atomic` of them in a ring; a new READ/ATOMIC takes the oldest.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RdAtomicRes {
    pub kind: ResKind,
    /// Bumped every time the slot is reused, so a queued item for the old occupant is
    /// recognised as stale.
    pub gen: u32,
    /// PSNs the request covers (READ: one per response packet).
    pub first_psn: Psn,
    pub last_psn: Psn,
    /// MSN the responses carry.
    pub msn: Msn,
    /// An item for it is in the output queue (its reply is not completely sent).
    pub queued: bool,
    /// The queued reply answers a duplicate (the original reply was sent whole): a new
    /// READ/ATOMIC may take the slot over, abandoning it (see `take_resource`).
    pub replay: bool,
    /// READ: the original request (a duplicate may ask for this range or a part of it).
    pub rkey: crate::types::Rkey,
    pub va_org: u64,
    pub len_org: u32,
    /// READ: the reply being sent - the MR, the memory offset of the next byte, bytes left,
    /// the PSN of the next packet, and whether the next packet starts the reply
    /// (FIRST/ONLY) or continues it (MIDDLE/LAST, as rxe replays from inside a READ).
    pub mr: crate::memory::MrRef,
    pub mem_offset: usize,
    pub resid: u32,
    pub cur_psn: Psn,
    pub starts: bool,
    /// ATOMIC: the original value.
    pub orig: u64,
}

/// Requester state (rxe_req.c's `qp->req`).
#[derive(Debug, Clone)]
pub(crate) struct ReqState {
    /// PSN of the next packet to send (moved back by a go-back-N rewind).
    pub psn: Psn,
    /// One past the highest PSN ever sent: responses up to here are for packets we sent,
    /// even after a rewind moved `psn` back (rxe checks against the WQE's last PSN).
    pub psn_hw: Psn,
    /// Index of the WQE being sent (or next to send).
    pub next: u64,
    /// Packets since the last AckReq.
    pub noack_pkts: u32,
    /// READ/ATOMIC WQEs sent and not completed.
    pub rd_atomic_inflight: u32,
    /// SSN of the last request message posted (24-bit, IBA 9.7.7.2).
    pub ssn: u32,
}

/// Completer state (rxe_comp.c's `qp->comp`).
#[derive(Debug, Clone)]
pub(crate) struct CompState {
    /// Oldest PSN not yet acknowledged.
    pub psn: Psn,
    /// Index of the oldest WQE not yet completed by a response.
    pub next: u64,
    /// Transport retries left for the current stall.
    pub retry_left: u8,
    /// RNR retries left.
    pub rnr_left: u8,
    /// Local ACK timeout deadline.
    pub ack_deadline: Option<u64>,
    /// RNR back-off deadline (sending is paused until then).
    pub rnr_deadline: Option<u64>,
    /// Limit sequence number: SENDs with SSN beyond it wait for credits (None = unlimited).
    pub lsn: Option<u32>,
    /// PSN a NAK-triggered retry restarted from; until a response acknowledges past it,
    /// further NAKs or implied NAKs for it (stale, already in flight) start no new retry
    /// (rxe's `started_retry`). Timeouts always retry.
    pub retry_from: Option<Psn>,
}

/// Responder state (rxe_resp.c's `qp->resp`).
#[derive(Debug, Clone)]
pub(crate) struct RespState {
    /// Expected PSN.
    pub epsn: Psn,
    /// The PSN after the last SEND, WRITE or ATOMIC packet executed: a duplicate SEND or
    /// WRITE is acknowledged with the one before it, never with a READ's PSN, which the
    /// requester would take for an implied NAK of that READ (rxe's `resp.ack_psn`).
    pub ack_psn: Psn,
    /// Messages completed.
    pub msn: Msn,
    /// Message in progress.
    pub in_msg: InMsg,
    /// Current receive WQE (SEND in progress).
    pub recv_wr_id: u64,
    /// Its SGEs.
    pub recv_sges: Vec<Sge>,
    /// Bytes placed into it so far.
    pub recv_offset: u32,
    /// The receive WQE is held across the packets of a message.
    pub have_recv: bool,
    /// WRITE in progress: the registration (re-resolved with the QP's PD for every packet),
    /// offset in its memory, bytes left of the RETH length.
    pub write_mr: crate::memory::MrRef,
    pub write_mem_offset: usize,
    pub write_left: u32,
    pub write_total: u32,
    /// A PSN sequence error NAK was sent for the current gap (send one per gap).
    pub nak_sent: bool,
    /// Output waiting to be sent (bounded: see `RespState::OUT_LIMIT`).
    pub out: VecDeque<RespItem>,
    /// The responder resources: `max_dest_rd_atomic` slots (rxe's `resp.resources`).
    pub resources: Vec<RdAtomicRes>,
    /// The slot the next READ/ATOMIC takes (the oldest).
    pub res_head: usize,
}

impl RespState {
    /// Most ACK/NAK items waiting besides the resources' replies. ACKs merge into the one
    /// before them and identical ones are not repeated, so a peer cannot make this grow by
    /// repeating requests; past the limit new ACKs are dropped (counted) - the requester's
    /// timer recovers, as from a lost ACK.
    pub const OUT_LIMIT: usize = 64;
}

/// What one role of a QP asks another to do, consumed by that role when it next runs (as
/// rxe's completer sets `req.need_retry` and lets the requester act): roles keep their own
/// state and never call each other's methods.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RoleEvents {
    /// Completer -> requester: go back N from the oldest unacknowledged PSN (a NAK, an
    /// implied NAK, an ACK timeout or the end of an RNR back-off).
    pub rewind: bool,
    /// Completer -> requester: ACKs for packets sent before a rewind moved the oldest
    /// unacknowledged PSN past the send point: resume from there.
    pub resume: bool,
    /// Requester -> completer: WQEs finished without a response (local operations, UC/UD
    /// sends, errors) wait to be retired in order.
    pub retire: bool,
}

/// A queue pair.
pub(crate) struct Qp {
    pub qpn: Qpn,
    pub qp_type: QpType,
    pub state: QpState,
    pub pd: PdId,
    pub send_cq: u32,
    pub recv_cq: u32,
    pub srq: Option<u32>,
    pub caps: QpCaps,
    pub sq_sig_all: bool,
    /// Attributes as set.
    pub attr: QpAttr,
    pub sq: SendQueue,
    pub rq: RecvQueue,
    pub req: ReqState,
    pub comp: CompState,
    pub resp: RespState,
    /// Requests between roles, consumed when the addressed role next runs.
    pub ev: RoleEvents,
    pub counters: QpCounters,
    /// `counters` as the device's running port totals last took them in
    /// (`Device::counters_incremental`).
    pub counted: QpCounters,
    /// In the device's ready list.
    pub queued: bool,
    /// The SQ drained event was delivered for the current SQD period.
    pub sqd_notified: bool,
    /// UDP source port derived from the QP pair.
    pub udp_sport: u16,
    /// Earliest deadline this QP has in the device's timer heap (at most one live entry per
    /// QP, so the heap stays small however often the ACK timer restarts).
    pub timer_queued: Option<u64>,
    /// Queue positions (sq.head, rq.head) when a host last took this QP from the moved list,
    /// and whether it is on that list now.
    pub positions_taken: (u64, u64),
    pub moved_noted: bool,
    /// The dataplane holds this QP's last packet while it resolves the next hop towards
    /// this GID (`DeviceEvent::PathHeld`). An RC QP's packets have not left, so an ACK
    /// timeout then costs no retry. A UD or UC QP (which completes a send when it is built,
    /// with no ACK to wait for) sends nothing more until the hop resolves or fails, so a
    /// burst during address resolution waits in the send queue instead of overflowing the
    /// dataplane's hold list. A NIC resolves the MAC when the AH or the QP's path is set;
    /// this is where ferroce learns it.
    pub held_for: Option<crate::Gid>,
    /// Why the QP went to error when the cause is not in the completion status (a
    /// `verbs::vendor_err` code carried by its error completions; 0: none).
    pub error_cause: u32,
    /// Congestion state (DCQCN), allocated at the QP's first CE mark or CNP.
    pub cc: Option<Box<super::cc::QpCc>>,
    /// Held in the device's parked list while its priority is paused (PFC).
    pub parked: bool,
}

impl Qp {
    pub fn new(qpn: Qpn, init: &super::QpInit) -> Qp {
        let super::QpInit {
            pd,
            qp_type,
            send_cq,
            recv_cq,
            srq,
            caps,
            sq_sig_all,
        } = *init;
        let (send_cq, recv_cq, srq) = (send_cq.0, recv_cq.0, srq.map(|s| s.0));
        let rq_depth = if srq.is_some() {
            0
        } else {
            caps.max_recv_wr as usize
        };
        Qp {
            qpn,
            qp_type,
            state: QpState::Reset,
            pd,
            send_cq,
            recv_cq,
            srq,
            caps,
            sq_sig_all,
            attr: QpAttr::default(),
            sq: SendQueue::new(
                caps.max_send_wr as usize,
                caps.max_send_sge as usize,
                caps.max_inline_data as usize,
            ),
            rq: RecvQueue::new(rq_depth, caps.max_recv_sge as usize),
            req: ReqState {
                psn: Psn::new(0),
                psn_hw: Psn::new(0),
                next: 0,
                noack_pkts: 0,
                rd_atomic_inflight: 0,
                ssn: 0,
            },
            comp: CompState {
                psn: Psn::new(0),
                next: 0,
                retry_left: 7,
                rnr_left: 7,
                ack_deadline: None,
                rnr_deadline: None,
                lsn: None,
                retry_from: None,
            },
            resp: RespState {
                epsn: Psn::new(0),
                ack_psn: Psn::new(0),
                msn: Msn::new(0),
                in_msg: InMsg::None,
                recv_wr_id: 0,
                recv_sges: Vec::with_capacity(caps.max_recv_sge as usize),
                recv_offset: 0,
                have_recv: false,
                write_mr: crate::memory::MrRef::default(),
                write_mem_offset: 0,
                write_left: 0,
                write_total: 0,
                nak_sent: false,
                out: VecDeque::with_capacity(RespState::OUT_LIMIT + 16),
                resources: Vec::new(),
                res_head: 0,
            },
            ev: RoleEvents::default(),
            counters: QpCounters::default(),
            counted: QpCounters::default(),
            queued: false,
            sqd_notified: false,
            udp_sport: 0xc000,
            timer_queued: None,
            positions_taken: (0, 0),
            moved_noted: false,
            held_for: None,
            error_cause: 0,
            cc: None,
            parked: false,
        }
    }

    /// Makes sure the device wakes this QP at `deadline`: pushes a heap entry only if none
    /// is queued at or before it (a later deadline is re-queued when the earlier entry fires).
    pub fn arm_timer(&mut self, sh: &mut super::Shared, deadline: u64) {
        match self.timer_queued {
            Some(t) if t <= deadline => {}
            _ => {
                sh.timers
                    .push(std::cmp::Reverse((deadline, self.qpn.value())));
                self.timer_queued = Some(deadline);
            }
        }
    }

    /// The earliest pending deadline (ACK timeout, end of an RNR back-off, a paced packet or
    /// a DCQCN rate event).
    pub fn next_deadline(&self) -> Option<u64> {
        [
            self.comp.ack_deadline,
            self.comp.rnr_deadline,
            self.cc.as_ref().and_then(|c| c.next_deadline()),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The priority of the QP's next packets: its path's (a UD QP: the next WR's address
    /// handle's), mapped as the device is configured.
    pub fn tx_priority(&self, sh: &Shared) -> u8 {
        let (tc, sl) = if self.qp_type == QpType::Ud {
            if self.req.next == self.sq.tail {
                (0, 0)
            } else {
                self.sq
                    .get(self.req.next)
                    .ud
                    .map_or((0, 0), |u| (u.ah.traffic_class, u.ah.sl))
            }
        } else {
            self.attr.av.map_or((0, 0), |av| (av.traffic_class, av.sl))
        };
        sh.cfg.priorities.priority(tc, sl)
    }

    /// The QP's congestion state, allocated on first use.
    pub fn cc_mut(&mut self) -> &mut super::cc::QpCc {
        self.cc
            .get_or_insert_with(|| Box::new(super::cc::QpCc::new()))
    }

    /// A CNP arrived for this QP (DCQCN's reaction point, ref. dcb.md): the rate is cut when
    /// the reaction point is on, else the CNP is only counted.
    pub fn on_cnp(&mut self, sh: &mut Shared, now: u64) {
        let Some(params) = sh.cfg.cc.rp else {
            self.counters.rp_cnp_ignored += 1;
            return;
        };
        self.counters.rp_cnp_handled += 1;
        let mtu = self.mtu();
        self.cc_mut().on_cnp(params, now, mtu);
        if let Some(d) = self.next_deadline() {
            self.arm_timer(sh, d);
        }
    }

    /// A packet for this QP arrived with CE set (DCQCN's notification point): a CNP is owed
    /// to the sending QP unless one went within `np_min_time_between_cnps`. Connected QPs
    /// only: a UD QP's CE marks are counted (its senders are many and unnamed by the path).
    /// Returns whether the QP now owes a CNP it did not owe before (the device then queues
    /// it for the CNP turn, `Device::next_due_cnp`).
    pub fn on_ce(&mut self, sh: &Shared, now: u64) -> bool {
        self.counters.np_ecn_marked_roce_packets += 1;
        let Some(interval) = sh.cfg.cc.np_min_interval_ns else {
            return false;
        };
        if self.qp_type == QpType::Ud || self.attr.av.is_none() {
            return false;
        }
        let cc = self.cc_mut();
        if cc.np.on_ce(now, interval) && !cc.cnp_pending {
            cc.cnp_pending = true;
            return true;
        }
        false
    }

    /// Whether a CNP is owed to the peer (`on_ce`), not yet sent.
    pub fn owes_cnp(&self) -> bool {
        self.cc.as_ref().is_some_and(|c| c.cnp_pending)
    }

    /// Produces the CNP this QP owes its peer, if any: BTH opcode 0x81 to the peer QP, BECN
    /// set, PSN 0, 16 reserved bytes (ref. roce-wire.md "CNP"), on the CNP DSCP and priority,
    /// never ECN-capable.
    pub fn next_cnp(&mut self, sh: &Shared, tx: &mut Transmit) -> bool {
        match self.cc.as_mut() {
            Some(cc) if cc.cnp_pending => cc.cnp_pending = false,
            _ => return false,
        }
        if !self.can_receive() {
            return false;
        }
        tx.payload.clear();
        tx.qpn = self.qpn;
        let mut path = self.connected_path(sh);
        path.traffic_class = sh.cfg.cc.cnp_dscp << 2;
        path.sl = sh.cfg.cc.cnp_prio;
        tx.path = path;
        let mut bth = BthRepr::new(Opcode::CNP, self.dest_qp(), Psn::new(0));
        bth.becn = true;
        let mut t = TransportRepr::new(bth);
        t.ext.cnp = Some(CnpRepr::default());
        tx.transport = t;
        self.counters.np_cnp_sent += 1;
        true
    }

    /// Path MTU in bytes (UD: the port's active MTU, passed by the device).
    pub fn mtu(&self) -> u32 {
        self.attr.path_mtu.map(Mtu::bytes).unwrap_or(1024)
    }

    pub fn dest_qp(&self) -> Qpn {
        self.attr.dest_qp.unwrap_or(Qpn::new(0))
    }

    pub fn access(&self) -> Access {
        self.attr.access.unwrap_or_default()
    }

    pub fn qkey(&self) -> Qkey {
        self.attr.qkey.unwrap_or_default()
    }

    /// Local ACK timeout in ns (None = infinite): 4.096 us x 2^timeout (IBA 9.7.6.1.3).
    pub fn ack_timeout_ns(&self) -> Option<u64> {
        match self.attr.timeout.unwrap_or(0) {
            0 => None,
            t => Some(4096u64 << t.min(31)),
        }
    }

    /// Whether the responder side accepts packets.
    pub fn can_receive(&self) -> bool {
        matches!(
            self.state,
            QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
        )
    }

    /// Whether the requester side may send.
    pub fn can_send(&self) -> bool {
        matches!(self.state, QpState::Rts | QpState::Sqd)
    }

    /// Validates and applies `attr`. Returns the previous and new states; on error nothing
    /// changes.
    pub fn modify(
        &mut self,
        attr: &QpAttr,
        max_rd_atom: u8,
        gid_count: usize,
    ) -> Result<(QpState, QpState), ModifyError> {
        let mask = Mask::of(attr);
        let from = self.state;
        if let Some(cur) = attr.cur_state {
            if cur != from {
                return Err(ModifyError::CurStateMismatch {
                    given: cur,
                    actual: from,
                });
            }
        }
        let to = attr.state.unwrap_or(from);
        let (required, optional) = transition_rules(self.qp_type, from, to)
            .ok_or(ModifyError::BadTransition { from, to })?;
        // SQD's attributes may change, and the QP may go back to RTS, only once the send
        // queue has drained (IBA 10.3.1; rxe_qp_chk_attr refuses it while sq_draining);
        // ERR and RESET end the drain at any time.
        if from == QpState::Sqd
            && !matches!(to, QpState::Err | QpState::Reset)
            && !self.sq_drained()
        {
            return Err(ModifyError::Invalid(
                "the send queue is still draining (wait for SQ_DRAINED)".into(),
            ));
        }
        let present = mask.0 & !(Mask::STATE);
        // With no state change, the attributes allowed are those of the X -> X transition.
        for bit in 0..21 {
            let b = 1u32 << bit;
            if required & b != 0 && present & b == 0 {
                return Err(ModifyError::Missing(Mask::name(b)));
            }
            if present & b != 0 && (required | optional) & b == 0 {
                return Err(ModifyError::NotAllowed(Mask::name(b)));
            }
        }
        // Value checks.
        if let Some(p) = attr.port {
            if p != 1 {
                return Err(ModifyError::Invalid(format!(
                    "port {p} does not exist (only 1)"
                )));
            }
        }
        if let Some(p) = attr.pkey_index {
            if p != 0 {
                return Err(ModifyError::Invalid(format!(
                    "pkey_index {p} out of range (the P_Key table has one entry)"
                )));
            }
        }
        if let Some(av) = attr.av {
            if av.sgid_index as usize >= gid_count {
                return Err(ModifyError::Invalid(format!(
                    "sgid_index {} out of range ({gid_count} GIDs)",
                    av.sgid_index
                )));
            }
            if av.dgid.is_zero() {
                return Err(ModifyError::Invalid("destination GID is zero".into()));
            }
        }
        if let Some(q) = attr.dest_qp {
            if q.value() == 0 {
                return Err(ModifyError::Invalid(
                    "dest_qp_num 0 is not a valid QP".into(),
                ));
            }
        }
        for (v, name, max) in [
            (attr.timeout, "timeout", 31),
            (attr.retry_cnt, "retry_cnt", 7),
            (attr.rnr_retry, "rnr_retry", 7),
            (attr.min_rnr_timer, "min_rnr_timer", 31),
            (attr.max_rd_atomic, "max_rd_atomic", max_rd_atom),
            (attr.max_dest_rd_atomic, "max_dest_rd_atomic", max_rd_atom),
        ] {
            if let Some(v) = v {
                if v > max {
                    return Err(ModifyError::Invalid(format!("{name} {v} exceeds {max}")));
                }
            }
        }
        if let Some(a) = attr.access {
            if a.0 & !crate::verbs::Access::ALL.0 != 0 {
                return Err(ModifyError::Invalid(format!(
                    "unknown access flags {:#x}",
                    a.0
                )));
            }
        }
        // Apply.
        let a = &mut self.attr;
        macro_rules! take {
            ($($f:ident),*) => { $(if attr.$f.is_some() { a.$f = attr.$f; })* };
        }
        take!(
            path_mtu,
            qkey,
            rq_psn,
            sq_psn,
            dest_qp,
            access,
            av,
            pkey_index,
            port,
            max_rd_atomic,
            max_dest_rd_atomic,
            min_rnr_timer,
            timeout,
            retry_cnt,
            rnr_retry,
            en_sqd_async_notify
        );
        a.state = Some(to);
        if let Some(psn) = attr.rq_psn {
            self.resp.epsn = psn;
            self.resp.ack_psn = psn;
        }
        if let Some(psn) = attr.sq_psn {
            self.req.psn = psn;
            self.req.psn_hw = psn;
            self.comp.psn = psn;
        }
        if let Some(r) = attr.retry_cnt {
            self.comp.retry_left = r;
        }
        if let Some(r) = attr.rnr_retry {
            self.comp.rnr_left = r;
        }
        if let Some(n) = attr.max_dest_rd_atomic {
            // A new number of responder resources starts an empty ring (allocated here, on
            // the control path, never per request).
            let n = n as usize;
            if n != self.resp.resources.len() {
                self.resp.out.retain(|i| matches!(i, RespItem::Ack { .. }));
                self.resp.resources = vec![RdAtomicRes::default(); n];
                self.resp.res_head = 0;
                self.resp.out.reserve(n + RespState::OUT_LIMIT);
            }
        }
        if matches!(self.qp_type, QpType::Rc | QpType::Uc) {
            if let (Some(dq), Some(av)) = (self.attr.dest_qp, self.attr.av) {
                self.udp_sport = udp_sport_connected(av.flow_label, self.qpn.value(), dq.value());
            }
        } else {
            self.udp_sport = udp_sport_ud(self.qpn.value());
        }
        self.state = to;
        if from != to {
            tracing::debug!(qpn = ?self.qpn, ?from, ?to, "QP state");
        }
        if to == QpState::Sqd && from != QpState::Sqd {
            self.sqd_notified = false;
        }
        Ok((from, to))
    }

    /// Back to the state of a newly created QP (transition to RESET): queues emptied,
    /// attributes cleared.
    pub fn reset(&mut self) {
        let fresh = Qp::new(
            self.qpn,
            &super::QpInit {
                pd: self.pd,
                qp_type: self.qp_type,
                send_cq: super::CqId(self.send_cq),
                recv_cq: super::CqId(self.recv_cq),
                srq: self.srq.map(super::SrqId),
                caps: self.caps,
                sq_sig_all: self.sq_sig_all,
            },
        );
        let (counters, counted) = (self.counters, self.counted);
        let (queued, parked, timer_queued) = (self.queued, self.parked, self.timer_queued);
        let (taken, noted) = (self.positions_taken, self.moved_noted);
        *self = fresh;
        // The counters go on (port totals, `rdma statistic`), and so does what the running
        // totals took of them: reset, they would be taken in twice.
        self.counters = counters;
        self.counted = counted;
        // The device's lists and timer heap may hold us: a fresh QP would be added again
        // (a RESET -> RTS loop while paused, or with a long ACK timer pending, would grow
        // them). A heap entry left for the old deadline fires harmlessly (`on_timer`).
        self.queued = queued;
        self.parked = parked;
        self.timer_queued = timer_queued;
        // Positions go back to 0: hosts must see that (and the moved list may hold us).
        self.positions_taken = taken;
        self.moved_noted = noted;
    }
}

/// QP-wide work shared by the roles: the ACK timer, the error transitions and flushes, and
/// receive completions (IBA 10.3.1). Roles call these; they never call each other.
impl Qp {
    /// (Re)starts the local ACK timer from `now` (IBA 9.7.6.1.3); with an infinite timeout
    /// (`timeout` 0) none runs. The one place the ACK deadline is set.
    pub fn restart_ack_timer(&mut self, sh: &mut super::Shared, now: u64) {
        self.comp.ack_deadline = self.ack_timeout_ns().map(|to| now + to);
        if let Some(d) = self.comp.ack_deadline {
            self.arm_timer(sh, d);
        }
    }

    /// Path of this QP (RC/UC: its primary path).
    pub fn connected_path(&self, sh: &Shared) -> super::transmit::Path {
        let av = self
            .attr
            .av
            .unwrap_or(crate::verbs::AddressVector::new(Default::default(), 0));
        super::transmit::Path {
            sgid: sh.gid(av.sgid_index),
            dgid: av.dgid,
            udp_sport: self.udp_sport,
            traffic_class: av.traffic_class,
            flow_label: if av.flow_label == 0 {
                super::transmit::calc_flow_label(self.qpn.value(), self.dest_qp().value())
            } else {
                av.flow_label
            },
            hop_limit: av.hop_limit,
            sl: av.sl,
            dmac: av.dmac,
        }
    }

    /// Stops the local ACK timer (nothing outstanding, an RNR back-off, or the QP left RTS).
    pub fn stop_ack_timer(&mut self) {
        self.comp.ack_deadline = None;
    }

    /// Whether no WQE of the send queue is under way: every one not yet retired is still
    /// unstarted (WQEs start in order, so the oldest tells) or done. A multi-packet message
    /// being sent, or one a rewind put back for a retry, is under way (rxe: comp.psn ==
    /// req.psn).
    pub(crate) fn sq_drained(&self) -> bool {
        (self.sq.head..self.sq.tail)
            .map(|i| self.sq.get(i))
            .find(|w| !matches!(w.state, WqeState::Done(_)))
            .is_none_or(|w| !w.started)
    }

    /// In SQD, once every WQE started before the drain has completed (at once if none was
    /// outstanding), raises SQ_DRAINED when the application asked for it (IBA 10.3.1,
    /// en_sqd_async_notify) - once per drain.
    pub(crate) fn check_sq_drained(&mut self, sh: &mut Shared) {
        if self.state == QpState::Sqd && self.sq_drained() && !self.sqd_notified {
            if self.attr.en_sqd_async_notify == Some(true) {
                sh.events
                    .push_back(crate::verbs::AsyncEvent::SqDrained(self.qpn));
            }
            self.sqd_notified = true;
        }
    }

    /// A local error of a send WR (bad SGE, refused local operation). RC: the QP goes to ERR.
    /// UC and UD go to SQE instead (IBA 10.3.1, Send Queue Error): the failed WR has its
    /// error completion, the rest of the send queue is flushed, and the receive queue keeps
    /// working until the application returns the QP to RTS. (rxe moves UC/UD QPs to ERR.)
    pub(crate) fn send_queue_error(&mut self, sh: &mut Shared) {
        if self.qp_type == QpType::Rc || self.state == QpState::Err {
            self.enter_error(sh);
            return;
        }
        tracing::debug!(qpn = ?self.qpn, "QP to SQE (send error)");
        self.state = QpState::Sqe;
        self.attr.state = Some(QpState::Sqe);
        self.flush_sq(sh);
    }

    /// Moves the QP to ERR (IBA 10.3.1): every outstanding send and receive WR completes with
    /// WR_FLUSH_ERR. Responses already queued (a final NAK) are still sent.
    pub(crate) fn enter_error(&mut self, sh: &mut Shared) {
        if self.state == QpState::Err {
            self.flush(sh);
            return;
        }
        tracing::debug!(qpn = ?self.qpn, from = ?self.state, cause = self.error_cause, "QP to ERR");
        self.state = QpState::Err;
        self.stop_ack_timer();
        self.comp.rnr_deadline = None;
        self.flush(sh);
        if self.srq.is_some() {
            // IBA 11.6.3: a QP on an SRQ reports that it will consume no more WQEs.
            sh.events
                .push_back(crate::verbs::AsyncEvent::QpLastWqeReached(self.qpn));
        }
    }

    /// Completes every outstanding WR with WR_FLUSH_ERR.
    pub(crate) fn flush(&mut self, sh: &mut Shared) {
        self.flush_sq(sh);
        self.flush_rq(sh);
    }

    /// Completes every outstanding send WR with WR_FLUSH_ERR.
    pub(crate) fn flush_sq(&mut self, sh: &mut Shared) {
        for idx in self.sq.head..self.sq.tail {
            let w = self.sq.get_mut(idx);
            if !matches!(w.state, WqeState::Done(_)) {
                w.state = WqeState::Done(WcStatus::WrFlushErr);
            }
        }
        self.req.next = self.sq.tail;
        self.comp.next = self.sq.tail;
        self.retire(sh);
    }

    /// Completes every outstanding receive WR with WR_FLUSH_ERR.
    fn flush_rq(&mut self, sh: &mut Shared) {
        // A receive WQE held by a message in progress is flushed too.
        if self.resp.have_recv {
            self.resp.have_recv = false;
            let c = self.recv_completion(
                self.resp.recv_wr_id,
                WcStatus::WrFlushErr,
                WcOpcode::Recv,
                0,
            );
            sh.complete(self.recv_cq, c);
        }
        if self.srq.is_none() {
            let mut sges = std::mem::take(&mut self.resp.recv_sges);
            while let Some(wr_id) = self.rq.pop_into(&mut sges) {
                let c = self.recv_completion(wr_id, WcStatus::WrFlushErr, WcOpcode::Recv, 0);
                sh.complete(self.recv_cq, c);
            }
            self.resp.recv_sges = sges;
        }
        if self.qp_type == QpType::Rc {
            self.resp.in_msg = InMsg::None;
        }
    }

    /// A receive completion skeleton.
    pub(crate) fn recv_completion(
        &self,
        wr_id: u64,
        status: WcStatus,
        opcode: WcOpcode,
        len: u32,
    ) -> Completion {
        Completion {
            wr_id,
            status,
            opcode,
            vendor_err: if status == WcStatus::Success {
                0
            } else {
                self.error_cause
            },
            byte_len: len,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num: self.qpn,
            src_qp: self.dest_qp(),
            wc_flags: WcFlags::default(),
            pkey_index: 0,
            sl: 0,
            solicited: false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Gid;
    use crate::verbs::AddressVector;

    fn qp(t: QpType) -> Qp {
        Qp::new(
            Qpn::new(0x12),
            &crate::engine::QpInit {
                pd: PdId(1),
                qp_type: t,
                send_cq: crate::engine::CqId(1),
                recv_cq: crate::engine::CqId(1),
                srq: None,
                caps: QpCaps::default(),
                sq_sig_all: false,
            },
        )
    }

    fn init() -> QpAttr {
        QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(Access::REMOTE_WRITE),
            ..Default::default()
        }
    }

    fn rtr() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rtr),
            av: Some(AddressVector::new(Gid::from_ipv4([10, 99, 0, 2]), 0)),
            path_mtu: Some(Mtu::M1024),
            dest_qp: Some(Qpn::new(0x20)),
            rq_psn: Some(Psn::new(100)),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(12),
            ..Default::default()
        }
    }

    fn rts() -> QpAttr {
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(200)),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..Default::default()
        }
    }

    #[test]
    fn rc_walks_reset_init_rtr_rts() {
        let mut q = qp(QpType::Rc);
        q.modify(&init(), 16, 2).unwrap();
        q.modify(&rtr(), 16, 2).unwrap();
        assert_eq!(q.resp.epsn, Psn::new(100));
        q.modify(&rts(), 16, 2).unwrap();
        assert_eq!(q.state, QpState::Rts);
        assert_eq!(q.req.psn, Psn::new(200));
        assert_eq!(q.ack_timeout_ns(), Some(4096 << 14));
        // rdma_get_udp_sport: flow label 0x12 * 0x20 = 0x240, folded to 14 bits, | 0xC000.
        assert_eq!(q.udp_sport, 0xc240);
    }

    #[test]
    fn bad_modifies_leave_the_qp_unchanged() {
        let mut q = qp(QpType::Rc);
        assert_eq!(
            q.modify(&rtr(), 16, 2).unwrap_err(),
            ModifyError::BadTransition {
                from: QpState::Reset,
                to: QpState::Rtr
            }
        );
        let mut a = init();
        a.access = None;
        assert_eq!(
            q.modify(&a, 16, 2).unwrap_err(),
            ModifyError::Missing("qp_access_flags")
        );
        let mut a = init();
        a.sq_psn = Some(Psn::new(1));
        assert_eq!(
            q.modify(&a, 16, 2).unwrap_err(),
            ModifyError::NotAllowed("sq_psn")
        );
        assert_eq!(q.state, QpState::Reset);
        q.modify(&init(), 16, 2).unwrap();
        let mut r = rtr();
        r.max_dest_rd_atomic = Some(200);
        assert!(matches!(q.modify(&r, 16, 2), Err(ModifyError::Invalid(_))));
        let mut r = rtr();
        r.av.as_mut().unwrap().sgid_index = 5;
        assert!(matches!(q.modify(&r, 16, 2), Err(ModifyError::Invalid(_))));
        let mut r = rtr();
        r.path_mtu = None;
        assert_eq!(
            q.modify(&r, 16, 2).unwrap_err(),
            ModifyError::Missing("path_mtu")
        );
        assert_eq!(q.state, QpState::Init);
        assert_eq!(q.attr.path_mtu, None);
        let mut c = rtr();
        c.cur_state = Some(QpState::Rts);
        assert_eq!(
            q.modify(&c, 16, 2).unwrap_err(),
            ModifyError::CurStateMismatch {
                given: QpState::Rts,
                actual: QpState::Init
            }
        );
        assert_eq!(q.state, QpState::Init);
    }

    #[test]
    fn sqd_to_sqd_takes_the_port_on_rc_only() {
        // ib_modify_qp_is_ok's table: IB_QP_PORT is optional for RC's SQD -> SQD only.
        let (_, rc) = transition_rules(QpType::Rc, QpState::Sqd, QpState::Sqd).unwrap();
        let (_, uc) = transition_rules(QpType::Uc, QpState::Sqd, QpState::Sqd).unwrap();
        assert!(rc & Mask::PORT != 0 && uc & Mask::PORT == 0);
    }

    #[test]
    fn ud_needs_qkey_and_no_path() {
        let mut q = qp(QpType::Ud);
        let mut a = init();
        a.access = None;
        assert_eq!(
            q.modify(&a, 16, 2).unwrap_err(),
            ModifyError::Missing("qkey")
        );
        a.qkey = Some(Qkey(0x11111111));
        q.modify(&a, 16, 2).unwrap();
        q.modify(
            &QpAttr {
                state: Some(QpState::Rtr),
                ..Default::default()
            },
            16,
            2,
        )
        .unwrap();
        assert!(q
            .modify(
                &QpAttr {
                    state: Some(QpState::Rts),
                    sq_psn: Some(Psn::new(0)),
                    timeout: Some(3),
                    ..Default::default()
                },
                16,
                2
            )
            .is_err());
        // 0xC000 + hash_32(0x12, 14), as rxe derives a UD QP's port.
        assert_eq!(q.udp_sport, 0xf806);
    }

    #[test]
    fn any_state_to_error_and_reset() {
        let mut q = qp(QpType::Uc);
        q.modify(
            &QpAttr {
                state: Some(QpState::Err),
                ..Default::default()
            },
            16,
            2,
        )
        .unwrap();
        assert!(q.modify(&init(), 16, 2).is_err());
        q.modify(
            &QpAttr {
                state: Some(QpState::Reset),
                ..Default::default()
            },
            16,
            2,
        )
        .unwrap();
        q.reset();
        assert_eq!(q.state, QpState::Reset);
        q.modify(&init(), 16, 2).unwrap();
    }
}
