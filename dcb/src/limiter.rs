//! A per-QP rate limiter (pacer): the next time a packet may go, from the current rate and the
//! packet's size, with a burst allowance. The dataplane asks it per packet, so the check is a
//! compare and the update one multiply by a precomputed time per byte.
//!
//! It keeps a virtual clock: the time at which everything sent so far would have finished at
//! the current rate. A packet may go when the virtual clock is not ahead of `now` by more than
//! the burst allowance; sending it advances the clock by its serialisation time. After an idle
//! spell the clock restarts from `now`, so idleness earns at most one burst. Time inside is
//! kept in 2^-16 ps (u128), so rounding never drifts the rate (at 400 Gb/s a byte is 20 ps).

/// Fractional bits of the internal time unit (2^-16 ps).
const SHIFT: u32 = 16;
/// Internal units per nanosecond.
const PER_NS: u128 = 1000 << SHIFT;

/// A pacer. Times are nanoseconds.
#[derive(Debug, Clone)]
pub struct Pacer {
    /// Internal units per byte at the current rate.
    per_byte: u128,
    /// Burst allowance, internal units.
    burst: u128,
    /// Virtual finish time of what was sent, internal units.
    vclock: u128,
    rate_mbps: f64,
}

impl Pacer {
    /// A pacer at `rate_mbps` allowing bursts of `burst_bytes` beyond the rate.
    pub fn new(rate_mbps: f64, burst_bytes: u64) -> Pacer {
        let mut p = Pacer {
            per_byte: 1,
            burst: 0,
            vclock: 0,
            rate_mbps: 0.0,
        };
        p.set_rate(0, rate_mbps, burst_bytes);
        p
    }

    /// Changes the rate at `now` (and the burst, expressed in bytes at the new rate). What
    /// is still owed for packets already sent is rescaled to the new rate: a packet sent at
    /// 1 Mb/s owes 8.7 ms, which must shrink when the rate climbs back, as a hardware rate
    /// limiter recomputes its next departure.
    pub fn set_rate(&mut self, now: u64, rate_mbps: f64, burst_bytes: u64) {
        let r = rate_mbps.max(0.001);
        // 1 byte = 8 bits; at r Mb/s a bit takes 10^6 / r ps.
        let per_byte = ((8.0e6 / r) * (1u64 << SHIFT) as f64).round().max(1.0) as u128;
        let now_u = now as u128 * PER_NS;
        if self.vclock > now_u && self.per_byte > 0 {
            let owed = self.vclock - now_u;
            self.vclock = now_u + owed * per_byte / self.per_byte;
        }
        self.per_byte = per_byte;
        self.burst = burst_bytes as u128 * self.per_byte;
        self.rate_mbps = r;
    }

    /// The rate, Mb/s.
    pub fn rate(&self) -> f64 {
        self.rate_mbps
    }

    /// When a packet may go: `now` or later, ns.
    #[inline]
    pub fn next_allowed(&self, now: u64) -> u64 {
        let earliest = self.vclock.saturating_sub(self.burst);
        let now_u = now as u128 * PER_NS;
        if earliest <= now_u {
            now
        } else {
            earliest.div_ceil(PER_NS).min(u64::MAX as u128) as u64
        }
    }

    /// Whether a packet may go at `now`.
    #[inline]
    pub fn can_send(&self, now: u64) -> bool {
        self.vclock <= now as u128 * PER_NS + self.burst
    }

    /// A packet of `bytes` went at `now`.
    #[inline]
    pub fn on_send(&mut self, now: u64, bytes: u64) {
        // After idleness the clock restarts from now: the allowance above it is the burst.
        self.vclock = self.vclock.max(now as u128 * PER_NS) + bytes as u128 * self.per_byte;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paces_at_the_rate_with_a_burst() {
        // 8 Gb/s = 1 ns per byte; 1000-byte packets take 1 us each; burst of two packets.
        let mut p = Pacer::new(8_000.0, 2000);
        let mut sent = 0;
        let mut t = 0;
        // The burst goes at once, then one packet per microsecond.
        while p.can_send(t) {
            p.on_send(t, 1000);
            sent += 1;
        }
        assert_eq!(sent, 3, "one packet plus a 2-packet burst at t = 0");
        assert_eq!(p.next_allowed(0), 1000);
        t = 1000;
        assert!(p.can_send(t));
        p.on_send(t, 1000);
        assert!(!p.can_send(t));
        // Over a long run the rate holds: 10 000 packets from t = 2 us take 10 ms.
        let start = p.next_allowed(t);
        let mut now = start;
        for _ in 0..10_000 {
            now = p.next_allowed(now);
            p.on_send(now, 1000);
        }
        let elapsed = now - start;
        assert!((9_990_000..=10_000_000).contains(&elapsed), "{elapsed}");
        // Idle time earns at most one burst.
        let later = now + 1_000_000_000;
        let mut n = 0;
        while p.can_send(later) {
            p.on_send(later, 1000);
            n += 1;
        }
        assert_eq!(n, 3);
        // A rate change takes effect at once.
        p.set_rate(later, 800.0, 0);
        let t2 = p.next_allowed(later);
        p.on_send(t2, 1000);
        assert_eq!(
            p.next_allowed(t2) - t2,
            10_000,
            "10 ns per byte at 800 Mb/s"
        );

        // What is owed shrinks with a faster rate: 10 us owed at 800 Mb/s is 1 us at 8 Gb/s.
        p.set_rate(t2, 8_000.0, 0);
        assert_eq!(p.next_allowed(t2) - t2, 1_000);
    }
}
