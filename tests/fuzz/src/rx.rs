//! The receive path of two connected RNIC engines (`roce::sim::Pair`: RC, UC and UD QPs on
//! each side, with posted receives and the input's own posted work requests), fed frames of
//! three kinds: raw bytes; raw bytes re-emitted with valid lengths, checksums and ICRC (so
//! malformed transport headers get past the link checks); and transport headers built from
//! the input around the QPs' real numbers, keys, addresses and PSNs (so the responder's and
//! completer's deeper states are reached). Simulated time moves as the input says.
//!
//! Invariants checked:
//! - nothing panics (the engine's debug assertions included);
//! - memory outside a registration is never written: each side has a registration over the
//!   middle page of three, and the outer pages keep their canary bytes (IBA C9-26: access
//!   is checked against the MR's bounds); the same holds through a type 2 memory window the
//!   input binds over any part of that page with any key and access (IBA 10.6.7);
//! - every work request the engine accepted completes, in success or error, once the input
//!   is done and time has run on (retry and RNR retry counts are finite here, IBA 9.7.5.2).

use std::sync::Arc;

use roce::engine::{Device, DeviceConfig};
use roce::memory::{HeapMemory, MwType, PdId};
use roce::sim::{bring_up, connect, node_gid, ConnectOpts, Endpoint, LinkConfig, Pair};
use roce::types::{Lkey, Qkey, Qpn, Rkey};
use roce::verbs::*;
use roce::wire::frame::{self, TransportRepr};
use roce::wire::opcode::Opcode;

use crate::{Input, CANARY, MS, PAGE, QKEY, SEC};

/// Steps of one input at most (a bound on the time one input takes).
const MAX_STEPS: usize = 96;

/// A registration over the middle page of three whose outer pages must keep `CANARY`.
struct Guard {
    mem: Arc<HeapMemory>,
    addr: u64,
    lkey: Lkey,
    rkey: Rkey,
}

impl Guard {
    fn new(dev: &mut Device, pd: PdId, addr: u64) -> Guard {
        let mem = HeapMemory::shared(3 * PAGE);
        mem.fill(CANARY);
        // Windows may be bound over it (MW_BIND).
        let access = Access::LOCAL_WRITE
            | Access::REMOTE_WRITE
            | Access::REMOTE_READ
            | Access::REMOTE_ATOMIC
            | Access::MW_BIND;
        let (lkey, rkey) = dev
            .reg_mr(pd, mem.clone(), PAGE, addr, PAGE as u64, access)
            .expect("guard MR");
        Guard {
            mem,
            addr,
            lkey,
            rkey: rkey.expect("remote access gives an rkey"),
        }
    }

    fn check(&self, side: usize) {
        let v = self.mem.to_vec(0, 3 * PAGE);
        let outside = v[..PAGE].iter().chain(&v[2 * PAGE..]);
        let bad = outside.filter(|&&b| b != CANARY).count();
        assert_eq!(bad, 0, "side {side}: {bad} bytes written outside the MR");
    }
}

/// Both sides' QPs of one transport: `.0` on A (node 0), `.1` on B (node 1).
type Qps = (Endpoint, Endpoint);

struct World {
    p: Pair,
    rc: Qps,
    uc: Qps,
    ud: Qps,
    guards: [Guard; 2],
    /// A type 2 memory window of each side, in the RC QP's PD: the input binds it over the
    /// guard's page (any part, any key byte, any access) and the peer aims at it.
    mws: [Rkey; 2],
    /// How each transport's QPs were connected (RC, UC, UD), for reconnecting them.
    opts: [ConnectOpts; 3],
    /// Work requests the engine accepted (all signaled), by queue: `[send, receive]`.
    posted: [u64; 2],
    /// Their completions polled (send WRs carry `wr_id` 1, receive WRs 0).
    completed: [u64; 2],
    /// Opcodes the table knows.
    opcodes: Vec<u8>,
}

impl World {
    fn new() -> World {
        let cfg = DeviceConfig {
            port_mtu: Mtu::M4096,
            ..Default::default()
        };
        let mut p = Pair::new(cfg.clone(), cfg, LinkConfig::default(), 7);
        let o = |qp_type| ConnectOpts {
            qp_type,
            mtu: Mtu::M1024,
            mem_len: 4 * PAGE,
            depth: 16,
            // Finite, so that every WR ends (IBA: 7 means retry for ever).
            rnr_retry: 3,
            retry_cnt: 3,
            timeout: 10,
            ..Default::default()
        };
        let opts = [o(QpType::Rc), o(QpType::Uc), o(QpType::Ud)];
        let rc = connect(&mut p, &opts[0]);
        let uc = connect(&mut p, &opts[1]);
        let ud = connect(&mut p, &opts[2]);
        let guards = [
            Guard::new(&mut p.a.dev, rc.0.pd, 0x7000_0000),
            Guard::new(&mut p.b.dev, rc.1.pd, 0x7100_0000),
        ];
        let mws = [
            p.a.dev.alloc_mw(rc.0.pd, MwType::Two).expect("MW"),
            p.b.dev.alloc_mw(rc.1.pd, MwType::Two).expect("MW"),
        ];
        let mut w = World {
            p,
            rc,
            uc,
            ud,
            guards,
            mws,
            opts,
            posted: [0; 2],
            completed: [0; 2],
            opcodes: (0..=255u8)
                .filter(|&o| Opcode(o).info().is_some())
                .collect(),
        };
        for side in 0..2 {
            for t in 0..3 {
                for i in 0..4 {
                    w.post_recv(side, t, i * 1024, 2048);
                }
            }
        }
        w
    }

    fn qps(&self, t: u8) -> &Qps {
        match t % 3 {
            0 => &self.rc,
            1 => &self.uc,
            _ => &self.ud,
        }
    }

    fn ep(&self, side: usize, t: u8) -> &Endpoint {
        let q = self.qps(t);
        if side == 0 {
            &q.0
        } else {
            &q.1
        }
    }

    fn post_recv(&mut self, side: usize, t: u8, off: u64, len: u32) {
        let ep = self.ep(side, t);
        let (qpn, sge) = (
            ep.qpn,
            ep.sge(off % (3 * PAGE as u64), len.min(PAGE as u32)),
        );
        let wr = RecvWr {
            wr_id: 0,
            sg_list: &[sge],
        };
        if self.p.node(side).dev.post_recv(qpn, &wr).is_ok() {
            self.posted[1] += 1;
        }
    }

    /// Posts a work request chosen by the input on a QP of `side`.
    fn post_send(&mut self, side: usize, inp: &mut Input) {
        let t = inp.u8();
        let (me, peer) = (self.ep(side, t).clone(), self.ep(1 - side, t).clone());
        let guard = &self.guards[1 - side];
        let sel = inp.u8();
        // The peer's own MR, its guard or its window (both in the RC QP's PD: UC is
        // refused there).
        let (addr, rkey) = match sel % 3 {
            0 => (peer.addr, peer.rkey),
            1 => (guard.addr, guard.rkey),
            _ => (guard.addr, self.window_key(1 - side, inp)),
        };
        let remote_addr = addr + (inp.u16() as u64 % (2 * PAGE as u64)) / 8 * 8;
        // Invalidations name this side's guard or window; binds put this side's window
        // over part of its guard.
        let op = match inp.wr_op(remote_addr, rkey) {
            WrOp::LocalInv { .. } => WrOp::LocalInv {
                rkey: if sel & 8 == 0 {
                    self.guards[side].rkey
                } else {
                    self.window_key(side, inp)
                },
            },
            WrOp::BindMw { length, access, .. } => {
                let g = &self.guards[side];
                WrOp::BindMw {
                    mw: self.mws[side],
                    rkey: self.window_key(side, inp),
                    mr: g.lkey,
                    addr: g.addr + inp.u16() as u64 % PAGE as u64,
                    length: length % (2 * PAGE as u64),
                    access,
                }
            }
            op => op,
        };
        let len = match op {
            WrOp::CompareSwap { .. } | WrOp::FetchAdd { .. } => 8,
            _ => inp.u16() as u32 % 3000,
        };
        let sge = me.sge(inp.u16() as u64 % PAGE as u64, len);
        let ud = (t % 3 == 2).then(|| UdDest {
            ah: AddressVector::new(node_gid(1 - side), 0),
            remote_qpn: peer.qpn,
            remote_qkey: Qkey(QKEY),
        });
        // Binds and invalidations carry no data.
        let sges = [sge];
        let sg_list = match op {
            WrOp::BindMw { .. } | WrOp::LocalInv { .. } => &sges[..0],
            _ => &sges[..],
        };
        let wr = SendWr {
            wr_id: 1,
            op,
            sg_list,
            flags: SendFlags::SIGNALED,
            ud,
        };
        if self.p.node(side).dev.post_send(me.qpn, &wr).is_ok() {
            self.posted[0] += 1;
        }
    }

    /// A frame to `to` from the other side whose transport headers are built from the
    /// input: an opcode the table knows (mostly), a real QP (mostly), a PSN near the QP's
    /// start, and extended headers from the input with their keys and addresses (mostly)
    /// pointing at real registrations.
    fn structured(&mut self, to: usize, inp: &mut Input) -> Vec<u8> {
        let opcodes = std::mem::take(&mut self.opcodes);
        let tr = crate::transport_from_input(inp, &opcodes, |inp, t, opcode| {
            let qpn = match t % 5 {
                0..=2 => self.ep(to, t).qpn,
                3 => Qpn::new(1),
                _ => Qpn::new(inp.u32() & 0x00ff_ffff),
            };
            // Requests count from the sender's starting PSN, responses from the receiver's
            // (`ConnectOpts::psns`: A sends from 0x100, B from 0x200).
            let base = if (to == 1) == opcode.info().is_none_or(|i| i.is_request) {
                0x100
            } else {
                0x200
            };
            (qpn, base)
        });
        self.opcodes = opcodes;
        let Some(mut tr) = tr else {
            return Vec::new();
        };
        self.aim(to, &mut tr, inp);
        let len = inp.u16() as usize % 1100;
        let fill = inp.u8();
        tr.bth.pad_count = ((4 - len % 4) % 4) as u8;
        self.p.craft(1 - to, tr, &vec![fill; len])
    }

    /// Points the extended headers' keys and addresses at `to`'s registrations and QPs, as
    /// the input selects.
    fn aim(&self, to: usize, tr: &mut TransportRepr, inp: &mut Input) {
        let sel = inp.u8();
        let off = inp.u16() as u64 % (2 * PAGE as u64);
        let (addr, rkey) = match sel % 4 {
            0 => (self.guards[to].addr, self.guards[to].rkey),
            1 => (self.rc_ep(to).addr, self.rc_ep(to).rkey),
            2 => (self.guards[to].addr, self.window_key(to, inp)),
            _ => return,
        };
        if let Some(r) = tr.ext.reth.as_mut() {
            r.va = addr + off;
            r.rkey = rkey;
            if sel & 4 != 0 {
                r.len %= 4 * PAGE as u32;
            }
        }
        if let Some(a) = tr.ext.atomic_eth.as_mut() {
            a.va = (addr + off) & !7;
            a.rkey = rkey;
        }
        if let Some(d) = tr.ext.deth.as_mut() {
            d.qkey = Qkey(QKEY);
            d.src_qp = self.ep(1 - to, 2).qpn;
        }
        if let Some(i) = tr.ext.ieth.as_mut() {
            i.rkey = rkey;
        }
    }

    /// `side`'s window's key with a key byte from the input (a bind sets the byte): one of
    /// four, so that a bind and a later access through the window meet often.
    fn window_key(&self, side: usize, inp: &mut Input) -> Rkey {
        Rkey(self.mws[side].0 & !0xff | (inp.u8() & 3) as u32)
    }

    fn rc_ep(&self, side: usize) -> &Endpoint {
        self.ep(side, 0)
    }

    fn poll_all(&mut self) {
        let mut out = [Completion::default(); 16];
        for side in 0..2 {
            for t in 0..3 {
                let cq = self.ep(side, t).cq;
                loop {
                    let n = self.p.node(side).dev.poll_cq(cq, &mut out).unwrap_or(0);
                    for c in &out[..n] {
                        self.completed[(c.wr_id == 0) as usize] += 1;
                    }
                    if n < out.len() {
                        break;
                    }
                }
            }
        }
    }

    /// Connects transport `t`'s QPs again, as an application recovers a QP in the error
    /// state: both to ERR (their WRs flushed, with completions), then RESET, then up again
    /// with the starting PSNs, and receives posted anew. Without it the first error of a
    /// QP would end its part of the input.
    fn reconnect(&mut self, t: u8) {
        let (a, b) = self.qps(t).clone();
        for (side, ep) in [(0, &a), (1, &b)] {
            self.p.set_qp_state(side, ep, QpState::Err);
        }
        self.settle(MS);
        let o = self.opts[(t % 3) as usize];
        let (pa, pb) = o.psns;
        for (side, me, peer, sq, rq) in [(0, &a, &b, pa, pb), (1, &b, &a, pb, pa)] {
            self.p.set_qp_state(side, me, QpState::Reset);
            bring_up(
                &mut self.p.node(side).dev,
                me,
                peer.qpn,
                node_gid(1 - side),
                &o,
                sq,
                rq,
            );
        }
        for side in 0..2 {
            for i in 0..4 {
                self.post_recv(side, t, i * 1024, 2048);
            }
        }
    }

    /// One step of the input: a frame, a post, or time.
    fn step(&mut self, inp: &mut Input) {
        match inp.u8() % 9 {
            8 => {
                let t = inp.u8();
                self.reconnect(t);
            }
            0 => {
                let to = (inp.u8() & 1) as usize;
                let n = inp.u16() as usize % 2048;
                let f = inp.bytes(n).to_vec();
                self.p.inject(to, &f);
            }
            1 => {
                // Re-emitted: valid lengths, IP checksum and ICRC around the input's headers.
                let to = (inp.u8() & 1) as usize;
                let n = inp.u16() as usize % 2048;
                let raw = inp.bytes(n);
                if let Ok(p) = frame::inspect(raw) {
                    let mut out = vec![0u8; p.frame_len];
                    if p.repr.emit(&mut out, p.payload(raw)).is_ok() {
                        self.p.inject(to, &out);
                    }
                }
            }
            2 | 3 => {
                let to = (inp.u8() & 1) as usize;
                let f = self.structured(to, inp);
                if !f.is_empty() {
                    self.p.inject(to, &f);
                }
            }
            4 | 5 => {
                let side = (inp.u8() & 1) as usize;
                self.post_send(side, inp);
            }
            6 => {
                let (side, t) = ((inp.u8() & 1) as usize, inp.u8());
                let off = inp.u16() as u64;
                self.post_recv(side, t, off, inp.u16() as u32 % 4096);
            }
            _ => {
                let ns = inp.u16() as u64 * 100_000;
                self.settle(ns);
                return;
            }
        }
        self.settle(10 * MS);
    }

    fn settle(&mut self, ns: u64) {
        let deadline = self.p.now + ns;
        self.p.run_until_idle(deadline);
        self.poll_all();
    }
}

/// Runs one input (see the module's doc).
pub fn run(data: &[u8]) {
    let mut w = World::new();
    crate::script(data, MAX_STEPS, |inp| w.step(inp));
    // Time enough for every timer: retries, RNR waits, the responder's state.
    for _ in 0..20 {
        w.settle(SEC);
    }
    for (side, g) in w.guards.iter().enumerate() {
        g.check(side);
    }
    assert_eq!(
        w.completed[0], w.posted[0],
        "every send WR ends: completions against WRs posted"
    );
    assert!(
        w.completed[1] <= w.posted[1],
        "{} receive completions for {} receive WRs",
        w.completed[1],
        w.posted[1]
    );
}
