//! Ethernet II header with an optional 802.1Q tag (PCP, DEI, VLAN id).

use super::{get_u16, put_u16, Error, Layer, Result};

super::fields! {
    /// Destination MAC.
    DST[0..6];
    /// Source MAC.
    SRC[6..12];
    /// EtherType (or TPID 0x8100 when tagged).
    ETHERTYPE[12..14];
    /// 802.1Q tag control information (when tagged).
    TCI[14..16];
    /// Inner EtherType (when tagged).
    INNER_ETHERTYPE[16..18];
}

/// EtherType values ferroce handles.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// 802.1Q VLAN tag (TPID).
    pub const VLAN: u16 = 0x8100;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// MAC control (PAUSE, PFC).
    pub const MAC_CONTROL: u16 = 0x8808;
}

/// Untagged header length.
pub const HEADER_LEN: usize = 14;
/// Tagged header length.
pub const TAGGED_HEADER_LEN: usize = 18;

super::view!(
    /// Zero-copy view of an Ethernet header (tagged or not).
    Frame
);

impl<T: AsRef<[u8]>> Frame<T> {
    /// Checks the length.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated(Layer::Ethernet));
        }
        if get_u16(b, field::ETHERTYPE.start) == ethertype::VLAN && b.len() < TAGGED_HEADER_LEN {
            return Err(Error::Truncated(Layer::Vlan));
        }
        Ok(())
    }

    /// Destination MAC.
    pub fn dst(&self) -> [u8; 6] {
        self.buffer.as_ref()[field::DST].try_into().unwrap()
    }

    /// Source MAC.
    pub fn src(&self) -> [u8; 6] {
        self.buffer.as_ref()[field::SRC].try_into().unwrap()
    }

    /// Whether an 802.1Q tag follows the addresses.
    pub fn is_tagged(&self) -> bool {
        get_u16(self.buffer.as_ref(), field::ETHERTYPE.start) == ethertype::VLAN
    }

    /// Tag control information (PCP:3 DEI:1 VID:12), when tagged.
    pub fn tci(&self) -> Option<u16> {
        self.is_tagged()
            .then(|| get_u16(self.buffer.as_ref(), field::TCI.start))
    }

    /// The EtherType of the payload (the inner one when tagged).
    pub fn ethertype(&self) -> u16 {
        let b = self.buffer.as_ref();
        if self.is_tagged() {
            get_u16(b, field::INNER_ETHERTYPE.start)
        } else {
            get_u16(b, field::ETHERTYPE.start)
        }
    }

    /// Header length: 14, or 18 when tagged.
    pub fn header_len(&self) -> usize {
        if self.is_tagged() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// The bytes after the header.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

/// An 802.1Q tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct VlanTag {
    /// Priority code point (802.1p priority, 0..=7).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN id (0..=4095; 0 = priority-tagged only).
    pub vid: u16,
}

impl VlanTag {
    /// From a TCI.
    pub const fn from_tci(tci: u16) -> VlanTag {
        VlanTag {
            pcp: (tci >> 13) as u8,
            dei: tci & 0x1000 != 0,
            vid: tci & 0x0fff,
        }
    }

    /// As a TCI (fields masked to their widths).
    pub const fn tci(&self) -> u16 {
        ((self.pcp as u16 & 7) << 13) | ((self.dei as u16) << 12) | (self.vid & 0x0fff)
    }
}

/// High-level Ethernet header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EthernetRepr {
    /// Destination MAC.
    pub dst: [u8; 6],
    /// Source MAC.
    pub src: [u8; 6],
    /// 802.1Q tag, if any.
    pub vlan: Option<VlanTag>,
    /// Payload EtherType.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Parses a checked frame header.
    pub fn parse<T: AsRef<[u8]>>(f: &Frame<T>) -> Result<EthernetRepr> {
        f.check_len()?;
        Ok(EthernetRepr {
            dst: f.dst(),
            src: f.src(),
            vlan: f.tci().map(VlanTag::from_tci),
            ethertype: f.ethertype(),
        })
    }

    /// Header length.
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() {
            TAGGED_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header into the first `buffer_len()` bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<()> {
        let need = self.buffer_len();
        if buf.len() < need {
            return Err(Error::BufferTooSmall { need });
        }
        buf[field::DST].copy_from_slice(&self.dst);
        buf[field::SRC].copy_from_slice(&self.src);
        match self.vlan {
            Some(tag) => {
                put_u16(buf, field::ETHERTYPE.start, ethertype::VLAN);
                put_u16(buf, field::TCI.start, tag.tci());
                put_u16(buf, field::INNER_ETHERTYPE.start, self.ethertype);
            }
            None => put_u16(buf, field::ETHERTYPE.start, self.ethertype),
        }
        Ok(())
    }
}

/// Formats a MAC as `aa:bb:cc:dd:ee:ff`.
pub fn mac_to_string(mac: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        mac[0], mac[1], mac[2], mac[3], mac[4], mac[5]
    )
}

/// Parses `aa:bb:cc:dd:ee:ff` (or with `-`).
pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut n = 0;
    for part in s.split([':', '-']) {
        if n == 6 || part.len() != 2 {
            return None;
        }
        out[n] = u8::from_str_radix(part, 16).ok()?;
        n += 1;
    }
    (n == 6).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tagged_round_trip() {
        let r = EthernetRepr {
            dst: [1, 2, 3, 4, 5, 6],
            src: [7, 8, 9, 10, 11, 12],
            vlan: Some(VlanTag {
                pcp: 3,
                dei: false,
                vid: 100,
            }),
            ethertype: ethertype::IPV6,
        };
        let mut b = [0u8; 18];
        r.emit(&mut b).unwrap();
        assert_eq!(&b[12..18], &[0x81, 0x00, 0x60, 0x64, 0x86, 0xdd]);
        let f = Frame::new_checked(&b[..]).unwrap();
        assert_eq!(EthernetRepr::parse(&f).unwrap(), r);
        assert!(Frame::new_checked(&b[..16]).is_err());
        assert_eq!(parse_mac("02:00:00:99:00:03"), Some([2, 0, 0, 0x99, 0, 3]));
        assert_eq!(parse_mac("02:00:00:99:00"), None);
        assert_eq!(mac_to_string(&[2, 0, 0, 0x99, 0, 3]), "02:00:00:99:00:03");
    }
}
