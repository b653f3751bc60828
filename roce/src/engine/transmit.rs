//! What the engine asks to send: headers as `Repr`s, the path, and the payload as references
//! into registered memory (or inline bytes), so the dataplane can gather it into an mbuf or
//! attach it as an external buffer without an intermediate copy.

use crate::memory::MrRef;
use crate::types::{Gid, Qpn};
use crate::wire::bth::BthRepr;
use crate::wire::ethernet::{EthernetRepr, VlanTag};
use crate::wire::frame::{FrameRepr, IpRepr, TransportRepr};
use crate::wire::ipv4::{Ecn, Ipv4Repr, PROTO_UDP};
use crate::wire::ipv6::Ipv6Repr;
use crate::wire::opcode::{Opcode, Operation};

/// Bytes of headers a RoCEv2 packet adds to its payload on the wire (Ethernet and FCS 18,
/// IPv4 20, UDP 8, BTH 12, ICRC 4): what ETS charges a packet beyond its payload.
pub const WIRE_HEADERS: u32 = 18 + 20 + 8 + 12 + 4;

/// Most payload segments one packet can reference (= the device's max SGEs per WR).
pub const MAX_PAYLOAD_SEGS: usize = 32;
/// Most inline bytes a send WR may carry (reported as `max_inline_data`).
pub const MAX_INLINE: usize = 256;

/// `len` bytes at `offset` in the memory of one registration of an MR.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PayloadSeg {
    /// The registration (resolve with `Device::memory`, which refuses a later registration
    /// that reuses the key).
    pub mr: MrRef,
    /// Offset within the MR's backing memory.
    pub offset: usize,
    /// Bytes.
    pub len: u32,
}

/// The payload of one packet: memory segments or inline bytes.
#[derive(Clone)]
pub struct Payload {
    len: u32,
    nsegs: u8,
    segs: [PayloadSeg; MAX_PAYLOAD_SEGS],
    inline_len: u16,
    inline: [u8; MAX_INLINE],
}

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Payload")
            .field("len", &self.len)
            .field("segs", &self.segs())
            .field("inline", &self.inline())
            .finish()
    }
}

impl Default for Payload {
    fn default() -> Self {
        Payload {
            len: 0,
            nsegs: 0,
            segs: [PayloadSeg::default(); MAX_PAYLOAD_SEGS],
            inline_len: 0,
            inline: [0; MAX_INLINE],
        }
    }
}

impl Payload {
    /// Total bytes.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Memory segments (empty when the payload is inline).
    pub fn segs(&self) -> &[PayloadSeg] {
        &self.segs[..self.nsegs as usize]
    }

    /// Inline bytes (empty when the payload is in memory).
    pub fn inline(&self) -> &[u8] {
        &self.inline[..self.inline_len as usize]
    }

    pub(crate) fn clear(&mut self) {
        self.len = 0;
        self.nsegs = 0;
        self.inline_len = 0;
    }

    pub(crate) fn push_seg(&mut self, seg: PayloadSeg) {
        if seg.len == 0 {
            return;
        }
        // Merge with the previous segment when contiguous in the same MR.
        if let Some(last) = self.segs[..self.nsegs as usize].last_mut() {
            if last.mr == seg.mr && last.offset + last.len as usize == seg.offset {
                last.len += seg.len;
                self.len += seg.len;
                return;
            }
        }
        self.segs[self.nsegs as usize] = seg;
        self.nsegs += 1;
        self.len += seg.len;
    }

    pub(crate) fn set_inline(&mut self, bytes: &[u8]) {
        self.inline[..bytes.len()].copy_from_slice(bytes);
        self.inline_len = bytes.len() as u16;
        self.len = bytes.len() as u32;
        self.nsegs = 0;
    }
}

/// Where a packet goes, as the engine knows it; the dataplane maps it to Ethernet and IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Path {
    /// Our source GID.
    pub sgid: Gid,
    /// Destination GID.
    pub dgid: Gid,
    /// UDP source port (flow entropy; rxe's formula, see `udp_sport_*`).
    pub udp_sport: u16,
    /// DSCP (6 bits) and ECN (2 bits).
    pub traffic_class: u8,
    /// IPv6 flow label.
    pub flow_label: u32,
    /// TTL / hop limit.
    pub hop_limit: u8,
    /// Service level (802.1p priority when tagging).
    pub sl: u8,
    /// Destination MAC when known from the address handle.
    pub dmac: Option<[u8; 6]>,
}

impl Default for Path {
    fn default() -> Self {
        Path {
            sgid: Gid::default(),
            dgid: Gid::default(),
            udp_sport: 0xc000,
            traffic_class: 0,
            flow_label: 0,
            hop_limit: 64,
            sl: 0,
            dmac: None,
        }
    }
}

/// Which header field gives a packet its 802.1p priority, its PFC class (mlx5 `trust`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Trust {
    /// The priority is the path's SL (the VLAN PCP it is tagged with).
    #[default]
    Pcp,
    /// The priority is DSCP / 8 (the mapping mlx5 and Linux use by default).
    Dscp,
}

/// How the priority of a packet follows from its path, with the port's defaults for a path
/// that sets neither SL nor DSCP (`roce.pcp`, `roce.dscp`). The dataplane tags frames with
/// this priority and the engine holds a QP whose priority is paused (PFC).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PriorityMap {
    /// Which field counts.
    pub trust: Trust,
    /// Priority of a path with SL 0.
    pub default_pcp: u8,
    /// DSCP of a path whose traffic class has none.
    pub default_dscp: u8,
}

impl PriorityMap {
    /// The DSCP a packet with traffic class `tc` leaves with.
    #[inline]
    pub fn dscp(&self, tc: u8) -> u8 {
        if tc >> 2 != 0 {
            tc >> 2
        } else {
            self.default_dscp & 0x3f
        }
    }

    /// The priority (0..=7) of a packet with traffic class `tc` and SL `sl`.
    #[inline]
    pub fn priority(&self, tc: u8, sl: u8) -> u8 {
        match self.trust {
            Trust::Pcp if sl != 0 => sl & 7,
            Trust::Pcp => self.default_pcp & 7,
            Trust::Dscp => self.dscp(tc) >> 3,
        }
    }

    /// The priority of a received Ethernet frame as this port classifies it (mlx5 `trust`):
    /// the PCP of its VLAN tag, or DSCP / 8 of its IPv4/IPv6 header; a frame without the
    /// field (untagged, or not IP) gets the port's default priority, the one its own
    /// packets without SL carry. Short frames too.
    pub fn of_frame(&self, f: &[u8]) -> u8 {
        let tagged = f.len() >= 18 && f[12..14] == [0x81, 0x00];
        match self.trust {
            Trust::Pcp if tagged => f[14] >> 5,
            Trust::Pcp => self.default_pcp & 7,
            Trust::Dscp => {
                let l3 = if tagged { 18 } else { 14 };
                let tos = match f.get(l3 - 2..l3).map(|e| [e[0], e[1]]) {
                    Some([0x08, 0x00]) if f.len() > l3 + 1 => f[l3 + 1],
                    Some([0x86, 0xdd]) if f.len() > l3 + 1 => (f[l3] << 4) | (f[l3 + 1] >> 4),
                    _ => return self.default_pcp & 7,
                };
                tos >> 5
            }
        }
    }
}

/// One packet to send.
#[derive(Debug, Clone)]
pub struct Transmit {
    /// The local QP sending it.
    pub qpn: Qpn,
    /// Addressing.
    pub path: Path,
    /// BTH and extended headers (pad count is derived when the frame is built).
    pub transport: TransportRepr,
    /// Payload.
    pub payload: Payload,
}

impl Default for Transmit {
    fn default() -> Self {
        Transmit {
            qpn: Qpn::new(0),
            path: Path::default(),
            transport: TransportRepr::new(BthRepr::new(
                Opcode::RC_ACK,
                Qpn::new(0),
                crate::types::Psn::new(0),
            )),
            payload: Payload::default(),
        }
    }
}

impl Transmit {
    /// Whether this packet carries data a throttled QP paces (requests and READ responses;
    /// ACKs, NAKs, ATOMIC ACKs and CNPs pass).
    pub fn is_paced(&self) -> bool {
        self.transport
            .bth
            .opcode
            .info()
            .is_some_and(|i| i.is_request || i.op == Operation::ReadResponse)
    }

    /// Whether the packet may be marked ECN-capable: data, not ACKs, NAKs or CNPs (a CNP is
    /// never ECN-capable, and congestion on the reverse path is the other QP's to signal).
    pub fn ecn_capable(&self) -> bool {
        let op = self.transport.bth.opcode;
        op != Opcode::RC_ACK && op != Opcode::CNP
    }

    /// The frame headers for this packet, given the link-layer addresses and the IPv4
    /// identification. IPv4 is used when both GIDs are IPv4-mapped, IPv6 otherwise.
    pub fn frame_repr(
        &self,
        src_mac: [u8; 6],
        dst_mac: [u8; 6],
        vlan: Option<VlanTag>,
        ip_ident: u16,
    ) -> FrameRepr {
        let p = &self.path;
        let dscp = p.traffic_class >> 2;
        let ecn = Ecn::from_bits(p.traffic_class);
        let ip = match (p.sgid.to_ipv4(), p.dgid.to_ipv4()) {
            (Some(src), Some(dst)) => IpRepr::V4(Ipv4Repr {
                src,
                dst,
                dscp,
                ecn,
                ident: ip_ident,
                dont_frag: true,
                ttl: p.hop_limit,
                protocol: PROTO_UDP,
                payload_len: 0,
            }),
            _ => IpRepr::V6(Ipv6Repr {
                src: p.sgid.0,
                dst: p.dgid.0,
                dscp,
                ecn,
                flow_label: p.flow_label & 0xfffff,
                next_header: PROTO_UDP,
                hop_limit: p.hop_limit,
                payload_len: 0,
            }),
        };
        FrameRepr {
            eth: EthernetRepr {
                dst: dst_mac,
                src: src_mac,
                vlan,
                ethertype: 0,
            },
            ip,
            udp_src_port: p.udp_sport,
            udp_checksum: 0,
            transport: self.transport,
        }
    }
}

/// rxe's flow label for a connected QP pair with no configured label
/// (`rdma_calc_flow_label`, include/rdma/ib_verbs.h).
pub fn calc_flow_label(lqpn: u32, rqpn: u32) -> u32 {
    let mut fl = (lqpn as u64).wrapping_mul(rqpn as u64);
    fl ^= fl >> 20;
    fl ^= fl >> 40;
    (fl & 0xfffff) as u32
}

/// UDP source port of an RC/UC QP: the same in both directions (`rdma_get_udp_sport`).
pub fn udp_sport_connected(flow_label: u32, lqpn: u32, rqpn: u32) -> u16 {
    let fl = if flow_label == 0 {
        calc_flow_label(lqpn, rqpn)
    } else {
        flow_label
    };
    let low = (fl & 0x3fff) ^ ((fl & 0xfc000) >> 14);
    (low | 0xc000) as u16
}

/// UDP source port of a UD QP (and QP1): `0xC000 + hash_32(qpn, 14)`.
pub fn udp_sport_ud(qpn: u32) -> u16 {
    (0xc000 + (qpn.wrapping_mul(0x61c8_8647) >> 18)) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_ports_match_rxe_in_the_corpus() {
        // write_bw_4k: QPs 0x24 <-> 0x2b used port 50700 both ways.
        assert_eq!(udp_sport_connected(0, 0x24, 0x2b), 50700);
        assert_eq!(udp_sport_connected(0, 0x2b, 0x24), 50700);
        // ud_pingpong: QP 0x13 sent from 53368, QP 0x1a from 64407.
        assert_eq!(udp_sport_ud(0x13), 53368);
        assert_eq!(udp_sport_ud(0x1a), 64407);
    }

    #[test]
    fn received_frames_get_the_priority_the_trust_mode_reads() {
        let pcp = PriorityMap {
            trust: Trust::Pcp,
            default_pcp: 3,
            default_dscp: 0,
        };
        let dscp = PriorityMap {
            trust: Trust::Dscp,
            ..pcp
        };
        // Untagged IPv4 with DSCP 48 (priority 6).
        let mut v4 = vec![0u8; 60];
        v4[12..14].copy_from_slice(&[0x08, 0x00]);
        v4[15] = (48 << 2) | 2;
        assert_eq!(pcp.of_frame(&v4), 3, "untagged: the port's default");
        assert_eq!(dscp.of_frame(&v4), 6);
        // Tagged PCP 5 over IPv6 with DSCP 26 (priority 3).
        let mut t6 = vec![0u8; 80];
        t6[12..14].copy_from_slice(&[0x81, 0x00]);
        t6[14] = 5 << 5;
        t6[16..18].copy_from_slice(&[0x86, 0xdd]);
        t6[18] = 0x60 | (26 >> 2);
        t6[19] = (26 & 3) << 6;
        assert_eq!(pcp.of_frame(&t6), 5);
        assert_eq!(dscp.of_frame(&t6), 3);
        // ARP and a runt: the default.
        let mut arp = vec![0u8; 60];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(dscp.of_frame(&arp), 3);
        assert_eq!(dscp.of_frame(&[0u8; 10]), 3);
        assert_eq!(pcp.of_frame(&[0u8; 10]), 3);
    }

    #[test]
    fn payload_merges_contiguous_segments() {
        let mut p = Payload::default();
        // (lkey and registration, offset, length): the second continues the first, the third
        // starts another MR and the fourth is empty.
        for (key, offset, len) in [(1, 0, 10), (1, 10, 5), (2, 15, 5), (2, 15, 0)] {
            p.push_seg(PayloadSeg {
                mr: MrRef {
                    lkey: crate::types::Lkey(key),
                    reg: key as u64,
                },
                offset,
                len,
            });
        }
        assert_eq!(p.segs().len(), 2);
        assert_eq!(p.len(), 20);
        p.set_inline(&[1, 2, 3]);
        assert_eq!(p.inline(), &[1, 2, 3]);
        assert!(p.segs().is_empty());
    }
}
