//! Enhanced Transmission Selection (IEEE 802.1Qaz): priorities map to traffic classes; a TC
//! is strict priority (a higher TC before a lower) or gets a share of what the strict TCs
//! leave, by deficit weighted round robin over bytes (Linux sch_ets is PRIO + DRR the same
//! way). Work conserving: an idle TC's share goes to the others (its deficit is reset, as DRR
//! does for an empty queue). A paused TC is skipped and keeps its deficit.

/// Traffic classes.
pub const TCS: usize = 8;

/// How a TC is scheduled (the `tc_tsa` of Linux's `struct ieee_ets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tsa {
    /// Strict priority.
    Strict,
    /// A weighted share (ETS).
    Ets,
}

/// An ETS configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtsConfig {
    /// Priority -> TC.
    pub prio_tc: [u8; 8],
    /// Selection per TC.
    pub tsa: [Tsa; TCS],
    /// Share of each ETS TC in percent (summing to 100 over the ETS TCs).
    pub bw_percent: [u8; TCS],
}

impl EtsConfig {
    /// The common lossless-RoCE setup (ref. dcb.md "ETS"): priority p -> TC p; TC6 (CNPs)
    /// and TC7 strict; TC3 (RoCE) and TC0 (the rest) 50 % each.
    pub fn roce_default() -> EtsConfig {
        let mut bw = [0; TCS];
        bw[0] = 50;
        bw[3] = 50;
        let mut tsa = [Tsa::Ets; TCS];
        tsa[6] = Tsa::Strict;
        tsa[7] = Tsa::Strict;
        EtsConfig {
            prio_tc: [0, 1, 2, 3, 4, 5, 6, 7],
            tsa,
            bw_percent: bw,
        }
    }

    /// Checks the configuration: TCs in range, ETS shares summing to 100 (none for strict
    /// TCs).
    pub fn validate(&self) -> Result<(), String> {
        if let Some(t) = self.prio_tc.iter().find(|t| **t as usize >= TCS) {
            return Err(format!("priority mapped to TC {t} (0..=7)"));
        }
        let mut sum = 0u32;
        for tc in 0..TCS {
            match self.tsa[tc] {
                Tsa::Strict if self.bw_percent[tc] != 0 => {
                    return Err(format!(
                        "strict TC {tc} has a share ({}%)",
                        self.bw_percent[tc]
                    ))
                }
                Tsa::Ets => sum += self.bw_percent[tc] as u32,
                _ => {}
            }
        }
        let any_ets = self.tsa.contains(&Tsa::Ets);
        if any_ets && sum != 100 {
            return Err(format!("ETS shares sum to {sum}%, not 100%"));
        }
        Ok(())
    }
}

/// Bytes of deficit a TC earns per round per percent of share.
const QUANTUM_PER_PERCENT: i64 = 256;

/// The scheduler's state.
#[derive(Debug, Clone)]
pub struct Ets {
    cfg: EtsConfig,
    quantum: [i64; TCS],
    deficit: [i64; TCS],
    /// The ETS TC the round robin visits next.
    next: usize,
    /// Strict TCs, highest first; ETS TCs in order.
    strict: Vec<usize>,
    ets: Vec<usize>,
}

impl Ets {
    /// A scheduler for `cfg` (validated).
    pub fn new(cfg: EtsConfig) -> Result<Ets, String> {
        cfg.validate()?;
        let mut strict: Vec<usize> = (0..TCS).filter(|t| cfg.tsa[*t] == Tsa::Strict).collect();
        strict.reverse();
        let ets: Vec<usize> = (0..TCS)
            .filter(|t| cfg.tsa[*t] == Tsa::Ets && cfg.bw_percent[*t] > 0)
            .collect();
        let mut quantum = [0; TCS];
        for t in &ets {
            quantum[*t] = cfg.bw_percent[*t] as i64 * QUANTUM_PER_PERCENT;
        }
        Ok(Ets {
            cfg,
            quantum,
            deficit: [0; TCS],
            next: 0,
            strict,
            ets,
        })
    }

    /// The TC of priority `p`.
    pub fn tc_of(&self, p: u8) -> usize {
        self.cfg.prio_tc[(p & 7) as usize] as usize
    }

    /// Chooses the TC to send from. `head[tc]` is the size in bytes of the packet at the head
    /// of TC `tc`'s queue (`None`: empty); a TC whose bit is set in `paused` may not send.
    /// The chosen TC is charged its head packet: the caller sends exactly that packet.
    #[inline]
    pub fn pick(&mut self, head: &[Option<u32>; TCS], paused: u8) -> Option<usize> {
        let ready = |t: usize| head[t].is_some() && paused & (1 << t) == 0;
        for &t in &self.strict {
            if ready(t) {
                return Some(t);
            }
        }
        let n = self.ets.len();
        if n == 0 || !self.ets.iter().any(|t| ready(*t)) {
            // Idle (or all paused) ETS TCs keep nothing beyond their deficit; empty ones reset.
            for &t in &self.ets {
                if head[t].is_none() {
                    self.deficit[t] = 0;
                }
            }
            return None;
        }
        // DRR: visit TCs from `next`; a ready TC with enough deficit sends; otherwise it earns
        // its quantum and the visit moves on. Bounded: every full pass adds at least one
        // quantum to every ready TC.
        loop {
            let t = self.ets[self.next];
            match head[t] {
                None => self.deficit[t] = 0,
                Some(_) if paused & (1 << t) != 0 => {}
                Some(size) => {
                    if self.deficit[t] >= size as i64 {
                        self.deficit[t] -= size as i64;
                        return Some(t);
                    }
                    self.deficit[t] += self.quantum[t];
                }
            }
            self.next = (self.next + 1) % n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(shares: &[(usize, u8)], strict: &[usize]) -> EtsConfig {
        let mut c = EtsConfig {
            prio_tc: [0, 1, 2, 3, 4, 5, 6, 7],
            tsa: [Tsa::Ets; TCS],
            bw_percent: [0; TCS],
        };
        for &(t, p) in shares {
            c.bw_percent[t] = p;
        }
        for &t in strict {
            c.tsa[t] = Tsa::Strict;
        }
        c
    }

    #[test]
    fn configurations_are_checked() {
        assert!(EtsConfig::roce_default().validate().is_ok());
        assert!(cfg(&[(0, 60), (3, 30)], &[]).validate().is_err());
        assert!(cfg(&[(0, 50), (3, 50), (7, 10)], &[7]).validate().is_err());
        let mut c = EtsConfig::roce_default();
        c.prio_tc[2] = 9;
        assert!(c.validate().is_err());
    }

    /// Sends `n` packets from always-backlogged TCs of the given sizes; returns bytes per TC.
    fn run(e: &mut Ets, sizes: &[(usize, u32)], n: usize, paused: u8) -> [u64; TCS] {
        let mut head = [None; TCS];
        for &(t, s) in sizes {
            head[t] = Some(s);
        }
        let mut bytes = [0u64; TCS];
        for _ in 0..n {
            let t = e.pick(&head, paused).unwrap();
            bytes[t] += head[t].unwrap() as u64;
        }
        bytes
    }

    #[test]
    fn shares_within_one_percent_over_100k_packets() {
        // 50/30/20 with different packet sizes: byte shares, not packet shares.
        let mut e = Ets::new(cfg(&[(0, 50), (2, 30), (5, 20)], &[])).unwrap();
        let b = run(&mut e, &[(0, 1500), (2, 4096), (5, 64)], 100_000, 0);
        let total: u64 = b.iter().sum();
        for (t, want) in [(0, 0.50), (2, 0.30), (5, 0.20)] {
            let got = b[t] as f64 / total as f64;
            assert!((got - want).abs() < 0.01, "TC{t}: {got:.4} vs {want}");
        }
    }

    #[test]
    fn strict_first_idle_share_redistributed_paused_skipped() {
        let mut e = Ets::new(EtsConfig::roce_default()).unwrap();
        // TC7 strict with backlog takes everything.
        let b = run(&mut e, &[(0, 1000), (3, 1000), (7, 100)], 1000, 0);
        assert_eq!(b[7], 100_000);
        // TC7 paused: the ETS TCs share.
        let b = run(&mut e, &[(0, 1000), (3, 1000), (7, 100)], 10_000, 1 << 7);
        assert_eq!(b[7], 0);
        let r = b[3] as f64 / (b[0] + b[3]) as f64;
        assert!((r - 0.5).abs() < 0.01, "{r}");
        // Work conserving: TC0 idle -> TC3 gets the whole link.
        let b = run(&mut e, &[(3, 1000)], 1000, 0);
        assert_eq!(b[3], 1_000_000);
        // TC3 paused: TC0 sends; unpaused, TC3 is not penalised for the pause.
        let b = run(&mut e, &[(0, 1000), (3, 1000)], 1000, 1 << 3);
        assert_eq!(b[3], 0);
        let b = run(&mut e, &[(0, 1000), (3, 1000)], 10_000, 0);
        let r = b[3] as f64 / (b[0] + b[3]) as f64;
        assert!((r - 0.5).abs() < 0.01, "{r}");
        // Nothing to send.
        assert_eq!(e.pick(&[None; TCS], 0), None);
        assert_eq!(
            e.pick(&[Some(100), None, None, None, None, None, None, None], 1),
            None
        );
    }
}
