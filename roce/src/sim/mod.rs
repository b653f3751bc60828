//! A deterministic two-node simulator (quinn-proto's test `Pair`): two [`Device`]s joined by
//! a link with bandwidth, delay and seeded faults (loss, reordering, duplication, corruption,
//! and a peer that ACKs only every Nth time), on a virtual clock that jumps to the next event.
//! Sessions can be dumped to pcap for tshark and `rnic-pcap`.

pub mod fabric;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use crate::engine::{CqId, Device, DeviceConfig, QpInit, Transmit};
use crate::memory::{HeapMemory, PdId};
use crate::types::{Gid, Lkey, Psn, Qkey, Qpn, Rkey};
use crate::verbs::{
    Access, AddressVector, Completion, Mtu, QpAttr, QpCaps, QpState, QpType, RecvWr, SendFlags,
    SendWr, Sge, WcStatus, WrOp,
};
use crate::wire::opcode::Opcode;

/// A small, fast, seeded PRNG (SplitMix64).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeded generator.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15)
    }

    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

/// Link model of one direction.
#[derive(Debug, Clone, Copy)]
pub struct LinkConfig {
    /// Bits per second.
    pub bandwidth_bps: u64,
    /// Propagation delay in ns.
    pub delay_ns: u64,
    /// Probability a frame is lost.
    pub loss: f64,
    /// Probability a frame is delayed by up to `reorder_ns` extra (so later frames pass it).
    pub reorder: f64,
    /// Extra delay of reordered frames, at most.
    pub reorder_ns: u64,
    /// Probability a frame is delivered twice.
    pub duplicate: f64,
    /// Probability one byte of a frame is flipped (the ICRC then drops it).
    pub corrupt: f64,
    /// Deliver only every Nth positive ACK (0 or 1 = all): a peer that coalesces ACKs.
    pub ack_every: u32,
}

impl Default for LinkConfig {
    fn default() -> Self {
        LinkConfig {
            bandwidth_bps: 100_000_000_000,
            delay_ns: 1_000,
            loss: 0.0,
            reorder: 0.0,
            reorder_ns: 5_000,
            duplicate: 0.0,
            corrupt: 0.0,
            ack_every: 0,
        }
    }
}

impl LinkConfig {
    /// A lossless link of `gbps` with `delay_ns` of propagation delay.
    pub fn lossless(gbps: u64, delay_ns: u64) -> LinkConfig {
        LinkConfig {
            bandwidth_bps: gbps * 1_000_000_000,
            delay_ns,
            ..Default::default()
        }
    }

    /// The same link with each fault at probability `p`.
    pub fn faulty(mut self, p: f64) -> LinkConfig {
        self.loss = p;
        self.reorder = p;
        self.duplicate = p;
        self.corrupt = p;
        self
    }
}

/// Frame statistics of one direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames put on the link.
    pub sent: u64,
    /// Bytes put on the link.
    pub bytes: u64,
    /// Frames lost.
    pub lost: u64,
    /// Frames delivered late (reordered).
    pub reordered: u64,
    /// Frames duplicated.
    pub duplicated: u64,
    /// Frames corrupted.
    pub corrupted: u64,
    /// ACKs suppressed by the coalescing peer mode.
    pub acks_suppressed: u64,
}

struct Link {
    cfg: LinkConfig,
    busy_until: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Vec<u8>)>>,
    seq: u64,
    acks_seen: u64,
    stats: LinkStats,
}

/// One simulated RNIC: its engine, MAC and a heap memory region for tests.
pub struct Node {
    /// The engine.
    pub dev: Device,
    /// MAC address.
    pub mac: [u8; 6],
    ip_ident: u16,
}

/// Two devices joined by a simulated link; `now` is virtual time in ns.
pub struct Pair {
    /// Node A.
    pub a: Node,
    /// Node B.
    pub b: Node,
    /// Virtual time (ns).
    pub now: u64,
    links: [Link; 2],
    rng: Rng,
    pcap: Option<crate::pcap::Writer<std::io::BufWriter<std::fs::File>>>,
    tx: Transmit,
    buf: Vec<u8>,
    pending: [bool; 2],
    /// Every frame put on a link, as (direction, time, bytes), when `record` is set.
    pub recorded: Vec<(usize, u64, Vec<u8>)>,
    /// Record frames into `recorded`.
    pub record: bool,
    /// Frames for which this returns true are dropped on the link (after recording).
    #[allow(clippy::type_complexity)]
    pub drop_if: Option<Box<dyn FnMut(usize, &crate::wire::frame::ParsedFrame) -> bool>>,
    /// Mark packets that carry data ECN-capable (ECT(0)), as the dataplane's `roce.ecn`.
    pub ect: bool,
    /// ECN-capable frames for which this returns true (given the direction and the time)
    /// get CE on the link, as a congested switch marks them (the ICRC does not cover the
    /// ECN bits; the IPv4 checksum is updated).
    #[allow(clippy::type_complexity)]
    pub mark_ce_if: Option<Box<dyn FnMut(usize, u64, &crate::wire::frame::ParsedFrame) -> bool>>,
}

/// The GID of node `i` (0 = A: 10.99.0.3, 1 = B: 10.99.0.4, IPv4-mapped).
pub fn node_gid(i: usize) -> Gid {
    Gid::from_ipv4([10, 99, 0, 3 + i as u8])
}

impl Pair {
    /// Two devices with the given configurations (their GID tables are filled in if empty)
    /// joined by `link` in both directions, with a seeded RNG for the faults.
    pub fn new(
        mut cfg_a: DeviceConfig,
        mut cfg_b: DeviceConfig,
        link: LinkConfig,
        seed: u64,
    ) -> Pair {
        if cfg_a.gids.is_empty() {
            cfg_a.gids = vec![node_gid(0)];
        }
        if cfg_b.gids.is_empty() {
            cfg_b.gids = vec![node_gid(1)];
        }
        let mk = |cfg| Link {
            cfg,
            busy_until: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            acks_seen: 0,
            stats: LinkStats::default(),
        };
        Pair {
            a: Node {
                dev: Device::new(cfg_a),
                mac: [2, 0, 0, 0x99, 0, 3],
                ip_ident: 0,
            },
            b: Node {
                dev: Device::new(cfg_b),
                mac: [2, 0, 0, 0x99, 0, 4],
                ip_ident: 0,
            },
            now: 0,
            links: [mk(link), mk(link)],
            rng: Rng::new(seed),
            pcap: None,
            tx: Transmit::default(),
            buf: vec![0u8; 9216],
            pending: [true, true],
            recorded: Vec::new(),
            record: false,
            drop_if: None,
            ect: false,
            mark_ce_if: None,
        }
    }

    /// A pair with default devices on a lossless 100 Gb/s, 1 us link.
    pub fn lossless() -> Pair {
        Pair::new(
            DeviceConfig::default(),
            DeviceConfig::default(),
            LinkConfig::default(),
            1,
        )
    }

    /// Writes every frame put on either link to a pcap file.
    pub fn capture(&mut self, path: &std::path::Path) -> std::io::Result<()> {
        let f = std::io::BufWriter::new(std::fs::File::create(path)?);
        self.pcap = Some(crate::pcap::Writer::new(f)?);
        Ok(())
    }

    /// Replaces the link model of direction `from` (0 = A->B, 1 = B->A).
    pub fn set_link(&mut self, from: usize, cfg: LinkConfig) {
        self.links[from].cfg = cfg;
    }

    /// Delivers a frame to node `to` now, as if it came off the wire.
    pub fn inject(&mut self, to: usize, frame: &[u8]) {
        let now = self.now;
        self.node(to).dev.handle_frame(now, frame);
        self.pending[to] = true;
    }

    /// Builds a frame from node `from` to the other node carrying `transport` and `payload`
    /// (for tests that craft packets).
    pub fn craft(
        &self,
        from: usize,
        transport: crate::wire::frame::TransportRepr,
        payload: &[u8],
    ) -> Vec<u8> {
        let (src, dst) = if from == 0 {
            (&self.a, &self.b)
        } else {
            (&self.b, &self.a)
        };
        let mut tx = Transmit {
            transport,
            ..Default::default()
        };
        tx.path.sgid = src.dev.gids()[0];
        tx.path.dgid = dst.dev.gids()[0];
        let repr = tx.frame_repr(src.mac, dst.mac, None, 1);
        let mut buf = vec![0u8; repr.frame_len(payload.len()).expect("known opcode")];
        repr.emit(&mut buf, payload).expect("fits");
        buf
    }

    /// Parsed frames recorded in direction `from` (see `record`).
    pub fn recorded_frames(&self, from: usize) -> Vec<crate::wire::frame::ParsedFrame> {
        self.recorded
            .iter()
            .filter(|(s, _, _)| *s == from)
            .filter_map(|(_, _, f)| crate::wire::frame::parse(f).ok())
            .collect()
    }

    /// Statistics of direction `from`.
    pub fn link_stats(&self, from: usize) -> LinkStats {
        self.links[from].stats
    }

    /// Node `i` (0 = A).
    pub fn node(&mut self, i: usize) -> &mut Node {
        if i == 0 {
            &mut self.a
        } else {
            &mut self.b
        }
    }

    fn send_side(&mut self, side: usize) -> bool {
        let mut progress = false;
        loop {
            if self.links[side].busy_until > self.now {
                self.pending[side] = true;
                return progress;
            }
            let (node, peer_mac) = if side == 0 {
                (&mut self.a, self.b.mac)
            } else {
                (&mut self.b, self.a.mac)
            };
            if !node.dev.poll_transmit(self.now, &mut self.tx) {
                self.pending[side] = false;
                return progress;
            }
            progress = true;
            if self.ect && self.tx.ecn_capable() && self.tx.path.traffic_class & 3 == 0 {
                self.tx.path.traffic_class |= 2;
            }
            node.ip_ident = node.ip_ident.wrapping_add(1);
            let n = match node.dev.write_frame(
                &self.tx,
                node.mac,
                peer_mac,
                None,
                node.ip_ident,
                &mut self.buf,
            ) {
                Ok(n) => n,
                Err(_) => continue, // MR gone: the dataplane would drop it too
            };
            let frame = self.buf[..n].to_vec();
            let is_ack = self.tx.transport.bth.opcode == Opcode::RC_ACK
                && self.tx.transport.ext.aeth.is_some_and(|a| a.is_ack());
            self.put_on_link(side, frame, is_ack);
        }
    }

    fn put_on_link(&mut self, side: usize, mut frame: Vec<u8>, is_ack: bool) {
        let now = self.now;
        if let Some(w) = self.pcap.as_mut() {
            let _ = w.write(now, &frame);
        }
        if self.record {
            self.recorded.push((side, now, frame.clone()));
        }
        if let Some(f) = self.drop_if.as_mut() {
            if let Ok(p) = crate::wire::frame::parse(&frame) {
                if f(side, &p) {
                    self.links[side].stats.lost += 1;
                    return;
                }
            }
        }
        if let Some(f) = self.mark_ce_if.as_mut() {
            if let Ok(p) = crate::wire::frame::parse(&frame) {
                if p.repr.ip.ecn() != crate::wire::ipv4::Ecn::NotEct && f(side, now, &p) {
                    crate::wire::frame::mark_ce(&mut frame);
                }
            }
        }
        let l = &mut self.links[side];
        let ser = (frame.len() as u64 * 8 * 1_000_000_000).div_ceil(l.cfg.bandwidth_bps.max(1));
        l.busy_until = l.busy_until.max(now) + ser;
        l.stats.sent += 1;
        l.stats.bytes += frame.len() as u64;
        if is_ack && l.cfg.ack_every > 1 {
            l.acks_seen += 1;
            if !l.acks_seen.is_multiple_of(l.cfg.ack_every as u64) {
                l.stats.acks_suppressed += 1;
                return;
            }
        }
        if self.rng.chance(l.cfg.loss) {
            l.stats.lost += 1;
            return;
        }
        if self.rng.chance(l.cfg.corrupt) {
            let i = 14 + self.rng.below(frame.len() as u64 - 14) as usize;
            frame[i] ^= 1 << self.rng.below(8);
            l.stats.corrupted += 1;
        }
        let mut at = l.busy_until + l.cfg.delay_ns;
        if self.rng.chance(l.cfg.reorder) {
            at += 1 + self.rng.below(l.cfg.reorder_ns.max(1));
            l.stats.reordered += 1;
        }
        if self.rng.chance(l.cfg.duplicate) {
            l.stats.duplicated += 1;
            l.seq += 1;
            l.queue.push(Reverse((at + 1, l.seq, frame.clone())));
        }
        l.seq += 1;
        l.queue.push(Reverse((at, l.seq, frame)));
    }

    fn deliver(&mut self) -> bool {
        let mut progress = false;
        for side in 0..2 {
            while let Some(Reverse((t, _, _))) = self.links[side].queue.peek() {
                if *t > self.now {
                    break;
                }
                let Reverse((_, _, frame)) = self.links[side].queue.pop().expect("peeked");
                let dst = if side == 0 { &mut self.b } else { &mut self.a };
                dst.dev.handle_frame(self.now, &frame);
                self.pending[1 - side] = true;
                progress = true;
            }
        }
        progress
    }

    fn timeouts(&mut self) -> bool {
        let mut progress = false;
        for side in 0..2 {
            let node = if side == 0 { &mut self.a } else { &mut self.b };
            if let Some(t) = node.dev.poll_timeout() {
                if t <= self.now {
                    node.dev.handle_timeout(self.now);
                    self.pending[side] = true;
                    progress = true;
                }
            }
        }
        progress
    }

    /// Runs until nothing is left to do or `now` would pass `deadline`. Returns whether the
    /// simulation went idle (as opposed to hitting the deadline).
    pub fn run_until_idle(&mut self, deadline: u64) -> bool {
        self.run(deadline, |_| false)
    }

    /// Runs until `done` returns true, the simulation is idle, or `deadline`. Returns true if
    /// `done` became true or the simulation went idle.
    pub fn run(&mut self, deadline: u64, done: impl FnMut(&mut Pair) -> bool) -> bool {
        run_until(self, deadline, done)
    }
}

impl Stepper for Pair {
    fn step_now(&mut self) -> bool {
        let mut progress = self.send_side(0);
        progress |= self.send_side(1);
        progress |= self.deliver();
        progress |= self.timeouts();
        progress
    }

    fn next_at(&mut self) -> Option<u64> {
        let mut next: Option<u64> = None;
        let mut consider = |t: u64| next = Some(next.map_or(t, |n: u64| n.min(t)));
        for side in 0..2 {
            if let Some(Reverse((t, _, _))) = self.links[side].queue.peek() {
                consider(*t);
            }
            if self.pending[side] && self.links[side].busy_until > self.now {
                consider(self.links[side].busy_until);
            }
        }
        for t in [self.a.dev.poll_timeout(), self.b.dev.poll_timeout()]
            .into_iter()
            .flatten()
        {
            consider(t);
        }
        next
    }

    fn clock(&mut self) -> &mut u64 {
        &mut self.now
    }
}

/// A discrete-event simulation on a virtual clock, driven by [`run_until`].
pub(crate) trait Stepper {
    /// Does everything due at the current time; returns whether anything happened.
    fn step_now(&mut self) -> bool;
    /// The time of the next pending event, if there is one.
    fn next_at(&mut self) -> Option<u64>;
    /// The virtual clock (ns).
    fn clock(&mut self) -> &mut u64;
}

/// Steps `sim` until `done` returns true, nothing is pending, or the next event lies past
/// `deadline`; the clock jumps from event to event. Returns false only for the deadline.
pub(crate) fn run_until<S: Stepper>(
    sim: &mut S,
    deadline: u64,
    mut done: impl FnMut(&mut S) -> bool,
) -> bool {
    loop {
        if done(sim) {
            return true;
        }
        if sim.step_now() {
            continue;
        }
        match sim.next_at() {
            Some(t) if t <= deadline => {
                let now = sim.clock();
                *now = (*now).max(t);
            }
            Some(_) => return false,
            None => return true,
        }
    }
}

/// A connected test endpoint: PD, CQ, QP and a registered memory region.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Protection domain.
    pub pd: PdId,
    /// Send and receive CQ.
    pub cq: CqId,
    /// QP number.
    pub qpn: Qpn,
    /// Backing memory of the MR.
    pub mem: Arc<HeapMemory>,
    /// MR address as the peer sees it.
    pub addr: u64,
    /// Local key.
    pub lkey: Lkey,
    /// Remote key.
    pub rkey: Rkey,
    /// Starting PSN of its send queue.
    pub sq_psn: Psn,
}

impl Endpoint {
    /// An SGE of `len` bytes at `off` in this endpoint's MR.
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: self.addr + off,
            length: len,
            lkey: self.lkey,
        }
    }

    /// An RDMA WRITE (posted by the peer) to `off` in this endpoint's MR, with its rkey.
    pub fn write_to(&self, off: u64) -> WrOp {
        WrOp::Write {
            remote_addr: self.addr + off,
            rkey: self.rkey,
        }
    }

    /// An RDMA READ (posted by the peer) of `off` in this endpoint's MR, with its rkey.
    pub fn read_from(&self, off: u64) -> WrOp {
        WrOp::Read {
            remote_addr: self.addr + off,
            rkey: self.rkey,
        }
    }

    /// The same PD, CQ and MR with another QP (a second QP of the same consumer).
    pub fn with_qp(&self, qpn: Qpn) -> Endpoint {
        Endpoint {
            qpn,
            ..self.clone()
        }
    }
}

impl Pair {
    /// Posts a signaled send WR on `ep` (a QP of node `side`); panics if refused.
    pub fn post(&mut self, side: usize, ep: &Endpoint, wr_id: u64, op: WrOp, sges: &[Sge]) {
        self.post_flags(side, ep, wr_id, op, sges, SendFlags::SIGNALED);
    }

    /// Posts a send WR with explicit flags; panics if refused.
    pub fn post_flags(
        &mut self,
        side: usize,
        ep: &Endpoint,
        wr_id: u64,
        op: WrOp,
        sges: &[Sge],
        flags: SendFlags,
    ) {
        self.node(side)
            .dev
            .post_send(
                ep.qpn,
                &SendWr {
                    wr_id,
                    op,
                    sg_list: sges,
                    flags,
                    ud: None,
                },
            )
            .expect("post_send");
    }

    /// Posts a receive WR; panics if refused.
    pub fn recv(&mut self, side: usize, ep: &Endpoint, wr_id: u64, sges: &[Sge]) {
        self.node(side)
            .dev
            .post_recv(
                ep.qpn,
                &RecvWr {
                    wr_id,
                    sg_list: sges,
                },
            )
            .expect("post_recv");
    }

    /// Every completion waiting on `ep`'s CQ.
    pub fn cqes(&mut self, side: usize, ep: &Endpoint) -> Vec<Completion> {
        let mut v = Vec::new();
        while let Some(c) = self.node(side).dev.poll_completion(ep.cq) {
            v.push(c);
        }
        v
    }

    /// (PSN, syndrome) of every NAK and RNR NAK recorded in direction `from`.
    pub fn naks(&self, from: usize) -> Vec<(Psn, u8)> {
        self.recorded_frames(from)
            .iter()
            .filter_map(|f| {
                let a = f.repr.transport.ext.aeth?;
                (f.repr.transport.bth.opcode == Opcode::RC_ACK && !a.is_ack())
                    .then_some((f.repr.transport.bth.psn, a.syndrome))
            })
            .collect()
    }

    /// The state of `ep`'s QP on node `side`.
    pub fn qp_state(&self, side: usize, ep: &Endpoint) -> QpState {
        let dev = if side == 0 { &self.a.dev } else { &self.b.dev };
        dev.query_qp(ep.qpn).expect("QP exists").state
    }

    /// Moves `ep`'s QP on node `side` to `state` (a modify of the state alone); panics if
    /// refused.
    pub fn set_qp_state(&mut self, side: usize, ep: &Endpoint, state: QpState) {
        let attr = QpAttr {
            state: Some(state),
            ..Default::default()
        };
        self.node(side)
            .dev
            .modify_qp(ep.qpn, &attr)
            .expect("modify_qp");
    }

    /// The first frame recorded in direction `from` (see `record`), as sent; panics if none.
    pub fn first_frame(&self, from: usize) -> Vec<u8> {
        let (_, _, f) = self
            .recorded
            .iter()
            .find(|(s, _, _)| *s == from)
            .expect("a frame recorded in that direction");
        f.clone()
    }

    /// Writes `data` at the start of A's MR, sends it with a signaled RDMA WRITE from `a` (a
    /// QP of node A) to `addr` under `rkey`, runs until idle and returns the status of the
    /// last completion on `a`'s CQ (the WRITE's).
    pub fn write_status(&mut self, a: &Endpoint, addr: u64, rkey: Rkey, data: &[u8]) -> WcStatus {
        crate::memory::Memory::write(&*a.mem, 0, data).expect("fits A's MR");
        let op = WrOp::Write {
            remote_addr: addr,
            rkey,
        };
        self.post(0, a, 1, op, &[a.sge(0, data.len() as u32)]);
        self.run_until_idle(1_000_000_000);
        self.cqes(0, a).last().expect("a completion").status
    }
}

/// Options for [`connect`].
#[derive(Debug, Clone, Copy)]
pub struct ConnectOpts {
    /// Transport.
    pub qp_type: QpType,
    /// Path MTU.
    pub mtu: Mtu,
    /// Size of each side's MR.
    pub mem_len: usize,
    /// Starting PSNs (A's send PSN, B's send PSN).
    pub psns: (u32, u32),
    /// Queue depths.
    pub depth: u32,
    /// Local ACK timeout exponent.
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// RNR timer code the responder sends.
    pub min_rnr_timer: u8,
    /// Outstanding READ/ATOMIC.
    pub rd_atomic: u8,
    /// SGEs per WR.
    pub max_sge: u32,
    /// Inline bytes per WR.
    pub max_inline: u32,
    /// QP access flags.
    pub access: Access,
    /// Source GID index of the path.
    pub sgid_index: u8,
    /// Service level of the path (its 802.1p priority).
    pub sl: u8,
}

impl Default for ConnectOpts {
    fn default() -> Self {
        ConnectOpts {
            qp_type: QpType::Rc,
            mtu: Mtu::M1024,
            mem_len: 1 << 20,
            psns: (0x100, 0x200),
            depth: 256,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            rd_atomic: 16,
            max_sge: 4,
            max_inline: 0,
            access: Access::LOCAL_WRITE
                | Access::REMOTE_WRITE
                | Access::REMOTE_READ
                | Access::REMOTE_ATOMIC,
            sgid_index: 0,
            sl: 0,
        }
    }
}

/// Creates a PD, CQ, QP and a registered heap MR at `base` on `dev` (not yet connected).
pub fn endpoint(dev: &mut Device, o: &ConnectOpts, base: u64) -> Endpoint {
    let pd = dev.alloc_pd().expect("pd");
    let cq = dev.create_cq(o.depth * 4).expect("cq");
    let qpn = dev
        .create_qp(&QpInit {
            qp_type: o.qp_type,
            caps: QpCaps {
                max_send_wr: o.depth,
                max_recv_wr: o.depth,
                max_send_sge: o.max_sge,
                max_recv_sge: o.max_sge,
                max_inline_data: o.max_inline,
            },
            ..QpInit::rc(pd, cq)
        })
        .expect("qp");
    let mem = HeapMemory::shared(o.mem_len);
    let (lkey, rkey) = dev
        .reg_mr(
            pd,
            mem.clone(),
            0,
            base,
            o.mem_len as u64,
            o.access | Access::LOCAL_WRITE,
        )
        .expect("mr");
    Endpoint {
        pd,
        cq,
        qpn,
        mem,
        addr: base,
        lkey,
        rkey: rkey.unwrap_or(Rkey(lkey.0)),
        sq_psn: Psn::new(0),
    }
}

/// One connected pair of QPs (A's, B's) per service level in `sls`, set up by `o` with its
/// `sl` replaced (for tests of classes sharing a link), each with its own memory range.
pub fn connect_per_sl(p: &mut Pair, o: &ConnectOpts, sls: &[u8]) -> Vec<(Endpoint, Endpoint)> {
    sls.iter()
        .enumerate()
        .map(|(i, &sl)| {
            let o = ConnectOpts { sl, ..*o };
            let base = 0x10_0000_0000 * (i as u64 + 1);
            let a = endpoint(&mut p.a.dev, &o, base);
            let b = endpoint(&mut p.b.dev, &o, base + 0x100_0000_0000);
            bring_up(&mut p.a.dev, &a, b.qpn, node_gid(1), &o, 0x10, 0x20);
            bring_up(&mut p.b.dev, &b, a.qpn, node_gid(0), &o, 0x20, 0x10);
            (a, b)
        })
        .collect()
}

/// Brings a QP from RESET to RTS towards `peer` (the usual verbs sequence).
pub fn bring_up(
    dev: &mut Device,
    me: &Endpoint,
    peer_qpn: Qpn,
    peer_gid: Gid,
    o: &ConnectOpts,
    sq_psn: u32,
    rq_psn: u32,
) {
    let init = match o.qp_type {
        QpType::Ud => QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            qkey: Some(Qkey(0x1111_1111)),
            ..Default::default()
        },
        _ => QpAttr {
            state: Some(QpState::Init),
            pkey_index: Some(0),
            port: Some(1),
            access: Some(o.access),
            ..Default::default()
        },
    };
    dev.modify_qp(me.qpn, &init).expect("INIT");
    // UC and RC take the path to the peer; RC also its responder resources and RNR timer.
    let connected = QpAttr {
        state: Some(QpState::Rtr),
        av: Some(AddressVector {
            sl: o.sl,
            ..AddressVector::new(peer_gid, o.sgid_index)
        }),
        path_mtu: Some(o.mtu),
        dest_qp: Some(peer_qpn),
        rq_psn: Some(Psn::new(rq_psn)),
        ..Default::default()
    };
    let rtr = match o.qp_type {
        QpType::Rc => QpAttr {
            max_dest_rd_atomic: Some(o.rd_atomic),
            min_rnr_timer: Some(o.min_rnr_timer),
            ..connected
        },
        QpType::Uc => connected,
        QpType::Ud => QpAttr {
            state: Some(QpState::Rtr),
            ..Default::default()
        },
    };
    dev.modify_qp(me.qpn, &rtr).expect("RTR");
    let rts = match o.qp_type {
        QpType::Rc => QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(sq_psn)),
            timeout: Some(o.timeout),
            retry_cnt: Some(o.retry_cnt),
            rnr_retry: Some(o.rnr_retry),
            max_rd_atomic: Some(o.rd_atomic),
            ..Default::default()
        },
        _ => QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(Psn::new(sq_psn)),
            ..Default::default()
        },
    };
    dev.modify_qp(me.qpn, &rts).expect("RTS");
}

/// Creates an endpoint on each node and connects them (A's MR at 0x10_0000_0000, B's at
/// 0x20_0000_0000).
pub fn connect(pair: &mut Pair, o: &ConnectOpts) -> (Endpoint, Endpoint) {
    connect_each(pair, o, o)
}

/// [`connect`] with A set up by `oa` and B by `ob` (for tests of peers that disagree, such as
/// on the path MTU); the starting PSNs are `oa`'s.
pub fn connect_each(pair: &mut Pair, oa: &ConnectOpts, ob: &ConnectOpts) -> (Endpoint, Endpoint) {
    let mut a = endpoint(&mut pair.a.dev, oa, 0x10_0000_0000);
    let mut b = endpoint(&mut pair.b.dev, ob, 0x20_0000_0000);
    let (pa, pb) = oa.psns;
    a.sq_psn = Psn::new(pa);
    b.sq_psn = Psn::new(pb);
    bring_up(&mut pair.a.dev, &a, b.qpn, node_gid(1), oa, pa, pb);
    bring_up(&mut pair.b.dev, &b, a.qpn, node_gid(0), ob, pb, pa);
    (a, b)
}

/// Drains every completion of `cq`.
pub fn drain_cq(dev: &mut Device, cq: CqId, out: &mut VecDeque<Completion>) {
    while let Some(c) = dev.poll_completion(cq) {
        out.push_back(c);
    }
}

pub mod traffic;
