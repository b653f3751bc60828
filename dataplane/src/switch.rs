//! An emulated switch on DPDK ports: real Ethernet frames between RNICs (ring links in one
//! process, or any DPDK ports) through `dcb::switch` (shared buffer, ETS classes, RED/ECN
//! marking, PFC), with each egress shaped to a rate in real time and held for a propagation
//! delay, so congestion, marking and pauses happen on the wire where no switch exists.
//!
//! - Forwarding: a learning bridge. Source MACs are learned per port (at most
//!   [`MAX_MACS`]); a frame to a known MAC goes to its port, broadcast, multicast and
//!   unknown destinations are flooded (copied) to every other port.
//! - Priority: the VLAN PCP of a tagged frame, else DSCP / 8 of an IP frame, else 0 (mlx5's
//!   and Linux's default DSCP map).
//! - PFC: real 802.1Qbb frames (`dcb::pfc::PauseFrame`), generated from each ingress port's
//!   occupancy and sent ahead of that port's data; PFC frames received on a port pause its
//!   egress classes. MAC control frames are never forwarded.
//! - ECN: CE is set in the frame's IP header at dequeue (`roce::wire::frame::mark_ce`).
//!
//! The worker polls it like an RNIC ([`SwitchDev::poll`]), in the same loop.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use dcb::pfc::PauseFrame;
use dcb::switch::{ser_ns, Frame, Switch, SwitchConfig, SwitchCounters};
use pmd_bindings::{Mbuf, Mempool, Port, RxQueue, TxQueue};

use crate::config::FaultConfig;
pub use crate::config::SwitchSettings;
use crate::fault::{FaultCounters, Faults};
use crate::nic::Tap;

/// Most MAC addresses the bridge learns (further ones are flooded to).
pub const MAX_MACS: usize = 4096;
/// Most frames waiting out the propagation delay per egress port (more are dropped,
/// counted): 10 ms at 10 Gb/s of full-size frames.
const MAX_DELAYED: usize = 16_384;
const BURST: usize = 32;
/// Frames taken from a port per turn of its ingress link.
const RX_PER_TURN: usize = 8;
/// Turns of an ingress link per poll at most (catching up after a late poll).
const RX_TURNS: usize = 4;
/// How far back a late poll may catch up on an ingress link, ns.
const RX_CATCHUP_NS: u64 = 20_000;

/// The bytes queued at every egress port at one time (ns, the worker's clock).
pub type QueueSample = (u64, Vec<u64>);

/// Queue samples kept until taken, at most (later ones are dropped): 100 s at 100 us.
const MAX_SAMPLES: usize = 1 << 20;

/// Counters of the emulated switch besides the model's.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// The switch model's counters (frames, drops by reason, marks, PFC, queue peaks).
    pub model: SwitchCounters,
    /// Frames flooded (copies made).
    pub flooded: u64,
    /// Frames dropped because no mbuf was left for a copy or a PFC frame.
    pub nombuf: u64,
    /// Frames dropped because an egress delay line was full.
    pub delay_dropped: u64,
    /// Faults injected on egress, every port's summed.
    pub faults: FaultCounters,
}

impl SwitchStats {
    /// Every counter by name (`rnic-ctl stat` shows them as device `switch0`).
    pub fn counters(&self) -> Vec<(String, u64)> {
        let m = &self.model;
        let mut v: Vec<(String, u64)> = [
            ("rx_frames", m.rx_frames),
            ("tx_frames", m.tx_frames),
            ("drops_no_port", m.drops[0]),
            ("drops_buffer", m.drops[1]),
            ("drops_ingress", m.drops[2]),
            ("drops_delay_line", self.delay_dropped),
            ("drops_nombuf", self.nombuf),
            ("ecn_marked", m.marked),
            ("pfc_xoff_tx", m.pfc_xoff),
            ("pfc_xon_tx", m.pfc_xon),
            ("pfc_rx", m.pfc_rx),
            ("flooded", self.flooded),
            ("fault_lost", self.faults.lost),
            ("fault_duplicated", self.faults.duplicated),
            ("fault_corrupted", self.faults.corrupted),
            ("fault_reordered", self.faults.reordered),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (i, q) in m.peak_queue.iter().enumerate() {
            v.push((format!("peak_queue_bytes_port{i}"), *q));
        }
        v
    }
}

struct SwitchPort {
    _port: Port,
    /// The link's rate, Mb/s, and when its ingress side is free again.
    mbps: f64,
    rx_busy_until: u64,
    rx: RxQueue,
    tx: TxQueue,
    /// Frames waiting out the propagation delay, with their release time (in order).
    delayed: VecDeque<(u64, Mbuf)>,
    txbuf: Vec<Mbuf>,
    /// `SwitchSettings::fault` on what leaves this port.
    faults: Option<Faults>,
}

/// The emulated switch on its DPDK ports.
pub struct SwitchDev {
    ports: Vec<SwitchPort>,
    sw: Switch<Mbuf>,
    macs: HashMap<[u8; 6], usize>,
    /// Addresses fixed to a port (`SwitchDev::pin`), never learned elsewhere.
    pinned: Vec<[u8; 6]>,
    pool: Arc<Mempool>,
    mac: [u8; 6],
    delay_ns: u64,
    rxbuf: Vec<Mbuf>,
    /// Frames the fault injector let through, on their way to the delay line.
    faulted: Vec<Mbuf>,
    tap: Option<Tap>,
    /// Queue samples (`SwitchSettings::sample_us`), shared with whoever takes them.
    samples: Arc<Mutex<Vec<QueueSample>>>,
    sample_ns: u64,
    next_sample: u64,
    /// Counters.
    pub stats: SwitchStats,
}

impl SwitchDev {
    /// A switch over `ports` (started; their queue 0 is the switch's), taking copies and
    /// PFC frames from `pool`.
    pub fn new(
        ports: Vec<Port>,
        pool: Arc<Mempool>,
        s: &SwitchSettings,
    ) -> Result<SwitchDev, String> {
        if ports.is_empty() {
            return Err("a switch needs ports".into());
        }
        if s.delay_us > 10_000_000 {
            return Err(format!("switch delay {} us exceeds 10 s", s.delay_us));
        }
        let rates: Vec<f64> = (0..ports.len())
            .map(|i| s.port_mbps.get(i).copied().unwrap_or(s.rate_mbps))
            .collect();
        let sw = Switch::new(SwitchConfig {
            port_mbps: rates.clone(),
            buffer: s.buffer,
            red: s.red,
            pfc: s.pfc,
            thresholds: s.thresholds,
            headroom: s.headroom,
            ets: dcb::ets::EtsConfig::roce_default(),
            seed: 1,
        })?;
        let mut out = Vec::new();
        for (i, (p, mbps)) in ports.into_iter().zip(rates).enumerate() {
            let faults = s.fault.any().then(|| {
                Faults::new(FaultConfig {
                    seed: s.fault.seed.wrapping_add(i as u64),
                    ..s.fault
                })
            });
            let rx = p.rx_queue(0).map_err(|e| e.to_string())?;
            let tx = p.tx_queue(0).map_err(|e| e.to_string())?;
            out.push(SwitchPort {
                _port: p,
                mbps,
                rx_busy_until: 0,
                rx,
                tx,
                delayed: VecDeque::new(),
                txbuf: Vec::with_capacity(BURST),
                faults,
            });
        }
        Ok(SwitchDev {
            ports: out,
            sw,
            macs: HashMap::new(),
            pinned: Vec::new(),
            pool,
            mac: [0x02, 0, 0, 0x99, 0xfe, 0x01],
            delay_ns: s.delay_us as u64 * 1000,
            rxbuf: Vec::with_capacity(RX_PER_TURN),
            faulted: Vec::with_capacity(4),
            tap: match &s.pcap {
                Some(p) => Some(Tap::create(p, 262_144, true, "switch pcap")?),
                None => None,
            },
            samples: Arc::new(Mutex::new(Vec::new())),
            sample_ns: s.sample_us as u64 * 1000,
            next_sample: 0,
            stats: SwitchStats::default(),
        })
    }

    /// Fixes `mac` to `port`, as a static forwarding entry: a frame with that source arriving
    /// on another port does not move it. An RNIC behind the switch needs it where the far
    /// port echoes what the switch sends (a packet socket sees its own outgoing frames): the
    /// echo of the RNIC's frames would otherwise teach the switch that the RNIC is out there.
    pub fn pin(&mut self, mac: [u8; 6], port: usize) {
        if port < self.ports.len() {
            self.macs.insert(mac, port);
            self.pinned.push(mac);
        }
    }

    /// Where the queue samples go (empty unless `SwitchSettings::sample_us` is set).
    pub fn samples(&self) -> Arc<Mutex<Vec<QueueSample>>> {
        self.samples.clone()
    }

    /// Counters, with the model's and the fault injectors'.
    pub fn snapshot(&self) -> SwitchStats {
        let mut s = self.stats.clone();
        s.model = self.sw.counters.clone();
        for f in self.ports.iter().filter_map(|p| p.faults.as_ref()) {
            s.faults += f.counters;
        }
        s
    }

    /// Bytes queued at egress `port` now.
    pub fn queued(&self, port: usize) -> u64 {
        self.sw.queued(port)
    }

    /// One pass: receive on every port, run the switch, send what is due. Returns the work
    /// done; frames still queued or in flight count as work (the worker keeps polling, so
    /// the shaping and the delay run on time).
    pub fn poll(&mut self, now: u64) -> usize {
        let mut work = 0;
        for i in 0..self.ports.len() {
            // The link delivers no faster than its rate: a few frames per turn, then the
            // ingress side is busy for their serialisation time. A late poll catches up on
            // what the link would have delivered meanwhile (up to RX_CATCHUP_NS back), or the
            // link's rate would fall with the worker's iteration time.
            for _ in 0..RX_TURNS {
                let p = &mut self.ports[i];
                if p.rx_busy_until > now {
                    work += 1;
                    break;
                }
                // rxbuf has room for RX_PER_TURN frames and is empty here.
                let mut rx = std::mem::take(&mut self.rxbuf);
                let n = p.rx.rx_burst(&mut rx);
                let busy: u64 = rx.iter().map(|m| ser_ns(m.data_len() as u64, p.mbps)).sum();
                let start = p.rx_busy_until.max(now.saturating_sub(RX_CATCHUP_NS));
                p.rx_busy_until = if n == 0 { now } else { start + busy };
                work += n;
                for m in rx.drain(..) {
                    self.ingress(now, i, m);
                }
                self.rxbuf = rx;
                if n < RX_PER_TURN {
                    break;
                }
            }
        }
        if self.sw.poll_timeout().is_some_and(|t| t <= now) {
            self.sw.handle_timeout(now);
        }
        // PFC frames first, ahead of data on their port (they still take the delay).
        while let Some((port, f)) = self.sw.poll_control() {
            let Ok(mut m) = self.pool.alloc() else {
                self.stats.nombuf += 1;
                continue;
            };
            if m.extend_from_slice(&f.emit(self.mac)) {
                self.delay(port, now + self.delay_ns, m, true);
            }
            work += 1;
        }
        while let Some(d) = self.sw.poll_transmit(now) {
            let mut m = d.data;
            if d.ce && m.is_exclusive() {
                roce::wire::frame::mark_ce(m.data_mut());
            }
            let at = d.done + self.delay_ns;
            match self.ports[d.port].faults.as_mut() {
                Some(f) => {
                    let mut out = std::mem::take(&mut self.faulted);
                    f.pass(now, m, &self.pool, &mut out);
                    for m in out.drain(..) {
                        self.delay(d.port, at, m, false);
                    }
                    self.faulted = out;
                }
                None => self.delay(d.port, at, m, false),
            }
            work += 1;
        }
        // A frame a port's fault injector held back for reordering leaves on its own once
        // no other frame overtook it in time (`Faults::release`); while one is held the
        // switch counts as busy.
        for port in 0..self.ports.len() {
            let Some(f) = self.ports[port].faults.as_mut() else {
                continue;
            };
            let mut out = std::mem::take(&mut self.faulted);
            f.release(now, &mut out, BURST);
            work += usize::from(f.waiting());
            for m in out.drain(..) {
                self.delay(port, now + self.delay_ns, m, false);
            }
            self.faulted = out;
        }
        for p in self.ports.iter_mut() {
            while p.delayed.front().is_some_and(|(t, _)| *t <= now) && p.txbuf.len() < BURST {
                if let Some((_, m)) = p.delayed.pop_front() {
                    if let Some(t) = self.tap.as_mut() {
                        t.write_mbuf(now, &m);
                    }
                    p.txbuf.push(m);
                }
            }
            if !p.txbuf.is_empty() {
                // What the far end's ring cannot take yet waits here (at most a burst; the
                // rest waits in the delay line): the ring is the link partner's receive
                // buffer, which the RNIC drains every iteration.
                work += p.tx.tx_burst(&mut p.txbuf);
            }
            if !p.delayed.is_empty() || !p.txbuf.is_empty() {
                work += 1;
            }
        }
        if (0..self.ports.len()).any(|p| self.sw.queued(p) > 0) {
            work += 1;
        }
        if self.sample_ns > 0 && now >= self.next_sample {
            self.next_sample = now - now % self.sample_ns + self.sample_ns;
            let q = (0..self.ports.len()).map(|p| self.sw.queued(p)).collect();
            if let Ok(mut v) = self.samples.lock() {
                if v.len() < MAX_SAMPLES {
                    v.push((now, q));
                }
            }
        }
        work
    }

    fn delay(&mut self, port: usize, at: u64, m: Mbuf, front: bool) {
        let p = &mut self.ports[port];
        if p.delayed.len() >= MAX_DELAYED {
            self.stats.delay_dropped += 1;
            return;
        }
        if front {
            // Ahead of data not yet due: before the first entry released later than it.
            let i = p.delayed.partition_point(|(t, _)| *t <= at);
            p.delayed.insert(i, (at, m));
        } else {
            p.delayed.push_back((at, m));
        }
    }

    fn ingress(&mut self, now: u64, port: usize, m: Mbuf) {
        let d = m.data();
        if d.len() < 14 {
            return;
        }
        if d[12..14] == roce::wire::ethernet::ethertype::MAC_CONTROL.to_be_bytes() {
            // The switch's own pause frames echoed back by a port are not the partner's.
            if d[6..12] == self.mac {
                return;
            }
            if let Some(f) = PauseFrame::parse(d) {
                self.sw.pause_frame(now, port, &f);
            }
            return;
        }
        let dst: [u8; 6] = d[..6].try_into().expect("14 bytes");
        let src: [u8; 6] = d[6..12].try_into().expect("14 bytes");
        if src[0] & 1 == 0
            && !self.pinned.contains(&src)
            && (self.macs.len() < MAX_MACS || self.macs.contains_key(&src))
        {
            self.macs.insert(src, port);
        }
        let (priority, ecn) = classify(d);
        let bytes = d.len() as u64;
        match self.macs.get(&dst).copied() {
            Some(out) if dst[0] & 1 == 0 => {
                if out != port {
                    let _ = self.sw.receive(
                        now,
                        port,
                        out,
                        Frame {
                            data: m,
                            bytes,
                            priority,
                            ecn,
                        },
                    );
                }
            }
            _ => {
                for out in (0..self.ports.len()).filter(|o| *o != port) {
                    let Ok(mut c) = self.pool.alloc() else {
                        self.stats.nombuf += 1;
                        continue;
                    };
                    if !c.extend_from_slice(m.data()) {
                        continue;
                    }
                    self.stats.flooded += 1;
                    let _ = self.sw.receive(
                        now,
                        port,
                        out,
                        Frame {
                            data: c,
                            bytes,
                            priority,
                            ecn,
                        },
                    );
                }
            }
        }
    }
}

/// A frame's priority (VLAN PCP, else DSCP / 8 of IPv4/IPv6, else 0) and IP ECN field.
fn classify(d: &[u8]) -> (u8, u8) {
    let mut et = u16::from_be_bytes([d[12], d[13]]);
    let mut l3 = 14;
    let mut pcp = None;
    if et == 0x8100 && d.len() >= 18 {
        pcp = Some(d[14] >> 5);
        et = u16::from_be_bytes([d[16], d[17]]);
        l3 = 18;
    }
    let tos = match et {
        0x0800 if d.len() > l3 + 1 => d[l3 + 1],
        0x86dd if d.len() > l3 + 1 => (d[l3] << 4) | (d[l3 + 1] >> 4),
        _ => 0,
    };
    (pcp.unwrap_or(tos >> 5), tos & 3)
}

#[cfg(test)]
mod tests {
    use super::classify;

    #[test]
    fn priority_from_pcp_or_dscp_and_the_ecn_field() {
        let mut f = vec![0u8; 60];
        f[12] = 0x08;
        // IPv4, DSCP 26 (priority 3), ECT(0).
        f[15] = (26 << 2) | 2;
        assert_eq!(classify(&f), (3, 2));
        // Tagged with PCP 5: the tag wins.
        let mut t = vec![0u8; 64];
        t[12..14].copy_from_slice(&[0x81, 0x00]);
        t[14] = 5 << 5;
        t[16..18].copy_from_slice(&[0x08, 0x00]);
        t[19] = (26 << 2) | 3;
        assert_eq!(classify(&t), (5, 3));
        // IPv6, traffic class DSCP 48 (priority 6), Not-ECT.
        let mut v = vec![0u8; 80];
        v[12..14].copy_from_slice(&[0x86, 0xdd]);
        v[14] = 0x60 | (48 >> 2);
        v[15] = (48 & 3) << 6;
        assert_eq!(classify(&v), (6, 0));
        // ARP: priority 0.
        let mut a = vec![0u8; 60];
        a[12..14].copy_from_slice(&[0x08, 0x06]);
        assert_eq!(classify(&a), (0, 0));
    }
}
