//! IPv4 header (RFC 791) with its header checksum (RFC 1071).

use super::{get_u16, put_u16, Error, Layer, Result};

super::fields! {
    /// Version (4 bits) and IHL (4 bits).
    VER_IHL[0];
    /// DSCP (6 bits) and ECN (2 bits).
    TOS[1];
    /// Total length.
    LENGTH[2..4];
    /// Identification.
    IDENT[4..6];
    /// Flags (3 bits) and fragment offset (13 bits).
    FLG_OFF[6..8];
    /// Time to live.
    TTL[8];
    /// Protocol.
    PROTOCOL[9];
    /// Header checksum.
    CHECKSUM[10..12];
    /// Source address.
    SRC[12..16];
    /// Destination address.
    DST[16..20];
}

/// Header length without options.
pub const HEADER_LEN: usize = 20;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// The 2-bit ECN codepoint (RFC 3168), shared by IPv4 and IPv6.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ecn {
    /// 00: not ECN-capable.
    #[default]
    NotEct,
    /// 01: ECN-capable transport (1).
    Ect1,
    /// 10: ECN-capable transport (0), what RoCE senders mark.
    Ect0,
    /// 11: congestion experienced.
    Ce,
}

impl Ecn {
    /// From the low 2 bits.
    pub const fn from_bits(b: u8) -> Ecn {
        match b & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }

    /// The 2-bit value.
    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }

    /// The name `rnic-pcap` prints: `not-ect`, `ect1`, `ect0`, `ce`.
    pub const fn name(self) -> &'static str {
        match self {
            Ecn::NotEct => "not-ect",
            Ecn::Ect1 => "ect1",
            Ecn::Ect0 => "ect0",
            Ecn::Ce => "ce",
        }
    }
}

/// Checks the version nibble that starts an IP header (of IPv4 or IPv6, `layer`) is `want`:
/// the first check of a header's parse, before its lengths.
pub(crate) fn check_version(b: &[u8], want: u8, layer: Layer) -> Result<()> {
    match b.first() {
        None => Err(Error::Truncated(layer)),
        Some(&v) if v >> 4 != want => Err(Error::BadIpVersion(v >> 4)),
        Some(_) => Ok(()),
    }
}

super::view!(
    /// Zero-copy view of an IPv4 header.
    Packet,
    /// Checks the fixed header, the IHL and the total length against the buffer.
    check_len => check_lengths
);

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks in order: the fixed header and the IHL against the buffer, then the total length
    /// against the header and the `available` bytes that follow the header's start.
    fn check_lengths(&self, available: usize) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Ipv4));
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(Error::BadIpHeaderLength(b[field::VER_IHL] & 0x0f));
        }
        if b.len() < hl {
            return Err(Error::Truncated(Layer::Ipv4));
        }
        let total = self.total_len() as usize;
        if total < hl || total > available {
            return Err(Error::BadIpLength(self.total_len()));
        }
        Ok(())
    }

    /// Version nibble.
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL x 4).
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    /// DSCP.
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::TOS] >> 2
    }

    /// ECN codepoint.
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.buffer.as_ref()[field::TOS])
    }

    /// Total length (header + payload).
    pub fn total_len(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Identification.
    pub fn ident(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::IDENT.start)
    }

    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        get_u16(self.buffer.as_ref(), field::FLG_OFF.start) & 0x4000 != 0
    }

    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        get_u16(self.buffer.as_ref(), field::FLG_OFF.start) & 0x2000 != 0
    }

    /// Fragment offset in bytes.
    pub fn frag_offset(&self) -> u16 {
        (get_u16(self.buffer.as_ref(), field::FLG_OFF.start) & 0x1fff) * 8
    }

    /// Whether this is a fragment (MF set or a non-zero offset).
    pub fn is_fragment(&self) -> bool {
        self.more_frags() || self.frag_offset() != 0
    }

    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    /// Header checksum as carried.
    pub fn checksum(&self) -> u16 {
        get_u16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// Source address.
    pub fn src(&self) -> [u8; 4] {
        self.buffer.as_ref()[field::SRC].try_into().unwrap()
    }

    /// Destination address.
    pub fn dst(&self) -> [u8; 4] {
        self.buffer.as_ref()[field::DST].try_into().unwrap()
    }

    /// Whether the header checksum verifies.
    pub fn verify_checksum(&self) -> bool {
        checksum(&self.buffer.as_ref()[..self.header_len()]) == 0
    }

    /// The payload (up to the total length; Ethernet padding excluded).
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the TOS byte from DSCP and ECN.
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: Ecn) {
        self.buffer.as_mut()[field::TOS] = (dscp << 2) | ecn.bits();
    }

    /// Sets the TTL.
    pub fn set_ttl(&mut self, ttl: u8) {
        self.buffer.as_mut()[field::TTL] = ttl;
    }

    /// Recomputes and stores the header checksum.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        let b = self.buffer.as_mut();
        put_u16(b, field::CHECKSUM.start, 0);
        let c = checksum(&b[..hl]);
        put_u16(b, field::CHECKSUM.start, c);
    }
}

/// RFC 1071 one's-complement checksum of `data` (0 when a header with its checksum verifies).
pub fn checksum(data: &[u8]) -> u16 {
    // The one's-complement sum is the same in any word size once folded, as 2^16 = 1 modulo
    // 2^16 - 1, and it does not depend on byte order but for a swap of the result (RFC 1071
    // section 2(A), 2(B)): eight bytes are loaded as the CPU holds them and added as two
    // 32-bit halves into a 64-bit sum, which no frame can overflow; the folded sum is swapped
    // to network order once. Every received IPv4 header is verified with it.
    let mut sum: u64 = 0;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let w = u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]);
        sum += (w & 0xffff_ffff) + (w >> 32);
    }
    let mut rest = words.remainder();
    if let [a, b, c, d, tail @ ..] = rest {
        sum += u32::from_ne_bytes([*a, *b, *c, *d]) as u64;
        rest = tail;
    }
    if let [a, b, tail @ ..] = rest {
        sum += u16::from_ne_bytes([*a, *b]) as u64;
        rest = tail;
    }
    if let [a] = rest {
        // An odd last byte is the high byte of a word padded with zero.
        sum += u16::from_ne_bytes([*a, 0]) as u64;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::from_be(sum as u16)
}

/// High-level IPv4 header (no options).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Repr {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag (RoCE senders set it).
    pub dont_frag: bool,
    /// Time to live.
    pub ttl: u8,
    /// Protocol.
    pub protocol: u8,
    /// Payload length (total length minus the header).
    pub payload_len: usize,
}

impl Ipv4Repr {
    /// Parses a header whose buffer holds the whole packet; rejects fragments and bad
    /// checksums.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> Result<Ipv4Repr> {
        Self::parse_header(p, p.buffer.as_ref().len())
    }

    /// Parses a header when the buffer may hold only the header itself and `available` bytes
    /// follow the header's start in the whole frame (e.g. the rest lies in other segments).
    /// Checks in order: version, IHL, total length, header checksum, fragmentation.
    pub fn parse_header<T: AsRef<[u8]>>(p: &Packet<T>, available: usize) -> Result<Ipv4Repr> {
        let b = p.buffer.as_ref();
        check_version(b, 4, Layer::Ipv4)?;
        p.check_lengths(available)?;
        let hl = p.header_len();
        if checksum(&b[..hl]) != 0 {
            return Err(Error::BadIpv4Checksum);
        }
        if p.is_fragment() {
            return Err(Error::Ipv4Fragment);
        }
        Ok(Ipv4Repr {
            src: p.src(),
            dst: p.dst(),
            dscp: p.dscp(),
            ecn: p.ecn(),
            ident: p.ident(),
            dont_frag: p.dont_frag(),
            ttl: p.ttl(),
            protocol: p.protocol(),
            payload_len: p.total_len() as usize - hl,
        })
    }

    /// Header length (20).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header with a correct checksum.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        if buf.len() < HEADER_LEN {
            return Err(Error::BufferTooSmall { need: HEADER_LEN });
        }
        let total = HEADER_LEN + self.payload_len;
        let total = u16::try_from(total).map_err(|_| Error::PayloadTooLong)?;
        buf[field::VER_IHL] = 0x45;
        buf[field::TOS] = (self.dscp << 2) | self.ecn.bits();
        put_u16(buf, field::LENGTH.start, total);
        put_u16(buf, field::IDENT.start, self.ident);
        put_u16(
            buf,
            field::FLG_OFF.start,
            if self.dont_frag { 0x4000 } else { 0 },
        );
        buf[field::TTL] = self.ttl;
        buf[field::PROTOCOL] = self.protocol;
        buf[field::SRC].copy_from_slice(&self.src);
        buf[field::DST].copy_from_slice(&self.dst);
        put_u16(buf, field::CHECKSUM.start, 0);
        let c = checksum(&buf[..HEADER_LEN]);
        put_u16(buf, field::CHECKSUM.start, c);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // A RoCEv2 ACK's IPv4 header from shared/corpus (write_bw_4k).
    const HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x30, 0x00, 0x01, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 10, 99, 0, 4, 10,
        99, 0, 2,
    ];

    #[test]
    fn checksum_matches_the_sixteen_bit_sum() {
        // The header of RFC 1071's usual worked example: checksum 0xb861.
        let h = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(checksum(&h), 0xb861);
        // Every length (odd ones, remainders of 1-3 bytes) against a sum of 16-bit words.
        let reference = |d: &[u8]| {
            let mut sum: u32 = 0;
            for (i, b) in d.iter().enumerate() {
                sum += if i % 2 == 0 {
                    (*b as u32) << 8
                } else {
                    *b as u32
                };
            }
            while sum >> 16 != 0 {
                sum = (sum & 0xffff) + (sum >> 16);
            }
            !(sum as u16)
        };
        let data: Vec<u8> = (0..80u32).map(|i| (i * 167 + 0xf3) as u8).collect();
        for n in 0..=data.len() {
            assert_eq!(checksum(&data[..n]), reference(&data[..n]), "length {n}");
        }
        assert_eq!(checksum(&[0xff; 60]), reference(&[0xff; 60]));
    }

    #[test]
    fn emit_fills_a_verifying_checksum() {
        let r = Ipv4Repr {
            src: [10, 99, 0, 4],
            dst: [10, 99, 0, 2],
            dscp: 0,
            ecn: Ecn::NotEct,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            protocol: PROTO_UDP,
            payload_len: 28,
        };
        let mut b = [0u8; 48];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[..10], &HDR[..10]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(Ipv4Repr::parse(&p).unwrap(), r);
        b[8] = 63; // a router decrements TTL without fixing the checksum: reject
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_unchecked(&b[..])),
            Err(Error::BadIpv4Checksum)
        );
    }

    #[test]
    fn rejects_fragments_and_bad_lengths() {
        let mut b = [0u8; 48];
        let mut r = Ipv4Repr {
            src: [1, 1, 1, 1],
            dst: [2, 2, 2, 2],
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 7,
            dont_frag: false,
            ttl: 1,
            protocol: PROTO_UDP,
            payload_len: 28,
        };
        r.emit(&mut b).unwrap();
        b[6] = 0x20; // MF
        Packet::new_unchecked(&mut b[..]).fill_checksum();
        assert_eq!(
            Ipv4Repr::parse(&Packet::new_unchecked(&b[..])),
            Err(Error::Ipv4Fragment)
        );
        r.payload_len = 100;
        r.emit(&mut b).unwrap();
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::BadIpLength(120)
        );
        b[0] = 0x44;
        assert_eq!(
            Packet::new_checked(&b[..]).unwrap_err(),
            Error::BadIpHeaderLength(4)
        );
    }
}
