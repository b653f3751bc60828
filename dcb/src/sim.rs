//! A packet-level fabric simulator on simulated time: senders -> one switch -> receivers,
//! deterministic and seeded, built from this crate's own state machines, so what is simulated
//! is what the dataplane runs:
//!
//! - each sender NIC has one link to the switch (rate, propagation delay) and any number of
//!   long-lived flows; per flow a DCQCN reaction point ([`Rp`]) sets a pacer ([`Pacer`]); the
//!   flows take turns on the link; the link honours PFC from the switch ([`PauseState`]);
//! - the switch has one egress queue per output port (RoCE traffic, one lossless priority),
//!   a shared buffer, RED/ECN marking at dequeue on the bytes queued ([`Marker`]), and PFC per
//!   ingress port ([`Ingress`]: XOFF/XON on the bytes that port has in the switch, with
//!   headroom for what is in flight);
//! - each receiver NIC counts what arrives and, as notification point ([`Np`]), returns a
//!   CNP for CE-marked packets, which reaches the sender after the two links' delays (CNPs
//!   travel strict priority, modelled as never queued).
//!
//! Flows are a lighter model than roce's QPs: an endless backlog of MTU packets, no ACKs or
//! retransmission (a drop is counted and lost). This is the model the DCQCN paper's fluid and
//! packet simulations use for long flows.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use crate::dcqcn::{Np, Rp, RpParams};
use crate::ecn::{codepoint, Marker, Red};
use crate::limiter::Pacer;
use crate::pfc::{Ingress, Mode, PauseFrame, PauseState, Send, Thresholds, MAX_QUANTA};

/// The lossless priority RoCE uses.
const PRIO: usize = 3;
/// Bytes of headers a RoCEv2 packet adds to its payload on the wire (Ethernet 14, IPv4 20,
/// UDP 8, BTH 12, ICRC 4, FCS 4).
pub const HEADER_BYTES: u64 = 62;

/// A flow: from a sender to a receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowSpec {
    /// Sender index.
    pub src: usize,
    /// Receiver index.
    pub dst: usize,
    /// Start time, ns.
    pub start: u64,
}

/// A scenario.
#[derive(Debug, Clone)]
pub struct Config {
    /// Senders (one link each to the switch).
    pub senders: usize,
    /// Receivers (one switch port each).
    pub receivers: usize,
    /// Flows.
    pub flows: Vec<FlowSpec>,
    /// Link rate of every link, Mb/s.
    pub link_mbps: f64,
    /// Propagation delay of every link, ns.
    pub link_delay: u64,
    /// Payload bytes per packet.
    pub mtu: u64,
    /// DCQCN parameters (`None`: no congestion control, senders at line rate).
    pub dcqcn: Option<RpParams>,
    /// The NP's minimum time between CNPs per flow, ns.
    pub cnp_interval: u64,
    /// ECN marking at the switch (`None`: no marking).
    pub red: Option<Red>,
    /// PFC at the switch ingress.
    pub pfc: bool,
    /// XOFF threshold per ingress port, bytes (XON two packets below).
    pub pfc_xoff: u64,
    /// Shared switch buffer, bytes.
    pub buffer: u64,
    /// Sampling period of the recorded time series, ns.
    pub sample: u64,
    /// Seed of the marking decisions.
    pub seed: u64,
}

impl Config {
    /// Headroom an ingress port needs above XOFF so PFC never drops: a round trip of the link
    /// at line rate (the pause takes one delay to arrive, packets in flight one more), two
    /// packets being serialised, and the sender's reaction (ref. dcb.md "PFC reaction").
    pub fn headroom(&self) -> u64 {
        let bytes_per_ns = self.link_mbps / 8_000.0;
        let pkt = self.mtu + HEADER_BYTES;
        (2.0 * self.link_delay as f64 * bytes_per_ns) as u64 + 4 * pkt + 4096
    }
}

/// One sample of a flow.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowSample {
    /// Time, us.
    pub time_us: f64,
    /// Flow index.
    pub flow: usize,
    /// DCQCN's current rate (line rate without DCQCN), Gb/s.
    pub rate_gbps: f64,
    /// Goodput delivered in the last sample period, Gb/s.
    pub goodput_gbps: f64,
}

/// One sample of the switch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwitchSample {
    /// Time, us.
    pub time_us: f64,
    /// Bytes queued at the most loaded egress port.
    pub queue_bytes: u64,
    /// Bytes in the whole switch buffer.
    pub buffer_bytes: u64,
    /// Senders paused by PFC at this instant.
    pub paused_senders: usize,
}

/// What a run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Per flow per sample.
    pub flows: Vec<FlowSample>,
    /// Switch per sample.
    pub switch: Vec<SwitchSample>,
    /// Payload bytes delivered per flow.
    pub delivered: Vec<u64>,
    /// Packets dropped at the switch (buffer full).
    pub drops: u64,
    /// Packets marked CE.
    pub marked: u64,
    /// CNPs sent.
    pub cnps: u64,
    /// PFC frames (XOFF and refreshes) the switch sent.
    pub pfc_xoff: u64,
    /// XON frames the switch sent.
    pub pfc_xon: u64,
    /// Nanoseconds each sender spent paused.
    pub paused_ns: Vec<u64>,
    /// Bytes the senders put on their links, and bytes that left the switch plus drops plus
    /// what is still queued: equal (conservation).
    pub sent_bytes: u64,
    /// See `sent_bytes`.
    pub accounted_bytes: u64,
    /// Simulated time, ns.
    pub duration: u64,
}

impl Outcome {
    /// Jain's fairness index of the flows' goodput averaged over samples from `from_us`.
    pub fn jain(&self, from_us: f64, flows: &[usize]) -> f64 {
        let mut sum = vec![0.0; self.delivered.len()];
        let mut n = vec![0usize; self.delivered.len()];
        for s in self.flows.iter().filter(|s| s.time_us >= from_us) {
            sum[s.flow] += s.goodput_gbps;
            n[s.flow] += 1;
        }
        let x: Vec<f64> = flows
            .iter()
            .map(|f| sum[*f] / n[*f].max(1) as f64)
            .collect();
        jain_index(&x)
    }

    /// Mean goodput of `flow` over samples from `from_us`, Gb/s.
    pub fn mean_goodput(&self, flow: usize, from_us: f64) -> f64 {
        let v: Vec<f64> = self
            .flows
            .iter()
            .filter(|s| s.flow == flow && s.time_us >= from_us)
            .map(|s| s.goodput_gbps)
            .collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }
}

/// Jain's fairness index of `x`: (sum x)^2 / (n * sum x^2), 1 when all are equal; 0 when
/// every value is 0.
pub fn jain_index(x: &[f64]) -> f64 {
    let s: f64 = x.iter().sum();
    let s2: f64 = x.iter().map(|v| v * v).sum();
    if s2 == 0.0 {
        0.0
    } else {
        s * s / (x.len() as f64 * s2)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A sender may be able to transmit.
    SenderTx(usize),
    /// A packet of `flow`, `bytes` long, reaches the switch.
    SwitchIn { flow: usize, bytes: u64 },
    /// An egress port may be able to transmit.
    EgressTx(usize),
    /// A packet reaches its receiver.
    Deliver { flow: usize, bytes: u64, ce: bool },
    /// A CNP reaches the sender of `flow`.
    Cnp(usize),
    /// A pause frame (quanta; 0 = XON) reaches sender `s`.
    Pfc { sender: usize, quanta: u16 },
    /// Ingress port `port`'s XOFF refresh may be due (the switch refreshes a pause while its
    /// buffer stays above XON, whether or not packets still arrive).
    PfcRefresh(usize),
    /// Record a sample.
    Sample,
}

struct Flow {
    spec: FlowSpec,
    rp: Option<Rp>,
    pacer: Pacer,
    np: Np,
    delivered: u64,
    delivered_at_sample: u64,
}

struct Sender {
    busy_until: u64,
    pause: PauseState,
    /// Next flow to consider (round robin).
    rr: usize,
    flows: Vec<usize>,
    scheduled: Option<u64>,
}

struct Port {
    queue: VecDeque<(usize, u64)>,
    bytes: u64,
    busy_until: u64,
    scheduled: bool,
}

/// The simulator.
pub struct Sim {
    cfg: Config,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    flows: Vec<Flow>,
    senders: Vec<Sender>,
    ports: Vec<Port>,
    ingress: Vec<Ingress>,
    /// The time of each ingress port's pending refresh event.
    refresh_at: Vec<Option<u64>>,
    marker: Option<Marker>,
    buffer_used: u64,
    out: Outcome,
}

impl Sim {
    /// A simulator for `cfg`.
    pub fn new(cfg: Config) -> Sim {
        let pkt = cfg.mtu + HEADER_BYTES;
        let speed = cfg.link_mbps as u64;
        let mode = if cfg.pfc {
            Mode::Pfc { enabled: 1 << PRIO }
        } else {
            Mode::Off
        };
        let flows = cfg
            .flows
            .iter()
            .map(|f| Flow {
                spec: *f,
                rp: cfg.dcqcn.map(|p| Rp::new(p, f.start)),
                pacer: Pacer::new(cfg.link_mbps, pkt),
                np: Np::default(),
                delivered: 0,
                delivered_at_sample: 0,
            })
            .collect();
        let senders = (0..cfg.senders)
            .map(|s| Sender {
                busy_until: 0,
                pause: PauseState::new(mode, speed),
                rr: 0,
                flows: (0..cfg.flows.len())
                    .filter(|f| cfg.flows[*f].src == s)
                    .collect(),
                scheduled: None,
            })
            .collect();
        let ports = (0..cfg.receivers)
            .map(|_| Port {
                queue: VecDeque::new(),
                bytes: 0,
                busy_until: 0,
                scheduled: false,
            })
            .collect();
        let th = Thresholds {
            xoff: cfg.pfc_xoff,
            xon: cfg.pfc_xoff.saturating_sub(2 * pkt),
        };
        let capacity = if cfg.pfc {
            cfg.pfc_xoff + cfg.headroom()
        } else {
            u64::MAX / 4
        };
        let ingress = (0..cfg.senders)
            .map(|_| Ingress::new(mode, speed, capacity, th, MAX_QUANTA))
            .collect();
        let marker = cfg.red.map(|r| Marker::new(r, cfg.seed));
        let n = cfg.flows.len();
        let mut sim = Sim {
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            flows,
            senders,
            ports,
            ingress,
            refresh_at: vec![None; cfg.senders],
            marker,
            buffer_used: 0,
            out: Outcome {
                delivered: vec![0; n],
                paused_ns: vec![0; cfg.senders],
                ..Default::default()
            },
            cfg,
        };
        for s in 0..sim.cfg.senders {
            let start = sim.senders[s]
                .flows
                .iter()
                .map(|f| sim.cfg.flows[*f].start)
                .min();
            if let Some(t) = start {
                sim.schedule_sender(s, t);
            }
        }
        sim.push(sim.cfg.sample, Ev::Sample);
        sim
    }

    fn push(&mut self, t: u64, e: Ev) {
        self.seq += 1;
        self.events.push(Reverse((t, self.seq, e)));
    }

    fn ser_ns(&self, bytes: u64) -> u64 {
        ((bytes as f64 * 8_000.0) / self.cfg.link_mbps).ceil() as u64
    }

    fn schedule_sender(&mut self, s: usize, t: u64) {
        let t = t.max(self.now);
        if self.senders[s].scheduled.is_some_and(|x| x <= t) {
            return;
        }
        self.senders[s].scheduled = Some(t);
        self.push(t, Ev::SenderTx(s));
    }

    /// Brings flow `f`'s DCQCN timers up to now and its pacer to the current rate.
    fn sync_rate(&mut self, f: usize) {
        let now = self.now;
        let pkt = self.cfg.mtu + HEADER_BYTES;
        let fl = &mut self.flows[f];
        if let Some(rp) = fl.rp.as_mut() {
            if rp.poll_timeout() <= now {
                rp.handle_timeout(now);
            }
            if (rp.rate() - fl.pacer.rate()).abs() > 1e-9 {
                fl.pacer.set_rate(now, rp.rate(), pkt);
            }
        }
    }

    fn sender_tx(&mut self, s: usize) {
        self.senders[s].scheduled = None;
        let now = self.now;
        if self.senders[s].busy_until > now {
            let t = self.senders[s].busy_until;
            self.schedule_sender(s, t);
            return;
        }
        self.senders[s].pause.handle_timeout(now);
        if self.senders[s].pause.is_paused(PRIO, now) {
            // The pause's end (or an XON) wakes the sender.
            if let Some(t) = self.senders[s].pause.poll_timeout() {
                self.schedule_sender(s, t);
            }
            return;
        }
        let n = self.senders[s].flows.len();
        let mut earliest = u64::MAX;
        for k in 0..n {
            let i = (self.senders[s].rr + k) % n;
            let f = self.senders[s].flows[i];
            if self.flows[f].spec.start > now {
                earliest = earliest.min(self.flows[f].spec.start);
                continue;
            }
            self.sync_rate(f);
            let next = self.flows[f].pacer.next_allowed(now);
            if next > now {
                // Wake at the pacer's time, or earlier if DCQCN's timers may raise the rate
                // (a flow cut to a low rate must not wait out its old, slow schedule).
                let rp_due = self.flows[f]
                    .rp
                    .as_ref()
                    .map_or(u64::MAX, |r| r.poll_timeout());
                earliest = earliest.min(next).min(rp_due.max(now + 1));
                continue;
            }
            // Send one packet of flow f.
            let bytes = self.cfg.mtu + HEADER_BYTES;
            self.flows[f].pacer.on_send(now, bytes);
            if let Some(rp) = self.flows[f].rp.as_mut() {
                rp.on_sent(bytes, now);
            }
            let ser = self.ser_ns(bytes);
            self.senders[s].busy_until = now + ser;
            self.senders[s].rr = (i + 1) % n;
            self.out.sent_bytes += bytes;
            let arrive = now + ser + self.cfg.link_delay;
            self.push(arrive, Ev::SwitchIn { flow: f, bytes });
            self.schedule_sender(s, now + ser);
            return;
        }
        if earliest != u64::MAX {
            self.schedule_sender(s, earliest);
        }
    }

    fn send_pfc(&mut self, sender: usize, f: Send) {
        let quanta = match f {
            Send::Pfc { quanta, .. } => quanta[PRIO],
            Send::Pause { quanta } => quanta,
        };
        if quanta == 0 {
            self.out.pfc_xon += 1;
        } else {
            self.out.pfc_xoff += 1;
        }
        // A 64-byte frame on the reverse link.
        let t = self.now + self.ser_ns(64) + self.cfg.link_delay;
        self.push(t, Ev::Pfc { sender, quanta });
    }

    /// Makes sure an event wakes ingress `port` when its next XOFF refresh is due (one
    /// pending event per port).
    fn schedule_refresh(&mut self, port: usize) {
        if let Some(t) = self.ingress[port].poll_timeout() {
            if self.refresh_at[port] != Some(t) {
                self.refresh_at[port] = Some(t);
                self.push(t, Ev::PfcRefresh(port));
            }
        }
    }

    fn switch_in(&mut self, f: usize, bytes: u64) {
        let src = self.flows[f].spec.src;
        let dst = self.flows[f].spec.dst;
        let now = self.now;
        // Refreshes due on this port first.
        let mut refresh = Vec::new();
        if self.ingress[src].poll_timeout().is_some_and(|t| t <= now) {
            self.ingress[src].handle_timeout(now, &mut refresh);
        }
        for r in refresh {
            self.send_pfc(src, r);
        }
        let fits_buffer = self.buffer_used + bytes <= self.cfg.buffer;
        let (ok, frame) = if fits_buffer {
            self.ingress[src].enqueue(PRIO, bytes, now)
        } else {
            (false, None)
        };
        if let Some(fr) = frame {
            self.send_pfc(src, fr);
            self.schedule_refresh(src);
        }
        if !ok {
            self.out.drops += 1;
            self.out.accounted_bytes += bytes;
            return;
        }
        self.buffer_used += bytes;
        let p = &mut self.ports[dst];
        p.queue.push_back((f, bytes));
        p.bytes += bytes;
        if !p.scheduled {
            p.scheduled = true;
            let t = p.busy_until.max(now);
            self.push(t, Ev::EgressTx(dst));
        }
    }

    fn egress_tx(&mut self, port: usize) {
        let now = self.now;
        self.ports[port].scheduled = false;
        if self.ports[port].busy_until > now {
            self.ports[port].scheduled = true;
            let t = self.ports[port].busy_until;
            self.push(t, Ev::EgressTx(port));
            return;
        }
        let Some((f, bytes)) = self.ports[port].queue.pop_front() else {
            return;
        };
        // Marked at dequeue on the bytes queued (as the HPCC simulator does).
        let queued = self.ports[port].bytes;
        self.ports[port].bytes -= bytes;
        self.buffer_used -= bytes;
        let ce = match self.marker.as_mut() {
            Some(m) => m.mark(codepoint::ECT0, queued) == codepoint::CE,
            None => false,
        };
        if ce {
            self.out.marked += 1;
        }
        let src = self.flows[f].spec.src;
        if let Some(fr) = self.ingress[src].dequeue(PRIO, bytes) {
            self.send_pfc(src, fr);
        }
        let ser = self.ser_ns(bytes);
        self.ports[port].busy_until = now + ser;
        self.out.accounted_bytes += bytes;
        self.push(
            now + ser + self.cfg.link_delay,
            Ev::Deliver { flow: f, bytes, ce },
        );
        if !self.ports[port].queue.is_empty() {
            self.ports[port].scheduled = true;
            self.push(now + ser, Ev::EgressTx(port));
        }
    }

    fn deliver(&mut self, f: usize, bytes: u64, ce: bool) {
        let payload = bytes.saturating_sub(HEADER_BYTES);
        self.flows[f].delivered += payload;
        self.out.delivered[f] += payload;
        if ce && self.cfg.dcqcn.is_some() && self.flows[f].np.on_ce(self.now, self.cfg.cnp_interval)
        {
            self.out.cnps += 1;
            // Back to the sender over two links, strict priority (not queued).
            let t = self.now + 2 * self.cfg.link_delay + 2 * self.ser_ns(64);
            self.push(t, Ev::Cnp(f));
        }
    }

    fn sample(&mut self) {
        let period = self.cfg.sample as f64;
        let t_us = self.now as f64 / 1000.0;
        for f in 0..self.flows.len() {
            self.sync_rate(f);
            let fl = &mut self.flows[f];
            let d = fl.delivered - fl.delivered_at_sample;
            fl.delivered_at_sample = fl.delivered;
            let rate = fl.rp.as_ref().map_or(self.cfg.link_mbps, |r| r.rate());
            let active = fl.spec.start <= self.now;
            self.out.flows.push(FlowSample {
                time_us: t_us,
                flow: f,
                rate_gbps: if active { rate / 1000.0 } else { 0.0 },
                goodput_gbps: d as f64 * 8.0 / period,
            });
        }
        let paused = (0..self.senders.len())
            .filter(|s| self.senders[*s].pause.is_paused(PRIO, self.now))
            .count();
        self.out.switch.push(SwitchSample {
            time_us: t_us,
            queue_bytes: self.ports.iter().map(|p| p.bytes).max().unwrap_or(0),
            buffer_bytes: self.buffer_used,
            paused_senders: paused,
        });
    }

    /// Runs until `duration` ns and returns what was measured.
    pub fn run(mut self, duration: u64) -> Outcome {
        while self
            .events
            .peek()
            .is_some_and(|Reverse((t, _, _))| *t <= duration)
        {
            let Some(Reverse((t, _, e))) = self.events.pop() else {
                break;
            };
            self.now = t;
            match e {
                Ev::SenderTx(s) => self.sender_tx(s),
                Ev::SwitchIn { flow, bytes } => self.switch_in(flow, bytes),
                Ev::EgressTx(p) => self.egress_tx(p),
                Ev::Deliver { flow, bytes, ce } => self.deliver(flow, bytes, ce),
                Ev::Cnp(f) => {
                    self.sync_rate(f);
                    if let Some(rp) = self.flows[f].rp.as_mut() {
                        rp.on_cnp(self.now);
                    }
                    self.sync_rate(f);
                }
                Ev::Pfc { sender, quanta } => {
                    let frame = PauseFrame::pfc_one(PRIO, quanta);
                    self.senders[sender].pause.handle_frame(self.now, &frame);
                    // Resumed (XON) or a new pause end: re-evaluate.
                    self.schedule_sender(sender, self.now);
                }
                Ev::PfcRefresh(port) => {
                    let mut refresh = Vec::new();
                    if self.ingress[port]
                        .poll_timeout()
                        .is_some_and(|t| t <= self.now)
                    {
                        self.ingress[port].handle_timeout(self.now, &mut refresh);
                    }
                    for r in refresh {
                        self.send_pfc(port, r);
                    }
                    self.schedule_refresh(port);
                }
                Ev::Sample => {
                    self.sample();
                    let next = self.now + self.cfg.sample;
                    self.push(next, Ev::Sample);
                }
            }
        }
        self.now = duration;
        for s in 0..self.senders.len() {
            self.senders[s].pause.handle_timeout(duration);
            // A pause still running is accounted up to the end.
            let still = self.senders[s]
                .pause
                .paused_since(PRIO, duration)
                .map_or(0, |since| duration - since);
            self.out.paused_ns[s] = self.senders[s].pause.counters.paused_ns[PRIO] + still;
        }
        // What is still queued in the switch or on the wire counts as accounted too.
        self.out.accounted_bytes += self.buffer_used;
        let in_flight: u64 = self
            .events
            .iter()
            .map(|Reverse((_, _, e))| match e {
                Ev::SwitchIn { bytes, .. } => *bytes,
                _ => 0,
            })
            .sum();
        self.out.accounted_bytes += in_flight;
        // Delivered-later packets were already accounted when they left the switch.
        self.out.duration = duration;
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(n: usize) -> Config {
        Config {
            senders: n,
            receivers: 1,
            flows: (0..n)
                .map(|s| FlowSpec {
                    src: s,
                    dst: 0,
                    start: 0,
                })
                .collect(),
            link_mbps: 100_000.0,
            link_delay: 1_000,
            mtu: 1024,
            dcqcn: Some(RpParams::firmware(100_000.0)),
            cnp_interval: 4_000,
            red: Some(Red::scaled(100.0)),
            pfc: true,
            pfc_xoff: 1_000_000,
            buffer: 32 << 20,
            sample: 10_000,
            seed: 1,
        }
    }

    #[test]
    fn one_flow_runs_at_line_rate_unmarked() {
        let mut c = base(1);
        c.red = Some(Red::scaled(100.0));
        let o = Sim::new(c).run(2_000_000);
        let g = o.mean_goodput(0, 500.0);
        // Payload share of a 1086-byte packet at 100 Gb/s: 94.3 Gb/s.
        assert!((g - 100.0 * 1024.0 / 1086.0).abs() < 1.0, "{g}");
        assert_eq!((o.drops, o.marked, o.cnps, o.pfc_xoff), (0, 0, 0, 0));
        assert_eq!(o.sent_bytes, o.accounted_bytes, "bytes conserved");
    }

    #[test]
    fn dcqcn_converges_to_fair_shares_with_a_bounded_queue() {
        let c = base(4);
        let red = c.red.unwrap();
        let o = Sim::new(c).run(30_000_000);
        let flows: Vec<usize> = (0..4).collect();
        let j = o.jain(15_000.0, &flows);
        assert!(j >= 0.95, "Jain {j}");
        let total: f64 = flows.iter().map(|f| o.mean_goodput(*f, 15_000.0)).sum();
        assert!(total > 85.0, "the bottleneck stays busy: {total} Gb/s");
        let late: Vec<u64> = o
            .switch
            .iter()
            .filter(|s| s.time_us >= 15_000.0)
            .map(|s| s.queue_bytes)
            .collect();
        let mean = late.iter().sum::<u64>() as f64 / late.len() as f64;
        assert!(
            mean < red.kmax as f64 * 1.5,
            "queue {mean} bytes vs Kmax {}",
            red.kmax
        );
        assert_eq!(o.drops, 0);
        assert!(o.cnps > 0);
        assert_eq!(o.sent_bytes, o.accounted_bytes, "bytes conserved");
    }

    #[test]
    fn pfc_prevents_drops_and_its_absence_drops() {
        // 8:1 incast without DCQCN or ECN, a small buffer.
        let mut c = base(8);
        c.dcqcn = None;
        c.red = None;
        c.buffer = 4 << 20;
        c.pfc_xoff = 200_000;
        let with = Sim::new(c.clone()).run(5_000_000);
        assert_eq!(with.drops, 0, "PFC is lossless");
        assert!(with.pfc_xoff > 0 && with.pfc_xon > 0);
        assert!(with.paused_ns.iter().all(|p| *p > 0));
        assert_eq!(with.sent_bytes, with.accounted_bytes);
        c.pfc = false;
        let without = Sim::new(c).run(5_000_000);
        assert!(without.drops > 0, "no PFC, no ECN: drops");
        assert_eq!(without.sent_bytes, without.accounted_bytes);
    }
}
