//! End-to-end throughput and latency of two ferroce RNICs joined by an in-process DPDK ring
//! link, beside baselines measured in the same run on the same machine:
//!
//! - DPDK's own rate on the same kind of link: a raw burst echo a -> b -> a through a ring
//!   pair, driven by one thread as ferroce's one worker drives both RNICs, with frames of the
//!   sizes the RDMA tests put on the wire (122 B = a 64 B WRITE, 4154 B = a full 4096 B-MTU
//!   packet), and the half round trip of one frame;
//! - the same link carrying a one-way stream whose frames are copied in at one end and out at
//!   the other (the ring PMD passes pointers, so the echo alone never touches the bytes);
//! - memcpy bandwidth over the same working set (one 64 KiB message), best of seven runs with
//!   the median and the slowest (`rnic-perf --baseline`'s measurement);
//! - the per-byte work of a WRITE when one core runs both ends, over the same 64 KiB in
//!   4 KiB packets: the transmit copy with its ICRC (one pass), the receive ICRC, the
//!   receive copy (the floor the 64 KiB goodput sits on before any per-packet cost);
//! - the half round trip of a token passed between two threads through one shared word (the
//!   barest cross-thread handoff, what an application thread and a worker thread cost).
//!
//! Then ferroce itself, through rnic-perf's loopback driver (perftest's loops and formulas):
//! RDMA WRITE bandwidth (64 KiB messages, MTU 4096), 64 B WRITE message rate, and 8 B WRITE
//! half round-trip latency (ib_write_lat). Ratios are printed against the baselines.
//!
//! Then 4 KiB WRITEs and READs with a type 2 memory window bound and invalidated per I/O
//! (SMB Direct's fast-registration pattern in verbs terms), against the same I/O through the
//! MR's key: the ratio is the cost of registering per I/O (`E2E_ONLY=fastreg` runs only this).
//!
//! Then 64 KiB WRITEs over one QP and over 16,000 QPs taken in turn (every QP active), and
//! the resident memory per QP (`E2E_ONLY=qps` runs only this). Then the loopback pair on one
//! worker thread against one each (`E2E_ONLY=workers`), and two pairs of clients on RNICs of
//! one worker against RNICs spread over two (`worker.count`, `E2E_ONLY=shards`), one
//! context's four QPs on one worker against spread over two (`worker.spread`,
//! `E2E_ONLY=spread`), and the
//! in-process pair with the application threads running the worker or only its own thread
//! (`worker.app_drive`, `E2E_ONLY=drive`). And 64 KiB, 1 MiB and 8 MiB WRITEs and
//! READs moving the same bytes (`E2E_ONLY=large`).
//!
//! And the same three through rnicd's host interface across processes: this process runs
//! the two RNICs behind an rnicd `Daemon` (socket in a temporary directory), and re-executes
//! itself twice as rnic-perf's server and client, each a client process of the daemon
//! (`rnic-perf --rnicd`): posts and completions cross shared-memory rings between processes.
//! Printed beside the in-process figures as ratios.
//!
//! And Debian's unmodified perftest binaries (`ib_write_bw -s 65536`, `ib_send_lat -s 8`) on
//! the same daemon through `scripts/ferroce-run` (ferroce's drop-in libibverbs.so.1, release
//! build via `make ibverbs PROFILE=release`), against the same tests run by rnic-perf through
//! rnicd in the same run. Skipped, with a line saying so, when perftest is not installed.
//!
//! `cargo bench -p ferroce-benches --bench e2e` (about a minute; release build).

use std::time::{Duration, Instant};

use clap::Parser;
use ferroce_tools::perf::driver::{self, Job};
use ferroce_tools::perf::{Kind, PerfArgs, Verb};
use ferroce_tools::rnic_opts::RnicOpts;
use pmd_bindings::mempool::ROCE_4K_DATA_ROOM;
use pmd_bindings::{ring_pair, Mbuf, Mempool, Port, PortConfig};
use serde_json::Value;

const BURST: usize = 32;

#[derive(Parser)]
struct A {
    #[command(flatten)]
    a: PerfArgs,
}

/// A ring pair named `name` whose ports take frames of up to 4200 bytes (a 4 KiB payload
/// with its headers).
fn jumbo_ring_pair(pool: &std::sync::Arc<Mempool>, name: &str) -> (Port, Port) {
    let cfg = PortConfig {
        mtu: Some(4200),
        ..PortConfig::default()
    };
    ring_pair(name, &cfg, pool.clone()).expect("ring pair")
}

/// Calls `step` 64 times at a go until `secs` have passed (the clock is read once per 64
/// steps); returns the seconds it ran.
fn repeat_for(secs: f64, mut step: impl FnMut()) -> f64 {
    let start = Instant::now();
    let limit = Duration::from_secs_f64(secs);
    while start.elapsed() < limit {
        for _ in 0..64 {
            step();
        }
    }
    start.elapsed().as_secs_f64()
}

/// Raw echo: returns (frames per second moved across the link counting both hops,
/// payload Gb/s across the link).
fn raw_echo(pool: &std::sync::Arc<Mempool>, name: &str, size: usize, secs: f64) -> (f64, f64) {
    let (a, b) = jumbo_ring_pair(pool, name);
    let (mut atx, mut arx) = (a.tx_queue(0).unwrap(), a.rx_queue(0).unwrap());
    let (mut btx, mut brx) = (b.tx_queue(0).unwrap(), b.rx_queue(0).unwrap());
    let mut burst: Vec<Mbuf> = Vec::with_capacity(BURST);
    let mut rx: Vec<Mbuf> = Vec::with_capacity(BURST);
    let mut echoed = 0u64;
    let s = repeat_for(secs, || {
        if burst.is_empty() && pool.alloc_bulk(&mut burst, BURST).is_ok() {
            for m in burst.iter_mut() {
                let d = m.append(size).expect("room");
                d[..14].copy_from_slice(&[2, 0, 0, 0x99, 0, 2, 2, 0, 0, 0x99, 0, 1, 8, 0]);
            }
        }
        atx.tx_burst(&mut burst);
        brx.rx_burst(&mut rx);
        btx.tx_burst(&mut rx);
        rx.clear();
        arx.rx_burst(&mut rx);
        echoed += rx.len() as u64;
        rx.clear();
    });
    burst.clear();
    drop((atx, arx, btx, brx, a, b));
    let fps = 2.0 * echoed as f64 / s;
    (fps, fps * size as f64 * 8.0 / 1e9)
}

/// A one-way stream a -> b in which every frame's bytes are copied in from a source buffer at
/// a and out to a destination buffer at b: the least a software NIC does per frame (the ring
/// itself only passes pointers). Returns (frames per second, payload Gb/s).
fn raw_stream_copy(
    pool: &std::sync::Arc<Mempool>,
    name: &str,
    size: usize,
    secs: f64,
) -> (f64, f64) {
    let (a, b) = jumbo_ring_pair(pool, name);
    let mut atx = a.tx_queue(0).unwrap();
    let mut brx = b.rx_queue(0).unwrap();
    let src = vec![0xa5u8; 65536];
    let mut dst = vec![0u8; 65536];
    let mut burst: Vec<Mbuf> = Vec::with_capacity(BURST);
    let mut rx: Vec<Mbuf> = Vec::with_capacity(BURST);
    let mut got = 0u64;
    let mut off = 0usize;
    let s = repeat_for(secs, || {
        if burst.is_empty() && pool.alloc_bulk(&mut burst, BURST).is_ok() {
            for m in burst.iter_mut() {
                let d = m.append(size).expect("room");
                if off + size > src.len() {
                    off = 0;
                }
                d.copy_from_slice(&src[off..off + size]);
                off += size;
            }
        }
        atx.tx_burst(&mut burst);
        brx.rx_burst(&mut rx);
        for m in &rx {
            let d = m.data();
            let o = (got as usize * size) % (dst.len() - size + 1);
            dst[o..o + d.len()].copy_from_slice(d);
            got += 1;
        }
        rx.clear();
    });
    std::hint::black_box(&dst);
    burst.clear();
    drop((atx, brx, a, b));
    let fps = got as f64 / s;
    (fps, fps * size as f64 * 8.0 / 1e9)
}

/// One frame a -> b -> a at a time: half the round trip, in microseconds (median of `n`).
fn raw_half_rtt(pool: &std::sync::Arc<Mempool>, name: &str, n: usize) -> f64 {
    let cfg = PortConfig::default();
    let (a, b) = ring_pair(name, &cfg, pool.clone()).expect("ring pair");
    let (mut atx, mut arx) = (a.tx_queue(0).unwrap(), a.rx_queue(0).unwrap());
    let (mut btx, mut brx) = (b.tx_queue(0).unwrap(), b.rx_queue(0).unwrap());
    let mut v = Vec::with_capacity(n);
    let mut one: Vec<Mbuf> = Vec::with_capacity(1);
    let mut rx: Vec<Mbuf> = Vec::with_capacity(BURST);
    for _ in 0..n {
        pool.alloc_bulk(&mut one, 1).expect("mbuf");
        one[0].append(64).expect("room")[..14].fill(2);
        let t = Instant::now();
        atx.tx_burst(&mut one);
        loop {
            brx.rx_burst(&mut rx);
            if !rx.is_empty() {
                btx.tx_burst(&mut rx);
                rx.clear();
                break;
            }
        }
        loop {
            arx.rx_burst(&mut rx);
            if !rx.is_empty() {
                rx.clear();
                break;
            }
        }
        v.push(t.elapsed().as_nanos() as f64 / 2000.0);
        one.clear();
    }
    drop((atx, arx, btx, brx, a, b));
    v.sort_by(|x, y| x.partial_cmp(y).unwrap());
    v[v.len() / 2]
}

/// Two threads passing a token back and forth through one shared word (the barest
/// cross-thread handoff: no ring, no frame): half the round trip in microseconds (median of
/// `n`). The threads spin and yield as ferroce's do, so on a machine with fewer free cores
/// than threads the figure includes the scheduler's handoff, as ferroce's latency does.
fn spsc_half_rtt(n: usize) -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let word = std::sync::Arc::new(AtomicU64::new(0));
    let w2 = word.clone();
    let wait_for = |w: &AtomicU64, v: u64| {
        let mut spins = 0u32;
        while w.load(Ordering::Acquire) != v {
            spins += 1;
            if spins > 64 {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    };
    let echo = std::thread::spawn(move || {
        for i in 0..n as u64 {
            wait_for(&w2, 2 * i + 1);
            w2.store(2 * i + 2, Ordering::Release);
        }
    });
    let mut v = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let t = Instant::now();
        word.store(2 * i + 1, Ordering::Release);
        wait_for(&word, 2 * i + 2);
        v.push(t.elapsed().as_nanos() as f64 / 2000.0);
    }
    echo.join().expect("echo thread");
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

fn ferroce(verb: Verb, kind: Kind, args: &[&str]) -> Value {
    ferroce_on(1, verb, kind, args)
}

/// As [`ferroce`], with the two RNICs on `workers` worker threads (1 or 2).
fn ferroce_on(workers: u32, verb: Verb, kind: Kind, args: &[&str]) -> Value {
    ferroce_with(workers, &RnicOpts::default(), verb, kind, args)
}

/// As [`ferroce_on`], with the RNICs' configuration overridden by `opts` (`--set`).
fn ferroce_with(workers: u32, opts: &RnicOpts, verb: Verb, kind: Kind, args: &[&str]) -> Value {
    let mut v = vec!["x"];
    v.extend_from_slice(args);
    let a = A::parse_from(v).a;
    let mut sink = Vec::new();
    let r = driver::loopback(
        &Job::Perf(verb, kind, a),
        4096,
        opts,
        &Default::default(),
        workers,
        &mut sink,
    )
    .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    r["client"]["results"][0].clone()
}

/// The environment variables that make this binary one end of an rnicd run.
const ROLE: &str = "FERROCE_E2E_ROLE";
const TEST: &str = "FERROCE_E2E_TEST";
const ARGS: &str = "FERROCE_E2E_ARGS";
const SOCK: &str = "FERROCE_E2E_SOCKET";

/// Child mode: one end of a test through rnicd; prints its JSON result.
fn child(role: &str) {
    let test = std::env::var(TEST).expect("test");
    let args = std::env::var(ARGS).expect("args");
    let sock = std::env::var(SOCK).expect("socket");
    let (verb, kind) = match test.as_str() {
        "write_bw" => (Verb::Write, Kind::Bw),
        "write_lat" => (Verb::Write, Kind::Lat),
        "send_lat" => (Verb::Send, Kind::Lat),
        t => panic!("test {t}"),
    };
    let mut v = vec!["x"];
    v.extend(args.split_whitespace());
    if role == "client" {
        v.push("127.0.0.1");
    }
    let a = A::parse_from(v).a;
    let dev = if role == "client" {
        "ferroce1"
    } else {
        "ferroce0"
    };
    let mut sink = Vec::new();
    let r = driver::via_rnicd(
        &Job::Perf(verb, kind, a),
        Some(std::path::Path::new(&sock)),
        Some(dev),
        &mut sink,
    )
    .unwrap_or_else(|e| panic!("{role} {test} {args}: {e}"));
    println!("{r}");
}

/// Runs `test` with `args` (plus `-p PORT`) as two processes through the daemon's socket;
/// returns the client's first result row.
fn via_rnicd(sock: &std::path::Path, test: &str, args: &str, port: u16) -> Value {
    let exe = std::env::current_exe().expect("exe");
    let args = format!("{args} -p {port}");
    let spawn = |role: &str| {
        std::process::Command::new(&exe)
            .env(ROLE, role)
            .env(TEST, test)
            .env(ARGS, &args)
            .env(SOCK, sock)
            .env("RUST_LOG", "error")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("spawn")
    };
    let srv = spawn("server");
    std::thread::sleep(Duration::from_millis(300));
    let cli = spawn("client").wait_with_output().expect("client");
    let _ = srv.wait_with_output();
    assert!(cli.status.success(), "{test} {args} through rnicd failed");
    let v: Value = serde_json::from_slice(&cli.stdout).expect("client JSON");
    v["results"][0].clone()
}

/// The workspace root (the benches crate's parent).
fn workspace() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

/// Runs Debian's perftest `tool` with `args` as two processes on the daemon's RNICs through
/// `ferroce-run` (server on ferroce0, client on ferroce1); returns the client's result row as
/// numbers (perftest's columns: bytes, iterations, then the figures).
fn via_ferroce_run(sock: &std::path::Path, tool: &str, args: &[&str], port: u16) -> Vec<f64> {
    let root = workspace();
    let run = root.join("scripts/ferroce-run");
    let libdir = root.join("target/release/ferroce");
    let port = port.to_string();
    let spawn = |dev: &str, peer: Option<&str>| {
        let mut c = std::process::Command::new(&run);
        c.arg("-S").arg(sock).arg(tool);
        c.args(["-d", dev, "-x", "1", "-F", "-p", &port]).args(args);
        c.args(peer);
        c.env("FERROCE_LIBDIR", &libdir)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn ferroce-run")
    };
    let srv = spawn("ferroce0", None);
    std::thread::sleep(Duration::from_millis(500));
    let cli = spawn("ferroce1", Some("127.0.0.1"))
        .wait_with_output()
        .expect("client");
    let _ = srv.wait_with_output();
    let out = String::from_utf8_lossy(&cli.stdout);
    assert!(
        cli.status.success(),
        "{tool} {args:?} through ferroce-run failed: {out}{}",
        String::from_utf8_lossy(&cli.stderr)
    );
    // The row after perftest's `#bytes` header.
    let row = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("#bytes"))
        .nth(1)
        .unwrap_or_else(|| panic!("{tool}: no result row in {out}"));
    row.split_whitespace()
        .map(|f| f.parse().unwrap_or(f64::NAN))
        .collect()
}

/// Two loopback RNICs (MTU 4096) and a context on each.
fn two_rnics(
    name: &str,
) -> (
    dataplane::runtime::Runtime,
    dataplane::Context,
    dataplane::Context,
) {
    let cfg = |h| driver::loopback_config(h, 4096, &RnicOpts::default()).expect("config");
    let rt = dataplane::runtime::Runtime::loopback(name, cfg(1), cfg(2)).expect("runtime");
    let a = rt.open(0).expect("a");
    let b = rt.open(1).expect("b");
    (rt, a, b)
}

/// 4 KiB RDMA WRITEs (or READs) from A into B, 64 in flight, for `n` I/Os; returns I/Os per
/// second. With `windows`, each I/O follows SMB Direct's pattern in verbs terms: B binds a
/// type 2 memory window over the I/O's 4 KiB with a fresh key (IBV_WR_BIND_MW, the
/// userspace fast registration), A moves the data through the window's key, and B
/// invalidates the window (IBV_WR_LOCAL_INV, unsignaled, chained before the slot's next
/// bind). Without, A uses the MR's key. Both ends are driven from this thread
/// (run-to-completion).
fn registered_io(read: bool, windows: bool, n: u64) -> f64 {
    use dataplane::Verbs;
    use ferroce_tools::dpdk_incast::rc_qp_init;
    use roce::memory::MwType;
    use roce::types::Rkey;
    use roce::verbs::{Access, Completion, SendFlags, SendWr, WcStatus, WrOp};
    const SLOTS: u64 = 64;
    const IO: u32 = 4096;
    let (rt, mut a, mut b) = two_rnics("e2e-mw");
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(1024).unwrap(), b.create_cq(1024).unwrap());
    let qa = a.create_qp(&rc_qp_init(pa, ca, 256)).unwrap();
    let qb = b.create_qp(&rc_qp_init(pb, cb, 256)).unwrap();
    let len = (SLOTS * IO as u64) as usize;
    let (ba, bb) = (a.alloc_buffer(len).unwrap(), b.alloc_buffer(len).unwrap());
    let ma = a.reg_mr(pa, &ba, 0, len, Access::ALL).unwrap();
    let mb = b.reg_mr(pb, &bb, 0, len, Access::ALL).unwrap();
    connect_rc(&mut a, qa, &mut b, qb);
    let mws: Vec<Rkey> = (0..SLOTS)
        .map(|_| b.alloc_mw(pb, MwType::Two).unwrap())
        .collect();
    let mut keys = mws.clone();
    let sig = SendFlags::SIGNALED;
    let io = |a: &mut dataplane::Context, slot: u64, rkey: Rkey| {
        let addr = mb.addr + slot * IO as u64;
        let op = if read {
            WrOp::Read {
                remote_addr: addr,
                rkey,
            }
        } else {
            WrOp::Write {
                remote_addr: addr,
                rkey,
            }
        };
        let sge = ma.sge(slot * IO as u64, IO);
        a.post_send(
            qa,
            &SendWr {
                wr_id: slot,
                op,
                sg_list: &[sge],
                flags: sig,
                ud: None,
            },
        )
        .expect("post I/O");
    };
    let bind = |b: &mut dataplane::Context, slot: u64, key: &mut Rkey| {
        let new = Rkey((key.0 & !0xff) | (key.0.wrapping_add(1) & 0xff));
        b.post_send(
            qb,
            &SendWr {
                wr_id: slot,
                op: WrOp::BindMw {
                    mw: *key,
                    rkey: new,
                    mr: mb.lkey,
                    addr: mb.addr + slot * IO as u64,
                    length: IO as u64,
                    access: Access::REMOTE_WRITE | Access::REMOTE_READ,
                },
                sg_list: &[],
                flags: sig,
                ud: None,
            },
        )
        .expect("post bind");
        *key = new;
    };
    let start = Instant::now();
    for s in 0..SLOTS {
        if windows {
            bind(&mut b, s, &mut keys[s as usize]);
        } else {
            io(&mut a, s, mb.rkey.unwrap());
        }
    }
    let mut done = 0u64;
    let mut wc = [Completion::default(); 32];
    while done < n {
        let got = a.poll_cq(ca, &mut wc).unwrap();
        for c in &wc[..got] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            done += 1;
            if windows {
                // Invalidate (unsignaled) and bind again, chained as SMB Direct posts them
                // (one ibv_post_send of two WRs: one doorbell, `Client::batch`): the send
                // queue runs them in order, one completion for both.
                let k = keys[c.wr_id as usize];
                b.batch(|b| {
                    b.post_send(
                        qb,
                        &SendWr {
                            wr_id: c.wr_id,
                            op: WrOp::LocalInv { rkey: k },
                            sg_list: &[],
                            flags: SendFlags::default(),
                            ud: None,
                        },
                    )
                    .expect("post invalidate");
                    bind(b, c.wr_id, &mut keys[c.wr_id as usize]);
                });
            } else {
                io(&mut a, c.wr_id, mb.rkey.unwrap());
            }
        }
        if windows {
            let got = b.poll_cq(cb, &mut wc).unwrap();
            for c in &wc[..got] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                io(&mut a, c.wr_id, keys[c.wr_id as usize]);
            }
        }
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    drop((a, b));
    rt.stop();
    rate
}

/// The per-byte work one core does for a WRITE when it runs both ends, with nothing else:
/// over a 64 KiB message in 4 KiB packets, the sender's payload copied into a frame buffer
/// with its ICRC in one pass (`Icrc::copy_from`, as the frame builder does), the receiver's
/// ICRC over the frame, then its copy into the destination. What the 64 KiB goodput is
/// bounded by before any per-packet cost (docs/performance.md).
fn icrc_floor() -> ferroce_tools::perf::baseline::Baseline {
    use roce::wire::icrc::Icrc;
    const MSG: usize = 65536;
    const PKT: usize = 4096;
    let src: Vec<u8> = (0..MSG).map(|i| (i * 31) as u8).collect();
    let mut dst = vec![0u8; MSG];
    let mut frames = vec![[0u8; PKT]; 16];
    ferroce_tools::perf::baseline::measure(MSG, 7, || {
        for (i, f) in frames.iter_mut().enumerate() {
            let mut out = Icrc::new();
            out.copy_from(f, std::hint::black_box(&src[i * PKT..(i + 1) * PKT]));
            let mut inn = Icrc::new();
            inn.update(f);
            std::hint::black_box((out.finish(), inn.finish()));
            dst[i * PKT..(i + 1) * PKT].copy_from_slice(f);
        }
        std::hint::black_box(&mut dst);
    })
}

/// Heap bytes in use in this process, every thread's arena (glibc's `mallinfo2`: what
/// malloc handed out and has not had back, in its arenas and in its own mappings). Resident
/// memory would not do: a second run reuses the first's freed heap.
fn heap_in_use() -> u64 {
    // SAFETY: mallinfo2 has no preconditions; it only reads malloc's statistics.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

/// 64 KiB RDMA WRITEs from A to B over `nqps` connected RC QP pairs, 64 in flight, each new
/// WRITE on the next QP in turn (round robin: with many QPs every QP is active, one WRITE
/// at a time), all QPs sharing one MR on each side and one CQ. Returns the goodput in Gb/s
/// and the heap the QPs took, in bytes per QP (both RNICs' QPs counted: the engine's state,
/// queues and tables, and the client's).
fn many_qps(nqps: u32, n: u64) -> (f64, f64) {
    use dataplane::Verbs;
    use ferroce_tools::dpdk_incast::{connect, rc_qp_init, End};
    use roce::verbs::Access;
    const MSG: u32 = 65536;
    const IN_FLIGHT: u64 = 64;
    let (rt, mut a, mut b) = two_rnics("e2e-qps");
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    let (ca, cb) = (a.create_cq(1024).unwrap(), b.create_cq(1024).unwrap());
    let len = MSG as usize;
    let (ba, bb) = (a.alloc_buffer(len).unwrap(), b.alloc_buffer(len).unwrap());
    let ma = a.reg_mr(pa, &ba, 0, len, Access::ALL).unwrap();
    let mb = b.reg_mr(pb, &bb, 0, len, Access::ALL).unwrap();
    let (ga, gb) = (a.query_gid(1).unwrap(), b.query_gid(1).unwrap());
    let before = heap_in_use();
    let mut qps = Vec::with_capacity(nqps as usize);
    // Room for a QP's share of the WRITEs in flight (all 64 on one QP).
    let depth = (IN_FLIGHT as u32).div_ceil(nqps).max(4);
    for _ in 0..nqps {
        let qa = a.create_qp(&rc_qp_init(pa, ca, depth)).expect("QP on A");
        let qb = b.create_qp(&rc_qp_init(pb, cb, depth)).expect("QP on B");
        let ea = End { qpn: qa, gid: ga };
        let eb = End { qpn: qb, gid: gb };
        connect(&mut a, &ea, &eb).expect("connect a");
        connect(&mut b, &eb, &ea).expect("connect b");
        qps.push(qa);
    }
    let per_qp = heap_in_use().saturating_sub(before) as f64 / (2.0 * nqps as f64);
    let mut next = 0usize;
    let start = Instant::now();
    stream_writes(&mut a, ca, n, IN_FLIGHT, |a| {
        let q = qps[next];
        next = (next + 1) % qps.len();
        post_write(a, q, &ma, &mb, MSG);
    });
    let gbps = n as f64 * MSG as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9;
    drop((a, b));
    rt.stop();
    (gbps, per_qp)
}

/// Connects RC QP `qa` of `a` and `qb` of `b` to each other (GID index 1 at both ends).
fn connect_rc(
    a: &mut dataplane::Context,
    qa: roce::types::Qpn,
    b: &mut dataplane::Context,
    qb: roce::types::Qpn,
) {
    use dataplane::Verbs;
    use ferroce_tools::dpdk_incast::{connect, End};
    let ea = End {
        qpn: qa,
        gid: a.query_gid(1).unwrap(),
    };
    let eb = End {
        qpn: qb,
        gid: b.query_gid(1).unwrap(),
    };
    connect(a, &ea, &eb).expect("connect a");
    connect(b, &eb, &ea).expect("connect b");
}

/// Posts one signaled WRITE on `qpn` of `len` bytes from the start of `from` to the start of
/// `to`.
fn post_write(
    a: &mut dataplane::Context,
    qpn: roce::types::Qpn,
    from: &dataplane::Mr,
    to: &dataplane::Mr,
    len: u32,
) {
    use dataplane::Verbs;
    use roce::verbs::{SendFlags, SendWr, WrOp};
    a.post_send(
        qpn,
        &SendWr {
            wr_id: 0,
            op: WrOp::Write {
                remote_addr: to.addr,
                rkey: to.rkey.expect("an rkey"),
            },
            sg_list: &[from.sge(0, len)],
            flags: SendFlags::SIGNALED,
            ud: None,
        },
    )
    .expect("post WRITE");
}

/// Keeps `in_flight` WRITEs posted by `post` until `n` have completed on `cq`, each one
/// successfully.
fn stream_writes(
    a: &mut dataplane::Context,
    cq: roce::engine::CqId,
    n: u64,
    in_flight: u64,
    mut post: impl FnMut(&mut dataplane::Context),
) {
    use dataplane::Verbs;
    use roce::verbs::{Completion, WcStatus};
    for _ in 0..in_flight.min(n) {
        post(a);
    }
    let (mut done, mut posted) = (0u64, in_flight.min(n));
    let mut wc = [Completion::default(); 32];
    while done < n {
        let got = a.poll_cq(cq, &mut wc).unwrap();
        for c in &wc[..got] {
            assert_eq!(c.status, WcStatus::Success, "{c:?}");
            done += 1;
            if posted < n {
                post(a);
                posted += 1;
            }
        }
    }
}

/// The median of some runs (the middle one of an odd count).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `a` and `b` in turn, `runs` times each (alternating, so a slow spell of this shared
/// machine falls on both); their medians.
fn alternating_medians(
    runs: usize,
    mut a: impl FnMut() -> f64,
    mut b: impl FnMut() -> f64,
) -> (f64, f64) {
    let (mut va, mut vb) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        va.push(a());
        vb.push(b());
    }
    (median(va), median(vb))
}

/// The many-QPs figures (issue 23): [`many_qps`] with 1 QP and with 16,000 (the default
/// table holds 16,384 per RNIC), alternating, three runs each, medians compared.
fn qp_scale() {
    println!("many QPs (64 KiB WRITEs, 64 in flight, round robin over the QPs)");
    let (mut one, mut many, mut mem) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..3 {
        one.push(many_qps(1, 20_000).0);
        let (g, b) = many_qps(16_000, 20_000);
        many.push(g);
        mem.push(b);
    }
    let (one, many, mem) = (median(one), median(many), median(mem));
    println!(
        "  1 QP: {one:8.2} Gb/s; 16,000 QPs: {many:8.2} Gb/s: ratio {:.3}; {mem:.0} bytes of heap per QP",
        many / one,
    );
}

/// The fast-registration figures: [`registered_io`] with and without a window per I/O,
/// alternating, three runs each, medians compared.
fn fast_registration() {
    println!("fast registration (SMB Direct's pattern: bind a type 2 window, I/O, invalidate)");
    for read in [false, true] {
        let verb = if read { "READ" } else { "WRITE" };
        let (plain, mw) = alternating_medians(
            3,
            || registered_io(read, false, 100_000),
            || registered_io(read, true, 100_000),
        );
        println!(
            "  4 KiB {verb}, 64 in flight: {mw:8.0} I/O/s with a window bound and invalidated per I/O, {plain:8.0} without: ratio {:.3}",
            mw / plain
        );
    }
}

fn have(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool} >/dev/null")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Builds the drop-in libibverbs (release) into target/release/ferroce; false if that fails.
fn build_libibverbs() -> bool {
    std::process::Command::new("make")
        .args(["-s", "ibverbs", "PROFILE=release"])
        .current_dir(workspace())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// The loopback pair on one worker thread and on two (each RNIC its own, its application
/// thread running it): 64 KiB WRITE goodput and 64 B WRITE message rate, three runs each,
/// alternating, medians (`E2E_ONLY=workers` runs only this).
fn workers() {
    println!("worker threads (the two loopback RNICs on one worker, or one each)");
    for (what, args, key, unit) in [
        (
            "64 KiB WRITE",
            &["-s", "65536", "-n", "30000", "-m", "4096"][..],
            "bw_avg_Gbps",
            "Gb/s",
        ),
        (
            "64 B WRITE",
            &["-s", "64", "-n", "1000000"][..],
            "msg_rate_Mpps",
            "Mmsg/s",
        ),
    ] {
        let run = |workers| ferroce_on(workers, Verb::Write, Kind::Bw, args)[key].as_f64();
        let (a, b) = alternating_medians(3, || run(1).unwrap(), || run(2).unwrap());
        println!(
            "  {what}: 1 worker {a:8.3} {unit}, 2 workers {b:8.3} {unit}: ratio {:.2}",
            b / a
        );
    }
}

/// Who runs the worker in process (`worker.app_drive`): the waiting application threads
/// (run-to-completion, the default) or only the worker's own thread. 64 KiB WRITE goodput,
/// 64 B WRITE message rate and the 8 B WRITE half round trip, five runs each, alternating,
/// medians (`E2E_ONLY=drive` runs only this).
fn app_drive() {
    println!("who runs the worker (worker.app_drive: application threads, or its own thread only)");
    let own = RnicOpts {
        set: vec!["worker.app_drive=false".into()],
        ..Default::default()
    };
    for (what, kind, args, key, unit) in [
        (
            "64 KiB WRITE",
            Kind::Bw,
            &["-s", "65536", "-n", "30000", "-m", "4096"][..],
            "bw_avg_Gbps",
            "Gb/s",
        ),
        (
            "64 B WRITE",
            Kind::Bw,
            &["-s", "64", "-n", "1000000"][..],
            "msg_rate_Mpps",
            "Mmsg/s",
        ),
        (
            "8 B WRITE half round trip",
            Kind::Lat,
            &["-s", "8", "-n", "20000"][..],
            "t_typical_us",
            "us",
        ),
    ] {
        let run = |o: &RnicOpts| ferroce_with(1, o, Verb::Write, kind, args)[key].as_f64();
        let (a, b) = alternating_medians(
            5,
            || run(&RnicOpts::default()).unwrap(),
            || run(&own).unwrap(),
        );
        println!(
            "  {what}: applications drive {a:8.3} {unit}, worker thread only {b:8.3} {unit}: ratio {:.2}",
            b / a
        );
    }
}

/// What a WRITE stream from context `a` to context `b` needs: a PD, CQ (256 deep on `a`),
/// buffer of `len` bytes and its MR on each.
struct WriteEnds {
    pa: roce::memory::PdId,
    pb: roce::memory::PdId,
    ca: roce::engine::CqId,
    cb: roce::engine::CqId,
    ba: dataplane::Buffer,
    bb: dataplane::Buffer,
    ma: dataplane::Mr,
    mb: dataplane::Mr,
}

impl WriteEnds {
    fn new(a: &mut dataplane::Context, b: &mut dataplane::Context, len: usize) -> WriteEnds {
        use dataplane::Verbs;
        use roce::verbs::Access;
        let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
        let (ca, cb) = (a.create_cq(256).unwrap(), b.create_cq(16).unwrap());
        let (ba, bb) = (a.alloc_buffer(len).unwrap(), b.alloc_buffer(len).unwrap());
        let ma = a.reg_mr(pa, &ba, 0, len, Access::ALL).unwrap();
        let mb = b.reg_mr(pb, &bb, 0, len, Access::ALL).unwrap();
        WriteEnds {
            pa,
            pb,
            ca,
            cb,
            ba,
            bb,
            ma,
            mb,
        }
    }

    /// One more connected RC pair (64 deep); returns `a`'s QP.
    fn connect(&self, a: &mut dataplane::Context, b: &mut dataplane::Context) -> roce::types::Qpn {
        use dataplane::Verbs;
        use ferroce_tools::dpdk_incast::rc_qp_init;
        let qa = a
            .create_qp(&rc_qp_init(self.pa, self.ca, 64))
            .expect("QP on A");
        let qb = b
            .create_qp(&rc_qp_init(self.pb, self.cb, 64))
            .expect("QP on B");
        connect_rc(a, qa, b, qb);
        qa
    }
}

/// 64 KiB WRITEs over two pairs of clients between two loopback RNICs (MTU 4096) spread
/// over `count` workers (`worker.count` 1 or 2): clients are placed on an RNIC's workers in
/// turn, so with 2 the k-th client of each RNIC is on worker k and each pair has a worker to
/// itself at both ends. Each pair moves `n` WRITEs, 32 in flight, from its own application
/// thread (which also runs its worker while it waits). Returns the aggregate goodput in Gb/s.
fn sharded_goodput(count: u32, n: u64) -> f64 {
    const MSG: u32 = 65536;
    const IN_FLIGHT: u64 = 32;
    let cfg = |h| {
        let mut c = driver::loopback_config(h, 4096, &RnicOpts::default()).expect("config");
        c.worker_count = count;
        c
    };
    let rt = dataplane::runtime::Runtime::loopback("e2e-shards", cfg(1), cfg(2)).expect("rt");
    let mut pairs = Vec::new();
    for _ in 0..2 {
        let (mut a, mut b) = (rt.open(0).expect("a"), rt.open(1).expect("b"));
        let e = WriteEnds::new(&mut a, &mut b, MSG as usize);
        let qa = e.connect(&mut a, &mut b);
        let WriteEnds {
            ca, ba, bb, ma, mb, ..
        } = e;
        pairs.push((a, b, ca, qa, ba, bb, ma, mb));
    }
    let start = Instant::now();
    let threads: Vec<_> = pairs
        .into_iter()
        .map(|(mut a, b, ca, qa, ba, bb, ma, mb)| {
            std::thread::spawn(move || {
                stream_writes(&mut a, ca, n, IN_FLIGHT, |a| {
                    post_write(a, qa, &ma, &mb, MSG)
                });
                drop((a, b, ba, bb));
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a stream");
    }
    let gbps = 2.0 * n as f64 * MSG as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9;
    rt.stop();
    gbps
}

/// [`sharded_goodput`] on one worker and on two, alternating, three runs each, medians.
fn shards() {
    println!("one RNIC over several workers (worker.count; two client pairs, 64 KiB WRITEs)");
    let (a, b) = alternating_medians(
        3,
        || sharded_goodput(1, 20_000),
        || sharded_goodput(2, 20_000),
    );
    println!(
        "  1 worker {a:8.2} Gb/s, 2 workers {b:8.2} Gb/s: ratio {:.2}",
        b / a
    );
}

/// 64 KiB WRITEs from one context with `qps` RC QPs sharing one CQ to one context on the
/// other loopback RNIC (MTU 4096), both RNICs over two workers (`worker.count = 2`): with
/// `worker.spread` each context's QPs are placed on both workers in turn, without it all on
/// the one its context is on. One application thread keeps 32 WRITEs in flight, posting
/// over the QPs in turn, until `n` completed. Returns the goodput in Gb/s.
fn spread_goodput(spread: bool, qps: usize, n: u64) -> f64 {
    const MSG: u32 = 65536;
    let cfg = |h| {
        let mut c = driver::loopback_config(h, 4096, &RnicOpts::default()).expect("config");
        c.worker_count = 2;
        c.worker_spread = spread;
        c
    };
    let rt = dataplane::runtime::Runtime::loopback("e2e-spread", cfg(1), cfg(2)).expect("rt");
    let (mut a, mut b) = (rt.open(0).expect("a"), rt.open(1).expect("b"));
    let e = WriteEnds::new(&mut a, &mut b, MSG as usize);
    let qa: Vec<_> = (0..qps).map(|_| e.connect(&mut a, &mut b)).collect();
    let start = Instant::now();
    let mut next = 0;
    stream_writes(&mut a, e.ca, n, 32, |a| {
        post_write(a, qa[next], &e.ma, &e.mb, MSG);
        next = (next + 1) % qa.len();
    });
    let gbps = n as f64 * MSG as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9;
    drop((a, b, e));
    rt.stop();
    gbps
}

/// [`spread_goodput`] with the context on one worker and spread over two, alternating,
/// three runs each, medians.
fn spread() {
    println!("one context's QPs over two workers (worker.spread; 4 QPs, one CQ, 64 KiB WRITEs)");
    let (a, b) = alternating_medians(
        3,
        || spread_goodput(false, 4, 20_000),
        || spread_goodput(true, 4, 20_000),
    );
    println!(
        "  on one worker {a:8.2} Gb/s, over two {b:8.2} Gb/s: ratio {:.2}",
        b / a
    );
}

/// Large messages (issue 22: 1 MiB and 8 MiB WRITE and READ at the goodput of 64 KiB): each
/// size moves the same 1 GiB in process, three runs each, sizes alternating, medians, the
/// ratio to 64 KiB of the same verb, and memcpy over the same working set (one message's
/// buffer) beside it, since a message larger than the caches costs memory bandwidth
/// (`E2E_ONLY=large` runs only this).
fn large_messages() {
    println!("message sizes (1 GiB moved per run, MTU 4096, in process)");
    const TOTAL: u64 = 1 << 30;
    let sizes = [65536u64, 1 << 20, 8 << 20];
    let mc: Vec<f64> = sizes
        .iter()
        .map(|&s| ferroce_tools::perf::baseline::memcpy(s as usize, 7).best_bps / 1e9)
        .collect();
    println!(
        "  memcpy (best of 7): 64 KiB {:7.2} Gb/s, 1 MiB {:7.2} Gb/s, 8 MiB {:7.2} Gb/s",
        mc[0], mc[1], mc[2]
    );
    for verb in [Verb::Write, Verb::Read] {
        let mut runs: Vec<Vec<f64>> = vec![Vec::new(); sizes.len()];
        for _ in 0..3 {
            for (i, &size) in sizes.iter().enumerate() {
                let (s, n) = (size.to_string(), (TOTAL / size).to_string());
                let r = ferroce(verb, Kind::Bw, &["-s", &s, "-n", &n, "-m", "4096"]);
                runs[i].push(r["bw_avg_Gbps"].as_f64().unwrap());
            }
        }
        let med: Vec<f64> = runs.into_iter().map(median).collect();
        let name = if verb == Verb::Read { "READ" } else { "WRITE" };
        println!(
            "  {name}: 64 KiB {:7.2} Gb/s, 1 MiB {:7.2} Gb/s ({:.2}), 8 MiB {:7.2} Gb/s ({:.2}); of memcpy: {:.3}, {:.3}, {:.3}",
            med[0],
            med[1],
            med[1] / med[0],
            med[2],
            med[2] / med[0],
            med[0] / mc[0],
            med[1] / mc[1],
            med[2] / mc[2]
        );
    }
}

fn main() {
    if let Ok(role) = std::env::var(ROLE) {
        child(&role);
        return;
    }
    // E2E_ONLY=fastreg or qps: that section alone (for profiling it).
    let only = std::env::var("E2E_ONLY").ok();
    if matches!(
        only.as_deref(),
        Some("fastreg")
            | Some("qps")
            | Some("workers")
            | Some("shards")
            | Some("spread")
            | Some("large")
            | Some("drive")
    ) {
        let cfg = driver::loopback_config(1, 4096, &RnicOpts::default()).expect("config");
        dataplane::runtime::init_eal("e2e", &cfg).expect("EAL");
        match only.as_deref() {
            Some("qps") => qp_scale(),
            Some("workers") => workers(),
            Some("shards") => shards(),
            Some("spread") => spread(),
            Some("large") => large_messages(),
            Some("drive") => app_drive(),
            _ => fast_registration(),
        }
        return;
    }
    // `cargo bench` passes --bench; this harness takes no options.
    let cfg = driver::loopback_config(1, 4096, &RnicOpts::default()).expect("config");
    dataplane::runtime::init_eal("e2e", &cfg).expect("EAL");
    let pool = Mempool::new("e2e_raw", 8191, 256, ROCE_4K_DATA_ROOM).expect("mempool");

    println!("baselines (same run, same machine)");
    // The same measurement as rnic-perf --baseline: warm buffers, seven runs of at least
    // 20 ms, the best with the median and the slowest beside it.
    let b = ferroce_tools::perf::baseline::memcpy(65536, 7);
    let mc = b.best_bps / 8e9;
    println!(
        "  memcpy 64 KiB working set:           {mc:8.2} GB/s = {:8.2} Gb/s (best of {}; median {:.2}, slowest {:.2} GB/s)",
        mc * 8.0,
        b.runs,
        b.median_bps / 8e9,
        b.worst_bps / 8e9
    );
    let floor = icrc_floor();
    println!(
        "  ICRC + copies, both ends, 4 KiB packets: {:8.2} Gb/s (best of {}; median {:.2}; one core: one-pass copy + ICRC out, ICRC + copy in)",
        floor.best_bps / 1e9,
        floor.runs,
        floor.median_bps / 1e9
    );
    let (f_small, _) = raw_echo(&pool, "e2e_s", 122, 3.0);
    println!(
        "  DPDK ring echo, 122 B frames:         {:8.2} Mframes/s across the link",
        f_small / 1e6
    );
    let (f_big, g_big) = raw_echo(&pool, "e2e_b", 4154, 3.0);
    println!(
        "  DPDK ring echo, 4154 B frames:        {:8.2} Mframes/s = {g_big:8.2} Gb/s across the link",
        f_big / 1e6
    );
    let (c_small, _) = raw_stream_copy(&pool, "e2e_cs", 122, 3.0);
    println!(
        "  DPDK ring stream + copy in/out, 122 B: {:8.2} Mframes/s",
        c_small / 1e6
    );
    let (c_big, cg_big) = raw_stream_copy(&pool, "e2e_cb", 4154, 3.0);
    println!(
        "  DPDK ring stream + copy in/out, 4154 B:{:8.2} Mframes/s = {cg_big:8.2} Gb/s",
        c_big / 1e6
    );
    let rtt = raw_half_rtt(&pool, "e2e_l", 20_000);
    println!("  DPDK ring, one 64 B frame a->b->a:    {rtt:8.3} us half round trip (median)");
    let spsc = spsc_half_rtt(20_000);
    println!("  two threads, one shared word:         {spsc:8.3} us half round trip (median)");

    println!("ferroce loopback (two RNICs, one worker, rnic-perf loops)");
    let bw = ferroce(
        Verb::Write,
        Kind::Bw,
        &["-s", "65536", "-n", "30000", "-m", "4096"],
    );
    let gbps = bw["bw_avg_Gbps"].as_f64().unwrap();
    println!(
        "  RDMA WRITE 64 KiB, MTU 4096:          {gbps:8.2} Gb/s ({:.2} MB/s)",
        bw["bw_avg_MBps"].as_f64().unwrap()
    );
    let mr = ferroce(Verb::Write, Kind::Bw, &["-s", "64", "-n", "1000000"]);
    let mpps = mr["msg_rate_Mpps"].as_f64().unwrap();
    println!("  RDMA WRITE 64 B message rate:         {mpps:8.3} Mmsg/s");
    let lat = ferroce(Verb::Write, Kind::Lat, &["-s", "8", "-n", "20000"]);
    let t = lat["t_typical_us"].as_f64().unwrap();
    println!(
        "  RDMA WRITE 8 B half round trip:       {t:8.3} us typical ({:.3} us avg, {:.3} us p99)",
        lat["t_avg_us"].as_f64().unwrap(),
        lat["p99_us"].as_f64().unwrap()
    );

    large_messages();
    fast_registration();
    qp_scale();
    workers();
    app_drive();
    shards();
    spread();

    println!("ferroce through rnicd (two RNICs behind the daemon, server and client as processes)");
    let dir = std::env::temp_dir().join(format!("ferroce-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut host = cfg.host.clone();
    host.socket = dir.join("rnicd.sock");
    let rt = dataplane::runtime::Runtime::loopback(
        "e2e-rnicd",
        driver::loopback_config(1, 4096, &RnicOpts::default()).unwrap(),
        driver::loopback_config(2, 4096, &RnicOpts::default()).unwrap(),
    )
    .expect("runtime");
    let daemon = dataplane::daemon::Daemon::start(rt, &host).expect("daemon");
    let rbw = via_rnicd(&host.socket, "write_bw", "-s 65536 -n 30000 -m 4096", 18710);
    let rgbps = rbw["bw_avg_Gbps"].as_f64().unwrap();
    println!("  RDMA WRITE 64 KiB, MTU 4096:          {rgbps:8.2} Gb/s");
    let rmr = via_rnicd(&host.socket, "write_bw", "-s 64 -n 1000000", 18711);
    let rmpps = rmr["msg_rate_Mpps"].as_f64().unwrap();
    println!("  RDMA WRITE 64 B message rate:         {rmpps:8.3} Mmsg/s");
    let rlat = via_rnicd(&host.socket, "write_lat", "-s 8 -n 20000", 18712);
    let rt_us = rlat["t_typical_us"].as_f64().unwrap();
    println!(
        "  RDMA WRITE 8 B half round trip:       {rt_us:8.3} us typical ({:.3} us avg, {:.3} us p99)",
        rlat["t_avg_us"].as_f64().unwrap(),
        rlat["p99_us"].as_f64().unwrap()
    );

    // Debian's perftest on the same daemon, and rnic-perf's send_lat for its comparison.
    let debian = if !have("ib_write_bw") || !have("ib_send_lat") {
        println!("Debian perftest through ferroce-run: NOT RUN (perftest is not installed)");
        None
    } else if !build_libibverbs() {
        println!("Debian perftest through ferroce-run: NOT RUN (make ibverbs failed)");
        None
    } else {
        println!("Debian perftest (unmodified binaries) through ferroce-run on the same rnicd");
        // The machine is shared and noisy: the two tools alternate, three runs each, and
        // the medians are compared. Columns: #bytes #iterations BW peak, BW average
        // [MB/sec], MsgRate.
        let (mut dw, mut rw) = (Vec::new(), Vec::new());
        for i in 0..3u16 {
            let w = via_ferroce_run(
                &host.socket,
                "ib_write_bw",
                &["-s", "65536", "-n", "30000", "-m", "4096"],
                18720 + 2 * i,
            );
            let d = w[3] * 8.0 / 1000.0;
            let r = via_rnicd(
                &host.socket,
                "write_bw",
                "-s 65536 -n 30000 -m 4096",
                18721 + 2 * i,
            )["bw_avg_Gbps"]
                .as_f64()
                .unwrap();
            println!(
                "  ib_write_bw -s 65536 -m 4096: {d:7.2} Gb/s; rnic-perf write_bw via rnicd: {r:7.2} Gb/s"
            );
            dw.push(d);
            rw.push(r);
        }
        // Latency through rnicd is bimodal on a 2-core machine (three processes: whether
        // the two ends and the worker share a core), so the two tools alternate, three runs
        // each, and the medians are compared. Columns: #bytes #iterations t_min t_max
        // t_typical t_avg t_stdev p99 p99.9.
        let (mut dl, mut rl) = (Vec::new(), Vec::new());
        for i in 0..3u16 {
            let l = via_ferroce_run(
                &host.socket,
                "ib_send_lat",
                &["-s", "8", "-n", "20000"],
                18714 + 2 * i,
            );
            let sl = via_rnicd(&host.socket, "send_lat", "-s 8 -n 20000", 18715 + 2 * i);
            let st = sl["t_typical_us"].as_f64().unwrap();
            println!(
                "  ib_send_lat -s 8: {:7.3} us typical ({:.3} avg); rnic-perf send_lat -s 8 via rnicd: {st:7.3} us typical ({:.3} avg)",
                l[4],
                l[5],
                sl["t_avg_us"].as_f64().unwrap()
            );
            dl.push(l[4]);
            rl.push(st);
        }
        let (dlat, st) = (median(dl), median(rl));
        let (dgbps, rgbps) = (median(dw), median(rw));
        println!(
            "  medians: ib_write_bw {dgbps:.2} Gb/s, rnic-perf write_bw {rgbps:.2} Gb/s; \
             ib_send_lat {dlat:.3} us, rnic-perf send_lat {st:.3} us"
        );
        Some((dgbps, rgbps, dlat, st))
    };
    daemon.stop();
    let _ = std::fs::remove_dir_all(&dir);

    println!("ratios");
    println!(
        "  through rnicd / in process: WRITE 64 KiB goodput {:.3}, 64 B rate {:.3}, 8 B half RTT {:.2}x",
        rgbps / gbps,
        rmpps / mpps,
        rt_us / t
    );
    if let Some((dgbps, pgbps, dlat, slat)) = debian {
        println!(
            "  Debian perftest / rnic-perf, both through rnicd (medians): ib_write_bw 64 KiB {:.3}, ib_send_lat 8 B {:.3}",
            dgbps / pgbps,
            dlat / slat
        );
    }
    // A 64 KiB WRITE at MTU 4096 is 16 full frames one way plus an ACK back.
    println!(
        "  WRITE 64 KiB goodput / raw 4154 B link rate:  {:.3}",
        gbps / g_big
    );
    println!(
        "  WRITE 64 KiB goodput / raw stream with copies: {:.3}",
        gbps / cg_big
    );
    println!(
        "  WRITE 64 KiB goodput / memcpy bandwidth:      {:.3}",
        gbps / (mc * 8.0)
    );
    println!(
        "  WRITE 64 KiB goodput / ICRC + copies floor:   {:.3}",
        gbps * 1e9 / floor.best_bps
    );
    println!(
        "  64 B WRITE rate / raw 122 B frame rate:       {:.3}",
        mpps * 1e6 / f_small
    );
    println!(
        "  64 B WRITE rate / raw 122 B stream with copies: {:.3}",
        mpps * 1e6 / c_small
    );
    println!(
        "  8 B WRITE half RTT / raw frame half RTT:      {:.1}x",
        t / rtt
    );
    println!(
        "  8 B WRITE half RTT / cross-thread handoff:    {:.1}x",
        t / spsc
    );
}
