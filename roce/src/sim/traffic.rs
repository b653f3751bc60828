//! Random RDMA workloads with a checker, for simulator property tests (and the dataplane's
//! end-to-end tests): every operation gets its own memory regions, so the expected final
//! contents of both memories and every completion are known exactly.

use std::collections::VecDeque;

use super::{Endpoint, Pair, Rng};
use crate::memory::Memory;
use crate::verbs::{Completion, RecvWr, SendFlags, SendWr, Sge, WcFlags, WcOpcode, WcStatus, WrOp};

/// Operation kinds a workload may contain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// RDMA WRITE.
    Write,
    /// RDMA WRITE with immediate.
    WriteImm,
    /// RDMA READ.
    Read,
    /// SEND.
    Send,
    /// SEND with immediate.
    SendImm,
    /// ATOMIC compare and swap.
    CompareSwap,
    /// ATOMIC fetch and add.
    FetchAdd,
}

impl OpKind {
    /// Every kind.
    pub const ALL: [OpKind; 7] = [
        OpKind::Write,
        OpKind::WriteImm,
        OpKind::Read,
        OpKind::Send,
        OpKind::SendImm,
        OpKind::CompareSwap,
        OpKind::FetchAdd,
    ];

    /// The kinds UC supports.
    pub const UC: [OpKind; 4] = [
        OpKind::Write,
        OpKind::WriteImm,
        OpKind::Send,
        OpKind::SendImm,
    ];

    fn is_atomic(self) -> bool {
        matches!(self, OpKind::CompareSwap | OpKind::FetchAdd)
    }

    fn consumes_recv(self) -> bool {
        matches!(self, OpKind::Send | OpKind::SendImm | OpKind::WriteImm)
    }
}

/// One planned operation, posted by side `from` towards the other side.
#[derive(Debug, Clone)]
pub struct PlannedOp {
    /// 0 = A posts it, 1 = B.
    pub from: usize,
    /// What it does.
    pub kind: OpKind,
    /// Bytes (8 for atomics).
    pub len: u32,
    /// Offset in the poster's memory (source of WRITE/SEND, destination of READ/ATOMIC).
    pub local_off: u64,
    /// Offset in the peer's memory (WRITE/READ/ATOMIC target, SEND receive buffer).
    pub remote_off: u64,
    /// Immediate data.
    pub imm: u32,
    /// ATOMIC: initial target value, operand(s), expected original and final values.
    pub atomic: Option<(u64, u64, u64)>,
}

/// Parameters of a random workload.
#[derive(Debug, Clone)]
pub struct TrafficSpec {
    /// Operations per direction.
    pub ops_per_side: usize,
    /// Largest message.
    pub max_len: u32,
    /// Kinds to draw from.
    pub kinds: Vec<OpKind>,
    /// Traffic in both directions at once.
    pub bidirectional: bool,
}

/// A planned workload and what it produced.
#[derive(Debug, Clone)]
pub struct Traffic {
    /// The operations, in posting order per side.
    pub ops: Vec<PlannedOp>,
    posted: [usize; 2],
    recv_posted: [usize; 2],
    /// Send completions seen per side.
    pub send_done: [Vec<Completion>; 2],
    /// Receive completions seen per side.
    pub recv_done: [Vec<Completion>; 2],
    mem_len: u64,
}

fn draw_len(rng: &mut Rng, max: u32) -> u32 {
    let r = rng.below(100);
    let mut cap = |hi: u64| rng_range(rng, hi.min(max as u64 + 1)) as u32;
    match r {
        0..=39 => cap(65),
        40..=69 => cap(4097),
        70..=89 => cap(65_537),
        _ => cap(max as u64 + 1),
    }
}

fn rng_range(rng: &mut Rng, hi: u64) -> u64 {
    rng.below(hi.max(1))
}

fn fill_pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

impl Traffic {
    /// Plans a workload; memory regions are carved out of `mem_len` bytes per side.
    pub fn plan(rng: &mut Rng, spec: &TrafficSpec, mem_len: u64) -> Traffic {
        let mut next = [0u64, 0u64];
        let mut alloc = |side: usize, len: u64| {
            let at = next[side];
            next[side] = (at + len.max(1) + 7) & !7;
            assert!(
                next[side] <= mem_len,
                "workload does not fit in {mem_len} bytes"
            );
            at
        };
        let mut ops = Vec::new();
        let sides: &[usize] = if spec.bidirectional { &[0, 1] } else { &[0] };
        for i in 0..spec.ops_per_side {
            for &from in sides {
                let kind = spec.kinds[rng.below(spec.kinds.len() as u64) as usize];
                let len = if kind.is_atomic() {
                    8
                } else {
                    draw_len(rng, spec.max_len)
                };
                let local_off = alloc(from, len as u64);
                let remote_off = alloc(1 - from, len as u64);
                let atomic = match kind {
                    OpKind::CompareSwap => {
                        let init = rng.next_u64();
                        let hit = rng.below(2) == 0;
                        let compare = if hit { init } else { init ^ 1 };
                        let swap = rng.next_u64();
                        Some((init, compare, swap))
                    }
                    OpKind::FetchAdd => Some((rng.next_u64(), rng.next_u64(), 0)),
                    _ => None,
                };
                ops.push(PlannedOp {
                    from,
                    kind,
                    len,
                    local_off,
                    remote_off,
                    imm: (i as u32) << 8 | from as u32,
                    atomic,
                });
            }
        }
        Traffic {
            ops,
            posted: [0, 0],
            recv_posted: [0, 0],
            send_done: [Vec::new(), Vec::new()],
            recv_done: [Vec::new(), Vec::new()],
            mem_len,
        }
    }

    /// Fills source regions and atomic targets with their initial contents.
    pub fn prepare(&self, eps: [&Endpoint; 2]) {
        for (i, op) in self.ops.iter().enumerate() {
            let (me, peer) = (eps[op.from], eps[1 - op.from]);
            match op.kind {
                OpKind::Write | OpKind::WriteImm | OpKind::Send | OpKind::SendImm => {
                    me.mem
                        .write(
                            op.local_off as usize,
                            &fill_pattern(i as u64, op.len as usize),
                        )
                        .expect("in bounds");
                }
                OpKind::Read => {
                    peer.mem
                        .write(
                            op.remote_off as usize,
                            &fill_pattern(i as u64, op.len as usize),
                        )
                        .expect("in bounds");
                }
                OpKind::CompareSwap | OpKind::FetchAdd => {
                    let (init, _, _) = op.atomic.expect("atomic");
                    peer.mem
                        .write(op.remote_off as usize, &init.to_ne_bytes())
                        .expect("in bounds");
                }
            }
        }
    }

    fn wr_for(&self, i: usize, eps: [&Endpoint; 2]) -> (WrOp, Sge) {
        let op = &self.ops[i];
        let (me, peer) = (eps[op.from], eps[1 - op.from]);
        let remote_addr = peer.addr + op.remote_off;
        let rkey = peer.rkey;
        let wrop = match op.kind {
            OpKind::Write => WrOp::Write { remote_addr, rkey },
            OpKind::WriteImm => WrOp::WriteWithImm {
                remote_addr,
                rkey,
                imm: op.imm,
            },
            OpKind::Read => WrOp::Read { remote_addr, rkey },
            OpKind::Send => WrOp::Send,
            OpKind::SendImm => WrOp::SendWithImm { imm: op.imm },
            OpKind::CompareSwap => {
                let (_, compare, swap) = op.atomic.expect("atomic");
                WrOp::CompareSwap {
                    remote_addr,
                    rkey,
                    compare,
                    swap,
                }
            }
            OpKind::FetchAdd => {
                let (_, add, _) = op.atomic.expect("atomic");
                WrOp::FetchAdd {
                    remote_addr,
                    rkey,
                    add,
                }
            }
        };
        let sge = Sge {
            addr: me.addr + op.local_off,
            length: op.len,
            lkey: me.lkey,
        };
        (wrop, sge)
    }

    /// Posts receive WQEs for the SENDs and WRITEs-with-immediate aimed at each side, and as
    /// many send WRs as the send queues take. Returns whether anything was posted.
    pub fn post_more(&mut self, pair: &mut Pair, eps: [&Endpoint; 2]) -> bool {
        let mut any = false;
        // Receives, in the order the peer's messages will arrive.
        for side in 0..2 {
            let targets: Vec<usize> = self
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.from != side && o.kind.consumes_recv())
                .map(|(i, _)| i)
                .collect();
            while self.recv_posted[side] < targets.len() {
                let i = targets[self.recv_posted[side]];
                let op = &self.ops[i];
                let me = eps[side];
                let sge = Sge {
                    addr: me.addr + op.remote_off,
                    length: if op.kind == OpKind::WriteImm {
                        0
                    } else {
                        op.len
                    },
                    lkey: me.lkey,
                };
                let wr = RecvWr {
                    wr_id: i as u64,
                    sg_list: &[sge],
                };
                if pair.node(side).dev.post_recv(me.qpn, &wr).is_err() {
                    break;
                }
                self.recv_posted[side] += 1;
                any = true;
            }
        }
        for side in 0..2 {
            let mine: Vec<usize> = self
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.from == side)
                .map(|(i, _)| i)
                .collect();
            while self.posted[side] < mine.len() {
                let i = mine[self.posted[side]];
                let (op, sge) = self.wr_for(i, eps);
                let wr = SendWr {
                    wr_id: i as u64,
                    op,
                    sg_list: &[sge],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                };
                if pair.node(side).dev.post_send(eps[side].qpn, &wr).is_err() {
                    break;
                }
                self.posted[side] += 1;
                any = true;
            }
        }
        any
    }

    /// Collects completions from both endpoints' CQs.
    pub fn collect(&mut self, pair: &mut Pair, eps: [&Endpoint; 2]) {
        for (side, ep) in eps.iter().enumerate() {
            let mut q = VecDeque::new();
            super::drain_cq(&mut pair.node(side).dev, ep.cq, &mut q);
            for c in q {
                if matches!(c.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm) {
                    self.recv_done[side].push(c);
                } else {
                    self.send_done[side].push(c);
                }
            }
        }
    }

    /// Number of send WRs each side posts.
    pub fn send_count(&self, side: usize) -> usize {
        self.ops.iter().filter(|o| o.from == side).count()
    }

    /// Whether every send WR of both sides has completed (successfully or not).
    pub fn all_completed(&self) -> bool {
        (0..2).all(|s| self.send_done[s].len() >= self.send_count(s))
    }

    /// Whether any completion carries an error.
    pub fn any_error(&self) -> bool {
        self.send_done
            .iter()
            .chain(self.recv_done.iter())
            .flatten()
            .any(|c| c.status != WcStatus::Success)
    }

    /// Runs the simulation, posting as queues allow, until every WR completed or `deadline`.
    pub fn run(&mut self, pair: &mut Pair, eps: [&Endpoint; 2], deadline: u64) -> bool {
        self.prepare(eps);
        pair.run(deadline, |p| {
            self.post_more(p, eps);
            self.collect(p, eps);
            self.all_completed() || (self.any_error() && self.posted_all())
        });
        // Unreliable transports complete sends when they leave: let the last packets land.
        pair.run_until_idle(deadline);
        self.collect(pair, eps);
        self.all_completed()
    }

    fn posted_all(&self) -> bool {
        (0..2).all(|s| self.posted[s] >= self.send_count(s))
    }

    /// Checks completions and memory against the plan, for a run where everything should
    /// have succeeded.
    pub fn verify(&self, eps: [&Endpoint; 2], reliable: bool) -> Result<(), String> {
        for side in 0..2 {
            let mine: Vec<(usize, &PlannedOp)> = self
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.from == side)
                .collect();
            let done = &self.send_done[side];
            if done.len() != mine.len() {
                return Err(format!(
                    "side {side}: {} of {} send WRs completed",
                    done.len(),
                    mine.len()
                ));
            }
            for (c, (i, op)) in done.iter().zip(&mine) {
                if c.wr_id != *i as u64 {
                    return Err(format!(
                        "side {side}: completion for WR {} out of order (expected {i})",
                        c.wr_id
                    ));
                }
                if c.status != WcStatus::Success {
                    return Err(format!(
                        "side {side}: WR {i} ({:?}) failed: {:?}",
                        op.kind, c.status
                    ));
                }
            }
            // Receives on this side, in arrival order.
            let expect_recv: Vec<(usize, &PlannedOp)> = self
                .ops
                .iter()
                .enumerate()
                .filter(|(_, o)| o.from != side && o.kind.consumes_recv())
                .collect();
            let got = &self.recv_done[side];
            if reliable && got.len() != expect_recv.len() {
                return Err(format!(
                    "side {side}: {} of {} receives completed",
                    got.len(),
                    expect_recv.len()
                ));
            }
            for (c, (i, op)) in got.iter().zip(&expect_recv) {
                if c.wr_id != *i as u64 || c.status != WcStatus::Success {
                    return Err(format!("side {side}: receive {c:?} does not match op {i}"));
                }
                if c.byte_len != op.len {
                    return Err(format!(
                        "side {side}: receive {i} byte_len {} != {}",
                        c.byte_len, op.len
                    ));
                }
                let with_imm = matches!(op.kind, OpKind::SendImm | OpKind::WriteImm);
                if with_imm != c.wc_flags.contains(WcFlags::WITH_IMM)
                    || (with_imm && c.imm_data != op.imm)
                {
                    return Err(format!(
                        "side {side}: receive {i} immediate data wrong: {c:?}"
                    ));
                }
                let want = if op.kind == OpKind::WriteImm {
                    WcOpcode::RecvRdmaWithImm
                } else {
                    WcOpcode::Recv
                };
                if c.opcode != want {
                    return Err(format!("side {side}: receive {i} opcode {:?}", c.opcode));
                }
            }
        }
        // Memory.
        for (i, op) in self.ops.iter().enumerate() {
            let (me, peer) = (eps[op.from], eps[1 - op.from]);
            let pattern = || fill_pattern(i as u64, op.len as usize);
            let ok = match op.kind {
                OpKind::Write | OpKind::WriteImm | OpKind::Send | OpKind::SendImm => {
                    peer.mem.to_vec(op.remote_off as usize, op.len as usize) == pattern()
                }
                OpKind::Read => me.mem.to_vec(op.local_off as usize, op.len as usize) == pattern(),
                OpKind::CompareSwap => {
                    let (init, compare, swap) = op.atomic.expect("atomic");
                    let fin = if init == compare { swap } else { init };
                    me.mem.to_vec(op.local_off as usize, 8) == init.to_ne_bytes()
                        && peer.mem.to_vec(op.remote_off as usize, 8) == fin.to_ne_bytes()
                }
                OpKind::FetchAdd => {
                    let (init, add, _) = op.atomic.expect("atomic");
                    me.mem.to_vec(op.local_off as usize, 8) == init.to_ne_bytes()
                        && peer.mem.to_vec(op.remote_off as usize, 8)
                            == init.wrapping_add(add).to_ne_bytes()
                }
            };
            if !ok {
                return Err(format!(
                    "op {i} {:?} of {} bytes from side {}: memory differs",
                    op.kind, op.len, op.from
                ));
            }
        }
        let _ = self.mem_len;
        Ok(())
    }
}
