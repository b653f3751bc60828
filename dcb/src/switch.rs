//! A shared-buffer Ethernet switch, sans-IO: ports x 8 priorities, the pieces a lossless RoCE
//! fabric is made of, assembled from this crate's state machines so a driver (the fabric
//! simulator in `roce::sim::fabric`, a switch on DPDK) only moves frames and time:
//!
//! - a shared buffer: a frame that does not fit is dropped (counted);
//! - per egress port, one FIFO per traffic class, scheduled by ETS ([`Ets`]: strict classes
//!   first, DWRR between the others), and shaped to the port's rate (one frame at a time, for
//!   its serialisation time, preamble and inter-frame gap included);
//! - ECN marking at dequeue on the bytes queued in the frame's class at that port (RED,
//!   [`Marker`]; Not-ECT frames are never marked), as the HPCC simulator and shared-buffer
//!   switches mark;
//! - PFC towards each ingress port per priority ([`Ingress`]: XOFF when the bytes that port
//!   has in the switch reach XOFF, refreshed while they stay above XON, XON below it, with
//!   headroom above XOFF for what is in flight); the frames to send are handed out ahead of
//!   data ([`Switch::poll_control`]);
//! - PFC from each port's link partner honoured on that egress port ([`PauseState`]).
//!
//! Forwarding is the driver's (it names the egress port): the model is the buffer, queues,
//! scheduler and flow control of a switch, not its tables. Times are nanoseconds, passed in.

use std::collections::VecDeque;

use crate::ecn::{codepoint, Marker, Red};
use crate::ets::{Ets, EtsConfig, TCS};
use crate::pfc::{Ingress, Mode, PauseFrame, PauseState, Thresholds, MAX_QUANTA, PRIORITIES};

/// Bytes a frame occupies on the wire beyond what the driver counts (preamble and start
/// delimiter 8, inter-frame gap 12, FCS 4).
pub const WIRE_EXTRA: u64 = 24;

/// A switch's configuration.
#[derive(Debug, Clone)]
pub struct SwitchConfig {
    /// Each port's egress rate, Mb/s (one entry per port).
    pub port_mbps: Vec<f64>,
    /// The shared buffer, bytes.
    pub buffer: u64,
    /// ECN marking (`None`: none).
    pub red: Option<Red>,
    /// Flow control towards the ingress ports, and honoured from them.
    pub pfc: Mode,
    /// XOFF/XON per ingress port and priority.
    pub thresholds: Thresholds,
    /// Bytes above XOFF an ingress port and priority may still bring in (what is in flight
    /// when the XOFF goes out); beyond it, frames are dropped. With PFC off, only the shared
    /// buffer limits a port.
    pub headroom: u64,
    /// Class scheduling at every egress port.
    pub ets: EtsConfig,
    /// Seed of the marking decisions.
    pub seed: u64,
}

impl SwitchConfig {
    /// The headroom a port needs so PFC never drops: a round trip of a link of `delay_ns` at
    /// `mbps`, plus the frames being serialised at both ends and the peer's reaction (two
    /// frames of `mtu` each), rounded up (ref. dcb.md "PFC reaction": SONiC's calculation).
    pub fn headroom_for(mbps: f64, delay_ns: u64, mtu: u64) -> u64 {
        let bytes_per_ns = mbps / 8_000.0;
        (2.0 * delay_ns as f64 * bytes_per_ns).ceil() as u64 + 4 * (mtu + WIRE_EXTRA) + 1024
    }
}

/// Why a frame was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Drop {
    /// The egress port does not exist.
    NoPort,
    /// The shared buffer is full.
    Buffer,
    /// The ingress port's share for the priority is full (headroom exhausted, or a lossy
    /// priority over its limit).
    Ingress,
}

/// Counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwitchCounters {
    /// Frames accepted.
    pub rx_frames: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Frames dropped, by reason: no port, buffer, ingress.
    pub drops: [u64; 3],
    /// Frames marked CE.
    pub marked: u64,
    /// XOFF and XON frames sent (refreshes included).
    pub pfc_xoff: u64,
    /// XON frames sent.
    pub pfc_xon: u64,
    /// Pause frames received from link partners.
    pub pfc_rx: u64,
    /// Most bytes ever queued at each egress port.
    pub peak_queue: Vec<u64>,
}

/// A frame offered to the switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame<T> {
    /// The driver's frame.
    pub data: T,
    /// Its length, bytes (without preamble, gap and FCS).
    pub bytes: u64,
    /// Its priority (PCP or DSCP-mapped).
    pub priority: u8,
    /// Its IP ECN field (0 when not IP).
    pub ecn: u8,
}

/// A frame in the switch.
struct Queued<T> {
    data: T,
    /// When it came in.
    arrived: u64,
    bytes: u64,
    in_port: usize,
    priority: u8,
    ecn: u8,
}

/// One egress port.
struct Port<T> {
    mbps: f64,
    busy_until: u64,
    classes: [VecDeque<Queued<T>>; TCS],
    class_bytes: [u64; TCS],
    bytes: u64,
    ets: Ets,
    /// What the link partner paused.
    pause: PauseState,
}

/// A frame leaving the switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departure<T> {
    /// Egress port.
    pub port: usize,
    /// The frame.
    pub data: T,
    /// Whether the switch set CE (the driver rewrites the frame's ECN field).
    pub ce: bool,
    /// When its last bit leaves, ns.
    pub done: u64,
}

/// The switch. `T` is the driver's frame (bytes, an mbuf, an index).
pub struct Switch<T> {
    cfg: SwitchConfig,
    ports: Vec<Port<T>>,
    ingress: Vec<Ingress>,
    marker: Option<Marker>,
    buffer_used: u64,
    control: VecDeque<(usize, PauseFrame)>,
    scratch: Vec<PauseFrame>,
    next_port: usize,
    /// Counters.
    pub counters: SwitchCounters,
}

impl<T> Switch<T> {
    /// A switch with `cfg` (its ETS configuration validated).
    pub fn new(cfg: SwitchConfig) -> Result<Switch<T>, String> {
        let n = cfg.port_mbps.len();
        let mut ports = Vec::with_capacity(n);
        for &mbps in &cfg.port_mbps {
            if mbps <= 0.0 || !mbps.is_finite() {
                return Err(format!("a port rate of {mbps} Mb/s"));
            }
            ports.push(Port {
                mbps,
                busy_until: 0,
                classes: Default::default(),
                class_bytes: [0; TCS],
                bytes: 0,
                ets: Ets::new(cfg.ets)?,
                pause: PauseState::new(cfg.pfc, mbps as u64),
            });
        }
        // With PFC, an ingress port and priority may hold XOFF plus the headroom; without
        // it, only the shared buffer limits what a port brings in.
        let capacity = match cfg.pfc {
            Mode::Off => cfg.buffer,
            _ => cfg.thresholds.xoff + cfg.headroom,
        };
        let ingress = cfg
            .port_mbps
            .iter()
            .map(|&m| Ingress::new(cfg.pfc, m as u64, capacity, cfg.thresholds, MAX_QUANTA))
            .collect();
        Ok(Switch {
            marker: cfg.red.map(|r| Marker::new(r, cfg.seed)),
            ports,
            ingress,
            buffer_used: 0,
            control: VecDeque::new(),
            scratch: Vec::new(),
            next_port: 0,
            counters: SwitchCounters {
                peak_queue: vec![0; n],
                ..Default::default()
            },
            cfg,
        })
    }

    /// Ports.
    pub fn ports(&self) -> usize {
        self.ports.len()
    }

    /// Bytes queued at egress `port` now.
    pub fn queued(&self, port: usize) -> u64 {
        self.ports.get(port).map_or(0, |p| p.bytes)
    }

    /// Bytes in the shared buffer.
    pub fn buffer_used(&self) -> u64 {
        self.buffer_used
    }

    /// Frame `f` came in on `in_port` for `out_port` at `now`: queued, or dropped (counted,
    /// and the frame handed back).
    pub fn receive(
        &mut self,
        now: u64,
        in_port: usize,
        out_port: usize,
        f: Frame<T>,
    ) -> Result<(), (Drop, T)> {
        let Frame {
            data,
            bytes,
            priority,
            ecn,
        } = f;
        if out_port >= self.ports.len() || in_port >= self.ports.len() {
            self.counters.drops[0] += 1;
            return Err((Drop::NoPort, data));
        }
        if self.buffer_used + bytes > self.cfg.buffer {
            self.counters.drops[1] += 1;
            return Err((Drop::Buffer, data));
        }
        let p = priority as usize % PRIORITIES;
        let (fits, frame) = self.ingress[in_port].enqueue(p, bytes, now);
        if let Some(f) = frame {
            self.send_control(in_port, f);
        }
        if !fits {
            self.counters.drops[2] += 1;
            return Err((Drop::Ingress, data));
        }
        self.counters.rx_frames += 1;
        self.buffer_used += bytes;
        let port = &mut self.ports[out_port];
        let tc = port.ets.tc_of(priority);
        port.classes[tc].push_back(Queued {
            data,
            arrived: now,
            bytes,
            in_port,
            priority,
            ecn,
        });
        port.class_bytes[tc] += bytes;
        port.bytes += bytes;
        let peak = &mut self.counters.peak_queue[out_port];
        *peak = (*peak).max(port.bytes);
        Ok(())
    }

    fn send_control(&mut self, port: usize, f: PauseFrame) {
        let xon = match f {
            PauseFrame::Pfc { quanta, .. } => quanta.iter().all(|q| *q == 0),
            PauseFrame::Pause { quanta } => quanta == 0,
        };
        if xon {
            self.counters.pfc_xon += 1;
        } else {
            self.counters.pfc_xoff += 1;
        }
        self.control.push_back((port, f));
    }

    /// A pause frame from the link partner on `port` arrived at `now`: that egress port holds
    /// the paused priorities.
    pub fn pause_frame(&mut self, now: u64, port: usize, f: &PauseFrame) {
        if let Some(p) = self.ports.get_mut(port) {
            self.counters.pfc_rx += 1;
            p.pause.handle_frame(now, f);
        }
    }

    /// The next pause frame to send, and the port it leaves on (they go ahead of data).
    pub fn poll_control(&mut self) -> Option<(usize, PauseFrame)> {
        self.control.pop_front()
    }

    /// The next frame to leave at `now`, from a port that is free and has an unpaused class
    /// with something queued; ports take turns. Called again at the same `now`, a port whose
    /// frames would already have finished by then sends the next one (catch-up).
    pub fn poll_transmit(&mut self, now: u64) -> Option<Departure<T>> {
        let n = self.ports.len();
        for i in 0..n {
            let pi = (self.next_port + i) % n;
            let port = &mut self.ports[pi];
            if port.bytes == 0 || port.busy_until > now {
                continue;
            }
            let paused_prio = port.pause.paused_mask(now);
            let mut paused_tc = 0u8;
            for pr in 0..PRIORITIES as u8 {
                if paused_prio & (1 << pr) != 0 {
                    paused_tc |= 1 << port.ets.tc_of(pr);
                }
            }
            let mut head = [None; TCS];
            for (tc, q) in port.classes.iter().enumerate() {
                head[tc] = q.front().map(|f| f.bytes.min(u32::MAX as u64) as u32);
            }
            let Some(tc) = port.ets.pick(&head, paused_tc) else {
                continue;
            };
            let Some(f) = port.classes[tc].pop_front() else {
                continue;
            };
            // Marked at dequeue on the bytes queued in its class, this frame included.
            let queued = port.class_bytes[tc];
            port.class_bytes[tc] -= f.bytes;
            port.bytes -= f.bytes;
            // It started when the port freed up or when it came in, whichever is later: a
            // driver that polls late (real time) catches up rather than losing the port's
            // time, so the port keeps its rate; event-driven drivers poll at exactly that.
            let done = port.busy_until.max(f.arrived).min(now) + ser_ns(f.bytes, port.mbps);
            port.busy_until = done;
            self.buffer_used -= f.bytes;
            let ce = match self.marker.as_mut() {
                Some(m) if f.ecn & 3 != codepoint::NOT_ECT => {
                    m.mark(f.ecn, queued) == codepoint::CE && f.ecn & 3 != codepoint::CE
                }
                _ => false,
            };
            if ce {
                self.counters.marked += 1;
            }
            if let Some(x) = self.ingress[f.in_port].dequeue(f.priority as usize, f.bytes) {
                self.send_control(f.in_port, x);
            }
            self.counters.tx_frames += 1;
            self.next_port = (pi + 1) % n;
            return Some(Departure {
                port: pi,
                data: f.data,
                ce,
                done,
            });
        }
        None
    }

    /// When something may next happen without a new frame: a busy port with frames
    /// queued frees up, a pause runs out, an XOFF refresh is due.
    pub fn poll_timeout(&self) -> Option<u64> {
        let ports = self.ports.iter().flat_map(|p| {
            let free = (p.bytes > 0).then_some(p.busy_until);
            [free, p.pause.poll_timeout()]
        });
        let refresh = self.ingress.iter().map(Ingress::poll_timeout);
        ports.chain(refresh).flatten().min()
    }

    /// Runs what is due at `now`: pause expiries, XOFF refreshes.
    pub fn handle_timeout(&mut self, now: u64) {
        for p in self.ports.iter_mut() {
            if p.pause.poll_timeout().is_some_and(|t| t <= now) {
                p.pause.handle_timeout(now);
            }
        }
        for i in 0..self.ingress.len() {
            if self.ingress[i].poll_timeout().is_some_and(|t| t <= now) {
                let mut out = std::mem::take(&mut self.scratch);
                self.ingress[i].handle_timeout(now, &mut out);
                for f in out.drain(..) {
                    self.send_control(i, f);
                }
                self.scratch = out;
            }
        }
    }
}

/// Serialisation time of a frame of `bytes` (plus [`WIRE_EXTRA`]) at `mbps`, ns.
pub fn ser_ns(bytes: u64, mbps: f64) -> u64 {
    (((bytes + WIRE_EXTRA) * 8) as f64 * 1000.0 / mbps).ceil() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fr<T>(data: T, bytes: u64, priority: u8, ecn: u8) -> Frame<T> {
        Frame {
            data,
            bytes,
            priority,
            ecn,
        }
    }

    fn cfg(pfc: bool, red: Option<Red>) -> SwitchConfig {
        SwitchConfig {
            port_mbps: vec![10_000.0; 3],
            buffer: 1 << 20,
            red,
            pfc: if pfc {
                Mode::Pfc { enabled: 1 << 3 }
            } else {
                Mode::Off
            },
            thresholds: Thresholds {
                xoff: 20_000,
                xon: 10_000,
            },
            headroom: 10_000,
            ets: EtsConfig::roce_default(),
            seed: 1,
        }
    }

    #[test]
    fn shapes_each_port_to_its_rate() {
        let mut s: Switch<u32> = Switch::new(cfg(false, None)).unwrap();
        for i in 0..10 {
            s.receive(0, 0, 2, fr(i, 1000, 3, 0)).unwrap();
        }
        let mut t = 0;
        let mut out = Vec::new();
        while let Some(next) = s.poll_timeout() {
            t = t.max(next);
            while let Some(d) = s.poll_transmit(t) {
                out.push((d.data, t));
            }
            s.handle_timeout(t);
            if s.queued(2) == 0 {
                break;
            }
        }
        assert_eq!(out.len(), 10);
        // 1024 wire bytes at 10 Gb/s: 819.2 ns each, in order.
        assert_eq!(out[1].1, 820);
        assert_eq!(out[9].1, 9 * 820);
        assert!(out.windows(2).all(|w| w[0].0 < w[1].0));
    }

    #[test]
    fn pfc_pauses_the_ingress_port_and_resumes_it() {
        let mut s: Switch<u32> = Switch::new(cfg(true, None)).unwrap();
        // 20 frames of 1000 bytes from port 0 reach XOFF at the 20th.
        for i in 0..20 {
            s.receive(0, 0, 2, fr(i, 1000, 3, 0)).unwrap();
        }
        let (port, f) = s.poll_control().expect("XOFF");
        assert_eq!(port, 0);
        assert!(matches!(f, PauseFrame::Pfc { class_enable: 8, quanta } if quanta[3] > 0));
        // Headroom: 10 more fit, the 11th is dropped.
        for i in 0..10 {
            s.receive(0, 0, 2, fr(100 + i, 1000, 3, 0)).unwrap();
        }
        assert_eq!(
            s.receive(0, 0, 2, fr(999, 1000, 3, 0)).unwrap_err().0,
            Drop::Ingress
        );
        // Draining below XON sends the XON.
        let mut t = 0;
        while s.queued(2) > 9_000 {
            t = s.poll_timeout().unwrap().max(t);
            while s.poll_transmit(t).is_some() {}
        }
        let (_, x) = s.poll_control().expect("XON");
        assert!(matches!(x, PauseFrame::Pfc { quanta, .. } if quanta[3] == 0));
        assert_eq!((s.counters.pfc_xoff, s.counters.pfc_xon), (1, 1));
        // Another priority is not lossless: no pause for it.
        s.receive(t, 1, 2, fr(7, 1000, 0, 0)).unwrap();
        assert!(s.poll_control().is_none());
    }

    #[test]
    fn a_paused_egress_class_waits_while_the_strict_cnp_class_goes_first() {
        let mut s: Switch<&str> = Switch::new(cfg(true, None)).unwrap();
        s.pause_frame(0, 2, &PauseFrame::pfc_one(3, 0xffff));
        s.receive(0, 0, 2, fr("data", 1000, 3, 0)).unwrap();
        s.receive(0, 1, 2, fr("other", 1000, 0, 0)).unwrap();
        s.receive(0, 1, 2, fr("cnp", 100, 6, 0)).unwrap();
        let a = s.poll_transmit(0).unwrap();
        assert_eq!(a.data, "cnp", "strict class first");
        let b = s.poll_transmit(a.done).unwrap();
        assert_eq!(b.data, "other", "the paused class waits");
        assert!(s.poll_transmit(b.done).is_none());
        s.pause_frame(b.done, 2, &PauseFrame::pfc_one(3, 0));
        assert_eq!(s.poll_transmit(b.done).unwrap().data, "data");
    }

    #[test]
    fn marks_ecn_capable_frames_by_the_queue_they_leave() {
        let red = Red {
            kmin: 5_000,
            kmax: 10_000,
            pmax: 1.0,
        };
        let mut s: Switch<u32> = Switch::new(cfg(false, Some(red))).unwrap();
        for i in 0..20 {
            let ecn = if i % 2 == 0 { codepoint::ECT0 } else { 0 };
            s.receive(0, 0, 2, fr(i, 1000, 3, ecn)).unwrap();
        }
        let mut t = 0;
        let mut marks = Vec::new();
        while let Some(d) = s.poll_transmit(t) {
            marks.push((d.data, d.ce));
            t = d.done;
        }
        // Above Kmax (10 000 queued) every ECN-capable frame is marked, never a Not-ECT one.
        assert!(marks[..10].iter().all(|(i, ce)| *ce == (i % 2 == 0)));
        assert!(marks.iter().all(|(i, ce)| !ce || i % 2 == 0));
        // Below Kmin (the last five leave with <= 5 000 queued) nothing is.
        assert!(marks[16..].iter().all(|(_, ce)| !ce));
        assert_eq!(s.counters.peak_queue[2], 20_000);
    }

    #[test]
    fn a_full_buffer_drops_and_says_why() {
        let mut c = cfg(false, None);
        c.buffer = 2500;
        let mut s: Switch<u32> = Switch::new(c).unwrap();
        s.receive(0, 0, 2, fr(1, 1000, 0, 0)).unwrap();
        s.receive(0, 1, 2, fr(2, 1000, 0, 0)).unwrap();
        assert_eq!(
            s.receive(0, 0, 2, fr(3, 1000, 0, 0)),
            Err((Drop::Buffer, 3))
        );
        assert_eq!(s.receive(0, 0, 9, fr(4, 10, 0, 0)), Err((Drop::NoPort, 4)));
        assert_eq!(s.counters.drops, [1, 1, 0]);
    }
}
