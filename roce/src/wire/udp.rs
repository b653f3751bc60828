//! UDP header (RFC 768). RoCEv2 senders put 0 in the checksum (allowed for IPv4, and used by
//! rxe for IPv6 too): ferroce neither requires nor computes it; the ICRC protects the packet.

use super::{check_room, put_u16, Error, Result};

super::header_view! {
    8 bytes, Udp;
    /// Source port.
    SRC_PORT[0..2] => src_port: u16;
    /// Destination port.
    DST_PORT[2..4] => dst_port: u16;
    /// Length field (header + payload).
    LENGTH[4..6] => len: u16;
    /// Checksum as carried.
    CHECKSUM[6..8] => checksum: u16;
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Whether the length field is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// High-level UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port (flow entropy for RoCEv2).
    pub src_port: u16,
    /// Destination port (4791 for RoCEv2).
    pub dst_port: u16,
    /// Payload length (the length field minus 8).
    pub payload_len: usize,
    /// Checksum as carried (RoCE senders use 0).
    pub checksum: u16,
}

impl UdpRepr {
    /// Parses a header; `available` is how many bytes the IP layer says follow the UDP
    /// header's start, which the length field must match exactly.
    pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>, available: usize) -> Result<UdpRepr> {
        p.check_len()?;
        let len = p.len() as usize;
        if len < HEADER_LEN || len != available {
            return Err(Error::BadUdpLength(p.len()));
        }
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload_len: len - HEADER_LEN,
            checksum: p.checksum(),
        })
    }

    /// Header length (8).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        check_room(buf, HEADER_LEN)?;
        let len =
            u16::try_from(HEADER_LEN + self.payload_len).map_err(|_| Error::PayloadTooLong)?;
        put_u16(buf, field::SRC_PORT.start, self.src_port);
        put_u16(buf, field::DST_PORT.start, self.dst_port);
        put_u16(buf, field::LENGTH.start, len);
        put_u16(buf, field::CHECKSUM.start, self.checksum);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_length_check() {
        let r = UdpRepr {
            src_port: 0xc0de,
            dst_port: 4791,
            payload_len: 20,
            checksum: 0,
        };
        let mut b = [0u8; 8];
        r.emit(&mut b).unwrap();
        assert_eq!(b, [0xc0, 0xde, 0x12, 0xb7, 0, 28, 0, 0]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(UdpRepr::parse(&p, 28).unwrap(), r);
        assert_eq!(UdpRepr::parse(&p, 30).unwrap_err(), Error::BadUdpLength(28));
        assert!(Packet::new_checked(&b[..7]).is_err());
    }
}
