//! An RNIC spread over several workers (`worker.count`): one `Nic` per worker, each with its
//! own `Device` holding its own stripe of the QP numbers (`roce::engine::QpnStripe`), so a
//! frame's destination QP names the worker that owns it.
//!
//! The first shard owns the port: it takes every frame off the port's receive queue and
//! sends every frame on its transmit queue (the vdevs here have one queue of each), and it is
//! the RNIC's voice on the link: it answers ARP, ND and ping, announces the addresses, keeps
//! the receive buffer that sends PFC, captures and injects faults. A received RoCE frame whose
//! destination QP another shard owns is handed over whole (the mbuf, no copy) through that
//! shard's inbox; ARP, ND and PFC/PAUSE frames are copied to every other shard, whose
//! neighbour tables learn from them without answering and whose engines honour the pauses.
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

/// The queues between the shards of one RNIC.
pub struct ShardLinks {
    /// Frames for each shard: received frames steered to it, copies of ARP, ND and pause
    /// frames, and frames other shards address to its QPs.
    inbox: Vec<ArrayQueue<Mbuf>>,
    /// Frames the shards other than the first hand to it for the port.
    outbox: ArrayQueue<Mbuf>,
}

impl ShardLinks {
    fn new(count: usize) -> ShardLinks {
        ShardLinks {
            inbox: (0..count).map(|_| ArrayQueue::new(LINK_FRAMES)).collect(),
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
            !s.links.inbox[s.index as usize].is_empty()
                || (s.index == 0 && !s.links.outbox.is_empty())
        })
    }

    /// The port's owner, for a frame it took off the port: a RoCE frame whose destination
    /// QP another shard owns goes to that shard's inbox (captured here first, the capture
    /// being the port's); ARP, ND and pause frames are copied to the other shards and also
    /// kept. Returns the frame if this shard handles it.
    pub(super) fn steer(&mut self, now: u64, m: Mbuf) -> Option<Mbuf> {
        let Some(sh) = self.shard.as_ref() else {
            return Some(m);
        };
        let kind = classify(m.data());
        match kind {
            FrameKind::Roce | FrameKind::Cnp => {
                // Headers past the first segment: handled here (the engine's steering
                // needs the BTH; such frames are rare and still verified).
                let Some(qpn) = dest_qpn(m.data()) else {
                    return Some(m);
                };
                let owner = QpnStripe::owner(qpn, sh.count);
                if owner == sh.index {
                    return Some(m);
                }
                let links = sh.links.clone();
                self.tap_mbuf(now, &m);
                match links.inbox[owner as usize].push(m) {
                    Ok(()) => self.counters.rx_steered += 1,
                    Err(_) => {
                        self.counters.rx_frames += 1;
                        self.counters.rx_steer_dropped += 1;
                    }
                }
                None
            }
            FrameKind::Arp | FrameKind::Pfc | FrameKind::Pause | FrameKind::Other => {
                if kind != FrameKind::Other || is_nd(m.data()) {
                    let links = sh.links.clone();
                    let me = sh.index as usize;
                    for (k, inbox) in links.inbox.iter().enumerate() {
                        if k != me {
                            self.copy_to(inbox, &m);
                        }
                    }
                }
                Some(m)
            }
        }
    }

    fn tap_mbuf(&mut self, now: u64, m: &Mbuf) {
        if let Some(t) = self.tap.as_mut() {
            t.write_mbuf(now, m);
        }
    }

    fn copy_to(&mut self, inbox: &ArrayQueue<Mbuf>, m: &Mbuf) {
        let Ok(mut c) = self.pool.alloc() else {
            self.counters.rx_steer_dropped += 1;
            return;
        };
        let mut ok = true;
        for s in m.segments() {
            ok &= c.extend_from_slice(s);
        }
        if !ok || inbox.push(c).is_err() {
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

    /// The port's owner: sends what the other shards built (captured and through the fault
    /// injector, as its own frames are), and receives what they addressed to its QPs;
    /// returns how many frames moved.
    pub(super) fn serve_shards(&mut self, now: u64) -> usize {
        let Some(sh) = self.shard.as_ref() else {
            return 0;
        };
        if sh.index != 0 {
            return 0;
        }
        let links = sh.links.clone();
        let mut work = 0;
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

    /// Whether a frame another shard copied here is one this shard only learns from
    /// (ARP, ND, pause): it is then not counted as received again.
    pub(super) fn is_copy(&self, kind: FrameKind) -> bool {
        self.shard.as_ref().is_some_and(|s| s.index > 0)
            && !matches!(kind, FrameKind::Roce | FrameKind::Cnp)
    }
}

/// Frames the port's owner keeps waiting for its transmit queue before it stops taking the
/// other shards' frames (they then wait in the outbox, and their builders behind it).
const MAX_FORWARD_BACKLOG: usize = 2 * BURST;

/// Whether a frame is IPv6 ICMP (neighbour discovery; ping too, which the other shards'
/// tables ignore without answering).
fn is_nd(f: &[u8]) -> bool {
    let Ok(eth) = roce::wire::ethernet::Frame::new_checked(f) else {
        return false;
    };
    let l3 = eth.header_len();
    eth.ethertype() == roce::wire::ethernet::ethertype::IPV6 && f.get(l3 + 6) == Some(&58)
}
