//! Neighbour handling, sans-IO: answers ARP, ICMP echo, IPv6 neighbour solicitations and
//! ICMPv6 echo for our addresses; resolves peers' MACs (through the gateway when off-link)
//! with retries and ageing; announces our addresses at start (gratuitous ARP, unsolicited NA).
//! Wire formats are smoltcp's; the table is ours.
//!
//! The table is bounded (`MAX_ENTRIES`, like Linux's gc_thresh3): remote input can create
//! entries (an ARP request or a solicitation for one of our addresses, RFC 826 / RFC 4861
//! 7.2.3), so when it is full the least useful entry is evicted (failed, then stale, then the
//! longest unconfirmed). Timers are a heap of deadlines, so an iteration never walks the
//! table. A generation number changes whenever a mapping that a sender may have cached
//! changes (new MAC, stale, failed, evicted): the RNIC caches each QP's next hop and asks
//! the table again only when the generation moved.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use roce::wire::ethernet::{self, ethertype, EthernetRepr, VlanTag};
use smoltcp::phy::ChecksumCapabilities;
use smoltcp::wire::{
    ArpOperation, ArpPacket, ArpRepr, EthernetAddress, Icmpv4Packet, Icmpv4Repr, Icmpv6Packet,
    Icmpv6Repr, IpProtocol, IpRepr, Ipv4Packet, Ipv4Repr, Ipv6Packet, Ipv6Repr, NdiscNeighborFlags,
    NdiscRepr, RawHardwareAddress,
};

use crate::config::{Cidr, RnicConfig};

/// Milliseconds, in ns.
const MS: u64 = 1_000_000;
/// Seconds, in ns.
const SEC: u64 = 1_000_000_000;
/// First retry of a resolution; each later one waits twice as long, up to `RETRY_MAX_NS`.
/// Linux waits retrans_time (1 s) every time, which alone outlasts an RC QP's whole retry
/// budget at common ACK timeouts (7 x 67 ms); a first answer lost at first contact must not
/// cost a connection.
pub const RETRY_FIRST_NS: u64 = 50 * MS;
/// Longest wait between two resolution attempts (Linux: retrans_time 1 s).
pub const RETRY_MAX_NS: u64 = SEC;
/// Attempts before a neighbour is declared unreachable: 0, 50, 150, 350, 750 and 1550 ms,
/// failing at 2.55 s (Linux: mcast_solicit 3 at 1 s, failing at 3 s).
pub const MAX_TRIES: u8 = 6;
/// How long an answer is trusted before the entry goes stale (Linux: base_reachable_time
/// 30 s).
pub const REACHABLE_NS: u64 = 30 * SEC;
/// How long an unreachable neighbour is not retried.
pub const FAILED_NS: u64 = 3 * SEC;
/// An entry's MAC is not replaced by a different one sooner than this after its last
/// update (Linux's ARP locktime, 1 s): a flood of forged replies cannot keep redirecting a
/// peer's traffic.
pub const LOCKTIME_NS: u64 = SEC;
/// Most entries (Linux: gc_thresh3 1024).
pub const MAX_ENTRIES: usize = 1024;

/// Wait before attempt `tries + 1`, after `tries` attempts.
fn retry_after(tries: u8) -> u64 {
    (RETRY_FIRST_NS << tries.saturating_sub(1).min(10)).min(RETRY_MAX_NS)
}

/// State of one neighbour entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighborState {
    /// Being resolved: `tries` requests sent, the next at `next`.
    Incomplete {
        /// Requests sent.
        tries: u8,
        /// Next retry.
        next: u64,
    },
    /// Known, trusted until `expires`.
    Reachable {
        /// MAC address.
        mac: [u8; 6],
        /// Goes stale then.
        expires: u64,
    },
    /// Known, not confirmed for `REACHABLE_NS`: still used, re-probed at its next use.
    Stale {
        /// Last known MAC.
        mac: [u8; 6],
    },
    /// Known but being confirmed again; still used meanwhile.
    Probe {
        /// Last known MAC.
        mac: [u8; 6],
        /// Requests sent.
        tries: u8,
        /// Next retry.
        next: u64,
    },
    /// Did not answer; not retried before `until`.
    Failed {
        /// Retry allowed after this.
        until: u64,
    },
}

impl NeighborState {
    /// When this state needs the timer.
    fn deadline(&self) -> Option<u64> {
        match *self {
            NeighborState::Incomplete { next, .. } | NeighborState::Probe { next, .. } => {
                Some(next)
            }
            NeighborState::Reachable { expires, .. } => Some(expires),
            NeighborState::Stale { .. } | NeighborState::Failed { .. } => None,
        }
    }

    /// Eviction preference when the table is full: lower goes first.
    fn keep_rank(&self) -> u8 {
        match self {
            NeighborState::Failed { .. } => 0,
            NeighborState::Stale { .. } => 1,
            NeighborState::Reachable { .. } | NeighborState::Probe { .. } => 2,
            NeighborState::Incomplete { .. } => 3,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    state: NeighborState,
    /// Last time its MAC was set or confirmed (for the lock time and eviction).
    updated: u64,
}

/// Result of resolving a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolve {
    /// Send to this MAC.
    Mac([u8; 6]),
    /// Resolution in progress: hold the frame.
    Pending,
    /// No route or no answer.
    Unreachable,
}

roce::counters!(
    /// Counters of the neighbour layer.
    NeighborCounters {
        /// ARP requests for our addresses.
        arp_requests_rx,
        /// ARP replies we sent.
        arp_replies_tx,
        /// ARP requests we sent (resolution, announcements).
        arp_requests_tx,
        /// ARP replies received.
        arp_replies_rx,
        /// ICMP (v4 and v6) echo requests answered.
        echo_replies_tx,
        /// Neighbour solicitations for our addresses.
        ns_rx,
        /// Neighbour advertisements sent.
        na_tx,
        /// Neighbour solicitations sent.
        ns_tx,
        /// Neighbour advertisements received.
        na_rx,
        /// Resolutions that failed.
        unreachable,
        /// Malformed ARP/ICMP/ND frames.
        malformed,
        /// MAC changes refused because the entry was updated less than `LOCKTIME_NS` before.
        updates_locked,
        /// Entries evicted because the table was full.
        evicted,
    }
);

/// The neighbour table and the protocol handlers around it.
#[derive(Debug)]
pub struct Neighbors {
    mac: [u8; 6],
    v4: Vec<Cidr<Ipv4Addr>>,
    v6: Vec<Ipv6Addr>,
    v6_cidrs: Vec<Cidr<Ipv6Addr>>,
    gw4: Option<Ipv4Addr>,
    gw6: Option<Ipv6Addr>,
    vlan: Option<VlanTag>,
    entries: HashMap<IpAddr, Entry>,
    max_entries: usize,
    /// Deadlines (lazily deleted: an item is live while its entry still has that deadline).
    timers: BinaryHeap<Reverse<(u64, IpAddr)>>,
    /// Whether the heap's top item is known to be live (checked by `poll_timeout` since the
    /// last change): the worker asks every iteration, and the check is a hash lookup.
    top_live: bool,
    generation: u64,
    out: VecDeque<Vec<u8>>,
    /// Learns from what it sees but answers nothing (`set_learn_only`).
    learn_only: bool,
    /// Counters.
    pub counters: NeighborCounters,
}

fn ll_from_mac(mac: [u8; 6]) -> Ipv6Addr {
    Ipv6Addr::from(roce::types::Gid::link_local_from_mac(mac).0)
}

fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | o[13] as u16,
        ((o[14] as u16) << 8) | o[15] as u16,
    )
}

fn multicast_mac(a: Ipv6Addr) -> [u8; 6] {
    let o = a.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

impl Neighbors {
    /// A table for an interface with `mac` and the addresses of `cfg`.
    pub fn new(mac: [u8; 6], cfg: &RnicConfig) -> Neighbors {
        Self::with_capacity(mac, cfg, MAX_ENTRIES)
    }

    /// A table holding at most `max_entries` neighbours.
    pub fn with_capacity(mac: [u8; 6], cfg: &RnicConfig, max_entries: usize) -> Neighbors {
        let mut v6 = vec![ll_from_mac(mac)];
        v6.extend(cfg.ipv6.iter().map(|c| c.addr));
        Neighbors {
            mac,
            v4: cfg.ipv4.clone(),
            v6,
            v6_cidrs: cfg.ipv6.clone(),
            gw4: cfg.gateway,
            gw6: cfg.gateway6,
            vlan: cfg.vlan.map(|vid| VlanTag {
                pcp: cfg.pcp,
                dei: false,
                vid,
            }),
            entries: HashMap::with_capacity(max_entries.min(MAX_ENTRIES)),
            max_entries: max_entries.max(1),
            timers: BinaryHeap::new(),
            top_live: false,
            generation: 0,
            out: VecDeque::new(),
            learn_only: false,
            counters: NeighborCounters::default(),
        }
    }

    /// Makes this table learn from the frames it is given without answering any (no ARP
    /// reply, neighbour advertisement or echo reply): the table of a worker that is not its
    /// RNIC's voice on the link, which gets copies of what the port's owner receives. It
    /// still asks for the addresses it needs.
    pub fn set_learn_only(&mut self) {
        self.learn_only = true;
    }

    /// Whether `ip` is one of ours.
    pub fn is_ours(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.v4.iter().any(|c| c.addr == a),
            IpAddr::V6(a) => self.v6.contains(&a),
        }
    }

    /// Whether a frame to the multicast MAC `mac` is for this interface: the all-nodes group
    /// and the solicited-node groups of our IPv6 addresses (RFC 4291 2.7.1, RFC 2464 7).
    pub fn accepts_multicast(&self, mac: [u8; 6]) -> bool {
        mac == multicast_mac(ALL_NODES)
            || self
                .v6
                .iter()
                .any(|a| multicast_mac(solicited_node(*a)) == mac)
    }

    /// Changes whenever a mapping a sender may have cached changes (see the module docs).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn next_hop(&self, dst: IpAddr) -> Option<IpAddr> {
        // Addresses no link or router delivers to (RFC 1122 3.2.1.3, RFC 4291 2.5.2-2.5.3,
        // 2.7): loopback, unspecified, multicast and broadcast destinations are unreachable
        // here, not sent to the gateway (a host would loop 127/8 back internally; an RNIC on
        // the wire has no such path).
        let martian = match dst {
            IpAddr::V4(a) => {
                a.is_loopback() || a.octets()[0] == 0 || a.is_multicast() || a.is_broadcast()
            }
            IpAddr::V6(a) => a.is_loopback() || a.is_unspecified() || a.is_multicast(),
        };
        if martian {
            return None;
        }
        match dst {
            IpAddr::V4(a) => {
                if self.v4.iter().any(|c| c.contains(a)) {
                    Some(dst)
                } else {
                    self.gw4.map(IpAddr::V4)
                }
            }
            IpAddr::V6(a) => {
                let ll = a.segments()[0] & 0xffc0 == 0xfe80;
                if ll || self.v6_cidrs.iter().any(|c| c.contains(a)) {
                    Some(dst)
                } else {
                    self.gw6.map(IpAddr::V6)
                }
            }
        }
    }

    /// Sets the state of `ip` (inserting it, evicting another if the table is full) and
    /// queues its deadline.
    fn set(&mut self, ip: IpAddr, state: NeighborState, updated: u64) {
        if !self.entries.contains_key(&ip) && self.entries.len() >= self.max_entries {
            self.evict_one();
        }
        self.entries.insert(ip, Entry { state, updated });
        self.top_live = false;
        if let Some(t) = state.deadline() {
            self.timers.push(Reverse((t, ip)));
        }
        // Stale timer items pile up only as fast as states change; drop them now and then.
        if self.timers.len() > 4 * self.max_entries.max(16) {
            let live: Vec<_> = self
                .entries
                .iter()
                .filter_map(|(ip, e)| e.state.deadline().map(|t| Reverse((t, *ip))))
                .collect();
            self.timers = live.into();
        }
    }

    fn evict_one(&mut self) {
        let victim = self
            .entries
            .iter()
            .min_by_key(|(_, e)| (e.state.keep_rank(), e.updated))
            .map(|(ip, _)| *ip);
        if let Some(ip) = victim {
            tracing::debug!(%ip, "neighbour evicted: table full");
            self.entries.remove(&ip);
            self.top_live = false;
            self.counters.evicted += 1;
            self.generation += 1;
        }
    }

    /// The MAC to send to `dst` (via the gateway when off-link), starting resolution if needed.
    pub fn resolve(&mut self, now: u64, dst: IpAddr) -> Resolve {
        let Some(hop) = self.next_hop(dst) else {
            self.counters.unreachable += 1;
            return Resolve::Unreachable;
        };
        // One of our own addresses (or a gateway configured as one): reached without the
        // link, as the RNIC reaches its own GIDs. Asking the link would put our own address
        // in the table and send an ARP request or solicitation for it, which other hosts
        // read as a duplicate-address probe (RFC 5227, RFC 4862).
        if self.is_ours(hop) {
            return Resolve::Mac(self.mac);
        }
        let Some(e) = self.entries.get(&hop).copied() else {
            self.start_resolution(now, hop);
            return Resolve::Pending;
        };
        match e.state {
            NeighborState::Reachable { mac, .. } | NeighborState::Probe { mac, .. } => {
                Resolve::Mac(mac)
            }
            NeighborState::Stale { mac } => {
                // Used while stale: confirm it (Linux: DELAY then PROBE), keep using it.
                self.set(
                    hop,
                    NeighborState::Probe {
                        mac,
                        tries: 1,
                        next: now + retry_after(1),
                    },
                    e.updated,
                );
                self.solicit(hop);
                Resolve::Mac(mac)
            }
            NeighborState::Incomplete { .. } => Resolve::Pending,
            NeighborState::Failed { until } if now < until => Resolve::Unreachable,
            NeighborState::Failed { .. } => {
                self.start_resolution(now, hop);
                Resolve::Pending
            }
        }
    }

    fn start_resolution(&mut self, now: u64, hop: IpAddr) {
        tracing::debug!(%hop, "resolving");
        self.set(
            hop,
            NeighborState::Incomplete {
                tries: 1,
                next: now + retry_after(1),
            },
            now,
        );
        self.solicit(hop);
    }

    /// The entry for an address (for tools and tests).
    pub fn entry(&self, ip: IpAddr) -> Option<NeighborState> {
        self.entries.get(&ip).map(|e| e.state)
    }

    /// Every entry.
    pub fn entries(&self) -> impl Iterator<Item = (&IpAddr, &NeighborState)> {
        self.entries.iter().map(|(ip, e)| (ip, &e.state))
    }

    /// Gratuitous ARP for each IPv4 address and an unsolicited NA for each IPv6 one.
    pub fn announce(&mut self) {
        for c in self.v4.clone() {
            self.arp(ArpOperation::Request, c.addr, [0xff; 6], c.addr, [0; 6]);
            self.counters.arp_requests_tx += 1;
        }
        for a in self.v6.clone() {
            self.ndisc_advert(a, ALL_NODES, [0x33, 0x33, 0, 0, 0, 1], false);
        }
    }

    /// A frame to send, if any.
    pub fn poll_frame(&mut self) -> Option<Vec<u8>> {
        self.out.pop_front()
    }

    /// The next deadline (retries, ageing).
    pub fn poll_timeout(&mut self) -> Option<u64> {
        if self.top_live {
            return self.timers.peek().map(|&Reverse((t, _))| t);
        }
        while let Some(&Reverse((t, ip))) = self.timers.peek() {
            match self.entries.get(&ip).and_then(|e| e.state.deadline()) {
                Some(d) if d == t => {
                    self.top_live = true;
                    return Some(t);
                }
                _ => {
                    self.timers.pop();
                }
            }
        }
        None
    }

    /// Retries and ageing due at `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        while let Some(&Reverse((t, ip))) = self.timers.peek() {
            if t > now {
                break;
            }
            self.timers.pop();
            self.top_live = false;
            let Some(e) = self.entries.get(&ip).copied() else {
                continue;
            };
            if e.state.deadline() != Some(t) {
                continue; // superseded
            }
            let (tries, mac) = match e.state {
                NeighborState::Reachable { mac, .. } => {
                    tracing::trace!(%ip, "neighbour stale");
                    self.set(ip, NeighborState::Stale { mac }, e.updated);
                    self.generation += 1;
                    continue;
                }
                NeighborState::Incomplete { tries, .. } => (tries, None),
                NeighborState::Probe { tries, mac, .. } => (tries, Some(mac)),
                _ => continue,
            };
            if tries >= MAX_TRIES {
                self.counters.unreachable += 1;
                tracing::info!(%ip, tries, "neighbour unreachable (no reply)");
                self.set(
                    ip,
                    NeighborState::Failed {
                        until: now + FAILED_NS,
                    },
                    e.updated,
                );
                self.generation += 1;
                continue;
            }
            let next = now + retry_after(tries + 1);
            let state = match mac {
                Some(mac) => NeighborState::Probe {
                    mac,
                    tries: tries + 1,
                    next,
                },
                None => NeighborState::Incomplete {
                    tries: tries + 1,
                    next,
                },
            };
            self.set(ip, state, e.updated);
            self.solicit(ip);
        }
    }

    /// Records that `ip` is at `mac` (RFC 826 merge; RFC 4861 7.2.5). `create`: add it if
    /// unknown. A different MAC replaces a known one only after `LOCKTIME_NS`.
    fn learn(&mut self, now: u64, ip: IpAddr, mac: [u8; 6], create: bool) {
        if mac[0] & 1 != 0 || mac == [0; 6] || self.is_ours(ip) {
            return;
        }
        let old = self.entries.get(&ip).copied();
        let known_mac = match old.map(|e| e.state) {
            None if !create => return,
            Some(
                NeighborState::Reachable { mac: m, .. }
                | NeighborState::Stale { mac: m }
                | NeighborState::Probe { mac: m, .. },
            ) => Some(m),
            _ => None,
        };
        if let (Some(m), Some(e)) = (known_mac, old) {
            if m != mac && now.saturating_sub(e.updated) < LOCKTIME_NS {
                self.counters.updates_locked += 1;
                tracing::debug!(%ip, new = %ethernet::mac_to_string(&mac), "MAC change refused: within the lock time");
                return;
            }
        }
        if known_mac != Some(mac) {
            self.generation += 1;
            tracing::debug!(%ip, mac = %ethernet::mac_to_string(&mac), "neighbour resolved");
        }
        self.set(
            ip,
            NeighborState::Reachable {
                mac,
                expires: now + REACHABLE_NS,
            },
            now,
        );
    }

    fn solicit(&mut self, ip: IpAddr) {
        match ip {
            IpAddr::V4(a) => {
                let Some(src) = self
                    .v4
                    .iter()
                    .find(|c| c.contains(a))
                    .or(self.v4.first())
                    .map(|c| c.addr)
                else {
                    return;
                };
                self.arp(ArpOperation::Request, src, [0xff; 6], a, [0; 6]);
                self.counters.arp_requests_tx += 1;
            }
            IpAddr::V6(a) => {
                let src = self.v6[0];
                let dst = solicited_node(a);
                let repr = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
                    target_addr: a,
                    lladdr: Some(RawHardwareAddress::from(EthernetAddress(self.mac))),
                });
                self.icmpv6(src, dst, multicast_mac(dst), &repr);
                self.counters.ns_tx += 1;
            }
        }
    }

    /// Queues a frame to `dst` of ethertype `et` whose body of `payload_len` bytes `emit`
    /// writes (it gets the rest of the frame: padding to the 60-byte minimum included).
    fn queue_frame(
        &mut self,
        dst: [u8; 6],
        et: u16,
        payload_len: usize,
        emit: impl FnOnce(&mut [u8]),
    ) {
        let eth = EthernetRepr {
            dst,
            src: self.mac,
            vlan: self.vlan,
            ethertype: et,
        };
        let hl = eth.buffer_len();
        let mut f = vec![0u8; (hl + payload_len).max(60)];
        eth.emit(&mut f).expect("sized");
        emit(&mut f[hl..]);
        self.out.push_back(f);
    }

    fn arp(
        &mut self,
        op: ArpOperation,
        src_ip: Ipv4Addr,
        dst_mac: [u8; 6],
        target_ip: Ipv4Addr,
        target_mac: [u8; 6],
    ) {
        let repr = ArpRepr::EthernetIpv4 {
            operation: op,
            source_hardware_addr: EthernetAddress(self.mac),
            source_protocol_addr: src_ip,
            target_hardware_addr: EthernetAddress(target_mac),
            target_protocol_addr: target_ip,
        };
        let len = repr.buffer_len();
        self.queue_frame(dst_mac, ethertype::ARP, len, |b| {
            repr.emit(&mut ArpPacket::new_unchecked(&mut b[..len]))
        });
    }

    /// Queues an IP packet `ip` to `dst_mac`; `emit` writes its payload (of the length `ip`
    /// gives).
    fn queue_ip(&mut self, dst_mac: [u8; 6], ip: IpRepr, emit: impl FnOnce(&mut [u8])) {
        let et = match ip {
            IpRepr::Ipv4(_) => ethertype::IPV4,
            IpRepr::Ipv6(_) => ethertype::IPV6,
        };
        let (hl, pl) = (ip.header_len(), ip.payload_len());
        self.queue_frame(dst_mac, et, hl + pl, |b| {
            ip.emit(&mut *b, &ChecksumCapabilities::default());
            emit(&mut b[hl..hl + pl]);
        });
    }

    fn icmpv6(&mut self, src: Ipv6Addr, dst: Ipv6Addr, dst_mac: [u8; 6], repr: &Icmpv6Repr<'_>) {
        let ip = IpRepr::new(
            src.into(),
            dst.into(),
            IpProtocol::Icmpv6,
            repr.buffer_len(),
            255,
        );
        self.queue_ip(dst_mac, ip, |b| {
            let mut icmp = Icmpv6Packet::new_unchecked(b);
            repr.emit(&src, &dst, &mut icmp, &ChecksumCapabilities::default());
        });
    }

    fn ndisc_advert(&mut self, target: Ipv6Addr, dst: Ipv6Addr, dst_mac: [u8; 6], solicited: bool) {
        if self.learn_only {
            return;
        }
        let mut flags = NdiscNeighborFlags::OVERRIDE;
        if solicited {
            flags |= NdiscNeighborFlags::SOLICITED;
        }
        let repr = Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
            flags,
            target_addr: target,
            lladdr: Some(RawHardwareAddress::from(EthernetAddress(self.mac))),
        });
        self.icmpv6(target, dst, dst_mac, &repr);
        self.counters.na_tx += 1;
    }

    /// Handles an ARP, IPv4 ICMP or ICMPv6 frame. Returns whether the frame was for this
    /// layer (consumed), so the caller counts the rest as dropped.
    pub fn handle_frame(&mut self, now: u64, frame: &[u8]) -> bool {
        let Ok(eth) = ethernet::Frame::new_checked(frame) else {
            return false;
        };
        let src_mac = eth.src();
        let body = eth.payload();
        match eth.ethertype() {
            ethertype::ARP => {
                self.handle_arp(now, body);
                true
            }
            ethertype::IPV4 => self.handle_ipv4(src_mac, body),
            ethertype::IPV6 => self.handle_ipv6(now, src_mac, body),
            _ => false,
        }
    }

    fn handle_arp(&mut self, now: u64, body: &[u8]) {
        let Ok(repr) = ArpPacket::new_checked(body).and_then(|p| ArpRepr::parse(&p)) else {
            self.counters.malformed += 1;
            return;
        };
        let ArpRepr::EthernetIpv4 {
            operation,
            source_hardware_addr,
            source_protocol_addr,
            target_protocol_addr,
            ..
        } = repr
        else {
            return;
        };
        let for_us = self.v4.iter().any(|c| c.addr == target_protocol_addr);
        // RFC 826 merge: update a known sender; add it when the packet is for us.
        self.learn(
            now,
            IpAddr::V4(source_protocol_addr),
            source_hardware_addr.0,
            for_us,
        );
        match operation {
            ArpOperation::Request
                if for_us && source_protocol_addr != target_protocol_addr && !self.learn_only =>
            {
                self.counters.arp_requests_rx += 1;
                self.arp(
                    ArpOperation::Reply,
                    target_protocol_addr,
                    source_hardware_addr.0,
                    source_protocol_addr,
                    source_hardware_addr.0,
                );
                self.counters.arp_replies_tx += 1;
            }
            ArpOperation::Reply if for_us => self.counters.arp_replies_rx += 1,
            _ => {}
        }
    }

    fn handle_ipv4(&mut self, src_mac: [u8; 6], body: &[u8]) -> bool {
        if self.learn_only {
            return false;
        }
        let caps = ChecksumCapabilities::default();
        let Ok(p) = Ipv4Packet::new_checked(body) else {
            return false;
        };
        let Ok(ip) = Ipv4Repr::parse(&p, &caps) else {
            return false;
        };
        if ip.next_header != IpProtocol::Icmp || !self.v4.iter().any(|c| c.addr == ip.dst_addr) {
            return false;
        }
        let Ok(ip4) = Icmpv4Packet::new_checked(p.payload()) else {
            self.counters.malformed += 1;
            return true;
        };
        let Ok(Icmpv4Repr::EchoRequest {
            ident,
            seq_no,
            data,
        }) = Icmpv4Repr::parse(&ip4, &caps)
        else {
            return true; // other ICMP for us: consumed, ignored
        };
        let reply = Icmpv4Repr::EchoReply {
            ident,
            seq_no,
            data,
        };
        let rip = IpRepr::new(
            ip.dst_addr.into(),
            ip.src_addr.into(),
            IpProtocol::Icmp,
            reply.buffer_len(),
            64,
        );
        self.queue_ip(src_mac, rip, |b| {
            reply.emit(&mut Icmpv4Packet::new_unchecked(b), &caps)
        });
        self.counters.echo_replies_tx += 1;
        true
    }

    fn handle_ipv6(&mut self, now: u64, src_mac: [u8; 6], body: &[u8]) -> bool {
        let caps = ChecksumCapabilities::default();
        let Ok(p) = Ipv6Packet::new_checked(body) else {
            return false;
        };
        let Ok(ip) = Ipv6Repr::parse(&p) else {
            return false;
        };
        if ip.next_header != IpProtocol::Icmpv6 {
            return false;
        }
        let Ok(icmp) = Icmpv6Packet::new_checked(p.payload()) else {
            self.counters.malformed += 1;
            return true;
        };
        let Ok(repr) = Icmpv6Repr::parse(&ip.src_addr, &ip.dst_addr, &icmp, &caps) else {
            self.counters.malformed += 1;
            return true;
        };
        match repr {
            Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
                target_addr,
                lladdr,
            }) => {
                if !self.v6.contains(&target_addr) {
                    return true;
                }
                self.counters.ns_rx += 1;
                let mac = lladdr.map(|l| {
                    let mut m = [0u8; 6];
                    let b = l.as_bytes();
                    m.copy_from_slice(&b[..6.min(b.len())]);
                    m
                });
                if ip.src_addr.is_unspecified() {
                    // Duplicate address detection: answer to all-nodes.
                    self.ndisc_advert(target_addr, ALL_NODES, [0x33, 0x33, 0, 0, 0, 1], false);
                } else {
                    if let Some(m) = mac {
                        self.learn(now, IpAddr::V6(ip.src_addr), m, true);
                    }
                    self.ndisc_advert(target_addr, ip.src_addr, mac.unwrap_or(src_mac), true);
                }
                true
            }
            Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert {
                target_addr,
                lladdr,
                ..
            }) => {
                self.counters.na_rx += 1;
                let mac = lladdr
                    .map(|l| {
                        let mut m = [0u8; 6];
                        let b = l.as_bytes();
                        m.copy_from_slice(&b[..6.min(b.len())]);
                        m
                    })
                    .unwrap_or(src_mac);
                self.learn(now, IpAddr::V6(target_addr), mac, false);
                true
            }
            Icmpv6Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } if self.v6.contains(&ip.dst_addr) && !self.learn_only => {
                let reply = Icmpv6Repr::EchoReply {
                    ident,
                    seq_no,
                    data,
                };
                self.icmpv6(ip.dst_addr, ip.src_addr, src_mac, &reply);
                self.counters.echo_replies_tx += 1;
                true
            }
            _ => self.v6.contains(&ip.dst_addr),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConfig;

    fn table() -> Neighbors {
        let mut r = RawConfig::default();
        r.set("port.device", "net_ring0").unwrap();
        r.set("address.ipv4", "10.99.0.3/24").unwrap();
        r.set("address.ipv6", "fd00:99::3/64").unwrap();
        r.set("address.gateway", "10.99.0.1").unwrap();
        Neighbors::new([2, 0, 0, 0x99, 0, 3], &r.validate().unwrap())
    }

    fn arp_frame(
        op: ArpOperation,
        smac: [u8; 6],
        sip: [u8; 4],
        tip: [u8; 4],
        dst: [u8; 6],
    ) -> Vec<u8> {
        let repr = ArpRepr::EthernetIpv4 {
            operation: op,
            source_hardware_addr: EthernetAddress(smac),
            source_protocol_addr: Ipv4Addr::from(sip),
            target_hardware_addr: EthernetAddress([0; 6]),
            target_protocol_addr: Ipv4Addr::from(tip),
        };
        let mut f = vec![0u8; 60];
        EthernetRepr {
            dst,
            src: smac,
            vlan: None,
            ethertype: ethertype::ARP,
        }
        .emit(&mut f)
        .unwrap();
        repr.emit(&mut ArpPacket::new_unchecked(&mut f[14..42]));
        f
    }

    #[test]
    fn answers_arp_for_our_address_and_learns_the_sender() {
        let mut n = table();
        let peer = [0x52, 0x54, 0, 0x99, 0, 2];
        assert!(n.handle_frame(
            0,
            &arp_frame(
                ArpOperation::Request,
                peer,
                [10, 99, 0, 2],
                [10, 99, 0, 3],
                [0xff; 6]
            )
        ));
        let reply = n.poll_frame().unwrap();
        assert_eq!(&reply[..6], &peer);
        let p = ArpRepr::parse(&ArpPacket::new_checked(&reply[14..42]).unwrap()).unwrap();
        match p {
            ArpRepr::EthernetIpv4 {
                operation,
                source_hardware_addr,
                source_protocol_addr,
                ..
            } => {
                assert_eq!(operation, ArpOperation::Reply);
                assert_eq!(source_hardware_addr.0, [2, 0, 0, 0x99, 0, 3]);
                assert_eq!(source_protocol_addr, Ipv4Addr::new(10, 99, 0, 3));
            }
            _ => unreachable!(),
        }
        assert_eq!(
            n.resolve(1, "10.99.0.2".parse().unwrap()),
            Resolve::Mac(peer)
        );
        // Not for us: ignored, nothing learned.
        n.handle_frame(
            0,
            &arp_frame(
                ArpOperation::Request,
                [2, 0, 0, 0, 0, 9],
                [10, 99, 0, 9],
                [10, 99, 0, 8],
                [0xff; 6],
            ),
        );
        assert!(n.poll_frame().is_none());
        assert!(n.entry("10.99.0.9".parse().unwrap()).is_none());
    }

    fn arp_reply_from(n: &mut Neighbors, now: u64, mac: [u8; 6], ip: [u8; 4]) {
        n.handle_frame(
            now,
            &arp_frame(
                ArpOperation::Reply,
                mac,
                ip,
                [10, 99, 0, 3],
                [2, 0, 0, 0x99, 0, 3],
            ),
        );
    }

    #[test]
    fn resolves_with_backed_off_retries_then_fails_and_ages() {
        let mut n = table();
        let ip: IpAddr = "10.99.0.2".parse().unwrap();
        assert_eq!(n.resolve(0, ip), Resolve::Pending);
        assert!(n.poll_frame().is_some(), "request sent");
        assert_eq!(n.resolve(10, ip), Resolve::Pending);
        assert!(
            n.poll_frame().is_none(),
            "no duplicate request before the retry"
        );
        // Retries 50 ms after the first request, then 100, 200, 400, 800 ms apart.
        let mut t = 0;
        let mut sent_at = vec![0];
        while let Some(d) = n.poll_timeout() {
            t = d;
            n.handle_timeout(t);
            if n.poll_frame().is_some() {
                sent_at.push(t / MS);
            }
        }
        assert_eq!(sent_at, vec![0, 50, 150, 350, 750, 1550]);
        assert_eq!(n.counters.arp_requests_tx, MAX_TRIES as u64);
        assert_eq!(t / MS, 2550, "declared unreachable one more interval later");
        assert_eq!(n.resolve(t, ip), Resolve::Unreachable);
        // After the hold-down a new attempt starts; a reply makes it reachable.
        let t = t + FAILED_NS;
        assert_eq!(n.resolve(t, ip), Resolve::Pending);
        let peer = [0x52, 0x54, 0, 0x99, 0, 2];
        arp_reply_from(&mut n, t, peer, [10, 99, 0, 2]);
        assert_eq!(n.resolve(t + 1, ip), Resolve::Mac(peer));
        // Ageing: the timer makes it stale after REACHABLE_NS (the generation moves so cached
        // next hops are looked up again); used while stale it is re-probed and still used.
        while n.poll_frame().is_some() {}
        let g = n.generation();
        assert_eq!(n.poll_timeout(), Some(t + REACHABLE_NS));
        n.handle_timeout(t + REACHABLE_NS);
        assert!(matches!(n.entry(ip), Some(NeighborState::Stale { .. })));
        assert_ne!(n.generation(), g);
        assert_eq!(n.resolve(t + REACHABLE_NS + 1, ip), Resolve::Mac(peer));
        assert!(n.poll_frame().is_some(), "re-probe sent");
        assert!(matches!(n.entry(ip), Some(NeighborState::Probe { .. })));
    }

    /// Forged replies cannot move a fresh entry to another MAC: a different MAC is taken only
    /// `LOCKTIME_NS` after the entry's last update (Linux's ARP locktime).
    #[test]
    fn a_flood_of_forged_arp_replies_is_held_off_by_the_lock_time() {
        let mut n = table();
        let ip: IpAddr = "10.99.0.2".parse().unwrap();
        let peer = [0x52, 0x54, 0, 0x99, 0, 2];
        let forger = [0x52, 0x54, 0, 0x66, 0, 6];
        n.resolve(0, ip);
        arp_reply_from(&mut n, 1000, peer, [10, 99, 0, 2]);
        for i in 0..1000 {
            arp_reply_from(&mut n, 2000 + i * 100_000, forger, [10, 99, 0, 2]);
        }
        assert_eq!(n.resolve(SEC / 2, ip), Resolve::Mac(peer));
        assert_eq!(n.counters.updates_locked, 1000);
        // The real peer refreshes its entry; the lock runs from the refresh.
        arp_reply_from(&mut n, SEC / 2, peer, [10, 99, 0, 2]);
        arp_reply_from(&mut n, SEC + SEC / 4, forger, [10, 99, 0, 2]);
        assert_eq!(n.resolve(SEC + SEC / 4, ip), Resolve::Mac(peer));
        // A real MAC change later than the lock time is accepted.
        arp_reply_from(&mut n, 3 * SEC, forger, [10, 99, 0, 2]);
        assert_eq!(n.resolve(3 * SEC, ip), Resolve::Mac(forger));
        // Nobody may claim one of our own addresses.
        arp_reply_from(&mut n, 9 * SEC, forger, [10, 99, 0, 3]);
        assert!(n.entry("10.99.0.3".parse().unwrap()).is_none());
    }

    /// ARP requests for our address from ever new senders create entries, but the table
    /// stays bounded: the oldest are evicted, a peer being resolved is kept.
    #[test]
    fn the_table_is_bounded_against_a_flood_of_new_senders() {
        let mut r = RawConfig::default();
        r.set("port.device", "net_ring0").unwrap();
        r.set("address.ipv4", "10.99.0.3/16").unwrap();
        let mut n = Neighbors::with_capacity([2, 0, 0, 0x99, 0, 3], &r.validate().unwrap(), 64);
        let wanted: IpAddr = "10.99.0.2".parse().unwrap();
        assert_eq!(n.resolve(0, wanted), Resolve::Pending);
        for i in 0..10_000u32 {
            let sip = [10, 99, (i >> 8) as u8 + 1, i as u8];
            let mac = [2, 0x11, 0, 0, (i >> 8) as u8, i as u8];
            n.handle_frame(
                1 + i as u64,
                &arp_frame(ArpOperation::Request, mac, sip, [10, 99, 0, 3], [0xff; 6]),
            );
            while n.poll_frame().is_some() {}
        }
        assert_eq!(n.len(), 64);
        assert!(n.counters.evicted >= 10_000 - 63);
        assert!(matches!(
            n.entry(wanted),
            Some(NeighborState::Incomplete { .. })
        ));
        // The most recent sender is there; the first ones are gone.
        assert!(n.entry("10.99.40.15".parse().unwrap()).is_some());
        assert!(n.entry("10.99.1.0".parse().unwrap()).is_none());
        // Timers stay proportional to the table, not to the flood.
        assert!(n.timers.len() <= 4 * 64);
    }

    #[test]
    fn our_own_addresses_resolve_to_our_mac_without_asking_the_link() {
        let mut n = table();
        let mac = [2, 0, 0, 0x99, 0, 3];
        for ip in ["10.99.0.3", "fd00:99::3", "fe80::ff:fe99:3"] {
            assert_eq!(n.resolve(0, ip.parse().unwrap()), Resolve::Mac(mac), "{ip}");
        }
        assert!(n.is_empty(), "no entry for our own addresses");
        assert_eq!(n.poll_frame(), None, "no request for them on the link");
    }

    #[test]
    fn off_subnet_goes_via_the_gateway() {
        let mut n = table();
        assert_eq!(n.resolve(0, "192.0.2.1".parse().unwrap()), Resolve::Pending);
        assert!(
            n.entry("10.99.0.1".parse().unwrap()).is_some(),
            "the gateway is resolved"
        );
        assert_eq!(
            n.resolve(0, "2001:db8::1".parse().unwrap()),
            Resolve::Unreachable,
            "no IPv6 gateway"
        );
    }

    #[test]
    fn loopback_multicast_and_broadcast_destinations_are_unreachable_not_routed() {
        let mut n = table();
        for ip in [
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "ff02::1",
        ] {
            assert_eq!(
                n.resolve(0, ip.parse().unwrap()),
                Resolve::Unreachable,
                "{ip}"
            );
        }
        assert!(n.is_empty(), "nothing resolved, not even the gateway");
        assert_eq!(n.poll_frame(), None, "no ARP or solicitation on the link");
        assert_eq!(n.counters.unreachable, 7);
    }

    #[test]
    fn answers_ping_and_neighbour_solicitation() {
        let mut n = table();
        let caps = ChecksumCapabilities::default();
        // ICMP echo request to 10.99.0.3.
        let echo = Icmpv4Repr::EchoRequest {
            ident: 7,
            seq_no: 1,
            data: b"hello",
        };
        let ip = Ipv4Repr {
            src_addr: Ipv4Addr::new(10, 99, 0, 2),
            dst_addr: Ipv4Addr::new(10, 99, 0, 3),
            next_header: IpProtocol::Icmp,
            payload_len: echo.buffer_len(),
            hop_limit: 64,
        };
        let mut f = vec![0u8; 14 + 20 + echo.buffer_len()];
        EthernetRepr {
            dst: [2, 0, 0, 0x99, 0, 3],
            src: [0x52, 0, 0, 0, 0, 2],
            vlan: None,
            ethertype: ethertype::IPV4,
        }
        .emit(&mut f)
        .unwrap();
        let mut p = Ipv4Packet::new_unchecked(&mut f[14..]);
        ip.emit(&mut p, &caps);
        echo.emit(&mut Icmpv4Packet::new_unchecked(p.payload_mut()), &caps);
        assert!(n.handle_frame(0, &f));
        let r = n.poll_frame().unwrap();
        let rp = Ipv4Packet::new_checked(&r[14..]).unwrap();
        assert_eq!(rp.dst_addr(), Ipv4Addr::new(10, 99, 0, 2));
        let rr =
            Icmpv4Repr::parse(&Icmpv4Packet::new_checked(rp.payload()).unwrap(), &caps).unwrap();
        assert_eq!(
            rr,
            Icmpv4Repr::EchoReply {
                ident: 7,
                seq_no: 1,
                data: b"hello"
            }
        );
        // Neighbour solicitation for fd00:99::3.
        let target: Ipv6Addr = "fd00:99::3".parse().unwrap();
        let src: Ipv6Addr = "fd00:99::2".parse().unwrap();
        let ns = Icmpv6Repr::Ndisc(NdiscRepr::NeighborSolicit {
            target_addr: target,
            lladdr: Some(RawHardwareAddress::from(EthernetAddress([
                0x52, 0, 0, 0, 0, 2,
            ]))),
        });
        let dst = solicited_node(target);
        let ip6 = Ipv6Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::Icmpv6,
            payload_len: ns.buffer_len(),
            hop_limit: 255,
        };
        let mut f = vec![0u8; 14 + 40 + ns.buffer_len()];
        EthernetRepr {
            dst: multicast_mac(dst),
            src: [0x52, 0, 0, 0, 0, 2],
            vlan: None,
            ethertype: ethertype::IPV6,
        }
        .emit(&mut f)
        .unwrap();
        let mut p = Ipv6Packet::new_unchecked(&mut f[14..]);
        ip6.emit(&mut p);
        ns.emit(
            &src,
            &dst,
            &mut Icmpv6Packet::new_unchecked(p.payload_mut()),
            &caps,
        );
        assert!(n.handle_frame(0, &f));
        let r = n.poll_frame().unwrap();
        let rp = Ipv6Packet::new_checked(&r[14..]).unwrap();
        let rip = Ipv6Repr::parse(&rp).unwrap();
        assert_eq!(rip.dst_addr, src);
        let na = Icmpv6Repr::parse(
            &rip.src_addr,
            &rip.dst_addr,
            &Icmpv6Packet::new_checked(rp.payload()).unwrap(),
            &caps,
        )
        .unwrap();
        assert!(
            matches!(na, Icmpv6Repr::Ndisc(NdiscRepr::NeighborAdvert { target_addr, .. }) if target_addr == target)
        );
        assert_eq!(
            n.resolve(1, IpAddr::V6(src)),
            Resolve::Mac([0x52, 0, 0, 0, 0, 2])
        );
    }

    #[test]
    fn announces_every_address() {
        let mut n = table();
        n.announce();
        let frames: Vec<_> = std::iter::from_fn(|| n.poll_frame()).collect();
        assert_eq!(
            frames.len(),
            3,
            "one gratuitous ARP, two unsolicited NAs (link-local and fd00:99::3)"
        );
        assert!(!n.handle_frame(0, &[0u8; 10]));
    }
}
