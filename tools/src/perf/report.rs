//! perftest's result tables and units, and the `--json` form of the same figures.
//!
//! Units follow perftest (`../shared/reference/perftest.md`): MB/sec is 2^20 bytes per second,
//! Gb/sec is 10^9 bits per second, MsgRate is millions of messages per second, latencies are
//! microseconds.

use serde_json::{json, Value};

/// The dashed rule perftest prints between sections.
pub const RULE: &str =
    "---------------------------------------------------------------------------------------";

/// One bandwidth result line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BwResult {
    /// Message size in bytes.
    pub bytes: u64,
    /// Messages completed (all QPs).
    pub iterations: u64,
    /// Peak bandwidth in bytes per second.
    pub peak_bps: f64,
    /// Average bandwidth in bytes per second.
    pub avg_bps: f64,
    /// Messages per second.
    pub msg_rate: f64,
}

impl BwResult {
    /// A result from `messages` of `bytes` completed in `secs`, with the best rate seen over a
    /// window (`peak_bps`, bytes per second).
    pub fn new(bytes: u64, messages: u64, secs: f64, peak_bps: f64) -> BwResult {
        let secs = secs.max(1e-9);
        let avg = (bytes * messages) as f64 / secs;
        BwResult {
            bytes,
            iterations: messages,
            peak_bps: peak_bps.max(avg),
            avg_bps: avg,
            msg_rate: messages as f64 / secs,
        }
    }
}

/// Bandwidth table header (perftest's columns).
pub fn bw_header(gbits: bool) -> String {
    if gbits {
        " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]".into()
    } else {
        " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]".into()
    }
}

/// Converts bytes per second to the table's unit.
pub fn bw_unit(bps: f64, gbits: bool) -> f64 {
    if gbits {
        bps * 8.0 / 1e9
    } else {
        bps / (1u64 << 20) as f64
    }
}

/// One bandwidth table line, formatted as perftest does (`REPORT_FMT`, and its wider form
/// for Gb/sec figures under 0.1).
pub fn bw_line(r: &BwResult, gbits: bool) -> String {
    let avg = bw_unit(r.avg_bps, gbits);
    if gbits && avg < 0.1 {
        return format!(
            " {:<7}    {}           {:<7.6}            {:<7.6}            {:<7.6}",
            r.bytes,
            r.iterations,
            bw_unit(r.peak_bps, gbits),
            avg,
            r.msg_rate / 1e6
        );
    }
    format!(
        " {:<7}    {:<10}       {:<7.2}            {:<7.2}\t\t   {:<7.6}",
        r.bytes,
        r.iterations,
        bw_unit(r.peak_bps, gbits),
        avg,
        r.msg_rate / 1e6
    )
}

/// A bandwidth result as JSON.
pub fn bw_json(r: &BwResult) -> Value {
    json!({
        "bytes": r.bytes,
        "iterations": r.iterations,
        "bw_peak_MBps": bw_unit(r.peak_bps, false),
        "bw_avg_MBps": bw_unit(r.avg_bps, false),
        "bw_peak_Gbps": bw_unit(r.peak_bps, true),
        "bw_avg_Gbps": bw_unit(r.avg_bps, true),
        "msg_rate_Mpps": r.msg_rate / 1e6,
    })
}

/// Latency statistics of one size.
#[derive(Debug, Clone, PartialEq)]
pub struct LatResult {
    /// Message size in bytes.
    pub bytes: u64,
    /// Iterations measured.
    pub iterations: u64,
    /// Minimum, microseconds.
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Median ("typical" in perftest).
    pub typical: f64,
    /// Mean.
    pub avg: f64,
    /// Standard deviation.
    pub stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// The samples, sorted (for `-H`).
    pub samples: Vec<f64>,
}

impl LatResult {
    /// perftest's latency statistics (`print_report_lat`, docs/perftest-protocol.md 6.3) from
    /// the post times of `iters` iterations (ns): `iters-1` deltas divided by `rtt_factor`
    /// (2 for WRITE/SEND ping-pong, 1 for READ/ATOMIC round trips), sorted, the two largest
    /// left out of the statistics (`LAT_MEASURE_TAIL`), t_max being the largest kept.
    pub fn perftest(bytes: u64, iters: u64, tposted_ns: &[u64], rtt_factor: f64) -> LatResult {
        let mut d: Vec<f64> = tposted_ns
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as f64 / 1000.0 / rtt_factor)
            .collect();
        d.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
        if d.is_empty() {
            return LatResult {
                bytes,
                iterations: iters,
                min: 0.0,
                max: 0.0,
                typical: 0.0,
                avg: 0.0,
                stdev: 0.0,
                p99: 0.0,
                p999: 0.0,
                samples: d,
            };
        }
        // m = iters - 1 - LAT_MEASURE_TAIL is the index of t_max; the m smallest are the
        // statistics' samples (tiny runs keep what there is).
        let n = d.len();
        let m = if n >= 3 { n - 2 } else { n - 1 };
        let kept = &d[..m.max(1)];
        let cnt = kept.len() as f64;
        let avg = kept.iter().sum::<f64>() / cnt;
        let var = kept.iter().map(|s| (avg - s) * (avg - s)).sum::<f64>() / cnt;
        let typical = if m >= 2 && (m - 1) % 2 == 1 {
            (d[m / 2] + d[m / 2 - 1]) / 2.0
        } else {
            d[m / 2]
        };
        let pct = |p: f64| d[((m as f64 * p).ceil() as usize).min(m).min(d.len() - 1)];
        LatResult {
            bytes,
            iterations: iters,
            min: d[0],
            max: d[m.min(d.len() - 1)],
            typical,
            avg,
            stdev: var.sqrt(),
            p99: pct(0.99),
            p999: pct(0.999),
            samples: kept.to_vec(),
        }
    }
}

/// Latency table header (perftest's columns).
pub fn lat_header() -> &'static str {
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
}

/// One latency table line (`REPORT_FMT_LAT`).
pub fn lat_line(r: &LatResult) -> String {
    format!(
        " {:<7} {}          {:<7.2}        {:<7.2}      {:<7.2}  \t       {:<7.2}     \t{:<7.2}\t\t{:<7.2} \t\t{:<7.2}",
        r.bytes, r.iterations, r.min, r.max, r.typical, r.avg, r.stdev, r.p99, r.p999
    )
}

/// `-H`: perftest's sample listing, "#, usec" then one `index, value` line per sorted sample
/// that entered the statistics.
pub fn histogram(r: &LatResult) -> String {
    let mut out = String::from("#, usec\n");
    for (i, v) in r.samples.iter().enumerate() {
        out.push_str(&format!("{}, {}\n", i + 1, fmt_g(*v)));
    }
    out
}

/// `%g`-like: up to 6 significant digits, no trailing zeros.
fn fmt_g(v: f64) -> String {
    let digits = if v.abs() >= 1.0 {
        (5 - v.abs().log10().floor() as i32).max(0) as usize
    } else {
        6
    };
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A latency result as JSON.
pub fn lat_json(r: &LatResult) -> Value {
    json!({
        "bytes": r.bytes,
        "iterations": r.iterations,
        "t_min_us": r.min,
        "t_max_us": r.max,
        "t_typical_us": r.typical,
        "t_avg_us": r.avg,
        "t_stdev_us": r.stdev,
        "p99_us": r.p99,
        "p99_9_us": r.p999,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bandwidth_units_are_perftests() {
        // 20 x 64 KiB in 0.08 s: 15.625 MB/sec (2^20) and 0.000250 Mpps, as in the corpus'
        // ib_write_bw -s 65536 -n 20 output.
        let r = BwResult::new(65536, 20, 0.08, 0.0);
        assert!((bw_unit(r.avg_bps, false) - 15.625).abs() < 1e-9);
        assert!((r.msg_rate / 1e6 - 0.00025).abs() < 1e-12);
        // Byte for byte as the corpus' log prints it.
        let line = bw_line(&BwResult::new(65536, 20, 0.07998, 0.0), false);
        assert_eq!(
            line,
            " 65536      20               15.63              15.63  \t\t   0.000250"
        );
        // Gb/sec is decimal: 15.625 MiB/s = 0.131072 Gb/s.
        assert!((bw_unit(r.avg_bps, true) - 0.131072).abs() < 1e-9);
    }

    #[test]
    fn latency_line_is_perftests() {
        // corpus atomic/read latency log line (8 B, 50 iterations).
        let r = LatResult {
            bytes: 8,
            iterations: 50,
            min: 260.59,
            max: 1828.40,
            typical: 367.90,
            avg: 463.62,
            stdev: 289.91,
            p99: 1828.40,
            p999: 1828.40,
            samples: vec![],
        };
        assert_eq!(
            lat_line(&r),
            " 8       50          260.59         1828.40      367.90   \t       463.62      \t289.91 \t\t1828.40 \t\t1828.40"
        );
    }

    #[test]
    fn latency_statistics_as_perftest() {
        // Posts 1 us apart except one 5 us gap and one 9 us gap: 9 deltas, the two largest
        // (5, 9) are the measurement tail; t_max is the largest kept (1.0).
        let mut t = vec![0u64];
        for gap in [1000, 1000, 5000, 1000, 1000, 9000, 1000, 1000, 1000] {
            t.push(t.last().unwrap() + gap);
        }
        let r = LatResult::perftest(2, 10, &t, 1.0);
        assert_eq!(r.iterations, 10);
        assert_eq!(r.min, 1.0);
        assert_eq!(r.max, 5.0, "t_max is delta[m], m = iters-1-2 = 7");
        assert_eq!(r.typical, 1.0);
        assert!((r.avg - 1.0).abs() < 1e-9);
        assert_eq!(r.stdev, 0.0);
        // Ping-pong halves the round trip.
        let h = LatResult::perftest(2, 10, &t, 2.0);
        assert_eq!(h.min, 0.5);
        assert_eq!(LatResult::perftest(2, 1, &[5], 2.0).max, 0.0);
        assert_eq!(LatResult::perftest(2, 2, &[0, 3000], 1.0).min, 3.0);
        let hist = histogram(&LatResult::perftest(
            2,
            5,
            &[0, 1000, 2000, 4500, 9000],
            1.0,
        ));
        assert_eq!(hist, "#, usec\n1, 1\n2, 1\n");
        assert_eq!(fmt_g(12.5), "12.5");
        assert_eq!(fmt_g(3.0), "3");
        assert_eq!(fmt_g(1234.56789), "1234.57");
    }
}
