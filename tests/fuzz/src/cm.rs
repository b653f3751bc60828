//! The connection manager (`roce::cm::CmAgent`, rdma_cm's wire side): two agents, A and B,
//! with B listening, driven by the input through their API (connect, accept, reject, RTU,
//! disconnect, SIDR) while the MADs between them are delivered, dropped, duplicated,
//! replayed later or delivered with bytes changed, raw MADs are injected, and time moves.
//!
//! Invariants checked: nothing panics; an agent never holds more connections than its
//! `max_conns`; the MADs and events waiting in an agent stay bounded (drained every step, so
//! one step's output is bounded by what one step can cause), and the connection table stays
//! within its bound once time has run past every retry and time wait.

use roce::cm::{AcceptParams, CmAgent, CmConfig, CmEvent, ConnId, ConnectParams, SidrParams};
use roce::types::Gid;

use crate::{Input, MS};

const MAX_STEPS: usize = 128;
const MAX_CONNS: usize = 8;
/// MADs kept for replay at most.
const KEEP: usize = 32;
/// What one step may leave in an agent's queues at most (a REQ flood of one step is one MAD;
/// timers firing together are bounded by the connections).
const MAX_OUT: usize = 4 * MAX_CONNS + 8;

fn gid(i: usize) -> Gid {
    Gid::from_ipv4([10, 99, 0, 10 + i as u8])
}

struct Side {
    agent: CmAgent,
    /// IDs its events named (for the input's accept, reject, RTU and disconnect calls).
    ids: Vec<ConnId>,
}

struct World {
    sides: [Side; 2],
    now: u64,
    /// MADs sent, as (to, bytes), kept for replay.
    kept: Vec<(usize, Vec<u8>)>,
    /// MADs in flight, as (to, bytes).
    wire: Vec<(usize, Vec<u8>)>,
    /// MADs handed to each agent in this step.
    delivered: [usize; 2],
}

impl World {
    fn new() -> World {
        let side = |i: usize| {
            let cfg = CmConfig {
                ca_guid: 0x1000 + i as u64,
                max_conns: MAX_CONNS,
                cm_response_timeout: 12,
                max_cm_retries: 3,
                ..Default::default()
            };
            Side {
                agent: CmAgent::new(cfg),
                ids: Vec::new(),
            }
        };
        let mut w = World {
            sides: [side(0), side(1)],
            now: 0,
            kept: Vec::new(),
            wire: Vec::new(),
            delivered: [0; 2],
        };
        let _ = w.sides[1].agent.listen(0x0106_0000_0000_1234);
        w
    }

    /// Takes both agents' output: MADs onto the wire (and the replay list), events' IDs
    /// into the sides' lists.
    fn drain(&mut self) {
        for i in 0..2 {
            let mut mads = 0;
            while let Some(m) = self.sides[i].agent.poll_mad() {
                mads += 1;
                self.wire.push((1 - i, m.mad.to_vec()));
                if self.kept.len() < KEEP {
                    self.kept.push((1 - i, m.mad.to_vec()));
                }
            }
            let mut events = 0;
            while let Some(e) = self.sides[i].agent.poll_event() {
                events += 1;
                let id = match e {
                    CmEvent::ConnectRequest { id, .. }
                    | CmEvent::RepReceived { id, .. }
                    | CmEvent::Established { id }
                    | CmEvent::Rejected { id, .. }
                    | CmEvent::TimedOut { id }
                    | CmEvent::Disconnected { id }
                    | CmEvent::Released { id }
                    | CmEvent::SidrRequest { id, .. }
                    | CmEvent::SidrReply { id, .. } => id,
                    #[allow(unreachable_patterns)]
                    _ => continue,
                };
                let ids = &mut self.sides[i].ids;
                if !ids.contains(&id) && ids.len() < 4 * MAX_CONNS {
                    ids.push(id);
                }
            }
            // At most one answer for each MAD that came in, beside what the step's call and
            // timers send: no MAD is amplified.
            let bound = MAX_OUT + self.delivered[i];
            assert!(mads <= bound, "side {i}: {mads} MADs from one step");
            assert!(events <= bound, "side {i}: {events} events from one step");
            assert!(
                self.sides[i].agent.conn_count() <= MAX_CONNS,
                "side {i}: {} connections",
                self.sides[i].agent.conn_count()
            );
        }
    }

    fn id(&self, side: usize, inp: &mut Input) -> ConnId {
        let ids = &self.sides[side].ids;
        let b = inp.u8();
        if ids.is_empty() || b == 0xff {
            ConnId(inp.u32())
        } else {
            ids[b as usize % ids.len()]
        }
    }

    fn deliver(&mut self, to: usize, mad: &[u8]) {
        self.delivered[to] += 1;
        let now = self.now;
        self.sides[to]
            .agent
            .handle_mad(now, gid(1 - to), gid(to), mad);
    }

    fn step(&mut self, inp: &mut Input) {
        let side = (inp.u8() & 1) as usize;
        let now = self.now;
        match inp.u8() % 14 {
            0 => {
                let p = ConnectParams {
                    service_id: if inp.u8() & 1 == 0 {
                        0x0106_0000_0000_1234
                    } else {
                        inp.u64()
                    },
                    local_gid: gid(side),
                    remote_gid: gid(1 - side),
                    qpn: inp.u32() & 0x00ff_ffff,
                    starting_psn: inp.u32() & 0x00ff_ffff,
                    responder_resources: inp.u8(),
                    initiator_depth: inp.u8(),
                    path_mtu: inp.u8() % 6,
                    retry_count: inp.u8() % 8,
                    rnr_retry_count: inp.u8() % 8,
                    ..Default::default()
                };
                let _ = self.sides[side].agent.connect(now, &p);
            }
            1 => {
                let id = self.id(side, inp);
                let p = AcceptParams {
                    qpn: inp.u32() & 0x00ff_ffff,
                    starting_psn: inp.u32() & 0x00ff_ffff,
                    responder_resources: inp.u8(),
                    initiator_depth: inp.u8(),
                    rnr_retry_count: inp.u8() % 8,
                    ..Default::default()
                };
                let _ = self.sides[side].agent.accept(now, id, &p);
            }
            2 => {
                let id = self.id(side, inp);
                let reason = inp.u16();
                let n = inp_len(inp, 160);
                let data = inp.bytes(n).to_vec();
                let _ = self.sides[side].agent.reject(id, reason, &data);
            }
            3 => {
                let id = self.id(side, inp);
                let _ = self.sides[side].agent.rtu(id);
            }
            4 => {
                let id = self.id(side, inp);
                let _ = self.sides[side].agent.established(id);
            }
            5 => {
                let id = self.id(side, inp);
                let _ = self.sides[side].agent.disconnect(now, id);
            }
            6 => {
                let p = SidrParams {
                    service_id: 0x0106_0000_0000_1234 ^ (inp.u8() as u64 & 1),
                    local_gid: gid(side),
                    remote_gid: gid(1 - side),
                    ..Default::default()
                };
                let _ = self.sides[side].agent.sidr_request(now, &p);
            }
            7 => {
                let id = self.id(side, inp);
                let (qpn, qkey, status) = (inp.u32() & 0x00ff_ffff, inp.u32(), inp.u8() % 4);
                let _ = self.sides[side]
                    .agent
                    .sidr_reply(id, status, qpn, qkey, &[]);
            }
            8 => {
                // Deliver what is on the wire, in order; some dropped, some twice.
                let wire = std::mem::take(&mut self.wire);
                for (to, m) in wire {
                    match inp.u8() % 8 {
                        0 => {}
                        1 => {
                            self.deliver(to, &m);
                            self.deliver(to, &m);
                        }
                        _ => self.deliver(to, &m),
                    }
                }
            }
            9 => {
                // A kept MAD again, later (a replay).
                if !self.kept.is_empty() {
                    let (to, m) = self.kept[inp.u8() as usize % self.kept.len()].clone();
                    self.deliver(to, &m);
                }
            }
            10 => {
                // A kept MAD with bytes changed.
                if !self.kept.is_empty() {
                    let (to, mut m) = self.kept[inp.u8() as usize % self.kept.len()].clone();
                    for _ in 0..1 + inp.u8() % 4 {
                        let at = inp.u16() as usize % m.len();
                        m[at] ^= inp.u8() | 1;
                    }
                    self.deliver(to, &m);
                }
            }
            11 => {
                let n = inp_len(inp, 300);
                let m = inp.bytes(n).to_vec();
                self.deliver(side, &m);
            }
            12 => {
                self.sides[side].agent.unlisten(0x0106_0000_0000_1234);
                let _ = self.sides[side].agent.listen(0x0106_0000_0000_1234);
            }
            _ => self.advance(inp.u16() as u64 * MS),
        }
        self.drain();
    }

    fn advance(&mut self, ns: u64) {
        self.now += ns;
        for s in &mut self.sides {
            s.agent.handle_timeout(self.now);
        }
    }
}

fn inp_len(inp: &mut Input, max: usize) -> usize {
    inp.u16() as usize % (max + 1)
}

/// Runs one input (see the module's doc).
pub fn run(data: &[u8]) {
    let mut w = World::new();
    crate::script(data, MAX_STEPS, |inp| w.step(inp));
    // Every retry and every time wait runs out (the wire is dropped: nothing more arrives).
    w.wire.clear();
    for _ in 0..200 {
        w.advance(1000 * MS);
        w.drain();
        w.wire.clear();
    }
    for (i, s) in w.sides.iter().enumerate() {
        assert!(
            s.agent.conn_count() <= MAX_CONNS,
            "side {i}: {} connections",
            s.agent.conn_count()
        );
    }
}
