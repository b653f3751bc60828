//! RoCEv2 wire formats, in the smoltcp style.
//!
//! One module per header. Each has a zero-copy view `Packet<T: AsRef<[u8]>>` with getters (and
//! setters where `T: AsMut<[u8]>`), a `mod field` of byte ranges, and a high-level `Repr` with
//! `parse`, `emit` and `buffer_len`.
//!
//! # The panic rule
//! `Packet::new_unchecked` trusts the buffer's length; its accessors may panic on a short
//! buffer. `Packet::new_checked` (or `check_len`) verifies the length first, after which no
//! accessor panics. Untrusted input (anything off the wire) goes only through `new_checked`,
//! `Repr::parse` or [`frame::parse`], which return an [`Error`] for every malformed input and
//! never panic.
//!
//! Wire enums keep unknown values (`Unknown(..)`) instead of failing or losing them, so a frame
//! parses and re-emits byte-identically.

pub mod aeth;
pub mod arp;
pub mod atomic_ack_eth;
pub mod atomic_eth;
pub mod bth;
pub mod cm;
pub mod cnp;
pub mod deth;
pub mod ethernet;
pub mod feth;
pub mod frame;
pub mod icrc;
pub mod ieth;
pub mod imm;
pub mod ipv4;
pub mod ipv6;
pub mod mac_control;
pub mod mad;
pub mod opcode;
pub mod reth;
pub mod udp;

pub use crate::types::{Gid, Lkey, Msn, Pkey, Psn, Qkey, Qpn, Rkey};

/// A byte range of a header field.
pub type Field = core::ops::Range<usize>;

/// The UDP destination port of RoCEv2 (IANA).
pub const ROCEV2_PORT: u16 = 4791;

/// Length of the ICRC trailer.
pub const ICRC_LEN: usize = 4;

/// Which header or stage a parse error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layer {
    /// Ethernet II header.
    Ethernet,
    /// 802.1Q tag.
    Vlan,
    /// IPv4 header.
    Ipv4,
    /// IPv6 header.
    Ipv6,
    /// UDP header.
    Udp,
    /// Base transport header.
    Bth,
    /// The extended transport headers the opcode calls for.
    ExtHeaders,
    /// The 4-byte ICRC trailer.
    Icrc,
    /// A MAC control (PAUSE/PFC) frame.
    MacControl,
    /// An ARP packet.
    Arp,
    /// The CNP body.
    Cnp,
}

impl core::fmt::Display for Layer {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            Layer::Ethernet => "Ethernet header",
            Layer::Vlan => "802.1Q tag",
            Layer::Ipv4 => "IPv4 header",
            Layer::Ipv6 => "IPv6 header",
            Layer::Udp => "UDP header",
            Layer::Bth => "BTH",
            Layer::ExtHeaders => "extended transport headers",
            Layer::Icrc => "ICRC",
            Layer::MacControl => "MAC control frame",
            Layer::Arp => "ARP packet",
            Layer::Cnp => "CNP body",
        };
        f.write_str(s)
    }
}

/// Why a frame or header was rejected, named after the first check that failed (the frame
/// parser checks in the order the variants are listed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The buffer ends inside this header.
    #[error("{0} truncated")]
    Truncated(Layer),
    /// The EtherType is neither IPv4 nor IPv6.
    #[error("EtherType {0:#06x} is not IP")]
    NotIp(u16),
    /// The IP version nibble disagrees with the EtherType.
    #[error("IP version {0} does not match the EtherType")]
    BadIpVersion(u8),
    /// IPv4 IHL below 5 or beyond the buffer.
    #[error("bad IPv4 header length {0}")]
    BadIpHeaderLength(u8),
    /// The IPv4 header checksum does not verify.
    #[error("bad IPv4 header checksum")]
    BadIpv4Checksum,
    /// An IPv4 fragment (RoCE is never fragmented).
    #[error("IPv4 fragment")]
    Ipv4Fragment,
    /// IP total/payload length inconsistent with the frame.
    #[error("IP length {0} inconsistent with the frame")]
    BadIpLength(u16),
    /// Not UDP.
    #[error("IP protocol {0} is not UDP")]
    NotUdp(u8),
    /// UDP destination port is not 4791.
    #[error("UDP destination port {0} is not RoCEv2 (4791)")]
    NotRoceV2(u16),
    /// UDP length inconsistent with the IP length.
    #[error("UDP length {0} inconsistent with the IP length")]
    BadUdpLength(u16),
    /// BTH transport header version is not 0.
    #[error("BTH TVer {0} is not 0")]
    BadTver(u8),
    /// Pad count larger than the payload, or payload+pad not 4-byte aligned.
    #[error("bad BTH pad count {0}")]
    BadPadCount(u8),
    /// Opcode not defined for RoCEv2 (or a transport ferroce does not implement, such as RD).
    #[error("unsupported opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// The ICRC does not verify.
    #[error("bad ICRC: frame carries {received:#010x}, computed {computed:#010x}")]
    BadIcrc {
        /// The value in the trailer (wire bytes read little-endian).
        received: u32,
        /// The value computed over the frame.
        computed: u32,
    },
    /// A field holds a value the header does not allow (e.g. a reserved AETH type).
    #[error("malformed {0}")]
    Malformed(Layer),
    /// On emit: the extended headers supplied do not match what the opcode calls for.
    #[error("extended headers do not match opcode {0:#04x}")]
    HeadersMismatch(u8),
    /// On emit: the output buffer is too small.
    #[error("output buffer too small: need {need} bytes")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
    },
    /// On emit: the frame would exceed what the length fields can express.
    #[error("payload too long")]
    PayloadTooLong,
}

/// Parse/emit result.
pub type Result<T> = core::result::Result<T, Error>;

/// Reads a big-endian u16 at `f` (which must be in bounds).
#[inline]
pub(crate) fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads a big-endian u24 at `at`.
#[inline]
pub(crate) fn get_u24(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
}

/// Reads a big-endian u32 at `at`.
#[inline]
pub(crate) fn get_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a big-endian u64 at `at`.
#[inline]
pub(crate) fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

#[inline]
pub(crate) fn put_u16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put_u24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

#[inline]
pub(crate) fn put_u32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put_u64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// Generates the zero-copy view boilerplate of a fixed-length header: the struct, the
/// checked/unchecked constructors, `check_len` and `into_inner`.
macro_rules! fixed_view {
    ($(#[$m:meta])* $name:ident, $len:expr, $layer:expr) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Header length in bytes.
            pub const LEN: usize = $len;

            /// Wraps a buffer without checking its length (accessors may panic if short).
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps a buffer after checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Checks the buffer holds the whole header.
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::wire::Error::Truncated($layer))
                } else {
                    Ok(())
                }
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}
pub(crate) use fixed_view;

/// Generates a 4-byte header holding one big-endian u32 (ImmDt, IETH, FETH): view + Repr.
macro_rules! u32_header {
    ($(#[$m:meta])* $repr:ident, $field:ident: $ty:ty, $wrap:expr, $unwrap:expr) => {
        /// Header length.
        pub const HEADER_LEN: usize = 4;

        $crate::wire::fixed_view!(
            /// Zero-copy view.
            Packet,
            HEADER_LEN,
            $crate::wire::Layer::ExtHeaders
        );

        impl<T: AsRef<[u8]>> Packet<T> {
            /// The header's value.
            pub fn $field(&self) -> $ty {
                let f: fn(u32) -> $ty = $wrap;
                f($crate::wire::get_u32(self.buffer.as_ref(), 0))
            }
        }

        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $repr {
            /// The header's value.
            pub $field: $ty,
        }

        impl $repr {
            /// Parses the header.
            pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> $crate::wire::Result<$repr> {
                p.check_len()?;
                Ok($repr { $field: p.$field() })
            }

            /// Header length.
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }

            /// Writes the header.
            pub fn emit(&self, buf: &mut [u8]) -> $crate::wire::Result<()> {
                if buf.len() < HEADER_LEN {
                    return Err($crate::wire::Error::BufferTooSmall { need: HEADER_LEN });
                }
                let f: fn($ty) -> u32 = $unwrap;
                $crate::wire::put_u32(buf, 0, f(self.$field));
                Ok(())
            }
        }
    };
}
pub(crate) use u32_header;
