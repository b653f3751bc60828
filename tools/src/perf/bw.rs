//! The bandwidth loop (`run_iter_bw`, `run_iter_bw_server`, `run_iter_bi`): WRs posted per QP
//! up to the TX depth, completions moderated every `cq_mod` WRs, addresses cycled through the
//! cycle buffer, and perftest's bandwidth formulas (docs/perftest-protocol.md sections 5, 6.2).

use std::time::{Duration, Instant};

use dataplane::{Buffer, Verbs};
use roce::engine::VerbsError;
use roce::types::Rkey;
use roce::verbs::*;

use super::oob::Key;
use super::report::BwResult;
use super::res::{inc, pattern, splitmix, Res, GRH};
use super::{AtomicType, Conn, Params, Verb};

const SEQ_BITS: u32 = 40;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;
/// perftest's `CTX_POLL_BATCH`.
const POLL_BATCH: usize = 16;
/// How long the receiving side waits for the next message before giving up (perftest's
/// send server has a 60 s watchdog).
const RECV_WATCHDOG: Duration = Duration::from_secs(60);
/// How long a sender waits for outstanding completions.
const SEND_WATCHDOG: Duration = Duration::from_secs(60);

fn wr_id(qp: usize, seq: u64) -> u64 {
    ((qp as u64) << SEQ_BITS) | (seq & SEQ_MASK)
}

/// What one bandwidth run measured.
#[derive(Debug, Default)]
pub struct BwOut {
    /// Send WRs completed (all QPs).
    pub sent: u64,
    /// Receives completed (all QPs).
    pub received: u64,
    /// Post times (ns since the loop started), by global post index.
    pub tposted: Vec<u64>,
    /// Completion times, by global completion index.
    pub tcompleted: Vec<u64>,
    /// First/last receive completion (ns).
    pub recv_span: Option<(u64, u64)>,
    /// Duration mode: messages counted and the sampling window (ns).
    pub sampled: Option<(u64, u64)>,
    /// Messages whose data `--verify` checked.
    pub verified: u64,
    /// UC/UD receiver: messages that never arrived (the sender had finished).
    pub lost: u64,
    /// SIGINT/SIGTERM ended the loop early.
    pub interrupted: bool,
    /// How long the loop ran (ns).
    pub elapsed_ns: u64,
}

/// Per-QP progress.
#[derive(Clone, Default)]
struct QpRun {
    scnt: u64,
    ccnt: u64,
    rposted: u64,
    rcnt: u64,
    loc_off: u64,
    rem_off: u64,
    /// --verify: CMP_AND_SWAP/FETCH_AND_ADD results expected per remote slot.
    expect_seq: u64,
    /// One past the last signaled WR posted (duration mode stops after it completes: the
    /// unsignaled ones behind it never report).
    signaled_upto: u64,
}

/// Duration mode phases (perftest's SIGALRM state machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Sample,
    Stop,
    End,
}

/// After the sender is known to have finished, how long an unreliable (UC/UD) receiver
/// waits without a new message before it takes what did not arrive as lost.
const LOSS_GRACE: Duration = Duration::from_millis(500);

/// Runs one bandwidth test of `size` bytes. `send`: this side posts requests to `rem`;
/// `recv`: this side consumes SENDs (or WRITE-with-immediate) whose receives were posted by
/// [`prepost_recvs`]. `peer_done` tells a receive-only side that the sender has finished
/// (its next message on the TCP connection is waiting): UC and UD drop what finds no receive
/// WQE, so such a receiver then stops waiting for messages that will never come and reports
/// what arrived (perftest's server waits for its watchdog instead, 120 s, then reports too).
pub fn run<V: Verbs>(
    res: &mut Res<V>,
    p: &Params,
    size: u64,
    rem: &[Key],
    send: bool,
    recv: bool,
    peer_done: &mut dyn FnMut() -> bool,
) -> Result<BwOut, String> {
    let nq = res.qps.len();
    let iters = p.iters;
    let total = iters * nq as u64;
    let mut runs = vec![
        QpRun {
            rposted: if recv { preposted(p) } else { 0 },
            ..Default::default()
        };
        nq
    ];
    let mut out = BwOut::default();
    let record = p.peak || p.duration.is_none();
    if record && send {
        out.tposted = vec![0; total as usize];
        out.tcompleted = vec![0; total as usize];
    }
    // Timestamps from the TSC, as perftest's get_cycles (a clock_gettime per post and per
    // completion cost the 64 B test 3 % of its cycles).
    let t0 = dataplane::worker::Clock::calibrated();
    let ns = |t0: dataplane::worker::Clock| t0.now();
    let cycle = res.cycle_buffer;
    let step = inc(size, res.cache_line);
    let cycling = size <= cycle / 2;
    let nslots = (cycle / step).max(1);
    // Duration mode.
    let (margin, dur) = match p.duration {
        Some(d) => (d as f64 / 4.0, d as f64),
        None => (0.0, 0.0),
    };
    let mut phase = if p.duration.is_some() {
        Phase::Start
    } else {
        Phase::Sample
    };
    let mut sample_start = 0u64;
    let mut sample_count_at_start = 0u64;
    let mut totscnt = 0u64;
    let mut totccnt = 0u64;
    let mut totrcnt = 0u64;
    let mut wc = [Completion::default(); POLL_BATCH];
    let mut idle = 0u32;
    let mut ev = super::EventWait::default();
    let mut last_progress = Instant::now();
    let mut progress_unclocked = false;
    let mut check = res.vbuf.as_ref().map(|(vb, _)| Check::new(vb, size));
    let atomic_cmp = matches!(p.atomic, AtomicType::CMP_AND_SWAP);
    loop {
        if super::interrupted() {
            // SIGINT/SIGTERM: stop here and report what completed.
            out.interrupted = true;
            break;
        }
        // Phase changes (duration mode).
        if p.duration.is_some() {
            let el = t0.now() as f64 / 1e9;
            match phase {
                Phase::Start if el >= margin => {
                    phase = Phase::Sample;
                    sample_start = ns(t0);
                    sample_count_at_start = if send { totccnt } else { totrcnt };
                }
                Phase::Sample if el >= dur - margin => {
                    phase = Phase::Stop;
                    let c = if send { totccnt } else { totrcnt };
                    out.sampled = Some((c - sample_count_at_start, ns(t0) - sample_start));
                }
                Phase::Stop if el >= dur => phase = Phase::End,
                _ => {}
            }
        }
        let posting = phase != Phase::End;
        let mut progress = false;
        // Post.
        if send && posting {
            for (q, r) in runs.iter_mut().enumerate() {
                loop {
                    let room = p.tx_depth as u64 - (r.scnt - r.ccnt);
                    let left = if iters > 0 { iters - r.scnt } else { u64::MAX };
                    if room < p.post_list as u64 || left == 0 {
                        break;
                    }
                    let batch = (p.post_list as u64).min(left);
                    for _ in 0..batch {
                        let seq = r.scnt;
                        let signaled = seq % p.cq_mod as u64 == p.cq_mod as u64 - 1
                            || (iters > 0 && seq == iters - 1);
                        let (sge, op) = make_wr(res, p, q, r, seq, size, &rem[q], atomic_cmp);
                        let mut flags = SendFlags::default();
                        if signaled {
                            flags = flags | SendFlags::SIGNALED;
                        }
                        if size <= p.inline as u64 && matches!(p.verb, Verb::Send | Verb::Write) {
                            flags = flags | SendFlags::INLINE;
                        }
                        let ud = (p.conn == Conn::UD).then(|| res.ud_dest(&rem[q]));
                        let wr = SendWr {
                            wr_id: wr_id(q, seq),
                            op,
                            sg_list: &[sge],
                            flags,
                            ud,
                        };
                        match res.ctx.post_send(res.qps[q], &wr) {
                            Ok(()) => {}
                            Err(VerbsError::QueueFull) => break,
                            Err(e) => {
                                return Err(format!("Couldn't post send: qp {q} scnt={seq}: {e}"))
                            }
                        }
                        if record && (totscnt as usize) < out.tposted.len() {
                            out.tposted[totscnt as usize] = ns(t0);
                        }
                        r.scnt += 1;
                        if signaled {
                            r.signaled_upto = r.scnt;
                        }
                        totscnt += 1;
                        progress = true;
                        if cycling && !(p.verify && p.verb == Verb::Write) {
                            r.loc_off = (r.loc_off + step) % (nslots * step);
                            r.rem_off = (r.rem_off + step) % (nslots * step);
                        }
                    }
                    if r.scnt - r.ccnt >= p.tx_depth as u64 {
                        break;
                    }
                }
            }
        }
        // Send completions.
        if send {
            let done = super::poll_checked(&mut res.ctx, res.scq, &mut wc, |c| {
                format!(
                    "at client (qp {} wr {})",
                    c.wr_id >> SEQ_BITS,
                    c.wr_id & SEQ_MASK
                )
            })?;
            for c in done {
                if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    // Shared CQ (not used by perftest's layout, tolerated).
                    continue;
                }
                let q = (c.wr_id >> SEQ_BITS) as usize;
                let seq = c.wr_id & SEQ_MASK;
                let Some(r) = runs.get_mut(q) else {
                    return Err(format!("completion for unknown wr_id {:#x}", c.wr_id));
                };
                let upto = seq + 1;
                if upto <= r.ccnt {
                    continue;
                }
                if let Some(c) = check.as_mut() {
                    if matches!(p.verb, Verb::Read | Verb::Atomic) {
                        for s in r.ccnt..upto {
                            c.send_completion(res, p, q, s)?;
                            out.verified += 1;
                        }
                    }
                }
                let n = upto - r.ccnt;
                r.ccnt = upto;
                let now = ns(t0);
                if record {
                    let end = ((totccnt + n) as usize).min(out.tcompleted.len());
                    for t in &mut out.tcompleted[(totccnt as usize).min(end)..end] {
                        *t = now;
                    }
                }
                totccnt += n;
                progress = true;
            }
        }
        // Receives.
        if recv {
            let done = super::poll_checked(&mut res.ctx, res.rcq, &mut wc, |c| {
                format!("at server (receive {})", c.wr_id & SEQ_MASK)
            })?;
            for c in done {
                let q = (c.wr_id >> SEQ_BITS) as usize;
                if q >= nq {
                    return Err(format!(
                        "receive completion for unknown wr_id {:#x}",
                        c.wr_id
                    ));
                }
                let expect_len = if p.conn == Conn::UD { size + GRH } else { size };
                let got_len = if p.write_imm { size } else { c.byte_len as u64 };
                if got_len != expect_len && !p.write_imm {
                    return Err(format!(
                        "received {} bytes, expected {expect_len} (qp {q})",
                        c.byte_len
                    ));
                }
                if let Some(v) = check.as_mut().filter(|_| !p.write_imm) {
                    v.recv(res, p, &runs[q], q, c.wr_id & SEQ_MASK)?;
                    out.verified += 1;
                }
                let now = ns(t0);
                out.recv_span = Some(match out.recv_span {
                    None => (now, now),
                    Some((a, _)) => (a, now),
                });
                runs[q].rcnt += 1;
                totrcnt += 1;
                progress = true;
                if iters == 0 || runs[q].rposted < iters {
                    let idx = runs[q].rposted;
                    let sge = recv_sge(res, p, q, idx, size);
                    res.post_recv(q, wr_id(q, idx), sge)?;
                    runs[q].rposted += 1;
                }
            }
        }
        // Done?
        let sends_done = !send
            || if iters > 0 {
                totccnt >= total
            } else {
                phase == Phase::End && runs.iter().all(|r| r.ccnt >= r.signaled_upto)
            };
        let recvs_done = !recv
            || if iters > 0 {
                totrcnt >= total
            } else {
                phase == Phase::End
            };
        if sends_done && recvs_done {
            break;
        }
        if progress {
            idle = 0;
            ev.reset();
            // Read the clock lazily (at the next quiet check), not once per completion.
            progress_unclocked = true;
        } else {
            idle += 1;
            if p.events && (send || recv) {
                // -e: sleep on the send CQ (or the receive CQ of a receiver); both ends of
                // a bidirectional run arm both and wake at least every 100 ms.
                let cq = if send { res.scq } else { res.rcq };
                if send && recv && !ev.is_armed() {
                    res.ctx
                        .req_notify_cq(res.rcq)
                        .map_err(|e| format!("req_notify_cq: {e}"))?;
                }
                ev.idle(&mut res.ctx, cq)?;
            } else {
                poll_backoff(idle);
            }
            // The clock and the watchdogs, once per 256 idle turns.
            if !idle.is_multiple_of(256) {
                continue;
            }
            if std::mem::take(&mut progress_unclocked) {
                last_progress = Instant::now();
            }
            let quiet = last_progress.elapsed();
            if recv && !send && p.conn != Conn::RC && iters > 0 && quiet > LOSS_GRACE {
                // Checked only once the link has been quiet a while (a peek on the socket).
                if peer_done() {
                    out.lost = total.saturating_sub(totrcnt);
                    break;
                }
            }
            let limit = if send { SEND_WATCHDOG } else { RECV_WATCHDOG };
            if quiet > limit {
                return Err(format!(
                    "no progress for {} s: sent {totccnt}/{} completed, received {totrcnt}",
                    limit.as_secs(),
                    totscnt
                ));
            }
        }
    }
    out.sent = totccnt;
    out.received = totrcnt;
    out.elapsed_ns = ns(t0);
    Ok(out)
}

/// Posts the receives a receiving side needs before the sync round (`ctx_set_recv_wqes`):
/// `rx_depth` per QP, at most `iters`.
pub fn prepost_recvs<V: Verbs>(res: &mut Res<V>, p: &Params, size: u64) -> Result<(), String> {
    for q in 0..res.qps.len() {
        let n = if p.iters > 0 {
            (p.rx_depth as u64).min(p.iters)
        } else {
            p.rx_depth as u64
        };
        for idx in 0..n {
            let sge = recv_sge(res, p, q, idx, size);
            res.post_recv(q, wr_id(q, idx), sge)?;
        }
    }
    Ok(())
}

/// How many receives [`prepost_recvs`] posts per QP.
pub fn preposted(p: &Params) -> u64 {
    if p.iters > 0 {
        (p.rx_depth as u64).min(p.iters)
    } else {
        p.rx_depth as u64
    }
}

/// The SGE of receive number `idx` on QP `q` (with `--verify` each receive of the window has
/// its own slot, else perftest's fixed place in the advertised region).
pub fn recv_sge<V: Verbs>(res: &Res<V>, p: &Params, q: usize, idx: u64, size: u64) -> Sge {
    match &res.vbuf {
        Some((_, vm)) => {
            let off = res.vrecv_off(p, q, idx % p.rx_depth as u64);
            let len = if p.conn == Conn::UD { size + GRH } else { size };
            vm.sge(off, len as u32)
        }
        None => res.recv_sge(p, q, size),
    }
}

#[allow(clippy::too_many_arguments)]
fn make_wr<V: Verbs>(
    res: &Res<V>,
    p: &Params,
    q: usize,
    r: &mut QpRun,
    seq: u64,
    size: u64,
    rem: &Key,
    atomic_cmp: bool,
) -> (Sge, WrOp) {
    let rkey = Rkey(rem.rkey);
    let step = inc(size, res.cache_line);
    let remote_addr = if p.verify && p.verb == Verb::Write {
        rem.vaddr + seq * step
    } else {
        rem.vaddr + r.rem_off
    };
    let sge = match &res.vbuf {
        Some((vb, vm)) => {
            let off = res.vsend_off(p, q, seq % p.tx_depth as u64);
            if matches!(p.verb, Verb::Send | Verb::Write) {
                let mut data = vec![0u8; size as usize];
                pattern(q as u32, seq, &mut data);
                vb.write(off as usize, &data);
            }
            vm.sge(off, size as u32)
        }
        None => res.mr.sge(res.local_off(q) + r.loc_off, size as u32),
    };
    let op = match p.verb {
        Verb::Write if p.write_imm => WrOp::WriteWithImm {
            remote_addr,
            rkey,
            imm: seq as u32,
        },
        Verb::Write => WrOp::Write { remote_addr, rkey },
        Verb::Read => WrOp::Read { remote_addr, rkey },
        Verb::Send => WrOp::Send,
        Verb::Atomic => {
            // --verify: every op on a slot is the next in that slot's count, so CMP_AND_SWAP
            // compares with the count and swaps in count+1; without it, perftest's operands.
            let nslots = (res.cycle_buffer / step).max(1);
            let expected = seq / nslots;
            r.expect_seq = expected;
            match (atomic_cmp, p.verify) {
                (true, true) => WrOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare: expected,
                    swap: expected + 1,
                },
                (true, false) => WrOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare: 0,
                    swap: 0,
                },
                (false, _) => WrOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add: 1,
                },
            }
        }
    };
    (sge, op)
}

/// The content a `--verify` server gives its advertised region for READ: byte `k` of QP `qp`'s
/// region.
pub fn region_pattern(qp: u32, off: u64, out: &mut [u8]) {
    for (i, b) in out.iter_mut().enumerate() {
        let k = off + i as u64;
        *b = (splitmix(((qp as u64) << 48) ^ (k / 8)) >> ((k % 8) * 8)) as u8;
    }
}

/// `--verify`'s check of what a message brought: the verify buffer, and room for one message
/// as it is and as it should be.
struct Check {
    vb: Buffer,
    size: u64,
    got: Vec<u8>,
    want: Vec<u8>,
}

impl Check {
    fn new(vb: &Buffer, size: u64) -> Check {
        let room = size as usize + GRH as usize;
        Check {
            vb: vb.clone(),
            size,
            got: vec![0; room],
            want: vec![0; room],
        }
    }

    /// The READ or ATOMIC `seq` of QP `q` completed: its response is what the server's
    /// region holds there.
    fn send_completion<V: Verbs>(
        &mut self,
        res: &Res<V>,
        p: &Params,
        q: usize,
        seq: u64,
    ) -> Result<(), String> {
        let size = self.size;
        let off = res.vsend_off(p, q, seq % p.tx_depth as u64) as usize;
        let n = size as usize;
        match p.verb {
            Verb::Read => {
                let step = inc(size, res.cache_line);
                let cycling = size <= res.cycle_buffer / 2;
                let nslots = (res.cycle_buffer / step).max(1);
                let rem_off = if cycling { (seq % nslots) * step } else { 0 };
                self.vb.read(off, &mut self.got[..n]);
                region_pattern(q as u32, rem_off, &mut self.want[..n]);
                if self.got[..n] != self.want[..n] {
                    return Err(format!(
                        "--verify: READ {seq} on QP {q} returned data that differs from the server's region at +{rem_off}"
                    ));
                }
            }
            Verb::Atomic => {
                let step = inc(size, res.cache_line);
                let nslots = (res.cycle_buffer / step).max(1);
                let expected = seq / nslots;
                let mut b = [0u8; 8];
                self.vb.read(off, &mut b);
                let v = u64::from_ne_bytes(b);
                if v != expected {
                    return Err(format!(
                        "--verify: ATOMIC {seq} on QP {q} returned {v}, expected {expected}"
                    ));
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Receive `idx` of QP `q` (whose counts are `r`) completed: it holds the next message.
    fn recv<V: Verbs>(
        &mut self,
        res: &Res<V>,
        p: &Params,
        r: &QpRun,
        q: usize,
        idx: u64,
    ) -> Result<(), String> {
        let size = self.size;
        let mut off = res.vrecv_off(p, q, idx % p.rx_depth as u64) as usize;
        if p.conn == Conn::UD {
            off += GRH as usize;
        }
        let n = size as usize;
        self.vb.read(off, &mut self.got[..n]);
        // The sender put the message's sequence number first; RC delivers in order and exactly
        // once, so it must be the count received so far.
        let mut s = [0u8; 8];
        let k = n.min(8);
        s[..k].copy_from_slice(&self.got[..k]);
        let seq = if n >= 8 {
            u64::from_le_bytes(s)
        } else if p.conn == Conn::RC {
            r.rcnt
        } else {
            // A message under 8 bytes holds only the low bytes of its sequence number, and UC and
            // UD lose messages: it is the first number from the count received so far whose low
            // bytes match (losing 256^n messages in a row would be needed to mistake one).
            let m = 1u64 << (8 * n);
            r.rcnt + u64::from_le_bytes(s).wrapping_sub(r.rcnt) % m
        };
        if p.conn == Conn::RC && seq != r.rcnt {
            return Err(format!(
                "--verify: QP {q} received message {seq} where {} was due",
                r.rcnt
            ));
        }
        pattern(q as u32, seq, &mut self.want[..n]);
        if self.got[..n] != self.want[..n] {
            return Err(format!(
                "--verify: message {seq} on QP {q} ({n} bytes) arrived corrupted"
            ));
        }
        Ok(())
    }
}

/// `--verify` on a WRITE server after the test: every message's place in the region holds
/// that message. Returns (messages verified, messages lost).
///
/// RC delivers every WRITE, so a place that does not hold its message is an error. UC may
/// lose one (IBA 9.7.7.1: a UC message missing a packet is dropped, and the packets before
/// the loss are already in memory): a place where every 256-byte block holds either its
/// message's bytes or the zeros `prepare_region` left is a lost message; any other content is
/// corruption and an error. 256 bytes is the smallest path MTU, so no block straddles two
/// packets of a message.
pub fn verify_write_region<V: Verbs>(
    res: &Res<V>,
    conn: Conn,
    size: u64,
    messages: u64,
) -> Result<(u64, u64), String> {
    const BLOCK: usize = 256;
    let step = inc(size, res.cache_line);
    let n = size as usize;
    let mut got = vec![0u8; n];
    let mut want = vec![0u8; n];
    let (mut verified, mut lost) = (0, 0);
    for q in 0..res.qps.len() {
        for seq in 0..messages {
            let off = res.remote_off(q) + seq * step;
            res.buf.read(off as usize, &mut got);
            pattern(q as u32, seq, &mut want);
            if got == want {
                verified += 1;
                continue;
            }
            let partial = conn == Conn::UC
                && got
                    .chunks(BLOCK)
                    .zip(want.chunks(BLOCK))
                    .all(|(g, w)| g == w || g.iter().all(|&b| b == 0));
            if !partial {
                return Err(format!(
                    "--verify: WRITE {seq} of QP {q} is not in the server's memory at +{}",
                    seq * step
                ));
            }
            lost += 1;
        }
    }
    Ok((verified, lost))
}

/// Prepares a `--verify` server's region: READ reads a known pattern, ATOMIC starts from 0.
pub fn prepare_region<V: Verbs>(res: &Res<V>, p: &Params) {
    for q in 0..res.qps.len() {
        let off = res.remote_off(q);
        let mut data = vec![0u8; res.region as usize];
        match p.verb {
            Verb::Read => region_pattern(q as u32, 0, &mut data),
            // ATOMIC starts from 0; a UC WRITE's lost blocks must read as zeros.
            Verb::Atomic => {}
            Verb::Write if p.conn == Conn::UC => {}
            _ => continue,
        }
        res.buf.write(off as usize, &data);
    }
}

/// perftest's bandwidth figures from a sender's timestamps (section 6.2): average over the
/// first post to the last completion, peak over the best run of consecutive messages.
pub fn sender_result(p: &Params, size: u64, out: &BwOut) -> BwResult {
    if let Some((count, window)) = out.sampled {
        return BwResult::new(size, count, window as f64 / 1e9, 0.0);
    }
    let n = out.tcompleted.len();
    if n == 0 || out.sent == 0 {
        return BwResult::new(size, 0, 1.0, 0.0);
    }
    let sum = out.tcompleted[n - 1].saturating_sub(out.tposted[0]).max(1);
    let mut peak = 0.0;
    if p.peak {
        let cq = p.cq_mod.max(1) as usize;
        let mut opt = f64::MAX;
        for i in 0..n {
            let mut j = (i + 1).div_ceil(cq) * cq - 1;
            let mut consider = |j: usize| {
                let d =
                    out.tcompleted[j].saturating_sub(out.tposted[i]) as f64 / (j - i + 1) as f64;
                if d > 0.0 && d < opt {
                    opt = d;
                }
            };
            while j < n {
                consider(j);
                j += cq;
            }
            if !n.is_multiple_of(cq) {
                consider(n - 1);
            }
        }
        if opt < f64::MAX {
            peak = size as f64 / (opt / 1e9);
        }
    }
    let mut r = BwResult::new(size, n as u64, sum as f64 / 1e9, peak);
    if p.no_peak {
        r.peak_bps = 0.0; // perftest -N prints 0.00
    }
    r
}

/// A receiver's figures: first to last receive completion, no peak (perftest prints 0.00).
pub fn receiver_result(size: u64, out: &BwOut) -> BwResult {
    if let Some((count, window)) = out.sampled {
        return BwResult::new(size, count, window as f64 / 1e9, 0.0);
    }
    match out.recv_span {
        Some((a, b)) if b > a => {
            let mut r = BwResult::new(size, out.received, (b - a) as f64 / 1e9, 0.0);
            r.peak_bps = 0.0;
            r
        }
        _ => BwResult {
            bytes: size,
            iterations: out.received,
            peak_bps: 0.0,
            avg_bps: 0.0,
            msg_rate: 0.0,
        },
    }
}

/// Busy-polls like perftest, but yields the CPU after a while so the dataplane worker, which
/// shares these cores, keeps running (for loops that watch memory, which runs nothing).
pub fn backoff(idle: u32) {
    if idle < 64 {
        std::hint::spin_loop();
    } else if idle < 4096 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(20));
    }
}

/// The back-off between CQ polls: none for a while, as perftest polls back to back. The
/// client's own poll already gives up the CPU when it keeps finding nothing (or, in process,
/// runs the RNIC itself, and pauses when another thread is running it), so yielding here too
/// only doubled the context switches per wait; a pause instruction here too made a half round
/// trip through rnicd 1.7x as long (write_lat -s 8: 3.9-4.9 us typical against 2.4-2.5 us
/// without, 4 alternating runs each).
pub fn poll_backoff(idle: u32) {
    if idle >= 4096 {
        std::thread::sleep(Duration::from_micros(20));
    }
}
