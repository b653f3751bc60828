//! The BTH opcode table (IBA 9.2.1 Table 35; RoCEv2 CNP from A17.9.3): for each opcode, the
//! transport, the operation, which extended headers follow and in what order, its position in
//! a message, and what it implies for the receiver. Parsing, building and the transport ask
//! this table rather than testing opcode bits (the approach of rxe_opcode.c).

use core::fmt;

/// The opcode byte of a BTH. Unknown values are kept (see [`Opcode::info`]).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

/// Transport service, the top 3 bits of the opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Reliable connected (0x00).
    Rc,
    /// Unreliable connected (0x20).
    Uc,
    /// Reliable datagram (0x40): not supported by RoCE implementations; no entries.
    Rd,
    /// Unreliable datagram (0x60).
    Ud,
    /// RoCEv2 congestion notification (0x80).
    Cnp,
}

/// What an opcode does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    /// SEND (consumes a receive WQE).
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ request.
    ReadRequest,
    /// RDMA READ response.
    ReadResponse,
    /// ACK / NAK.
    Acknowledge,
    /// ATOMIC acknowledge (carries the original value).
    AtomicAcknowledge,
    /// ATOMIC compare and swap.
    CompareSwap,
    /// ATOMIC fetch and add.
    FetchAdd,
    /// FLUSH (IBA 1.5, persistent memory).
    Flush,
    /// ATOMIC WRITE (IBA 1.5).
    AtomicWrite,
    /// Congestion notification packet.
    Cnp,
}

/// Extended transport headers, in the order they appear on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExtHeader {
    /// RDMA ETH (16 bytes).
    Reth,
    /// Atomic ETH (28 bytes).
    AtomicEth,
    /// Datagram ETH (8 bytes).
    Deth,
    /// Flush ETH (4 bytes).
    Feth,
    /// Immediate data (4 bytes).
    ImmDt,
    /// Invalidate ETH (4 bytes).
    Ieth,
    /// ACK ETH (4 bytes).
    Aeth,
    /// Atomic ACK ETH (8 bytes).
    AtomicAckEth,
    /// The 16 reserved bytes of a CNP.
    CnpBody,
}

#[allow(clippy::len_without_is_empty)] // a header's size, not a collection
impl ExtHeader {
    /// Length in bytes.
    pub const fn len(self) -> usize {
        match self {
            ExtHeader::Reth => 16,
            ExtHeader::AtomicEth => 28,
            ExtHeader::Deth => 8,
            ExtHeader::Feth | ExtHeader::ImmDt | ExtHeader::Ieth | ExtHeader::Aeth => 4,
            ExtHeader::AtomicAckEth => 8,
            ExtHeader::CnpBody => 16,
        }
    }
}

/// Everything the table knows about one opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpcodeInfo {
    /// The opcode.
    pub opcode: u8,
    /// IB spec name, e.g. `RC_SEND_ONLY_WITH_IMMEDIATE` (as rxe and tshark name them).
    pub name: &'static str,
    /// Transport service.
    pub transport: Transport,
    /// Operation.
    pub op: Operation,
    /// First packet of a message (FIRST or ONLY).
    pub first: bool,
    /// Last packet of a message (LAST or ONLY).
    pub last: bool,
    /// Extended headers in wire order.
    pub headers: &'static [ExtHeader],
    /// Total length of the extended headers.
    pub ext_len: usize,
    /// The extended headers as a set: bit `h as u16` for each `h` in `headers`.
    pub ext_mask: u16,
    /// Carries (or may carry) a payload.
    pub has_payload: bool,
    /// Sent by a requester (else by a responder, or a CNP).
    pub is_request: bool,
    /// An RC request the responder acknowledges (the AckReq bit asks for it explicitly).
    pub needs_ack: bool,
    /// Consumes a receive WQE at the responder (SEND, WRITE with immediate) on its last
    /// packet.
    pub consumes_recv_wqe: bool,
    /// Carries immediate data.
    pub has_imm: bool,
    /// Carries an rkey to invalidate.
    pub has_inv: bool,
}

impl OpcodeInfo {
    /// Whether this opcode carries the given extended header.
    pub fn has(&self, h: ExtHeader) -> bool {
        self.ext_mask & 1 << h as u16 != 0
    }

    /// Byte offset of header `h` after the BTH, if present.
    pub fn offset_of(&self, h: ExtHeader) -> Option<usize> {
        let mut off = 0;
        for &x in self.headers {
            if x == h {
                return Some(off);
            }
            off += x.len();
        }
        None
    }
}

use ExtHeader::*;
use Operation as O;
use Transport as T;

const fn ext_len(h: &[ExtHeader]) -> usize {
    let mut i = 0;
    let mut n = 0;
    while i < h.len() {
        n += h[i].len();
        i += 1;
    }
    n
}

const fn ext_mask(h: &[ExtHeader]) -> u16 {
    let mut i = 0;
    let mut m = 0;
    while i < h.len() {
        m |= 1 << h[i] as u16;
        i += 1;
    }
    m
}

/// Packet position in a message.
#[derive(Clone, Copy)]
enum P {
    First,
    Middle,
    Last,
    Only,
}

const fn row(
    opcode: u8,
    name: &'static str,
    transport: Transport,
    op: Operation,
    pos: P,
    headers: &'static [ExtHeader],
) -> OpcodeInfo {
    let (first, last) = match pos {
        P::First => (true, false),
        P::Middle => (false, false),
        P::Last => (false, true),
        P::Only => (true, true),
    };
    let is_request = !matches!(
        op,
        O::ReadResponse | O::Acknowledge | O::AtomicAcknowledge | O::Cnp
    );
    let has_payload = matches!(op, O::Send | O::Write | O::ReadResponse | O::AtomicWrite);
    let mask = ext_mask(headers);
    let has_imm = mask & 1 << ImmDt as u16 != 0;
    OpcodeInfo {
        opcode,
        name,
        transport,
        op,
        first,
        last,
        headers,
        ext_len: ext_len(headers),
        ext_mask: mask,
        has_payload,
        is_request,
        needs_ack: is_request && matches!(transport, T::Rc),
        consumes_recv_wqe: matches!(op, O::Send) || (matches!(op, O::Write) && has_imm),
        has_imm,
        has_inv: mask & 1 << Ieth as u16 != 0,
    }
}

/// Every opcode ferroce knows, in opcode order.
pub const OPCODES: &[OpcodeInfo] = &[
    row(0x00, "RC_SEND_FIRST", T::Rc, O::Send, P::First, &[]),
    row(0x01, "RC_SEND_MIDDLE", T::Rc, O::Send, P::Middle, &[]),
    row(0x02, "RC_SEND_LAST", T::Rc, O::Send, P::Last, &[]),
    row(
        0x03,
        "RC_SEND_LAST_WITH_IMMEDIATE",
        T::Rc,
        O::Send,
        P::Last,
        &[ImmDt],
    ),
    row(0x04, "RC_SEND_ONLY", T::Rc, O::Send, P::Only, &[]),
    row(
        0x05,
        "RC_SEND_ONLY_WITH_IMMEDIATE",
        T::Rc,
        O::Send,
        P::Only,
        &[ImmDt],
    ),
    row(
        0x06,
        "RC_RDMA_WRITE_FIRST",
        T::Rc,
        O::Write,
        P::First,
        &[Reth],
    ),
    row(
        0x07,
        "RC_RDMA_WRITE_MIDDLE",
        T::Rc,
        O::Write,
        P::Middle,
        &[],
    ),
    row(0x08, "RC_RDMA_WRITE_LAST", T::Rc, O::Write, P::Last, &[]),
    row(
        0x09,
        "RC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Rc,
        O::Write,
        P::Last,
        &[ImmDt],
    ),
    row(
        0x0a,
        "RC_RDMA_WRITE_ONLY",
        T::Rc,
        O::Write,
        P::Only,
        &[Reth],
    ),
    row(
        0x0b,
        "RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Rc,
        O::Write,
        P::Only,
        &[Reth, ImmDt],
    ),
    row(
        0x0c,
        "RC_RDMA_READ_REQUEST",
        T::Rc,
        O::ReadRequest,
        P::Only,
        &[Reth],
    ),
    row(
        0x0d,
        "RC_RDMA_READ_RESPONSE_FIRST",
        T::Rc,
        O::ReadResponse,
        P::First,
        &[Aeth],
    ),
    row(
        0x0e,
        "RC_RDMA_READ_RESPONSE_MIDDLE",
        T::Rc,
        O::ReadResponse,
        P::Middle,
        &[],
    ),
    row(
        0x0f,
        "RC_RDMA_READ_RESPONSE_LAST",
        T::Rc,
        O::ReadResponse,
        P::Last,
        &[Aeth],
    ),
    row(
        0x10,
        "RC_RDMA_READ_RESPONSE_ONLY",
        T::Rc,
        O::ReadResponse,
        P::Only,
        &[Aeth],
    ),
    row(
        0x11,
        "RC_ACKNOWLEDGE",
        T::Rc,
        O::Acknowledge,
        P::Only,
        &[Aeth],
    ),
    row(
        0x12,
        "RC_ATOMIC_ACKNOWLEDGE",
        T::Rc,
        O::AtomicAcknowledge,
        P::Only,
        &[Aeth, AtomicAckEth],
    ),
    row(
        0x13,
        "RC_COMPARE_SWAP",
        T::Rc,
        O::CompareSwap,
        P::Only,
        &[AtomicEth],
    ),
    row(
        0x14,
        "RC_FETCH_ADD",
        T::Rc,
        O::FetchAdd,
        P::Only,
        &[AtomicEth],
    ),
    row(
        0x16,
        "RC_SEND_LAST_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        P::Last,
        &[Ieth],
    ),
    row(
        0x17,
        "RC_SEND_ONLY_WITH_INVALIDATE",
        T::Rc,
        O::Send,
        P::Only,
        &[Ieth],
    ),
    row(0x1c, "RC_FLUSH", T::Rc, O::Flush, P::Only, &[Feth, Reth]),
    row(
        0x1d,
        "RC_ATOMIC_WRITE",
        T::Rc,
        O::AtomicWrite,
        P::Only,
        &[Reth],
    ),
    row(0x20, "UC_SEND_FIRST", T::Uc, O::Send, P::First, &[]),
    row(0x21, "UC_SEND_MIDDLE", T::Uc, O::Send, P::Middle, &[]),
    row(0x22, "UC_SEND_LAST", T::Uc, O::Send, P::Last, &[]),
    row(
        0x23,
        "UC_SEND_LAST_WITH_IMMEDIATE",
        T::Uc,
        O::Send,
        P::Last,
        &[ImmDt],
    ),
    row(0x24, "UC_SEND_ONLY", T::Uc, O::Send, P::Only, &[]),
    row(
        0x25,
        "UC_SEND_ONLY_WITH_IMMEDIATE",
        T::Uc,
        O::Send,
        P::Only,
        &[ImmDt],
    ),
    row(
        0x26,
        "UC_RDMA_WRITE_FIRST",
        T::Uc,
        O::Write,
        P::First,
        &[Reth],
    ),
    row(
        0x27,
        "UC_RDMA_WRITE_MIDDLE",
        T::Uc,
        O::Write,
        P::Middle,
        &[],
    ),
    row(0x28, "UC_RDMA_WRITE_LAST", T::Uc, O::Write, P::Last, &[]),
    row(
        0x29,
        "UC_RDMA_WRITE_LAST_WITH_IMMEDIATE",
        T::Uc,
        O::Write,
        P::Last,
        &[ImmDt],
    ),
    row(
        0x2a,
        "UC_RDMA_WRITE_ONLY",
        T::Uc,
        O::Write,
        P::Only,
        &[Reth],
    ),
    row(
        0x2b,
        "UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE",
        T::Uc,
        O::Write,
        P::Only,
        &[Reth, ImmDt],
    ),
    row(0x64, "UD_SEND_ONLY", T::Ud, O::Send, P::Only, &[Deth]),
    row(
        0x65,
        "UD_SEND_ONLY_WITH_IMMEDIATE",
        T::Ud,
        O::Send,
        P::Only,
        &[Deth, ImmDt],
    ),
    row(0x81, "CNP", T::Cnp, O::Cnp, P::Only, &[CnpBody]),
];

const fn build_table() -> [Option<OpcodeInfo>; 256] {
    let mut t = [None; 256];
    let mut i = 0;
    while i < OPCODES.len() {
        t[OPCODES[i].opcode as usize] = Some(OPCODES[i]);
        i += 1;
    }
    t
}

static TABLE: [Option<OpcodeInfo>; 256] = build_table();

/// Operations, for sizing the reverse index.
const N_OPERATIONS: usize = Operation::Cnp as usize + 1;
/// Entries of the reverse index: transport x operation x the four position/header bits.
const N_FIND: usize = (Transport::Cnp as usize + 1) * N_OPERATIONS * 16;

/// What [`Opcode::find`] looks an opcode up by: transport, operation, first, last, immediate,
/// invalidate.
type FindKey = (Transport, Operation, bool, bool, bool, bool);

/// Where [`Opcode::find`] looks up a combination.
const fn find_key((transport, op, first, last, imm, inv): FindKey) -> usize {
    ((transport as usize * N_OPERATIONS + op as usize) << 4)
        | (first as usize) << 3
        | (last as usize) << 2
        | (imm as usize) << 1
        | inv as usize
}

/// The table turned around: opcode by transport, operation, position and headers.
const fn build_find() -> [Option<Opcode>; N_FIND] {
    let mut t = [None; N_FIND];
    let mut i = 0;
    while i < OPCODES.len() {
        let o = &OPCODES[i];
        t[find_key((o.transport, o.op, o.first, o.last, o.has_imm, o.has_inv))] =
            Some(Opcode(o.opcode));
        i += 1;
    }
    t
}

static FIND: [Option<Opcode>; N_FIND] = build_find();

impl Opcode {
    /// RC ACKNOWLEDGE.
    pub const RC_ACK: Opcode = Opcode(0x11);
    /// RC ATOMIC ACKNOWLEDGE.
    pub const RC_ATOMIC_ACK: Opcode = Opcode(0x12);
    /// RoCEv2 CNP.
    pub const CNP: Opcode = Opcode(0x81);
    /// RC RDMA READ Request.
    pub const RC_READ_REQUEST: Opcode = Opcode(0x0c);
    /// RC RDMA READ Response First.
    pub const RC_READ_RESPONSE_FIRST: Opcode = Opcode(0x0d);
    /// RC RDMA READ Response Middle.
    pub const RC_READ_RESPONSE_MIDDLE: Opcode = Opcode(0x0e);
    /// RC RDMA READ Response Last.
    pub const RC_READ_RESPONSE_LAST: Opcode = Opcode(0x0f);
    /// RC RDMA READ Response Only.
    pub const RC_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC CmpSwap.
    pub const RC_COMPARE_SWAP: Opcode = Opcode(0x13);
    /// RC FetchAdd.
    pub const RC_FETCH_ADD: Opcode = Opcode(0x14);
    /// UD SEND Only.
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND Only with Immediate.
    pub const UD_SEND_ONLY_WITH_IMM: Opcode = Opcode(0x65);

    /// The table entry, or `None` for an opcode RoCEv2 does not define (or RD, which
    /// ferroce does not implement).
    #[inline]
    pub fn info(self) -> Option<&'static OpcodeInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// The IB name, or `UNKNOWN`.
    pub fn name(self) -> &'static str {
        self.info().map(|i| i.name).unwrap_or("UNKNOWN")
    }

    /// The opcode with this transport and operation/position, e.g. to map an RC opcode to its
    /// UC twin.
    pub fn find(
        transport: Transport,
        op: Operation,
        first: bool,
        last: bool,
        imm: bool,
        inv: bool,
    ) -> Option<Opcode> {
        // An indexed table, not a search: the requester asks for every packet it builds.
        FIND[find_key((transport, op, first, last, imm, inv))]
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_is_consistent() {
        for info in OPCODES {
            let t = match info.opcode >> 5 {
                0 => Transport::Rc,
                1 => Transport::Uc,
                3 => Transport::Ud,
                4 => Transport::Cnp,
                _ => unreachable!(),
            };
            assert_eq!(info.transport, t, "{}", info.name);
            assert!(info.name.starts_with(match t {
                Transport::Rc => "RC_",
                Transport::Uc => "UC_",
                Transport::Ud => "UD_",
                _ => "CNP",
            }));
            // RETH/AtomicETH/DETH come before ImmDt/IETH; AETH before AtomicAckETH.
            if let (Some(a), Some(b)) = (info.offset_of(Reth), info.offset_of(ImmDt)) {
                assert!(a < b);
            }
            if let (Some(a), Some(b)) = (info.offset_of(Deth), info.offset_of(ImmDt)) {
                assert!(a < b);
            }
            assert_eq!(Opcode(info.opcode).info(), Some(info));
        }
        assert_eq!(OPCODES.len(), 40);
        assert!(Opcode(0x40).info().is_none(), "RD is not supported");
        assert!(Opcode(0x15).info().is_none());
        let ack = Opcode::RC_ACK.info().unwrap();
        assert!(!ack.is_request && !ack.needs_ack && ack.first && ack.last);
        let w = Opcode(0x0b).info().unwrap();
        assert!(w.consumes_recv_wqe && w.has_imm && w.ext_len == 20);
        assert_eq!(w.offset_of(ImmDt), Some(16));
        assert!(!Opcode(0x0a).info().unwrap().consumes_recv_wqe);
        assert_eq!(
            Opcode::find(Transport::Uc, Operation::Send, true, true, true, false),
            Some(Opcode(0x25))
        );
        // The reverse index answers as a search of the table would, for every combination.
        let transports = [T::Rc, T::Uc, T::Rd, T::Ud, T::Cnp];
        let ops = [
            O::Send,
            O::Write,
            O::ReadRequest,
            O::ReadResponse,
            O::Acknowledge,
            O::AtomicAcknowledge,
            O::CompareSwap,
            O::FetchAdd,
            O::Flush,
            O::AtomicWrite,
            O::Cnp,
        ];
        assert_eq!(ops.len(), N_OPERATIONS);
        let mut found = 0;
        for t in transports {
            for op in ops {
                for bits in 0..16u8 {
                    let [first, last, imm, inv] = [8, 4, 2, 1].map(|b| bits & b != 0);
                    let searched = OPCODES
                        .iter()
                        .find(|i| {
                            (i.transport, i.op, i.first, i.last, i.has_imm, i.has_inv)
                                == (t, op, first, last, imm, inv)
                        })
                        .map(|i| Opcode(i.opcode));
                    assert_eq!(Opcode::find(t, op, first, last, imm, inv), searched);
                    found += searched.is_some() as usize;
                }
            }
        }
        assert_eq!(found, OPCODES.len(), "every opcode has its own combination");
        assert_eq!(
            format!("{:?}", Opcode(0x65)),
            "UD_SEND_ONLY_WITH_IMMEDIATE(0x65)"
        );
    }
}
