//! Priority-based Flow Control (IEEE 802.1Qbb) and link-wide PAUSE (802.3x), sans-IO.
//!
//! - [`PauseState`] is the transmit side: PFC frames the port received pause its priorities
//!   for `quanta x 512` bit times at the port's speed; a time of 0 resumes; a new frame
//!   replaces (refreshes) the running time. A PAUSE frame pauses every priority.
//! - [`Ingress`] is the receive side: per-priority ingress occupancy against XOFF/XON
//!   thresholds; it asks for an XOFF when a priority passes XOFF, refreshes it before the pause
//!   it asked for runs out, and asks for an XON once the priority drains below XON.
//! - [`Watchdog`] detects a priority paused continuously for longer than the detection time (a
//!   PFC storm) and holds its action until no pause arrived for the restoration time.
//!
//! Time is nanoseconds, passed in (`now`); speeds are Mb/s.

/// Priorities (and PFC classes).
pub const PRIORITIES: usize = 8;
/// Quanta of the longest pause, and of the XOFF frames [`Ingress`] sends by default.
pub const MAX_QUANTA: u16 = 0xffff;

/// How long `quanta` pause quanta last at `speed_mbps`, in nanoseconds (rounded up): one
/// quantum is 512 bit times (802.1Qbb 36.1.3.1; 5.12 ns at 100 Gb/s, 20.48 ns at 25 Gb/s).
pub fn pause_ns(quanta: u16, speed_mbps: u64) -> u64 {
    // quanta x 512 bits / (speed_mbps x 10^6 bit/s) in ns = quanta x 512 000 / speed_mbps.
    (quanta as u64 * 512_000).div_ceil(speed_mbps.max(1))
}

/// Flow control mode of a port: PFC and PAUSE are mutually exclusive (802.1Qbb 36.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Neither: pause frames are counted and ignored.
    Off,
    /// 802.3x PAUSE: one pause for the whole link.
    Pause,
    /// PFC on the priorities whose bit is set.
    Pfc {
        /// Enabled priorities (bit n = priority n).
        enabled: u8,
    },
}

/// A received pause frame, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PauseFrame {
    /// 802.1Qbb PFC: class-enable vector and a time per priority.
    Pfc {
        /// Bit n: the time for priority n is valid.
        class_enable: u8,
        /// Quanta per priority.
        quanta: [u16; PRIORITIES],
    },
    /// 802.3x PAUSE: one time for the link.
    Pause {
        /// Quanta.
        quanta: u16,
    },
}

/// The destination of MAC control frames (802.3 Annex 31B).
pub const MAC_CONTROL_DST: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x01];
/// The MAC control EtherType.
pub const MAC_CONTROL_ETHERTYPE: u16 = 0x8808;
/// MAC control opcodes: PAUSE (802.3x) and PFC (802.1Qbb).
const OPCODE_PAUSE: u16 = 0x0001;
const OPCODE_PFC: u16 = 0x0101;

impl PauseFrame {
    /// Decodes a received Ethernet frame (untagged, as MAC control frames are): PFC is
    /// opcode 0x0101 with a class-enable vector (its low byte) and eight times; PAUSE is
    /// opcode 0x0001 with one time (802.1Qbb 36.1.3.1, 802.3 31B.2). The destination is
    /// not checked here (ports also accept their own address).
    pub fn parse(frame: &[u8]) -> Option<PauseFrame> {
        let be = |i: usize| Some(u16::from_be_bytes([*frame.get(i)?, *frame.get(i + 1)?]));
        if be(12)? != MAC_CONTROL_ETHERTYPE {
            return None;
        }
        match be(14)? {
            OPCODE_PAUSE => Some(PauseFrame::Pause { quanta: be(16)? }),
            OPCODE_PFC => {
                let class_enable = be(16)? as u8;
                let mut quanta = [0u16; PRIORITIES];
                for (p, q) in quanta.iter_mut().enumerate() {
                    *q = be(18 + 2 * p)?;
                }
                Some(PauseFrame::Pfc {
                    class_enable,
                    quanta,
                })
            }
            _ => None,
        }
    }

    /// The frame on the wire from `src` (60 bytes before the FCS, zero padded).
    pub fn emit(&self, src: [u8; 6]) -> [u8; 60] {
        let mut f = [0u8; 60];
        f[..6].copy_from_slice(&MAC_CONTROL_DST);
        f[6..12].copy_from_slice(&src);
        f[12..14].copy_from_slice(&MAC_CONTROL_ETHERTYPE.to_be_bytes());
        match self {
            PauseFrame::Pause { quanta } => {
                f[14..16].copy_from_slice(&OPCODE_PAUSE.to_be_bytes());
                f[16..18].copy_from_slice(&quanta.to_be_bytes());
            }
            PauseFrame::Pfc {
                class_enable,
                quanta,
            } => {
                f[14..16].copy_from_slice(&OPCODE_PFC.to_be_bytes());
                f[17] = *class_enable;
                for (p, q) in quanta.iter().enumerate() {
                    f[18 + 2 * p..20 + 2 * p].copy_from_slice(&q.to_be_bytes());
                }
            }
        }
        f
    }

    /// A PFC frame for priority `p` alone, with `quanta` (0 = XON).
    pub fn pfc_one(p: usize, quanta: u16) -> PauseFrame {
        let mut q = [0u16; PRIORITIES];
        q[p] = quanta;
        PauseFrame::Pfc {
            class_enable: 1 << p,
            quanta: q,
        }
    }
}

/// Counters of the transmit side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PauseCounters {
    /// PFC frames received per priority (the class was enabled in the frame).
    pub rx_pfc: [u64; PRIORITIES],
    /// PAUSE frames received.
    pub rx_pause: u64,
    /// Frames ignored: flow control off, or a PFC/PAUSE frame in the other mode.
    pub rx_ignored: u64,
    /// Nanoseconds each priority spent paused (accounted when a pause ends or is replaced).
    pub paused_ns: [u64; PRIORITIES],
}

/// The transmit side: which priorities the peer has paused, until when.
#[derive(Debug, Clone)]
pub struct PauseState {
    mode: Mode,
    speed_mbps: u64,
    /// Paused since / until, per priority.
    since: [Option<u64>; PRIORITIES],
    until: [Option<u64>; PRIORITIES],
    /// Counters.
    pub counters: PauseCounters,
}

impl PauseState {
    /// A port in `mode` at `speed_mbps`.
    pub fn new(mode: Mode, speed_mbps: u64) -> PauseState {
        PauseState {
            mode,
            speed_mbps,
            since: [None; PRIORITIES],
            until: [None; PRIORITIES],
            counters: PauseCounters::default(),
        }
    }

    /// The mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    fn set(&mut self, p: usize, now: u64, quanta: u16) {
        self.expire(p, now);
        if quanta == 0 {
            // XON: resume at once.
            if let Some(s) = self.since[p].take() {
                self.counters.paused_ns[p] += now.saturating_sub(s);
            }
            self.until[p] = None;
        } else {
            // XOFF, or a refresh: the new time replaces what was left of the old one.
            self.since[p].get_or_insert(now);
            self.until[p] = Some(now + pause_ns(quanta, self.speed_mbps));
        }
    }

    /// Ends priority `p`'s pause if its time ran out by `now`.
    fn expire(&mut self, p: usize, now: u64) {
        if let Some(u) = self.until[p] {
            if u <= now {
                if let Some(s) = self.since[p].take() {
                    self.counters.paused_ns[p] += u.saturating_sub(s);
                }
                self.until[p] = None;
            }
        }
    }

    /// A pause frame arrived at `now`.
    pub fn handle_frame(&mut self, now: u64, f: &PauseFrame) {
        match (self.mode, f) {
            (
                Mode::Pfc { enabled },
                PauseFrame::Pfc {
                    class_enable,
                    quanta,
                },
            ) => {
                for (p, &q) in quanta.iter().enumerate() {
                    if class_enable & (1 << p) == 0 {
                        continue;
                    }
                    self.counters.rx_pfc[p] += 1;
                    // A class not enabled on this port is counted, not acted on.
                    if enabled & (1 << p) != 0 {
                        self.set(p, now, q);
                    }
                }
            }
            (Mode::Pause, PauseFrame::Pause { quanta }) => {
                self.counters.rx_pause += 1;
                for p in 0..PRIORITIES {
                    self.set(p, now, *quanta);
                }
            }
            _ => self.counters.rx_ignored += 1,
        }
    }

    /// Whether priority `p` may not transmit at `now`.
    pub fn is_paused(&self, p: usize, now: u64) -> bool {
        self.until
            .get(p)
            .copied()
            .flatten()
            .is_some_and(|u| u > now)
    }

    /// The paused priorities at `now` (bit n = priority n).
    pub fn paused_mask(&self, now: u64) -> u8 {
        (0..PRIORITIES).fold(0, |m, p| m | ((self.is_paused(p, now) as u8) << p))
    }

    /// When the earliest running pause ends (call [`PauseState::handle_timeout`] then).
    pub fn poll_timeout(&self) -> Option<u64> {
        self.until.iter().flatten().copied().min()
    }

    /// Accounts the pauses that ended by `now`.
    pub fn handle_timeout(&mut self, now: u64) {
        for p in 0..PRIORITIES {
            self.expire(p, now);
        }
    }

    /// Since when priority `p` has been paused without a break (for the watchdog).
    pub fn paused_since(&self, p: usize, now: u64) -> Option<u64> {
        if self.is_paused(p, now) {
            self.since[p]
        } else {
            None
        }
    }
}

/// XOFF/XON thresholds of one priority's ingress buffer, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Thresholds {
    /// Send XOFF when the occupancy reaches this.
    pub xoff: u64,
    /// Send XON when it falls to this or below.
    pub xon: u64,
}

impl Thresholds {
    /// mlx5's sizing rule for a `buffer`-byte priority buffer: headroom for what is in flight
    /// once XOFF is sent = (301 + 2.16 x cable metres) x speed in Gb/s + 2.72 x MTU bytes,
    /// with speeds below 40 Gb/s counted as 40 (the driver's floor); XOFF = buffer - headroom;
    /// XON one MTU below XOFF, as the driver sets it (ref. dcb.md "PFC"). `None` if the buffer
    /// cannot hold the headroom.
    pub fn mlx5(buffer: u64, cable_m: f64, speed_gbps: f64, mtu: u64) -> Option<Thresholds> {
        let speed = speed_gbps.max(40.0);
        let headroom = ((301.0 + 2.16 * cable_m) * speed + 2.72 * mtu as f64).ceil() as u64;
        let xoff = buffer.checked_sub(headroom)?;
        Some(Thresholds {
            xoff,
            xon: xoff.saturating_sub(mtu),
        })
    }
}

/// What the receive side asks the port to send: a frame of the form the peer receives (a
/// PFC frame with the classes in `class_enable` and their quanta, or a PAUSE frame; quanta 0
/// = XON / resume).
pub type Send = PauseFrame;

/// Counters of the receive side.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngressCounters {
    /// XOFF frames asked for per priority (refreshes included).
    pub tx_xoff: [u64; PRIORITIES],
    /// XON frames asked for per priority.
    pub tx_xon: [u64; PRIORITIES],
    /// Bytes that arrived while a priority's buffer was full (headroom exhausted).
    pub overflow_bytes: [u64; PRIORITIES],
}

/// The receive side: ingress occupancy per priority and the pause frames it calls for.
#[derive(Debug, Clone)]
pub struct Ingress {
    mode: Mode,
    /// Half the pause time of `quanta` at the port's speed (at least 1 ns): the refresh
    /// interval of an XOFF in force.
    refresh_ns: u64,
    /// Every priority's thresholds and buffer.
    thresholds: Thresholds,
    capacity: u64,
    occupancy: [u64; PRIORITIES],
    quanta: u16,
    /// When the XOFF in force was sent (`None`: not pausing the peer).
    xoff_at: [Option<u64>; PRIORITIES],
    /// Counters.
    pub counters: IngressCounters,
}

impl Ingress {
    /// A port in `mode` at `speed_mbps` whose priorities have `capacity` bytes of buffer and
    /// `thresholds`; XOFF frames carry `quanta`.
    pub fn new(
        mode: Mode,
        speed_mbps: u64,
        capacity: u64,
        thresholds: Thresholds,
        quanta: u16,
    ) -> Ingress {
        let quanta = quanta.max(1);
        Ingress {
            mode,
            refresh_ns: (pause_ns(quanta, speed_mbps) / 2).max(1),
            thresholds,
            capacity,
            occupancy: [0; PRIORITIES],
            quanta,
            xoff_at: [None; PRIORITIES],
            counters: IngressCounters::default(),
        }
    }

    fn lossless(&self, p: usize) -> bool {
        match self.mode {
            Mode::Off => false,
            Mode::Pause => true,
            Mode::Pfc { enabled } => enabled & (1 << p) != 0,
        }
    }

    fn frame(&self, p: usize, quanta: u16) -> Send {
        match self.mode {
            Mode::Pause => Send::Pause { quanta },
            _ => Send::pfc_one(p, quanta),
        }
    }

    /// The pause state priority `p` is judged in: PAUSE (802.3x) pauses the whole link, so
    /// one state for every priority; PFC one per priority.
    fn slot(&self, p: usize) -> usize {
        match self.mode {
            Mode::Pause => 0,
            _ => p,
        }
    }

    /// The occupancy PAUSE mode judges (the sum of every priority) or priority `p`'s.
    fn level(&self, p: usize) -> u64 {
        match self.mode {
            Mode::Pause => self.occupancy.iter().sum(),
            _ => self.occupancy[p],
        }
    }

    /// `bytes` of priority `p` arrived; returns false if they do not fit (the caller drops
    /// them: headroom exhausted, or a lossy priority's buffer full), and the frame to send,
    /// if any.
    pub fn enqueue(&mut self, p: usize, bytes: u64, now: u64) -> (bool, Option<Send>) {
        let p = p % PRIORITIES;
        if self.occupancy[p] + bytes > self.capacity {
            self.counters.overflow_bytes[p] += bytes;
            return (false, None);
        }
        self.occupancy[p] += bytes;
        let k = self.slot(p);
        if self.lossless(p) && self.xoff_at[k].is_none() && self.level(p) >= self.thresholds.xoff {
            self.xoff_at[k] = Some(now);
            self.counters.tx_xoff[k] += 1;
            return (true, Some(self.frame(k, self.quanta)));
        }
        (true, None)
    }

    /// `bytes` of priority `p` left the buffer; returns the XON to send, if any.
    pub fn dequeue(&mut self, p: usize, bytes: u64) -> Option<Send> {
        let p = p % PRIORITIES;
        self.occupancy[p] = self.occupancy[p].saturating_sub(bytes);
        let k = self.slot(p);
        if self.xoff_at[k].is_some() && self.level(p) <= self.thresholds.xon {
            self.xoff_at[k] = None;
            self.counters.tx_xon[k] += 1;
            return Some(self.frame(k, 0));
        }
        None
    }

    /// When a refresh is due: half the pause time after the XOFF in force, so the peer never
    /// resumes while the buffer is still above XON.
    pub fn poll_timeout(&self) -> Option<u64> {
        self.xoff_at
            .iter()
            .flatten()
            .map(|t| t + self.refresh_ns)
            .min()
    }

    /// Refreshes the XOFFs due at `now`; returns the frames to send.
    pub fn handle_timeout(&mut self, now: u64, out: &mut Vec<Send>) {
        for p in 0..PRIORITIES {
            if let Some(t) = self.xoff_at[p] {
                if now >= t + self.refresh_ns {
                    self.xoff_at[p] = Some(now);
                    self.counters.tx_xoff[p] += 1;
                    out.push(self.frame(p, self.quanta));
                }
            }
        }
    }

    /// Bytes of priority `p` held.
    pub fn occupancy(&self, p: usize) -> u64 {
        self.occupancy[p % PRIORITIES]
    }

    /// Whether the peer is being paused for priority `p` (in PAUSE mode: the link).
    pub fn pausing(&self, p: usize) -> bool {
        self.xoff_at[self.slot(p % PRIORITIES)].is_some()
    }
}

/// What the watchdog does with a stormed priority (SONiC's actions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StormAction {
    /// Discard the priority's queued and new packets, and the pause frames for it, so the
    /// storm does not propagate.
    Drop,
    /// Ignore the pause frames for it and keep sending.
    Forward,
}

/// A watchdog event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StormEvent {
    /// Priority `0` was paused continuously past the detection time.
    Detected(usize),
    /// Priority `0` saw no pause for the restoration time: back to normal.
    Restored(usize),
}

/// Watchdog counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchdogCounters {
    /// Storms detected per priority.
    pub detected: [u64; PRIORITIES],
    /// Storms ended per priority.
    pub restored: [u64; PRIORITIES],
}

/// PFC storm detection: a priority paused continuously for longer than `detect_ns` is
/// stormed; its action holds until no pause frame for it arrived for `restore_ns`.
#[derive(Debug, Clone)]
pub struct Watchdog {
    detect_ns: u64,
    restore_ns: u64,
    action: StormAction,
    stormed: [bool; PRIORITIES],
    last_pause: [Option<u64>; PRIORITIES],
    /// Counters.
    pub counters: WatchdogCounters,
}

impl Watchdog {
    /// A watchdog with these times (SONiC's defaults: 200 ms each).
    pub fn new(detect_ns: u64, restore_ns: u64, action: StormAction) -> Watchdog {
        Watchdog {
            detect_ns,
            restore_ns,
            action,
            stormed: [false; PRIORITIES],
            last_pause: [None; PRIORITIES],
            counters: WatchdogCounters::default(),
        }
    }

    /// The action for stormed priorities.
    pub fn action(&self) -> StormAction {
        self.action
    }

    /// A pause frame for priority `p` arrived (call for every one, stormed or not).
    pub fn pause_received(&mut self, p: usize, now: u64) {
        self.last_pause[p % PRIORITIES] = Some(now);
    }

    /// Whether priority `p` is stormed: its pauses are not honoured.
    pub fn stormed(&self, p: usize) -> bool {
        self.stormed[p % PRIORITIES]
    }

    /// Checks every priority against `pause`'s state at `now`. Under 802.3x PAUSE one pause
    /// stops the whole link, so a storm is one storm (reported and counted as priority 0's)
    /// that holds every priority, not eight.
    pub fn poll(&mut self, pause: &PauseState, now: u64, events: &mut Vec<StormEvent>) {
        if pause.mode() == Mode::Pause {
            self.poll_priority(0, pause, now, events);
            self.stormed = [self.stormed[0]; PRIORITIES];
            return;
        }
        for p in 0..PRIORITIES {
            self.poll_priority(p, pause, now, events);
        }
    }

    /// Checks priority `p`: detected once paused for `detect_ns`, restored once no pause
    /// came for `restore_ns`.
    fn poll_priority(
        &mut self,
        p: usize,
        pause: &PauseState,
        now: u64,
        events: &mut Vec<StormEvent>,
    ) {
        if !self.stormed[p] {
            if pause
                .paused_since(p, now)
                .is_some_and(|s| now.saturating_sub(s) >= self.detect_ns)
            {
                self.stormed[p] = true;
                self.counters.detected[p] += 1;
                events.push(StormEvent::Detected(p));
            }
        } else if self.last_pause[p].is_none_or(|t| now.saturating_sub(t) >= self.restore_ns) {
            self.stormed[p] = false;
            self.counters.restored[p] += 1;
            events.push(StormEvent::Restored(p));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G100: u64 = 100_000;
    const G25: u64 = 25_000;

    fn pfc(p: usize, quanta: u16) -> PauseFrame {
        PauseFrame::pfc_one(p, quanta)
    }

    #[test]
    fn frames_round_trip_through_the_wire_format() {
        let src = [2, 0, 0, 0x99, 0, 3];
        for f in [
            pfc(3, 0xffff),
            pfc(0, 0),
            PauseFrame::Pfc {
                class_enable: 0b1000_0001,
                quanta: [1, 2, 3, 4, 5, 6, 7, 8],
            },
            PauseFrame::Pause { quanta: 77 },
        ] {
            let b = f.emit(src);
            assert_eq!(&b[..6], &MAC_CONTROL_DST);
            assert_eq!(PauseFrame::parse(&b), Some(f));
        }
        // A PFC frame as 802.1Qbb lays it out: priority 3 for 0x1234 quanta.
        let mut raw = [0u8; 60];
        raw[12..14].copy_from_slice(&[0x88, 0x08]);
        raw[14..18].copy_from_slice(&[0x01, 0x01, 0x00, 0x08]);
        raw[24..26].copy_from_slice(&[0x12, 0x34]);
        match PauseFrame::parse(&raw) {
            Some(PauseFrame::Pfc {
                class_enable: 8,
                quanta,
            }) => assert_eq!(quanta[3], 0x1234),
            other => panic!("{other:?}"),
        }
        assert_eq!(PauseFrame::parse(&raw[..20]), None, "truncated");
        raw[15] = 0x02;
        assert_eq!(PauseFrame::parse(&raw), None, "another MAC control opcode");
    }

    #[test]
    fn quanta_last_512_bit_times() {
        // 100 Gb/s: 5.12 ns a quantum; 25 Gb/s: 20.48 ns.
        assert_eq!(pause_ns(1000, G100), 5120);
        assert_eq!(pause_ns(1000, G25), 20480);
        assert_eq!(pause_ns(0xffff, G100), 335_540); // 335 539.2 rounded up
        assert_eq!(pause_ns(0xffff, G25), 1_342_157); // 1 342 156.8
        assert_eq!(pause_ns(1, 10_000), 52); // 51.2
    }

    #[test]
    fn pfc_pauses_refreshes_and_resumes() {
        let mut s = PauseState::new(Mode::Pfc { enabled: 1 << 3 }, G100);
        s.handle_frame(1000, &pfc(3, 1000)); // 5120 ns
        assert!(s.is_paused(3, 1000) && s.is_paused(3, 6119));
        assert!(!s.is_paused(3, 6120), "expires after exactly 1000 quanta");
        assert!(!s.is_paused(2, 2000), "other priorities run");
        assert_eq!(s.paused_mask(2000), 1 << 3);
        assert_eq!(s.poll_timeout(), Some(6120));
        // A refresh before expiry extends from its own arrival.
        s.handle_frame(5000, &pfc(3, 1000));
        assert!(s.is_paused(3, 10_119) && !s.is_paused(3, 10_120));
        // Quanta 0 resumes at once.
        s.handle_frame(7000, &pfc(3, 0));
        assert!(!s.is_paused(3, 7000));
        assert_eq!(s.counters.paused_ns[3], 6000);
        assert_eq!(s.counters.rx_pfc[3], 3);
        // A class not enabled on the port is counted, not honoured.
        s.handle_frame(8000, &pfc(5, 0xffff));
        assert!(!s.is_paused(5, 8001));
        assert_eq!(s.counters.rx_pfc[5], 1);
        // PAUSE on a PFC port is ignored.
        s.handle_frame(9000, &PauseFrame::Pause { quanta: 100 });
        assert_eq!(s.counters.rx_ignored, 1);
        assert_eq!(s.paused_mask(9001), 0);
        // Expiry is accounted.
        s.handle_frame(20_000, &pfc(3, 200)); // 1024 ns at 100G
        s.handle_timeout(30_000);
        assert_eq!(s.counters.paused_ns[3], 6000 + 1024);
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn link_pause_stops_every_priority() {
        let mut s = PauseState::new(Mode::Pause, G25);
        s.handle_frame(0, &PauseFrame::Pause { quanta: 100 }); // 2048 ns
        assert_eq!(s.paused_mask(2047), 0xff);
        assert_eq!(s.paused_mask(2048), 0);
        s.handle_frame(3000, &pfc(3, 100));
        assert_eq!(s.counters.rx_ignored, 1, "PFC on a PAUSE port");
    }

    #[test]
    fn mlx5_headroom_rule() {
        // 100 Gb/s, 3 m cable, MTU 4096, 256 KiB buffer: headroom (301 + 6.48) x 100 + 2.72 x
        // 4096 = 30 748 + 11 141.12 = 41 889.12 -> 41 890 bytes.
        let t = Thresholds::mlx5(262_144, 3.0, 100.0, 4096).unwrap();
        assert_eq!(t.xoff, 262_144 - 41_890);
        assert_eq!(
            t.xon,
            t.xoff - 4096,
            "XON one MTU below XOFF, as the driver sets it"
        );
        assert!(Thresholds::mlx5(10_000, 3.0, 100.0, 4096).is_none());
        // Below 40 Gb/s the driver sizes for 40: 25 Gb/s gets 40 Gb/s's headroom,
        // (301 + 6.48) x 40 + 11 141.12 = 23 440.32 -> 23 441 bytes.
        let slow = Thresholds::mlx5(262_144, 3.0, 25.0, 4096).unwrap();
        assert_eq!(slow, Thresholds::mlx5(262_144, 3.0, 40.0, 4096).unwrap());
        assert_eq!(slow.xoff, 262_144 - 23_441);
    }

    /// 802.3x PAUSE stops the whole link: the summed occupancy of every priority sends one
    /// XOFF, not one per priority, and one XON when the sum drains.
    #[test]
    fn pause_mode_has_one_state_for_the_link() {
        let th = Thresholds {
            xoff: 10_000,
            xon: 5_000,
        };
        let mut g = Ingress::new(Mode::Pause, G100, 40_000, th, 0xffff);
        assert_eq!(g.enqueue(0, 6_000, 0), (true, None));
        let (ok, f) = g.enqueue(3, 6_000, 10);
        assert!(ok);
        assert_eq!(
            f,
            Some(Send::Pause { quanta: 0xffff }),
            "the sum passed XOFF"
        );
        assert_eq!(
            g.enqueue(5, 1_000, 20),
            (true, None),
            "the link is paused already"
        );
        assert!(g.pausing(0) && g.pausing(5));
        assert_eq!(g.counters.tx_xoff.iter().sum::<u64>(), 1);
        assert_eq!(g.dequeue(3, 6_000), None, "7 000 still held, above XON");
        assert_eq!(g.dequeue(0, 6_000), Some(Send::Pause { quanta: 0 }));
        assert!(!g.pausing(3));
    }

    #[test]
    fn ingress_xoff_refresh_and_xon() {
        let th = Thresholds {
            xoff: 10_000,
            xon: 5_000,
        };
        let mut g = Ingress::new(Mode::Pfc { enabled: 1 << 3 }, G100, 20_000, th, 0xffff);
        assert_eq!(g.enqueue(3, 9_000, 0), (true, None));
        let (ok, f) = g.enqueue(3, 1_000, 10);
        assert!(ok);
        assert_eq!(f, Some(pfc_send(3, 0xffff)));
        assert!(g.pausing(3));
        // Only one XOFF while paused.
        assert_eq!(g.enqueue(3, 1_000, 20).1, None);
        // Refresh at half the pause time (335 540 / 2 = 167 770 ns after the XOFF).
        assert_eq!(g.poll_timeout(), Some(10 + 167_770));
        let mut out = Vec::new();
        g.handle_timeout(167_779, &mut out);
        assert!(out.is_empty());
        g.handle_timeout(167_780, &mut out);
        assert_eq!(out, vec![pfc_send(3, 0xffff)]);
        assert_eq!(g.poll_timeout(), Some(167_780 + 167_770));
        // XON once drained to XON.
        assert_eq!(g.dequeue(3, 5_000), None); // 6 000 left
        assert_eq!(g.dequeue(3, 1_000), Some(pfc_send(3, 0)));
        assert!(!g.pausing(3));
        assert_eq!(g.poll_timeout(), None);
        assert_eq!(g.counters.tx_xoff[3], 2);
        assert_eq!(g.counters.tx_xon[3], 1);
        // Beyond capacity: refused, counted.
        assert!(!g.enqueue(3, 20_000, 30).0);
        assert_eq!(g.counters.overflow_bytes[3], 20_000);
        // A lossy priority never pauses the peer.
        assert_eq!(g.enqueue(0, 15_000, 40), (true, None));
    }

    fn pfc_send(p: usize, quanta: u16) -> Send {
        PauseFrame::pfc_one(p, quanta)
    }

    #[test]
    fn watchdog_detects_and_restores() {
        const MS: u64 = 1_000_000;
        let mut s = PauseState::new(Mode::Pfc { enabled: 0xff }, G100);
        let mut w = Watchdog::new(200 * MS, 200 * MS, StormAction::Drop);
        let mut ev = Vec::new();
        // A storm: XOFF refreshed every 100 us for 250 ms.
        let mut t = 0;
        while t <= 250 * MS {
            s.handle_frame(t, &pfc(4, 0xffff));
            w.pause_received(4, t);
            w.poll(&s, t, &mut ev);
            t += 100_000;
        }
        assert_eq!(ev, vec![StormEvent::Detected(4)]);
        let detected_at = 200 * MS;
        assert!(w.stormed(4));
        // Not yet restored 199 ms after the last pause...
        let last = t - 100_000;
        ev.clear();
        w.poll(&s, last + 199 * MS, &mut ev);
        assert!(ev.is_empty() && w.stormed(4));
        // ...restored at 200 ms.
        w.poll(&s, last + 200 * MS, &mut ev);
        assert_eq!(ev, vec![StormEvent::Restored(4)]);
        assert_eq!((w.counters.detected[4], w.counters.restored[4]), (1, 1));
        assert!(detected_at <= last);
        // Short pauses never trigger it.
        let mut w2 = Watchdog::new(200 * MS, 200 * MS, StormAction::Forward);
        let mut s2 = PauseState::new(Mode::Pfc { enabled: 0xff }, G100);
        for i in 0..1000u64 {
            let t = i * MS;
            s2.handle_frame(t, &pfc(1, 1000));
            w2.pause_received(1, t);
            w2.poll(&s2, t + 500_000, &mut ev);
        }
        assert!(!w2.stormed(1));
    }

    /// An 802.3x PAUSE storm stops the whole link: one storm detected and one restored
    /// (priority 0's), every priority stormed meanwhile; it used to count eight.
    #[test]
    fn a_link_pause_storm_is_one_storm() {
        const MS: u64 = 1_000_000;
        let mut s = PauseState::new(Mode::Pause, G100);
        let mut w = Watchdog::new(50 * MS, 50 * MS, StormAction::Forward);
        let mut ev = Vec::new();
        let mut t = 0;
        while t <= 60 * MS {
            s.handle_frame(t, &PauseFrame::Pause { quanta: 0xffff });
            // As the Nic does: a PAUSE is a pause of every priority.
            for p in 0..PRIORITIES {
                w.pause_received(p, t);
            }
            w.poll(&s, t, &mut ev);
            t += 100_000;
        }
        assert_eq!(ev, vec![StormEvent::Detected(0)]);
        assert!((0..PRIORITIES).all(|p| w.stormed(p)));
        w.poll(&s, t + 60 * MS, &mut ev);
        assert_eq!(ev, vec![StormEvent::Detected(0), StormEvent::Restored(0)]);
        assert!((0..PRIORITIES).all(|p| !w.stormed(p)));
        assert_eq!(w.counters.detected.iter().sum::<u64>(), 1);
        assert_eq!(w.counters.restored.iter().sum::<u64>(), 1);
    }
}
