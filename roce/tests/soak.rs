//! A seeded fault soak on simulated time (issue 26): one RC connection over a link that loses
//! 5% of frames, duplicates 1%, reorders 1% and corrupts 0.1%, both ways, carries batch after
//! batch of work requests of every opcode (WRITE, WRITE with immediate, READ, SEND, SEND
//! with immediate, compare-and-swap, fetch-and-add) in both directions, of every size from
//! 0 B to 8 MiB. Every WR must complete in order with SUCCESS, every byte of both memories
//! must be what the workload wrote and every atomic's result what it should be
//! (`roce::sim::traffic`), and after each batch both QPs are idle again: nothing
//! outstanding, nothing retained.
//!
//! The unreliable transports get the same link: UC (WRITE, WRITE with immediate, SEND, SEND
//! with immediate, 0 B to 8 MiB) and UD (SEND, SEND with immediate, up to the MTU). There a
//! lost packet loses its message, so what is checked is that nothing wrong is ever
//! delivered: every send WR completes with SUCCESS in order, every receive that completes
//! holds exactly one message that was sent, whole (UC: a duplicated message may arrive
//! twice, as on rxe), every byte a WRITE placed is that WRITE's byte at that place, and
//! after each batch every WQE was retired (receives left waiting by lost messages are
//! consumed by filler messages before the next batch).
//!
//! CI runs a short soak (`FERROCE_SOAK_WRS`, default 4000 WRs per transport); the figures in
//! docs/reliability.md come from `FERROCE_SOAK_WRS=1000000 cargo test --release -p roce
//! --test soak -- --nocapture`. A seed that ever failed joins `REGRESSION_SEEDS`.

use roce::engine::DeviceConfig;
use roce::memory::Memory;
use roce::sim::traffic::{OpKind, Traffic, TrafficSpec};
use roce::sim::{connect, node_gid, ConnectOpts, Endpoint, LinkConfig, Pair, Rng};
use roce::types::Qkey;
use roce::verbs::{
    AddressVector, Completion, Mtu, QpType, RecvWr, SendFlags, SendWr, UdDest, WcFlags, WcOpcode,
    WcStatus, WrOp,
};

/// Seeds that once failed, run again every time (none so far).
const REGRESSION_SEEDS: &[u64] = &[];

/// Bytes one batch moves per side at most (its regions are carved from each side's memory).
const BATCH_BYTES: u64 = 16 << 20;
/// Simulated time one batch may take.
const BATCH_DEADLINE_NS: u64 = 600_000_000_000;

/// What a soak did.
#[derive(Debug, Default)]
struct Soaked {
    wrs: u64,
    bytes: u64,
    batches: u64,
    frames: u64,
    lost: u64,
    duplicated: u64,
    reordered: u64,
    corrupted: u64,
    sim_ns: u64,
    /// UC and UD: messages whose receive completed (or WRITEs that arrived whole).
    delivered: u64,
}

/// The size cap of the next batch: most batches carry small and medium messages, one in
/// 25 up to 1 MiB and one in 100 up to 8 MiB (each batch's own sizes spread below its cap).
fn batch_cap(rng: &mut Rng) -> u32 {
    match rng.below(100) {
        0 => 8 << 20,
        1..=4 => 1 << 20,
        5..=49 => 64 << 10,
        _ => 4096,
    }
}

/// Two nodes over the soak's link: 5% lost, 1% duplicated, 1% reordered, 0.1% corrupted.
fn faulty_pair(seed: u64) -> Pair {
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut link = LinkConfig::lossless(25, 2_000);
    link.loss = 0.05;
    link.duplicate = 0.01;
    link.reorder = 0.01;
    link.corrupt = 0.001;
    Pair::new(cfg.clone(), cfg, link, seed)
}

/// The link's fault figures and the simulated time, into `s`.
fn link_figures(p: &Pair, s: &mut Soaked) {
    for side in 0..2 {
        let l = p.link_stats(side);
        s.frames += l.sent;
        s.lost += l.lost;
        s.duplicated += l.duplicated;
        s.reordered += l.reordered;
        s.corrupted += l.corrupted;
    }
    s.sim_ns = p.now;
}

fn soak(seed: u64, total_wrs: u64) -> Soaked {
    let mut rng = Rng::new(seed);
    let mut p = faulty_pair(seed);
    let mem_len = (2 * BATCH_BYTES + (1 << 20)) as usize;
    let o = ConnectOpts {
        mtu: [Mtu::M1024, Mtu::M4096][(seed % 2) as usize],
        mem_len,
        psns: (rng.below(1 << 24) as u32, 0x00ff_fff0),
        // 67 ms, perftest's default: an 8 MiB READ's reply can wait behind 8 MiB requests
        // (and their go-back-N retransmissions) in the same direction for longer than the
        // 1 ms of timeout 8 several times over, which exhausts its retries legitimately.
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        depth: 64,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    let mut s = Soaked::default();
    // Send and receive WQEs each side posted (all must be retired after each batch).
    let mut retired = [(0u64, 0u64); 2];
    while s.wrs < total_wrs {
        let cap = batch_cap(&mut rng);
        // Mean size about cap/10 (`traffic`'s spread): as many WRs as fit the batch.
        let per_side = (BATCH_BYTES / (cap as u64 / 4).max(4096)).clamp(2, 256) as usize;
        let per_side = per_side.min(((total_wrs - s.wrs) as usize).div_ceil(2).max(1));
        let spec = TrafficSpec {
            ops_per_side: per_side,
            max_len: cap,
            kinds: OpKind::ALL.to_vec(),
            bidirectional: true,
        };
        let mut t = Traffic::plan(&mut rng, &spec, mem_len as u64);
        let what = format!(
            "seed {seed}, batch {} (cap {cap}, {per_side} WRs a side)",
            s.batches
        );
        let deadline = p.now + BATCH_DEADLINE_NS;
        if !t.run(&mut p, [&a, &b], deadline) {
            let now = p.now;
            let mut side = |i: usize, ep: &roce::sim::Endpoint| {
                format!(
                    "side {i}: {} of {} sends and {} receives done, QP {:?}, {:?}",
                    t.send_done[i].len(),
                    t.send_count(i),
                    t.recv_done[i].len(),
                    p.qp_state(i, ep),
                    p.node(i).dev.qp_counters(ep.qpn)
                )
            };
            panic!(
                "{what}: stalled at {now} ns\n{}\n{}",
                side(0, &a),
                side(1, &b)
            );
        }
        if let Err(e) = t.verify([&a, &b], true) {
            panic!(
                "{what}: {e}\nside 0: {:?}\nside 1: {:?}",
                p.node(0).dev.qp_counters(a.qpn),
                p.node(1).dev.qp_counters(b.qpn)
            );
        }
        // Both QPs idle: every WQE posted so far retired.
        for (side, ep) in [(0, &a), (1, &b)] {
            retired[side].0 += t.send_count(side) as u64;
            retired[side].1 += t.recv_done[side].len() as u64;
            assert_eq!(
                p.node(side).dev.queue_positions(ep.qpn),
                Some(retired[side]),
                "{what}: side {side} holds work it did not retire"
            );
        }
        s.wrs += t.ops.len() as u64;
        s.bytes += t.ops.iter().map(|o| o.len as u64).sum::<u64>();
        s.batches += 1;
    }
    link_figures(&p, &mut s);
    s
}

/// The immediate data of the filler messages that consume receives left waiting by lost
/// messages at the end of a batch (message numbers stay far below it).
const FILLER: u32 = 0xffff_fff0;
/// Bytes of the GRH a UD receive buffer starts with.
const GRH: u32 = 40;

/// One message of an unreliable batch, posted by `from`.
struct Msg {
    from: usize,
    kind: OpKind,
    len: u32,
}

/// A batch of UC or UD messages in both directions (module doc). Each side's memory holds,
/// per message, a source region and a WRITE target region of `cap` bytes and a receive slot
/// of `slot_len` bytes.
struct Batch {
    qp_type: QpType,
    msgs: Vec<Msg>,
    cap: u64,
    slot_len: u64,
    /// Per side: messages posted (in plan order), receives posted, sends completed.
    posted: [usize; 2],
    recvs_posted: [u64; 2],
    sends: [Vec<Completion>; 2],
    recvs: [Vec<Completion>; 2],
}

impl Batch {
    fn src(&self, i: usize) -> u64 {
        i as u64 * self.cap
    }

    fn slot(&self, n: u64) -> u64 {
        self.msgs.len() as u64 * self.cap + (n % self.msgs.len() as u64) * self.slot_len
    }

    fn target(&self, i: usize) -> u64 {
        self.msgs.len() as u64 * (self.cap + self.slot_len) + i as u64 * self.cap
    }

    fn pattern(i: usize, len: u32) -> Vec<u8> {
        let mut r = Rng::new(0x5eed_0000 + i as u64);
        (0..len).map(|_| r.next_u64() as u8).collect()
    }

    /// Posts message `i` (a filler when `None`) from `from`; false if the send queue is full.
    fn post(&self, p: &mut Pair, eps: [&Endpoint; 2], from: usize, i: Option<usize>) -> bool {
        let (me, peer) = (eps[from], eps[1 - from]);
        let (kind, len, imm, src) = match i {
            Some(i) => (self.msgs[i].kind, self.msgs[i].len, i as u32, self.src(i)),
            None => (OpKind::SendImm, 0, FILLER, 0),
        };
        let target = || peer.addr + self.target(i.expect("a message"));
        let op = match kind {
            OpKind::Write => WrOp::Write {
                remote_addr: target(),
                rkey: peer.rkey,
            },
            OpKind::WriteImm => WrOp::WriteWithImm {
                remote_addr: target(),
                rkey: peer.rkey,
                imm,
            },
            OpKind::Send => WrOp::Send,
            _ => WrOp::SendWithImm { imm },
        };
        let ud = (self.qp_type == QpType::Ud).then(|| UdDest {
            ah: AddressVector::new(node_gid(1 - from), 0),
            remote_qpn: peer.qpn,
            remote_qkey: Qkey(0x1111_1111),
        });
        let wr = SendWr {
            wr_id: i.map_or(u64::MAX, |i| i as u64),
            op,
            sg_list: &[me.sge(src, len)],
            flags: SendFlags::SIGNALED,
            ud,
        };
        p.node(from).dev.post_send(me.qpn, &wr).is_ok()
    }

    /// Keeps `side`'s receive queue holding `want` more WQEs than its peer's messages have
    /// consumed; each WQE's slot cycles over the batch's slots.
    fn post_recvs(&mut self, p: &mut Pair, ep: &Endpoint, side: usize, upto: u64) {
        while self.recvs_posted[side] < upto {
            let n = self.recvs_posted[side];
            let wr = RecvWr {
                wr_id: n,
                sg_list: &[ep.sge(self.slot(n), self.slot_len as u32)],
            };
            if p.node(side).dev.post_recv(ep.qpn, &wr).is_err() {
                break;
            }
            self.recvs_posted[side] += 1;
        }
    }

    fn collect(&mut self, p: &mut Pair, eps: [&Endpoint; 2]) {
        for (side, ep) in eps.iter().enumerate() {
            for c in p.cqes(side, ep) {
                if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    self.recvs[side].push(c);
                } else {
                    self.sends[side].push(c);
                }
            }
        }
    }
}

/// The soak of UC or UD (module doc); returns its figures.
fn unreliable_soak(qp_type: QpType, seed: u64, total_wrs: u64) -> Soaked {
    let mut rng = Rng::new(seed);
    let mut p = faulty_pair(seed);
    let mtu = [Mtu::M1024, Mtu::M4096][(seed % 2) as usize];
    let mem_len = (3 * BATCH_BYTES + (1 << 20)) as usize;
    let o = ConnectOpts {
        qp_type,
        mtu,
        mem_len,
        psns: (rng.below(1 << 24) as u32, 0x00ff_fff0),
        depth: 64,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    let eps = [&a, &b];
    let mut s = Soaked::default();
    // WQEs each side posted, to compare with what the device retired after each batch.
    let mut total_sends = [0u64; 2];
    let mut total_recvs = [0u64; 2];
    while s.wrs < total_wrs {
        let (cap, kinds): (u32, &[OpKind]) = match qp_type {
            QpType::Ud => (mtu.bytes(), &[OpKind::Send, OpKind::SendImm]),
            _ => (batch_cap(&mut rng), &OpKind::UC),
        };
        // Each message has a source, a target and a slot of `cap` bytes on each side.
        let per_side = (BATCH_BYTES / (2 * cap as u64)).clamp(1, 48) as usize;
        let per_side = per_side.min(((total_wrs - s.wrs) as usize).div_ceil(2).max(1));
        let mut msgs = Vec::new();
        for _ in 0..per_side {
            for from in 0..2 {
                let kind = kinds[rng.below(kinds.len() as u64) as usize];
                let len = match rng.below(4) {
                    0 => rng.below(65),
                    1 => rng.below(4097),
                    _ => rng.below(cap as u64 + 1),
                }
                .min(cap as u64) as u32;
                msgs.push(Msg { from, kind, len });
            }
        }
        let slot_len = cap as u64 + if qp_type == QpType::Ud { GRH as u64 } else { 0 };
        let mut t = Batch {
            qp_type,
            cap: cap as u64,
            slot_len,
            msgs,
            posted: [0, 0],
            recvs_posted: total_recvs,
            sends: [Vec::new(), Vec::new()],
            recvs: [Vec::new(), Vec::new()],
        };
        assert!((t.msgs.len() as u64) * (2 * t.cap + slot_len) <= mem_len as u64);
        let what = format!("{qp_type:?} seed {seed}, batch {} (cap {cap})", s.batches);
        // Sources hold their patterns; WRITE targets and receive slots are zeroed.
        for (i, m) in t.msgs.iter().enumerate() {
            eps[m.from]
                .mem
                .write(t.src(i) as usize, &Batch::pattern(i, m.len))
                .unwrap();
            eps[1 - m.from]
                .mem
                .write(t.target(i) as usize, &vec![0; m.len as usize])
                .unwrap();
        }
        for ep in eps {
            ep.mem
                .write(
                    t.slot(0) as usize,
                    &vec![0; t.msgs.len() * slot_len as usize],
                )
                .unwrap();
        }
        // Each side's receives: one per message of the peer that consumes one.
        let consuming = |side: usize| {
            t.msgs
                .iter()
                .filter(|m| m.from != side && m.kind != OpKind::Write)
                .count() as u64
        };
        let want_recvs = [total_recvs[0] + consuming(0), total_recvs[1] + consuming(1)];
        let deadline = p.now + BATCH_DEADLINE_NS;
        let mine = |t: &Batch, side: usize| -> Vec<usize> {
            (0..t.msgs.len())
                .filter(|&i| t.msgs[i].from == side)
                .collect()
        };
        let order = [mine(&t, 0), mine(&t, 1)];
        let done = p.run(deadline, |p| {
            for side in 0..2 {
                t.post_recvs(p, eps[side], side, want_recvs[side]);
                while t.posted[side] < order[side].len()
                    && t.post(p, eps, side, Some(order[side][t.posted[side]]))
                {
                    t.posted[side] += 1;
                }
            }
            t.collect(p, eps);
            (0..2).all(|i| t.sends[i].len() == order[i].len())
        });
        assert!(done, "{what}: stalled at {} ns", p.now);
        // UC and UD complete a send when it leaves: let the last packets land.
        p.run_until_idle(deadline);
        t.collect(&mut p, eps);
        // Receives that lost messages left waiting: consumed by fillers, so that the next
        // batch's messages find their own.
        let mut fillers = [0u64; 2];
        for round in 0.. {
            assert!(round < 200, "{what}: receives never consumed");
            let waiting: Vec<u64> = (0..2)
                .map(|side| want_recvs[side] - total_recvs[side] - t.recvs[side].len() as u64)
                .collect();
            if waiting.iter().all(|&w| w == 0) {
                break;
            }
            for side in 0..2 {
                for _ in 0..waiting[side].min(32) {
                    assert!(
                        t.post(&mut p, eps, 1 - side, None),
                        "{what}: filler refused"
                    );
                    fillers[1 - side] += 1;
                }
            }
            p.run_until_idle(deadline);
            t.collect(&mut p, eps);
        }
        // Sends: every one SUCCESS, in the order posted (fillers last).
        for side in 0..2 {
            let want: Vec<u64> = order[side]
                .iter()
                .map(|&i| i as u64)
                .chain((0..fillers[side]).map(|_| u64::MAX))
                .collect();
            let got: Vec<u64> = t.sends[side].iter().map(|c| c.wr_id).collect();
            assert_eq!(got, want, "{what}: side {side}'s send completions");
            for c in &t.sends[side] {
                assert_eq!(c.status, WcStatus::Success, "{what}: {c:?}");
            }
        }
        // Receives: each holds one whole message that was sent to it.
        let mut delivered = vec![false; t.msgs.len()];
        for (side, recvs) in t.recvs.iter().enumerate() {
            for c in recvs {
                assert_eq!(c.status, WcStatus::Success, "{what}: side {side}: {c:?}");
                let at = t.slot(c.wr_id) as usize
                    + if qp_type == QpType::Ud {
                        GRH as usize
                    } else {
                        0
                    };
                let with_imm = c.wc_flags.contains(WcFlags::WITH_IMM);
                let payload = c.byte_len - if qp_type == QpType::Ud { GRH } else { 0 };
                if with_imm && c.imm_data == FILLER {
                    assert_eq!(payload, 0, "{what}: a filler with data: {c:?}");
                    continue;
                }
                let got = eps[side].mem.to_vec(at, payload as usize);
                let k = if with_imm {
                    c.imm_data as usize
                } else {
                    // A SEND without immediate: the message of that length and content.
                    (0..t.msgs.len())
                        .find(|&k| {
                            let m = &t.msgs[k];
                            m.from != side
                                && m.kind == OpKind::Send
                                && m.len == payload
                                && Batch::pattern(k, m.len) == got
                        })
                        .unwrap_or_else(|| {
                            panic!("{what}: side {side}: receive {c:?} holds no message sent")
                        })
                };
                let m = t.msgs.get(k).unwrap_or_else(|| panic!("{what}: {c:?}"));
                assert!(
                    m.from != side
                        && m.len == payload
                        && (with_imm == (m.kind != OpKind::Send))
                        && (c.opcode == WcOpcode::RecvRdmaWithImm) == (m.kind == OpKind::WriteImm),
                    "{what}: side {side}: receive {c:?} does not match message {k} ({:?}, {} B)",
                    m.kind,
                    m.len
                );
                if m.kind == OpKind::WriteImm {
                    // Its completion says the whole WRITE arrived.
                    let placed = eps[side].mem.to_vec(t.target(k) as usize, m.len as usize);
                    assert!(
                        placed == Batch::pattern(k, m.len),
                        "{what}: WRITE {k} incomplete"
                    );
                } else {
                    assert!(
                        got == Batch::pattern(k, m.len),
                        "{what}: message {k}'s bytes"
                    );
                }
                delivered[k] = true;
            }
        }
        // WRITEs: every byte placed is that WRITE's byte (or still zero: a UC message that
        // lost a packet is dropped after its first packets were placed, IBA 9.7.7.1).
        for (k, m) in t.msgs.iter().enumerate() {
            if !matches!(m.kind, OpKind::Write | OpKind::WriteImm) {
                continue;
            }
            let placed = eps[1 - m.from]
                .mem
                .to_vec(t.target(k) as usize, m.len as usize);
            let want = Batch::pattern(k, m.len);
            assert!(
                placed.iter().zip(&want).all(|(g, w)| g == w || *g == 0),
                "{what}: WRITE {k} placed bytes that are not its own"
            );
            if m.kind == OpKind::Write && m.len > 0 && placed == want {
                delivered[k] = true;
            }
        }
        // Both QPs idle: every WQE posted so far retired.
        for side in 0..2 {
            total_sends[side] += (order[side].len() as u64) + fillers[side];
            total_recvs[side] = t.recvs_posted[side];
            assert_eq!(
                p.node(side).dev.queue_positions(eps[side].qpn),
                Some((total_sends[side], total_recvs[side])),
                "{what}: side {side} holds work it did not retire"
            );
        }
        s.wrs += t.msgs.len() as u64;
        s.bytes += t.msgs.iter().map(|m| m.len as u64).sum::<u64>();
        s.delivered += delivered.iter().filter(|&&d| d).count() as u64;
        s.batches += 1;
    }
    link_figures(&p, &mut s);
    s
}

/// `FERROCE_SOAK_WRS` and `FERROCE_SOAK_SEED`, or the CI defaults.
fn soak_params() -> (u64, u64) {
    let var = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    (var("FERROCE_SOAK_WRS", 4000), var("FERROCE_SOAK_SEED", 1))
}

fn report(what: &str, seed: u64, s: &Soaked, started: std::time::Instant) {
    eprintln!(
        "{what} soak seed {seed}: {} WRs in {} batches, {:.2} GB, {} frames: {} lost, {} \
         duplicated, {} reordered, {} corrupted; {} messages delivered; {:.3} s simulated, \
         {:.1} s real",
        s.wrs,
        s.batches,
        s.bytes as f64 / 1e9,
        s.frames,
        s.lost,
        s.duplicated,
        s.reordered,
        s.corrupted,
        s.delivered,
        s.sim_ns as f64 / 1e9,
        started.elapsed().as_secs_f64()
    );
    assert!(s.lost > 0 && s.duplicated > 0 && s.reordered > 0, "{s:?}");
}

/// The lossy soak of `qp_type` (see `unreliable_soak`) with the environment's parameters,
/// reported as `what`.
fn unreliable_soak_delivers(qp_type: QpType, what: &str) {
    let (total, seed) = soak_params();
    let started = std::time::Instant::now();
    let s = unreliable_soak(qp_type, seed, total);
    report(what, seed, &s, started);
    // Most small messages get through 5% loss: delivery is checked, not only absence of
    // wrong data.
    assert!(s.delivered * 3 > s.wrs, "{s:?}");
}

#[test]
fn uc_under_a_lossy_soak_never_delivers_a_wrong_byte() {
    unreliable_soak_delivers(QpType::Uc, "UC");
}

#[test]
fn ud_under_a_lossy_soak_never_delivers_a_wrong_byte() {
    unreliable_soak_delivers(QpType::Ud, "UD");
}

#[test]
fn every_wr_of_a_lossy_soak_completes_with_its_data() {
    let (total, seed) = soak_params();
    let started = std::time::Instant::now();
    let s = soak(seed, total);
    report("RC", seed, &s, started);
    for &r in REGRESSION_SEEDS {
        soak(r, 2000);
    }
}
