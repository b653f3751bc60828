//! ECN marking at a congestion point (a switch egress queue, or ferroce's own transmit queue):
//! RED/WRED on bytes queued. Below Kmin nothing is marked; between Kmin and Kmax the
//! probability rises linearly to Pmax; at or above Kmax every ECN-capable packet is marked
//! (ref. dcb.md "ECN"). Kmin = Kmax is DCTCP's step marking. Only ECT(0)/ECT(1) packets become
//! CE; Not-ECT packets pass unmarked and CE stays CE. The random draws come from a seeded
//! generator, so a run is reproducible.

/// The IP ECN field (RFC 3168).
pub mod codepoint {
    /// Not ECN-capable.
    pub const NOT_ECT: u8 = 0b00;
    /// ECT(1).
    pub const ECT1: u8 = 0b01;
    /// ECT(0): what RoCE senders mark.
    pub const ECT0: u8 = 0b10;
    /// Congestion experienced.
    pub const CE: u8 = 0b11;
}

/// A RED marking curve on bytes queued.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Red {
    /// Below this many bytes nothing is marked.
    pub kmin: u64,
    /// At or above this, everything ECN-capable is marked.
    pub kmax: u64,
    /// The probability just below Kmax.
    pub pmax: f64,
}

impl Red {
    /// The DCQCN paper's: Kmin 5 KB, Kmax 200 KB, Pmax 1 %.
    pub const PAPER: Red = Red {
        kmin: 5_000,
        kmax: 200_000,
        pmax: 0.01,
    };

    /// The thresholds simulators scale with the link (ref. dcb.md: Kmin 100 KB, Kmax 400 KB
    /// per 25 Gb/s, Pmax 0.2).
    pub fn scaled(speed_gbps: f64) -> Red {
        let s = speed_gbps / 25.0;
        Red {
            kmin: (100_000.0 * s) as u64,
            kmax: (400_000.0 * s) as u64,
            pmax: 0.2,
        }
    }

    /// The marking probability with `queued` bytes in the queue.
    pub fn probability(&self, queued: u64) -> f64 {
        if queued < self.kmin {
            0.0
        } else if queued >= self.kmax {
            1.0
        } else {
            // kmin < kmax here (kmin = kmax falls in one of the branches above).
            self.pmax * (queued - self.kmin) as f64 / (self.kmax - self.kmin) as f64
        }
    }
}

/// A small, fast, seeded generator (xorshift64*) for marking decisions.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced by a fixed non-zero value).
    pub fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A uniform draw in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Counters of a marker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MarkCounters {
    /// Packets marked CE.
    pub marked: u64,
    /// ECN-capable packets seen.
    pub ect: u64,
    /// Not-ECT packets seen (never marked).
    pub not_ect: u64,
}

/// A congestion point: RED marking with its own generator.
#[derive(Debug, Clone)]
pub struct Marker {
    /// The curve.
    pub red: Red,
    rng: Rng,
    /// Counters.
    pub counters: MarkCounters,
}

impl Marker {
    /// A marker with `red`, seeded with `seed`.
    pub fn new(red: Red, seed: u64) -> Marker {
        Marker {
            red,
            rng: Rng::new(seed),
            counters: MarkCounters::default(),
        }
    }

    /// The ECN field a packet with field `ecn` leaves with, `queued` bytes in its queue.
    #[inline]
    pub fn mark(&mut self, ecn: u8, queued: u64) -> u8 {
        match ecn & 3 {
            codepoint::NOT_ECT => {
                self.counters.not_ect += 1;
                codepoint::NOT_ECT
            }
            codepoint::CE => {
                self.counters.ect += 1;
                codepoint::CE
            }
            e => {
                self.counters.ect += 1;
                let p = self.red.probability(queued);
                // p = 1 above Kmax needs no draw; p = 0 below Kmin neither.
                if p >= 1.0 || (p > 0.0 && self.rng.unit() < p) {
                    self.counters.marked += 1;
                    codepoint::CE
                } else {
                    e
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::codepoint::*;
    use super::*;

    #[test]
    fn the_curve() {
        let red = |kmin, kmax, pmax| Red { kmin, kmax, pmax };
        let r = red(100, 1100, 0.2);
        assert_eq!(r.probability(99), 0.0);
        assert_eq!(r.probability(100), 0.0);
        assert!((r.probability(600) - 0.1).abs() < 1e-12);
        assert!((r.probability(1099) - 0.2 * 999.0 / 1000.0).abs() < 1e-12);
        assert_eq!(r.probability(1100), 1.0);
        // DCTCP step marking.
        let s = red(500, 500, 1.0);
        assert_eq!(s.probability(499), 0.0);
        assert_eq!(s.probability(500), 1.0);
        let x = Red::scaled(100.0);
        assert_eq!((x.kmin, x.kmax), (400_000, 1_600_000));
    }

    #[test]
    fn marking_rate_follows_the_curve_and_respects_codepoints() {
        let r = Red {
            kmin: 0,
            kmax: 1000,
            pmax: 0.5,
        };
        let mut m = Marker::new(r, 7);
        let n = 200_000;
        let marked = (0..n).filter(|_| m.mark(ECT0, 500) == CE).count();
        let frac = marked as f64 / n as f64;
        assert!((frac - 0.25).abs() < 0.005, "{frac}");
        assert_eq!(m.mark(NOT_ECT, 5000), NOT_ECT, "never marks Not-ECT");
        assert_eq!(m.mark(ECT1, 5000), CE);
        assert_eq!(m.mark(CE, 0), CE);
        assert_eq!(m.mark(ECT1, 0), ECT1);
        // Seeded: the same seed gives the same decisions.
        let mut a = Marker::new(r, 42);
        let mut b = Marker::new(r, 42);
        for q in 0..1000 {
            assert_eq!(a.mark(ECT0, q), b.mark(ECT0, q));
        }
    }
}
