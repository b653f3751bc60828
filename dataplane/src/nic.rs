//! One software RNIC on one DPDK port: receive, classify, drive the engine, build frames, send.
//!
//! Owned by exactly one worker lcore (no locks on this path). Per iteration:
//! 1. `rx_burst` and classification: RoCEv2 to the engine (segments passed in place), ARP /
//!    ICMP / IPv6 ND to the neighbour layer, PFC and PAUSE counted (acted on in the DCB part),
//!    IPv4 fragments and everything else counted and dropped;
//! 2. verbs commands from the applications' rings;
//! 3. timers (engine and neighbours);
//! 4. transmit: engine output built straight into mbufs (headers, payload gathered from the
//!    registered memory, ICRC once), waiting (bounded) while the peer's MAC is resolved;
//! 5. completions and events to the applications' rings.

use std::collections::VecDeque;
use std::io::BufWriter;
use std::net::IpAddr;
use std::sync::Arc;

use pmd_bindings::{Mbuf, Mempool, Port, RxQueue, TxQueue};
use roce::engine::{CreditMode, Device, DeviceConfig, Transmit};
use roce::pcap;
use roce::sim::Rng;
use roce::types::Gid;
use roce::wire::ethernet::{self, ethertype, VlanTag};
use roce::wire::frame::{classify, FrameKind};

use crate::config::{FaultConfig, RnicConfig};
use crate::host::{HostEnd, HostLimits, Owners};
use crate::neighbor::{Neighbors, Resolve};

/// The group address of MAC control frames (PAUSE, PFC; IEEE 802.3 Annex 31B).
const MAC_CONTROL_GROUP: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x01];

/// Frames per burst.
pub const BURST: usize = 32;
/// Frames held while their next hop is being resolved.
const MAX_PENDING: usize = 256;
/// Transmit frames kept for a retry when the queue is full, at most.
const MAX_TX_BACKLOG: usize = 1024;
/// Engine packets produced per iteration at most (fairness with receive).
const TX_BUDGET: usize = 64;

/// Port-level counters of one RNIC.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicCounters {
    /// Frames received.
    pub rx_frames: u64,
    /// RoCEv2 frames handed to the engine (CNPs included).
    pub rx_roce: u64,
    /// ARP frames.
    pub rx_arp: u64,
    /// ICMP / ICMPv6 (incl. ND) frames for the neighbour layer.
    pub rx_icmp: u64,
    /// PFC frames (counted; acted on by DCB).
    pub rx_pfc: u64,
    /// Link-level PAUSE frames.
    pub rx_pause: u64,
    /// IPv4 fragments (never RoCE).
    pub rx_ipv4_fragments: u64,
    /// Anything else, dropped.
    pub rx_other: u64,
    /// Frames to a destination MAC that is not ours (another station's unicast, a group we
    /// did not join, broadcast other than ARP), dropped.
    pub rx_dropped_mac: u64,
    /// Frames on a VLAN that is not ours (or untagged on a VLAN port), dropped.
    pub rx_dropped_vlan: u64,
    /// Frames too short for an Ethernet header.
    pub rx_runts: u64,
    /// Frames received in more than one segment.
    pub rx_multiseg: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// RoCE packets built.
    pub tx_roce: u64,
    /// Neighbour-layer frames sent.
    pub tx_neighbor: u64,
    /// Frames held for address resolution.
    pub tx_held: u64,
    /// Held frames dropped (queue full or peer unreachable).
    pub tx_held_dropped: u64,
    /// Packets whose destination could not be resolved.
    pub tx_unresolved: u64,
    /// QPs failed because their peer could not be resolved.
    pub qps_failed_unresolved: u64,
    /// Mbuf allocation failures.
    pub tx_nombuf: u64,
    /// Frames the transmit queue refused and were retried later.
    pub tx_retried: u64,
    /// Frames dropped because the transmit backlog was full.
    pub tx_dropped: u64,
    /// Faults injected: lost.
    pub fault_lost: u64,
    /// Faults injected: duplicated.
    pub fault_duplicated: u64,
    /// Faults injected: corrupted.
    pub fault_corrupted: u64,
    /// Faults injected: reordered.
    pub fault_reordered: u64,
}

/// A QP's last resolved next hop, valid while the neighbour table's generation is `gen`.
#[derive(Clone, Copy)]
struct NextHop {
    dgid: Gid,
    mac: [u8; 6],
    gen: u64,
}

impl NextHop {
    const NONE: NextHop = NextHop {
        dgid: Gid([0; 16]),
        mac: [0; 6],
        gen: u64::MAX,
    };
}

struct Fault {
    cfg: FaultConfig,
    rng: Rng,
    held: Option<Mbuf>,
}

/// A software RNIC on one port.
pub struct Nic {
    /// Port name.
    pub name: String,
    _port: Port,
    rxq: RxQueue,
    txq: TxQueue,
    pool: Arc<Mempool>,
    /// The transport engine.
    pub dev: Device,
    /// ARP / ND.
    pub neigh: Neighbors,
    cfg: RnicConfig,
    mac: [u8; 6],
    vlan: Option<VlanTag>,
    /// Attached application contexts (by host id; `None` once closed).
    hosts: Vec<Option<HostEnd>>,
    /// Which host owns each QP, CQ and SRQ.
    owners: Owners,
    /// What moved in the engine this iteration (reused, no allocation).
    moved_qps: Vec<roce::types::Qpn>,
    moved_srqs: Vec<roce::engine::SrqId>,
    ready_cqs: Vec<roce::engine::CqId>,
    /// Next hop per QP (by `Device::qp_index`).
    hops: Vec<NextHop>,
    pending: VecDeque<(IpAddr, Gid, Mbuf)>,
    rxbuf: Vec<Mbuf>,
    txbuf: Vec<Mbuf>,
    tx: Transmit,
    ident: u16,
    tap: Option<pcap::Writer<BufWriter<std::fs::File>>>,
    fault: Option<Fault>,
    scratch: Vec<u8>,
    /// Counters.
    pub counters: NicCounters,
}

impl Nic {
    /// An RNIC on `port` (started, with rx/tx queue 0 free), using `pool` for transmit mbufs.
    pub fn new(cfg: RnicConfig, port: Port, pool: Arc<Mempool>) -> Result<Nic, String> {
        let mut mac = port
            .mac_addr()
            .map_err(|e| format!("{}: {e}", port.name()))?;
        if let Some(m) = cfg.mac {
            // Virtual ports may not support changing the MAC; ours is then a software MAC and
            // the port runs promiscuous.
            let _ = port.set_mac_addr(m);
            mac = m;
        }
        let rxq = port.rx_queue(0).map_err(|e| e.to_string())?;
        let txq = port.tx_queue(0).map_err(|e| e.to_string())?;
        let gids = cfg.gids(mac);
        let dev = Device::new(DeviceConfig {
            gids,
            port_mtu: cfg.path_mtu,
            credits: if cfg.credits_from_rq {
                CreditMode::FromReceiveQueue
            } else {
                CreditMode::Unlimited
            },
            coalesce_acks: cfg.ack_coalescing,
            ..Default::default()
        });
        let max_qp = dev.config().limits.max_qp as usize;
        let limits = HostLimits::of(dev.config());
        let mut neigh = Neighbors::new(mac, &cfg);
        neigh.announce();
        let tap = match &cfg.pcap {
            None => None,
            Some(p) => {
                let f = std::fs::File::create(p)
                    .map_err(|e| format!("capture.pcap {}: {e}", p.display()))?;
                Some(pcap::Writer::new(BufWriter::new(f)).map_err(|e| e.to_string())?)
            }
        };
        let fault = cfg.fault.any().then(|| Fault {
            cfg: cfg.fault,
            rng: Rng::new(cfg.fault.seed),
            held: None,
        });
        let vlan = cfg.vlan.map(|vid| VlanTag {
            pcp: cfg.pcp,
            dei: false,
            vid,
        });
        tracing::info!("rnic {}", cfg.summary(mac));
        Ok(Nic {
            name: port.name().to_string(),
            _port: port,
            rxq,
            txq,
            pool,
            dev,
            neigh,
            cfg,
            mac,
            vlan,
            hosts: Vec::new(),
            owners: Owners::new(limits),
            moved_qps: Vec::with_capacity(64),
            moved_srqs: Vec::with_capacity(16),
            ready_cqs: Vec::with_capacity(16),
            hops: vec![NextHop::NONE; max_qp],
            pending: VecDeque::with_capacity(MAX_PENDING),
            rxbuf: Vec::with_capacity(BURST),
            txbuf: Vec::with_capacity(MAX_TX_BACKLOG + BURST),
            tx: Transmit::default(),
            ident: 0,
            tap,
            fault,
            scratch: Vec::with_capacity(16384),
            counters: NicCounters::default(),
        })
    }

    /// The MAC address in use.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The configuration.
    pub fn config(&self) -> &RnicConfig {
        &self.cfg
    }

    /// Attaches an application context.
    pub fn add_host(&mut self, mut h: HostEnd) {
        let id = match self.hosts.iter().position(|h| h.is_none()) {
            Some(i) => i,
            None => {
                self.hosts.push(None);
                self.hosts.len() - 1
            }
        };
        h.id = id as u16;
        self.hosts[id] = Some(h);
    }

    /// The sizes host interfaces of this RNIC need.
    pub fn host_limits(&self) -> HostLimits {
        HostLimits::of(self.dev.config())
    }

    /// Attached application contexts.
    pub fn host_count(&self) -> usize {
        self.hosts.iter().flatten().count()
    }

    /// Routes queue positions, completions and events to the hosts owning their objects;
    /// returns how many completions and events were delivered. Positions go first: an
    /// application that polls a completion may post into the slot it freed at once (verbs
    /// semantics), so the slot must already read as retired.
    fn publish(&mut self) -> usize {
        let mut work = 0;
        self.dev.take_moved(
            &mut self.moved_qps,
            &mut self.moved_srqs,
            &mut self.ready_cqs,
        );
        for &q in &self.moved_qps {
            let owner = self.dev.qp_index(q).and_then(|s| self.owners.qp(s));
            if let Some(Some(h)) = owner.and_then(|o| self.hosts.get(o)) {
                h.publish_qp(&self.dev, q);
            }
        }
        for &s in &self.moved_srqs {
            if let Some(Some(h)) = self.owners.srq(s).and_then(|o| self.hosts.get(o)) {
                h.publish_srq(&self.dev, s);
            }
        }
        for h in self.hosts.iter_mut().flatten() {
            work += h.retry_pending(&mut self.dev);
        }
        for i in 0..self.ready_cqs.len() {
            let cq = self.ready_cqs[i];
            if let Some(Some(h)) = self.owners.cq(cq).and_then(|o| self.hosts.get_mut(o)) {
                work += h.move_completions(&mut self.dev, cq);
            }
        }
        while let Some(ev) = self.dev.poll_event() {
            use roce::verbs::AsyncEvent as E;
            let owner = match ev {
                E::QpFatal(q)
                | E::QpRequestError(q)
                | E::QpAccessError(q)
                | E::QpLastWqeReached(q)
                | E::SqDrained(q) => self.dev.qp_index(q).and_then(|s| self.owners.qp(s)),
                E::SrqLimitReached(s) => self.owners.srq(roce::engine::SrqId(s)),
                E::CqError(c) => self.owners.cq(roce::engine::CqId(c)),
                E::PortActive | E::PortError | E::DeviceFatal => {
                    for h in self.hosts.iter_mut().flatten() {
                        h.deliver_event(&ev);
                    }
                    work += 1;
                    continue;
                }
            };
            if let Some(Some(h)) = owner.and_then(|o| self.hosts.get_mut(o)) {
                h.deliver_event(&ev);
                work += 1;
            }
        }
        work
    }

    /// Mbufs of the transmit pool in use (for leak checks).
    pub fn pool_in_use(&self) -> u32 {
        self.pool.in_use()
    }

    /// One iteration; returns the amount of work done (0 = idle).
    pub fn poll(&mut self, now: u64) -> usize {
        let mut work = 0;
        // 1. Receive.
        if self.rxq.rx_burst(&mut self.rxbuf) > 0 {
            let mut rx = std::mem::take(&mut self.rxbuf);
            work += rx.len();
            for m in rx.drain(..) {
                self.rx_frame(now, &m);
            }
            self.rxbuf = rx;
        }
        // 2. Verbs commands; contexts that closed are dropped.
        for slot in self.hosts.iter_mut() {
            if let Some(h) = slot {
                work += h.process(&mut self.dev, &mut self.owners, 256);
                if h.is_closed() {
                    *slot = None;
                }
            }
        }
        // 3. Timers.
        if self.dev.poll_timeout().is_some_and(|t| t <= now) {
            self.dev.handle_timeout(now);
            work += 1;
        }
        if self.neigh.poll_timeout().is_some_and(|t| t <= now) {
            self.neigh.handle_timeout(now);
            work += 1;
        }
        // 4. Transmit.
        while let Some(f) = self.neigh.poll_frame() {
            self.send_raw(now, &f);
            self.counters.tx_neighbor += 1;
            work += 1;
        }
        if !self.pending.is_empty() {
            self.retry_pending(now);
        }
        let mut budget = TX_BUDGET;
        while budget > 0 && self.dev.poll_transmit(now, &mut self.tx) {
            self.emit(now);
            budget -= 1;
            work += 1;
        }
        self.flush();
        // 5. Queue positions, completions and events.
        work += self.publish();
        work
    }

    fn tap(&mut self, now: u64, segs: &[&[u8]]) {
        if let Some(w) = self.tap.as_mut() {
            let _ = w.write_segments(now, segs);
        }
    }

    fn rx_frame(&mut self, now: u64, m: &Mbuf) {
        self.counters.rx_frames += 1;
        // Segments in place (no copy) for the engine. A frame in more segments than we keep
        // references for, or whose first segment is too short to classify, is linearised.
        let mut segs: [&[u8]; 8] = [&[]; 8];
        let mut n = 0;
        let mut overflow = false;
        for s in m.segments() {
            if n == segs.len() {
                overflow = true;
                break;
            }
            segs[n] = s;
            n += 1;
        }
        if n > 1 {
            self.counters.rx_multiseg += 1;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let linear: [&[u8]; 1];
        let segs: &[&[u8]] = if overflow || (n > 1 && segs[0].len() < 128) {
            scratch.clear();
            for s in m.segments() {
                scratch.extend_from_slice(s);
            }
            linear = [&scratch[..]];
            &linear
        } else {
            &segs[..n]
        };
        if let Some(w) = self.tap.as_mut() {
            let _ = w.write_segments(now, segs);
        }
        let first = segs.first().copied().unwrap_or(&[]);
        if !self.l2_accept(first) {
            self.scratch = scratch;
            return;
        }
        match classify(first) {
            FrameKind::Roce | FrameKind::Cnp => {
                self.counters.rx_roce += 1;
                self.dev.handle_frame_segments(now, segs);
            }
            FrameKind::Pfc => self.counters.rx_pfc += 1,
            FrameKind::Pause => self.counters.rx_pause += 1,
            kind => {
                if is_ipv4_fragment(first) {
                    self.counters.rx_ipv4_fragments += 1;
                } else {
                    // ARP, ICMP and ND are small: a multi-segment one is joined (rare path).
                    let joined;
                    let f = if segs.len() == 1 {
                        first
                    } else {
                        joined = segs.concat();
                        &joined[..]
                    };
                    let consumed = self.neigh.handle_frame(now, f);
                    match (kind, consumed) {
                        (FrameKind::Arp, _) => self.counters.rx_arp += 1,
                        (_, true) => self.counters.rx_icmp += 1,
                        _ => self.counters.rx_other += 1,
                    }
                }
            }
        }
        self.scratch = scratch;
    }

    /// Whether a frame is addressed to this RNIC at layer 2 (a NIC's address filter; the
    /// port itself may run promiscuous because our MAC is a software one): our VLAN - or, on
    /// a port without one, untagged or priority-tagged (VID 0, IEEE 802.1Q) - and our unicast
    /// MAC, broadcast for ARP, the IPv6 groups ND needs (all-nodes, our solicited-node
    /// groups) and the MAC-control group for PFC/PAUSE (01:80:C2:00:00:01). The rest is
    /// counted and dropped.
    fn l2_accept(&mut self, f: &[u8]) -> bool {
        let Ok(eth) = ethernet::Frame::new_checked(f) else {
            self.counters.rx_runts += 1;
            return false;
        };
        let vid = eth.tci().map(|t| t & 0x0fff);
        let vlan_ok = match (self.vlan, vid) {
            (None, None | Some(0)) => true,
            (Some(v), Some(x)) => x == v.vid,
            _ => false,
        };
        if !vlan_ok {
            self.counters.rx_dropped_vlan += 1;
            return false;
        }
        let dst = eth.dst();
        let ok = if dst == self.mac {
            true
        } else if dst == [0xff; 6] {
            eth.ethertype() == ethertype::ARP
        } else if dst[..2] == [0x33, 0x33] {
            eth.ethertype() == ethertype::IPV6 && self.neigh.accepts_multicast(dst)
        } else {
            dst == MAC_CONTROL_GROUP && eth.ethertype() == ethertype::MAC_CONTROL
        };
        if !ok {
            self.counters.rx_dropped_mac += 1;
        }
        ok
    }

    fn send_raw(&mut self, now: u64, frame: &[u8]) {
        let Ok(mut m) = self.pool.alloc() else {
            self.counters.tx_nombuf += 1;
            return;
        };
        if !m.extend_from_slice(frame) {
            self.counters.tx_dropped += 1;
            return;
        }
        self.tap(now, &[frame]);
        self.push_tx(m);
    }

    /// Builds the engine's packet in `self.tx` into an mbuf and queues it.
    fn emit(&mut self, now: u64) {
        let dgid = self.tx.path.dgid;
        let ip = match dgid.to_ipv4() {
            Some(a) => IpAddr::from(a),
            None => IpAddr::V6(dgid.to_ipv6()),
        };
        let resolved = match self.tx.path.dmac {
            Some(m) => Resolve::Mac(m),
            None => self.next_hop(now, dgid, ip),
        };
        if resolved == Resolve::Unreachable {
            self.unreachable(dgid, ip);
            return;
        }
        // DSCP and ECN: the path's traffic class, or the port's defaults (roce.dscp/ecn).
        let mut tc = self.tx.path.traffic_class;
        if tc >> 2 == 0 {
            tc |= self.cfg.dscp << 2;
        }
        if self.cfg.ecn && tc & 3 == 0 {
            tc |= 2; // ECT(0)
        }
        self.tx.path.traffic_class = tc;
        let dst = match resolved {
            Resolve::Mac(m) => m,
            _ => [0; 6],
        };
        self.ident = self.ident.wrapping_add(1);
        let repr = self.tx.frame_repr(self.mac, dst, self.vlan, self.ident);
        let plen = self.tx.payload.len();
        let Ok(total) = repr.frame_len(plen) else {
            return;
        };
        let Ok(mut m) = self.pool.alloc() else {
            self.counters.tx_nombuf += 1;
            return;
        };
        let Some(buf) = m.append(total) else {
            // Larger than an mbuf: the path MTU is configured above what the pool holds.
            self.counters.tx_dropped += 1;
            return;
        };
        let Ok(hlen) = repr.emit_headers(buf, plen) else {
            return;
        };
        if self
            .dev
            .gather(&self.tx, &mut buf[hlen..hlen + plen])
            .is_err()
        {
            // The MR went away while the packet was queued.
            self.counters.tx_dropped += 1;
            return;
        }
        let (head, tail) = buf.split_at_mut(hlen + plen);
        if repr
            .emit_trailer(&head[..hlen], &[&head[hlen..]], tail)
            .is_err()
        {
            return;
        }
        self.counters.tx_roce += 1;
        if resolved == Resolve::Pending {
            if self.pending.len() >= MAX_PENDING {
                self.counters.tx_held_dropped += 1;
                return;
            }
            self.counters.tx_held += 1;
            self.pending.push_back((ip, dgid, m));
            return;
        }
        if self.tap.is_some() {
            let v = m.to_vec();
            self.tap(now, &[&v]);
        }
        self.push_tx(m);
    }

    /// The MAC for the packet in `self.tx`: from its QP's cached next hop while the
    /// neighbour table has not changed since (no table lookup per packet), else resolved and
    /// cached again.
    fn next_hop(&mut self, now: u64, dgid: Gid, ip: IpAddr) -> Resolve {
        let slot = self.dev.qp_index(self.tx.qpn);
        if let Some(h) = slot.and_then(|s| self.hops.get(s)) {
            if h.gen == self.neigh.generation() && h.dgid == dgid {
                return Resolve::Mac(h.mac);
            }
        }
        let r = self.neigh.resolve(now, ip);
        if let (Resolve::Mac(mac), Some(h)) = (r, slot.and_then(|s| self.hops.get_mut(s))) {
            *h = NextHop {
                dgid,
                mac,
                gen: self.neigh.generation(),
            };
        }
        r
    }

    fn unreachable(&mut self, dgid: Gid, ip: IpAddr) {
        self.counters.tx_unresolved += 1;
        let n = self.dev.fail_qps_to(&dgid);
        if n > 0 {
            self.counters.qps_failed_unresolved += n as u64;
            tracing::warn!(
                "{}: no route or no answer for {ip}: {n} QP(s) moved to error",
                self.name
            );
        }
    }

    fn retry_pending(&mut self, now: u64) {
        for _ in 0..self.pending.len() {
            let Some((ip, gid, mut m)) = self.pending.pop_front() else {
                break;
            };
            match self.neigh.resolve(now, ip) {
                Resolve::Mac(mac) => {
                    // The destination MAC is not covered by the ICRC: patch it in place.
                    m.data_mut()[..6].copy_from_slice(&mac);
                    if self.tap.is_some() {
                        let v = m.to_vec();
                        self.tap(now, &[&v]);
                    }
                    self.push_tx(m);
                }
                Resolve::Pending => self.pending.push_back((ip, gid, m)),
                Resolve::Unreachable => {
                    self.counters.tx_held_dropped += 1;
                    self.unreachable(gid, ip);
                }
            }
        }
    }

    fn push_tx(&mut self, m: Mbuf) {
        if let Some(f) = self.fault.as_mut() {
            let c = &mut self.counters;
            if f.rng.chance(f.cfg.loss) {
                c.fault_lost += 1;
                return;
            }
            let mut m = m;
            if f.rng.chance(f.cfg.corrupt) && m.data_len() > 60 && m.is_exclusive() {
                let i = 14 + f.rng.below(m.data_len() as u64 - 14) as usize;
                m.data_mut()[i] ^= 1 << f.rng.below(8);
                c.fault_corrupted += 1;
            }
            if f.rng.chance(f.cfg.duplicate) {
                if let Ok(mut d) = self.pool.alloc() {
                    if d.extend_from_slice(m.data()) {
                        c.fault_duplicated += 1;
                        self.txbuf.push(d);
                    }
                }
            }
            if f.held.is_none() && f.rng.chance(f.cfg.reorder) {
                c.fault_reordered += 1;
                f.held = Some(m);
                return;
            }
            self.txbuf.push(m);
            if let Some(h) = f.held.take() {
                self.txbuf.push(h);
            }
        } else {
            self.txbuf.push(m);
        }
        if self.txbuf.len() >= BURST {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if self.txbuf.is_empty() {
            return;
        }
        let before = self.txbuf.len();
        let bytes: u64 = self.txbuf.iter().map(|m| m.pkt_len() as u64).sum();
        let sent = self.txq.tx_burst(&mut self.txbuf);
        self.counters.tx_frames += sent as u64;
        // Approximate bytes of what went (leftovers are at the front now).
        let left: u64 = self.txbuf.iter().map(|m| m.pkt_len() as u64).sum();
        self.counters.tx_bytes += bytes - left;
        if sent < before {
            self.counters.tx_retried += (before - sent) as u64;
            // Keep the leftovers for the next iteration (l3fwd frees them; RC would then have
            // to retransmit), but bound the backlog.
            while self.txbuf.len() > MAX_TX_BACKLOG {
                self.txbuf.pop();
                self.counters.tx_dropped += 1;
            }
        }
    }

    /// Flushes the capture file.
    pub fn flush_capture(&mut self) {
        if let Some(w) = self.tap.as_mut() {
            let _ = w.flush();
        }
    }
}

fn is_ipv4_fragment(f: &[u8]) -> bool {
    let Ok(eth) = ethernet::Frame::new_checked(f) else {
        return false;
    };
    if eth.ethertype() != ethertype::IPV4 {
        return false;
    }
    let ip = eth.payload();
    ip.len() >= 20 && (u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff) != 0
}

impl Drop for Nic {
    fn drop(&mut self) {
        self.flush_capture();
        // Mbufs still held go back to the pool with the Vecs/queues.
        if let Some(f) = self.fault.as_mut() {
            f.held.take();
        }
    }
}
