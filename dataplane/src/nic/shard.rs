//! An RNIC spread over several workers (`worker.count`): one `Nic` per worker, each with its
//! own `Device` holding its own stripe of the QP numbers (`roce::engine::QpnStripe`) and its
//! own CM agent handing out its own stripe of communication IDs, so a frame's destination QP
//! (for QP1, the connection or the listened service its MAD names) tells the worker that
//! owns it.
//!
//! Where the port has a queue pair per worker (`RnicConfig::port_queues`), shard k receives
//! and sends on queue k; a frame that arrives at a shard which does not own its destination
//! QP is handed over whole (the mbuf, no copy) through the owner's inbox. Where it has one,
//! the first shard receives everything and steers, and the other shards hand what they build
//! to it through one outbox. Either way the first shard is the RNIC's voice on the link: it
//! answers ARP, ND and ping (other shards pass such frames to it), announces the addresses,
//! keeps the receive buffer that sends PFC, captures and injects faults (with any of the last
//! three the port has one queue, so that it sees every frame). The ARP, ND and PFC/PAUSE
//! frames it accepts are copied to every other shard through a queue of their own: their
//! neighbour tables learn from them without answering and their engines honour the pauses
//! (counted once, by the first shard). A frame to one of the RNIC's own GIDs goes straight to
//! the inbox of the shard owning its QP.
//!
//! The queues are bounded lock-free queues (`crossbeam_queue::ArrayQueue`): a full inbox
//! drops the frame, counted (`rx_steer_dropped`), as a NIC's full receive queue does; a full
//! outbox leaves the frames with their builder, which retries as it does with a full
//! transmit queue.

use std::collections::VecDeque;
use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use pmd_bindings::{Mbuf, Mempool, Port, RxQueue, TxQueue};
use roce::engine::QpnStripe;
use roce::wire::frame::{classify, dest_qpn, FrameKind};

use super::spread::{Deferred, ToHome, ToSatellite};
use super::{Nic, BURST};
use crate::config::RnicConfig;
use crate::doorbell::Doorbell;
use crate::host::ServiceMap;
use ferroce_host::abi::ring::WaitWord;
use ferroce_host::abi::slots::PostBuf;
use roce::cm::{comm_id_owner, mad_route, MadRoute};
use roce::types::Qpn;
use roce::wire::frame::gsi_mad;

/// Frames an inbox or the outbox holds at most.
const LINK_FRAMES: usize = 4096;
/// Copies of control frames a shard's copy queue holds at most.
const COPY_FRAMES: usize = 256;

/// The queues between the shards of one RNIC.
pub struct ShardLinks {
    /// Frames for each shard: received frames steered to it and frames other shards
    /// address to its QPs.
    inbox: Vec<ArrayQueue<Mbuf>>,
    /// Copies of the ARP, ND and pause frames the port's owner accepted, for each shard.
    copies: Vec<ArrayQueue<Mbuf>>,
    /// Frames the shards other than the first hand to it for the port.
    outbox: ArrayQueue<Mbuf>,
    /// Which shard listens to each service (the port's owner steers REQs by it).
    pub(super) services: ServiceMap,
    /// Each shard's doorbell, rung when frames are queued for it while it sleeps.
    bells: Vec<Doorbell>,
    /// Contexts spread over the shards (`worker.spread`): from the home (the first shard)
    /// to each other shard, in program order (`spread.rs`).
    pub(super) to_sat: Vec<ArrayQueue<ToSatellite>>,
    /// And from every other shard to the home.
    pub(super) to_home: ArrayQueue<ToHome>,
    /// Post buffers the satellites applied, back for the home to decode into (a forwarded
    /// post allocates nothing once they circulate).
    pub(super) spare_posts: ArrayQueue<Box<PostBuf>>,
}

impl ShardLinks {
    fn new(count: usize, spread: Option<u32>) -> ShardLinks {
        // Without spread contexts the queues stay empty: one slot each.
        let msgs = spread.map_or(1, |q| q.max(1) as usize);
        ShardLinks {
            to_sat: (0..count).map(|_| ArrayQueue::new(msgs)).collect(),
            to_home: ArrayQueue::new(msgs),
            spare_posts: ArrayQueue::new(msgs),
            inbox: (0..count).map(|_| ArrayQueue::new(LINK_FRAMES)).collect(),
            copies: (0..count).map(|_| ArrayQueue::new(COPY_FRAMES)).collect(),
            outbox: ArrayQueue::new(LINK_FRAMES),
            services: ServiceMap::default(),
            bells: (0..count).map(|_| Doorbell::default()).collect(),
        }
    }
}

/// A `Nic`'s place among the shards of its RNIC.
pub(super) struct Shard {
    /// Its index (0 owns the port).
    pub index: u32,
    /// How many shards the RNIC has.
    pub count: u32,
    /// The queues between them.
    pub links: Arc<ShardLinks>,
    /// Shards this one queued frames for in the current iteration (a bit each), whose
    /// doorbells it rings at the end of it: once per iteration, not per frame.
    pub due: u64,
    /// Whether one context's QPs spread over the shards (`worker.spread`).
    pub spread: bool,
    /// Messages for each satellite shard its queue had no room for, in order.
    pub out_sat: Vec<VecDeque<ToSatellite>>,
    /// Messages for the home its queue had no room for, in order.
    pub out_home: VecDeque<ToHome>,
    /// The home: spread contexts' calls waiting for the posts before them.
    pub deferred: VecDeque<Deferred>,
}

/// Where a `Nic`'s frames come from and go.
pub(super) enum Wire {
    /// The port's own queues.
    Port { rxq: RxQueue, txq: TxQueue },
    /// A shard other than the first: its inbox (by index) and the shared outbox.
    Shard(Arc<ShardLinks>, usize),
}

impl Wire {
    /// Takes up to `max` frames into `out`; returns how many.
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        match self {
            Wire::Port { rxq, .. } => rxq.rx_burst_max(out, max),
            Wire::Shard(links, i) => {
                let room = max.min(out.capacity() - out.len());
                let mut n = 0;
                while n < room {
                    let Some(m) = links.inbox[*i].pop() else {
                        break;
                    };
                    out.push(m);
                    n += 1;
                }
                n
            }
        }
    }

    /// Sends frames from the front of `pkts`; what was not taken stays, in order.
    pub fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        match self {
            Wire::Port { txq, .. } => txq.tx_burst(pkts),
            Wire::Shard(links, _) => {
                let mut sent = 0;
                // Past the first frame the outbox refuses, the rest stay, in order (an
                // allocation only then).
                let mut back: Option<Vec<Mbuf>> = None;
                for m in pkts.drain(..) {
                    match &mut back {
                        Some(b) => b.push(m),
                        None => match links.outbox.push(m) {
                            Ok(()) => sent += 1,
                            Err(m) => back = Some(vec![m]),
                        },
                    }
                }
                if let Some(b) = back {
                    pkts.extend(b);
                }
                if sent > 0 {
                    links.bells[0].ring();
                }
                sent
            }
        }
    }
}

impl Nic {
    /// One RNIC on `port` spread over `count` workers: a `Nic` for each (see the module
    /// documentation), the first owning the port. `count` 1 is [`Nic::new`].
    pub fn sharded(
        cfg: RnicConfig,
        port: Port,
        pool: Arc<Mempool>,
        count: u32,
    ) -> Result<Vec<Nic>, String> {
        if count <= 1 {
            return Ok(vec![Nic::new(cfg, port, pool)?]);
        }
        let spread = cfg.worker_spread;
        let queue = spread.then_some(cfg.spread_queue);
        let links = Arc::new(ShardLinks::new(count as usize, queue));
        (0..count)
            .map(|index| {
                let shard = Shard {
                    index,
                    count,
                    links: links.clone(),
                    due: 0,
                    spread,
                    out_sat: (0..count).map(|_| VecDeque::new()).collect(),
                    out_home: VecDeque::new(),
                    deferred: VecDeque::new(),
                };
                Nic::build(cfg.clone(), port.clone(), pool.clone(), Some(shard))
            })
            .collect()
    }

    /// Which shard of its RNIC this is and how many there are (`(0, 1)`: the only one).
    pub fn shard(&self) -> (u32, u32) {
        self.shard.as_ref().map_or((0, 1), |s| (s.index, s.count))
    }

    /// Before the worker sleeps: this shard's doorbell, armed (frames queued for it from now
    /// on wake it).
    pub(super) fn arm_links(&self, out: &mut Vec<WaitWord>) {
        if let Some(s) = &self.shard {
            out.push(s.links.bells[s.index as usize].arm());
        }
    }

    /// At the end of an iteration: rings the doorbells of the shards it queued frames for,
    /// and clears its own (it is awake).
    pub(super) fn ring_shards(&mut self) {
        let Some(s) = self.shard.as_mut() else {
            return;
        };
        s.links.bells[s.index as usize].disarm();
        let mut due = std::mem::take(&mut s.due);
        while due != 0 {
            let k = due.trailing_zeros() as usize;
            due &= due - 1;
            s.links.bells[k].ring();
        }
    }

    /// Whether frames wait in this shard's inbox or (the port's owner) in the outbox.
    pub(super) fn links_busy(&self) -> bool {
        self.shard.as_ref().is_some_and(|s| {
            let i = s.index as usize;
            !s.links.inbox[i].is_empty()
                || !s.links.copies[i].is_empty()
                || (i == 0 && !s.links.outbox.is_empty())
        })
    }

    /// A shard with a queue of the port, for a frame it took off it: a RoCE frame whose
    /// destination QP another shard owns (a CM message: whose connection or listener,
    /// `gsi_owner`) goes to that shard's inbox, and anything else that is not RoCE to the
    /// port's owner, which answers and copies it (captured first where it arrived, the capture
    /// being the port's). Returns the frame if this shard handles it.
    pub(super) fn steer(&mut self, now: u64, m: Mbuf) -> Option<Mbuf> {
        let Some(sh) = self.shard.as_ref() else {
            return Some(m);
        };
        // A shard without a queue receives from its inbox: steered there already.
        if matches!(self.wire, Wire::Shard(..)) {
            return Some(m);
        }
        let owner = match dest_qpn(m.data()) {
            Some(GSI) => gsi_owner(&sh.links, sh.count, m.data()),
            Some(qpn) => QpnStripe::owner(qpn, sh.count),
            // Not RoCE (or headers past the first segment: rare, verified there).
            None => 0,
        } as usize;
        if owner == sh.index as usize {
            return Some(m);
        }
        self.tap_mbuf(now, &m);
        let pushed = self.shard.as_mut().is_some_and(|s| {
            s.due |= 1 << owner;
            s.links.inbox[owner].push(m).is_ok()
        });
        if pushed {
            self.counters.rx_steered += 1;
        } else {
            self.counters.rx_frames += 1;
            self.counters.rx_steer_dropped += 1;
        }
        None
    }

    /// The port's owner: copies an ARP, ND or pause frame it accepted to every other shard.
    pub(super) fn copy_to_shards(&mut self, segs: &[&[u8]]) {
        let Some(links) = self
            .shard
            .as_ref()
            .filter(|s| s.index == 0)
            .map(|s| s.links.clone())
        else {
            return;
        };
        for (q, bell) in links.copies.iter().zip(&links.bells).skip(1) {
            self.copy_to(q, segs);
            bell.ring();
        }
    }

    /// Captures a frame in an mbuf, if the capture is on.
    pub(super) fn tap_mbuf(&mut self, now: u64, m: &Mbuf) {
        if let Some(t) = self.tap.as_mut() {
            t.write_mbuf(now, m);
        }
    }

    fn copy_to(&mut self, q: &ArrayQueue<Mbuf>, segs: &[&[u8]]) {
        let Ok(mut c) = self.pool.alloc() else {
            self.counters.rx_steer_dropped += 1;
            return;
        };
        let mut ok = true;
        for s in segs {
            ok &= c.extend_from_slice(s);
        }
        if !ok || q.push(c).is_err() {
            self.counters.rx_steer_dropped += 1;
        }
    }

    /// A frame this shard built for one of the RNIC's own GIDs: to the inbox of the shard
    /// owning its destination QP, or `Err` with the frame if that is this one.
    pub(super) fn loop_to_shard(&mut self, m: Mbuf) -> Result<(), Mbuf> {
        let Some(sh) = self.shard.as_ref() else {
            return Err(m);
        };
        let owner = QpnStripe::owner(self.tx.transport.bth.dest_qp, sh.count);
        if owner == sh.index {
            return Err(m);
        }
        let sh = self.shard.as_mut().expect("checked above");
        sh.due |= 1 << owner;
        match sh.links.inbox[owner as usize].push(m) {
            Ok(()) => self.counters.tx_loopback += 1,
            Err(_) => self.counters.tx_loopback_dropped += 1,
        }
        Ok(())
    }

    /// Every shard learns from or obeys the copies the port's owner made of control frames,
    /// and (with a queue of the port) receives what other shards steered to it; the port's
    /// owner also sends what shards without a queue built (captured and through the fault
    /// injector, as its own frames are). Returns how many frames moved.
    pub(super) fn serve_shards(&mut self, now: u64) -> usize {
        if !self.links_busy() {
            return 0;
        }
        let Some(sh) = self.shard.as_ref() else {
            return 0;
        };
        let (index, links) = (sh.index as usize, sh.links.clone());
        let mut work = 0;
        while let Some(c) = links.copies[index].pop() {
            work += 1;
            let d = c.data();
            match classify(d) {
                FrameKind::Pfc | FrameKind::Pause => self.pause_frame(now, d),
                _ => {
                    self.neigh.handle_frame(now, d);
                }
            }
        }
        // What other shards steered here, on a shard with a queue of its own (one without
        // takes its inbox as its receive queue).
        let own_queue = matches!(self.wire, Wire::Port { .. });
        while own_queue && work < 4 * BURST {
            let Some(mut m) = links.inbox[index].pop() else {
                break;
            };
            work += 1;
            if let Some(p) = self.rx_frame(now, &mut m) {
                self.hold_ud(now, p, m);
            }
        }
        if index != 0 {
            return work;
        }
        let mut sent = 0;
        while sent < 4 * BURST && self.txbuf.len() < MAX_FORWARD_BACKLOG {
            let Some(m) = links.outbox.pop() else {
                break;
            };
            sent += 1;
            self.tap_mbuf(now, &m);
            self.counters.tx_forwarded += 1;
            self.push_tx(now, m);
        }
        self.flush();
        work + sent
    }
}

/// QP1, the general services interface: the connection manager's MADs.
const GSI: Qpn = Qpn::new(1);

/// The shard whose connection manager a frame to QP1 is for: a REQ or SIDR_REQ goes to the
/// shard listening to its service, any other CM message to the shard whose agent handed out
/// the communication ID it names (`CmConfig::id_stripe`); the rest (a request nobody listens
/// to, which that agent holds a while and then rejects, and what is not a CM message) to the
/// first.
fn gsi_owner(links: &ShardLinks, count: u32, frame: &[u8]) -> u32 {
    match gsi_mad(frame).and_then(mad_route) {
        Some(MadRoute::Conn(id)) => comm_id_owner(id, count),
        Some(MadRoute::Service(sid)) => {
            let m = links.services.lock().unwrap_or_else(|e| e.into_inner());
            m.get(&sid).copied().unwrap_or(0)
        }
        None => 0,
    }
}

/// Frames the port's owner keeps waiting for its transmit queue before it stops taking the
/// other shards' frames (they then wait in the outbox, and their builders behind it).
const MAX_FORWARD_BACKLOG: usize = 2 * BURST;
