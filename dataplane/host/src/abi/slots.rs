//! The ring slots of the host interface, as they lie in memory shared with an application:
//! `repr(C)` structs of integers and byte arrays only, valid for every bit pattern, so the
//! reader never interprets memory another process wrote as a Rust enum, bool or Option.
//!
//! A work request goes into the post ring as one to seven 64-byte cells (one cache line
//! each, as NVMe's and io_uring's 64-byte entries): a head cell that holds the common fields
//! and the first SGE, then only the extension cells the WR calls for (docs/host-protocol.md
//! 5.3). A one-SGE WRITE or SEND is one cell. The worker copies each cell out of the ring
//! before it reads it and decodes the post with every tag, count and length checked
//! ([`PostBuf::decode`]), into a buffer it reuses; a post that does not decode is a protocol
//! error of the writer, reported as a [`SlotError`] - never trusted, never a panic.

use roce::types::{Gid, Lkey, Qkey, Qpn};
use roce::verbs::{
    ibv, Access, AddressVector, AsyncEvent, Completion, SendFlags, SendWr, Sge, UdDest, WcFlags,
    WcOpcode, WcStatus, WrOp,
};

use crate::abi::ring::{Consumer, Plain};

/// Most SGEs a work request can carry through the host interface.
pub const MAX_HOST_SGE: usize = 16;
/// Bytes of one post cell: a cache line.
pub const CELL_BYTES: usize = 64;
/// SGEs (16 bytes each) in one extension cell.
const SGES_PER_CELL: usize = CELL_BYTES / 16;
/// Inline bytes the head cell holds (in the first SGE's place).
const HEAD_INLINE: usize = 16;
/// Most cells one post takes: the head, an operand cell, a UD cell, and the SGEs past the
/// first (15, in 4 cells) or the inline bytes past the first 16 (240, in 4 cells).
pub const MAX_POST_CELLS: usize = 3 + (MAX_HOST_SGE - 1).div_ceil(SGES_PER_CELL);
const _: () = assert!(
    (roce::engine::MAX_INLINE - HEAD_INLINE).div_ceil(CELL_BYTES)
        <= (MAX_HOST_SGE - 1).div_ceil(SGES_PER_CELL)
);

/// What a post asks for (`PostHead::kind`).
pub mod post_kind {
    /// A send WR on the QP `handle`.
    pub const SEND: u8 = 1;
    /// A receive WR on the QP `handle`.
    pub const RECV: u8 = 2;
    /// A receive WR on the SRQ `handle`.
    pub const SRQ_RECV: u8 = 3;
}

/// ferroce's own send operation code in `PostHead::opcode`, beside libibverbs'
/// `ibv_wr_opcode` values (`roce::verbs::ibv::wr_opcode`), which every other operation uses:
/// fast registration, which `ibv_wr_opcode` has no code for (verbs registers with a call).
pub const WR_REG_MR: u8 = 0x80;

/// `PostHead::ud`: a UD cell follows.
const UD_PRESENT: u8 = 1;
/// `PostHead::ud`: the UD cell names the destination MAC.
const UD_DMAC: u8 = 2;

/// One cell of the post ring: 64 bytes, one cache line. A post is a [`PostHead`] cell and
/// the extension cells it calls for, in this order: an [`OperandCell`] (compare-and-swap,
/// bind, fast registration), a [`UdCell`] (UD sends), then the SGEs past the first (four
/// to a cell, 16 bytes each) or the inline bytes past the first 16 (64 to a cell).
#[repr(C, align(64))]
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PostCell(pub [u8; CELL_BYTES]);

impl Default for PostCell {
    fn default() -> Self {
        PostCell([0; CELL_BYTES])
    }
}

/// The first cell of a post.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct PostHead {
    /// `post_kind::*`.
    pub kind: u8,
    /// Send WRs: `ibv_wr_opcode`, or `WR_REG_MR`.
    pub opcode: u8,
    /// Send WRs: `SendFlags` bits.
    pub flags: u8,
    /// SGE count (0..=MAX_HOST_SGE); 0 for inline data.
    pub nsge: u8,
    /// QP number (send, receive) or SRQ id.
    pub handle: u32,
    /// Work request id.
    pub wr_id: u64,
    /// WRITE/READ/ATOMIC: remote address. REG_MR: the new start address. BIND_MW: the
    /// window's first address.
    pub remote_addr: u64,
    /// WRITE/READ/ATOMIC: rkey. SEND_WITH_INV/LOCAL_INV: the key. REG_MR: the MR's lkey.
    /// BIND_MW: the window's current key.
    pub rkey: u32,
    /// Immediate data. REG_MR, BIND_MW: the access flags.
    pub imm: u32,
    /// ATOMIC: compare (CAS) or add (FETCH_AND_ADD). REG_MR, BIND_MW: the length.
    pub compare_add: u64,
    /// Inline bytes (with the INLINE flag).
    pub inline_len: u16,
    /// `UD_PRESENT` | `UD_DMAC`.
    pub ud: u8,
    /// Cells the post takes, this one included (checked against what the fields call for).
    pub cells: u8,
    /// Ignored.
    pub reserved: u32,
    /// The first SGE (address u64, length u32, lkey u32), or the first 16 inline bytes.
    pub first: [u8; 16],
}

/// The operand cell (after the head): CMP_AND_SWP's swap value; REG_MR's new key byte (low
/// 8 bits); BIND_MW's new key (low 32 bits) and the MR's lkey (high 32 bits).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OperandCell {
    /// See the type.
    pub swap: u64,
    /// Ignored.
    pub reserved: [u8; 56],
}

/// The UD destination cell (a UD QP's send WR).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdCell {
    /// Destination QP (masked to 24 bits).
    pub qpn: u32,
    /// Q_Key (bit 31 set: the QP's own).
    pub qkey: u32,
    /// Destination GID.
    pub dgid: [u8; 16],
    /// Flow label (masked to 20 bits).
    pub flow_label: u32,
    /// Source GID index.
    pub sgid_index: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
    /// Service level (masked to 4 bits).
    pub sl: u8,
    /// Destination MAC (with `UD_DMAC` in the head).
    pub dmac: [u8; 6],
    /// Ignored.
    pub reserved: [u8; 26],
}

// SAFETY: repr(C) of integers and byte arrays: no pointers, every bit pattern valid.
unsafe impl Plain for PostCell {}
// SAFETY: as PostCell.
unsafe impl Plain for PostHead {}
// SAFETY: as PostCell.
unsafe impl Plain for OperandCell {}
// SAFETY: as PostCell.
unsafe impl Plain for UdCell {}

// The layout is an ABI (docs/host-protocol.md 5.3): every cell type is one cache line.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<PostCell>() == CELL_BYTES);
    assert!(size_of::<PostHead>() == CELL_BYTES);
    assert!(size_of::<OperandCell>() == CELL_BYTES);
    assert!(size_of::<UdCell>() == CELL_BYTES);
    assert!(offset_of!(PostHead, handle) == 4);
    assert!(offset_of!(PostHead, wr_id) == 8);
    assert!(offset_of!(PostHead, remote_addr) == 16);
    assert!(offset_of!(PostHead, rkey) == 24);
    assert!(offset_of!(PostHead, imm) == 28);
    assert!(offset_of!(PostHead, compare_add) == 32);
    assert!(offset_of!(PostHead, inline_len) == 40);
    assert!(offset_of!(PostHead, ud) == 42);
    assert!(offset_of!(PostHead, cells) == 43);
    assert!(offset_of!(PostHead, first) == 48);
    assert!(offset_of!(UdCell, flow_label) == 24);
    assert!(offset_of!(UdCell, dmac) == 32);
};

/// The cell types, each one cache line of plain data.
trait CellLayout: Plain {}
impl CellLayout for PostHead {}
impl CellLayout for OperandCell {}
impl CellLayout for UdCell {}

impl PostCell {
    /// The cell holding `v`'s bytes.
    fn of<T: CellLayout>(v: &T) -> PostCell {
        // SAFETY: every CellLayout type is Plain and CELL_BYTES long (asserted above); any
        // bytes are a valid PostCell.
        unsafe { std::ptr::read_unaligned(v as *const T as *const PostCell) }
    }

    /// The cell's bytes read as `T`.
    fn view<T: CellLayout>(&self) -> T {
        // SAFETY: as `of`, the other way: T is Plain (valid for every bit pattern) and the
        // same size.
        unsafe { std::ptr::read_unaligned(self as *const PostCell as *const T) }
    }

    /// The cell read as a post's head.
    pub fn head(&self) -> PostHead {
        self.view()
    }
}

/// Why a post did not decode (the writer broke the protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// Unknown `kind`.
    #[error("unknown post kind {0}")]
    Kind(u8),
    /// Unknown send opcode.
    #[error("unknown send opcode {0}")]
    Opcode(u8),
    /// Flag bits ferroce does not define.
    #[error("unknown send flags {0:#x}")]
    Flags(u8),
    /// More SGEs than a post holds.
    #[error("{0} SGEs (at most 16)")]
    Sges(u32),
    /// More inline bytes than a post holds.
    #[error("{0} inline bytes (at most 256)")]
    Inline(u32),
    /// Inline data on an operation that cannot carry it, or both SGEs and inline data.
    #[error("inline data where it cannot be")]
    InlineMisuse,
    /// Access flags ferroce does not define.
    #[error("unknown access flags {0:#x}")]
    Access(u32),
    /// The head's cell count is not what its fields call for.
    #[error("the head says {said} cells where its fields call for {need}")]
    Cells {
        /// `PostHead::cells`.
        said: u8,
        /// What the fields call for.
        need: usize,
    },
    /// The ring holds fewer cells than the post's head says (a producer publishes whole
    /// posts).
    #[error("a post cut short: {have} of its {need} cells published")]
    Truncated {
        /// Cells published.
        have: usize,
        /// Cells the head calls for.
        need: usize,
    },
}

/// Whether a send opcode carries an operand cell.
fn has_operand(opcode: u8) -> bool {
    opcode == WR_REG_MR
        || matches!(
            opcode as u32,
            ibv::wr_opcode::ATOMIC_CMP_AND_SWP | ibv::wr_opcode::BIND_MW
        )
}

/// Extension cells for SGEs past the first, or inline bytes past the head's.
fn data_cells(nsge: usize, inline_len: usize) -> usize {
    nsge.saturating_sub(1).div_ceil(SGES_PER_CELL)
        + inline_len.saturating_sub(HEAD_INLINE).div_ceil(CELL_BYTES)
}

fn put_sge(b: &mut [u8], sge: &Sge) {
    b[..8].copy_from_slice(&sge.addr.to_le_bytes());
    b[8..12].copy_from_slice(&sge.length.to_le_bytes());
    b[12..16].copy_from_slice(&sge.lkey.0.to_le_bytes());
}

fn get_sge(b: &[u8]) -> Sge {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    Sge {
        addr: u64::from_le_bytes(a),
        length: u32_at(8),
        lkey: Lkey(u32_at(12)),
    }
}

/// A post encoded for the ring: [`PostCells::cells`] says how many cells it takes (check the
/// ring's room for them), [`PostCells::write`] hands them out in order.
#[derive(Debug, Clone, Copy)]
pub struct PostCells<'a> {
    head: PostHead,
    swap: Option<u64>,
    ud: Option<UdCell>,
    sges: &'a [Sge],
    inline: &'a [u8],
}

impl<'a> PostCells<'a> {
    /// A receive WR (QP or SRQ per `kind`).
    pub fn recv(kind: u8, handle: u32, wr_id: u64, sges: &'a [Sge]) -> Result<Self, SlotError> {
        if sges.len() > MAX_HOST_SGE {
            return Err(SlotError::Sges(sges.len() as u32));
        }
        let mut head = PostHead {
            kind,
            handle,
            wr_id,
            nsge: sges.len() as u8,
            ..PostHead::default()
        };
        head.cells = (1 + data_cells(sges.len(), 0)) as u8;
        Ok(PostCells {
            head,
            swap: None,
            ud: None,
            sges,
            inline: &[],
        })
    }

    /// A send WR on QP `qpn`; `inline` carries the payload of an inline WR (its SGEs are
    /// then not sent).
    #[inline]
    pub fn send(qpn: Qpn, wr: &SendWr<'a>, inline: Option<&'a [u8]>) -> Result<Self, SlotError> {
        let mut head = PostHead {
            kind: post_kind::SEND,
            handle: qpn.value(),
            wr_id: wr.wr_id,
            flags: wr.flags.0 as u8,
            ..PostHead::default()
        };
        let mut swap = None;
        match wr.op.to_ibv() {
            Some((opcode, f)) => {
                head.opcode = opcode as u8;
                (head.remote_addr, head.rkey, head.imm, head.compare_add) =
                    (f.remote_addr, f.rkey, f.imm, f.compare_add);
                match opcode {
                    ibv::wr_opcode::LOCAL_INV | ibv::wr_opcode::SEND_WITH_INV => {
                        head.rkey = f.invalidate_rkey
                    }
                    ibv::wr_opcode::ATOMIC_CMP_AND_SWP => swap = Some(f.swap),
                    ibv::wr_opcode::BIND_MW => {
                        let b = f.bind;
                        (head.rkey, head.remote_addr, head.compare_add, head.imm) =
                            (b.mw, b.addr, b.length, b.access);
                        swap = Some(b.rkey as u64 | (b.mr as u64) << 32);
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
                head.opcode = WR_REG_MR;
                (head.rkey, head.remote_addr, head.compare_add, head.imm) =
                    (lkey.0, addr, length, access.0);
                swap = Some(key as u64);
            }
        }
        let ud = wr.ud.as_ref().map(|ud| {
            head.ud = UD_PRESENT | if ud.ah.dmac.is_some() { UD_DMAC } else { 0 };
            UdCell {
                qpn: ud.remote_qpn.value(),
                qkey: ud.remote_qkey.0,
                dgid: ud.ah.dgid.0,
                flow_label: ud.ah.flow_label,
                sgid_index: ud.ah.sgid_index,
                hop_limit: ud.ah.hop_limit,
                traffic_class: ud.ah.traffic_class,
                sl: ud.ah.sl,
                dmac: ud.ah.dmac.unwrap_or_default(),
                reserved: [0; 26],
            }
        });
        let (sges, inline): (&[Sge], &[u8]) = match inline {
            Some(d) => {
                if d.len() > roce::engine::MAX_INLINE {
                    return Err(SlotError::Inline(d.len() as u32));
                }
                head.inline_len = d.len() as u16;
                (&[], d)
            }
            None => {
                if wr.sg_list.len() > MAX_HOST_SGE {
                    return Err(SlotError::Sges(wr.sg_list.len() as u32));
                }
                head.nsge = wr.sg_list.len() as u8;
                (wr.sg_list, &[])
            }
        };
        head.cells = (1
            + swap.is_some() as usize
            + ud.is_some() as usize
            + data_cells(sges.len(), inline.len())) as u8;
        Ok(PostCells {
            head,
            swap,
            ud,
            sges,
            inline,
        })
    }

    /// Cells the post takes in the ring.
    pub fn cells(&self) -> usize {
        self.head.cells as usize
    }

    /// Hands the post's cells to `out`, in ring order.
    pub fn write(&self, mut out: impl FnMut(&PostCell)) {
        let mut head = self.head;
        if let Some(s) = self.sges.first() {
            put_sge(&mut head.first, s);
        }
        let n = self.inline.len().min(HEAD_INLINE);
        head.first[..n].copy_from_slice(&self.inline[..n]);
        out(&PostCell::of(&head));
        if let Some(swap) = self.swap {
            out(&PostCell::of(&OperandCell {
                swap,
                reserved: [0; 56],
            }));
        }
        if let Some(ud) = &self.ud {
            out(&PostCell::of(ud));
        }
        for chunk in self.sges.get(1..).unwrap_or(&[]).chunks(SGES_PER_CELL) {
            let mut c = PostCell::default();
            for (s, b) in chunk.iter().zip(c.0.chunks_exact_mut(16)) {
                put_sge(b, s);
            }
            out(&c);
        }
        for chunk in self
            .inline
            .get(HEAD_INLINE..)
            .unwrap_or(&[])
            .chunks(CELL_BYTES)
        {
            let mut c = PostCell::default();
            c.0[..chunk.len()].copy_from_slice(chunk);
            out(&c);
        }
    }
}

/// A send WR decoded from a post.
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
    /// SGEs (the first `nsge`).
    pub sges: [Sge; MAX_HOST_SGE],
    /// Inline byte count.
    pub inline_len: usize,
    /// Inline bytes (the first `inline_len`).
    pub inline: [u8; roce::engine::MAX_INLINE],
}

impl DecodedSend {
    /// The WR as the engine takes it (its inline bytes apart: `inline()`).
    pub fn as_wr(&self) -> SendWr<'_> {
        SendWr {
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

/// A decoded post, as [`PostBuf::post`] shows it.
#[derive(Debug, Clone, Copy)]
pub enum Post<'a> {
    /// A send WR for the QP.
    Send {
        /// QP.
        qpn: Qpn,
        /// Its fields.
        wr: &'a DecodedSend,
    },
    /// A receive WR for the QP.
    Recv {
        /// QP.
        qpn: Qpn,
        /// Work request id.
        wr_id: u64,
        /// SGEs.
        sges: &'a [Sge],
    },
    /// A receive WR for the SRQ.
    SrqRecv {
        /// SRQ id.
        srq: u32,
        /// Work request id.
        wr_id: u64,
        /// SGEs.
        sges: &'a [Sge],
    },
}

/// A post decoded and checked, in a buffer its reader keeps and decodes every post into:
/// only what a post carries is written (a one-SGE WRITE writes one SGE), and nothing of
/// some 600 bytes is moved per post.
#[derive(Debug, Clone)]
pub struct PostBuf {
    kind: u8,
    handle: u32,
    send: DecodedSend,
}

impl Default for PostBuf {
    fn default() -> Self {
        PostBuf {
            kind: 0,
            handle: 0,
            send: DecodedSend {
                wr_id: 0,
                op: WrOp::Send,
                flags: SendFlags::default(),
                ud: None,
                nsge: 0,
                sges: [Sge::default(); MAX_HOST_SGE],
                inline_len: 0,
                inline: [0; roce::engine::MAX_INLINE],
            },
        }
    }
}

impl PostHead {
    /// Cells the post this head starts takes, with the head's counts and tags checked (the
    /// first steps of [`PostBuf::decode`]): what a reader must know before it takes the
    /// post's other cells.
    pub fn cells(&self) -> Result<usize, SlotError> {
        let nsge = self.nsge as usize;
        if nsge > MAX_HOST_SGE {
            return Err(SlotError::Sges(nsge as u32));
        }
        let need = match self.kind {
            post_kind::RECV | post_kind::SRQ_RECV => 1 + data_cells(nsge, 0),
            post_kind::SEND => {
                if self.inline_len as usize > roce::engine::MAX_INLINE {
                    return Err(SlotError::Inline(self.inline_len as u32));
                }
                // SGEs or inline bytes, never both: at most MAX_POST_CELLS cells.
                if nsge != 0 && self.inline_len != 0 {
                    return Err(SlotError::InlineMisuse);
                }
                1 + has_operand(self.opcode) as usize
                    + (self.ud & UD_PRESENT != 0) as usize
                    + data_cells(nsge, self.inline_len as usize)
            }
            k => return Err(SlotError::Kind(k)),
        };
        debug_assert!(need <= MAX_POST_CELLS);
        if self.cells as usize != need {
            return Err(SlotError::Cells {
                said: self.cells,
                need,
            });
        }
        Ok(need)
    }
}

impl PostBuf {
    /// The post last decoded; `None` before the first or after one that did not decode.
    pub fn post(&self) -> Option<Post<'_>> {
        let s = &self.send;
        Some(match self.kind {
            post_kind::SEND => Post::Send {
                qpn: Qpn::new(self.handle),
                wr: s,
            },
            post_kind::SRQ_RECV => Post::SrqRecv {
                srq: self.handle,
                wr_id: s.wr_id,
                sges: &s.sges[..s.nsge],
            },
            post_kind::RECV => Post::Recv {
                qpn: Qpn::new(self.handle),
                wr_id: s.wr_id,
                sges: &s.sges[..s.nsge],
            },
            _ => return None,
        })
    }

    /// Decodes the post that `head` starts; `cell(i)` is the post's `i`-th cell (1 for the
    /// first after the head), already copied out of the ring. Every field is checked
    /// (docs/host-protocol.md 5.3); on an error [`PostBuf::post`] shows nothing.
    pub fn decode(
        &mut self,
        head: &PostHead,
        cell: impl Fn(usize) -> PostCell,
    ) -> Result<(), SlotError> {
        // Nothing usable until the post decodes in full.
        self.kind = 0;
        head.cells()?;
        let nsge = head.nsge as usize;
        let s = &mut self.send;
        let mut next = 1;
        if head.kind == post_kind::SEND {
            let all = SendFlags::FENCE.0
                | SendFlags::SIGNALED.0
                | SendFlags::SOLICITED.0
                | SendFlags::INLINE.0;
            if head.flags as u32 & !all != 0 {
                return Err(SlotError::Flags(head.flags));
            }
            let flags = SendFlags(head.flags as u32);
            let swap = if has_operand(head.opcode) {
                next += 1;
                cell(1).view::<OperandCell>().swap
            } else {
                0
            };
            let op = if head.opcode == WR_REG_MR {
                if head.imm & !Access::ALL.0 != 0 {
                    return Err(SlotError::Access(head.imm));
                }
                WrOp::RegMr {
                    lkey: Lkey(head.rkey),
                    key: swap as u8,
                    addr: head.remote_addr,
                    length: head.compare_add,
                    access: Access(head.imm),
                }
            } else {
                let f = ibv::IbvSendFields {
                    remote_addr: head.remote_addr,
                    rkey: head.rkey,
                    imm: head.imm,
                    invalidate_rkey: head.rkey,
                    compare_add: head.compare_add,
                    swap,
                    bind: ibv::IbvBind {
                        mw: head.rkey,
                        rkey: swap as u32,
                        mr: (swap >> 32) as u32,
                        addr: head.remote_addr,
                        length: head.compare_add,
                        access: head.imm,
                    },
                };
                WrOp::from_ibv(head.opcode as u32, &f)
                    .map_err(|_| SlotError::Opcode(head.opcode))?
            };
            let inline = flags.contains(SendFlags::INLINE) && !op.is_read_or_atomic();
            if (inline && nsge != 0) || (!inline && head.inline_len != 0) {
                return Err(SlotError::InlineMisuse);
            }
            s.ud = if head.ud & UD_PRESENT != 0 {
                let u = cell(next).view::<UdCell>();
                next += 1;
                Some(UdDest {
                    ah: AddressVector {
                        dgid: Gid(u.dgid),
                        sgid_index: u.sgid_index,
                        flow_label: u.flow_label & 0xfffff,
                        hop_limit: u.hop_limit,
                        traffic_class: u.traffic_class,
                        sl: u.sl & 0xf,
                        dmac: (head.ud & UD_DMAC != 0).then_some(u.dmac),
                    },
                    remote_qpn: Qpn::new(u.qpn & 0xff_ffff),
                    remote_qkey: Qkey(u.qkey),
                })
            } else {
                None
            };
            (s.op, s.flags) = (op, flags);
            let len = head.inline_len as usize;
            let first = len.min(HEAD_INLINE);
            s.inline[..first].copy_from_slice(&head.first[..first]);
            let mut at = first;
            while at < len {
                let c = cell(next);
                next += 1;
                let take = (len - at).min(CELL_BYTES);
                s.inline[at..at + take].copy_from_slice(&c.0[..take]);
                at += take;
            }
            s.inline_len = len;
        }
        if nsge > 0 {
            s.sges[0] = get_sge(&head.first);
        }
        let mut i = 1;
        while i < nsge {
            let c = cell(next);
            next += 1;
            for b in c.0.chunks_exact(16).take(nsge - i) {
                s.sges[i] = get_sge(b);
                i += 1;
            }
        }
        s.nsge = nsge;
        s.wr_id = head.wr_id;
        self.kind = head.kind;
        self.handle = head.handle;
        Ok(())
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

/// Why a post taken from a client's ring cannot be executed: the client broke the protocol
/// (the RNIC then closes it, with the device-fatal event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// A post that does not decode.
    #[error("bad post: {0}")]
    Slot(#[from] SlotError),
    /// Ring indices that claim more posts than the ring holds.
    #[error("post ring indices corrupted")]
    Indices,
}

/// The worker's side of a post ring: takes the next post out of `posts` and decodes it into
/// `buf`, with every field checked, each cell copied out of shared memory before it is read.
/// `None` once the ring is empty; `Some(Err)` for a post that breaks the protocol (a head
/// that does not check, fewer cells published than it calls for), or for producer indices
/// that claim more than the ring holds (a corrupted or hostile client).
pub fn next_post(
    posts: &mut Consumer<PostCell>,
    buf: &mut PostBuf,
) -> Option<Result<(), PostError>> {
    let Some(head) = posts.peek(0) else {
        return (posts.rejected > 0).then_some(Err(PostError::Indices));
    };
    let head = head.head();
    let need = match head.cells() {
        Ok(n) => n,
        Err(e) => return Some(Err(e.into())),
    };
    // A producer publishes a post's cells with one store: fewer is a broken protocol.
    if !posts.ready(need) {
        let have = posts.published();
        return Some(Err(SlotError::Truncated { have, need }.into()));
    }
    let r = buf.decode(&head, |i| posts.get(i).unwrap_or_default());
    posts.advance(need);
    Some(r.map_err(PostError::Slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodes a post and decodes it back, as the two ends of the ring do.
    fn round_trip(p: &PostCells<'_>) -> Result<PostBuf, SlotError> {
        let mut cells = Vec::new();
        p.write(|c| cells.push(*c));
        assert_eq!(cells.len(), p.cells());
        let mut buf = PostBuf::default();
        buf.decode(&cells[0].head(), |i| cells[i])?;
        Ok(buf)
    }

    #[test]
    fn sends_receives_completions_and_events_round_trip() {
        let sges: Vec<Sge> = (0..MAX_HOST_SGE as u64)
            .map(|i| Sge {
                addr: 0x1234_5678_9abc + i,
                length: 77 + i as u32,
                lkey: Lkey(0x301 + i as u32),
            })
            .collect();
        let ud = UdDest {
            ah: AddressVector {
                dmac: Some([2, 0, 0, 0x99, 0, 7]),
                flow_label: 0x12345,
                sl: 3,
                ..AddressVector::new(Gid::from_ipv4([10, 99, 0, 2]), 1)
            },
            remote_qpn: Qpn::new(0x33),
            remote_qkey: Qkey(0x1111_1111),
        };
        // Every operation, with and without a UD destination, with 0, 1, 5 and 16 SGEs:
        // one cell for a one-SGE WRITE or SEND, an operand cell for CAS, bind and
        // registration, a UD cell, four SGEs to each cell past the head's.
        for op in WrOp::SAMPLES {
            for ud in [None, Some(ud)] {
                for n in [0, 1, 5, MAX_HOST_SGE] {
                    let wr = SendWr {
                        wr_id: 99,
                        op,
                        sg_list: &sges[..n],
                        flags: SendFlags::SIGNALED | SendFlags::FENCE,
                        ud,
                    };
                    let p = PostCells::send(Qpn::new(0x12), &wr, None).unwrap();
                    let operand = matches!(
                        op,
                        WrOp::CompareSwap { .. } | WrOp::BindMw { .. } | WrOp::RegMr { .. }
                    );
                    assert_eq!(
                        p.cells(),
                        1 + operand as usize + ud.is_some() as usize + (n.max(1) - 1).div_ceil(4),
                        "{op:?} {n}"
                    );
                    let buf = round_trip(&p).unwrap();
                    let Post::Send { qpn, wr: d } = buf.post().unwrap() else {
                        panic!()
                    };
                    assert_eq!(qpn, Qpn::new(0x12));
                    assert_eq!(d.as_wr(), wr, "{op:?}");
                    assert_eq!(d.inline(), None);
                }
            }
        }
        // Inline data of every length that changes the cell count.
        let data: Vec<u8> = (0..roce::engine::MAX_INLINE)
            .map(|i| i as u8 ^ 0x5a)
            .collect();
        for len in [0, 1, 16, 17, 80, 81, 255, 256] {
            let wr = SendWr {
                wr_id: 7,
                op: WrOp::Send,
                sg_list: &[],
                flags: SendFlags::INLINE,
                ud: None,
            };
            let p = PostCells::send(Qpn::new(0x12), &wr, Some(&data[..len])).unwrap();
            assert_eq!(p.cells(), 1 + len.saturating_sub(16).div_ceil(64), "{len}");
            let buf = round_trip(&p).unwrap();
            let Post::Send { wr: d, .. } = buf.post().unwrap() else {
                panic!()
            };
            assert_eq!(d.inline(), Some(&data[..len]));
        }
        for n in [0, 1, 2, 16] {
            let p = PostCells::recv(post_kind::SRQ_RECV, 3, 5, &sges[..n]).unwrap();
            let buf = round_trip(&p).unwrap();
            let Post::SrqRecv {
                srq,
                wr_id,
                sges: got,
            } = buf.post().unwrap()
            else {
                panic!()
            };
            assert_eq!((srq, wr_id, got), (3, 5, &sges[..n]));
            let p = PostCells::recv(post_kind::RECV, 0x13, 6, &sges[..n]).unwrap();
            let buf = round_trip(&p).unwrap();
            let Post::Recv {
                qpn,
                wr_id,
                sges: got,
            } = buf.post().unwrap()
            else {
                panic!()
            };
            assert_eq!((qpn, wr_id, got), (Qpn::new(0x13), 6, &sges[..n]));
        }
        let too_many = vec![Sge::default(); MAX_HOST_SGE + 1];
        assert_eq!(
            PostCells::recv(post_kind::RECV, 1, 1, &too_many).unwrap_err(),
            SlotError::Sges(17)
        );
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

    /// Any bytes at all decode to a checked post or an error, never a panic; a head whose
    /// cell count disagrees with its fields is refused.
    #[test]
    fn garbage_cells_are_errors_not_panics() {
        let mut rng = roce::sim::Rng::new(7);
        let mut ok = 0;
        let mut buf = PostBuf::default();
        for _ in 0..20_000 {
            let mut cells = [PostCell::default(); MAX_POST_CELLS];
            for c in cells.iter_mut() {
                for b in c.0.iter_mut() {
                    *b = rng.next_u64() as u8;
                }
            }
            // Small kinds, opcodes, flags and counts now and then, to reach the deeper checks.
            let h = &mut cells[0].0;
            h[0] = rng.below(4) as u8;
            h[1] = rng.below(12) as u8;
            if rng.below(2) == 0 {
                h[2] &= 0x1f;
                h[3] = rng.below(18) as u8;
                h[40] = rng.below(255) as u8;
                h[41] = 0;
                h[42] &= 3;
                h[43] = rng.below(16) as u8;
            }
            let head = cells[0].head();
            if let Ok(n) = head.cells() {
                assert!((1..=MAX_POST_CELLS).contains(&n));
                if buf.decode(&head, |i| cells[i]).is_ok() {
                    ok += 1;
                    assert!(buf.post().is_some());
                } else {
                    assert!(
                        buf.post().is_none(),
                        "a post that did not decode shows nothing"
                    );
                }
            }
        }
        assert!(ok > 0, "some random posts are well-formed");
        // SGEs and inline bytes together would take more than MAX_POST_CELLS: refused
        // before any cell past the head is looked for.
        let both = PostHead {
            kind: post_kind::SEND,
            opcode: ibv::wr_opcode::ATOMIC_CMP_AND_SWP as u8,
            flags: SendFlags::INLINE.0 as u8,
            nsge: 16,
            inline_len: 256,
            ud: UD_PRESENT,
            cells: 11,
            ..PostHead::default()
        };
        assert_eq!(both.cells(), Err(SlotError::InlineMisuse));
        // A valid post whose head claims one cell more, or one fewer, is refused.
        let sge = [Sge::default(); 2];
        let p = PostCells::recv(post_kind::RECV, 1, 1, &sge).unwrap();
        let mut cells = Vec::new();
        p.write(|c| cells.push(*c));
        for said in [1u8, 3] {
            cells[0].0[43] = said;
            assert_eq!(
                cells[0].head().cells(),
                Err(SlotError::Cells { said, need: 2 })
            );
        }
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
