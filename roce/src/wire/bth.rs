//! Base Transport Header (IBA 9.2, 12 bytes).

use super::opcode::Opcode;
use super::{check_room, put_u16, put_u24, Error, Pkey, Psn, Qpn, Result};

super::header_view! {
    12 bytes, Bth;
    /// Opcode.
    OPCODE[0] => opcode: Opcode;
    /// SE (7), MigReq (6), PadCnt (5:4), TVer (3:0).
    FLAGS[1];
    /// Partition key.
    PKEY[2..4] => pkey: Pkey;
    /// FECN (7), BECN (6), 6 reserved bits. Masked in the ICRC.
    FECN_BECN[4];
    /// Destination QP.
    DQPN[5..8] => dest_qp: Qpn;
    /// AckReq (7), 7 reserved bits.
    ACKREQ[8];
    /// Packet sequence number.
    PSN[9..12] => psn: Psn;
}

impl<T: AsRef<[u8]>> Packet<T> {
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// Solicited event.
    pub fn se(&self) -> bool {
        self.b()[field::FLAGS] & 0x80 != 0
    }

    /// Migration request.
    pub fn migreq(&self) -> bool {
        self.b()[field::FLAGS] & 0x40 != 0
    }

    /// Pad count (bytes of padding before the ICRC).
    pub fn pad_count(&self) -> u8 {
        (self.b()[field::FLAGS] >> 4) & 3
    }

    /// Transport header version.
    pub fn tver(&self) -> u8 {
        self.b()[field::FLAGS] & 0x0f
    }

    /// Forward ECN.
    pub fn fecn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x80 != 0
    }

    /// Backward ECN (set in CNPs).
    pub fn becn(&self) -> bool {
        self.b()[field::FECN_BECN] & 0x40 != 0
    }

    /// Acknowledge request.
    pub fn ack_req(&self) -> bool {
        self.b()[field::ACKREQ] & 0x80 != 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets or clears FECN (a switch marking congestion; masked in the ICRC).
    pub fn set_fecn(&mut self, v: bool) {
        let b = &mut self.buffer.as_mut()[field::FECN_BECN];
        *b = (*b & !0x80) | ((v as u8) << 7);
    }

    /// Sets or clears BECN.
    pub fn set_becn(&mut self, v: bool) {
        let b = &mut self.buffer.as_mut()[field::FECN_BECN];
        *b = (*b & !0x40) | ((v as u8) << 6);
    }
}

/// High-level BTH. Reserved bits are kept so a parsed header re-emits byte-identically
/// (hardware sets some of them; they are masked or ignored by receivers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub se: bool,
    /// Migration request.
    pub migreq: bool,
    /// Pad count (0..=3).
    pub pad_count: u8,
    /// Partition key.
    pub pkey: Pkey,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// The 6 reserved bits of byte 4 (as carried).
    pub resv6: u8,
    /// Destination QP.
    pub dest_qp: Qpn,
    /// Acknowledge request.
    pub ack_req: bool,
    /// The 7 reserved bits after AckReq (as carried).
    pub resv7: u8,
    /// Packet sequence number.
    pub psn: Psn,
}

impl BthRepr {
    /// A header with default P_Key, no flags and zero reserved bits.
    pub const fn new(opcode: Opcode, dest_qp: Qpn, psn: Psn) -> BthRepr {
        BthRepr {
            opcode,
            se: false,
            migreq: false,
            pad_count: 0,
            pkey: Pkey::DEFAULT,
            fecn: false,
            becn: false,
            resv6: 0,
            dest_qp,
            ack_req: false,
            resv7: 0,
            psn,
        }
    }

    /// Parses a BTH; TVer must be 0 (IBA C9-?: packets with another version are dropped).
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<BthRepr> {
        p.check_len()?;
        if p.tver() != 0 {
            return Err(Error::BadTver(p.tver()));
        }
        let b = p.b();
        Ok(BthRepr {
            opcode: p.opcode(),
            se: p.se(),
            migreq: p.migreq(),
            pad_count: p.pad_count(),
            pkey: p.pkey(),
            fecn: p.fecn(),
            becn: p.becn(),
            resv6: b[field::FECN_BECN] & 0x3f,
            dest_qp: p.dest_qp(),
            ack_req: p.ack_req(),
            resv7: b[field::ACKREQ] & 0x7f,
            psn: p.psn(),
        })
    }

    /// Header length (12).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header (TVer 0).
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_room(buf, HEADER_LEN)?;
        buf[field::OPCODE] = self.opcode.0;
        buf[field::FLAGS] =
            ((self.se as u8) << 7) | ((self.migreq as u8) << 6) | ((self.pad_count & 3) << 4);
        put_u16(buf, field::PKEY.start, self.pkey.0);
        buf[field::FECN_BECN] =
            ((self.fecn as u8) << 7) | ((self.becn as u8) << 6) | (self.resv6 & 0x3f);
        put_u24(buf, field::DQPN.start, self.dest_qp.value());
        buf[field::ACKREQ] = ((self.ack_req as u8) << 7) | (self.resv7 & 0x7f);
        put_u24(buf, field::PSN.start, self.psn.value());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deconstruct_and_construct() {
        // RC_RDMA_WRITE_LAST, AckReq, dest QP 0x12, PSN 0xa3a3ab (shape of corpus frames).
        let bytes = [
            0x08, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x80, 0xa3, 0xa3, 0xab,
        ];
        let p = Packet::new_checked(&bytes[..]).unwrap();
        let r = BthRepr::parse(&p).unwrap();
        assert_eq!(r.opcode, Opcode(0x08));
        assert!(r.ack_req && !r.se && !r.fecn);
        assert_eq!(r.dest_qp, Qpn::new(0x12));
        assert_eq!(r.psn, Psn::new(0xa3a3ab));
        let mut out = [0u8; 12];
        r.emit(&mut out).unwrap();
        assert_eq!(out, bytes);
        let mut bad = bytes;
        bad[1] = 0x01;
        assert_eq!(
            BthRepr::parse(&Packet::new_unchecked(&bad[..])),
            Err(Error::BadTver(1))
        );
    }
}
