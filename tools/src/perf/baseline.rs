//! A machine baseline to read a bandwidth figure against (`--baseline`): the bandwidth of
//! `memcpy` between two buffers of the test's message size - the same working set the RNIC
//! moves - measured here, now, on the same machine. Bandwidth figures differ threefold
//! between machines of one kind and with their load; their ratio to this baseline says
//! whether ferroce is doing as it should (docs/performance figures are given as such
//! ratios).
//!
//! Trustworthy, as the e2e bench's earlier single-shot copy was not: warm buffers, each run
//! long enough (at least 20 ms and 64 MiB) to average out the timer, seven runs, the best
//! reported (what the machine can do) with the median and the spread beside it.

use std::time::{Duration, Instant};

/// memcpy bandwidth of one buffer size.
#[derive(Debug, Clone, Copy)]
pub struct Baseline {
    /// Bytes per copy.
    pub size: usize,
    /// The best run, bits per second.
    pub best_bps: f64,
    /// The median run, bits per second.
    pub median_bps: f64,
    /// The slowest run, bits per second.
    pub worst_bps: f64,
    /// Runs.
    pub runs: usize,
}

/// Measures memcpy of `size`-byte buffers (at least 64 bytes), `runs` times.
pub fn memcpy(size: usize, runs: usize) -> Baseline {
    let size = size.max(64);
    let src: Vec<u8> = (0..size).map(|i| (i * 31) as u8).collect();
    let mut dst = vec![0u8; size];
    measure(size, runs, || {
        dst.copy_from_slice(std::hint::black_box(&src));
        std::hint::black_box(&mut dst);
    })
}

/// Measures `op`, which moves `size` bytes each call, `runs` times the same way as
/// [`memcpy`]: warmed up, each run at least 64 MiB and 20 ms, best, median and slowest.
pub fn measure(size: usize, runs: usize, mut op: impl FnMut()) -> Baseline {
    let size = size.max(1);
    // Calls per run: at least 64 MiB, then as many as fill 20 ms.
    let mut per_run = (64usize << 20).div_ceil(size).max(1);
    let mut run = |n: usize| {
        for _ in 0..n {
            op();
        }
    };
    run(per_run.min(1024)); // warm the caches and pages
    let t = Instant::now();
    run(per_run);
    let first = t.elapsed();
    if first < Duration::from_millis(20) {
        let scale = 20e-3 / first.as_secs_f64().max(1e-9);
        per_run = ((per_run as f64) * scale).ceil() as usize;
    }
    let mut bps: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let t = Instant::now();
            run(per_run);
            let s = t.elapsed().as_secs_f64().max(1e-9);
            (per_run * size) as f64 * 8.0 / s
        })
        .collect();
    bps.sort_by(|a, b| a.total_cmp(b));
    Baseline {
        size,
        best_bps: *bps.last().expect("a run"),
        median_bps: bps[bps.len() / 2],
        worst_bps: bps[0],
        runs: bps.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_baseline_is_ordered_and_plausible() {
        let b = memcpy(65536, 3);
        assert_eq!(b.runs, 3);
        assert!(b.worst_bps <= b.median_bps && b.median_bps <= b.best_bps);
        // More than 100 Mb/s on any machine that builds this.
        assert!(b.worst_bps > 1e8, "{b:?}");
    }
}
