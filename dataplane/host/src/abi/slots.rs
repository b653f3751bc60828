//! The ring slots of the host interface, as they lie in memory shared with an application:
//! `repr(C)` structs of integers and byte arrays only, valid for every bit pattern, so the
//! reader never interprets memory another process wrote as a Rust enum, bool or Option.
//!
//! Each slot is copied out of the ring first and then decoded with every tag, count and length
//! checked ([`PostSlot::decode`]); a slot that does not decode is a protocol error of the
//! writer, reported as a [`SlotError`] - never trusted, never a panic.

use roce::types::{Gid, Lkey, Qkey, Qpn};
use roce::verbs::{
    ibv, Access, AddressVector, AsyncEvent, Completion, SendFlags, Sge, UdDest, WcFlags, WcOpcode,
    WcStatus, WrOp,
};

use crate::abi::ring::Plain;

/// Most SGEs a work request can carry through the host interface.
pub const MAX_HOST_SGE: usize = 16;
/// Bytes a post slot holds for SGEs (16 bytes each) or, in their place, inline data.
pub const POST_PAYLOAD: usize = MAX_HOST_SGE * 16;
const _: () = assert!(roce::engine::MAX_INLINE <= POST_PAYLOAD);

/// What a post slot asks for (`PostSlot::kind`).
pub mod post_kind {
    /// A send WR on the QP `handle`.
    pub const SEND: u32 = 1;
    /// A receive WR on the QP `handle`.
    pub const RECV: u32 = 2;
    /// A receive WR on the SRQ `handle`.
    pub const SRQ_RECV: u32 = 3;
}

/// ferroce's own send operation code in `PostSlot::opcode`, beside libibverbs'
/// `ibv_wr_opcode` values (`roce::verbs::ibv::wr_opcode`), which every other operation uses:
/// fast registration, which `ibv_wr_opcode` has no code for (verbs registers with a call).
pub const WR_REG_MR: u32 = 0x80;

/// `PostSlot::ud_flags`: the WR carries a UD destination.
const UD_PRESENT: u8 = 1;
/// `PostSlot::ud_flags`: the address handle names the destination MAC.
const UD_DMAC: u8 = 2;

/// A posted work request (send, receive, SRQ receive) in the command ring.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct PostSlot {
    /// `post_kind::*`.
    pub kind: u32,
    /// QP number (send, receive) or SRQ id.
    pub handle: u32,
    /// Work request id.
    pub wr_id: u64,
    /// `wr_opcode::*` (send WRs).
    pub opcode: u32,
    /// `SendFlags` bits.
    pub flags: u32,
    /// SGE count (0..=MAX_HOST_SGE); 0 for inline data.
    pub nsge: u32,
    /// Inline bytes in `payload` (with the INLINE flag).
    pub inline_len: u32,
    /// WRITE/READ/ATOMIC: remote address. REG_MR: the new start address.
    pub remote_addr: u64,
    /// WRITE/READ/ATOMIC: rkey. SEND_WITH_INV/LOCAL_INV: the key. REG_MR: the MR's lkey.
    pub rkey: u32,
    /// Immediate data. REG_MR: the new access flags.
    pub imm: u32,
    /// ATOMIC: compare (CAS) or add (FETCH_AND_ADD). REG_MR: the new length.
    pub compare_add: u64,
    /// ATOMIC CAS: swap. REG_MR: the new key byte.
    pub swap: u64,
    /// UD: destination QP.
    pub ud_qpn: u32,
    /// UD: Q_Key.
    pub ud_qkey: u32,
    /// UD: destination GID.
    pub ud_dgid: [u8; 16],
    /// UD: flow label.
    pub ud_flow_label: u32,
    /// UD: source GID index, hop limit, traffic class, service level.
    pub ud_sgid_index: u8,
    /// UD: hop limit.
    pub ud_hop_limit: u8,
    /// UD: traffic class.
    pub ud_traffic_class: u8,
    /// UD: service level.
    pub ud_sl: u8,
    /// UD: destination MAC (with `UD_DMAC`).
    pub ud_dmac: [u8; 6],
    /// `UD_PRESENT` | `UD_DMAC`.
    pub ud_flags: u8,
    /// Padding.
    pub pad: u8,
    /// SGEs (address u64, length u32, lkey u32; little-endian) or inline bytes.
    pub payload: [u8; POST_PAYLOAD],
}

// SAFETY: repr(C) of integers and byte arrays: no pointers, every bit pattern valid.
unsafe impl Plain for PostSlot {}

// The layout is an ABI shared with the C client (and the offsets the tests poke at).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(offset_of!(PostSlot, opcode) == 16);
    assert!(offset_of!(PostSlot, flags) == 20);
    assert!(offset_of!(PostSlot, nsge) == 24);
    assert!(offset_of!(PostSlot, inline_len) == 28);
    assert!(offset_of!(PostSlot, payload) == 104);
    assert!(size_of::<PostSlot>() == 104 + POST_PAYLOAD);
};

impl Default for PostSlot {
    fn default() -> Self {
        PostSlot {
            kind: 0,
            handle: 0,
            wr_id: 0,
            opcode: 0,
            flags: 0,
            nsge: 0,
            inline_len: 0,
            remote_addr: 0,
            rkey: 0,
            imm: 0,
            compare_add: 0,
            swap: 0,
            ud_qpn: 0,
            ud_qkey: 0,
            ud_dgid: [0; 16],
            ud_flow_label: 0,
            ud_sgid_index: 0,
            ud_hop_limit: 0,
            ud_traffic_class: 0,
            ud_sl: 0,
            ud_dmac: [0; 6],
            ud_flags: 0,
            pad: 0,
            payload: [0; POST_PAYLOAD],
        }
    }
}

/// Why a slot did not decode (the writer broke the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// Unknown `kind`.
    #[error("unknown post kind {0}")]
    Kind(u32),
    /// Unknown send opcode.
    #[error("unknown send opcode {0}")]
    Opcode(u32),
    /// Flag bits ferroce does not define.
    #[error("unknown send flags {0:#x}")]
    Flags(u32),
    /// More SGEs than a slot holds.
    #[error("{0} SGEs (at most 16)")]
    Sges(u32),
    /// More inline bytes than a slot holds.
    #[error("{0} inline bytes (at most 256)")]
    Inline(u32),
    /// Inline data on an operation that cannot carry it, or both SGEs and inline data.
    #[error("inline data where it cannot be")]
    InlineMisuse,
    /// Access flags ferroce does not define.
    #[error("unknown access flags {0:#x}")]
    Access(u32),
}

/// A post slot, decoded and checked.
// Lives on the stack for one post: boxing the large variant would allocate per send.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, Copy)]
pub enum Post {
    /// A send WR for the QP.
    Send {
        /// QP.
        qpn: Qpn,
        /// Its fields (SGEs in `sges[..nsge]`, inline bytes in `inline[..inline_len]`).
        wr: DecodedSend,
    },
    /// A receive WR for the QP.
    Recv {
        /// QP.
        qpn: Qpn,
        /// Work request id.
        wr_id: u64,
        /// SGE count.
        nsge: usize,
        /// SGEs.
        sges: [Sge; MAX_HOST_SGE],
    },
    /// A receive WR for the SRQ.
    SrqRecv {
        /// SRQ id.
        srq: u32,
        /// Work request id.
        wr_id: u64,
        /// SGE count.
        nsge: usize,
        /// SGEs.
        sges: [Sge; MAX_HOST_SGE],
    },
}

/// A send WR decoded from a slot.
#[derive(Debug, Clone, Copy)]
pub struct DecodedSend {
    /// Work request id.
    pub wr_id: u64,
    /// Operation.
    pub op: WrOp,
    /// Flags.
    pub flags: SendFlags,
    /// UD destination.
    pub ud: Option<UdDest>,
    /// SGE count.
    pub nsge: usize,
    /// SGEs.
    pub sges: [Sge; MAX_HOST_SGE],
    /// Inline byte count.
    pub inline_len: usize,
    /// Inline bytes.
    pub inline: [u8; POST_PAYLOAD],
}

impl DecodedSend {
    /// The WR as the engine takes it (its inline bytes apart: `inline()`).
    pub fn as_wr(&self) -> roce::verbs::SendWr<'_> {
        roce::verbs::SendWr {
            wr_id: self.wr_id,
            op: self.op,
            sg_list: &self.sges[..self.nsge],
            flags: self.flags,
            ud: self.ud,
        }
    }

    /// The inline bytes, if this is an inline WR.
    pub fn inline(&self) -> Option<&[u8]> {
        (self.flags.contains(SendFlags::INLINE) && !self.op.is_read_or_atomic())
            .then(|| &self.inline[..self.inline_len])
    }
}

fn put_sges(payload: &mut [u8; POST_PAYLOAD], list: &[Sge]) {
    for (sge, b) in list.iter().zip(payload.chunks_exact_mut(16)) {
        b[..8].copy_from_slice(&sge.addr.to_le_bytes());
        b[8..12].copy_from_slice(&sge.length.to_le_bytes());
        b[12..].copy_from_slice(&sge.lkey.0.to_le_bytes());
    }
}

fn get_sges(payload: &[u8; POST_PAYLOAD], n: usize) -> [Sge; MAX_HOST_SGE] {
    let mut out = [Sge::default(); MAX_HOST_SGE];
    for (o, b) in out.iter_mut().zip(payload.chunks_exact(16)).take(n) {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[..8]);
        *o = Sge {
            addr: u64::from_le_bytes(a),
            length: u32_at(8),
            lkey: Lkey(u32_at(12)),
        };
    }
    out
}

impl PostSlot {
    /// A receive WR (QP or SRQ per `kind`).
    pub fn recv(kind: u32, handle: u32, wr_id: u64, sges: &[Sge]) -> Result<PostSlot, SlotError> {
        if sges.len() > MAX_HOST_SGE {
            return Err(SlotError::Sges(sges.len() as u32));
        }
        let mut s = PostSlot {
            kind,
            handle,
            wr_id,
            nsge: sges.len() as u32,
            ..PostSlot::default()
        };
        put_sges(&mut s.payload, sges);
        Ok(s)
    }

    /// A send WR on QP `qpn`; `inline` carries the payload of an inline WR (copied here).
    pub fn send(
        qpn: Qpn,
        wr: &roce::verbs::SendWr<'_>,
        inline: Option<&[u8]>,
    ) -> Result<PostSlot, SlotError> {
        let mut s = PostSlot {
            kind: post_kind::SEND,
            handle: qpn.value(),
            wr_id: wr.wr_id,
            flags: wr.flags.0,
            ..PostSlot::default()
        };
        match wr.op.to_ibv() {
            Some((opcode, f)) => {
                s.opcode = opcode;
                (s.remote_addr, s.rkey, s.imm, s.compare_add, s.swap) =
                    (f.remote_addr, f.rkey, f.imm, f.compare_add, f.swap);
                match opcode {
                    ibv::wr_opcode::LOCAL_INV | ibv::wr_opcode::SEND_WITH_INV => {
                        s.rkey = f.invalidate_rkey
                    }
                    ibv::wr_opcode::BIND_MW => {
                        let b = f.bind;
                        (s.rkey, s.swap, s.remote_addr, s.compare_add, s.imm) = (
                            b.mw,
                            b.rkey as u64 | (b.mr as u64) << 32,
                            b.addr,
                            b.length,
                            b.access,
                        );
                    }
                    _ => {}
                }
            }
            None => {
                let WrOp::RegMr {
                    lkey,
                    key,
                    addr,
                    length,
                    access,
                } = wr.op
                else {
                    unreachable!("only fast registration has no ibv_wr_opcode")
                };
                s.opcode = WR_REG_MR;
                (s.rkey, s.swap, s.remote_addr, s.compare_add, s.imm) =
                    (lkey.0, key as u64, addr, length, access.0);
            }
        }
        if let Some(ud) = &wr.ud {
            s.ud_flags = UD_PRESENT;
            s.ud_qpn = ud.remote_qpn.value();
            s.ud_qkey = ud.remote_qkey.0;
            s.ud_dgid = ud.ah.dgid.0;
            s.ud_flow_label = ud.ah.flow_label;
            s.ud_sgid_index = ud.ah.sgid_index;
            s.ud_hop_limit = ud.ah.hop_limit;
            s.ud_traffic_class = ud.ah.traffic_class;
            s.ud_sl = ud.ah.sl;
            if let Some(m) = ud.ah.dmac {
                s.ud_flags |= UD_DMAC;
                s.ud_dmac = m;
            }
        }
        match inline {
            Some(d) => {
                if d.len() > roce::engine::MAX_INLINE {
                    return Err(SlotError::Inline(d.len() as u32));
                }
                s.payload[..d.len()].copy_from_slice(d);
                s.inline_len = d.len() as u32;
            }
            None => {
                if wr.sg_list.len() > MAX_HOST_SGE {
                    return Err(SlotError::Sges(wr.sg_list.len() as u32));
                }
                put_sges(&mut s.payload, wr.sg_list);
                s.nsge = wr.sg_list.len() as u32;
            }
        }
        Ok(s)
    }

    /// Decodes and checks a slot copied out of a ring.
    pub fn decode(&self) -> Result<Post, SlotError> {
        if self.nsge as usize > MAX_HOST_SGE {
            return Err(SlotError::Sges(self.nsge));
        }
        let nsge = self.nsge as usize;
        match self.kind {
            post_kind::RECV | post_kind::SRQ_RECV => {
                let sges = get_sges(&self.payload, nsge);
                Ok(if self.kind == post_kind::RECV {
                    Post::Recv {
                        qpn: Qpn::new(self.handle),
                        wr_id: self.wr_id,
                        nsge,
                        sges,
                    }
                } else {
                    Post::SrqRecv {
                        srq: self.handle,
                        wr_id: self.wr_id,
                        nsge,
                        sges,
                    }
                })
            }
            post_kind::SEND => self.decode_send().map(|wr| Post::Send {
                qpn: Qpn::new(self.handle),
                wr,
            }),
            k => Err(SlotError::Kind(k)),
        }
    }

    fn decode_send(&self) -> Result<DecodedSend, SlotError> {
        let all = SendFlags::FENCE.0
            | SendFlags::SIGNALED.0
            | SendFlags::SOLICITED.0
            | SendFlags::INLINE.0;
        if self.flags & !all != 0 {
            return Err(SlotError::Flags(self.flags));
        }
        let flags = SendFlags(self.flags);
        let op = if self.opcode == WR_REG_MR {
            if self.imm & !Access::ALL.0 != 0 {
                return Err(SlotError::Access(self.imm));
            }
            WrOp::RegMr {
                lkey: Lkey(self.rkey),
                key: self.swap as u8,
                addr: self.remote_addr,
                length: self.compare_add,
                access: Access(self.imm),
            }
        } else {
            let f = ibv::IbvSendFields {
                remote_addr: self.remote_addr,
                rkey: self.rkey,
                imm: self.imm,
                invalidate_rkey: self.rkey,
                compare_add: self.compare_add,
                swap: self.swap,
                bind: ibv::IbvBind {
                    mw: self.rkey,
                    rkey: self.swap as u32,
                    mr: (self.swap >> 32) as u32,
                    addr: self.remote_addr,
                    length: self.compare_add,
                    access: self.imm,
                },
            };
            WrOp::from_ibv(self.opcode, &f).map_err(|_| SlotError::Opcode(self.opcode))?
        };
        let inline = flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic();
        if self.inline_len as usize > roce::engine::MAX_INLINE {
            return Err(SlotError::Inline(self.inline_len));
        }
        if (inline && self.nsge != 0) || (!inline && self.inline_len != 0) {
            return Err(SlotError::InlineMisuse);
        }
        let ud = (self.ud_flags & UD_PRESENT != 0).then(|| UdDest {
            ah: AddressVector {
                dgid: Gid(self.ud_dgid),
                sgid_index: self.ud_sgid_index,
                flow_label: self.ud_flow_label & 0xfffff,
                hop_limit: self.ud_hop_limit,
                traffic_class: self.ud_traffic_class,
                sl: self.ud_sl & 0xf,
                dmac: (self.ud_flags & UD_DMAC != 0).then_some(self.ud_dmac),
            },
            remote_qpn: Qpn::new(self.ud_qpn & 0xff_ffff),
            remote_qkey: Qkey(self.ud_qkey),
        });
        Ok(DecodedSend {
            wr_id: self.wr_id,
            op,
            flags,
            ud,
            nsge: self.nsge as usize,
            sges: get_sges(&self.payload, self.nsge as usize),
            inline_len: if inline { self.inline_len as usize } else { 0 },
            inline: self.payload,
        })
    }
}

/// A completion in a CQ ring (`ibv_wc`'s fields as integers).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CqeSlot {
    /// Work request id.
    pub wr_id: u64,
    /// `ibv_wc_status` value.
    pub status: u32,
    /// `ibv_wc_opcode` value.
    pub opcode: u32,
    /// Vendor error.
    pub vendor_err: u32,
    /// Bytes.
    pub byte_len: u32,
    /// Immediate data.
    pub imm_data: u32,
    /// Invalidated rkey.
    pub invalidated_rkey: u32,
    /// QP number.
    pub qp_num: u32,
    /// Source QP.
    pub src_qp: u32,
    /// `ibv_wc_flags` bits.
    pub wc_flags: u32,
    /// P_Key index.
    pub pkey_index: u16,
    /// Service level.
    pub sl: u8,
    /// 1 if the solicited bit was set.
    pub solicited: u8,
}

// SAFETY: repr(C) of integers: no pointers, every bit pattern valid.
unsafe impl Plain for CqeSlot {}

impl CqeSlot {
    /// The slot for a completion.
    pub fn encode(c: &Completion) -> CqeSlot {
        CqeSlot {
            wr_id: c.wr_id,
            status: c.status.to_ibv(),
            opcode: c.opcode.to_ibv(),
            vendor_err: c.vendor_err,
            byte_len: c.byte_len,
            imm_data: c.imm_data,
            invalidated_rkey: c.invalidated_rkey,
            qp_num: c.qp_num.value(),
            src_qp: c.src_qp.value(),
            wc_flags: c.wc_flags.0,
            pkey_index: c.pkey_index,
            sl: c.sl,
            solicited: c.solicited as u8,
        }
    }

    /// The slot with every field in its range, as an application may read it (`ibv_wc`'s
    /// values): an unknown status reads as GENERAL_ERR, an unknown opcode as the last one,
    /// QP numbers are 24 bits, flags only those `ibv_wc_flags` defines and ferroce sets. The
    /// one place a completion read from a ring is checked; every client reads through it.
    pub fn sanitized(&self) -> CqeSlot {
        CqeSlot {
            status: WcStatus::from_ibv(self.status).to_ibv(),
            opcode: WcOpcode::from_ibv(self.opcode)
                .unwrap_or(WcOpcode::RecvRdmaWithImm)
                .to_ibv(),
            qp_num: self.qp_num & 0xff_ffff,
            src_qp: self.src_qp & 0xff_ffff,
            wc_flags: self.wc_flags & (WcFlags::GRH.0 | WcFlags::WITH_IMM.0 | WcFlags::WITH_INV.0),
            sl: self.sl & 0xf,
            solicited: (self.solicited != 0) as u8,
            ..*self
        }
    }

    /// The completion a slot holds (read through [`CqeSlot::sanitized`]).
    pub fn decode(&self) -> Completion {
        self.sanitized().completion()
    }

    /// The completion of a slot [`CqeSlot::sanitized`] returned (for any other, use
    /// [`CqeSlot::decode`]).
    pub fn completion(&self) -> Completion {
        let s = self;
        Completion {
            wr_id: s.wr_id,
            status: WcStatus::from_ibv(s.status),
            opcode: WcOpcode::from_ibv(s.opcode).unwrap_or(WcOpcode::RecvRdmaWithImm),
            vendor_err: s.vendor_err,
            byte_len: s.byte_len,
            imm_data: s.imm_data,
            invalidated_rkey: s.invalidated_rkey,
            qp_num: Qpn::new(s.qp_num),
            src_qp: Qpn::new(s.src_qp),
            wc_flags: WcFlags(s.wc_flags),
            pkey_index: s.pkey_index,
            sl: s.sl,
            solicited: s.solicited != 0,
        }
    }
}

/// An asynchronous event in the event ring: `kind` (libibverbs' `ibv_event_type` values) and
/// the object it concerns.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventSlot {
    /// `ibv_event_type`.
    pub kind: u32,
    /// QP number, SRQ id or CQ id (0 for port and device events).
    pub object: u32,
}

// SAFETY: repr(C) of integers.
unsafe impl Plain for EventSlot {}

impl EventSlot {
    /// The slot for an event.
    pub fn encode(e: &AsyncEvent) -> EventSlot {
        let (kind, object) = e.to_ibv();
        EventSlot { kind, object }
    }

    /// The event a slot holds, if its kind is known.
    pub fn decode(&self) -> Option<AsyncEvent> {
        AsyncEvent::from_ibv(self.kind, self.object)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::verbs::SendWr;

    #[test]
    fn sends_receives_completions_and_events_round_trip() {
        let sges = [
            Sge {
                addr: 0x1234_5678_9abc,
                length: 77,
                lkey: Lkey(0x301),
            },
            Sge {
                addr: 9,
                length: 1,
                lkey: Lkey(0x402),
            },
        ];
        for op in WrOp::SAMPLES {
            let ud = UdDest {
                ah: AddressVector::new(Gid::from_ipv4([10, 99, 0, 2]), 1),
                remote_qpn: Qpn::new(0x33),
                remote_qkey: Qkey(0x1111_1111),
            };
            let wr = SendWr {
                wr_id: 99,
                op,
                sg_list: &sges,
                flags: SendFlags::SIGNALED | SendFlags::FENCE,
                ud: Some(ud),
            };
            let slot = PostSlot::send(Qpn::new(0x12), &wr, None).unwrap();
            let Post::Send { qpn, wr: d } = slot.decode().unwrap() else {
                panic!()
            };
            assert_eq!(qpn, Qpn::new(0x12));
            assert_eq!(d.as_wr(), wr, "{op:?}");
        }
        let slot = PostSlot::recv(post_kind::SRQ_RECV, 3, 5, &sges).unwrap();
        let Post::SrqRecv {
            srq,
            wr_id,
            nsge,
            sges: got,
        } = slot.decode().unwrap()
        else {
            panic!()
        };
        assert_eq!((srq, wr_id, &got[..nsge]), (3, 5, &sges[..]));
        let c = Completion {
            wr_id: 5,
            status: WcStatus::RemAccessErr,
            opcode: WcOpcode::RecvRdmaWithImm,
            vendor_err: 0x101,
            byte_len: 100,
            imm_data: 7,
            invalidated_rkey: 8,
            qp_num: Qpn::new(0x11),
            src_qp: Qpn::new(0x22),
            wc_flags: WcFlags(3),
            pkey_index: 0,
            sl: 2,
            solicited: true,
        };
        assert_eq!(CqeSlot::encode(&c).decode(), c);
        for e in [
            AsyncEvent::QpFatal(Qpn::new(0x11)),
            AsyncEvent::SrqLimitReached(2),
            AsyncEvent::CqError(3),
            AsyncEvent::DeviceFatal,
        ] {
            assert_eq!(EventSlot::encode(&e).decode(), Some(e));
        }
    }

    /// Any bytes at all decode to a checked post or an error, never a panic.
    #[test]
    fn garbage_slots_are_errors_not_panics() {
        let mut rng = roce::sim::Rng::new(7);
        let mut ok = 0;
        for _ in 0..20_000 {
            let mut bytes = [0u8; std::mem::size_of::<PostSlot>()];
            for b in bytes.iter_mut() {
                *b = rng.next_u64() as u8;
            }
            // Small kinds and opcodes now and then, to reach the deeper checks.
            bytes[0] = (rng.below(4)) as u8;
            bytes[1..4].fill(0);
            bytes[16] = rng.below(12) as u8;
            bytes[17..20].fill(0);
            // Flags, SGE count and inline length in range now and then too.
            if rng.below(2) == 0 {
                bytes[21..24].fill(0);
                bytes[24] = rng.below(18) as u8;
                bytes[25..28].fill(0);
                bytes[28] = rng.below(255) as u8;
                bytes[29..32].fill(0);
            }
            // SAFETY: PostSlot is valid for every bit pattern (Plain).
            let slot: PostSlot = unsafe { std::mem::transmute(bytes) };
            if slot.decode().is_ok() {
                ok += 1;
            }
        }
        assert!(ok > 0, "some random slots are well-formed");
        let c: CqeSlot = CqeSlot {
            status: 999,
            opcode: 77,
            ..Default::default()
        };
        assert_eq!(c.decode().status, WcStatus::GeneralErr);
        // What the C libraries copy to the application is in range in every field.
        let wild = CqeSlot {
            wr_id: 5,
            status: u32::MAX,
            opcode: 7,
            qp_num: u32::MAX,
            src_qp: 0x0100_0011,
            wc_flags: u32::MAX,
            sl: 0xff,
            solicited: 9,
            ..Default::default()
        }
        .sanitized();
        assert_eq!(wild.status, WcStatus::GeneralErr as u32);
        assert_eq!(wild.opcode, WcOpcode::RecvRdmaWithImm as u32);
        assert_eq!((wild.qp_num, wild.src_qp), (0xff_ffff, 0x11));
        assert_eq!(wild.wc_flags, 0xb);
        assert_eq!((wild.sl, wild.solicited, wild.wr_id), (0xf, 1, 5));
        assert_eq!(wild.sanitized(), wild, "sanitizing twice changes nothing");
        assert_eq!(
            EventSlot {
                kind: 999,
                object: 0
            }
            .decode(),
            None
        );
    }
}
