//! `rnic-perf`: perftest's bandwidth and latency tests, and rdma-core's pingpong examples, on
//! ferroce's verbs API, speaking their TCP exchanges so that either end may be the unmodified
//! tool (docs/perftest-protocol.md is the specification followed here).

pub mod baseline;
pub mod bw;
pub mod cm;
pub mod driver;
pub mod lat;
pub mod oob;
pub mod pingpong;
pub mod report;
pub mod res;
pub mod run;

use clap::{Args, ValueEnum};
use roce::verbs::Mtu;

/// The error a test returns when SIGINT/SIGTERM stopped it (after printing what it measured).
pub const INTERRUPTED: &str = "interrupted";

/// "vendor error N" as perftest prints it, with what ferroce's code means when it has one.
pub fn vendor_text(code: u32) -> String {
    match roce::verbs::vendor_err::describe(code) {
        Some(d) => format!("vendor error {code:#x}: {d}"),
        None => format!("vendor error {code}"),
    }
}

/// Polls `cq` into `wc` and returns the completions, or fails at the first one in error as
/// perftest stops there: the message says "Completion with error", `which(c)` (the side and
/// the WR it was) and the status.
pub fn poll_checked<'a, V: dataplane::Verbs>(
    ctx: &mut V,
    cq: roce::engine::CqId,
    wc: &'a mut [roce::verbs::Completion],
    which: impl Fn(&roce::verbs::Completion) -> String,
) -> Result<&'a [roce::verbs::Completion], String> {
    let n = ctx.poll_cq(cq, wc).map_err(|e| format!("poll CQ: {e}"))?;
    let done = &wc[..n];
    if let Some(c) = done
        .iter()
        .find(|c| c.status != roce::verbs::WcStatus::Success)
    {
        return Err(format!(
            "Completion with error {}: {}",
            which(c),
            wc_status_text(c)
        ));
    }
    Ok(done)
}

/// A failed completion's status (by name and number) and its vendor error, for the error
/// messages of the bandwidth and latency tests.
pub fn wc_status_text(c: &roce::verbs::Completion) -> String {
    format!(
        "status {:?} ({}) {}",
        c.status,
        c.status as u32,
        vendor_text(c.vendor_err)
    )
}

/// What a run measured before it ended early (SIGINT/SIGTERM, or an error after some rows):
/// each side's document (`client`/`server`, as a successful run returns them) and the
/// counters, so that `--json` reports them with the error instead of losing them.
static PARTIAL: std::sync::Mutex<Option<serde_json::Map<String, serde_json::Value>>> =
    std::sync::Mutex::new(None);

/// Keeps `doc` as what `key` (`client`, `server` or `counters`) measured of a run that ends
/// with an error.
pub fn keep_partial(key: &str, doc: serde_json::Value) {
    let mut g = PARTIAL.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(serde_json::Map::new)
        .insert(key.to_string(), doc);
}

/// Takes what [`keep_partial`] kept.
pub fn take_partial() -> serde_json::Map<String, serde_json::Value> {
    let mut g = PARTIAL.lock().unwrap_or_else(|e| e.into_inner());
    g.take().unwrap_or_default()
}

/// Whether the user asked to stop (SIGINT/SIGTERM): loops end and report what they have.
pub fn interrupted() -> bool {
    crate::rnic_opts::stop_requested()
}

/// The RDMA operation a test measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// SEND/RECV.
    Send,
    /// ATOMIC.
    Atomic,
}

/// Bandwidth or latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `*_bw`.
    Bw,
    /// `*_lat`.
    Lat,
}

/// Transport (`-c`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(clippy::upper_case_acronyms)]
pub enum Conn {
    /// Reliable connection.
    #[value(name = "RC", alias = "rc")]
    RC,
    /// Unreliable connection.
    #[value(name = "UC", alias = "uc")]
    UC,
    /// Unreliable datagram.
    #[value(name = "UD", alias = "ud")]
    UD,
}

/// `-A`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
pub enum AtomicType {
    /// Compare and swap.
    #[value(name = "CMP_AND_SWAP", alias = "cmp_and_swap")]
    CMP_AND_SWAP,
    /// Fetch and add.
    #[value(name = "FETCH_AND_ADD", alias = "fetch_and_add")]
    FETCH_AND_ADD,
}

/// perftest's flags, with its meanings (docs/perftest-protocol.md section 3).
#[derive(Debug, Clone, Args)]
pub struct PerfArgs {
    /// Server address: run as the client (without it: run as the server).
    pub server: Option<String>,
    /// Message size in bytes.
    #[arg(short = 's', long = "size")]
    pub size: Option<u64>,
    /// Run all sizes from 2 B to 8 MiB.
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Iterations.
    #[arg(short = 'n', long = "iters")]
    pub iters: Option<u64>,
    /// Run for SECS seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration", value_name = "SECS")]
    pub duration: Option<u64>,
    /// Number of QPs (bandwidth tests).
    #[arg(short = 'q', long = "qp", default_value_t = 1)]
    pub qps: u32,
    /// Send queue depth (WRs in flight per QP).
    #[arg(short = 't', long = "tx-depth")]
    pub tx_depth: Option<u32>,
    /// Receive queue depth (SEND tests).
    #[arg(short = 'r', long = "rx-depth")]
    pub rx_depth: Option<u32>,
    /// Generate a completion every N WRs.
    #[arg(short = 'Q', long = "cq-mod")]
    pub cq_mod: Option<u32>,
    /// Post N WRs per call.
    #[arg(short = 'l', long = "post_list", default_value_t = 1)]
    pub post_list: u32,
    /// Path MTU (256, 512, 1024, 2048, 4096); default: the port's active MTU.
    #[arg(short = 'm', long = "mtu")]
    pub mtu: Option<u32>,
    /// Connection type.
    #[arg(short = 'c', long = "connection", value_enum, default_value = "RC")]
    pub conn: Conn,
    /// Measure both directions at once.
    #[arg(short = 'b', long = "bidirectional")]
    pub bidir: bool,
    /// GID index (default: the first IPv4-mapped GID, else 0).
    #[arg(short = 'x', long = "gid-index")]
    pub gid_index: Option<u8>,
    /// TCP port of the out-of-band exchange.
    #[arg(short = 'p', long = "tcp-port", default_value_t = 18515)]
    pub tcp_port: u16,
    /// Local ACK timeout exponent (4.096 us x 2^N).
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14)]
    pub qp_timeout: u8,
    /// Atomic operation.
    #[arg(
        short = 'A',
        long = "atomic_type",
        value_enum,
        default_value = "FETCH_AND_ADD"
    )]
    pub atomic: AtomicType,
    /// Outstanding READ/ATOMIC (default: the device's maximum).
    #[arg(short = 'o', long = "outs")]
    pub outs: Option<u8>,
    /// Report Gb/sec (10^9 bit) instead of MB/sec (2^20 byte).
    #[arg(long = "report_gbits")]
    pub report_gbits: bool,
    /// Use RDMA WRITE with immediate (the server consumes a receive per message).
    #[arg(long = "write_with_imm")]
    pub write_with_imm: bool,
    /// Print the latency samples (histogram).
    #[arg(short = 'H', long = "report-histogram")]
    pub histogram: bool,
    /// Ignored (perftest's CPU frequency warning switch).
    #[arg(short = 'F', long = "CPU-freq")]
    pub cpu_freq: bool,
    /// Device name (accepted for perftest compatibility; ferroce has one device per process).
    #[arg(short = 'd', long = "ib-dev")]
    pub ib_dev: Option<String>,
    /// Port number (must be 1).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    pub ib_port: u8,
    /// Maximum inline data in bytes.
    #[arg(short = 'I', long = "inline_size")]
    pub inline: Option<u32>,
    /// Check the data of every message (an extension; both sides must be rnic-perf with
    /// --verify).
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON document with the results on stdout (tables go to stderr).
    #[arg(long)]
    pub json: bool,
    /// Bandwidth tests: also measure this machine's memcpy of the message size (the same
    /// working set) and print each result as a fraction of it (an extension).
    #[arg(long)]
    pub baseline: bool,
    /// Type of service: the traffic class (DSCP and ECN bits) of the RoCE packets.
    #[arg(short = 'T', long = "tos", value_name = "TOS")]
    pub tos: Option<u8>,
    /// Service level of the path (0..=15).
    #[arg(short = 'S', long = "sl", default_value_t = 0)]
    pub sl: u8,
    /// Do not measure the peak bandwidth.
    #[arg(short = 'N', long = "noPeak")]
    pub no_peak: bool,
    /// Print the version of perftest this speaks, and ferroce's, and exit.
    #[arg(short = 'V', long = "version")]
    pub version: bool,
    /// Print only one figure: bandwidth, message_rate or latency.
    #[arg(long = "output", value_name = "UNITS")]
    pub output: Option<String>,
    /// Run the out-of-band TCP exchange over IPv6.
    #[arg(long = "ipv6")]
    pub ipv6: bool,
    /// Accepted for perftest's command lines: ferroce has one post path.
    #[arg(long = "use_old_post_send")]
    pub use_old_post_send: bool,
    /// Run forever, printing the bandwidth every -D seconds (default 5); Ctrl-C stops.
    #[arg(long = "run_infinitely")]
    pub run_infinitely: bool,
    /// Sleep on completion events instead of polling the CQs (perftest -e).
    #[arg(short = 'e', long = "events")]
    pub events: bool,
    /// Connect the test's QPs with rdma_cm and exchange the test's data over an rdma_cm
    /// connection instead of TCP (perftest -R): the server listens on `-p` (an rdma_cm port),
    /// the client names the server's RNIC address.
    #[arg(short = 'R', long = "rdma_cm")]
    pub rdma_cm: bool,
}

/// Everything a test run needs, after perftest's `force_dependecies`.
#[derive(Debug, Clone)]
pub struct Params {
    /// Operation.
    pub verb: Verb,
    /// Bandwidth or latency.
    pub kind: Kind,
    /// Server or client.
    pub role: oob::Role,
    /// Transport.
    pub conn: Conn,
    /// Sizes to run (one unless `-a`).
    pub sizes: Vec<u64>,
    /// Largest size (buffers are allocated for it).
    pub max_size: u64,
    /// Iterations per QP (0 in duration mode).
    pub iters: u64,
    /// Duration mode.
    pub duration: Option<u64>,
    /// QPs.
    pub qps: u32,
    /// Send depth.
    pub tx_depth: u32,
    /// Receive depth.
    pub rx_depth: u32,
    /// Completion moderation.
    pub cq_mod: u32,
    /// WRs per post call.
    pub post_list: u32,
    /// Requested path MTU.
    pub mtu: Option<Mtu>,
    /// Bidirectional.
    pub bidir: bool,
    /// GID index (None: auto).
    pub gid_index: Option<u8>,
    /// ACK timeout exponent.
    pub qp_timeout: u8,
    /// Atomic operation.
    pub atomic: AtomicType,
    /// Outstanding READ/ATOMIC requested.
    pub outs: Option<u8>,
    /// Gb/sec units.
    pub gbits: bool,
    /// WRITE with immediate.
    pub write_imm: bool,
    /// Histogram.
    pub histogram: bool,
    /// Inline size.
    pub inline: u32,
    /// Verify data.
    pub verify: bool,
    /// JSON output.
    pub json: bool,
    /// Whether the user gave `-Q`.
    pub cq_mod_given: bool,
    /// Whether the peak bandwidth is measured.
    pub peak: bool,
    /// `-N`: the peak column reads 0.
    pub no_peak: bool,
    /// Traffic class of the path (`-T`).
    pub tos: u8,
    /// Service level of the path (`-S`).
    pub sl: u8,
    /// `--output`: print only this figure.
    pub output: Option<Output>,
    /// `--ipv6`: the TCP exchange over IPv6.
    pub ipv6: bool,
    /// `--run_infinitely`.
    pub run_infinitely: bool,
    /// `-e`: sleep on completion events.
    pub events: bool,
    /// `-R`: QPs connected by rdma_cm, data exchanged over an rdma_cm connection.
    pub rdma_cm: bool,
}

/// `--output`: the one figure to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Average bandwidth.
    Bandwidth,
    /// Message rate.
    MessageRate,
    /// Typical latency.
    Latency,
}

/// perftest's `MSG_SIZE_CQ_MOD_LIMIT`.
const MSG_SIZE_CQ_MOD_LIMIT: u64 = 8192;
/// Iterations of a run over all its QPs at most: each is timed and its timestamps kept
/// (8-16 bytes each), so more would ask for gigabytes before the first message.
const MAX_ITERS: u64 = 100_000_000;
/// Largest size of `-a`.
pub const MAX_SIZE_ALL: u64 = 8 << 20;

impl Params {
    /// Derives the run's parameters from the flags, as perftest does (section 3), rejecting
    /// combinations perftest rejects.
    pub fn from_args(verb: Verb, kind: Kind, a: &PerfArgs) -> Result<Params, String> {
        let role = if a.server.is_some() {
            oob::Role::Client
        } else {
            oob::Role::Server
        };
        if a.events && verb == Verb::Write && kind == Kind::Lat {
            // ib_write_lat waits by polling the buffer for the peer's WRITE, not a CQ.
            return Err("-e is not available with write_lat (it polls memory, not a CQ)".into());
        }
        if a.rdma_cm && a.conn == Conn::UC {
            // perftest's refusal: rdma_cm connects RC (port space TCP) and UD (UDP) only.
            return Err("-R: UC is not supported in librdmacm".into());
        }
        if a.rdma_cm && a.ipv6 {
            return Err(
                "-R: rdma_cm addresses are IPv4 here (--ipv6 applies to the TCP exchange)".into(),
            );
        }
        if a.sl > 15 {
            return Err(format!("-S {}: between 0 and 15", a.sl));
        }
        let output = match a.output.as_deref() {
            None => None,
            Some("bandwidth") => Some(Output::Bandwidth),
            Some("message_rate") => Some(Output::MessageRate),
            Some("latency") => Some(Output::Latency),
            Some(o) => return Err(format!("--output {o}: bandwidth, message_rate or latency")),
        };
        if output == Some(Output::Latency) && kind == Kind::Bw
            || matches!(output, Some(Output::Bandwidth | Output::MessageRate)) && kind == Kind::Lat
        {
            return Err(format!(
                "--output {}: not a figure this test measures",
                a.output.as_deref().unwrap_or("")
            ));
        }
        if a.run_infinitely && (kind != Kind::Bw || verb == Verb::Send || a.write_with_imm) {
            return Err("--run_infinitely applies to write_bw, read_bw and atomic_bw here".into());
        }
        if a.run_infinitely && a.iters.is_some() {
            return Err("--run_infinitely and -n are exclusive".into());
        }
        if a.ib_port != 1 {
            return Err(format!(
                "-i {}: ferroce devices have one port (1)",
                a.ib_port
            ));
        }
        if a.conn == Conn::UD && verb != Verb::Send {
            return Err("UD is supported only by the SEND tests (-c UD)".into());
        }
        if a.conn == Conn::UC && matches!(verb, Verb::Read | Verb::Atomic) {
            return Err("UC supports only SEND and WRITE".into());
        }
        if kind == Kind::Lat && a.qps != 1 {
            return Err("-q is supported only by the bandwidth tests".into());
        }
        if kind == Kind::Lat && a.duration.is_some() {
            return Err("-D is supported by the bandwidth tests; use -n for latency".into());
        }
        if kind == Kind::Lat && a.bidir {
            return Err("-b is supported only by the bandwidth tests".into());
        }
        if a.qps == 0 || a.qps > 512 {
            return Err(format!("-q {}: between 1 and 512", a.qps));
        }
        if a.post_list == 0 || a.post_list > 1024 {
            return Err(format!("-l {}: between 1 and 1024", a.post_list));
        }
        if verb == Verb::Atomic && a.size.is_some_and(|s| s != 8) {
            return Err("atomic tests use 8-byte messages (-s is not accepted)".into());
        }
        if a.write_with_imm && verb != Verb::Write {
            return Err("--write_with_imm applies to the WRITE tests".into());
        }
        if a.all && a.size.is_some() {
            return Err("-a and -s are exclusive".into());
        }
        if a.duration.is_some() && a.iters.is_some() {
            return Err("-D and -n are exclusive".into());
        }
        if a.duration == Some(0) {
            return Err("-D must be at least 1 second".into());
        }
        let mtu = match a.mtu {
            None => None,
            Some(m) => Some(match m {
                256 => Mtu::M256,
                512 => Mtu::M512,
                1024 => Mtu::M1024,
                2048 => Mtu::M2048,
                4096 => Mtu::M4096,
                _ => return Err(format!("-m {m}: must be 256, 512, 1024, 2048 or 4096")),
            }),
        };
        let default_size = match (verb, kind) {
            (Verb::Atomic, _) => 8,
            (_, Kind::Bw) => 65536,
            (_, Kind::Lat) => 2,
        };
        let size = a.size.unwrap_or(default_size);
        if size == 0 || size > MAX_SIZE_ALL {
            return Err(format!("-s {size}: between 1 and {MAX_SIZE_ALL}"));
        }
        let sizes: Vec<u64> = if a.all {
            if verb == Verb::Atomic {
                vec![8]
            } else {
                (1..=23).map(|k| 1u64 << k).collect()
            }
        } else {
            vec![size]
        };
        let max_size = *sizes.iter().max().unwrap_or(&size);
        let duration = match (a.duration, a.run_infinitely) {
            (None, true) => Some(5),
            (d, _) => d,
        };
        let iters = match duration {
            Some(_) => 0,
            None => {
                let n = a
                    .iters
                    .unwrap_or(if verb == Verb::Write && kind == Kind::Bw {
                        5000
                    } else {
                        1000
                    });
                if n < 5 {
                    return Err(format!("-n {n}: at least 5 iterations"));
                }
                // Every iteration's timestamps are kept (perftest's too), per QP.
                if n.saturating_mul(a.qps as u64) > MAX_ITERS {
                    return Err(format!(
                        "-n {n}: at most {MAX_ITERS} iterations over all QPs (-q {})",
                        a.qps
                    ));
                }
                n
            }
        };
        let mut tx_depth = a.tx_depth.unwrap_or(if kind == Kind::Bw { 128 } else { 1 });
        if tx_depth == 0 || tx_depth > 8192 {
            return Err(format!("-t {tx_depth}: between 1 and 8192"));
        }
        let mut rx_depth = a
            .rx_depth
            .unwrap_or(if verb == Verb::Send || a.write_with_imm {
                512
            } else {
                1
            });
        if rx_depth == 0 || rx_depth > 16384 {
            return Err(format!("-r {rx_depth}: between 1 and 16384"));
        }
        let mut cq_mod = a.cq_mod.unwrap_or(100);
        if cq_mod == 0 || cq_mod > 8192 {
            return Err(format!("-Q {cq_mod}: between 1 and 8192"));
        }
        // force_dependecies, in order.
        if verb == Verb::Write && !a.write_with_imm {
            rx_depth = 1;
        }
        if iters > 0 {
            tx_depth = tx_depth.min(iters as u32);
            if verb == Verb::Send || a.write_with_imm {
                rx_depth = rx_depth.min(iters as u32);
            }
        }
        if size > MSG_SIZE_CQ_MOD_LIMIT && a.conn != Conn::UD && !a.all && a.cq_mod.is_none() {
            cq_mod = 1;
        }
        cq_mod = cq_mod.min(tx_depth);
        if kind == Kind::Lat {
            tx_depth = 1;
            cq_mod = 1;
        }
        if verb == Verb::Send && rx_depth % 2 == 1 && rx_depth > 1 {
            rx_depth += 1;
        }
        let inline = match verb {
            Verb::Read | Verb::Atomic => 0,
            _ => a.inline.unwrap_or(0),
        };
        if inline > 512 {
            return Err(format!("-I {inline}: at most 512"));
        }
        if a.post_list > tx_depth {
            return Err(format!(
                "-l {} exceeds the TX depth {tx_depth}",
                a.post_list
            ));
        }
        if a.verify {
            if a.duration.is_some() && verb == Verb::Write && kind == Kind::Bw {
                return Err(
                    "--verify with WRITE bandwidth needs -n (every message keeps its own slot)"
                        .into(),
                );
            }
            if verb == Verb::Write && kind == Kind::Bw && a.all {
                return Err("--verify with WRITE bandwidth runs one size (no -a)".into());
            }
            if verb == Verb::Write && kind == Kind::Bw && iters * res::inc(max_size, 64) > 256 << 20
            {
                return Err(format!(
                    "--verify with WRITE keeps every message: -n {iters} x {max_size} B exceeds 256 MiB per QP"
                ));
            }
        }
        let peak = !a.no_peak
            && duration.is_none()
            && iters <= 20000
            && !(verb == Verb::Send && role == oob::Role::Server && !a.bidir);
        Ok(Params {
            verb,
            kind,
            role,
            conn: a.conn,
            sizes,
            max_size,
            iters,
            duration,
            qps: a.qps,
            tx_depth,
            rx_depth,
            cq_mod,
            post_list: a.post_list,
            mtu,
            bidir: a.bidir,
            gid_index: a.gid_index,
            qp_timeout: a.qp_timeout.min(31),
            atomic: a.atomic,
            outs: a.outs,
            gbits: a.report_gbits,
            write_imm: a.write_with_imm,
            histogram: a.histogram,
            inline,
            verify: a.verify,
            json: a.json,
            cq_mod_given: a.cq_mod.is_some(),
            peak,
            no_peak: a.no_peak,
            tos: a.tos.unwrap_or(0),
            sl: a.sl,
            output,
            ipv6: a.ipv6,
            run_infinitely: a.run_infinitely,
            events: a.events,
            rdma_cm: a.rdma_cm,
        })
    }

    /// The test's title as perftest prints it (section 6.1).
    pub fn title(&self) -> String {
        let mut t = String::from(match self.verb {
            Verb::Send => "Send ",
            Verb::Write => "RDMA_Write ",
            Verb::Read => "RDMA_Read ",
            Verb::Atomic => "Atomic ",
        });
        if self.verb == Verb::Atomic {
            t.push_str(match self.atomic {
                AtomicType::CMP_AND_SWAP => "CMP_AND_SWAP ",
                AtomicType::FETCH_AND_ADD => "FETCH_AND_ADD ",
            });
        }
        if self.bidir {
            t.push_str("Bidirectional ");
        }
        if self.post_list > 1 {
            t.push_str("Post List ");
        }
        t.push_str(match self.kind {
            Kind::Bw => "BW ",
            Kind::Lat => "Latency ",
        });
        t.push_str("Test");
        t
    }

    /// The tool name (`write_bw` ...).
    pub fn name(&self) -> String {
        let v = match self.verb {
            Verb::Write => "write",
            Verb::Read => "read",
            Verb::Send => "send",
            Verb::Atomic => "atomic",
        };
        let k = match self.kind {
            Kind::Bw => "bw",
            Kind::Lat => "lat",
        };
        format!("{v}_{k}")
    }

    /// Whether this side sends requests in the test.
    pub fn sends(&self) -> bool {
        self.role == oob::Role::Client || self.bidir || self.kind == Kind::Lat
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: PerfArgs,
    }

    fn p(verb: Verb, kind: Kind, args: &[&str]) -> Result<Params, String> {
        let mut v = vec!["t"];
        v.extend_from_slice(args);
        Params::from_args(verb, kind, &T::try_parse_from(v).unwrap().a)
    }

    #[test]
    fn perftest_dependencies() {
        // The corpus headers: n=50 -> TX 50 / CQ 50 / RX 50 (send); n=20 s=65536 -> CQ 1.
        let w = p(
            Verb::Write,
            Kind::Bw,
            &["-s", "4096", "-n", "50", "10.99.0.4"],
        )
        .unwrap();
        assert_eq!((w.tx_depth, w.cq_mod, w.rx_depth), (50, 50, 1));
        assert_eq!(w.role, oob::Role::Client);
        let w = p(Verb::Write, Kind::Bw, &["-s", "65536", "-n", "20"]).unwrap();
        assert_eq!((w.tx_depth, w.cq_mod), (20, 1));
        assert_eq!(w.role, oob::Role::Server);
        let s = p(Verb::Send, Kind::Bw, &["-s", "2048", "-n", "50"]).unwrap();
        assert_eq!((s.tx_depth, s.cq_mod, s.rx_depth), (50, 50, 50));
        assert!(!s.peak, "the send server measures no peak");
        let d = p(Verb::Write, Kind::Bw, &[]).unwrap();
        assert_eq!(
            (d.iters, d.tx_depth, d.cq_mod, d.sizes.clone()),
            (5000, 128, 1, vec![65536])
        );
        let l = p(Verb::Send, Kind::Lat, &["-n", "50"]).unwrap();
        assert_eq!(
            (l.tx_depth, l.cq_mod, l.rx_depth, l.sizes.clone()),
            (1, 1, 50, vec![2])
        );
        let a = p(Verb::Atomic, Kind::Bw, &[]).unwrap();
        assert_eq!(a.sizes, vec![8]);
        assert_eq!(a.title(), "Atomic FETCH_AND_ADD BW Test");
        let all = p(Verb::Read, Kind::Bw, &["-a"]).unwrap();
        assert_eq!(all.sizes.len(), 23);
        assert_eq!(all.max_size, 8 << 20);
        assert_eq!(
            p(Verb::Write, Kind::Bw, &["-b", "-l", "4"])
                .unwrap()
                .title(),
            "RDMA_Write Bidirectional Post List BW Test"
        );
    }

    #[test]
    fn bad_combinations_are_rejected() {
        for (verb, kind, args) in [
            (Verb::Write, Kind::Bw, vec!["-c", "UD"]),
            (Verb::Read, Kind::Bw, vec!["-c", "UC"]),
            (Verb::Write, Kind::Lat, vec!["-q", "2"]),
            (Verb::Atomic, Kind::Bw, vec!["-s", "16"]),
            (Verb::Write, Kind::Bw, vec!["-m", "1000"]),
            (Verb::Write, Kind::Bw, vec!["-n", "2"]),
            // Each iteration's timestamps are kept: -n past 10^8 (over all QPs) would
            // abort the allocation, and past 2^32 wrapped the depths to 0.
            (Verb::Write, Kind::Lat, vec!["-n", "100000000000"]),
            (Verb::Send, Kind::Lat, vec!["-n", "4294967296"]),
            (Verb::Write, Kind::Bw, vec!["-n", "1000000", "-q", "512"]),
            (Verb::Write, Kind::Bw, vec!["-s", "0"]),
            (Verb::Write, Kind::Bw, vec!["-a", "-s", "8"]),
            (Verb::Write, Kind::Bw, vec!["-D", "2", "-n", "8"]),
            (Verb::Write, Kind::Bw, vec!["-i", "2"]),
            (Verb::Send, Kind::Bw, vec!["--write_with_imm"]),
            (Verb::Write, Kind::Bw, vec!["-t", "0"]),
            (Verb::Write, Kind::Bw, vec!["-l", "200", "-t", "100"]),
            (
                Verb::Write,
                Kind::Bw,
                vec!["--verify", "-n", "100000", "-s", "65536"],
            ),
        ] {
            assert!(p(verb, kind, &args).is_err(), "{args:?}");
        }
    }
}

/// Waiting for completions with `-e`: the first idle turn arms the CQ (the caller then polls
/// once more, so a completion that arrived before arming is seen); the next sleeps until the
/// CQ notifies, at most 100 ms (the caller's watchdogs and Ctrl-C checks keep running).
#[derive(Debug, Default)]
pub struct EventWait {
    armed: bool,
}

impl EventWait {
    /// One idle turn on `cq`.
    pub fn idle<V: dataplane::Verbs>(
        &mut self,
        ctx: &mut V,
        cq: roce::engine::CqId,
    ) -> Result<(), String> {
        if !self.armed {
            ctx.req_notify_cq(cq)
                .map_err(|e| format!("req_notify_cq: {e}"))?;
            self.armed = true;
        } else {
            ctx.wait_cq(cq, Some(std::time::Duration::from_millis(100)))
                .map_err(|e| format!("waiting for a completion event: {e}"))?;
            self.armed = false;
        }
        Ok(())
    }

    /// Whether the CQ is armed (the next idle turn sleeps).
    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// Progress was made: the next idle turn arms again.
    pub fn reset(&mut self) {
        self.armed = false;
    }
}
