//! IPv6 header (RFC 8200), without extension headers (RoCEv2 puts UDP directly after it).

use super::ipv4::{check_version, Ecn};
use super::{get_u16, get_u32, put_u16, put_u32, Error, Layer, Result};

super::fields! {
    /// Version (4), traffic class (8), flow label (20).
    VER_TC_FLOW[0..4];
    /// Payload length.
    LENGTH[4..6];
    /// Next header.
    NXT_HDR[6];
    /// Hop limit.
    HOP_LIMIT[7];
    /// Source address.
    SRC[8..24];
    /// Destination address.
    DST[24..40];
}

/// Header length.
pub const HEADER_LEN: usize = 40;

super::view!(
    /// Zero-copy view of an IPv6 header.
    Packet,
    /// Checks the header and payload length against the buffer.
    check_len => check_lengths
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks the fixed header against the buffer, then the payload length against the
    /// `available` bytes that follow the header's start.
    fn check_lengths(&self, available: usize) -> Result<()> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Ipv6));
        }
        if HEADER_LEN + self.payload_len() as usize > available {
            return Err(Error::BadIpLength(self.payload_len()));
        }
        Ok(())
    }

    fn word0(&self) -> u32 {
        get_u32(self.buffer.as_ref(), field::VER_TC_FLOW.start)
    }

    /// Version nibble.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// Traffic class (DSCP:6 ECN:2).
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }

    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }

    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    pub fn src(&self) -> [u8; 16] {
        self.buffer.as_ref()[field::SRC].try_into().unwrap()
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 16] {
        self.buffer.as_ref()[field::DST].try_into().unwrap()
    }

    /// The payload (Ethernet padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the traffic class from DSCP and ECN.
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: Ecn) {
        let w = self.word0();
        let tc = ((dscp as u32) << 2) | ecn.bits() as u32;
        put_u32(
            self.buffer.as_mut(),
            field::VER_TC_FLOW.start,
            (w & 0xf00f_ffff) | (tc << 20),
        );
    }

    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, h: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = h;
    }
}

/// High-level IPv6 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Ipv6Repr {
    /// Parses a header whose buffer holds the whole packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Ipv6Repr> {
        Self::parse_header(p, p.buffer.as_ref().len())
    }

    /// Parses a header when only `available` bytes follow its start in the whole frame (the
    /// buffer itself may hold just the header). Checks version, then the payload length.
    pub fn parse_header<T: AsRef<[u8]>>(p: &Packet<T>, available: usize) -> Result<Ipv6Repr> {
        check_version(p.buffer.as_ref(), 6, Layer::Ipv6)?;
        p.check_lengths(available)?;
        let tc = p.traffic_class();
        Ok(Ipv6Repr {
            src: p.src(),
            dst: p.dst(),
            dscp: tc >> 2,
            ecn: Ecn::from_bits(tc),
            flow_label: p.flow_label(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            payload_len: p.payload_len() as usize,
        })
    }

    /// Header length (40).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall { need: HEADER_LEN });
        }
        let len = u16::try_from(self.payload_len).map_err(|_| Error::PayloadTooLong)?;
        let tc = ((self.dscp as u32 & 0x3f) << 2) | self.ecn.bits() as u32;
        put_u32(
            buf,
            field::VER_TC_FLOW.start,
            (6 << 28) | (tc << 20) | (self.flow_label & 0x000f_ffff),
        );
        put_u16(buf, field::LENGTH.start, len);
        buf[field::NXT_HDR] = self.next_header;
        buf[field::HOP_LIMIT] = self.hop_limit;
        buf[field::SRC].copy_from_slice(&self.src);
        buf[field::DST].copy_from_slice(&self.dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = Ipv6Repr {
            src: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: 0xabcde,
            next_header: 17,
            hop_limit: 64,
            payload_len: 8,
        };
        let mut b = [0u8; 48];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..4], &[0x66, 0xaa, 0xbc, 0xde]);
        assert_eq!(
            Ipv6Repr::parse(&Packet::new_checked(&b[..]).unwrap()).unwrap(),
            r
        );
        let mut p = Packet::new_unchecked(&mut b[..]);
        p.set_dscp_ecn(48, Ecn::Ce);
        assert_eq!(p.traffic_class(), 0xc3);
        assert_eq!(p.flow_label(), 0xabcde);
        assert_eq!(
            Packet::new_checked(&b[..40]).unwrap_err(),
            Error::BadIpLength(8)
        );
    }
}
