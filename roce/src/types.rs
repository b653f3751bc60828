//! Newtypes for the identifiers and sequence numbers of the IB transport.
//!
//! Each wraps the integer it is on the wire and masks to its field width, so an out-of-range
//! value can never be emitted.

use core::cmp::Ordering;
use core::fmt;

/// Mask of a 24-bit field.
pub const MASK24: u32 = 0x00ff_ffff;

/// A 24-bit packet sequence number with wrapping arithmetic.
///
/// PSNs are compared only through [`Psn::cmp_wrapping`] (the sign of the 24-bit difference,
/// roce-wire.md "PSN rules"), which is meaningful while fewer than 2^23 PSNs are outstanding.
/// `Psn` deliberately does not implement `Ord`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(from = "u32", into = "u32"))]
pub struct Psn(u32);

impl From<u32> for Psn {
    fn from(v: u32) -> Psn {
        Psn::new(v)
    }
}

impl From<Psn> for u32 {
    fn from(v: Psn) -> u32 {
        v.0
    }
}

impl Psn {
    /// A PSN from the low 24 bits of `v`.
    pub const fn new(v: u32) -> Psn {
        Psn(v & MASK24)
    }

    /// The 24-bit value.
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n` modulo 2^24.
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & MASK24)
    }

    /// `self - n` modulo 2^24.
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & MASK24)
    }

    /// The next PSN.
    #[must_use]
    pub const fn next(self) -> Psn {
        self.add(1)
    }

    /// Signed 24-bit distance `self - other` in `-2^23 .. 2^23`.
    pub const fn diff(self, other: Psn) -> i32 {
        // Shift the 24-bit difference into the top of an i32 and back: sign-extends it.
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// Wrapping comparison: `Less` when `self` is before `other`.
    pub const fn cmp_wrapping(self, other: Psn) -> Ordering {
        let d = self.diff(other);
        if d < 0 {
            Ordering::Less
        } else if d > 0 {
            Ordering::Greater
        } else {
            Ordering::Equal
        }
    }

    /// `self` strictly before `other` (wrapping).
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// `self` strictly after `other` (wrapping).
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

/// `Debug` as `Name(0x..)` and `Display` as `0x..` for a newtype over an integer.
macro_rules! hex_fmt {
    ($name:ident) => {
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!(stringify!($name), "({:#x})"), self.0)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{:#x}", self.0)
            }
        }
    };
}

macro_rules! id24 {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        // Deserialised through `new`: an out-of-range value is masked, never stored.
        #[cfg_attr(feature = "serde", serde(from = "u32", into = "u32"))]
        pub struct $name(u32);

        impl From<u32> for $name {
            fn from(v: u32) -> Self {
                $name::new(v)
            }
        }

        impl From<$name> for u32 {
            fn from(v: $name) -> u32 {
                v.0
            }
        }

        impl $name {
            /// From the low 24 bits of `v`.
            pub const fn new(v: u32) -> Self {
                $name(v & MASK24)
            }

            /// The 24-bit value.
            pub const fn value(self) -> u32 {
                self.0
            }
        }

        hex_fmt!($name);
    };
}

id24!(
    /// A 24-bit queue pair number. QP0 is unused on RoCE; QP1 is the GSI.
    Qpn
);
id24!(
    /// The 24-bit message sequence number carried in AETH (counts completed messages at the
    /// responder, wrapping).
    Msn
);

impl Qpn {
    /// The general services interface QP (connection manager MADs).
    pub const GSI: Qpn = Qpn(1);
}

impl Msn {
    /// The next MSN modulo 2^24.
    #[must_use]
    pub const fn next(self) -> Msn {
        Msn(self.0.wrapping_add(1) & MASK24)
    }
}

macro_rules! key32 {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(transparent))]
        pub struct $name(pub u32);

        impl $name {
            /// The low 8 bits: the key byte that changes on every (re-)registration, so a
            /// stale key fails.
            pub const fn key_byte(self) -> u8 {
                self.0 as u8
            }

            /// The upper 24 bits: the index of the memory region.
            pub const fn index(self) -> u32 {
                self.0 >> 8
            }
        }

        hex_fmt!($name);
    };
}

key32!(
    /// Remote key of a memory region (carried in RETH / AtomicETH / IETH).
    Rkey
);
key32!(
    /// Local key of a memory region (in scatter/gather entries).
    Lkey
);

/// A 32-bit Q_Key (UD). Bit 31 set marks a privileged Q_Key, which a non-privileged sender may
/// not use; the GSI uses 0x80010000.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, Debug)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Qkey(pub u32);

impl Qkey {
    /// The GSI's well-known Q_Key.
    pub const GSI: Qkey = Qkey(0x8001_0000);

    /// Whether the privileged bit (31) is set.
    pub const fn is_privileged(self) -> bool {
        self.0 & 0x8000_0000 != 0
    }
}

/// A 16-bit partition key (RoCE uses the default 0xFFFF).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct Pkey(pub u16);

impl Pkey {
    /// The default full-membership partition key.
    pub const DEFAULT: Pkey = Pkey(0xffff);
}

impl Default for Pkey {
    fn default() -> Self {
        Pkey::DEFAULT
    }
}

/// A 128-bit global identifier. For RoCEv2 it is the IPv6 address, or the IPv4-mapped IPv6
/// address `::ffff:a.b.c.d` for IPv4.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(transparent))]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The IPv4-mapped GID `::ffff:a.b.c.d`.
    pub const fn from_ipv4(a: [u8; 4]) -> Gid {
        Gid([
            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, a[0], a[1], a[2], a[3],
        ])
    }

    /// The IPv4 address, when this is an IPv4-mapped GID.
    pub fn to_ipv4(&self) -> Option<[u8; 4]> {
        if self.is_ipv4_mapped() {
            Some([self.0[12], self.0[13], self.0[14], self.0[15]])
        } else {
            None
        }
    }

    /// Whether this is `::ffff:a.b.c.d`.
    pub fn is_ipv4_mapped(&self) -> bool {
        self.0[..10].iter().all(|&b| b == 0) && self.0[10] == 0xff && self.0[11] == 0xff
    }

    /// The link-local GID `fe80::` + modified EUI-64 of `mac`, which rxe and hardware RNICs
    /// put at GID index 0.
    pub const fn link_local_from_mac(mac: [u8; 6]) -> Gid {
        let e = eui64(mac).to_be_bytes();
        Gid([
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7],
        ])
    }

    /// As a std IPv6 address.
    pub fn to_ipv6(&self) -> std::net::Ipv6Addr {
        std::net::Ipv6Addr::from(self.0)
    }

    /// Whether all bytes are zero (an unset GID table entry).
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|&b| b == 0)
    }
}

impl From<std::net::Ipv4Addr> for Gid {
    fn from(a: std::net::Ipv4Addr) -> Gid {
        Gid::from_ipv4(a.octets())
    }
}

impl From<std::net::Ipv6Addr> for Gid {
    fn from(a: std::net::Ipv6Addr) -> Gid {
        Gid(a.octets())
    }
}

impl From<std::net::IpAddr> for Gid {
    fn from(a: std::net::IpAddr) -> Gid {
        match a {
            std::net::IpAddr::V4(v4) => v4.into(),
            std::net::IpAddr::V6(v6) => v6.into(),
        }
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.to_ipv4() {
            Some(a) => write!(f, "::ffff:{}.{}.{}.{}", a[0], a[1], a[2], a[3]),
            None => write!(f, "{}", self.to_ipv6()),
        }
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// The EUI-64 of a MAC address (the U/L bit flipped, 0xfffe in the middle), as a GUID: the
/// node GUID RoCE devices derive from their port's MAC (rxe does), which the connection
/// manager carries as the CA GUID.
pub const fn eui64(mac: [u8; 6]) -> u64 {
    u64::from_be_bytes([
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psn_wraps_and_compares() {
        let a = Psn::new(0xff_fffe);
        assert_eq!(a.add(3), Psn::new(1));
        assert_eq!(Psn::new(1).sub(3), a);
        assert_eq!(Psn::new(1).diff(a), 3);
        assert_eq!(a.diff(Psn::new(1)), -3);
        assert!(a.before(Psn::new(1)));
        assert!(Psn::new(1).after(a));
        assert_eq!(a.cmp_wrapping(a), Ordering::Equal);
        assert_eq!(Psn::new(0x1_000_005), Psn::new(5));
        // The boundary of the comparison window: 2^23 apart is "behind".
        assert_eq!(Psn::new(0).diff(Psn::new(0x80_0000)), -0x80_0000);
    }

    #[test]
    fn gid_forms() {
        let g = Gid::from_ipv4([10, 99, 0, 2]);
        assert_eq!(g.to_string(), "::ffff:10.99.0.2");
        assert_eq!(g.to_ipv4(), Some([10, 99, 0, 2]));
        let ll = Gid::link_local_from_mac([0x52, 0x54, 0, 0x99, 0, 2]);
        assert_eq!(ll.to_string(), "fe80::5054:ff:fe99:2");
        assert_eq!(ll.to_ipv4(), None);
        assert_eq!(Qpn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Rkey(0x1234).key_byte(), 0x34);
        assert!(Qkey::GSI.is_privileged());
    }
}
