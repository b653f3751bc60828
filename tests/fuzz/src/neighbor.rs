//! The neighbour table (`dataplane::neighbor::Neighbors`: ARP, IPv4 ICMP echo, IPv6 neighbour
//! discovery), which learns from whatever the link carries: raw frames, and ARP requests and
//! replies, neighbour solicitations and advertisements and echo requests built from the
//! input, from any MAC and address (poisoning attempts among them: our own addresses,
//! multicast and zero MACs, floods of new senders), while the RNIC resolves next hops and
//! time moves.
//!
//! Invariants checked: nothing panics; the table stays within its capacity; it never maps
//! one of the RNIC's own addresses, and never to a multicast or zero MAC; every frame it
//! sends comes from the RNIC's MAC; one step sends a bounded number of frames (no
//! amplification: at most one answer for each frame that came in, beside the requests of
//! the step's resolutions and timers).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use dataplane::config::RawConfig;
use dataplane::neighbor::{NeighborState, Neighbors};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, EthernetFrame, EthernetProtocol,
    EthernetRepr, Icmpv4Packet, Icmpv4Repr, Icmpv6Packet, Icmpv6Repr, IpProtocol, Ipv4Packet,
    Ipv4Repr, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags, NdiscRepr, RawHardwareAddress,
};

use crate::{Input, MS};

const MAC: [u8; 6] = [0x02, 0, 0, 0x99, 0, 0x05];
const CAPACITY: usize = 16;
const MAX_STEPS: usize = 128;

fn config() -> dataplane::config::RnicConfig {
    let mut r = RawConfig::default();
    for (k, v) in [
        ("port.device", "net_ring0"),
        ("address.mac", "02:00:00:99:00:05"),
        ("address.ipv4", "10.99.0.5/24"),
        ("address.ipv6", "fd99::5/64"),
        ("address.gateway", "10.99.0.1"),
        ("address.gateway6", "fd99::1"),
    ] {
        r.set(k, v).expect("key");
    }
    r.validate().expect("valid")
}

/// An IPv4 address from the input: mostly on the link, sometimes ours, the gateway or any.
fn ipv4(inp: &mut Input) -> Ipv4Addr {
    match inp.u8() % 8 {
        0 => Ipv4Addr::new(10, 99, 0, 5),
        1 => Ipv4Addr::new(10, 99, 0, 1),
        2 => Ipv4Addr::from(inp.u32()),
        _ => Ipv4Addr::new(10, 99, 0, inp.u8() % 24),
    }
}

/// An IPv6 address from the input, the same way.
fn ipv6(inp: &mut Input) -> Ipv6Addr {
    match inp.u8() % 8 {
        0 => "fd99::5".parse().unwrap(),
        1 => "fd99::1".parse().unwrap(),
        2 => Ipv6Addr::from((inp.u64() as u128) << 64 | inp.u64() as u128),
        _ => Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, (inp.u8() % 24) as u16),
    }
}

/// A MAC from the input: mostly unicast, sometimes multicast, zero or ours.
fn mac(inp: &mut Input) -> [u8; 6] {
    match inp.u8() % 8 {
        0 => [0; 6],
        1 => [0x33, 0x33, 0, 0, 0, inp.u8()],
        2 => MAC,
        _ => [0x02, 0, 0, 0x77, 0, inp.u8() % 24],
    }
}

/// An Ethernet header from `src` to `dst` followed by `len` zero bytes.
pub(crate) fn ethernet(
    src: [u8; 6],
    dst: [u8; 6],
    ethertype: EthernetProtocol,
    len: usize,
) -> Vec<u8> {
    let repr = EthernetRepr {
        src_addr: EthernetAddress(src),
        dst_addr: EthernetAddress(dst),
        ethertype,
    };
    let mut buf = vec![0u8; repr.buffer_len() + len];
    repr.emit(&mut EthernetFrame::new_unchecked(&mut buf[..]));
    buf
}

fn arp(inp: &mut Input) -> Vec<u8> {
    let src = mac(inp);
    let op = if inp.u8() & 1 == 0 {
        ArpOperation::Request
    } else {
        ArpOperation::Reply
    };
    let repr = ArpRepr::EthernetIpv4 {
        operation: op,
        source_hardware_addr: EthernetAddress(mac(inp)),
        source_protocol_addr: ipv4(inp),
        target_hardware_addr: EthernetAddress(mac(inp)),
        target_protocol_addr: ipv4(inp),
    };
    let dst = if inp.u8() & 1 == 0 { [0xff; 6] } else { MAC };
    let mut f = ethernet(src, dst, EthernetProtocol::Arp, repr.buffer_len());
    repr.emit(&mut ArpPacket::new_unchecked(&mut f[14..]));
    f
}

fn echo4(inp: &mut Input) -> Vec<u8> {
    let len = inp.u8() as usize;
    let data = inp.bytes(len).to_vec();
    let icmp = Icmpv4Repr::EchoRequest {
        ident: inp.u16(),
        seq_no: inp.u16(),
        data: &data,
    };
    let ip = Ipv4Repr {
        src_addr: ipv4(inp),
        dst_addr: ipv4(inp),
        next_header: IpProtocol::Icmp,
        payload_len: icmp.buffer_len(),
        hop_limit: 64,
    };
    let mut f = ethernet(
        mac(inp),
        MAC,
        EthernetProtocol::Ipv4,
        ip.buffer_len() + icmp.buffer_len(),
    );
    let caps = ChecksumCapabilities::default();
    ip.emit(&mut Ipv4Packet::new_unchecked(&mut f[14..]), &caps);
    icmp.emit(&mut Icmpv4Packet::new_unchecked(&mut f[34..]), &caps);
    f
}

fn ndisc(inp: &mut Input) -> Vec<u8> {
    let (src, dst) = (ipv6(inp), ipv6(inp));
    let target = ipv6(inp);
    let lladdr = (inp.u8() & 3 != 0).then(|| RawHardwareAddress::from(EthernetAddress(mac(inp))));
    let nd = if inp.u8() & 1 == 0 {
        NdiscRepr::NeighborSolicit {
            target_addr: target,
            lladdr,
        }
    } else {
        NdiscRepr::NeighborAdvert {
            flags: NdiscNeighborFlags::from_bits_truncate(inp.u8()),
            target_addr: target,
            lladdr,
        }
    };
    let icmp = Icmpv6Repr::Ndisc(nd);
    let ip = Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: IpProtocol::Icmpv6,
        payload_len: icmp.buffer_len(),
        hop_limit: if inp.u8() & 7 == 0 { 64 } else { 255 },
    };
    let mut f = ethernet(
        mac(inp),
        [0x33, 0x33, 0xff, 0, 0, 5],
        EthernetProtocol::Ipv6,
        ip.buffer_len() + icmp.buffer_len(),
    );
    ip.emit(&mut Ipv6Packet::new_unchecked(&mut f[14..]));
    icmp.emit(
        &src,
        &dst,
        &mut Icmpv6Packet::new_unchecked(&mut f[54..]),
        &ChecksumCapabilities::default(),
    );
    f
}

/// Runs one input (see the module's doc).
pub fn run(data: &[u8]) {
    let cfg = config();
    let mut n = Neighbors::with_capacity(MAC, &cfg, CAPACITY);
    let mut now = 0u64;
    crate::script(data, MAX_STEPS, |inp| {
        let mut came_in = 0;
        match inp.u8() % 8 {
            0 => {
                let len = inp.u16() as usize % 300;
                let f = inp.bytes(len);
                n.handle_frame(now, f);
                came_in += 1;
            }
            1 | 2 => {
                n.handle_frame(now, &arp(inp));
                came_in += 1;
            }
            3 => {
                n.handle_frame(now, &echo4(inp));
                came_in += 1;
            }
            4 => {
                n.handle_frame(now, &ndisc(inp));
                came_in += 1;
            }
            5 => {
                let dst = if inp.u8() & 1 == 0 {
                    IpAddr::V4(ipv4(inp))
                } else {
                    IpAddr::V6(ipv6(inp))
                };
                let _ = n.resolve(now, dst);
            }
            6 => n.announce(),
            _ => {
                now += inp.u16() as u64 * MS;
                n.handle_timeout(now);
            }
        }
        let mut sent = 0;
        while let Some(f) = n.poll_frame() {
            sent += 1;
            assert!(f.len() >= 14 && f[6..12] == MAC, "a frame not from our MAC");
        }
        // Announcements and the timers' requests cover every entry at most once, with a
        // few announcements (gratuitous ARP and unsolicited NA per address).
        assert!(
            sent <= came_in + CAPACITY + 8,
            "{sent} frames sent in one step"
        );
        check(&n);
    });
}

fn check(n: &Neighbors) {
    assert!(n.len() <= CAPACITY, "{} entries", n.len());
    for (ip, st) in n.entries() {
        assert!(!n.is_ours(*ip), "an entry for our own {ip}: {st:?}");
        if let NeighborState::Reachable { mac, .. }
        | NeighborState::Stale { mac }
        | NeighborState::Probe { mac, .. } = st
        {
            assert!(mac[0] & 1 == 0 && *mac != [0; 6], "{ip} mapped to {mac:x?}");
        }
    }
}
