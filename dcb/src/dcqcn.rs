//! DCQCN (Zhu et al., SIGCOMM 2015): the notification point (NP: a CNP for CE-marked packets,
//! rate limited per QP) and the reaction point (RP: per-QP rate state cut on CNPs and raised by
//! timer and byte-counter events), in two variants with their own semantics, not only their
//! own numbers (ref. dcb.md "DCQCN", docs/dcb.md). Where the paper is silent or its sources
//! differ, each choice names the source it follows.
//!
//! - [`Variant::Paper`]: the SIGCOMM'15 algorithm. Every CNP cuts at once: RT = RC,
//!   RC = RC (1 - alpha/2) with the alpha before the update (the paper; the first author's
//!   ns-3 model uses the updated one), then alpha = (1 - g) alpha + g. The 50 us between cuts
//!   is the notification point's CNP interval ([`Np`]), not a check at the reaction point (the
//!   ns-3 model's RP has none). Alpha decays every K without a CNP and the increase timer
//!   runs, both from the first CNP on (ns-3 schedules them at a CNP: a QP that ran
//!   uncongested meets its first CNP with alpha 1, not a decayed one). Increase events come
//!   from the timer (T) and the byte counter (B), each raising its stage first: fast
//!   recovery while both stages are below F (F - 1 = 4 steps after a cut with F = 5, as in the
//!   ns-3 model), hyper increase RT += i R_HAI (i = min stage - F + 1) once both reach F (ns-3's
//!   `>=`), additive increase otherwise.
//! - [`Variant::Firmware`]: NVIDIA ConnectX firmware's (the "Mellanox" DCQCN of the HPCC
//!   simulator). Alpha is updated once per alpha period from a "CNP in this period" bit; the
//!   rate is cut at most once per rate-reduce-monitor period if a CNP arrived in it, by
//!   RC (1 - alpha_fixed / 2^rpg_gd) with alpha in 1/1024 units (rpg_gd 11: alpha/2), but never
//!   below RC (1 - rpg_min_dec_fac); with clamp_tgt_rate off, RT = RC only if a timer increase
//!   happened since the last cut; hyper increase adds a constant R_HAI; the first CNP sets
//!   alpha to initial_alpha_value and, if rate_to_set_on_first_cnp is set, RC = RT = it, and
//!   starts the three timers (HPCC's `cnp_received_mlx`).
//!
//! Timers cost O(1) per [`Rp::handle_timeout`] call whatever the time since the last one:
//! alpha decay and missed monitor periods are applied in closed form, and increase events
//! past the first 64 of a call are applied as the steady state they converge to (RC trails
//! RT by one step). Rates are Mb/s (f64), time nanoseconds (u64), passed in.

/// Which DCQCN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// The SIGCOMM'15 paper's.
    Paper,
    /// NVIDIA firmware's.
    Firmware,
}

/// Reaction point parameters. Field comments give the mlx5 name of each (`rpg_*`, `dce_tcp_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RpParams {
    /// Semantics.
    pub variant: Variant,
    /// Line rate (RC and RT never exceed it), Mb/s.
    pub line_rate: f64,
    /// Minimum rate (`rpg_min_rate`), Mb/s.
    pub min_rate: f64,
    /// Alpha gain g (`dce_tcp_g` / 1024).
    pub g: f64,
    /// Alpha period: decay period K (paper) or update period (`dce_tcp_rtt`), ns.
    pub alpha_period: u64,
    /// Firmware: at most one cut per `rate_reduce_monitor_period`, ns. The paper's RP cuts
    /// on every CNP (its 50 us is the NP's CNP interval, [`Np::on_ce`]'s `min_interval`).
    pub decrease_period: u64,
    /// Increase timer period T (`rpg_time_reset`), ns.
    pub timer: u64,
    /// Byte counter B (`rpg_byte_reset`), bytes; 0 turns it off.
    pub byte_counter: u64,
    /// Stage threshold F (`rpg_threshold`).
    pub threshold: u32,
    /// Additive increase R_AI (`rpg_ai_rate`), Mb/s.
    pub ai_rate: f64,
    /// Hyper increase R_HAI (`rpg_hai_rate`), Mb/s.
    pub hai_rate: f64,
    /// Firmware: the cut is RC x alpha_fixed / 2^gd (`rpg_gd`); alpha_fixed = alpha x 1024.
    pub gd: u32,
    /// Firmware: a cut leaves at least RC x (1 - min_dec_fac) (`rpg_min_dec_fac` / 100).
    pub min_dec_fac: f64,
    /// Firmware: alpha on the first CNP (`initial_alpha_value` / 1024).
    pub initial_alpha: f64,
    /// Firmware: RC = RT = this on the first CNP, Mb/s (`rate_to_set_on_first_cnp`; 0: keep).
    pub rate_on_first_cnp: f64,
    /// RT = RC on every cut (`clamp_tgt_rate`); the paper always does.
    pub clamp_tgt_rate: bool,
    /// Firmware, with clamp_tgt_rate off: RT = RC on a cut only if a timer increase came since
    /// the last cut (`clamp_tgt_rate_after_time_inc`).
    pub clamp_tgt_rate_after_time_inc: bool,
}

impl RpParams {
    /// The paper's values at `line_rate` Mb/s: g = 1/256, K = 55 us, F = 5, T = 55 us,
    /// B = 10 MB, R_AI = 40 Mb/s, R_HAI = 200 Mb/s (the first author's simulator; the paper
    /// needs a minimum rate and does not give one: 1 Mb/s as the firmware). The NP's CNP
    /// interval (50 us) is set where CNPs are generated.
    pub fn paper(line_rate: f64) -> RpParams {
        RpParams {
            variant: Variant::Paper,
            line_rate,
            min_rate: 1.0,
            g: 1.0 / 256.0,
            alpha_period: 55_000,
            decrease_period: 50_000,
            timer: 55_000,
            byte_counter: 10_000_000,
            threshold: 5,
            ai_rate: 40.0,
            hai_rate: 200.0,
            gd: 11,
            min_dec_fac: 0.5,
            initial_alpha: 1.0,
            rate_on_first_cnp: 0.0,
            clamp_tgt_rate: true,
            clamp_tgt_rate_after_time_inc: false,
        }
    }

    /// NVIDIA firmware defaults (ConnectX; ref. dcb.md) at `line_rate` Mb/s:
    /// dce_tcp_g 1019 read as g = (1024 - 1019) / 1024 = 5/1024 (the "effective g" reading;
    /// docs/dcb.md says why), dce_tcp_rtt 1 us, rate_reduce_monitor_period 4 us,
    /// rpg_time_reset 300 us, rpg_byte_reset 32767 x 64 B, rpg_threshold 1, rpg_ai_rate 5 Mb/s,
    /// rpg_hai_rate 50 Mb/s, rpg_gd 11, rpg_min_dec_fac 50 %, rpg_min_rate 1 Mb/s,
    /// initial_alpha_value 1023, rate_to_set_on_first_cnp 0, clamp_tgt_rate 0,
    /// clamp_tgt_rate_after_time_inc 1. The AI and HAI rates are for 25 Gb/s and scale with
    /// the line rate, as the simulators that use these values do.
    pub fn firmware(line_rate: f64) -> RpParams {
        let scale = line_rate / 25_000.0;
        RpParams {
            variant: Variant::Firmware,
            line_rate,
            min_rate: 1.0,
            g: 5.0 / 1024.0,
            alpha_period: 1_000,
            decrease_period: 4_000,
            timer: 300_000,
            byte_counter: 32_767 * 64,
            threshold: 1,
            ai_rate: 5.0 * scale,
            hai_rate: 50.0 * scale,
            gd: 11,
            min_dec_fac: 0.5,
            initial_alpha: 1023.0 / 1024.0,
            rate_on_first_cnp: 0.0,
            clamp_tgt_rate: false,
            clamp_tgt_rate_after_time_inc: true,
        }
    }
}

/// Reaction point counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpCounters {
    /// CNPs received.
    pub cnps: u64,
    /// Rate cuts.
    pub decreases: u64,
    /// Fast recovery steps.
    pub fast_recovery: u64,
    /// Additive increase steps.
    pub additive: u64,
    /// Hyper increase steps.
    pub hyper: u64,
}

/// Increase events a [`Rp::handle_timeout`] call applies one by one; the rest of a long gap
/// is applied as the steady state they converge to.
const EXPLICIT_INCREASES: u64 = 64;

/// One QP's rate state.
#[derive(Debug, Clone)]
pub struct Rp {
    p: RpParams,
    /// Current rate RC, Mb/s.
    rc: f64,
    /// Target rate RT, Mb/s.
    rt: f64,
    alpha: f64,
    timer_stage: u32,
    byte_stage: u32,
    bytes: u64,
    /// Next deadlines (u64::MAX: not running; the timers start at the first CNP).
    next_timer: u64,
    next_alpha: u64,
    next_decrease: u64,
    /// Firmware: a CNP came in the current alpha / decrease period.
    cnp_alpha: bool,
    cnp_decrease: bool,
    /// Firmware: a timer increase happened since the last cut.
    time_inc_since_cut: bool,
    seen_cnp: bool,
    /// Counters.
    pub counters: RpCounters,
}

/// What kind of increase an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    FastRecovery,
    Additive,
    Hyper(u32),
}

impl Rp {
    /// A QP starting at line rate (DCQCN has no slow start), alpha 1, no timer running until
    /// its first CNP. `_now` is kept for the callers' symmetry with the other timers.
    pub fn new(p: RpParams, _now: u64) -> Rp {
        Rp {
            p,
            rc: p.line_rate,
            rt: p.line_rate,
            alpha: 1.0,
            timer_stage: 0,
            byte_stage: 0,
            bytes: 0,
            next_timer: u64::MAX,
            next_alpha: u64::MAX,
            next_decrease: u64::MAX,
            cnp_alpha: false,
            cnp_decrease: false,
            time_inc_since_cut: false,
            seen_cnp: false,
            counters: RpCounters::default(),
        }
    }

    /// The current rate RC, Mb/s.
    #[inline]
    pub fn rate(&self) -> f64 {
        self.rc
    }

    /// The target rate RT, Mb/s.
    pub fn target(&self) -> f64 {
        self.rt
    }

    /// Alpha.
    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// The parameters.
    pub fn params(&self) -> &RpParams {
        &self.p
    }

    fn cut(&mut self, factor: f64, now: u64) {
        self.rc = (self.rc * (1.0 - factor)).max(self.p.min_rate);
        self.timer_stage = 0;
        self.byte_stage = 0;
        self.bytes = 0;
        self.next_timer = now.saturating_add(self.p.timer.max(1));
        self.counters.decreases += 1;
    }

    /// A CNP for this QP arrived.
    pub fn on_cnp(&mut self, now: u64) {
        self.counters.cnps += 1;
        let first = !self.seen_cnp;
        self.seen_cnp = true;
        match self.p.variant {
            Variant::Paper => {
                self.rt = self.rc;
                // The cut uses the alpha before this CNP's update (the paper; the first
                // author's simulator uses the updated one).
                let a = self.alpha;
                self.cut(a / 2.0, now);
                self.alpha = (1.0 - self.p.g) * self.alpha + self.p.g;
                // The alpha decay restarts from this CNP.
                self.next_alpha = now.saturating_add(self.p.alpha_period.max(1));
            }
            Variant::Firmware => {
                if first {
                    self.alpha = self.p.initial_alpha;
                    if self.p.rate_on_first_cnp > 0.0 {
                        self.rc = self
                            .p
                            .rate_on_first_cnp
                            .clamp(self.p.min_rate, self.p.line_rate);
                        self.rt = self.rc;
                    }
                    self.next_alpha = now.saturating_add(self.p.alpha_period.max(1));
                    self.next_decrease = now.saturating_add(self.p.decrease_period.max(1));
                    self.next_timer = now.saturating_add(self.p.timer.max(1));
                }
                self.cnp_alpha = true;
                self.cnp_decrease = true;
            }
        }
    }

    /// `bytes` were sent (the byte counter's input). Before the first CNP nothing is counted:
    /// a QP at line rate has nothing to increase.
    #[inline]
    pub fn on_sent(&mut self, bytes: u64, now: u64) {
        if self.p.byte_counter == 0 || !self.seen_cnp {
            return;
        }
        self.bytes = self.bytes.saturating_add(bytes);
        let events = self.bytes / self.p.byte_counter;
        self.bytes %= self.p.byte_counter;
        let explicit = events.min(EXPLICIT_INCREASES);
        for _ in 0..explicit {
            self.byte_stage = self.byte_stage.saturating_add(1);
            self.increase(now, false);
        }
        self.fast_forward(events - explicit, false);
    }

    /// The kind of the increase event that the current stages make.
    fn step_kind(&self) -> Step {
        let f = self.p.threshold;
        let (ts, bs) = (self.timer_stage, self.byte_stage);
        match self.p.variant {
            Variant::Paper => {
                if ts < f && bs < f {
                    Step::FastRecovery
                } else if ts >= f && bs >= f {
                    Step::Hyper(ts.min(bs) - f + 1)
                } else {
                    Step::Additive
                }
            }
            Variant::Firmware => {
                // The firmware's stage is the larger of the two counters (the byte counter
                // only adds events); fast recovery below F, additive at F, hyper above with a
                // constant step (HPCC's RateIncEventMlx).
                let s = ts.max(bs);
                if s < f {
                    Step::FastRecovery
                } else if s == f {
                    Step::Additive
                } else {
                    Step::Hyper(1)
                }
            }
        }
    }

    fn increase(&mut self, _now: u64, from_timer: bool) {
        match self.step_kind() {
            Step::FastRecovery => self.counters.fast_recovery += 1,
            Step::Additive => {
                self.rt += self.p.ai_rate;
                self.counters.additive += 1;
            }
            Step::Hyper(i) => {
                self.rt += i as f64 * self.p.hai_rate;
                self.counters.hyper += 1;
            }
        }
        if from_timer && self.p.variant == Variant::Firmware {
            self.time_inc_since_cut = true;
        }
        self.rt = self.rt.min(self.p.line_rate);
        self.rc = ((self.rt + self.rc) / 2.0).min(self.p.line_rate);
    }

    /// Applies `n` more increase events of the timer (`from_timer`) or the byte counter
    /// without a step each: after the explicit ones the step is constant, RT moves by it per
    /// event and RC trails RT by one step (the fixed point of RC = (RT + RC) / 2; 64 halvings
    /// leave no difference an f64 holds).
    fn fast_forward(&mut self, n: u64, from_timer: bool) {
        if n == 0 {
            return;
        }
        let n32 = n.min(u32::MAX as u64) as u32;
        if from_timer {
            self.timer_stage = self.timer_stage.saturating_add(n32);
            if self.p.variant == Variant::Firmware {
                self.time_inc_since_cut = true;
            }
        } else {
            self.byte_stage = self.byte_stage.saturating_add(n32);
        }
        let d = match self.step_kind() {
            Step::FastRecovery => {
                self.counters.fast_recovery += n;
                0.0
            }
            Step::Additive => {
                self.counters.additive += n;
                self.p.ai_rate
            }
            Step::Hyper(i) => {
                self.counters.hyper += n;
                i as f64 * self.p.hai_rate
            }
        };
        self.rt = (self.rt + n as f64 * d).min(self.p.line_rate);
        self.rc = if self.rt >= self.p.line_rate {
            self.p.line_rate
        } else {
            (self.rt - d).max(self.rc).min(self.rt)
        };
    }

    /// The next deadline ([`Rp::handle_timeout`] then); `u64::MAX` before the first CNP.
    pub fn poll_timeout(&self) -> u64 {
        match self.p.variant {
            Variant::Paper => self.next_timer.min(self.next_alpha),
            Variant::Firmware => self.next_timer.min(self.next_alpha).min(self.next_decrease),
        }
    }

    /// Firmware: the monitor period's end at which a CNP that arrived in it cuts the rate
    /// (`None`: no cut pending; the paper's RP cuts in [`Rp::on_cnp`]).
    pub fn next_cut(&self) -> Option<u64> {
        (self.p.variant == Variant::Firmware && self.cnp_decrease).then_some(self.next_decrease)
    }

    /// The next time the rate can change without a CNP or sent bytes: the increase timer or
    /// a pending cut. Alpha's own period is left out: its decay between two such events is
    /// applied in closed form when [`Rp::handle_timeout`] next runs, so a driver that only
    /// cares about the rate need not wake for it. `u64::MAX` before the first CNP.
    pub fn next_rate_event(&self) -> u64 {
        self.next_timer.min(self.next_cut().unwrap_or(u64::MAX))
    }

    /// How many periods of `period` have come due by `now` from `next` (0 if none), and the
    /// deadline after them.
    fn due(next: u64, period: u64, now: u64) -> (u64, u64) {
        if next > now {
            return (0, next);
        }
        let period = period.max(1);
        let n = (now - next) / period + 1;
        (n, next.saturating_add(n.saturating_mul(period)))
    }

    /// Runs the timers due by `now`, in O(1) whatever the gap since the last call.
    pub fn handle_timeout(&mut self, now: u64) {
        // Alpha.
        let (n, next) = Self::due(self.next_alpha, self.p.alpha_period, now);
        if n > 0 {
            let decay = |k: u64| (1.0 - self.p.g).powi(k.min(i32::MAX as u64) as i32);
            match self.p.variant {
                Variant::Paper => self.alpha *= decay(n),
                Variant::Firmware => {
                    // The first due period carries the CNP bit; the rest had no CNP.
                    let c = if self.cnp_alpha { self.p.g } else { 0.0 };
                    self.alpha = ((1.0 - self.p.g) * self.alpha + c) * decay(n - 1);
                    self.cnp_alpha = false;
                }
            }
            self.next_alpha = next;
        }
        // Firmware: the cut, once per monitor period, if a CNP came in it: only the first
        // due period can have had one (each CNP since the last call is in it).
        if self.p.variant == Variant::Firmware {
            let first_due = self.next_decrease;
            let (n, next) = Self::due(self.next_decrease, self.p.decrease_period, now);
            if n > 0 {
                if self.cnp_decrease {
                    self.cnp_decrease = false;
                    if self.p.clamp_tgt_rate
                        || (self.p.clamp_tgt_rate_after_time_inc && self.time_inc_since_cut)
                    {
                        self.rt = self.rc;
                    }
                    self.time_inc_since_cut = false;
                    let by_gd = self.alpha * 1024.0 / (1u64 << self.p.gd.min(40)) as f64;
                    let factor = by_gd.min(self.p.min_dec_fac);
                    self.cut(factor, first_due);
                }
                self.next_decrease = next;
            }
        }
        // Increase timer.
        let (n, next) = Self::due(self.next_timer, self.p.timer, now);
        if n > 0 {
            self.next_timer = next;
            let explicit = n.min(EXPLICIT_INCREASES);
            for _ in 0..explicit {
                self.timer_stage = self.timer_stage.saturating_add(1);
                self.increase(now, true);
            }
            self.fast_forward(n - explicit, true);
        }
    }
}

/// The notification point's per-QP state: at most one CNP per `min_interval` ns (paper: 50 us;
/// firmware: `min_time_between_cnps`, a few us; 0: one for every CE-marked packet, as the HPCC
/// simulator does).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Np {
    last: Option<u64>,
    /// CE-marked packets seen.
    pub ce_packets: u64,
    /// CNPs sent.
    pub cnps: u64,
}

impl Np {
    /// A CE-marked packet of this QP arrived: true if a CNP goes back now.
    #[inline]
    pub fn on_ce(&mut self, now: u64, min_interval: u64) -> bool {
        self.ce_packets += 1;
        if self.last.is_some_and(|t| now < t + min_interval) {
            return false;
        }
        self.last = Some(now);
        self.cnps += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: u64 = 1000;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn paper_cuts_on_every_cnp_with_the_old_alpha_then_updates_it() {
        let mut r = Rp::new(RpParams::paper(40_000.0), 0);
        assert_eq!(r.poll_timeout(), u64::MAX, "no timer before the first CNP");
        // Uncongested for a second: alpha has not decayed (its timer starts at a CNP).
        r.handle_timeout(1_000_000 * US);
        assert!(close(r.alpha(), 1.0));
        r.on_cnp(1_000_010 * US);
        // alpha 1: RC = 40 000 x (1 - 1/2); RT = 40 000; alpha = (1 - g) + g = 1.
        assert!(close(r.rate(), 20_000.0));
        assert!(close(r.target(), 40_000.0));
        assert!(close(r.alpha(), 1.0));
        // The RP cuts on every CNP it gets (the 50 us is the NP's CNP interval).
        r.on_cnp(1_000_040 * US);
        assert!(close(r.rate(), 10_000.0), "{}", r.rate());
        assert!(close(r.target(), 20_000.0));
        assert_eq!(r.counters.decreases, 2);
        // Alpha decays every 55 us after the last CNP: two periods -> (1 - g)^2.
        r.handle_timeout(1_000_040 * US + 110 * US);
        let g = 1.0 / 256.0;
        assert!(close(r.alpha(), (1.0 - g) * (1.0 - g)), "{}", r.alpha());
        // The next CNP cuts by the decayed alpha, then raises it.
        let a = r.alpha();
        let rc = r.rate();
        r.on_cnp(1_000_200 * US);
        assert!(close(r.rate(), rc * (1.0 - a / 2.0)));
        assert!(close(r.alpha(), (1.0 - g) * a + g));
        assert!(close(r.target(), rc));
    }

    #[test]
    fn paper_increase_stages() {
        let mut p = RpParams::paper(40_000.0);
        p.byte_counter = 0; // timer only: the byte stage stays 0, below F
        let mut r = Rp::new(p, 0);
        r.on_cnp(0);
        let (rt, mut rc) = (r.target(), r.rate());
        // Timer stages 1-4 (below F = 5) are fast recovery: RC = (RT + RC) / 2, RT unchanged.
        for k in 1..=4u64 {
            r.handle_timeout(k * 55 * US);
            rc = (rt + rc) / 2.0;
            assert!(close(r.rate(), rc) && close(r.target(), rt), "step {k}");
        }
        assert_eq!(r.counters.fast_recovery, 4);
        // The fifth (timer stage = F, byte stage below) is additive.
        r.handle_timeout(5 * 55 * US);
        assert_eq!(r.counters.additive, 1);
        // With both counters: hyper increase once both stages reach F (ns-3's >=), by
        // i = min stage - F + 1 steps of R_HAI.
        let mut q = RpParams::paper(100_000.0);
        q.byte_counter = 1_000;
        let mut r = Rp::new(q, 0);
        r.on_cnp(0); // RT = RC = 100 000, then RC cut to 50 000
        r.rt = 60_000.0; // a lower target to watch RT move
        for k in 1..=6u64 {
            r.handle_timeout(k * 55 * US); // timer stage k
        }
        // Timer stages 1-4: fast recovery; 5 and 6 (byte stage 0): additive, +40 each.
        assert_eq!(
            (
                r.counters.fast_recovery,
                r.counters.additive,
                r.counters.hyper
            ),
            (4, 2, 0)
        );
        r.on_sent(6_000, 6 * 55 * US); // byte stages 1..6 with timer stage 6
                                       // Byte stages 1-4: additive (timer stage >= F, byte stage < F); 5: both >= F, hyper
                                       // i = 5 - 5 + 1 = 1 (+200); 6: hyper i = 2 (+400).
        assert_eq!(
            (
                r.counters.fast_recovery,
                r.counters.additive,
                r.counters.hyper
            ),
            (4, 6, 2)
        );
        assert!(
            close(r.target(), 60_000.0 + 6.0 * 40.0 + 200.0 + 400.0),
            "{}",
            r.target()
        );
    }

    #[test]
    fn rates_stay_between_min_and_line_rate() {
        let mut r = Rp::new(RpParams::paper(25_000.0), 0);
        for k in 0..10_000u64 {
            r.on_cnp(k * 51 * US);
        }
        assert!(close(r.rate(), 1.0), "clamped at the minimum: {}", r.rate());
        for k in 0..100_000u64 {
            r.handle_timeout(510_000 * US + k * 55 * US);
            r.on_sent(1_000_000, 0);
        }
        assert!(close(r.rate(), 25_000.0), "back to line rate: {}", r.rate());
        assert!(close(r.target(), 25_000.0), "{}", r.target());
    }

    #[test]
    fn firmware_cuts_once_per_monitor_period_with_the_period_alpha() {
        let p = RpParams::firmware(100_000.0);
        let mut r = Rp::new(p, 0);
        // Three CNPs inside one 4 us monitor period; the first starts the timers (at 100 ns).
        r.on_cnp(100);
        r.on_cnp(200);
        r.on_cnp(300);
        // First CNP: alpha = 1023/1024.
        assert!(close(r.alpha(), 1023.0 / 1024.0));
        // Alpha updates at 1.1, 2.1, 3.1 us: the first with the CNP bit, then without.
        r.handle_timeout(3_500);
        let g = 5.0 / 1024.0;
        let a1 = (1.0 - g) * (1023.0 / 1024.0) + g;
        let a3 = a1 * (1.0 - g) * (1.0 - g);
        assert!(close(r.alpha(), a3), "{} vs {a3}", r.alpha());
        assert_eq!(
            r.counters.decreases, 0,
            "no cut before the monitor period ends"
        );
        // At 4.1 us: one cut by alpha x 1024 / 2^11 = alpha / 2 (alpha updated at 4.1 first).
        r.handle_timeout(4_100);
        let a4 = a3 * (1.0 - g);
        assert_eq!(r.counters.decreases, 1);
        assert!(
            close(r.rate(), 100_000.0 * (1.0 - a4 / 2.0)),
            "{}",
            r.rate()
        );
        // clamp_tgt_rate off and no timer increase yet: RT stays at line rate.
        assert!(close(r.target(), 100_000.0));
        // No CNP in the next period: no cut.
        r.handle_timeout(8_100);
        assert_eq!(r.counters.decreases, 1);
        // A timer increase (300 us after the cut) with F = 1: additive (stage 1 = F),
        // RT += 5 Mb/s x 4 (scaled to 100 Gb/s) but RT is already at line rate.
        let rc = r.rate();
        r.handle_timeout(4_100 + 300_000);
        assert_eq!(r.counters.additive, 1);
        assert!(close(r.rate(), (100_000.0 + rc) / 2.0));
        // Now a cut sets RT = RC first (a timer increase happened since the last cut).
        let rc = r.rate();
        r.on_cnp(305_000);
        r.handle_timeout(308_100);
        assert_eq!(r.counters.decreases, 2);
        assert!(close(r.target(), rc));
        // Hyper increase adds a constant R_HAI (50 Mb/s x 4).
        r.handle_timeout(308_100 + 300_000); // stage 1: additive
        let rt = r.target();
        r.handle_timeout(308_100 + 600_000); // stage 2 > F: hyper
        assert!(close(r.target(), (rt + 200.0).min(100_000.0)));
        assert_eq!(r.counters.hyper, 1);
    }

    /// A long gap between calls costs the same as a short one and lands where calling at
    /// every deadline would (the closed forms of alpha decay and monitor periods; the steady
    /// state of increase events).
    #[test]
    fn a_long_gap_is_one_step_and_matches_stepping() {
        for p in [RpParams::paper(100_000.0), RpParams::firmware(100_000.0)] {
            let mut p = p;
            p.byte_counter = 0;
            let mut stepped = Rp::new(p, 0);
            stepped.on_cnp(0);
            stepped.handle_timeout(4_000);
            let mut jumped = stepped.clone();
            // Stepping through every deadline for 50 ms...
            let end = 50_000_000;
            loop {
                let t = stepped.poll_timeout();
                if t > end {
                    break;
                }
                stepped.handle_timeout(t);
            }
            // ...and one call at the end.
            jumped.handle_timeout(end);
            assert!(
                (stepped.alpha() - jumped.alpha()).abs() < 1e-9,
                "{:?}: alpha {} vs {}",
                p.variant,
                stepped.alpha(),
                jumped.alpha()
            );
            assert!(
                (stepped.rate() - jumped.rate()).abs() <= 1e-6 * stepped.rate(),
                "{:?}: rate {} vs {}",
                p.variant,
                stepped.rate(),
                jumped.rate()
            );
            assert!(close(stepped.target(), jumped.target()));
            assert_eq!(stepped.poll_timeout(), jumped.poll_timeout());
            // A gap of a simulated day is one call (8.6e10 alpha periods of 1 us would not
            // finish if they were looped over): the QP is back at line rate, alpha ~0.
            jumped.handle_timeout(end + 86_400_000_000_000);
            assert!(close(jumped.rate(), p.line_rate), "{}", jumped.rate());
            assert!(jumped.alpha() < 1e-6, "{}", jumped.alpha());
        }
    }

    #[test]
    fn firmware_cut_never_below_min_dec_fac() {
        let mut p = RpParams::firmware(100_000.0);
        p.gd = 9; // alpha x 1024 / 512 = 2 alpha: would cut by ~100 %
        let mut r = Rp::new(p, 0);
        r.on_cnp(0);
        r.handle_timeout(4_000);
        assert!(close(r.rate(), 50_000.0), "at most 50 %: {}", r.rate());
        // rate_to_set_on_first_cnp.
        let mut p = RpParams::firmware(100_000.0);
        p.rate_on_first_cnp = 10_000.0;
        let mut r = Rp::new(p, 0);
        r.on_cnp(0);
        assert!(close(r.rate(), 10_000.0) && close(r.target(), 10_000.0));
    }

    #[test]
    fn np_limits_cnps_per_qp() {
        let mut n = Np::default();
        assert!(n.on_ce(0, 50 * US));
        assert!(!n.on_ce(49 * US, 50 * US));
        assert!(n.on_ce(50 * US, 50 * US));
        assert_eq!((n.ce_packets, n.cnps), (3, 2));
        let mut every = Np::default();
        assert!((0..10).all(|t| every.on_ce(t, 0)));
    }
}
