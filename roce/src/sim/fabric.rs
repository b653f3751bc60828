//! Several RNICs through one switch, on simulated time: every node is a real [`Device`] (the
//! transport engine with its DCQCN reaction and notification points and its PFC hold), each
//! joined to its own port of a [`dcb::switch::Switch`] (shared buffer, ETS classes, RED/ECN
//! marking, PFC towards the nodes) by a link with a rate and a propagation delay. The switch
//! forwards by destination GID (node `i` is [`node_gid`]`(i)`). Incast, fairness and the
//! queue's behaviour can be measured with the RNIC's own transport, deterministically.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use dcb::pfc::{Mode, PauseFrame, PauseState};
use dcb::switch::{ser_ns, Frame, Switch, SwitchConfig};

use super::{bring_up, endpoint, node_gid, ConnectOpts, Endpoint, Node};
use crate::engine::{Device, DeviceConfig, Transmit};
use crate::types::Psn;
use crate::verbs::Completion;

/// A fabric's shape.
#[derive(Debug, Clone)]
pub struct FabricConfig {
    /// Every node's device (GIDs are filled in per node).
    pub device: DeviceConfig,
    /// Nodes (one switch port each).
    pub nodes: usize,
    /// Rate of every node's link (both directions), Mb/s; the switch's ports run at it.
    pub link_mbps: f64,
    /// Propagation delay of every link, ns.
    pub link_delay: u64,
    /// The switch (its `port_mbps` is set from `link_mbps`).
    pub switch: SwitchConfig,
    /// Nodes mark their data ECN-capable (ECT(0)), as `roce.ecn`.
    pub ect: bool,
    /// Nodes honour the switch's PFC on these priorities (as `[pfc]`); `Mode::Off`: not.
    pub node_pfc: Mode,
    /// Period of the switch queue samples, ns (0: none).
    pub sample_ns: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A frame from node `from` for node `to` reaches the switch.
    ToSwitch {
        from: usize,
        to: usize,
        priority: u8,
        ecn: u8,
        frame: Vec<u8>,
    },
    /// A frame reaches node `to`.
    ToNode { to: usize, frame: Vec<u8> },
    /// A pause frame from the switch reaches node `to` (encoded as on the wire).
    Pause { to: usize, frame: Vec<u8> },
}

/// The fabric.
pub struct Fabric {
    /// The nodes.
    pub nodes: Vec<Node>,
    /// The switch (frames are their bytes).
    pub switch: Switch<(Vec<u8>, usize)>,
    /// Virtual time, ns.
    pub now: u64,
    /// The switch's queued bytes per port, sampled every `sample_ns`: (time, per port).
    pub samples: Vec<(u64, Vec<u64>)>,
    /// Frames the switch dropped.
    pub drops: u64,
    cfg: FabricConfig,
    link_busy: Vec<u64>,
    pause: Vec<PauseState>,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    next_sample: u64,
    tx: Transmit,
    buf: Vec<u8>,
}

impl Fabric {
    /// A fabric as `cfg` says.
    pub fn new(cfg: FabricConfig) -> Fabric {
        let mut sw = cfg.switch.clone();
        sw.port_mbps = vec![cfg.link_mbps; cfg.nodes];
        let switch = Switch::new(sw).expect("switch configuration");
        let nodes = (0..cfg.nodes)
            .map(|i| {
                let mut d = cfg.device.clone();
                d.gids = vec![node_gid(i)];
                Node {
                    dev: Device::new(d),
                    mac: [2, 0, 0, 0x99, 1, i as u8],
                    ip_ident: 0,
                }
            })
            .collect();
        Fabric {
            nodes,
            switch,
            now: 0,
            samples: Vec::new(),
            drops: 0,
            link_busy: vec![0; cfg.nodes],
            pause: (0..cfg.nodes)
                .map(|_| PauseState::new(cfg.node_pfc, cfg.link_mbps as u64))
                .collect(),
            events: BinaryHeap::new(),
            seq: 0,
            next_sample: 0,
            tx: Transmit::default(),
            buf: vec![0; 9216],
            cfg,
        }
    }

    /// Connects a QP on node `a` with one on node `b` (RC or UC per `o`); returns the two
    /// endpoints (each with its own MR).
    pub fn connect(&mut self, a: usize, b: usize, o: &ConnectOpts) -> (Endpoint, Endpoint) {
        let ea = endpoint(&mut self.nodes[a].dev, o, 0x10_0000_0000);
        let eb = endpoint(&mut self.nodes[b].dev, o, 0x20_0000_0000);
        let (pa, pb) = o.psns;
        bring_up(&mut self.nodes[a].dev, &ea, eb.qpn, node_gid(b), o, pa, pb);
        bring_up(&mut self.nodes[b].dev, &eb, ea.qpn, node_gid(a), o, pb, pa);
        let mut ea = ea;
        let mut eb = eb;
        ea.sq_psn = Psn::new(pa);
        eb.sq_psn = Psn::new(pb);
        (ea, eb)
    }

    /// Every completion waiting on `ep`'s CQ of node `n`.
    pub fn cqes(&mut self, n: usize, ep: &Endpoint) -> Vec<Completion> {
        let mut v = Vec::new();
        while let Some(c) = self.nodes[n].dev.poll_completion(ep.cq) {
            v.push(c);
        }
        v
    }

    fn push(&mut self, t: u64, e: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, e)));
    }

    /// The node whose GID is `gid`.
    fn node_of(&self, gid: &crate::types::Gid) -> Option<usize> {
        (0..self.nodes.len()).find(|i| node_gid(*i) == *gid)
    }

    /// Node `i` puts frames on its link while the link is free.
    fn send_node(&mut self, i: usize) -> bool {
        let mut progress = false;
        while self.link_busy[i] <= self.now {
            if !self.nodes[i].dev.poll_transmit(self.now, &mut self.tx) {
                break;
            }
            progress = true;
            // Forwarding by destination GID, known here: the frame need not be parsed again.
            let Some(to) = self.node_of(&self.tx.path.dgid) else {
                self.drops += 1;
                continue;
            };
            let node = &mut self.nodes[i];
            if self.cfg.ect && self.tx.ecn_capable() && self.tx.path.traffic_class & 3 == 0 {
                self.tx.path.traffic_class |= 2;
            }
            let priority = node
                .dev
                .config()
                .priorities
                .priority(self.tx.path.traffic_class, self.tx.path.sl);
            node.ip_ident = node.ip_ident.wrapping_add(1);
            let Ok(n) = node.dev.write_frame(
                &self.tx,
                node.mac,
                [2, 0, 0, 0x99, 0xff, 0],
                None,
                node.ip_ident,
                &mut self.buf,
            ) else {
                continue;
            };
            let frame = self.buf[..n].to_vec();
            let done = self.now.max(self.link_busy[i]) + ser_ns(n as u64, self.cfg.link_mbps);
            self.link_busy[i] = done;
            let ecn = self.tx.path.traffic_class & 3;
            self.push(
                done + self.cfg.link_delay,
                Ev::ToSwitch {
                    from: i,
                    to,
                    priority,
                    ecn,
                    frame,
                },
            );
        }
        progress
    }

    fn deliver(&mut self) -> bool {
        let mut progress = false;
        while let Some(Reverse((t, _, _))) = self.events.peek() {
            if *t > self.now {
                break;
            }
            let Some(Reverse((_, _, ev))) = self.events.pop() else {
                break;
            };
            progress = true;
            match ev {
                Ev::ToSwitch {
                    from,
                    to,
                    priority,
                    ecn,
                    frame,
                } => {
                    let bytes = frame.len() as u64;
                    let f = Frame {
                        data: (frame, to),
                        bytes,
                        priority,
                        ecn,
                    };
                    if self.switch.receive(self.now, from, to, f).is_err() {
                        self.drops += 1;
                    }
                }
                Ev::ToNode { to, frame } => {
                    let now = self.now;
                    self.nodes[to].dev.handle_frame(now, &frame);
                }
                Ev::Pause { to, frame } => {
                    if let Some(f) = PauseFrame::parse(&frame) {
                        self.pause[to].handle_frame(self.now, &f);
                        let mask = self.pause[to].paused_mask(self.now);
                        self.nodes[to].dev.set_paused(mask);
                    }
                }
            }
        }
        progress
    }

    fn run_switch(&mut self) -> bool {
        let mut progress = false;
        if self.switch.poll_timeout().is_some_and(|t| t <= self.now) {
            self.switch.handle_timeout(self.now);
        }
        while let Some((port, f)) = self.switch.poll_control() {
            // Ahead of data: a 64-byte frame on the port's link.
            let t = self.now + ser_ns(64, self.cfg.link_mbps) + self.cfg.link_delay;
            let frame = f.emit([2, 0, 0, 0x99, 0xff, 0]).to_vec();
            self.push(t, Ev::Pause { to: port, frame });
            progress = true;
        }
        while let Some(d) = self.switch.poll_transmit(self.now) {
            let (mut frame, to) = d.data;
            if d.ce {
                crate::wire::frame::mark_ce(&mut frame);
            }
            self.push(d.done + self.cfg.link_delay, Ev::ToNode { to, frame });
            progress = true;
        }
        progress
    }

    fn timers(&mut self) -> bool {
        let mut progress = false;
        for i in 0..self.nodes.len() {
            if self.pause[i].poll_timeout().is_some_and(|t| t <= self.now) {
                self.pause[i].handle_timeout(self.now);
                let mask = self.pause[i].paused_mask(self.now);
                self.nodes[i].dev.set_paused(mask);
                progress = true;
            }
            let now = self.now;
            let dev = &mut self.nodes[i].dev;
            if dev.poll_timeout().is_some_and(|t| t <= now) {
                dev.handle_timeout(now);
                progress = true;
            }
        }
        if self.cfg.sample_ns > 0 && self.now >= self.next_sample {
            let q = (0..self.nodes.len())
                .map(|p| self.switch.queued(p))
                .collect();
            self.samples.push((self.now, q));
            self.next_sample = self.now - self.now % self.cfg.sample_ns + self.cfg.sample_ns;
        }
        progress
    }

    /// Runs until `done` returns true, nothing is left to do, or time would pass
    /// `deadline`; returns whether `done` became true or the fabric went idle.
    pub fn run(&mut self, deadline: u64, done: impl FnMut(&mut Fabric) -> bool) -> bool {
        super::run_until(self, deadline, done)
    }
}

impl super::Stepper for Fabric {
    fn step_now(&mut self) -> bool {
        let mut progress = false;
        for i in 0..self.nodes.len() {
            progress |= self.send_node(i);
        }
        progress |= self.deliver();
        progress |= self.run_switch();
        progress |= self.timers();
        progress
    }

    fn next_at(&mut self) -> Option<u64> {
        let mut next = self.events.peek().map(|Reverse((t, _, _))| *t);
        let mut consider = |t: Option<u64>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        consider(self.switch.poll_timeout());
        for i in 0..self.nodes.len() {
            consider(self.pause[i].poll_timeout());
            consider(self.nodes[i].dev.poll_timeout());
            // A node whose link is busy may have more to send when it frees.
            if self.link_busy[i] > self.now {
                consider(Some(self.link_busy[i]));
            }
        }
        if self.cfg.sample_ns > 0 {
            consider(Some(self.next_sample));
        }
        next
    }

    fn clock(&mut self) -> &mut u64 {
        &mut self.now
    }
}

/// An N:1 incast through the fabric: `senders` nodes each keep 64 KiB RDMA WRITEs going
/// (`depth` outstanding) to one receiver over links of `link_mbps` (1 us each way), every QP on
/// the lossless priority 3, the switch with PFC on it (XOFF 200 KB per ingress port) and,
/// with DCQCN, RED marking scaled to the link (Kmin 100 KB, Kmax 400 KB per 25 Gb/s).
#[derive(Debug, Clone)]
pub struct Incast {
    /// Senders.
    pub senders: usize,
    /// WRITEs each sender keeps outstanding (4 in the published runs; with 16, a sender's
    /// window - 128 packets, 512 KiB - exceeds what an ingress port holds above XOFF, so
    /// only honoured pauses keep the switch from dropping).
    pub depth: u64,
    /// Link rate, Mb/s.
    pub link_mbps: f64,
    /// DCQCN's variant (NP interval: the paper's 50 us, the firmware's 4 us), or none.
    pub dcqcn: Option<dcb::dcqcn::Variant>,
    /// Measure from here, ns.
    pub from: u64,
    /// Run until here, ns.
    pub until: u64,
    /// Sampling period of the time series, ns.
    pub sample_ns: u64,
}

/// What an [`Incast`] measured.
#[derive(Debug, Clone, Default)]
pub struct IncastOutcome {
    /// Goodput per sender over [from, until), Gb/s.
    pub per_sender: Vec<f64>,
    /// Per sample: time (us), each sender's goodput since the last sample (Gb/s), and the
    /// bottleneck queue (bytes).
    pub series: Vec<(f64, Vec<f64>, u64)>,
    /// Frames the switch dropped.
    pub drops: u64,
    /// XOFF frames the switch sent.
    pub xoff: u64,
    /// The bottleneck queue's 99th percentile and peak over [from, until), bytes.
    pub p99: u64,
    /// Peak of the bottleneck queue over the whole run, bytes.
    pub peak: u64,
    /// CNPs the senders' QPs took.
    pub cnps: u64,
    /// Kmax of the marking (0 without DCQCN).
    pub kmax: u64,
}

impl IncastOutcome {
    /// Sum of the senders' goodput, Gb/s.
    pub fn aggregate(&self) -> f64 {
        self.per_sender.iter().sum()
    }

    /// Jain's fairness index of the senders' goodput.
    pub fn jain(&self) -> f64 {
        let x = &self.per_sender;
        let s: f64 = x.iter().sum();
        let q: f64 = x.iter().map(|v| v * v).sum();
        if q == 0.0 {
            return 0.0;
        }
        s * s / (x.len() as f64 * q)
    }
}

/// Runs an incast.
pub fn incast(s: &Incast) -> IncastOutcome {
    use crate::engine::cc::CongestionConfig;
    use crate::engine::PriorityMap;
    use crate::verbs::{Mtu, SendFlags, SendWr, WcStatus, WrOp};
    use dcb::dcqcn::{RpParams, Variant};
    const MSG: u32 = 64 * 1024;
    let cc = match s.dcqcn {
        Some(Variant::Paper) => CongestionConfig {
            rp: Some(RpParams::paper(s.link_mbps)),
            np_min_interval_ns: Some(50_000),
            ..Default::default()
        },
        Some(Variant::Firmware) => CongestionConfig {
            rp: Some(RpParams::firmware(s.link_mbps)),
            np_min_interval_ns: Some(4_000),
            ..Default::default()
        },
        None => CongestionConfig::default(),
    };
    let red = s.dcqcn.map(|_| dcb::ecn::Red::scaled(s.link_mbps / 1000.0));
    let cfg = FabricConfig {
        device: DeviceConfig {
            port_mtu: Mtu::M4096,
            cc,
            // Every QP on priority 3 (as roce.pcp = 3); CNPs on 6.
            priorities: PriorityMap {
                default_pcp: 3,
                ..Default::default()
            },
            ..Default::default()
        },
        nodes: s.senders + 1,
        link_mbps: s.link_mbps,
        link_delay: 1_000,
        switch: SwitchConfig {
            port_mbps: Vec::new(),
            buffer: 8 << 20,
            red,
            pfc: Mode::Pfc { enabled: 1 << 3 },
            // XOFF well above each sender's share of Kmax, so ECN acts before PFC does.
            thresholds: dcb::pfc::Thresholds {
                xoff: 200_000,
                xon: 200_000 - 2 * 4200,
            },
            headroom: SwitchConfig::headroom_for(s.link_mbps, 1_000, 4096),
            ets: dcb::ets::EtsConfig::roce_default(),
            seed: 5,
        },
        ect: true,
        node_pfc: Mode::Pfc { enabled: 1 << 3 },
        sample_ns: s.sample_ns.max(1_000),
    };
    let mut f = Fabric::new(cfg);
    let o = ConnectOpts {
        mtu: Mtu::M4096,
        mem_len: s.depth.max(1) as usize * 2 * MSG as usize,
        depth: 16,
        timeout: 14,
        ..Default::default()
    };
    let rx = s.senders;
    let eps: Vec<_> = (0..s.senders).map(|n| f.connect(n, rx, &o)).collect();
    let mut posted = vec![0u64; s.senders];
    let mut seq = vec![0u64; s.senders];
    let mut done = vec![0u64; s.senders];
    let mut bytes = vec![0u64; s.senders];
    let mut out = IncastOutcome::default();
    let step = s.sample_ns.max(1_000);
    let mut last = (0u64, vec![0u64; s.senders]);
    while f.now < s.until {
        for (n, (a, b)) in eps.iter().enumerate() {
            for c in f.cqes(n, a) {
                assert_eq!(c.status, WcStatus::Success, "sender {n}: {c:?}");
                posted[n] -= 1;
                done[n] += MSG as u64;
                if f.now >= s.from {
                    bytes[n] += MSG as u64;
                }
            }
            while posted[n] < s.depth.max(1) {
                let off = (seq[n] % (2 * s.depth.max(1))) * MSG as u64;
                seq[n] += 1;
                f.nodes[n]
                    .dev
                    .post_send(
                        a.qpn,
                        &SendWr {
                            wr_id: 1,
                            op: WrOp::Write {
                                remote_addr: b.addr + off,
                                rkey: b.rkey,
                            },
                            sg_list: &[a.sge(off, MSG)],
                            flags: SendFlags::SIGNALED,
                            ud: None,
                        },
                    )
                    .expect("post_send");
                posted[n] += 1;
            }
        }
        if f.now >= last.0 + step {
            let dt = (f.now - last.0) as f64;
            let g = (0..s.senders)
                .map(|n| (done[n] - last.1[n]) as f64 * 8.0 / dt)
                .collect();
            out.series
                .push((f.now as f64 / 1000.0, g, f.switch.queued(rx)));
            last = (f.now, done.clone());
        }
        let until = (f.now + step.min(50_000)).min(s.until);
        f.run(until, |_| false);
        f.now = f.now.max(until);
    }
    let secs = s.until.saturating_sub(s.from).max(1) as f64 / 1e9;
    let mut q: Vec<u64> = f
        .samples
        .iter()
        .filter(|(t, _)| *t >= s.from)
        .map(|(_, ports)| ports[rx])
        .collect();
    q.sort_unstable();
    out.per_sender = bytes.iter().map(|b| *b as f64 * 8.0 / secs / 1e9).collect();
    out.drops = f.drops;
    out.xoff = f.switch.counters.pfc_xoff;
    out.p99 = q.get(q.len() * 99 / 100).copied().unwrap_or(0);
    out.peak = f.switch.counters.peak_queue[rx];
    out.cnps = (0..s.senders)
        .filter_map(|n| f.nodes[n].dev.qp_counters(eps[n].0.qpn))
        .map(|c| c.rp_cnp_handled)
        .sum();
    out.kmax = red.map_or(0, |r| r.kmax);
    out
}
