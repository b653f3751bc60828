//! A packet-level fabric simulator on simulated time: senders -> one switch -> receivers,
//! deterministic and seeded, built from this crate's own state machines, so what is simulated
//! is what the dataplane runs:
//!
//! - each sender NIC has one link to the switch (rate, propagation delay) and any number of
//!   long-lived flows; per flow a DCQCN reaction point ([`Rp`]) sets a pacer ([`Pacer`]); the
//!   flows take turns on the link; the link honours PFC from the switch ([`PauseState`]);
//! - the switch is the crate's switch model ([`Switch`]: shared buffer, ETS classes, RED/ECN
//!   marking at dequeue on the bytes queued, PFC per ingress port with headroom, per-port
//!   shaping), the same logic the DPDK switch and the RNIC fabric run; senders are its first
//!   ports, receivers the next; data travels on priority 3 (lossless), CNPs on 6 (strict);
//! - each receiver NIC counts what arrives and, as notification point ([`Np`]), returns a
//!   CNP for CE-marked packets through the switch to the sender.
//!
//! Flows are a lighter model than roce's QPs: an endless backlog of MTU packets, no ACKs or
//! retransmission (a drop is counted and lost). This is the model the DCQCN paper's fluid and
//! packet simulations use for long flows.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::dcqcn::{Np, Rp, RpParams};
use crate::ecn::{codepoint, Red};
use crate::limiter::Pacer;
use crate::pfc::{Mode, PauseFrame, PauseState, Send, Thresholds};
use crate::switch::{Frame, Switch, SwitchConfig, WIRE_EXTRA};

/// The lossless priority RoCE uses.
const PRIO: usize = 3;
/// The priority CNPs travel on (strict in the switch's ETS).
const CNP_PRIO: u8 = 6;
/// The FCS, part of [`HEADER_BYTES`] but counted by the switch in [`WIRE_EXTRA`].
const FCS: u64 = 4;
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

/// Bytes a packet with `mtu` bytes of payload takes on the wire: headers, FCS, preamble and
/// inter-frame gap (what a link's rate is shared by).
pub fn wire_bytes(mtu: u64) -> u64 {
    mtu + HEADER_BYTES - FCS + WIRE_EXTRA
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
    /// A CNP for `flow` reaches the switch from its receiver.
    CnpIn(usize),
    /// The switch may have something to do (a port frees, a refresh is due).
    SwitchWake,
    /// A packet reaches its receiver.
    Deliver { flow: usize, bytes: u64, ce: bool },
    /// A CNP reaches the sender of `flow`.
    Cnp(usize),
    /// A pause frame (quanta; 0 = XON) reaches sender `s`.
    Pfc { sender: usize, quanta: u16 },
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

/// A frame in the switch: a data packet of a flow, or a CNP for it.
#[derive(Debug, Clone, Copy)]
struct Pkt {
    flow: usize,
    bytes: u64,
    cnp: bool,
}

/// The simulator.
pub struct Sim {
    cfg: Config,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    flows: Vec<Flow>,
    senders: Vec<Sender>,
    /// Ports 0..senders are the senders' links, then one per receiver.
    sw: Switch<Pkt>,
    /// The pending `SwitchWake`, if any.
    sw_wake: Option<u64>,
    /// CNP bytes in the switch (not part of the data's conservation count).
    cnp_bytes: u64,
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
        let sw = Switch::new(SwitchConfig {
            port_mbps: vec![cfg.link_mbps; cfg.senders + cfg.receivers],
            buffer: cfg.buffer,
            red: cfg.red,
            pfc: mode,
            thresholds: Thresholds {
                xoff: cfg.pfc_xoff,
                xon: cfg.pfc_xoff.saturating_sub(2 * pkt),
            },
            headroom: cfg.headroom(),
            ets: crate::ets::EtsConfig::roce_default(),
            seed: cfg.seed,
        })
        .expect("a valid switch");
        let n = cfg.flows.len();
        let mut sim = Sim {
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            flows,
            senders,
            sw,
            sw_wake: None,
            cnp_bytes: 0,
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

    /// Serialisation time of a frame of `bytes` (FCS excluded) on a link: as the switch
    /// counts it, preamble, gap and FCS included.
    fn ser_ns(&self, bytes: u64) -> u64 {
        crate::switch::ser_ns(bytes, self.cfg.link_mbps)
    }

    /// A data packet's frame as the switch counts it (without the FCS).
    fn frame_bytes(&self) -> u64 {
        self.cfg.mtu + HEADER_BYTES - FCS
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
            // Send one packet of flow f; the pacer and the byte counter count it on the wire.
            let bytes = self.frame_bytes();
            let wire = bytes + WIRE_EXTRA;
            self.flows[f].pacer.on_send(now, wire);
            if let Some(rp) = self.flows[f].rp.as_mut() {
                rp.on_sent(wire, now);
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

    fn switch_in(&mut self, f: usize, bytes: u64) {
        let (src, dst) = (self.flows[f].spec.src, self.flows[f].spec.dst);
        let frame = Frame {
            data: Pkt {
                flow: f,
                bytes,
                cnp: false,
            },
            bytes,
            priority: PRIO as u8,
            ecn: codepoint::ECT0,
        };
        if self
            .sw
            .receive(self.now, src, self.cfg.senders + dst, frame)
            .is_err()
        {
            self.out.drops += 1;
            self.out.accounted_bytes += bytes;
        }
        self.pump();
    }

    /// A CNP from flow `f`'s receiver enters the switch for the sender, strict priority.
    fn cnp_in(&mut self, f: usize) {
        let (src, dst) = (self.flows[f].spec.src, self.flows[f].spec.dst);
        let frame = Frame {
            data: Pkt {
                flow: f,
                bytes: 64,
                cnp: true,
            },
            bytes: 64,
            priority: CNP_PRIO,
            ecn: codepoint::NOT_ECT,
        };
        if self
            .sw
            .receive(self.now, self.cfg.senders + dst, src, frame)
            .is_ok()
        {
            self.cnp_bytes += 64;
        }
        self.pump();
    }

    /// Runs the switch at `now`: due timers, pause frames to the senders, departures; then
    /// makes sure an event wakes it when it next has something to do.
    fn pump(&mut self) {
        let now = self.now;
        if self.sw.poll_timeout().is_some_and(|t| t <= now) {
            self.sw.handle_timeout(now);
        }
        while let Some((port, f)) = self.sw.poll_control() {
            if port < self.cfg.senders {
                self.send_pfc(port, f);
            }
        }
        while let Some(d) = self.sw.poll_transmit(now) {
            let p = d.data;
            let at = d.done + self.cfg.link_delay;
            if p.cnp {
                self.cnp_bytes -= p.bytes;
                self.push(at, Ev::Cnp(p.flow));
                continue;
            }
            if d.ce {
                self.out.marked += 1;
            }
            self.out.accounted_bytes += p.bytes;
            self.push(
                at,
                Ev::Deliver {
                    flow: p.flow,
                    bytes: p.bytes,
                    ce: d.ce,
                },
            );
        }
        // A time at or before now can only be a port held by a pause: other events wake it.
        if let Some(t) = self.sw.poll_timeout().filter(|t| *t > now) {
            if self.sw_wake.is_none_or(|w| w > t || w <= now) {
                self.sw_wake = Some(t);
                self.push(t, Ev::SwitchWake);
            }
        }
    }

    fn deliver(&mut self, f: usize, bytes: u64, ce: bool) {
        let payload = bytes.saturating_sub(HEADER_BYTES - FCS);
        self.flows[f].delivered += payload;
        self.out.delivered[f] += payload;
        if ce && self.cfg.dcqcn.is_some() && self.flows[f].np.on_ce(self.now, self.cfg.cnp_interval)
        {
            self.out.cnps += 1;
            // Back to the sender through the switch, on the strict CNP class.
            let t = self.now + self.ser_ns(64) + self.cfg.link_delay;
            self.push(t, Ev::CnpIn(f));
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
            queue_bytes: (0..self.cfg.receivers)
                .map(|r| self.sw.queued(self.cfg.senders + r))
                .max()
                .unwrap_or(0),
            buffer_bytes: self.sw.buffer_used() - self.cnp_bytes,
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
                Ev::CnpIn(f) => self.cnp_in(f),
                Ev::SwitchWake => {
                    if self.sw_wake == Some(self.now) {
                        self.sw_wake = None;
                    }
                    self.pump();
                }
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
        self.out.accounted_bytes += self.sw.buffer_used() - self.cnp_bytes;
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
        // Payload share of a 1086-byte packet plus preamble and gap (1106 bytes on the wire)
        // at 100 Gb/s: 92.6 Gb/s.
        assert!((g - 100.0 * 1024.0 / 1106.0).abs() < 1.0, "{g}");
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
