//! libibverbs' numbering (rdma-core `<infiniband/verbs.h>`), converted here and nowhere else:
//! QP types and states, path MTUs, send opcodes and flags, QP attribute masks, completion
//! statuses and opcodes, and async event types. The drop-in libibverbs, the C client and the
//! host interface's slots all speak these numbers; each converts through the functions below,
//! so a value means the same and is checked the same whichever API carried it.

use core::fmt;

use super::{
    Access, AddressVector, AsyncEvent, Mtu, QpAttr, QpState, QpType, SendFlags, WcOpcode, WcStatus,
    WrOp,
};
use crate::types::{Lkey, Psn, Qkey, Qpn, Rkey};

/// `enum ibv_wr_opcode`.
pub mod wr_opcode {
    /// IBV_WR_RDMA_WRITE.
    pub const RDMA_WRITE: u32 = 0;
    /// IBV_WR_RDMA_WRITE_WITH_IMM.
    pub const RDMA_WRITE_WITH_IMM: u32 = 1;
    /// IBV_WR_SEND.
    pub const SEND: u32 = 2;
    /// IBV_WR_SEND_WITH_IMM.
    pub const SEND_WITH_IMM: u32 = 3;
    /// IBV_WR_RDMA_READ.
    pub const RDMA_READ: u32 = 4;
    /// IBV_WR_ATOMIC_CMP_AND_SWP.
    pub const ATOMIC_CMP_AND_SWP: u32 = 5;
    /// IBV_WR_ATOMIC_FETCH_AND_ADD.
    pub const ATOMIC_FETCH_AND_ADD: u32 = 6;
    /// IBV_WR_LOCAL_INV.
    pub const LOCAL_INV: u32 = 7;
    /// IBV_WR_BIND_MW.
    pub const BIND_MW: u32 = 8;
    /// IBV_WR_SEND_WITH_INV.
    pub const SEND_WITH_INV: u32 = 9;
    /// IBV_WR_TSO (raw packet QPs; not offered).
    pub const TSO: u32 = 10;
    /// IBV_WR_DRIVER1 (provider-specific; not offered).
    pub const DRIVER1: u32 = 11;
    /// IBV_WR_FLUSH (not offered).
    pub const FLUSH: u32 = 14;
    /// IBV_WR_ATOMIC_WRITE (not offered).
    pub const ATOMIC_WRITE: u32 = 15;
}

/// `enum ibv_qp_attr_mask`: which fields of an `ibv_qp_attr` a modify carries.
pub mod qp_attr_mask {
    /// IBV_QP_STATE.
    pub const STATE: u32 = 1 << 0;
    /// IBV_QP_CUR_STATE.
    pub const CUR_STATE: u32 = 1 << 1;
    /// IBV_QP_EN_SQD_ASYNC_NOTIFY.
    pub const EN_SQD_ASYNC_NOTIFY: u32 = 1 << 2;
    /// IBV_QP_ACCESS_FLAGS.
    pub const ACCESS_FLAGS: u32 = 1 << 3;
    /// IBV_QP_PKEY_INDEX.
    pub const PKEY_INDEX: u32 = 1 << 4;
    /// IBV_QP_PORT.
    pub const PORT: u32 = 1 << 5;
    /// IBV_QP_QKEY.
    pub const QKEY: u32 = 1 << 6;
    /// IBV_QP_AV.
    pub const AV: u32 = 1 << 7;
    /// IBV_QP_PATH_MTU.
    pub const PATH_MTU: u32 = 1 << 8;
    /// IBV_QP_TIMEOUT.
    pub const TIMEOUT: u32 = 1 << 9;
    /// IBV_QP_RETRY_CNT.
    pub const RETRY_CNT: u32 = 1 << 10;
    /// IBV_QP_RNR_RETRY.
    pub const RNR_RETRY: u32 = 1 << 11;
    /// IBV_QP_RQ_PSN.
    pub const RQ_PSN: u32 = 1 << 12;
    /// IBV_QP_MAX_QP_RD_ATOMIC.
    pub const MAX_QP_RD_ATOMIC: u32 = 1 << 13;
    /// IBV_QP_ALT_PATH.
    pub const ALT_PATH: u32 = 1 << 14;
    /// IBV_QP_MIN_RNR_TIMER.
    pub const MIN_RNR_TIMER: u32 = 1 << 15;
    /// IBV_QP_SQ_PSN.
    pub const SQ_PSN: u32 = 1 << 16;
    /// IBV_QP_MAX_DEST_RD_ATOMIC.
    pub const MAX_DEST_RD_ATOMIC: u32 = 1 << 17;
    /// IBV_QP_PATH_MIG_STATE.
    pub const PATH_MIG_STATE: u32 = 1 << 18;
    /// IBV_QP_CAP.
    pub const CAP: u32 = 1 << 19;
    /// IBV_QP_DEST_QPN.
    pub const DEST_QPN: u32 = 1 << 20;
    /// IBV_QP_RATE_LIMIT.
    pub const RATE_LIMIT: u32 = 1 << 25;
    /// The attributes ferroce does not support in a modify (alternate paths, path migration,
    /// resizing the queues, rate limits): EOPNOTSUPP.
    pub const UNSUPPORTED: u32 = ALT_PATH | PATH_MIG_STATE | CAP | RATE_LIMIT;
}

/// `enum ibv_event_type` (the kinds ferroce reports).
pub mod event_type {
    /// IBV_EVENT_CQ_ERR.
    pub const CQ_ERR: u32 = 0;
    /// IBV_EVENT_QP_FATAL.
    pub const QP_FATAL: u32 = 1;
    /// IBV_EVENT_QP_REQ_ERR.
    pub const QP_REQ_ERR: u32 = 2;
    /// IBV_EVENT_QP_ACCESS_ERR.
    pub const QP_ACCESS_ERR: u32 = 3;
    /// IBV_EVENT_SQ_DRAINED.
    pub const SQ_DRAINED: u32 = 5;
    /// IBV_EVENT_DEVICE_FATAL.
    pub const DEVICE_FATAL: u32 = 8;
    /// IBV_EVENT_PORT_ACTIVE.
    pub const PORT_ACTIVE: u32 = 9;
    /// IBV_EVENT_PORT_ERR.
    pub const PORT_ERR: u32 = 10;
    /// IBV_EVENT_SRQ_LIMIT_REACHED.
    pub const SRQ_LIMIT_REACHED: u32 = 15;
    /// IBV_EVENT_QP_LAST_WQE_REACHED.
    pub const QP_LAST_WQE_REACHED: u32 = 16;
}

/// A value libibverbs' numbering does not allow here, or one ferroce does not offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IbvError {
    /// A value or combination libibverbs does not define or forbids here (EINVAL).
    Invalid(&'static str, u64),
    /// A value libibverbs defines that ferroce does not implement (EOPNOTSUPP).
    Unsupported(&'static str, u64),
    /// An address vector without a GRH on RoCE (EINVAL): the most common RoCE bring-up
    /// mistake, so it gets its own explanation.
    NotGlobal,
}

impl IbvError {
    /// Whether the answer is EOPNOTSUPP rather than EINVAL.
    pub fn is_unsupported(&self) -> bool {
        matches!(self, IbvError::Unsupported(..))
    }
}

impl fmt::Display for IbvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IbvError::Invalid(what, v) => write!(f, "invalid {what} {v:#x}"),
            IbvError::Unsupported(what, v) => write!(f, "{what} {v:#x} is not supported"),
            IbvError::NotGlobal => f.write_str(
                "ah_attr.is_global is 0, but RoCE addresses the peer by its GID: set \
                 is_global = 1 and ah_attr.grh.dgid (the peer's GID) and grh.sgid_index (1 for \
                 this port's IPv4 address, as on rxe)",
            ),
        }
    }
}

impl QpType {
    /// From `enum ibv_qp_type` (IBV_QPT_RC 2, UC 3, UD 4); None for the types ferroce does
    /// not have.
    pub fn from_ibv(v: u32) -> Option<QpType> {
        match v {
            2 => Some(QpType::Rc),
            3 => Some(QpType::Uc),
            4 => Some(QpType::Ud),
            _ => None,
        }
    }

    /// The `enum ibv_qp_type` value.
    pub fn to_ibv(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Uc => 3,
            QpType::Ud => 4,
        }
    }
}

/// The states in `enum ibv_qp_state` order (IBV_QPS_RESET = 0 ... IBV_QPS_ERR = 6).
const QP_STATES: [QpState; 7] = [
    QpState::Reset,
    QpState::Init,
    QpState::Rtr,
    QpState::Rts,
    QpState::Sqd,
    QpState::Sqe,
    QpState::Err,
];

impl QpState {
    /// From `enum ibv_qp_state`; None for values it does not define (IBV_QPS_UNKNOWN).
    pub fn from_ibv(v: u32) -> Option<QpState> {
        QP_STATES.get(v as usize).copied()
    }

    /// The `enum ibv_qp_state` value.
    pub fn to_ibv(self) -> u32 {
        QP_STATES.iter().position(|x| *x == self).unwrap_or(6) as u32
    }
}

impl Mtu {
    /// From `enum ibv_mtu` (1 = 256 ... 5 = 4096).
    pub const fn from_ibv(v: u32) -> Option<Mtu> {
        Mtu::from_number(v)
    }

    /// The `enum ibv_mtu` value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
}

impl SendFlags {
    /// The flags of an `ibv_send_flags` value that mean something to ferroce (FENCE,
    /// SIGNALED, SOLICITED, INLINE); IP_CSUM (raw packet QPs) and provider bits are ignored,
    /// as rxe ignores them.
    pub const fn from_ibv(v: u32) -> SendFlags {
        SendFlags(v & 0xf)
    }
}

/// The operation fields of a send work request as the C APIs hand them over (`ibv_send_wr`
/// without its lists and address handle; immediate data in host order): what
/// [`WrOp::from_ibv`] converts and [`WrOp::to_ibv`] produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IbvSendFields {
    /// `wr.rdma.remote_addr` / `wr.atomic.remote_addr`.
    pub remote_addr: u64,
    /// `wr.rdma.rkey` / `wr.atomic.rkey`.
    pub rkey: u32,
    /// `imm_data` (host order).
    pub imm: u32,
    /// `invalidate_rkey` (LOCAL_INV, SEND_WITH_INV).
    pub invalidate_rkey: u32,
    /// `wr.atomic.compare_add`.
    pub compare_add: u64,
    /// `wr.atomic.swap`.
    pub swap: u64,
    /// `bind_mw` (BIND_MW).
    pub bind: IbvBind,
}

/// A memory window bind as `ibv_send_wr.bind_mw` / `ibv_mw_bind` give it, with the objects
/// already turned into their keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IbvBind {
    /// The window's current rkey (`mw->rkey`).
    pub mw: u32,
    /// Its new rkey.
    pub rkey: u32,
    /// The MR's lkey (`bind_info.mr->lkey`; 0 with length 0, an unbind).
    pub mr: u32,
    /// `bind_info.addr`.
    pub addr: u64,
    /// `bind_info.length`.
    pub length: u64,
    /// `bind_info.mw_access_flags`.
    pub access: u32,
}

impl WrOp {
    /// The operation an `ibv_wr_opcode` and its fields ask for.
    pub fn from_ibv(opcode: u32, f: &IbvSendFields) -> Result<WrOp, IbvError> {
        use wr_opcode::*;
        let (remote_addr, rkey) = (f.remote_addr, Rkey(f.rkey));
        Ok(match opcode {
            RDMA_WRITE => WrOp::Write { remote_addr, rkey },
            RDMA_WRITE_WITH_IMM => WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: f.imm,
            },
            SEND => WrOp::Send,
            SEND_WITH_IMM => WrOp::SendWithImm { imm: f.imm },
            RDMA_READ => WrOp::Read { remote_addr, rkey },
            ATOMIC_CMP_AND_SWP => WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare: f.compare_add,
                swap: f.swap,
            },
            ATOMIC_FETCH_AND_ADD => WrOp::FetchAdd {
                remote_addr,
                rkey,
                add: f.compare_add,
            },
            LOCAL_INV => WrOp::LocalInv {
                rkey: Rkey(f.invalidate_rkey),
            },
            SEND_WITH_INV => WrOp::SendWithInv {
                rkey: Rkey(f.invalidate_rkey),
            },
            BIND_MW => {
                let b = &f.bind;
                // Access bits a window may not have are the bind's error (MW_BIND_ERR in its
                // completion, as rxe answers), not the post's: the engine checks them.
                WrOp::BindMw {
                    mw: Rkey(b.mw),
                    rkey: Rkey(b.rkey),
                    mr: Lkey(b.mr),
                    addr: b.addr,
                    length: b.length,
                    access: Access(b.access),
                }
            }
            TSO | DRIVER1 | FLUSH | ATOMIC_WRITE => {
                return Err(IbvError::Unsupported("send opcode", opcode as u64))
            }
            o => return Err(IbvError::Invalid("send opcode", o as u64)),
        })
    }

    /// The `ibv_wr_opcode` and fields of this operation; None for fast registration, which
    /// libibverbs' numbering does not have (the host interface gives it its own code).
    pub fn to_ibv(&self) -> Option<(u32, IbvSendFields)> {
        use wr_opcode::*;
        let mut f = IbvSendFields::default();
        let op = match *self {
            WrOp::Send => SEND,
            WrOp::SendWithImm { imm } => {
                f.imm = imm;
                SEND_WITH_IMM
            }
            WrOp::SendWithInv { rkey } => {
                f.invalidate_rkey = rkey.0;
                SEND_WITH_INV
            }
            WrOp::Write { remote_addr, rkey } => {
                (f.remote_addr, f.rkey) = (remote_addr, rkey.0);
                RDMA_WRITE
            }
            WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm,
            } => {
                (f.remote_addr, f.rkey, f.imm) = (remote_addr, rkey.0, imm);
                RDMA_WRITE_WITH_IMM
            }
            WrOp::Read { remote_addr, rkey } => {
                (f.remote_addr, f.rkey) = (remote_addr, rkey.0);
                RDMA_READ
            }
            WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare,
                swap,
            } => {
                (f.remote_addr, f.rkey, f.compare_add, f.swap) =
                    (remote_addr, rkey.0, compare, swap);
                ATOMIC_CMP_AND_SWP
            }
            WrOp::FetchAdd {
                remote_addr,
                rkey,
                add,
            } => {
                (f.remote_addr, f.rkey, f.compare_add) = (remote_addr, rkey.0, add);
                ATOMIC_FETCH_AND_ADD
            }
            WrOp::LocalInv { rkey } => {
                f.invalidate_rkey = rkey.0;
                LOCAL_INV
            }
            WrOp::BindMw {
                mw,
                rkey,
                mr,
                addr,
                length,
                access,
            } => {
                f.bind = IbvBind {
                    mw: mw.0,
                    rkey: rkey.0,
                    mr: mr.0,
                    addr,
                    length,
                    access: access.0,
                };
                BIND_MW
            }
            WrOp::RegMr { .. } => return None,
        };
        Some((op, f))
    }
}

/// An `ibv_qp_attr` as numbers (what both C APIs hand to a modify), converted by
/// [`QpAttr::from_ibv`]; fields the mask does not name are not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IbvQpAttr {
    /// `qp_state`.
    pub qp_state: u32,
    /// `cur_qp_state`.
    pub cur_qp_state: u32,
    /// `en_sqd_async_notify`.
    pub en_sqd_async_notify: u8,
    /// `qp_access_flags`.
    pub qp_access_flags: u32,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `port_num`.
    pub port_num: u8,
    /// `qkey`.
    pub qkey: u32,
    /// `ah_attr.is_global` (RoCE needs it set).
    pub ah_is_global: bool,
    /// `ah_attr` as an address vector.
    pub av: AddressVector,
    /// `path_mtu` (`enum ibv_mtu`).
    pub path_mtu: u32,
    /// `timeout`.
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `rq_psn`.
    pub rq_psn: u32,
    /// `max_rd_atomic`.
    pub max_rd_atomic: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// `sq_psn`.
    pub sq_psn: u32,
    /// `max_dest_rd_atomic`.
    pub max_dest_rd_atomic: u8,
    /// `dest_qp_num`.
    pub dest_qp_num: u32,
}

/// An [`IbvQpAttr`] from a value whose fields carry `struct ibv_qp_attr`'s names and
/// types (libibverbs' own struct, the C client's `struct ferroce_qp_attr`), with the address
/// handle's global flag and address vector as the caller converts them (the two structs
/// lay out `ah_attr` differently).
#[macro_export]
macro_rules! ibv_qp_attr_of {
    ($a:expr, $ah_is_global:expr, $av:expr) => {{
        let a = &$a;
        $crate::verbs::ibv::IbvQpAttr {
            qp_state: a.qp_state,
            cur_qp_state: a.cur_qp_state,
            en_sqd_async_notify: a.en_sqd_async_notify,
            qp_access_flags: a.qp_access_flags,
            pkey_index: a.pkey_index,
            port_num: a.port_num,
            qkey: a.qkey,
            ah_is_global: $ah_is_global,
            av: $av,
            path_mtu: a.path_mtu,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            rq_psn: a.rq_psn,
            max_rd_atomic: a.max_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            sq_psn: a.sq_psn,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            dest_qp_num: a.dest_qp_num,
        }
    }};
}

impl QpAttr {
    /// The attributes a modify with `mask` (`enum ibv_qp_attr_mask`) sets from `a`.
    pub fn from_ibv(mask: u32, a: &IbvQpAttr) -> Result<QpAttr, IbvError> {
        use qp_attr_mask::*;
        let has = |bit: u32| mask & bit != 0;
        if mask & UNSUPPORTED != 0 {
            return Err(IbvError::Unsupported(
                "QP attribute mask bits",
                (mask & UNSUPPORTED) as u64,
            ));
        }
        // Bits libibverbs does not define: EOPNOTSUPP, as the kernel's uverbs answers.
        let known = ((1 << 21) - 1) | RATE_LIMIT;
        if mask & !known != 0 {
            return Err(IbvError::Unsupported(
                "QP attribute mask bits",
                (mask & !known) as u64,
            ));
        }
        // Each attribute is the one of `a` when its mask bit is set; a value out of its enum
        // fails the modify (checked in field order).
        let state = |bit: u32, v: u32| {
            has(bit)
                .then(|| QpState::from_ibv(v).ok_or(IbvError::Invalid("QP state", v as u64)))
                .transpose()
        };
        Ok(QpAttr {
            state: state(STATE, a.qp_state)?,
            cur_state: state(CUR_STATE, a.cur_qp_state)?,
            en_sqd_async_notify: has(EN_SQD_ASYNC_NOTIFY).then_some(a.en_sqd_async_notify != 0),
            // A QP's access flags are its remote rights (and LOCAL_WRITE); MR-only bits
            // (MW_BIND, ZERO_BASED, ON_DEMAND...) are ignored, as rxe does.
            access: has(ACCESS_FLAGS).then_some(Access(a.qp_access_flags & 0xf)),
            pkey_index: has(PKEY_INDEX).then_some(a.pkey_index),
            port: has(PORT).then_some(a.port_num),
            qkey: has(QKEY).then_some(Qkey(a.qkey)),
            // RoCE addresses by GID: a path without a GRH cannot be routed.
            av: match (has(AV), a.ah_is_global) {
                (false, _) => None,
                (true, true) => Some(a.av),
                (true, false) => return Err(IbvError::NotGlobal),
            },
            path_mtu: has(PATH_MTU)
                .then(|| {
                    Mtu::from_ibv(a.path_mtu)
                        .ok_or(IbvError::Invalid("path_mtu", a.path_mtu as u64))
                })
                .transpose()?,
            timeout: has(TIMEOUT).then_some(a.timeout),
            retry_cnt: has(RETRY_CNT).then_some(a.retry_cnt),
            rnr_retry: has(RNR_RETRY).then_some(a.rnr_retry),
            rq_psn: has(RQ_PSN).then_some(Psn::new(a.rq_psn)),
            max_rd_atomic: has(MAX_QP_RD_ATOMIC).then_some(a.max_rd_atomic),
            min_rnr_timer: has(MIN_RNR_TIMER).then_some(a.min_rnr_timer),
            sq_psn: has(SQ_PSN).then_some(Psn::new(a.sq_psn)),
            max_dest_rd_atomic: has(MAX_DEST_RD_ATOMIC).then_some(a.max_dest_rd_atomic),
            dest_qp: has(DEST_QPN).then_some(Qpn::new(a.dest_qp_num)),
        })
    }
}

impl WcStatus {
    /// From `enum ibv_wc_status`; a value it does not define reads as GENERAL_ERR.
    pub fn from_ibv(v: u32) -> WcStatus {
        WcStatus::from_number(v).unwrap_or(WcStatus::GeneralErr)
    }

    /// The `enum ibv_wc_status` value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
}

impl WcOpcode {
    /// From `enum ibv_wc_opcode`; None for a value it does not define.
    pub fn from_ibv(v: u32) -> Option<WcOpcode> {
        WcOpcode::from_number(v)
    }

    /// The `enum ibv_wc_opcode` value.
    pub const fn to_ibv(self) -> u32 {
        self as u32
    }
}

impl AsyncEvent {
    /// The `enum ibv_event_type` and the object it concerns (QP number, SRQ or CQ id; 0 for
    /// port and device events).
    pub fn to_ibv(&self) -> (u32, u32) {
        use event_type::*;
        match *self {
            AsyncEvent::CqError(c) => (CQ_ERR, c),
            AsyncEvent::QpFatal(q) => (QP_FATAL, q.value()),
            AsyncEvent::QpRequestError(q) => (QP_REQ_ERR, q.value()),
            AsyncEvent::QpAccessError(q) => (QP_ACCESS_ERR, q.value()),
            AsyncEvent::SqDrained(q) => (SQ_DRAINED, q.value()),
            AsyncEvent::DeviceFatal => (DEVICE_FATAL, 0),
            AsyncEvent::PortActive => (PORT_ACTIVE, 0),
            AsyncEvent::PortError => (PORT_ERR, 0),
            AsyncEvent::SrqLimitReached(s) => (SRQ_LIMIT_REACHED, s),
            AsyncEvent::QpLastWqeReached(q) => (QP_LAST_WQE_REACHED, q.value()),
        }
    }

    /// The event of an `enum ibv_event_type` about `object`; None for kinds ferroce does not
    /// report.
    pub fn from_ibv(kind: u32, object: u32) -> Option<AsyncEvent> {
        use event_type::*;
        let q = Qpn::new(object & 0xff_ffff);
        Some(match kind {
            CQ_ERR => AsyncEvent::CqError(object),
            QP_FATAL => AsyncEvent::QpFatal(q),
            QP_REQ_ERR => AsyncEvent::QpRequestError(q),
            QP_ACCESS_ERR => AsyncEvent::QpAccessError(q),
            SQ_DRAINED => AsyncEvent::SqDrained(q),
            DEVICE_FATAL => AsyncEvent::DeviceFatal,
            PORT_ACTIVE => AsyncEvent::PortActive,
            PORT_ERR => AsyncEvent::PortError,
            SRQ_LIMIT_REACHED => AsyncEvent::SrqLimitReached(object),
            QP_LAST_WQE_REACHED => AsyncEvent::QpLastWqeReached(q),
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_send_operation_survives_the_round_trip() {
        // REG_MR is the library's own (ibv_wr_* has no opcode for it).
        let ops = WrOp::SAMPLES
            .into_iter()
            .filter(|o| !matches!(o, WrOp::RegMr { .. }));
        for op in ops {
            let (code, f) = op.to_ibv().unwrap();
            assert_eq!(WrOp::from_ibv(code, &f), Ok(op));
        }
    }

    #[test]
    fn opcodes_number_as_verbs_h_does() {
        // <infiniband/verbs.h>: IBV_WR_RDMA_WRITE 0, SEND 2, RDMA_READ 4, LOCAL_INV 7,
        // BIND_MW 8, SEND_WITH_INV 9.
        let f = IbvSendFields::default();
        assert_eq!(WrOp::from_ibv(2, &f), Ok(WrOp::Send));
        assert!(matches!(WrOp::from_ibv(4, &f), Ok(WrOp::Read { .. })));
        assert!(matches!(
            WrOp::from_ibv(9, &f),
            Ok(WrOp::SendWithInv { .. })
        ));
        assert_eq!(
            WrOp::from_ibv(15, &f),
            Err(IbvError::Unsupported("send opcode", 15))
        );
        assert_eq!(
            WrOp::from_ibv(12, &f),
            Err(IbvError::Invalid("send opcode", 12))
        );
    }

    #[test]
    fn qp_attributes_follow_the_mask() {
        use qp_attr_mask::*;
        let a = IbvQpAttr {
            qp_state: 2,
            path_mtu: 5,
            dest_qp_num: 0x11,
            rq_psn: 7,
            qp_access_flags: 0x2f,
            ah_is_global: true,
            ..IbvQpAttr::default()
        };
        let q =
            QpAttr::from_ibv(STATE | PATH_MTU | DEST_QPN | RQ_PSN | ACCESS_FLAGS | AV, &a).unwrap();
        assert_eq!(q.state, Some(QpState::Rtr));
        assert_eq!(q.path_mtu, Some(Mtu::M4096));
        assert_eq!(q.dest_qp, Some(Qpn::new(0x11)));
        assert_eq!(q.rq_psn, Some(Psn::new(7)));
        assert_eq!(q.access, Some(Access(0xf)), "only a QP's own rights");
        assert_eq!(q.sq_psn, None, "not in the mask, not read");
        assert!(q.av.is_some());
        let not_global = IbvQpAttr {
            ah_is_global: false,
            ..a
        };
        assert_eq!(QpAttr::from_ibv(AV, &not_global), Err(IbvError::NotGlobal));
        assert!(QpAttr::from_ibv(CAP, &a).unwrap_err().is_unsupported());
        assert!(QpAttr::from_ibv(1 << 22, &a).unwrap_err().is_unsupported());
        let bad_state = IbvQpAttr { qp_state: 7, ..a };
        assert_eq!(
            QpAttr::from_ibv(STATE, &bad_state),
            Err(IbvError::Invalid("QP state", 7))
        );
        let bad_mtu = IbvQpAttr { path_mtu: 6, ..a };
        assert!(QpAttr::from_ibv(PATH_MTU, &bad_mtu).is_err());
    }

    #[test]
    fn statuses_opcodes_and_events_round_trip() {
        for v in 0..22 {
            assert_eq!(WcStatus::from_ibv(v).to_ibv(), v);
        }
        assert_eq!(WcStatus::from_ibv(99), WcStatus::GeneralErr);
        for v in [0, 1, 2, 3, 4, 5, 6, 8, 128, 129] {
            assert_eq!(WcOpcode::from_ibv(v).unwrap().to_ibv(), v);
        }
        assert_eq!(WcOpcode::from_ibv(7), None);
        for e in [
            AsyncEvent::CqError(3),
            AsyncEvent::QpFatal(Qpn::new(0x12)),
            AsyncEvent::QpRequestError(Qpn::new(0x12)),
            AsyncEvent::QpAccessError(Qpn::new(0x12)),
            AsyncEvent::SqDrained(Qpn::new(0x12)),
            AsyncEvent::DeviceFatal,
            AsyncEvent::PortActive,
            AsyncEvent::PortError,
            AsyncEvent::SrqLimitReached(4),
            AsyncEvent::QpLastWqeReached(Qpn::new(0x13)),
        ] {
            let (k, o) = e.to_ibv();
            assert_eq!(AsyncEvent::from_ibv(k, o), Some(e));
        }
        assert_eq!(AsyncEvent::from_ibv(4, 0), None, "COMM_EST is not reported");
    }
}
