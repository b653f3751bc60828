//! Verbs-level types: what applications post and poll, and the QP attributes they modify. The
//! names follow libibverbs; its numbering (`ibv_wc_status`, `ibv_wr_opcode`, QP attribute
//! masks, `ibv_event_type`...) is converted in one place, [`ibv`], for every API that speaks
//! it (the drop-in libibverbs, the C client, the host interface's slots).

pub mod ibv;

use crate::types::{Gid, Lkey, Psn, Qkey, Qpn, Rkey};
use core::fmt;

/// Declares an enum whose variants carry the numbers of a libibverbs enum, and its
/// `from_number` (the variant of a number; None for one it does not define), so that the
/// numbering is written once, in the variants.
macro_rules! numbered_enum {
    (
        $(#[$m:meta])*
        pub enum $name:ident {
            $($(#[$vm:meta])* $v:ident = $n:literal,)*
        }
    ) => {
        $(#[$m])*
        pub enum $name {
            $($(#[$vm])* $v = $n,)*
        }

        impl $name {
            /// The variant numbered `n`, if any.
            pub(crate) const fn from_number(n: u32) -> Option<$name> {
                match n {
                    $($n => Some($name::$v),)*
                    _ => None,
                }
            }
        }
    };
}

/// Memory and QP access rights (`ibv_access_flags`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Access(pub u32);

impl Access {
    /// Local write (required for receive buffers and READ/ATOMIC destinations).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote RDMA WRITE.
    pub const REMOTE_WRITE: Access = Access(2);
    /// Remote RDMA READ.
    pub const REMOTE_READ: Access = Access(4);
    /// Remote ATOMIC.
    pub const REMOTE_ATOMIC: Access = Access(8);
    /// Memory windows may be bound to the MR (`IBV_ACCESS_MW_BIND`).
    pub const MW_BIND: Access = Access(0x10);
    /// A memory window addressed from 0 (`IBV_ACCESS_ZERO_BASED`; in a bind only).
    pub const ZERO_BASED: Access = Access(0x20);
    /// Every flag an MR may have.
    pub const ALL: Access = Access(0x1f);
    /// The flags a memory window may be bound with: remote access and zero-based
    /// addressing (LOCAL_WRITE is accepted and has no meaning for a window, as rxe does).
    pub const MW_ALLOWED: Access = Access(0x2f);

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// Whether any remote flag is set (the MR then gets an rkey).
    pub const fn any_remote(self) -> bool {
        self.0 & 0xe != 0
    }
}

impl core::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (bit, name) in [
            (1, "LOCAL_WRITE"),
            (2, "REMOTE_WRITE"),
            (4, "REMOTE_READ"),
            (8, "REMOTE_ATOMIC"),
            (0x10, "MW_BIND"),
            (0x20, "ZERO_BASED"),
        ] {
            if self.0 & bit != 0 {
                parts.push(name);
            }
        }
        write!(f, "Access({})", parts.join("|"))
    }
}

/// ferroce's `vendor_err` codes: in an error completion, what the status alone does not say
/// (verbs leaves `vendor_err` to the provider).
pub mod vendor_err {
    /// The QP went to error because its peer's MAC could not be resolved (no ARP/ND reply).
    pub const PEER_UNREACHABLE: u32 = 0x101;
    /// A work request the RNIC took from the application's ring but could not post.
    pub const REJECTED_AT_POST: u32 = 0x102;

    /// What a code means, for messages.
    pub fn describe(code: u32) -> Option<&'static str> {
        match code {
            PEER_UNREACHABLE => Some("the peer's address could not be resolved (no ARP/ND reply)"),
            REJECTED_AT_POST => Some("the work request could not be posted (refused by the RNIC)"),
            _ => None,
        }
    }
}

/// Transport service of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpType {
    /// Reliable connected.
    Rc,
    /// Unreliable connected.
    Uc,
    /// Unreliable datagram.
    Ud,
}

/// QP state (IBA 10.3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum QpState {
    /// Reset.
    Reset,
    /// Initialised.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Send queue drained.
    Sqd,
    /// Send queue error.
    Sqe,
    /// Error.
    Err,
}

numbered_enum! {
    /// Path MTU (`ibv_mtu`: 1 = 256 ... 5 = 4096).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
    #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
    pub enum Mtu {
        /// 256 bytes.
        M256 = 1,
        /// 512 bytes.
        M512 = 2,
        /// 1024 bytes.
        M1024 = 3,
        /// 2048 bytes.
        M2048 = 4,
        /// 4096 bytes.
        M4096 = 5,
    }
}

impl Mtu {
    /// Payload bytes per packet.
    pub const fn bytes(self) -> u32 {
        128 << (self as u32)
    }

    /// From a byte count (exactly 256, 512, 1024, 2048 or 4096).
    pub const fn from_bytes(b: u32) -> Option<Mtu> {
        match b {
            256 => Some(Mtu::M256),
            512 => Some(Mtu::M512),
            1024 => Some(Mtu::M1024),
            2048 => Some(Mtu::M2048),
            4096 => Some(Mtu::M4096),
            _ => None,
        }
    }

    /// The largest path MTU whose packets fit an IP MTU of `ip_mtu` bytes (RoCEv2 headers:
    /// IPv4 20 / IPv6 40, UDP 8, BTH 12, up to 28 of extended headers, ICRC 4).
    pub fn for_ip_mtu(ip_mtu: u32, ipv6: bool) -> Mtu {
        let overhead = if ipv6 { 40 } else { 20 } + 8 + 12 + 28 + 4;
        let room = ip_mtu.saturating_sub(overhead);
        [Mtu::M4096, Mtu::M2048, Mtu::M1024, Mtu::M512]
            .into_iter()
            .find(|m| m.bytes() <= room)
            .unwrap_or(Mtu::M256)
    }
}

/// A scatter/gather element: `length` bytes at `addr` in the MR whose local key is `lkey`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Sge {
    /// Address (as the application registered it).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the MR.
    pub lkey: Lkey,
}

/// Send work request flags (`ibv_send_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SendFlags(pub u32);

impl SendFlags {
    /// Wait for prior READ/ATOMIC to complete before starting.
    pub const FENCE: SendFlags = SendFlags(1);
    /// Generate a completion.
    pub const SIGNALED: SendFlags = SendFlags(2);
    /// Set the solicited-event bit.
    pub const SOLICITED: SendFlags = SendFlags(4);
    /// Copy the data at post time (SGE keys are not checked).
    pub const INLINE: SendFlags = SendFlags(8);

    /// Whether every flag of `o` is set.
    pub const fn contains(self, o: SendFlags) -> bool {
        self.0 & o.0 == o.0
    }
}

impl core::ops::BitOr for SendFlags {
    type Output = SendFlags;
    fn bitor(self, rhs: SendFlags) -> SendFlags {
        SendFlags(self.0 | rhs.0)
    }
}

/// Where a UD send goes (an address handle plus the remote QP and Q_Key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdDest {
    /// The address handle.
    pub ah: AddressVector,
    /// Destination QP.
    pub remote_qpn: Qpn,
    /// Q_Key to send (if its top bit is set, the QP's own Q_Key is used: IBA 10.2.5).
    pub remote_qkey: Qkey,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WrOp {
    /// SEND.
    Send,
    /// SEND with immediate data.
    SendWithImm {
        /// Immediate data (host order; carried big-endian).
        imm: u32,
    },
    /// SEND with invalidate (RC).
    SendWithInv {
        /// Remote key the responder invalidates.
        rkey: Rkey,
    },
    /// RDMA WRITE.
    Write {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// RDMA WRITE with immediate data.
    WriteWithImm {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Immediate data.
        imm: u32,
    },
    /// RDMA READ into the SGEs.
    Read {
        /// Remote address.
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
    },
    /// ATOMIC compare and swap (8 bytes; the original value goes to the SGE).
    CompareSwap {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value compared with the target.
        compare: u64,
        /// Value written if equal.
        swap: u64,
    },
    /// ATOMIC fetch and add.
    FetchAdd {
        /// Remote address (8-byte aligned).
        remote_addr: u64,
        /// Remote key.
        rkey: Rkey,
        /// Value added.
        add: u64,
    },
    /// Invalidate a local MR's keys.
    LocalInv {
        /// The key to invalidate.
        rkey: Rkey,
    },
    /// Bind a memory window (`IBV_WR_BIND_MW`, and `ibv_bind_mw` for type 1): the window
    /// whose current key is `mw` gets the key byte of `rkey`, the range `addr..addr+length`
    /// of the MR `mr` and the remote access `access` (with ZERO_BASED, peers address it from
    /// 0). A type 1 window with `length` 0 is unbound. IBA 10.6.7.
    BindMw {
        /// The window's current key.
        mw: Rkey,
        /// Its new key (only the low 8 bits count: the index stays the window's).
        rkey: Rkey,
        /// The MR it is bound to.
        mr: Lkey,
        /// First address (a virtual address of the MR).
        addr: u64,
        /// Length (0: unbind, type 1).
        length: u64,
        /// Remote access through the window (REMOTE_*, ZERO_BASED).
        access: Access,
    },
    /// Fast registration: rebind an MR (allocated for fast registration) to a new range,
    /// access and key byte.
    RegMr {
        /// The MR's current local key (its index selects the MR).
        lkey: Lkey,
        /// New key byte (low 8 bits of the new lkey/rkey).
        key: u8,
        /// New start address.
        addr: u64,
        /// New length.
        length: u64,
        /// New access rights.
        access: Access,
    },
}

impl WrOp {
    /// One operation of each kind, with fields that differ from each other, for tests of the
    /// encodings that carry them (ibverbs numbering, the host ring's post slot).
    pub const SAMPLES: [WrOp; 11] = [
        WrOp::Send,
        WrOp::SendWithImm { imm: 7 },
        WrOp::SendWithInv { rkey: Rkey(0x505) },
        WrOp::Write {
            remote_addr: 0xdead_0000,
            rkey: Rkey(0x606),
        },
        WrOp::WriteWithImm {
            remote_addr: 1,
            rkey: Rkey(2),
            imm: 3,
        },
        WrOp::Read {
            remote_addr: 4,
            rkey: Rkey(5),
        },
        WrOp::CompareSwap {
            remote_addr: 8,
            rkey: Rkey(9),
            compare: 10,
            swap: 11,
        },
        WrOp::FetchAdd {
            remote_addr: 16,
            rkey: Rkey(17),
            add: 18,
        },
        WrOp::LocalInv { rkey: Rkey(19) },
        WrOp::BindMw {
            mw: Rkey(0x80301),
            rkey: Rkey(0x80302),
            mr: Lkey(0x1ff),
            addr: 0x9000,
            length: 512,
            access: Access(Access::REMOTE_READ.0 | Access::ZERO_BASED.0),
        },
        WrOp::RegMr {
            lkey: Lkey(0x2001),
            key: 0x42,
            addr: 0x7000,
            length: 4096,
            access: Access(Access::LOCAL_WRITE.0 | Access::REMOTE_WRITE.0),
        },
    ];

    /// The completion opcode this work request reports.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            WrOp::Send | WrOp::SendWithImm { .. } | WrOp::SendWithInv { .. } => WcOpcode::Send,
            WrOp::Write { .. } | WrOp::WriteWithImm { .. } => WcOpcode::RdmaWrite,
            WrOp::Read { .. } => WcOpcode::RdmaRead,
            WrOp::CompareSwap { .. } => WcOpcode::CompSwap,
            WrOp::FetchAdd { .. } => WcOpcode::FetchAdd,
            WrOp::LocalInv { .. } => WcOpcode::LocalInv,
            WrOp::BindMw { .. } => WcOpcode::BindMw,
            WrOp::RegMr { .. } => WcOpcode::RegMr,
        }
    }

    /// READ or ATOMIC (needs a response, counts against max_rd_atomic).
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            WrOp::Read { .. } | WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. }
        )
    }

    /// Carried on the wire (as opposed to a local operation).
    pub const fn is_remote(&self) -> bool {
        !matches!(
            self,
            WrOp::LocalInv { .. } | WrOp::RegMr { .. } | WrOp::BindMw { .. }
        )
    }
}

/// A send work request (`ibv_send_wr`). The SGEs are copied at post time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: WrOp,
    /// Local buffers.
    pub sg_list: &'a [Sge],
    /// Flags.
    pub flags: SendFlags,
    /// UD destination (UD QPs only).
    pub ud: Option<UdDest>,
}

/// A receive work request (`ibv_recv_wr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Buffers the incoming SEND is scattered into.
    pub sg_list: &'a [Sge],
}

numbered_enum! {
    /// Completion status (`ibv_wc_status`, same numbering).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[repr(u32)]
    pub enum WcStatus {
        /// Success.
        Success = 0,
        /// Local length error (e.g. receive buffer too small).
        LocLenErr = 1,
        /// Local QP operation error.
        LocQpOpErr = 2,
        /// Local EE context operation error.
        LocEecOpErr = 3,
        /// Local protection error (bad lkey, SGE out of bounds).
        LocProtErr = 4,
        /// Flushed because the QP entered the error state.
        WrFlushErr = 5,
        /// Memory window bind error.
        MwBindErr = 6,
        /// Bad response (unexpected opcode or length).
        BadRespErr = 7,
        /// Local access error.
        LocAccessErr = 8,
        /// Remote invalid request (NAK 0x61).
        RemInvReqErr = 9,
        /// Remote access error (NAK 0x62).
        RemAccessErr = 10,
        /// Remote operational error (NAK 0x63).
        RemOpErr = 11,
        /// Transport retry counter exceeded.
        RetryExcErr = 12,
        /// RNR retry counter exceeded.
        RnrRetryExcErr = 13,
        /// Local RDD violation.
        LocRddViolErr = 14,
        /// Remote invalid RD request.
        RemInvRdReqErr = 15,
        /// Remote aborted.
        RemAbortErr = 16,
        /// Invalid EE context number.
        InvEecnErr = 17,
        /// Invalid EE context state.
        InvEecStateErr = 18,
        /// Fatal error.
        FatalErr = 19,
        /// Response timeout.
        RespTimeoutErr = 20,
        /// General error.
        GeneralErr = 21,
    }
}

impl WcStatus {
    /// libibverbs' `ibv_wc_status_str` text.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
        }
    }
}

numbered_enum! {
    /// Completion opcode (`ibv_wc_opcode`, same numbering).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    #[repr(u32)]
    pub enum WcOpcode {
        /// SEND (any variant).
        Send = 0,
        /// RDMA WRITE (any variant).
        RdmaWrite = 1,
        /// RDMA READ.
        RdmaRead = 2,
        /// Compare and swap.
        CompSwap = 3,
        /// Fetch and add.
        FetchAdd = 4,
        /// Memory window bind.
        BindMw = 5,
        /// Local invalidate.
        LocalInv = 6,
        /// Fast registration.
        RegMr = 8,
        /// A received SEND.
        Recv = 128,
        /// A received RDMA WRITE with immediate.
        RecvRdmaWithImm = 129,
    }
}

/// Completion flags (`ibv_wc_flags`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WcFlags(pub u32);

impl WcFlags {
    /// The first 40 bytes of the receive buffer hold a GRH (UD).
    pub const GRH: WcFlags = WcFlags(1);
    /// Immediate data is valid.
    pub const WITH_IMM: WcFlags = WcFlags(2);
    /// An rkey was invalidated (SEND with invalidate).
    pub const WITH_INV: WcFlags = WcFlags(8);

    /// Whether every flag of `o` is set.
    pub const fn contains(self, o: WcFlags) -> bool {
        self.0 & o.0 == o.0
    }

    /// Sets `o`.
    pub fn insert(&mut self, o: WcFlags) {
        self.0 |= o.0;
    }
}

/// A work completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// Status.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Vendor error detail (0 = none).
    pub vendor_err: u32,
    /// Bytes transferred (received bytes for a receive).
    pub byte_len: u32,
    /// Immediate data (host order), valid with `WcFlags::WITH_IMM`.
    pub imm_data: u32,
    /// Invalidated rkey, valid with `WcFlags::WITH_INV`.
    pub invalidated_rkey: u32,
    /// Local QP number.
    pub qp_num: Qpn,
    /// Source QP (UD receives).
    pub src_qp: Qpn,
    /// Flags.
    pub wc_flags: WcFlags,
    /// Partition key index.
    pub pkey_index: u16,
    /// Service level (0 on RoCE).
    pub sl: u8,
    /// Solicited event was requested by the sender (receives).
    pub solicited: bool,
}

impl Default for Completion {
    /// An all-zero completion (a successful SEND on QP 0): a placeholder for poll buffers.
    fn default() -> Self {
        Completion {
            wr_id: 0,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            vendor_err: 0,
            byte_len: 0,
            imm_data: 0,
            invalidated_rkey: 0,
            qp_num: Qpn::new(0),
            src_qp: Qpn::new(0),
            wc_flags: WcFlags(0),
            pkey_index: 0,
            sl: 0,
            solicited: false,
        }
    }
}

/// A path to a remote port (an address handle / the QP's primary path).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct AddressVector {
    /// Destination GID.
    pub dgid: Gid,
    /// Index of our source GID.
    pub sgid_index: u8,
    /// IPv6 flow label (0: derive from the QPNs, as rxe does).
    pub flow_label: u32,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// Traffic class: DSCP (6 bits) and ECN (2 bits), as `ibv_global_route.traffic_class`.
    pub traffic_class: u8,
    /// Service level (maps to the 802.1p priority when the dataplane tags frames).
    pub sl: u8,
    /// Destination MAC if the application already knows it (`None`: resolve the GID).
    pub dmac: Option<[u8; 6]>,
}

impl AddressVector {
    /// A path to `dgid` from source GID `sgid_index` with default TTL 64.
    pub const fn new(dgid: Gid, sgid_index: u8) -> AddressVector {
        AddressVector {
            dgid,
            sgid_index,
            flow_label: 0,
            hop_limit: 64,
            traffic_class: 0,
            sl: 0,
            dmac: None,
        }
    }
}

/// Attributes for `modify_qp` (`ibv_qp_attr`); a `Some` field is in the attribute mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpAttr {
    /// Target state.
    pub state: Option<QpState>,
    /// Current state the caller believes the QP is in.
    pub cur_state: Option<QpState>,
    /// Path MTU.
    pub path_mtu: Option<Mtu>,
    /// Q_Key (UD).
    pub qkey: Option<Qkey>,
    /// Expected receive PSN.
    pub rq_psn: Option<Psn>,
    /// Send PSN.
    pub sq_psn: Option<Psn>,
    /// Destination QP.
    pub dest_qp: Option<Qpn>,
    /// Remote access allowed on this QP.
    pub access: Option<Access>,
    /// Primary path.
    pub av: Option<AddressVector>,
    /// P_Key index.
    pub pkey_index: Option<u16>,
    /// Port number (1).
    pub port: Option<u8>,
    /// Outstanding READ/ATOMIC this QP may issue.
    pub max_rd_atomic: Option<u8>,
    /// Outstanding READ/ATOMIC this QP accepts (responder resources).
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK timer code this QP sends.
    pub min_rnr_timer: Option<u8>,
    /// Local ACK timeout exponent (4.096 us x 2^timeout; 0 = infinite).
    pub timeout: Option<u8>,
    /// Transport retries (3 bits).
    pub retry_cnt: Option<u8>,
    /// RNR retries (3 bits; 7 = infinite).
    pub rnr_retry: Option<u8>,
    /// Notify when the send queue drains (SQD).
    pub en_sqd_async_notify: Option<bool>,
}

/// Sizes requested at QP creation (`ibv_qp_cap`); the device may round them up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// SGEs per send WR.
    pub max_send_sge: u32,
    /// SGEs per receive WR.
    pub max_recv_sge: u32,
    /// Inline data per send WR.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 128,
            max_recv_wr: 128,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 0,
        }
    }
}

impl QpAttr {
    /// RTR -> RTS of a reliable QP: sending from `sq_psn`, ACK timeout exponent `timeout`,
    /// `max_rd_atomic` READs/ATOMICs outstanding, and the most retries (7, and 7 for RNR:
    /// without end).
    pub fn rts(sq_psn: Psn, timeout: u8, max_rd_atomic: u8) -> QpAttr {
        QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(sq_psn),
            timeout: Some(timeout),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(max_rd_atomic),
            ..Default::default()
        }
    }
}

/// Everything `query_qp` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct QpInfo {
    /// QP number.
    pub qpn: Qpn,
    /// Type.
    pub qp_type: QpType,
    /// State.
    pub state: QpState,
    /// Capabilities actually provided.
    pub caps: QpCaps,
    /// Attributes as set (unset ones are `None`).
    pub attr: QpAttr,
    /// Whether every send WR generates a completion.
    pub sq_sig_all: bool,
    /// The QP's current DCQCN rate in kb/s while congestion control holds it below line
    /// rate (`None`: not throttled).
    #[cfg_attr(feature = "serde", serde(default))]
    pub rate_kbps: Option<u64>,
    /// In SQD, whether the send queue is still draining (`ibv_qp_attr.sq_draining`): a
    /// message it started is not finished yet.
    #[cfg_attr(feature = "serde", serde(default))]
    pub sq_draining: bool,
}

/// Asynchronous events (`ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A QP hit an error that is not tied to a WR.
    QpFatal(Qpn),
    /// A QP received a request it could not process (invalid request).
    QpRequestError(Qpn),
    /// A QP's responder hit a remote access violation.
    QpAccessError(Qpn),
    /// A QP attached to an SRQ entered the error state and will consume no more WQEs.
    QpLastWqeReached(Qpn),
    /// A QP's send queue drained (SQD).
    SqDrained(Qpn),
    /// An SRQ fell below its limit.
    SrqLimitReached(u32),
    /// A CQ overflowed.
    CqError(u32),
    /// The port came up.
    PortActive,
    /// The port went down.
    PortError,
    /// The device stopped working (IBV_EVENT_DEVICE_FATAL): every later call fails.
    DeviceFatal,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qp_states_number_as_libibverbs_does() {
        // <infiniband/verbs.h>: IBV_QPS_RESET 0, INIT 1, RTR 2, RTS 3, SQD 4, SQE 5, ERR 6.
        assert_eq!(QpState::Reset.to_ibv(), 0);
        assert_eq!(QpState::Rts.to_ibv(), 3);
        assert_eq!(QpState::Sqe.to_ibv(), 5);
        assert_eq!(QpState::Err.to_ibv(), 6);
        for v in 0..7 {
            assert_eq!(QpState::from_ibv(v).unwrap().to_ibv(), v);
        }
        assert_eq!(QpState::from_ibv(7), None, "IBV_QPS_UNKNOWN");
    }

    #[test]
    fn qp_types_number_as_libibverbs_does() {
        // <infiniband/verbs.h>: IBV_QPT_RC 2, UC 3, UD 4; RAW_PACKET 8 and XRC are not ours.
        for (t, v) in [(QpType::Rc, 2), (QpType::Uc, 3), (QpType::Ud, 4)] {
            assert_eq!(t.to_ibv(), v);
            assert_eq!(QpType::from_ibv(v), Some(t));
        }
        assert_eq!(QpType::from_ibv(8), None);
    }
}
