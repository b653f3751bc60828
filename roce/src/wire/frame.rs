//! Whole RoCEv2 frames: a validating parser (contiguous or segmented input) and a builder that
//! writes headers and trailer into caller memory, with the payload supplied separately.
//!
//! Parsing checks, in order: Ethernet type, IP version and header (IPv4 checksum, no
//! fragments), UDP destination port 4791 and length, BTH TVer, opcode and the extended header
//! lengths it implies, pad count, and ICRC; the error names the first failure. Every input,
//! however malformed, yields a result or an error, never a panic.

use super::aeth::{self, AethRepr};
use super::atomic_ack_eth::{self, AtomicAckEthRepr};
use super::atomic_eth::{self, AtomicEthRepr};
use super::bth::{self, BthRepr};
use super::cnp::{self, CnpRepr};
use super::deth::{self, DethRepr};
use super::ethernet::{self, ethertype, EthernetRepr};
use super::feth::{self, FethRepr};
use super::icrc::{self, Icrc};
use super::ieth::{self, IethRepr};
use super::imm::{self, ImmRepr};
use super::ipv4::{self, Ipv4Repr};
use super::ipv6::{self, Ipv6Repr};
use super::opcode::{ExtHeader, Opcode, OpcodeInfo};
use super::reth::{self, RethRepr};
use super::udp::{self, UdpRepr};
use super::{get_u16, put_u16, Error, Layer, Result, ICRC_LEN, ROCEV2_PORT};
use crate::types::{Psn, Qpn};

/// The extended transport headers of one packet. Which are present is dictated by the opcode
/// (see [`OpcodeInfo::headers`]); [`TransportRepr::emit`] refuses a mismatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ExtHeaders {
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// DETH.
    pub deth: Option<DethRepr>,
    /// FETH.
    pub feth: Option<FethRepr>,
    /// Immediate data.
    pub imm: Option<ImmRepr>,
    /// IETH.
    pub ieth: Option<IethRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicAckETH.
    pub atomic_ack: Option<AtomicAckEthRepr>,
    /// CNP body.
    pub cnp: Option<CnpRepr>,
}

impl ExtHeaders {
    /// The extended headers set, as [`OpcodeInfo::ext_mask`] lists an opcode's.
    fn mask(&self) -> u16 {
        let bit = |set: bool, h: ExtHeader| (set as u16) << h as u16;
        bit(self.reth.is_some(), ExtHeader::Reth)
            | bit(self.atomic_eth.is_some(), ExtHeader::AtomicEth)
            | bit(self.deth.is_some(), ExtHeader::Deth)
            | bit(self.feth.is_some(), ExtHeader::Feth)
            | bit(self.imm.is_some(), ExtHeader::ImmDt)
            | bit(self.ieth.is_some(), ExtHeader::Ieth)
            | bit(self.aeth.is_some(), ExtHeader::Aeth)
            | bit(self.atomic_ack.is_some(), ExtHeader::AtomicAckEth)
            | bit(self.cnp.is_some(), ExtHeader::CnpBody)
    }
}

/// BTH plus extended headers: everything between UDP and the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransportRepr {
    /// Base transport header.
    pub bth: BthRepr,
    /// Extended headers.
    pub ext: ExtHeaders,
}

impl TransportRepr {
    /// A transport header with no extended headers set yet.
    pub const fn new(bth: BthRepr) -> TransportRepr {
        TransportRepr {
            bth,
            ext: ExtHeaders {
                reth: None,
                atomic_eth: None,
                deth: None,
                feth: None,
                imm: None,
                ieth: None,
                aeth: None,
                atomic_ack: None,
                cnp: None,
            },
        }
    }

    /// The opcode's table entry (error for an unknown opcode).
    pub fn info(&self) -> Result<&'static OpcodeInfo> {
        self.bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(self.bth.opcode.0))
    }

    /// Parses the BTH and the extended headers its opcode calls for, from the start of `buf`.
    /// Returns the headers and their total length.
    pub fn parse(buf: &[u8]) -> Result<(TransportRepr, usize)> {
        let mut t = TransportRepr::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0)));
        let total = t.parse_into(buf)?;
        Ok((t, total))
    }

    /// As [`TransportRepr::parse`], into `self` (every field written on success; on an
    /// error `self` holds nothing usable): the frame parser fills its result in place
    /// rather than moving some 180 bytes per packet.
    pub fn parse_into(&mut self, buf: &[u8]) -> Result<usize> {
        let bth = BthRepr::parse(&bth::Packet::new_checked(buf)?)?;
        let info = bth
            .opcode
            .info()
            .ok_or(Error::UnknownOpcode(bth.opcode.0))?;
        let total = bth::HEADER_LEN + info.ext_len;
        if buf.len() < total {
            return Err(Error::Truncated(Layer::ExtHeaders));
        }
        *self = TransportRepr::new(bth);
        let t = self;
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            let b = &buf[off..off + h.len()];
            match h {
                ExtHeader::Reth => {
                    t.ext.reth = Some(RethRepr::parse(&reth::Packet::new_checked(b)?)?)
                }
                ExtHeader::AtomicEth => {
                    t.ext.atomic_eth =
                        Some(AtomicEthRepr::parse(&atomic_eth::Packet::new_checked(b)?)?)
                }
                ExtHeader::Deth => {
                    t.ext.deth = Some(DethRepr::parse(&deth::Packet::new_checked(b)?)?)
                }
                ExtHeader::Feth => {
                    t.ext.feth = Some(FethRepr::parse(&feth::Packet::new_checked(b)?)?)
                }
                ExtHeader::ImmDt => {
                    t.ext.imm = Some(ImmRepr::parse(&imm::Packet::new_checked(b)?)?)
                }
                ExtHeader::Ieth => {
                    t.ext.ieth = Some(IethRepr::parse(&ieth::Packet::new_checked(b)?)?)
                }
                ExtHeader::Aeth => {
                    t.ext.aeth = Some(AethRepr::parse(&aeth::Packet::new_checked(b)?)?)
                }
                ExtHeader::AtomicAckEth => {
                    t.ext.atomic_ack = Some(AtomicAckEthRepr::parse(
                        &atomic_ack_eth::Packet::new_checked(b)?,
                    )?)
                }
                ExtHeader::CnpBody => {
                    t.ext.cnp = Some(CnpRepr::parse(&cnp::Packet::new_checked(b)?)?)
                }
            }
            off += h.len();
        }
        Ok(total)
    }

    /// Length of the BTH and extended headers.
    pub fn buffer_len(&self) -> Result<usize> {
        Ok(bth::HEADER_LEN + self.info()?.ext_len)
    }

    /// Writes the BTH and the extended headers, in the table's order. Fails if the extended
    /// headers set are not exactly those the opcode calls for.
    pub fn emit(&self, buf: &mut [u8]) -> Result<usize> {
        self.emit_padded(buf, self.bth.pad_count)
    }

    /// [`Self::emit`] with the BTH's pad count `pad` in place of `bth.pad_count` (the frame
    /// builder knows it from the payload; no copy of the whole header set to change it).
    fn emit_padded(&self, buf: &mut [u8], pad: u8) -> Result<usize> {
        let info = self.info()?;
        // Exactly the opcode's headers, no more and no fewer.
        if self.ext.mask() != info.ext_mask {
            return Err(Error::HeadersMismatch(info.opcode));
        }
        let total = bth::HEADER_LEN + info.ext_len;
        if buf.len() < total {
            return Err(Error::BufferTooSmall { need: total });
        }
        BthRepr {
            pad_count: pad,
            ..self.bth
        }
        .emit(buf)?;
        let mut off = bth::HEADER_LEN;
        for &h in info.headers {
            let b = &mut buf[off..off + h.len()];
            // `present` was checked above, so each unwrap_or_default never takes the default.
            match h {
                ExtHeader::Reth => self.ext.reth.unwrap_or_default().emit(b)?,
                ExtHeader::AtomicEth => self.ext.atomic_eth.unwrap_or_default().emit(b)?,
                ExtHeader::Deth => self.ext.deth.unwrap_or_default().emit(b)?,
                ExtHeader::Feth => self.ext.feth.unwrap_or_default().emit(b)?,
                ExtHeader::ImmDt => self.ext.imm.unwrap_or_default().emit(b)?,
                ExtHeader::Ieth => self.ext.ieth.unwrap_or_default().emit(b)?,
                ExtHeader::Aeth => self
                    .ext
                    .aeth
                    .unwrap_or(AethRepr::ack(0, Default::default()))
                    .emit(b)?,
                ExtHeader::AtomicAckEth => self.ext.atomic_ack.unwrap_or_default().emit(b)?,
                ExtHeader::CnpBody => self.ext.cnp.unwrap_or_default().emit(b)?,
            }
            off += h.len();
        }
        Ok(total)
    }
}

/// The network layer of a RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpRepr {
    /// IPv4 (GIDs are IPv4-mapped).
    V4(Ipv4Repr),
    /// IPv6.
    V6(Ipv6Repr),
}

impl IpRepr {
    /// Header length.
    pub const fn header_len(&self) -> usize {
        match self {
            IpRepr::V4(_) => ipv4::HEADER_LEN,
            IpRepr::V6(_) => ipv6::HEADER_LEN,
        }
    }

    /// Whether this is IPv6.
    pub const fn is_ipv6(&self) -> bool {
        matches!(self, IpRepr::V6(_))
    }

    /// DSCP.
    pub const fn dscp(&self) -> u8 {
        match self {
            IpRepr::V4(r) => r.dscp,
            IpRepr::V6(r) => r.dscp,
        }
    }

    /// ECN codepoint.
    pub const fn ecn(&self) -> ipv4::Ecn {
        match self {
            IpRepr::V4(r) => r.ecn,
            IpRepr::V6(r) => r.ecn,
        }
    }

    /// Source and destination as GIDs.
    pub fn gids(&self) -> (super::Gid, super::Gid) {
        match self {
            IpRepr::V4(r) => (super::Gid::from_ipv4(r.src), super::Gid::from_ipv4(r.dst)),
            IpRepr::V6(r) => (super::Gid(r.src), super::Gid(r.dst)),
        }
    }

    /// Payload length (after the IP header).
    pub const fn payload_len(&self) -> usize {
        match self {
            IpRepr::V4(r) => r.payload_len,
            IpRepr::V6(r) => r.payload_len,
        }
    }

    fn set_payload_len(&mut self, n: usize) {
        match self {
            IpRepr::V4(r) => r.payload_len = n,
            IpRepr::V6(r) => r.payload_len = n,
        }
    }

    fn ethertype(&self) -> u16 {
        match self {
            IpRepr::V4(_) => ethertype::IPV4,
            IpRepr::V6(_) => ethertype::IPV6,
        }
    }
}

/// Every header of a RoCEv2 frame: what the builder needs and what the parser returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr {
    /// Ethernet header (the EtherType is derived from `ip` when emitting).
    pub eth: EthernetRepr,
    /// IP header (its length fields are derived when emitting).
    pub ip: IpRepr,
    /// UDP source port (flow entropy).
    pub udp_src_port: u16,
    /// UDP checksum as carried (0 when sending).
    pub udp_checksum: u16,
    /// BTH and extended headers (the pad count is derived when emitting).
    pub transport: TransportRepr,
}

/// Pad bytes that align a payload of `len` bytes to 4 (IBA 9.2: PadCnt).
pub const fn pad_for(len: usize) -> usize {
    (4 - (len & 3)) & 3
}

impl FrameRepr {
    /// Bytes of headers before the payload.
    pub fn header_len(&self) -> Result<usize> {
        Ok(self.eth.buffer_len()
            + self.ip.header_len()
            + udp::HEADER_LEN
            + self.transport.buffer_len()?)
    }

    /// Bytes of the whole frame for a payload of `payload_len` bytes.
    pub fn frame_len(&self, payload_len: usize) -> Result<usize> {
        Ok(self.header_len()? + payload_len + pad_for(payload_len) + ICRC_LEN)
    }

    /// Writes every header into `hdr`, with the lengths, IPv4 checksum and BTH pad count that
    /// a payload of `payload_len` bytes implies. Returns the header length. The payload goes
    /// right after, then the trailer from [`FrameRepr::layout`]: [`FrameLayout::header_icrc`]
    /// and [`FrameLayout::finish_trailer`] around a payload fed separately, or
    /// [`FrameLayout::emit_trailer_in_place`].
    pub fn emit_headers(&self, hdr: &mut [u8], payload_len: usize) -> Result<usize> {
        let tlen = self.transport.buffer_len()?;
        let hlen = self.header_len()?;
        if hdr.len() < hlen {
            return Err(Error::BufferTooSmall { need: hlen });
        }
        let pad = pad_for(payload_len);
        let udp_payload = tlen + payload_len + pad + ICRC_LEN;
        let mut eth = self.eth;
        eth.ethertype = self.ip.ethertype();
        let mut off = eth.buffer_len();
        eth.emit(hdr)?;
        let mut ip = self.ip;
        ip.set_payload_len(udp::HEADER_LEN + udp_payload);
        match &ip {
            IpRepr::V4(r) => r.emit(&mut hdr[off..])?,
            IpRepr::V6(r) => r.emit(&mut hdr[off..])?,
        }
        off += ip.header_len();
        UdpRepr {
            src_port: self.udp_src_port,
            dst_port: ROCEV2_PORT,
            payload_len: udp_payload,
            checksum: self.udp_checksum,
        }
        .emit(&mut hdr[off..])?;
        off += udp::HEADER_LEN;
        off += self.transport.emit_padded(&mut hdr[off..], pad as u8)?;
        debug_assert_eq!(off, hlen);
        Ok(hlen)
    }

    /// Where this frame's headers end and its IP header lies: what the trailer's ICRC needs
    /// ([`FrameLayout`]).
    pub fn layout(&self) -> Result<FrameLayout> {
        Ok(FrameLayout {
            l3: self.eth.buffer_len(),
            ip_header_len: self.ip.header_len(),
            ipv6: self.ip.is_ipv6(),
            header_len: self.header_len()?,
        })
    }

    /// Writes a complete frame (headers, payload, pad, ICRC) into `buf`; returns its length.
    pub fn emit(&self, buf: &mut [u8], payload: &[u8]) -> Result<usize> {
        let total = self.frame_len(payload.len())?;
        if buf.len() < total {
            return Err(Error::BufferTooSmall { need: total });
        }
        let hlen = self.emit_headers(buf, payload.len())?;
        buf[hlen..hlen + payload.len()].copy_from_slice(payload);
        self.layout()?
            .emit_trailer_in_place(&mut buf[..total], payload.len())?;
        Ok(total)
    }
}

/// Where the parts of a built frame lie, as far as its trailer is concerned: the ICRC
/// covers the frame from the IP header on, with the variant fields of the IP, UDP and BTH
/// headers masked (IBA 17.3.3, roce-wire.md). A [`FrameRepr`] and a [`HeaderTemplate`] both
/// give one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLayout {
    /// Offset of the IP header (the Ethernet header's length).
    pub l3: usize,
    /// Length of the IP header.
    pub ip_header_len: usize,
    /// Whether the IP header is IPv6.
    pub ipv6: bool,
    /// Bytes of headers before the payload.
    pub header_len: usize,
}

impl FrameLayout {
    /// The ICRC computation over the headers `hdr` (the variant fields masked), ready to
    /// take the payload; [`FrameLayout::finish_trailer`] completes it.
    pub fn header_icrc(&self, hdr: &[u8]) -> Result<Icrc> {
        let hlen = self.header_len;
        let prefix_end = self.l3 + self.ip_header_len + udp::HEADER_LEN + bth::HEADER_LEN;
        if hdr.len() < hlen || hlen < prefix_end {
            return Err(Error::BufferTooSmall {
                need: hlen.max(prefix_end),
            });
        }
        let mut c = Icrc::new();
        c.update_masked_prefix(&hdr[self.l3..prefix_end], self.ipv6, self.ip_header_len);
        c.update(&hdr[prefix_end..hlen]);
        Ok(c)
    }

    /// Writes the trailer (zero pad, then the ICRC) to `trailer` for a computation from
    /// [`FrameLayout::header_icrc`] that has taken the `payload_len` bytes of payload;
    /// returns the trailer's length.
    pub fn finish_trailer(
        &self,
        mut icrc: Icrc,
        payload_len: usize,
        trailer: &mut [u8],
    ) -> Result<usize> {
        let pad = pad_for(payload_len);
        let need = pad + ICRC_LEN;
        if trailer.len() < need {
            return Err(Error::BufferTooSmall { need });
        }
        icrc.update_zeros(pad);
        trailer[..pad].fill(0);
        trailer[pad..need].copy_from_slice(&icrc.finish().to_le_bytes());
        Ok(need)
    }

    /// The trailer (zero pad bytes, then the ICRC least-significant byte first) of a frame
    /// built in one buffer: `frame` holds the headers and `payload_len` bytes of payload, and
    /// room for the pad and ICRC after them, which are written in one pass over the frame
    /// ([`icrc::compute_in_place`]). Returns the trailer's length.
    pub fn emit_trailer_in_place(&self, frame: &mut [u8], payload_len: usize) -> Result<usize> {
        let pad = pad_for(payload_len);
        let end = self.header_len + payload_len + pad;
        if frame.len() < end + ICRC_LEN || end < self.l3 {
            return Err(Error::BufferTooSmall {
                need: end + ICRC_LEN,
            });
        }
        frame[self.header_len + payload_len..end].fill(0);
        let crc = icrc::compute_in_place(&mut frame[self.l3..end], self.ipv6, self.ip_header_len);
        frame[end..end + ICRC_LEN].copy_from_slice(&crc.to_le_bytes());
        Ok(pad + ICRC_LEN)
    }
}

/// Longest Ethernet + IP + UDP header a template holds (802.1Q tag, IPv6).
pub const MAX_TEMPLATE_LEN: usize =
    ethernet::TAGGED_HEADER_LEN + ipv6::HEADER_LEN + udp::HEADER_LEN;

/// The Ethernet, IP and UDP headers of one flow's frames, written once: a frame is then one
/// copy of them plus the few fields that change per packet (the IP and UDP lengths, the
/// IPv4 identification and checksum), where [`FrameRepr::emit_headers`] writes and
/// checksums every field of every header. A hardware RNIC keeps such a header per QP in
/// its QP context; the dataplane keeps one per QP and builds it again when the QP's path,
/// next hop or VLAN tag changes. The BTH and extended headers are written per packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderTemplate {
    bytes: [u8; MAX_TEMPLATE_LEN],
    /// Offset of the IP header.
    l3: u8,
    /// Offset of the UDP header.
    l4: u8,
    ipv6: bool,
    /// IPv4: the one's-complement sum (folded) of the header's 16-bit words other than the
    /// total length, the identification and the checksum, to which those two are added per
    /// packet (RFC 1071's sum is associative: RFC 1624).
    sum: u16,
}

impl HeaderTemplate {
    /// The template of `repr`'s frames; its transport headers, IP length fields, IPv4
    /// identification and UDP length are not part of it.
    pub fn new(repr: &FrameRepr) -> Result<HeaderTemplate> {
        let mut bytes = [0u8; MAX_TEMPLATE_LEN];
        let eth = EthernetRepr {
            ethertype: repr.ip.ethertype(),
            ..repr.eth
        };
        eth.emit(&mut bytes)?;
        let l3 = eth.buffer_len();
        let mut sum = 0;
        match repr.ip {
            IpRepr::V4(r) => {
                let r = Ipv4Repr {
                    ident: 0,
                    payload_len: 0,
                    ..r
                };
                r.emit(&mut bytes[l3..])?;
                let h = &mut bytes[l3..l3 + ipv4::HEADER_LEN];
                // The checksum with the length at its least (20) and no identification:
                // turned back into the sum of the other words.
                let c = get_u16(h, ipv4::field::CHECKSUM.start);
                h[ipv4::field::LENGTH].fill(0);
                h[ipv4::field::CHECKSUM].fill(0);
                sum = ones_add(!c, !(ipv4::HEADER_LEN as u16));
            }
            IpRepr::V6(r) => Ipv6Repr {
                payload_len: 0,
                ..r
            }
            .emit(&mut bytes[l3..])?,
        }
        let l4 = l3 + repr.ip.header_len();
        UdpRepr {
            src_port: repr.udp_src_port,
            dst_port: ROCEV2_PORT,
            payload_len: 0,
            checksum: repr.udp_checksum,
        }
        .emit(&mut bytes[l4..])?;
        Ok(HeaderTemplate {
            bytes,
            l3: l3 as u8,
            l4: l4 as u8,
            ipv6: repr.ip.is_ipv6(),
            sum,
        })
    }

    /// Bytes of the Ethernet, IP and UDP headers: where the BTH starts.
    pub fn udp_end(&self) -> usize {
        self.l4 as usize + udp::HEADER_LEN
    }

    /// Bytes of the whole frame for `transport` and a payload of `payload_len` bytes.
    pub fn frame_len(&self, transport: &TransportRepr, payload_len: usize) -> Result<usize> {
        Ok(
            self.udp_end()
                + transport.buffer_len()?
                + payload_len
                + pad_for(payload_len)
                + ICRC_LEN,
        )
    }

    /// Writes every header of a frame into `hdr`, as [`FrameRepr::emit_headers`] does for
    /// the repr this template was made from with `transport` and IPv4 identification
    /// `ident`: byte for byte the same frame. Returns where its parts lie.
    pub fn emit_headers(
        &self,
        transport: &TransportRepr,
        ident: u16,
        payload_len: usize,
        hdr: &mut [u8],
    ) -> Result<FrameLayout> {
        let l4 = self.l4 as usize;
        let udp_end = l4 + udp::HEADER_LEN;
        let tlen = transport.buffer_len()?;
        let hlen = udp_end + tlen;
        if hdr.len() < hlen {
            return Err(Error::BufferTooSmall { need: hlen });
        }
        let pad = pad_for(payload_len);
        let udp_len = udp::HEADER_LEN + tlen + payload_len + pad + ICRC_LEN;
        let l3 = self.l3 as usize;
        // The IP length bounds the UDP length: checked first, as the IP header is written
        // first by `FrameRepr::emit_headers`.
        let ip_len = if self.ipv6 {
            udp_len
        } else {
            ipv4::HEADER_LEN + udp_len
        };
        let ip_len = u16::try_from(ip_len).map_err(|_| Error::PayloadTooLong)?;
        hdr[..udp_end].copy_from_slice(&self.bytes[..udp_end]);
        if self.ipv6 {
            put_u16(hdr, l3 + ipv6::field::LENGTH.start, ip_len);
        } else {
            put_u16(hdr, l3 + ipv4::field::LENGTH.start, ip_len);
            put_u16(hdr, l3 + ipv4::field::IDENT.start, ident);
            let sum = ones_add(ones_add(self.sum, ip_len), ident);
            put_u16(hdr, l3 + ipv4::field::CHECKSUM.start, !sum);
        }
        put_u16(hdr, l4 + udp::field::LENGTH.start, udp_len as u16);
        transport.emit_padded(&mut hdr[udp_end..], pad as u8)?;
        Ok(FrameLayout {
            l3,
            ip_header_len: l4 - l3,
            ipv6: self.ipv6,
            header_len: hlen,
        })
    }
}

/// One's-complement sum of two 16-bit words (RFC 1071).
fn ones_add(a: u16, b: u16) -> u16 {
    let (s, carry) = a.overflowing_add(b);
    s + carry as u16
}

/// A parsed frame: its headers and where its payload lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParsedFrame {
    /// The headers.
    pub repr: FrameRepr,
    /// Offset of the payload from the start of the frame.
    pub payload_offset: usize,
    /// Payload length (pad excluded).
    pub payload_len: usize,
    /// Offset of the IP header (Ethernet header length).
    pub l3_offset: usize,
    /// Length of the frame up to and including the ICRC (Ethernet padding excluded).
    pub frame_len: usize,
    /// The ICRC the frame carries (wire bytes read little-endian).
    pub icrc_received: u32,
    /// The ICRC computed over the frame.
    pub icrc_computed: u32,
}

impl ParsedFrame {
    /// A frame with every field zero or empty, to be filled by [`parse_in_place_into`].
    pub fn blank() -> ParsedFrame {
        ParsedFrame {
            repr: FrameRepr {
                eth: EthernetRepr {
                    dst: [0; 6],
                    src: [0; 6],
                    vlan: None,
                    ethertype: 0,
                },
                ip: IpRepr::V4(Ipv4Repr {
                    src: [0; 4],
                    dst: [0; 4],
                    dscp: 0,
                    ecn: ipv4::Ecn::NotEct,
                    ident: 0,
                    dont_frag: false,
                    ttl: 0,
                    protocol: 0,
                    payload_len: 0,
                }),
                udp_src_port: 0,
                udp_checksum: 0,
                transport: TransportRepr::new(BthRepr::new(Opcode(0), Qpn::new(0), Psn::new(0))),
            },
            payload_offset: 0,
            payload_len: 0,
            l3_offset: 0,
            frame_len: 0,
            icrc_received: 0,
            icrc_computed: 0,
        }
    }

    /// Whether the ICRC verifies.
    pub fn icrc_ok(&self) -> bool {
        self.icrc_received == self.icrc_computed
    }

    /// The payload of a contiguous frame.
    pub fn payload<'a>(&self, frame: &'a [u8]) -> &'a [u8] {
        &frame[self.payload_offset..self.payload_offset + self.payload_len]
    }

    /// The opcode's table entry (always known after a successful parse).
    pub fn info(&self) -> &'static OpcodeInfo {
        self.repr
            .transport
            .bth
            .opcode
            .info()
            .expect("parse only accepts known opcodes")
    }
}

/// Parses and verifies a frame held in one slice.
pub fn parse(frame: &[u8]) -> Result<ParsedFrame> {
    parse_segments(&[frame])
}

/// As [`parse`], for a frame the caller owns: the ICRC is computed in one pass over it, its
/// variant fields masked in place and restored ([`icrc::compute_in_place`]); the bytes are
/// as they were when it returns.
pub fn parse_in_place(frame: &mut [u8]) -> Result<ParsedFrame> {
    let mut p = ParsedFrame::blank();
    parse_in_place_into(frame, &mut p)?;
    Ok(p)
}

/// As [`parse_in_place`], into `out` (written in full on success; on an error it holds
/// nothing usable): a receive path that keeps one `ParsedFrame` fills it in place instead of
/// moving its some 290 bytes per packet.
pub fn parse_in_place_into(frame: &mut [u8], out: &mut ParsedFrame) -> Result<()> {
    let (ipv6, ip_hl) = inspect_headers(&[&*frame], out)?;
    let icrc_off = out.frame_len - ICRC_LEN;
    out.icrc_computed = icrc::compute_in_place(&mut frame[out.l3_offset..icrc_off], ipv6, ip_hl);
    if !out.icrc_ok() {
        return Err(Error::BadIcrc {
            received: out.icrc_received,
            computed: out.icrc_computed,
        });
    }
    Ok(())
}

/// Parses and verifies a frame held in several segments (e.g. an mbuf chain).
pub fn parse_segments(segments: &[&[u8]]) -> Result<ParsedFrame> {
    let p = inspect_segments(segments)?;
    if !p.icrc_ok() {
        return Err(Error::BadIcrc {
            received: p.icrc_received,
            computed: p.icrc_computed,
        });
    }
    Ok(p)
}

/// Longest header stack: tagged Ethernet 18 + IPv4 with options 60 + UDP 8 + BTH 12 + the
/// largest extended headers (FETH + RETH = 20, or AtomicETH 28).
const MAX_HEADERS: usize = 18 + 60 + 8 + 12 + 28;

/// Parses a frame and computes its ICRC without failing on a mismatch (for tools that show
/// `icrc: bad`). Every other check is applied.
pub fn inspect_segments(segments: &[&[u8]]) -> Result<ParsedFrame> {
    let mut p = ParsedFrame::blank();
    let (ipv6, ip_hl) = inspect_headers(segments, &mut p)?;
    p.icrc_computed = icrc::compute_segments(
        SegmentRange::new(segments, p.l3_offset, p.frame_len - ICRC_LEN),
        ipv6,
        ip_hl,
    );
    Ok(p)
}

/// Where a RoCEv2 frame's IP and UDP headers lie and what the UDP header says, as
/// [`inspect_headers`] uses them (the Ethernet and IP headers go straight into the frame's
/// `FrameRepr`: moving them through a return value cost some 80 instructions a packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Lower {
    /// Where the IP header starts (the Ethernet header's length).
    l3: usize,
    /// The IP header's length.
    ip_hl: usize,
    udp: UdpRepr,
}

/// [`lower_general`] for the frame nearly every packet is: untagged Ethernet, IPv4 without
/// options, UDP to port 4791, read at fixed offsets. `None` for any other frame and for any
/// that fails one of the general parser's checks (the same checks, in one pass): the general
/// parser then takes it and gives the error, so both accept the same frames with the same
/// result (tested against each other on mutated frames). It saves the general way's layered
/// views and per-layer length checks on every received packet.
#[inline]
fn lower_fast(head: &[u8], total: usize, repr: &mut FrameRepr) -> Option<Lower> {
    const L3: usize = ethernet::HEADER_LEN;
    const L4: usize = L3 + ipv4::HEADER_LEN;
    let h: &[u8; L4 + udp::HEADER_LEN] = head.get(..L4 + udp::HEADER_LEN)?.try_into().ok()?;
    let be16 = |at: usize| get_u16(h, at);
    // IPv4 (version 4, a 20-byte header) straight after an untagged Ethernet header.
    if be16(12) != ethertype::IPV4 || h[L3] != 0x45 {
        return None;
    }
    // Ipv4Repr::parse_header's checks: the total length within the frame, the header
    // checksum, not a fragment (MF or an offset); then UDP.
    let ip_total = be16(L3 + 2) as usize;
    if ip_total < ipv4::HEADER_LEN
        || ip_total > total - L3
        || ipv4::checksum(&h[L3..L4]) != 0
        || be16(L3 + 6) & 0x3fff != 0
        || h[L3 + 9] != ipv4::PROTO_UDP
    {
        return None;
    }
    // UdpRepr::parse's: to RoCEv2's port, its length exactly the IP payload's.
    let udp_len = be16(L4 + 4) as usize;
    if be16(L4 + 2) != ROCEV2_PORT
        || udp_len < udp::HEADER_LEN
        || udp_len != ip_total - ipv4::HEADER_LEN
    {
        return None;
    }
    let tos = h[L3 + 1];
    fn bytes<const N: usize>(h: &[u8], at: usize) -> [u8; N] {
        *h[at..].first_chunk().expect("within the header")
    }
    repr.eth = EthernetRepr {
        dst: bytes(h, 0),
        src: bytes(h, 6),
        vlan: None,
        ethertype: ethertype::IPV4,
    };
    repr.ip = IpRepr::V4(Ipv4Repr {
        src: bytes(h, L3 + 12),
        dst: bytes(h, L3 + 16),
        dscp: tos >> 2,
        ecn: ipv4::Ecn::from_bits(tos),
        ident: be16(L3 + 4),
        dont_frag: be16(L3 + 6) & 0x4000 != 0,
        ttl: h[L3 + 8],
        protocol: ipv4::PROTO_UDP,
        payload_len: ip_total - ipv4::HEADER_LEN,
    });
    Some(Lower {
        l3: L3,
        ip_hl: ipv4::HEADER_LEN,
        udp: UdpRepr {
            src_port: be16(L4),
            dst_port: ROCEV2_PORT,
            payload_len: udp_len - udp::HEADER_LEN,
            checksum: be16(L4 + 6),
        },
    })
}

/// The Ethernet, IP (v4 or v6) and UDP headers of a frame whose first bytes are `head` and
/// whose length is `total`, each checked by its layer's parser.
fn lower_general(head: &[u8], total: usize, repr: &mut FrameRepr) -> Result<Lower> {
    let eth_frame = ethernet::Frame::new_checked(head)?;
    let eth = EthernetRepr::parse(&eth_frame)?;
    let l3 = eth_frame.header_len();
    if eth.ethertype != ethertype::IPV4 && eth.ethertype != ethertype::IPV6 {
        return Err(Error::NotIp(eth.ethertype));
    }
    let after_eth = &head[l3..];
    let l3_avail = total - l3;
    // IP: validated against the whole frame length (the payload may lie in later segments).
    let (ip, ip_hl) = if eth.ethertype == ethertype::IPV4 {
        let r = Ipv4Repr::parse_header(&ipv4::Packet::new_unchecked(after_eth), l3_avail)?;
        if r.protocol != ipv4::PROTO_UDP {
            return Err(Error::NotUdp(r.protocol));
        }
        (
            IpRepr::V4(r),
            ipv4::Packet::new_unchecked(after_eth).header_len(),
        )
    } else {
        let r = Ipv6Repr::parse_header(&ipv6::Packet::new_unchecked(after_eth), l3_avail)?;
        if r.next_header != ipv4::PROTO_UDP {
            return Err(Error::NotUdp(r.next_header));
        }
        (IpRepr::V6(r), ipv6::HEADER_LEN)
    };
    let ip_payload = ip.payload_len();
    let l4 = l3 + ip_hl;
    let udp_view = udp::Packet::new_checked(head.get(l4..).unwrap_or(&[]))?;
    if udp_view.dst_port() != ROCEV2_PORT {
        return Err(Error::NotRoceV2(udp_view.dst_port()));
    }
    let udp = UdpRepr::parse(&udp_view, ip_payload)?;
    repr.eth = eth;
    repr.ip = ip;
    Ok(Lower { l3, ip_hl, udp })
}

/// Every check of [`inspect_segments`] but the ICRC's computation (`icrc_computed` is 0),
/// into `out`; returns whether the frame is IPv6 and its IP header's length, which the ICRC
/// needs.
fn inspect_headers(segments: &[&[u8]], out: &mut ParsedFrame) -> Result<(bool, usize)> {
    let total: usize = segments.iter().map(|s| s.len()).sum();
    // Headers may straddle segments: gather the first bytes into a stack buffer, unless the
    // first segment holds them all (the usual case: parsed where they lie, and the buffer is
    // never zeroed).
    let mut gathered: [u8; MAX_HEADERS];
    let want = total.min(MAX_HEADERS);
    let head: &[u8] = match segments.first() {
        Some(first) if first.len() >= want => &first[..want],
        _ => {
            gathered = [0u8; MAX_HEADERS];
            let n = copy_range(segments, 0, want, &mut gathered);
            &gathered[..n]
        }
    };

    let Lower { l3, ip_hl, udp } = match lower_fast(head, total, &mut out.repr) {
        Some(lower) => lower,
        None => lower_general(head, total, &mut out.repr)?,
    };
    let l4 = l3 + ip_hl;
    let bth_off = l4 + udp::HEADER_LEN;
    let tlen = out
        .repr
        .transport
        .parse_into(head.get(bth_off..).unwrap_or(&[]))?;
    // The BTH through the ICRC must fit in the UDP payload.
    if udp.payload_len < tlen + ICRC_LEN {
        return Err(Error::Truncated(Layer::ExtHeaders));
    }
    let after_headers = udp.payload_len - tlen - ICRC_LEN;
    let pad_count = out.repr.transport.bth.pad_count;
    let pad = pad_count as usize;
    if pad > after_headers || udp.payload_len % 4 != 0 {
        return Err(Error::BadPadCount(pad_count));
    }
    let icrc_off = bth_off + udp.payload_len - ICRC_LEN;
    // The ICRC where it lies when the first segment holds it (the usual case).
    let icrc_received = match segments.first().and_then(|f| f.get(icrc_off..icrc_off + 4)) {
        Some(b) => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        None => {
            let mut icrc_bytes = [0u8; 4];
            copy_range(segments, icrc_off, icrc_off + ICRC_LEN, &mut icrc_bytes);
            u32::from_le_bytes(icrc_bytes)
        }
    };
    let ipv6 = out.repr.ip.is_ipv6();
    out.repr.udp_src_port = udp.src_port;
    out.repr.udp_checksum = udp.checksum;
    out.payload_offset = bth_off + tlen;
    out.payload_len = after_headers - pad;
    out.l3_offset = l3;
    out.frame_len = icrc_off + ICRC_LEN;
    out.icrc_received = icrc_received;
    out.icrc_computed = 0;
    Ok((ipv6, ip_hl))
}

/// Contiguous form of [`inspect_segments`].
pub fn inspect(frame: &[u8]) -> Result<ParsedFrame> {
    inspect_segments(&[frame])
}

/// Copies bytes `start..end` of the concatenated segments into `out`; returns how many.
pub(crate) fn copy_range(segments: &[&[u8]], start: usize, end: usize, out: &mut [u8]) -> usize {
    let mut n = 0;
    for s in SegmentRange::new(segments, start, end) {
        let take = s.len().min(out.len() - n);
        out[n..n + take].copy_from_slice(&s[..take]);
        n += take;
    }
    n
}

/// Iterator over the parts of `segments` that fall in `start..end` of their concatenation.
pub struct SegmentRange<'a, 'b> {
    segments: &'b [&'a [u8]],
    idx: usize,
    pos: usize,
    start: usize,
    end: usize,
}

impl<'a, 'b> SegmentRange<'a, 'b> {
    /// Bytes `start..end` of the concatenation of `segments`.
    pub fn new(segments: &'b [&'a [u8]], start: usize, end: usize) -> Self {
        SegmentRange {
            segments,
            idx: 0,
            pos: 0,
            start,
            end,
        }
    }
}

impl<'a> Iterator for SegmentRange<'a, '_> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        while self.idx < self.segments.len() {
            let s = self.segments[self.idx];
            let (s_start, s_end) = (self.pos, self.pos + s.len());
            self.idx += 1;
            self.pos = s_end;
            let a = self.start.max(s_start);
            let b = self.end.min(s_end);
            if a < b {
                return Some(&s[a - s_start..b - s_start]);
            }
            if s_start >= self.end {
                return None;
            }
        }
        None
    }
}

/// Classification of any Ethernet frame (for tools and the dataplane's first look).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// RoCEv2 (UDP 4791 over IPv4/IPv6), other than CNP.
    Roce,
    /// RoCEv2 congestion notification.
    Cnp,
    /// 802.1Qbb priority flow control.
    Pfc,
    /// 802.3x link-level PAUSE.
    Pause,
    /// ARP.
    Arp,
    /// Anything else.
    Other,
}

impl FrameKind {
    /// The name rnic-pcap prints.
    pub const fn name(self) -> &'static str {
        match self {
            FrameKind::Roce => "roce",
            FrameKind::Cnp => "cnp",
            FrameKind::Pfc => "pfc",
            FrameKind::Pause => "pause",
            FrameKind::Arp => "arp",
            FrameKind::Other => "other",
        }
    }
}

/// Quick classification from the first bytes of a frame (no validation beyond what the
/// decision needs): MAC control by opcode, ARP by EtherType, RoCE by UDP destination port and
/// opcode 0x81 for CNP.
pub fn classify(frame: &[u8]) -> FrameKind {
    let Ok(eth) = ethernet::Frame::new_checked(frame) else {
        return FrameKind::Other;
    };
    let l3 = eth.header_len();
    let rest = &frame[l3..];
    match eth.ethertype() {
        ethertype::MAC_CONTROL => match rest.get(..2) {
            Some([0x01, 0x01]) => FrameKind::Pfc,
            Some([0x00, 0x01]) => FrameKind::Pause,
            _ => FrameKind::Other,
        },
        ethertype::ARP => FrameKind::Arp,
        _ => match bth_offset(frame).map(|o| frame.get(o)) {
            Some(Some(&op)) if Opcode(op) == Opcode::CNP => FrameKind::Cnp,
            Some(_) => FrameKind::Roce,
            None => FrameKind::Other,
        },
    }
}

/// The destination QP of a RoCEv2 frame, read from its BTH without validating the rest
/// (`None` if the first bytes are not a RoCEv2 frame's): where a receiver steers it.
pub fn dest_qpn(frame: &[u8]) -> Option<Qpn> {
    let o = bth_offset(frame)?;
    let b = frame.get(o + 5..o + 8)?;
    Some(Qpn::new(u32::from_be_bytes([0, b[0], b[1], b[2]])))
}

/// The MAD a RoCEv2 frame to QP1 carries (what follows its BTH and DETH, pad and ICRC
/// included), without validating anything: where a receiver steers a connection manager's
/// message before the owner of the connection parses it.
pub fn gsi_mad(frame: &[u8]) -> Option<&[u8]> {
    frame.get(bth_offset(frame)? + bth::HEADER_LEN + deth::HEADER_LEN..)
}

/// Where the BTH starts in a RoCEv2 frame (IPv4 or IPv6, UDP to port 4791), found from the
/// first bytes without validating the rest.
fn bth_offset(frame: &[u8]) -> Option<usize> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    let l3 = eth.header_len();
    let rest = &frame[l3..];
    let (proto, hl) = match eth.ethertype() {
        ethertype::IPV4 => match rest.first() {
            Some(b) if rest.len() >= 20 => (rest[9], ((b & 0x0f) as usize) * 4),
            _ => return None,
        },
        ethertype::IPV6 if rest.len() >= 40 => (rest[6], 40),
        _ => return None,
    };
    if proto != ipv4::PROTO_UDP {
        return None;
    }
    match rest.get(hl + 2..hl + 4) {
        Some(p) if u16::from_be_bytes([p[0], p[1]]) == ROCEV2_PORT => {
            Some(l3 + hl + udp::HEADER_LEN)
        }
        _ => None,
    }
}

/// Sets CE in the ECN field of an ECN-capable IPv4 or IPv6 frame (one 802.1Q tag allowed),
/// as a congested switch marks it, updating the IPv4 header checksum (the ICRC masks the ECN
/// bits, so it stays valid). Returns whether the frame was marked: Not-ECT frames and
/// anything else are left alone.
pub fn mark_ce(frame: &mut [u8]) -> bool {
    let mut l3 = 14;
    let mut ethertype = match frame.get(12..14) {
        Some(t) => u16::from_be_bytes([t[0], t[1]]),
        None => return false,
    };
    if ethertype == 0x8100 {
        let Some(t) = frame.get(16..18) else {
            return false;
        };
        ethertype = u16::from_be_bytes([t[0], t[1]]);
        l3 = 18;
    }
    match ethertype {
        0x0800 if frame.len() >= l3 + 20 => {
            if frame[l3 + 1] & 3 == 0 {
                return false;
            }
            frame[l3 + 1] |= 3;
            frame[l3 + 10] = 0;
            frame[l3 + 11] = 0;
            let ihl = ((frame[l3] & 0xf) as usize * 4).clamp(20, frame.len() - l3);
            let sum = frame[l3..l3 + ihl]
                .chunks(2)
                .map(|c| u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]) as u32)
                .sum::<u32>();
            let folded = (sum & 0xffff) + (sum >> 16);
            let folded = (folded & 0xffff) + (folded >> 16);
            frame[l3 + 10..l3 + 12].copy_from_slice(&(!(folded as u16)).to_be_bytes());
            true
        }
        // The traffic class straddles bytes 0 and 1; its ECN bits are bits 5..4 of byte 1.
        0x86dd if frame.len() >= l3 + 40 => {
            if frame[l3 + 1] & 0x30 == 0 {
                return false;
            }
            frame[l3 + 1] |= 0x30;
            true
        }
        _ => false,
    }
}

/// A sample frame that tests and benches build on: an RC RDMA WRITE ONLY (AckReq, QP 0x12,
/// PSN 0xfffffe, a RETH for `payload`) from 10.99.0.3 to 10.99.0.2, or from fe80::1 to fe80::2
/// when `ipv6`, 802.1Q-tagged (PCP 3, VID 99) when `vlan`. Returns its `Repr` and its bytes.
#[doc(hidden)]
pub fn example_write(ipv6: bool, vlan: bool, payload: &[u8]) -> (FrameRepr, Vec<u8>) {
    let mut t = TransportRepr::new(BthRepr::new(
        Opcode(0x0a),
        Qpn::new(0x12),
        Psn::new(0xfffffe),
    ));
    t.bth.ack_req = true;
    t.ext.reth = Some(RethRepr {
        va: 0x1000,
        rkey: crate::types::Rkey(0x38b),
        len: payload.len() as u32,
    });
    let ip = if ipv6 {
        IpRepr::V6(Ipv6Repr {
            src: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            dst: [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
            dscp: 26,
            ecn: ipv4::Ecn::Ect0,
            flow_label: 0x12345,
            next_header: 17,
            hop_limit: 64,
            payload_len: 0,
        })
    } else {
        IpRepr::V4(Ipv4Repr {
            src: [10, 99, 0, 3],
            dst: [10, 99, 0, 2],
            dscp: 26,
            ecn: ipv4::Ecn::Ect0,
            ident: 7,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        })
    };
    let repr = FrameRepr {
        eth: EthernetRepr {
            dst: [2, 0, 0, 0x99, 0, 2],
            src: [2, 0, 0, 0x99, 0, 3],
            vlan: vlan.then_some(ethernet::VlanTag {
                pcp: 3,
                dei: false,
                vid: 99,
            }),
            ethertype: 0,
        },
        ip,
        udp_src_port: 0xc123,
        udp_checksum: 0,
        transport: t,
    };
    let mut buf = vec![0u8; repr.frame_len(payload.len()).unwrap()];
    let n = repr.emit(&mut buf, payload).unwrap();
    assert_eq!(n, buf.len());
    (repr, buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Msn, Psn, Qpn};
    use crate::wire::ipv4::Ecn;

    use super::example_write as write_frame;
    use crate::wire::icrc::tests::{hex, CX4_CNP};

    /// The fast path of the receive parser ([`lower_fast`]) against the general one, on
    /// frames of every kind and on changes of each of their first 42 bytes (with the
    /// IPv4 header checksum made good again, so that the checks behind it are reached too)
    /// and every cut: where the fast path answers, its answer is the general parser's; where
    /// it does not, the general parser decides (the error comes from there).
    #[test]
    fn the_fast_header_path_agrees_with_the_general_one() {
        let mut frames = vec![hex(CX4_CNP)];
        for (v6, vlan) in [(false, false), (true, false), (false, true)] {
            for len in [0usize, 1, 64, 4096] {
                frames.push(write_frame(v6, vlan, &vec![7u8; len]).1);
            }
        }
        let mut fast = 0usize;
        let mut check = |f: &[u8]| {
            let head = &f[..f.len().min(MAX_HEADERS)];
            let (mut a, mut b) = (ParsedFrame::blank().repr, ParsedFrame::blank().repr);
            if let Some(lower) = lower_fast(head, f.len(), &mut a) {
                assert_eq!(lower_general(head, f.len(), &mut b), Ok(lower), "{f:02x?}");
                assert_eq!((a.eth, a.ip), (b.eth, b.ip), "{f:02x?}");
                fast += 1;
            }
        };
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for f in &frames {
            check(f);
            for cut in [0, 1, 13, 14, 33, 34, 41, 42, 60] {
                check(&f[..cut.min(f.len())]);
            }
            for at in 0..42.min(f.len()) {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let flips = [1, 4, 0x10, 0x20, 0x40, 0x80].map(|b| f[at] ^ b);
                for v in [0, 0xff, seed as u8].into_iter().chain(flips) {
                    let mut g = f.clone();
                    g[at] = v;
                    check(&g);
                    if (14..34).contains(&at) && g[12..14] == [0x08, 0x00] && g[14] & 0xf == 5 {
                        ipv4::Packet::new_unchecked(&mut g[14..34]).fill_checksum();
                        check(&g);
                    }
                }
            }
        }
        // The usual frames, and the changes that keep them valid (addresses, ports, TOS,
        // TTL, identification...), did take the fast path.
        assert!(fast > 400, "{fast}");
    }

    #[test]
    fn marking_ce_keeps_the_frame_valid() {
        // The ConnectX CNP is ECT(0): marked, its IPv4 checksum and ICRC still verify.
        let mut f = hex(CX4_CNP);
        assert!(mark_ce(&mut f));
        let p = parse(&f).expect("checksum and ICRC still good");
        assert_eq!(p.repr.ip.ecn(), Ecn::Ce);
        assert_eq!(p.repr.ip.dscp(), 48);
        // Not-ECT frames are left alone (a switch drops rather than marks them).
        let mut g = hex(CX4_CNP);
        g[15] &= !3;
        g[24] = 0;
        g[25] = 0;
        let before = g.clone();
        assert!(!mark_ce(&mut g));
        assert_eq!(g, before);
        assert!(!mark_ce(&mut [0u8; 10]), "too short");
    }

    #[test]
    fn hardware_cnp_parses_and_re_emits() {
        let f = hex(CX4_CNP);
        let p = parse(&f).unwrap();
        assert_eq!(classify(&f), FrameKind::Cnp);
        let t = &p.repr.transport;
        assert_eq!(t.bth.opcode, Opcode::CNP);
        assert!(t.bth.becn);
        assert_eq!(t.bth.dest_qp, Qpn::new(0x118));
        assert_eq!(p.repr.ip.dscp(), 48);
        assert_eq!(p.repr.ip.ecn(), Ecn::Ect0);
        assert_eq!(p.payload_len, 0);
        let mut out = vec![0u8; f.len()];
        assert_eq!(p.repr.emit(&mut out, &[]).unwrap(), f.len());
        assert_eq!(out, f);
    }

    #[test]
    fn build_parse_round_trip_all_l3_variants() {
        for ipv6 in [false, true] {
            for vlan in [false, true] {
                for len in [0usize, 1, 2, 3, 4, 1024, 4095] {
                    let payload: Vec<u8> = (0..len).map(|i| i as u8).collect();
                    let (repr, buf) = write_frame(ipv6, vlan, &payload);
                    let p = parse(&buf).unwrap();
                    assert_eq!(p.payload(&buf), &payload[..]);
                    // In place: the same, and the frame as it was.
                    let mut own = buf.clone();
                    assert_eq!(parse_in_place(&mut own).unwrap(), p);
                    assert_eq!(own, buf);
                    // A corrupted byte is caught in place too, and left as it came.
                    let last = own.len() - 5;
                    own[last] ^= 1;
                    let bad = own.clone();
                    assert!(matches!(
                        parse_in_place(&mut own),
                        Err(Error::BadIcrc { .. })
                    ));
                    assert_eq!(own, bad);
                    let mut expect = repr;
                    expect.eth.ethertype = if ipv6 {
                        ethertype::IPV6
                    } else {
                        ethertype::IPV4
                    };
                    expect.transport.bth.pad_count = pad_for(len) as u8;
                    expect.ip.set_payload_len(p.repr.ip.payload_len());
                    assert_eq!(p.repr, expect);
                    // Any split into segments parses the same.
                    for cut in [1, 13, 17, 30, 50, 61, buf.len() - 2] {
                        if cut < buf.len() {
                            let (a, b) = buf.split_at(cut);
                            assert_eq!(parse_segments(&[a, b]).unwrap(), p, "cut {cut}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn icrc_covers_invariant_bytes_only() {
        let payload = [0x5a; 64];
        let (_, buf) = write_frame(false, false, &payload);
        let l3 = 14;
        // Every byte covered by the ICRC is caught, except the masked ones.
        let masked = [l3 + 1, l3 + 8, l3 + 10, l3 + 11, l3 + 26, l3 + 27, l3 + 32];
        for i in l3..buf.len() - 4 {
            let mut b = buf.clone();
            b[i] ^= 0x01;
            let r = parse(&b);
            if masked.contains(&i) {
                // TOS/TTL/checksum changes break the IPv4 checksum instead (checked below).
                if i == l3 + 26 || i == l3 + 27 || i == l3 + 32 {
                    assert!(r.is_ok(), "masked byte {i} must not matter: {r:?}");
                }
            } else {
                assert!(r.is_err(), "byte {i} not covered");
            }
        }
        // A router rewrites TTL and DSCP/ECN and fixes the IP checksum: still valid.
        let mut b = buf.clone();
        {
            let mut ip = ipv4::Packet::new_unchecked(&mut b[l3..]);
            ip.set_ttl(3);
            ip.set_dscp_ecn(10, Ecn::Ce);
            ip.fill_checksum();
        }
        let p = parse(&b).unwrap();
        assert_eq!(p.repr.ip.ecn(), Ecn::Ce);
        // ... but without fixing the checksum it is its own error.
        let mut b = buf.clone();
        b[l3 + 8] = 1;
        assert_eq!(parse(&b).unwrap_err(), Error::BadIpv4Checksum);
        // FECN/BECN set by a switch: still valid.
        let mut b = buf.clone();
        bth::Packet::new_unchecked(&mut b[l3 + 28..]).set_fecn(true);
        assert!(parse(&b).unwrap().repr.transport.bth.fecn);
        // IPv6: traffic class, flow label and hop limit are masked.
        let (_, buf6) = write_frame(true, false, &payload);
        let mut b = buf6.clone();
        ipv6::Packet::new_unchecked(&mut b[l3..]).set_dscp_ecn(0, Ecn::Ce);
        ipv6::Packet::new_unchecked(&mut b[l3..]).set_hop_limit(1);
        b[l3 + 3] ^= 0xff; // flow label
        assert!(parse(&b).is_ok());
        let mut b = buf6.clone();
        b[l3 + 8] ^= 1; // source address
        assert!(matches!(parse(&b), Err(Error::BadIcrc { .. })));
    }

    #[test]
    fn errors_name_the_first_failure() {
        let (_, buf) = write_frame(false, false, &[1, 2, 3, 4, 5]);
        let fix = |b: &mut Vec<u8>| ipv4::Packet::new_unchecked(&mut b[14..]).fill_checksum();
        let mut b = buf.clone();
        b[12] = 0x88;
        b[13] = 0x08;
        assert_eq!(parse(&b).unwrap_err(), Error::NotIp(0x8808));
        let mut b = buf.clone();
        b[14] = 0x65;
        assert_eq!(parse(&b).unwrap_err(), Error::BadIpVersion(6));
        let mut b = buf.clone();
        b[20] = 0x20;
        fix(&mut b);
        assert_eq!(parse(&b).unwrap_err(), Error::Ipv4Fragment);
        let mut b = buf.clone();
        b[23] = 6;
        fix(&mut b);
        assert_eq!(parse(&b).unwrap_err(), Error::NotUdp(6));
        let mut b = buf.clone();
        b[36] = 0x12;
        b[37] = 0xb8;
        assert_eq!(parse(&b).unwrap_err(), Error::NotRoceV2(4792));
        let mut b = buf.clone();
        b[39] += 4;
        assert!(matches!(parse(&b).unwrap_err(), Error::BadUdpLength(_)));
        let mut b = buf.clone();
        b[43] |= 1;
        assert_eq!(parse(&b).unwrap_err(), Error::BadTver(1));
        let mut b = buf.clone();
        b[42] = 0x15;
        assert_eq!(parse(&b).unwrap_err(), Error::UnknownOpcode(0x15));
        let mut b = buf.clone();
        b[43] = 0; // pad 3 -> 0: alignment still fine but ICRC now wrong
        assert!(matches!(parse(&b).unwrap_err(), Error::BadIcrc { .. }));
        let mut b = buf.clone();
        b[43] = 0x30;
        let (_, short) = write_frame(false, false, &[]);
        let mut s = short.clone();
        s[43] = 0x30; // pad 3 with no payload
        assert_eq!(parse(&s).unwrap_err(), Error::BadPadCount(3));
        let _ = b;
        assert_eq!(
            parse(&buf[..buf.len() - 1]).unwrap_err(),
            Error::BadIpLength(buf.len() as u16 - 14)
        );
        assert_eq!(
            parse(&buf[..10]).unwrap_err(),
            Error::Truncated(Layer::Ethernet)
        );
        // Trailing Ethernet padding is ignored.
        let mut padded = buf.clone();
        padded.extend_from_slice(&[0; 7]);
        assert_eq!(parse(&padded).unwrap().frame_len, buf.len());
    }

    #[test]
    fn emit_refuses_headers_that_do_not_match_the_opcode() {
        let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_ACK, Qpn::new(1), Psn::new(0)));
        let mut b = [0u8; 64];
        assert_eq!(t.emit(&mut b), Err(Error::HeadersMismatch(0x11)));
        t.ext.aeth = Some(AethRepr::ack(31, Msn::new(0)));
        assert_eq!(t.emit(&mut b), Ok(16));
        t.ext.reth = Some(RethRepr::default());
        assert_eq!(t.emit(&mut b), Err(Error::HeadersMismatch(0x11)));
        // As many headers as the opcode has, but another one.
        t.ext.aeth = None;
        assert_eq!(t.emit(&mut b), Err(Error::HeadersMismatch(0x11)));
        t.bth.opcode = Opcode(0x15);
        assert_eq!(t.emit(&mut b), Err(Error::UnknownOpcode(0x15)));
    }

    #[test]
    fn classify_kinds() {
        let (_, roce) = write_frame(false, true, &[0; 8]);
        assert_eq!(classify(&roce), FrameKind::Roce);
        let mut pfc = vec![0u8; 60];
        pfc[12] = 0x88;
        pfc[13] = 0x08;
        pfc[14] = 1;
        pfc[15] = 1;
        assert_eq!(classify(&pfc), FrameKind::Pfc);
        pfc[14] = 0;
        assert_eq!(classify(&pfc), FrameKind::Pause);
        assert_eq!(classify(&[0u8; 5]), FrameKind::Other);
    }
}
