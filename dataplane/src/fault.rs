//! Fault injection on a stream of frames leaving a port: loss, duplication, corruption,
//! reordering, CE marks and a delay line, seeded. An RNIC's port (`[fault]`) and the emulated
//! switch's egress (`[switch]`'s `loss`, `duplicate`, `corrupt`, `reorder`) use it; this kernel
//! has no netem, and a vdev has no wire to disturb.

use std::collections::VecDeque;

use pmd_bindings::{Mbuf, Mempool};
use roce::sim::Rng;

use crate::config::FaultConfig;

/// Most frames the delay line holds at once (more are dropped, counted): a 1 ms delay at
/// 10 Gb/s is about 300 full-size frames.
pub const MAX_DELAYED: usize = 16_384;

roce::counters!(
    /// What the injector did.
    FaultCounters {
        /// Frames dropped.
        lost,
        /// Frames sent twice.
        duplicated,
        /// Frames with one bit flipped.
        corrupted,
        /// Frames held back behind the next one.
        reordered,
        /// ECN-capable frames sent with CE set.
        ce_marked,
        /// Frames held in the delay line.
        delayed,
        /// Frames dropped because the delay line was full.
        delay_dropped,
    }
);

impl std::ops::AddAssign for FaultCounters {
    /// Sums two injectors' counts (the switch's ports).
    fn add_assign(&mut self, o: FaultCounters) {
        self.add(&o);
    }
}

/// How long a frame held back for reordering waits for another to overtake it before it
/// leaves on its own: reordering displaces a frame a little, it does not keep it (and a link
/// that goes quiet would otherwise hold that frame, and its mbuf, for good).
pub const REORDER_HOLD_NS: u64 = 100_000;

/// A seeded fault injector with its delay line.
pub struct Faults {
    cfg: FaultConfig,
    rng: Rng,
    /// A frame held back to leave after the next one (reordering), with the time it leaves
    /// by on its own ([`REORDER_HOLD_NS`]).
    held: Option<(u64, Mbuf)>,
    /// Frames waiting out `delay_us`, with the time they may leave (in order).
    delayed: VecDeque<(u64, Mbuf)>,
    /// Counters.
    pub counters: FaultCounters,
}

impl Faults {
    /// An injector for `cfg` (its seed starts the random sequence).
    pub fn new(cfg: FaultConfig) -> Faults {
        Faults {
            cfg,
            rng: Rng::new(cfg.seed),
            held: None,
            delayed: VecDeque::new(),
            counters: FaultCounters::default(),
        }
    }

    /// Decides the faults of `m`, leaving at `now`: what leaves now is pushed to `out` in
    /// order (a duplicate takes an mbuf from `pool`); a delayed frame waits in the delay
    /// line ([`Faults::release`]).
    pub fn pass(&mut self, now: u64, mut m: Mbuf, pool: &Mempool, out: &mut Vec<Mbuf>) {
        let c = &mut self.counters;
        if self.rng.chance(self.cfg.loss) {
            c.lost += 1;
            return;
        }
        if self.rng.chance(self.cfg.corrupt) && m.data_len() > 60 && m.is_exclusive() {
            // Past the Ethernet header, so the frame still reaches its port.
            let i = 14 + self.rng.below(m.data_len() as u64 - 14) as usize;
            m.data_mut()[i] ^= 1 << self.rng.below(8);
            c.corrupted += 1;
        }
        if self.cfg.ce > 0.0
            && m.is_exclusive()
            && self.rng.chance(self.cfg.ce)
            && roce::wire::frame::mark_ce(m.data_mut())
        {
            c.ce_marked += 1;
        }
        if self.rng.chance(self.cfg.duplicate) {
            if let Ok(mut d) = pool.alloc() {
                if d.extend_from_slice(m.data()) {
                    c.duplicated += 1;
                    out.push(d);
                }
            }
        }
        if self.held.is_none() && self.rng.chance(self.cfg.reorder) {
            c.reordered += 1;
            self.held = Some((now + REORDER_HOLD_NS, m));
            return;
        }
        let held = self.held.take().map(|(_, m)| m);
        if self.cfg.delay_us > 0 {
            for m in std::iter::once(m).chain(held) {
                self.enter_delay_line(now, m);
            }
            return;
        }
        out.push(m);
        out.extend(held);
    }

    /// Puts `m`, leaving at `now`, in the delay line for `delay_us` (dropped and counted if
    /// the line is full).
    fn enter_delay_line(&mut self, now: u64, m: Mbuf) {
        if self.delayed.len() >= MAX_DELAYED {
            self.counters.delay_dropped += 1;
        } else {
            self.counters.delayed += 1;
            let at = now + self.cfg.delay_us as u64 * 1_000;
            self.delayed.push_back((at, m));
        }
    }

    /// Moves the frames whose delay is over to `out` until it holds `max`, and a frame held
    /// back for reordering that no other frame overtook within [`REORDER_HOLD_NS`] (into the
    /// delay line first, if there is one); returns how many.
    pub fn release(&mut self, now: u64, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let mut n = 0;
        if self.held.as_ref().is_some_and(|(t, _)| *t <= now) && out.len() < max {
            if let Some((_, m)) = self.held.take() {
                if self.cfg.delay_us == 0 {
                    out.push(m);
                    n += 1;
                } else {
                    self.enter_delay_line(now, m);
                }
            }
        }
        while out.len() < max && self.delayed.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, m)) = self.delayed.pop_front() {
                out.push(m);
                n += 1;
            }
        }
        n
    }

    /// Whether frames wait in the delay line or held back for reordering.
    pub fn waiting(&self) -> bool {
        !self.delayed.is_empty() || self.held.is_some()
    }
}
