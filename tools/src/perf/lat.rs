//! The latency loops (`run_iter_lat_write`, `run_iter_lat`, `run_iter_lat_send`;
//! docs/perftest-protocol.md sections 5.5-5.7). Each returns the post time of every iteration.

use std::time::{Duration, Instant};

use dataplane::Verbs;
use roce::types::Rkey;
use roce::verbs::*;

use super::bw::{backoff, poll_backoff, region_pattern};
use super::oob::{Key, Role};
use super::res::{pattern, Res, GRH};
use super::{AtomicType, Conn, Params, Verb};

/// Runs the latency loop of `p.verb` for one message size against the peer's region `rem`.
pub fn run<V: Verbs>(res: &mut Res<V>, p: &Params, size: u64, rem: &Key) -> Result<LatOut, String> {
    let l = Lat {
        p,
        size,
        rem,
        t0: Instant::now(),
    };
    let mut out = LatOut {
        tposted: Vec::with_capacity(p.iters as usize),
        ..Default::default()
    };
    match p.verb {
        Verb::Write => write_lat(res, l, &mut out),
        Verb::Send => send_lat(res, l, &mut out),
        _ => rd_atomic_lat(res, l, &mut out),
    }?;
    out.total_ns = l.t0.elapsed().as_nanos() as u64;
    Ok(out)
}

/// What every latency loop works with besides the test's resources.
#[derive(Clone, Copy)]
struct Lat<'a> {
    p: &'a Params,
    size: u64,
    /// The peer's advertised region.
    rem: &'a Key,
    /// When the loop started: post times count from here.
    t0: Instant,
}

/// How long one side waits for the other's next message.
const WATCHDOG: Duration = Duration::from_secs(30);

/// What a latency loop measured.
#[derive(Debug, Default)]
pub struct LatOut {
    /// Post time of each iteration (ns since the loop started).
    pub tposted: Vec<u64>,
    /// Wall time of the whole loop (ns), for duration mode.
    pub total_ns: u64,
    /// Messages whose data `--verify` checked.
    pub verified: u64,
    /// SIGINT/SIGTERM ended the loop early (`tposted` holds what was measured).
    pub interrupted: bool,
}

/// Ends a latency loop early on SIGINT/SIGTERM, keeping what it measured; any other error
/// goes up.
macro_rules! or_stop {
    ($e:expr, $out:expr) => {
        match $e {
            Err(e) if e == super::INTERRUPTED => {
                $out.interrupted = true;
                break;
            }
            r => r?,
        }
    };
}

fn wait_one<V: Verbs>(
    res: &mut Res<V>,
    cq: roce::engine::CqId,
    what: &str,
) -> Result<Completion, String> {
    let mut wc = [Completion::default(); 1];
    let start = Instant::now();
    let mut idle = 0u32;
    let mut ev = super::EventWait::default();
    let events = res.events;
    loop {
        if let [c] = super::poll_checked(&mut res.ctx, cq, &mut wc, |_| format!("({what})"))? {
            return Ok(*c);
        }
        idle += 1;
        if events {
            ev.idle(&mut res.ctx, cq)?;
        } else {
            poll_backoff(idle.min(4000));
        }
        // The clock is read once per 1024 idle polls: reading it on every poll cost an
        // eighth of a latency test's time (clock_gettime in a profile of send_lat).
        if idle.is_multiple_of(1024) {
            if super::interrupted() {
                return Err(super::INTERRUPTED.into());
            }
            if start.elapsed() > WATCHDOG {
                return Err(format!("no {what} completion for {} s", WATCHDOG.as_secs()));
            }
        }
    }
}

/// Posts one send WR on the test's QP.
fn post<V: Verbs>(
    res: &mut Res<V>,
    wr_id: u64,
    op: WrOp,
    sge: Sge,
    flags: SendFlags,
    ud: Option<UdDest>,
) -> Result<(), String> {
    res.ctx
        .post_send(
            res.qps[0],
            &SendWr {
                wr_id,
                op,
                sg_list: &[sge],
                flags,
                ud,
            },
        )
        .map_err(|e| format!("Couldn't post send: wr {wr_id}: {e}"))
}

/// `ib_write_lat`: each side WRITEs `size` bytes whose last byte is its iteration count and
/// spins on the last byte of its own advertised region for the peer's. The server writes first.
fn write_lat<V: Verbs>(res: &mut Res<V>, l: Lat<'_>, out: &mut LatOut) -> Result<(), String> {
    let Lat { p, size, rem, t0 } = l;
    let iters = p.iters;
    let poll_off = (res.remote_off(0) + size - 1) as usize;
    let src = res.local_off(0);
    let post_off = (src + size - 1) as usize;
    let (mut scnt, mut rcnt, mut ccnt) = (0u64, 0u64, 0u64);
    let mut body = vec![0u8; size as usize];
    let mut got = vec![0u8; size as usize];
    while scnt < iters || ccnt < iters || rcnt < iters {
        if super::interrupted() {
            out.interrupted = true;
            break;
        }
        if rcnt < iters && !(scnt < 1 && p.role == Role::Server) {
            rcnt += 1;
            let want = rcnt as u8;
            let start = Instant::now();
            let mut idle = 0u32;
            while res.buf.load_u8(poll_off) != want {
                idle += 1;
                backoff(idle.min(4000));
                if !idle.is_multiple_of(1024) {
                    continue; // the clock and the stop flag, once per 1024 idle turns
                }
                if super::interrupted() {
                    break;
                }
                if start.elapsed() > WATCHDOG {
                    return Err(format!(
                        "no WRITE {rcnt} from the peer for {} s",
                        WATCHDOG.as_secs()
                    ));
                }
            }
            if p.verify && size > 1 {
                res.buf
                    .read(res.remote_off(0) as usize, &mut got[..size as usize - 1]);
                pattern(0, rcnt - 1, &mut body);
                if got[..size as usize - 1] != body[..size as usize - 1] {
                    return Err(format!(
                        "--verify: WRITE {rcnt} from the peer arrived corrupted"
                    ));
                }
                out.verified += 1;
            }
        }
        if scnt < iters {
            if p.verify && size > 1 {
                pattern(0, scnt, &mut body);
                res.buf.write(src as usize, &body[..size as usize - 1]);
            }
            out.tposted.push(t0.elapsed().as_nanos() as u64);
            scnt += 1;
            res.buf.write(post_off, &[scnt as u8]);
            let mut flags = SendFlags::SIGNALED;
            if size <= p.inline as u64 {
                flags = flags | SendFlags::INLINE;
            }
            let sge = res.mr.sge(src, size as u32);
            let op = WrOp::Write {
                remote_addr: rem.vaddr,
                rkey: Rkey(rem.rkey),
            };
            post(res, scnt, op, sge, flags, None)?;
        }
        if ccnt < iters {
            let scq = res.scq;
            or_stop!(wait_one(res, scq, "WRITE"), out);
            ccnt += 1;
        }
    }
    Ok(())
}

/// `ib_read_lat` / `ib_atomic_lat` client: one signaled READ or ATOMIC at a time.
fn rd_atomic_lat<V: Verbs>(res: &mut Res<V>, l: Lat<'_>, out: &mut LatOut) -> Result<(), String> {
    let Lat { p, size, rem, t0 } = l;
    let iters = p.iters;
    let src = res.local_off(0);
    let mut got = vec![0u8; size as usize];
    let mut want = vec![0u8; size as usize];
    let mut i = 0u64;
    while i < iters {
        let rkey = Rkey(rem.rkey);
        let remote_addr = rem.vaddr;
        let op = match (p.verb, p.atomic, p.verify) {
            (Verb::Read, _, _) => WrOp::Read { remote_addr, rkey },
            (_, AtomicType::FETCH_AND_ADD, _) => WrOp::FetchAdd {
                remote_addr,
                rkey,
                add: 1,
            },
            (_, AtomicType::CMP_AND_SWAP, true) => WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare: i,
                swap: i + 1,
            },
            (_, AtomicType::CMP_AND_SWAP, false) => WrOp::CompareSwap {
                remote_addr,
                rkey,
                compare: 0,
                swap: 0,
            },
        };
        let sge = res.mr.sge(src, size as u32);
        out.tposted.push(t0.elapsed().as_nanos() as u64);
        post(res, i, op, sge, SendFlags::SIGNALED, None)?;
        let scq = res.scq;
        let what = if p.verb == Verb::Read {
            "READ"
        } else {
            "ATOMIC"
        };
        or_stop!(wait_one(res, scq, what), out);
        if p.verify {
            res.buf.read(src as usize, &mut got);
            if p.verb == Verb::Read {
                region_pattern(0, 0, &mut want);
                if got != want {
                    return Err(format!("--verify: READ {i} returned the wrong data"));
                }
            } else {
                let v = u64::from_ne_bytes(got[..8].try_into().unwrap_or([0; 8]));
                if v != i {
                    return Err(format!("--verify: ATOMIC {i} returned {v}, expected {i}"));
                }
            }
            out.verified += 1;
        }
        i += 1;
    }
    Ok(())
}

/// `ib_send_lat`: receives were posted before the sync round; the client sends first; each
/// side sends after receiving, every SEND signaled and waited for.
fn send_lat<V: Verbs>(res: &mut Res<V>, l: Lat<'_>, out: &mut LatOut) -> Result<(), String> {
    let Lat { p, size, rem, t0 } = l;
    let iters = p.iters;
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut rposted = super::bw::preposted(p);
    let src = res.local_off(0);
    let mut body = vec![0u8; size as usize];
    let mut got = vec![0u8; size as usize];
    let ud = (p.conn == Conn::UD).then(|| res.ud_dest(rem));
    while scnt < iters || rcnt < iters {
        if rcnt < iters && !(scnt < 1 && p.role == Role::Client) {
            let rcq = res.rcq;
            let c = or_stop!(wait_one(res, rcq, "receive"), out);
            let want_len = if p.conn == Conn::UD { size + GRH } else { size };
            if c.byte_len as u64 != want_len {
                return Err(format!(
                    "received {} bytes, expected {want_len}",
                    c.byte_len
                ));
            }
            if let Some((vb, _)) = &res.vbuf {
                let off = res.vrecv_off(p, 0, c.wr_id % p.rx_depth as u64)
                    + if p.conn == Conn::UD { GRH } else { 0 };
                vb.read(off as usize, &mut got);
                pattern(0, rcnt, &mut body);
                if got != body {
                    return Err(format!("--verify: message {rcnt} arrived corrupted"));
                }
                out.verified += 1;
            }
            rcnt += 1;
            if rposted < iters {
                let sge = super::bw::recv_sge(res, p, 0, rposted, size);
                res.post_recv(0, rposted, sge)?;
                rposted += 1;
            }
        }
        if scnt < iters {
            if p.verify {
                pattern(0, scnt, &mut body);
                res.buf.write(src as usize, &body);
            }
            out.tposted.push(t0.elapsed().as_nanos() as u64);
            let mut flags = SendFlags::SIGNALED;
            if size <= p.inline as u64 {
                flags = flags | SendFlags::INLINE;
            }
            let sge = res.mr.sge(src, size as u32);
            post(res, scnt, WrOp::Send, sge, flags, ud)?;
            scnt += 1;
            let scq = res.scq;
            or_stop!(wait_one(res, scq, "SEND"), out);
        }
    }
    Ok(())
}
