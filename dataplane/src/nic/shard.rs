//! An RNIC spread over several workers (`worker.count`): one `Nic` per worker, each with its
//! own `Device` holding its own stripe of the QP numbers (`roce::engine::QpnStripe`), so a
//! frame's destination QP names the worker that owns it.
//!
//! The first shard owns the port: it takes every frame off the port's receive queue and
//! sends every frame on its transmit queue (the vdevs here have one queue of each), and it is
//! the RNIC's voice on the link: it answers ARP, ND and ping, announces the addresses, keeps
//! the receive buffer that sends PFC, captures and injects faults. A received RoCE frame whose
//! destination QP another shard owns is handed over whole (the mbuf, no copy) through that
//! shard's inbox; the ARP, ND and PFC/PAUSE frames it accepts are copied to every other
//! shard through their own queue, whose neighbour tables learn from them without answering
//! and whose engines honour the pauses (they are counted once, by the port's owner).
//! The other shards hand what they build to the port's owner through one outbox. A frame
//! to one of the RNIC's own GIDs goes straight to the inbox of the shard owning its QP.
//!
//! The queues are bounded lock-free queues (`crossbeam_queue::ArrayQueue`): a full inbox
//! drops the frame, counted (`rx_steer_dropped`), as a NIC's full receive queue does; a full
//! outbox leaves the frames with their builder, which retries as it does with a full
//! transmit queue.

use std::sync::Arc;

use crossbeam_queue::ArrayQueue;
use pmd_bindings::{Mbuf, Mempool, Port, RxQueue, TxQueue};
use roce::engine::QpnStripe;
use roce::wire::frame::{classify, dest_qpn, FrameKind};

use super::{Nic, BURST};
use crate::config::RnicConfig;

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
}

impl ShardLinks {
    fn new(count: usize) -> ShardLinks {
        ShardLinks {
            inbox: (0..count).map(|_| ArrayQueue::new(LINK_FRAMES)).collect(),
            copies: (0..count).map(|_| ArrayQueue::new(COPY_FRAMES)).collect(),
            outbox: ArrayQueue::new(LINK_FRAMES),
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
        let links = Arc::new(ShardLinks::new(count as usize));
        (0..count)
            .map(|index| {
                let shard = Shard {
                    index,
                    count,
                    links: links.clone(),
                };
                Nic::build(cfg.clone(), port.clone(), pool.clone(), Some(shard))
            })
            .collect()
    }

    /// Which shard of its RNIC this is and how many there are (`(0, 1)`: the only one).
    pub fn shard(&self) -> (u32, u32) {
        self.shard.as_ref().map_or((0, 1), |s| (s.index, s.count))
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

    /// The port's owner, for a frame it took off the port: a RoCE frame whose destination
    /// QP another shard owns goes to that shard's inbox (captured here first, the capture
    /// being the port's). Returns the frame if this shard handles it (a frame whose headers
    /// are not all in its first segment too: rare, and still verified here).
    pub(super) fn steer(&mut self, now: u64, m: Mbuf) -> Option<Mbuf> {
        let Some(sh) = self.shard.as_ref() else {
            return Some(m);
        };
        let Some(qpn) = dest_qpn(m.data()) else {
            return Some(m);
        };
        let owner = QpnStripe::owner(qpn, sh.count) as usize;
        if owner == sh.index as usize {
            return Some(m);
        }
        self.tap_mbuf(now, &m);
        let pushed = self
            .shard
            .as_ref()
            .is_some_and(|s| s.links.inbox[owner].push(m).is_ok());
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
        for q in &links.copies[1..] {
            self.copy_to(q, segs);
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
        match sh.links.inbox[owner as usize].push(m) {
            Ok(()) => self.counters.tx_loopback += 1,
            Err(_) => self.counters.tx_loopback_dropped += 1,
        }
        Ok(())
    }

    /// The port's owner sends what the other shards built (captured and through the fault
    /// injector, as its own frames are) and receives what they addressed to its QPs; the
    /// others learn from or obey the copies it made of control frames. Returns how many
    /// frames moved.
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
        if index != 0 {
            return work;
        }
        while work < 4 * BURST {
            let Some(mut m) = links.inbox[0].pop() else {
                break;
            };
            work += 1;
            if let Some(p) = self.rx_frame(now, &mut m) {
                self.hold_ud(now, p, m);
            }
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

/// Frames the port's owner keeps waiting for its transmit queue before it stops taking the
/// other shards' frames (they then wait in the outbox, and their builders behind it).
const MAX_FORWARD_BACKLOG: usize = 2 * BURST;
