//! RoCEv2 wire formats, in the smoltcp style.
//!
//! One module per header. Each has a zero-copy view `Packet<T: AsRef<[u8]>>` with getters (and
//! setters where `T: AsMut<[u8]>`), a `mod field` of byte ranges, and a high-level `Repr` with
//! `parse`, `emit` and `buffer_len`. A fixed-length header declares its fields once, as a table
//! (`header!`, or `header_view!` where bit fields or a derived length call for a hand-written
//! `Repr`); the macros generate the rest.
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

/// Checks that an output buffer has room for `need` bytes (what every `emit` checks first).
#[inline]
pub(crate) fn check_room(buf: &[u8], need: usize) -> Result<()> {
    if buf.len() < need {
        Err(Error::BufferTooSmall { need })
    } else {
        Ok(())
    }
}

/// A value a header carries big-endian in `LEN` bytes, read and written at a byte offset
/// (which must be in bounds). What the field tables of `header_view!` and `header!` name.
pub(crate) trait WireValue: Sized {
    /// Bytes on the wire.
    const LEN: usize;
    /// Reads the value at `at`.
    fn get(b: &[u8], at: usize) -> Self;
    /// Writes the value at `at`.
    fn put(self, b: &mut [u8], at: usize);
}

/// Implements `WireValue` for a type carried as `$len` bytes through a reader and a writer.
macro_rules! wire_value {
    ($($ty:ty: $len:expr, $get:expr, $put:expr;)*) => {$(
        impl WireValue for $ty {
            const LEN: usize = $len;
            #[inline]
            fn get(b: &[u8], at: usize) -> Self {
                let f: fn(&[u8], usize) -> $ty = $get;
                f(b, at)
            }
            #[inline]
            fn put(self, b: &mut [u8], at: usize) {
                let f: fn(&mut [u8], usize, $ty) = $put;
                f(b, at, self)
            }
        }
    )*};
}

wire_value! {
    u8: 1, |b, at| b[at], |b, at, v| b[at] = v;
    u16: 2, get_u16, put_u16;
    u32: 4, get_u32, put_u32;
    u64: 8, get_u64, put_u64;
    [u8; 16]: 16, |b, at| b[at..at + 16].try_into().unwrap(), |b, at, v| {
        b[at..at + 16].copy_from_slice(&v)
    };
    Pkey: 2, |b, at| Pkey(get_u16(b, at)), |b, at, v| put_u16(b, at, v.0);
    Qkey: 4, |b, at| Qkey(get_u32(b, at)), |b, at, v| put_u32(b, at, v.0);
    Rkey: 4, |b, at| Rkey(get_u32(b, at)), |b, at, v| put_u32(b, at, v.0);
    Qpn: 3, |b, at| Qpn::new(get_u24(b, at)), |b, at, v| put_u24(b, at, v.value());
    Psn: 3, |b, at| Psn::new(get_u24(b, at)), |b, at, v| put_u24(b, at, v.value());
    Msn: 3, |b, at| Msn::new(get_u24(b, at)), |b, at, v| put_u24(b, at, v.value());
    opcode::Opcode: 1, |b, at| opcode::Opcode(b[at]), |b, at, v| b[at] = v.0;
}

/// Generates a zero-copy view struct over a buffer with `new_unchecked`, `new_checked` and
/// `into_inner`; the caller writes the view's `check_len` (what `new_checked` calls), or names
/// (`check_len => f`) its `f(&self, available)` that `check_len` calls with the buffer length.
macro_rules! view {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking its length (accessors may panic if short).
            pub const fn new_unchecked(buffer: T) -> Self {
                $name { buffer }
            }

            /// Wraps a buffer after [`Self::check_len`].
            pub fn new_checked(buffer: T) -> $crate::wire::Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// The wrapped buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
    // A header whose lengths are checked against `available` bytes from its start, which
    // `check_len` takes to be the buffer.
    ($(#[$m:meta])* $name:ident, $(#[$cm:meta])* check_len => $lengths:ident) => {
        $crate::wire::view!($(#[$m])* $name);

        impl<T: AsRef<[u8]>> $name<T> {
            $(#[$cm])*
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                self.$lengths(self.buffer.as_ref().len())
            }
        }
    };
}
pub(crate) use view;

/// Generates the zero-copy view boilerplate of a fixed-length header: the `view!` struct,
/// `LEN` and a `check_len` that wants the whole header.
macro_rules! fixed_view {
    ($(#[$m:meta])* $name:ident, $len:expr, $layer:expr) => {
        $crate::wire::view!($(#[$m])* $name);

        impl<T: AsRef<[u8]>> $name<T> {
            /// Header length in bytes.
            pub const LEN: usize = $len;

            /// Checks the buffer holds the whole header.
            pub fn check_len(&self) -> $crate::wire::Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err($crate::wire::Error::Truncated($layer))
                } else {
                    Ok(())
                }
            }
        }
    };
}
pub(crate) use fixed_view;

/// The constant of a field-table row: a byte offset (`[n]`) or a byte range (`[a..b]`).
macro_rules! field_const {
    ($(#[$m:meta])* $c:ident [$a:literal]) => {
        $(#[$m])*
        pub const $c: usize = $a;
    };
    ($(#[$m:meta])* $c:ident [$a:literal .. $b:literal]) => {
        $(#[$m])*
        pub const $c: Field = $a..$b;
    };
}
pub(crate) use field_const;

/// Generates a header's `mod field` from a table: one constant a row, with the row's doc, a
/// byte offset (`NAME[n]`, a `usize`) or a byte range (`NAME[a..b]`, a `Field`).
macro_rules! fields {
    ($($(#[$fm:meta])* $c:ident [$($pos:tt)*];)*) => {
        /// Byte ranges.
        pub mod field {
            #[allow(unused_imports)]
            use $crate::wire::Field;
            $($crate::wire::field_const!($(#[$fm])* $c [$($pos)*]);)*
        }
    };
}
pub(crate) use fields;

/// The first byte and the width of a field-table row's position.
macro_rules! field_span {
    ([$a:literal]) => {
        ($a, 1)
    };
    ([$a:literal .. $b:literal]) => {
        ($a, $b - $a)
    };
}
pub(crate) use field_span;

/// The getter of a field-table row that names one (none for a row without).
macro_rules! field_getter {
    ($(#[$m:meta])* [$($pos:tt)*]) => {};
    ($(#[$m:meta])* [$($pos:tt)*] => $get:ident: $ty:ty) => {
        $(#[$m])*
        pub fn $get(&self) -> $ty {
            const SPAN: (usize, usize) = $crate::wire::field_span!([$($pos)*]);
            const _: () = assert!(SPAN.1 == <$ty as $crate::wire::WireValue>::LEN);
            <$ty as $crate::wire::WireValue>::get(self.buffer.as_ref(), SPAN.0)
        }
    };
}
pub(crate) use field_getter;

/// Generates a fixed-length header's layout from a table of its fields: `mod field` (one
/// constant a row, with the row's doc), `HEADER_LEN`, the `fixed_view!` `Packet`, and a
/// getter for each row that names one (`=> getter: Type`, the type read as a `WireValue`,
/// whose width the row's range must match). Rows without a getter are bytes of bit fields,
/// which the header's module reads by hand. Every row must lie within the header (checked at
/// compile time, as the widths are).
macro_rules! header_view {
    (
        $len:literal bytes, $layer:ident;
        $(
            $(#[$fm:meta])*
            $c:ident [$($pos:tt)*] $(=> $get:ident: $ty:ty)?;
        )*
    ) => {
        $crate::wire::fields! {
            $($(#[$fm])* $c [$($pos)*];)*
        }

        /// Header length.
        pub const HEADER_LEN: usize = $len;

        // Every field lies within the header.
        const _: () = {
            $(
                let (start, width): (usize, usize) = $crate::wire::field_span!([$($pos)*]);
                assert!(start + width <= HEADER_LEN);
            )*
        };

        $crate::wire::fixed_view!(
            /// Zero-copy view of the header.
            Packet,
            HEADER_LEN,
            $crate::wire::Layer::$layer
        );

        impl<T: AsRef<[u8]>> Packet<T> {
            $($crate::wire::field_getter!($(#[$fm])* [$($pos)*] $(=> $get: $ty)?);)*
        }
    };
}
pub(crate) use header_view;

/// A fixed-length header whose high-level form is its fields as they are: the
/// `header_view!` layout from a table in which every row names its getter and its `Repr`
/// field (`=> getter -> repr_field: Type`), and the `Repr` struct (plain data: `Debug`, `Copy`,
/// `Eq`, `Hash`, `Default`) with `parse` (length check, then each getter), `buffer_len` and
/// `emit` (room check, then each field).
macro_rules! header {
    (
        $(#[$rm:meta])* $repr:ident: $len:literal bytes, $layer:ident;
        $(
            $(#[$fm:meta])*
            $c:ident [$($pos:tt)*] => $get:ident -> $name:ident: $ty:ty;
        )*
    ) => {
        $crate::wire::header_view!(
            $len bytes, $layer;
            $($(#[$fm])* $c [$($pos)*] => $get: $ty;)*
        );

        $(#[$rm])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $repr {
            $(
                $(#[$fm])*
                pub $name: $ty,
            )*
        }

        impl $repr {
            /// Parses the header.
            pub fn parse<T: AsRef<[u8]>>(p: &Packet<T>) -> $crate::wire::Result<$repr> {
                p.check_len()?;
                Ok($repr { $($name: p.$get(),)* })
            }

            /// Header length.
            pub const fn buffer_len(&self) -> usize {
                HEADER_LEN
            }

            /// Writes the header.
            pub fn emit(&self, buf: &mut [u8]) -> $crate::wire::Result<()> {
                $crate::wire::check_room(buf, HEADER_LEN)?;
                $(
                    <$ty as $crate::wire::WireValue>::put(
                        self.$name,
                        buf,
                        $crate::wire::field_span!([$($pos)*]).0,
                    );
                )*
                Ok(())
            }
        }
    };
}
pub(crate) use header;

#[cfg(test)]
mod tests {
    use super::*;

    /// A table header's `Repr` emits exactly `bytes` and parses back from them, and a buffer
    /// one byte short is refused by the view and by `emit`.
    macro_rules! check_round_trip {
        ($m:ident::$repr:ident $fields:tt, $bytes:expr) => {{
            let r = $m::$repr $fields;
            let bytes: &[u8] = &$bytes;
            let n = bytes.len();
            assert_eq!(n, $m::HEADER_LEN, stringify!($repr));
            let mut out = vec![0u8; n];
            r.emit(&mut out).unwrap();
            assert_eq!(out, bytes, stringify!($repr));
            let p = $m::Packet::new_checked(bytes).unwrap();
            assert_eq!($m::$repr::parse(&p).unwrap(), r);
            assert!($m::Packet::new_checked(&bytes[..n - 1]).is_err());
            assert_eq!(
                r.emit(&mut out[..n - 1]),
                Err(Error::BufferTooSmall { need: n })
            );
        }};
    }

    #[test]
    fn table_headers_round_trip() {
        check_round_trip!(
            reth::RethRepr {
                va: 0x55b6_a788_2000,
                rkey: Rkey(0x38b),
                len: 4096,
            },
            [0, 0, 0x55, 0xb6, 0xa7, 0x88, 0x20, 0, 0, 0, 0x03, 0x8b, 0, 0, 0x10, 0]
        );
        check_round_trip!(
            atomic_eth::AtomicEthRepr {
                va: 0x1000,
                rkey: Rkey(7),
                swap_add: 0x0102_0304_0506_0708,
                compare: u64::MAX,
            },
            [
                0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff,
                0xff, 0xff, 0xff, 0xff, 0xff,
            ]
        );
        check_round_trip!(
            atomic_ack_eth::AtomicAckEthRepr {
                orig: 0xdead_beef_0000_0001,
            },
            [0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1]
        );
        check_round_trip!(
            deth::DethRepr {
                qkey: Qkey::GSI,
                src_qp: Qpn::GSI,
                resv: 0,
            },
            [0x80, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01]
        );
        check_round_trip!(
            aeth::AethRepr {
                syndrome: 0x60,
                msn: Msn::new(0x123456),
            },
            [0x60, 0x12, 0x34, 0x56]
        );
        check_round_trip!(imm::ImmRepr { imm: 0x1234_5678 }, [0x12, 0x34, 0x56, 0x78]);
        check_round_trip!(ieth::IethRepr { rkey: Rkey(0xabcd) }, [0, 0, 0xab, 0xcd]);
        check_round_trip!(feth::FethRepr { raw: 0x31 }, [0, 0, 0, 0x31]);
        let reserved: [u8; 16] = core::array::from_fn(|i| i as u8 + 1);
        check_round_trip!(cnp::CnpRepr { reserved }, reserved);
    }
}
