//! One software RNIC on one DPDK port: receive, classify, drive the engine, build frames, send.
//!
//! Owned by exactly one worker lcore (no locks on this path). Per iteration:
//! 1. verbs commands from the applications' rings (before the burst: posted receive WRs are
//!    there for the packets that arrive, as after a doorbell);
//! 2. `rx_burst` into the receive buffer (per-priority occupancy, PFC/PAUSE sent from it;
//!    received PFC/PAUSE acted on at once), then classification of what the buffer releases:
//!    RoCEv2 to the engine (segments passed in place), ARP / ICMP / IPv6 ND to the neighbour
//!    layer, IPv4 fragments and everything else counted and dropped; first of all, the
//!    packets this port sent to its own GIDs last iteration (internal loopback);
//! 3. timers (engine and neighbours);
//! 4. transmit: engine output built straight into mbufs (headers, payload gathered from the
//!    registered memory, ICRC once), waiting (bounded) while the peer's MAC is resolved;
//! 5. completions and events to the applications' rings.

use std::collections::VecDeque;
use std::io::BufWriter;
use std::net::IpAddr;
use std::sync::Arc;

use pmd_bindings::{Mbuf, Mempool, Port};
use roce::engine::transmit::Path;
use roce::engine::{CreditMode, Device, DeviceConfig, DeviceEvent, EmitError, Transmit};
use roce::pcap;
use roce::table::Table;
use roce::types::Gid;
use roce::wire::ethernet::{self, ethertype, VlanTag};
use roce::wire::frame::{
    classify, parse_in_place_into, parse_segments, FrameKind, HeaderTemplate, ParsedFrame,
};
use roce::wire::opcode::Opcode;

use crate::config::RnicConfig;
use crate::fault::Faults;
use crate::host::{HostEnd, Owners};

mod serve;
mod shard;
mod spread;
use crate::neighbor::{Neighbors, Resolve};
use dcb::pfc::{Ingress, PauseFrame, PauseState, StormAction, StormEvent, Watchdog};
use ferroce_host::abi::{Command, HostLimits, ReplyData};
use roce::engine::{VerbsError, VerbsResult};
pub use shard::ShardLinks;
use shard::{Shard, Wire};

/// The group address of MAC control frames (PAUSE, PFC; IEEE 802.3 Annex 31B).
const MAC_CONTROL_GROUP: [u8; 6] = [0x01, 0x80, 0xc2, 0x00, 0x00, 0x01];

/// Frames per burst.
pub const BURST: usize = 32;
/// Frames held while their next hop is being resolved.
const MAX_PENDING: usize = 256;
/// Transmit frames kept for a retry when the queue is full, at most.
const MAX_TX_BACKLOG: usize = 1024;
/// Engine packets produced per iteration at most (fairness with receive).
const TX_BUDGET: usize = 64;
/// Receive bursts per iteration at most (`RX_BURSTS * BURST` > `TX_BUDGET`).
const RX_BURSTS: usize = 4;
/// Internal-loopback frames waiting for the next receive phase, at most (a bound that one
/// iteration's transmit budget cannot reach; the surplus would be a counted drop).
const MAX_LOOPBACK: usize = 4 * TX_BUDGET;
/// Bursts taken into the receive buffer per iteration at most while it sends PFC: twice
/// what one iteration hands on, so a backlog shows in the buffer, where it is counted per
/// priority, rather than in the port's queue.
const DRAIN_BURSTS: usize = 2 * RX_BURSTS;

roce::counters!(
    /// Port-level counters of one RNIC.
    NicCounters {
        /// Frames received.
        rx_frames,
        /// RoCEv2 frames handed to the engine (CNPs included).
        rx_roce,
        /// ARP frames.
        rx_arp,
        /// ICMP / ICMPv6 (incl. ND) frames for the neighbour layer.
        rx_icmp,
        /// PFC frames received.
        rx_pfc,
        /// Link-level PAUSE frames received.
        rx_pause,
        /// PFC/PAUSE frames not honoured: flow control off, or the other kind than `pfc.mode`.
        rx_pause_ignored,
        /// MAC control frames that did not decode.
        rx_pause_malformed,
        /// PFC storms detected by the watchdog.
        pfc_storms_detected,
        /// PFC storms over.
        pfc_storms_restored,
        /// Frames discarded because their priority is stormed (`pfc.watchdog_action = drop`).
        tx_storm_dropped,
        /// Priorities whose PFC the port's hardware does itself (0 on virtual devices).
        pfc_hw_priorities,
        /// PFC frames sent (XOFF, their refreshes, and XON), from the receive buffer.
        tx_pfc,
        /// PAUSE frames sent (`pfc.mode = pause`).
        tx_pause,
        /// Frames dropped because their priority's receive buffer was full (a lossy
        /// priority's, or a lossless one's past its headroom: the peer did not stop).
        rx_buffer_discards,
        /// Most bytes one priority held in the receive buffer (mbuf memory).
        rx_buffer_peak,
        /// IPv4 fragments (never RoCE).
        rx_ipv4_fragments,
        /// Anything else, dropped.
        rx_other,
        /// Frames to a destination MAC that is not ours (another station's unicast, a group we
        /// did not join, broadcast other than ARP), dropped.
        rx_dropped_mac,
        /// Frames on a VLAN that is not ours (or untagged on a VLAN port), dropped.
        rx_dropped_vlan,
        /// Frames too short for an Ethernet header.
        rx_runts,
        /// UD messages that found no receive WQE and waited for one.
        rx_ud_held,
        /// Of those, the ones whose wait ran out (then dropped by the engine, counted there).
        rx_ud_hold_expired,
        /// Frames received in more than one segment.
        rx_multiseg,
        /// Frames sent.
        tx_frames,
        /// Bytes sent.
        tx_bytes,
        /// RoCE packets built.
        tx_roce,
        /// Neighbour-layer frames sent.
        tx_neighbor,
        /// Frames held for address resolution.
        tx_held,
        /// Held frames dropped (queue full or peer unreachable).
        tx_held_dropped,
        /// Packets whose destination could not be resolved.
        tx_unresolved,
        /// QPs failed because their peer could not be resolved.
        qps_failed_unresolved,
        /// Mbuf allocation failures.
        tx_nombuf,
        /// Frames the transmit queue refused and were retried later.
        tx_retried,
        /// Frames dropped because the transmit backlog was full.
        tx_dropped,
        /// RoCE packets to one of this port's own GIDs, delivered to its own receive path
        /// (internal loopback) instead of the wire.
        tx_loopback,
        /// Loopback packets dropped because the loopback queue was full.
        tx_loopback_dropped,
        /// Received RoCE frames the port's owner handed to the worker that owns their
        /// destination QP (an RNIC spread over several workers, `worker.count`).
        rx_steered,
        /// Frames dropped on the way to another worker of the RNIC: its inbox was full, or
        /// (a copy of an ARP, ND or pause frame) its copy queue was full or no mbuf was free.
        rx_steer_dropped,
        /// Frames other workers of the RNIC built, sent by the port's owner.
        tx_forwarded,
        /// Completions of a context spread over several workers (`worker.spread`) that came
        /// home for a CQ or context already gone, dropped.
        spread_dropped,
        /// Faults injected: lost.
        fault_lost,
        /// Faults injected: duplicated.
        fault_duplicated,
        /// Faults injected: corrupted.
        fault_corrupted,
        /// Faults injected: reordered.
        fault_reordered,
        /// Faults injected: ECN-capable frames sent with CE set.
        fault_ce_marked,
        /// Faults injected: frames held `fault.delay_us` before they left.
        fault_delayed,
        /// Frames dropped because the delay line was full.
        fault_delay_dropped,
    }
);

/// How close an engine deadline must be for the worker to keep polling rather than back off
/// (its idle sleep is 100 us by default).
const DEADLINE_SPIN_NS: u64 = 100_000;

/// A QP's last resolved next hop, valid while the neighbour table's generation is `gen`.
#[derive(Clone, Copy)]
struct NextHop {
    dgid: Gid,
    mac: [u8; 6],
    gen: u64,
}

/// A QP's header template (Ethernet, IP, UDP) and what it was built from: used while the
/// packet's path, source and destination MACs and VLAN tag are the same (a connected QP's
/// always are, until it is modified or its next hop moves; a UD QP's while it sends to one
/// address).
struct CachedTemplate {
    key: TemplateKey,
    tmpl: HeaderTemplate,
}

/// What a header template is built from, besides the transport headers.
#[derive(Clone, Copy, PartialEq, Eq)]
struct TemplateKey {
    path: Path,
    src: [u8; 6],
    dst: [u8; 6],
    vlan: Option<VlanTag>,
}

impl NextHop {
    const NONE: NextHop = NextHop {
        dgid: Gid([0; 16]),
        mac: [0; 6],
        gen: u64::MAX,
    };
}

/// The capture file of a port (an RNIC's, or the emulated switch's egress).
pub(crate) struct Tap {
    w: pcap::Writer<BufWriter<std::fs::File>>,
    /// Capturing now (switchable while running).
    on: bool,
    /// Wall-clock ns minus the worker's clock, fixed at the first frame: timestamps are the
    /// time of day (captures merge with a host's tcpdump, e.g. with mergecap) and still
    /// never go backwards.
    wall_offset: Option<u64>,
}

impl Tap {
    /// A capture into `path`, keeping `snaplen` bytes of each frame; `what` names the setting
    /// in errors.
    pub(crate) fn create(
        path: &std::path::Path,
        snaplen: u32,
        on: bool,
        what: &str,
    ) -> Result<Tap, String> {
        let f =
            std::fs::File::create(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
        Ok(Tap {
            w: pcap::Writer::with_snaplen(BufWriter::new(f), snaplen).map_err(|e| e.to_string())?,
            on,
            wall_offset: None,
        })
    }

    fn write(&mut self, now: u64, segs: &[&[u8]]) {
        if !self.on {
            return;
        }
        let off = *self.wall_offset.get_or_insert_with(|| {
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            wall.saturating_sub(now)
        });
        let _ = self.w.write_segments(now + off, segs);
    }

    /// Captures a frame from its mbuf's segments in place (a copy only past 8 segments).
    pub(crate) fn write_mbuf(&mut self, now: u64, m: &Mbuf) {
        if !self.on {
            return;
        }
        let mut segs: [&[u8]; 8] = [&[]; 8];
        let mut n = 0;
        for s in m.segments() {
            if n == segs.len() {
                let v = m.to_vec();
                return self.write(now, &[&v]);
            }
            segs[n] = s;
            n += 1;
        }
        self.write(now, &segs[..n]);
    }
}

/// Frames taken off the receive queue and not yet handled: the RNIC's receive buffer. With
/// PFC or PAUSE on (and not done by the port's hardware), its occupancy per priority sends
/// XOFF and XON to the link partner, as a NIC's port buffer does; without, it holds no more
/// than one iteration hands on, and a backlog stays in the port's queue.
struct RxBuffer {
    /// (priority, bytes charged, frame) in arrival order: frames are handled in the order
    /// they came, whatever their priority (each QP's packets are in one priority).
    frames: VecDeque<(u8, u32, Mbuf)>,
    /// Occupancy and the pause frames it calls for (None: not sending PFC).
    ingress: Option<Ingress>,
    /// Most frames held at once (a bound on the mbufs held, below the pool's size).
    max_frames: usize,
    /// `fault.rx_pps`: frames that may be handled now (whole and 1e9ths), and when it was
    /// last refilled.
    tokens: u64,
    tokens_at: u64,
}

/// A UD message waiting for a receive WQE ([`Nic`]'s `wants_hold`), parsed when it arrived.
struct HeldUd {
    since: u64,
    qpn: roce::types::Qpn,
    parsed: ParsedFrame,
    mbuf: Mbuf,
}

/// A frame waiting for its next hop's address (`Nic::pending`).
struct Held {
    gid: Gid,
    /// Its priority: a frame of a paused priority is not released when the address comes,
    /// but when the pause ends.
    prio: u8,
    /// The engine was told the address is known (`DeviceEvent::PathKnown`) while the frame
    /// waits for a pause: told once, not on every retry.
    known: bool,
    m: Mbuf,
}

/// A software RNIC on one port.
pub struct Nic {
    /// Port name.
    pub name: String,
    _port: Port,
    /// Where frames come from and go: the port's queues, or the port owner's rings.
    wire: Wire,
    /// Its place in an RNIC spread over several workers (`None`: the RNIC's only one).
    shard: Option<Shard>,
    pool: Arc<Mempool>,
    /// The transport engine.
    pub dev: Device,
    /// ARP / ND.
    pub neigh: Neighbors,
    cfg: RnicConfig,
    mac: [u8; 6],
    vlan: Option<VlanTag>,
    /// Attached application contexts (by host id; `None` once closed).
    hosts: Table<HostEnd>,
    /// The time of the current (or last) iteration: control calls between iterations act
    /// at it (the connection manager's timers start from it).
    now: u64,
    /// Which host owns each QP, CQ and SRQ.
    owners: Owners,
    /// What moved in the engine this iteration (reused, no allocation).
    moved_qps: Vec<roce::types::Qpn>,
    moved_srqs: Vec<roce::engine::SrqId>,
    ready_cqs: Vec<roce::engine::CqId>,
    /// Next hop per QP (by `Device::qp_index`).
    hops: Vec<NextHop>,
    /// Header template per QP (by `Device::qp_index`), made by the QP's first packet.
    templates: Vec<Option<Box<CachedTemplate>>>,
    /// Frames waiting for their next hop's address.
    pending: VecDeque<Held>,
    /// Packets to our own GIDs, received at the start of the next receive phase.
    loopback: VecDeque<Mbuf>,
    /// UD messages waiting for a receive WQE: (arrival time, QP, frame), in arrival order.
    held_rx: VecDeque<HeldUd>,
    rxbuf: Vec<Mbuf>,
    rx: RxBuffer,
    txbuf: Vec<Mbuf>,
    tx: Transmit,
    ident: u16,
    tap: Option<Tap>,
    fault: Option<Faults>,
    /// Flow control from the link partner: what it paused, and the storm watchdog.
    pause: PauseState,
    watchdog: Option<Watchdog>,
    storm_events: Vec<StormEvent>,
    scratch: Vec<u8>,
    /// The buffer clients' posts are decoded into (`serve_posts`), kept between batches.
    post_buf: Option<Box<ferroce_host::abi::slots::PostBuf>>,
    /// The headers of the frame being received (`rx_frame`), kept between frames.
    rx_parsed: Option<Box<ParsedFrame>>,
    /// Counters.
    pub counters: NicCounters,
}

impl Nic {
    /// An RNIC on `port` (started, with rx/tx queue 0 free), using `pool` for transmit mbufs.
    pub fn new(cfg: RnicConfig, port: Port, pool: Arc<Mempool>) -> Result<Nic, String> {
        Self::build(cfg, port, pool, None)
    }

    fn build(
        cfg: RnicConfig,
        port: Port,
        pool: Arc<Mempool>,
        shard: Option<Shard>,
    ) -> Result<Nic, String> {
        let mut mac = port
            .mac_addr()
            .map_err(|e| format!("{}: {e}", port.name()))?;
        if let Some(m) = cfg.mac {
            // Virtual ports may not support changing the MAC; ours is then a software MAC and
            // the port runs promiscuous.
            let _ = port.set_mac_addr(m);
            mac = m;
        }
        // Queue k of the port is shard k's where the port has one for it (port_queues); a
        // shard without goes through the port's owner.
        let q = shard.as_ref().map_or(0, |s| s.index as u16);
        let wire = match &shard {
            Some(sh) if q >= port.rx_queue_count().min(port.tx_queue_count()) => {
                Wire::Shard(sh.links.clone(), sh.index as usize)
            }
            _ => Wire::Port {
                rxq: port.rx_queue(q).map_err(|e| e.to_string())?,
                txq: port.tx_queue(q).map_err(|e| e.to_string())?,
            },
        };
        // The port's owner is the RNIC's voice on the link: the others capture nothing,
        // inject no fault, keep no receive buffer and answer no neighbour (see `shard`).
        let owner = shard.as_ref().is_none_or(|s| s.index == 0);
        let gids = cfg.gids(mac);
        let dev = Device::new(DeviceConfig {
            gids,
            port_mtu: cfg.path_mtu,
            credits: if cfg.credits_from_rq {
                CreditMode::FromReceiveQueue
            } else {
                CreditMode::Unlimited
            },
            coalesce_acks: cfg.ack_coalescing,
            limits: roce::engine::DeviceLimits {
                max_qp: cfg.max_qp,
                ..Default::default()
            },
            qpn_stripe: shard.as_ref().map_or(roce::engine::QpnStripe::ALL, |s| {
                roce::engine::QpnStripe {
                    index: s.index,
                    count: s.count,
                }
            }),
            max_unacked_psns: cfg.send_window,
            ack_every: cfg.ack_every,
            cc: cfg.dcqcn,
            ets: cfg.ets,
            priorities: roce::engine::PriorityMap {
                trust: cfg.trust,
                default_pcp: cfg.pcp,
                default_dscp: cfg.dscp,
            },
            node_guid: roce::types::eui64(mac),
        });
        let max_qp = dev.config().limits.max_qp as usize;
        let hold_frames = cfg.ud_rx_hold_frames as usize;
        let limits = HostLimits::of(dev.config());
        let mut owners = Owners::new(limits);
        owners.services = shard.as_ref().map(|s| (s.links.services.clone(), s.index));
        let mut neigh = Neighbors::new(mac, &cfg);
        if owner {
            neigh.announce();
        } else {
            neigh.set_learn_only();
        }
        let tap = match &cfg.pcap {
            Some(p) if owner => Some(Tap::create(
                p,
                cfg.snaplen,
                cfg.capture_enabled,
                "capture.pcap",
            )?),
            _ => None,
        };
        let fault = (owner && cfg.fault.any()).then(|| Faults::new(cfg.fault));
        let vlan = cfg.vlan.map(|vid| VlanTag {
            pcp: cfg.pcp,
            dei: false,
            vid,
        });
        let pause = PauseState::new(cfg.pfc.mode, cfg.speed_gbps.max(1) as u64 * 1000);
        let pfc_hw = hardware_pfc(&port, &cfg);
        let rx = RxBuffer {
            frames: VecDeque::with_capacity(2 * RX_BURSTS * BURST),
            // A port whose hardware does PFC sends it from its own buffer, which only it
            // sees; the software buffer then only feeds the engine.
            ingress: (owner && cfg.pfc.mode != dcb::pfc::Mode::Off && pfc_hw == 0)
                .then(|| rx_ingress(&cfg, cfg.speed_gbps.max(1) as u64 * 1000)),
            max_frames: (cfg.mbufs as usize / 4).max(RX_BURSTS * BURST),
            tokens: 0,
            tokens_at: 0,
        };
        let watchdog = cfg.pfc.watchdog.map(|w| {
            Watchdog::new(
                w.detect_ms as u64 * 1_000_000,
                w.restore_ms as u64 * 1_000_000,
                w.action,
            )
        });
        tracing::info!("rnic {}", cfg.summary(mac));
        let counters = NicCounters {
            pfc_hw_priorities: pfc_hw as u64,
            ..Default::default()
        };
        Ok(Nic {
            name: port.name().to_string(),
            _port: port,
            wire,
            shard,
            pool,
            dev,
            neigh,
            cfg,
            mac,
            vlan,
            hosts: Table::dense(crate::host::MAX_HOST_IDS),
            now: 0,
            owners,
            moved_qps: Vec::with_capacity(64),
            moved_srqs: Vec::with_capacity(16),
            ready_cqs: Vec::with_capacity(16),
            hops: vec![NextHop::NONE; max_qp],
            templates: std::iter::repeat_with(|| None).take(max_qp).collect(),
            pending: VecDeque::with_capacity(MAX_PENDING),
            loopback: VecDeque::with_capacity(MAX_LOOPBACK),
            held_rx: VecDeque::with_capacity(hold_frames),
            rxbuf: Vec::with_capacity(BURST),
            rx,
            txbuf: Vec::with_capacity(MAX_TX_BACKLOG + BURST),
            tx: Transmit::default(),
            ident: 0,
            tap,
            fault,
            pause,
            watchdog,
            storm_events: Vec::new(),
            scratch: Vec::with_capacity(16384),
            post_buf: None,
            rx_parsed: None,
            counters,
        })
    }

    /// When this RNIC next has timed work, for a worker about to sleep longer than its base
    /// idle sleep ([`crate::worker::idle_sleep_us`]): the engine's timers (ACK, RNR,
    /// pacing, the connection manager's) and the neighbour table's (retries, ageing).
    /// `Some(now)` while anything else runs on real time - frames held for an address or for
    /// a receive WQE, injected faults (the delay line, the receive rate), PFC (pauses
    /// received or sent) - which keeps the base sleep; `None` with nothing timed at all.
    pub fn sleep_deadline(&mut self, now: u64) -> Option<u64> {
        if !self.held_rx.is_empty()
            || !self.pending.is_empty()
            || self.fault.is_some()
            || self.rx.ingress.is_some()
            || self.dev.paused() != 0
        {
            return Some(now);
        }
        match (self.dev.poll_timeout(), self.neigh.poll_timeout()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Before the worker sleeps: arms every client's post ring and adds the words to wait on
    /// to `out`; returns whether work is already waiting (posts, or received frames not yet
    /// handled), so the worker must not sleep.
    pub fn prepare_sleep(&self, out: &mut Vec<ferroce_host::abi::ring::WaitWord>) -> bool {
        // Armed before the look at the queues between shards (`Doorbell`).
        self.arm_links(out);
        let mut busy = !self.rx.frames.is_empty()
            || !self.loopback.is_empty()
            || self.links_busy()
            || self.spread_busy();
        for h in self.hosts.values() {
            busy |= h.prepare_sleep(out);
        }
        busy
    }

    /// The port's counters, the fault injector's included.
    pub fn counters(&self) -> NicCounters {
        let mut c = self.counters;
        if let Some(f) = &self.fault {
            let k = f.counters;
            c.fault_lost = k.lost;
            c.fault_duplicated = k.duplicated;
            c.fault_corrupted = k.corrupted;
            c.fault_reordered = k.reordered;
            c.fault_ce_marked = k.ce_marked;
            c.fault_delayed = k.delayed;
            c.fault_delay_dropped = k.delay_dropped;
        }
        c
    }

    /// The MAC address in use.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The configuration.
    pub fn config(&self) -> &RnicConfig {
        &self.cfg
    }

    /// Executes a control call of the client `token`; a client that is no longer attached
    /// gets `DeviceFatal`.
    pub fn call(
        &mut self,
        token: u64,
        cmd: Command,
        area: Option<Arc<ferroce_host::abi::area::Area>>,
    ) -> VerbsResult<ReplyData> {
        let Some(id) = self.host_id(token) else {
            // Closed (by the client, or by the RNIC for breaking the protocol): the context
            // is dead to its client, as after a device-fatal error.
            return Err(VerbsError::DeviceFatal);
        };
        let r = self.serve_call(id, cmd, area);
        if self.hosts.get(id).is_some_and(|h| h.is_closed()) {
            // Closed by the call (`Close`): a spread context's satellites go now, before
            // any other call can reuse what it held.
            self.close_satellites(id, token);
        }
        self.forget_freed_qps();
        // Completions and positions the call produced (a flushed QP, a destroyed CQ) reach
        // the rings before the reply does.
        self.publish();
        r
    }

    /// Drops the header templates of QPs destroyed since the last look: a template is kept
    /// per QP slot, and QP numbers (so slots) are handed out cyclically, so templates kept
    /// after their QPs would fill every slot of the table over time (16K by default: some
    /// 2 MiB that the real soak saw as rnicd's memory creeping up run after run).
    fn forget_freed_qps(&mut self) {
        for s in self.owners.freed_qp_slots.drain(..) {
            if let Some(t) = self.templates.get_mut(s) {
                *t = None;
            }
        }
    }

    /// Header templates kept (one per QP that has sent since it was created), for tests
    /// and tools: at most the number of live QPs.
    pub fn cached_templates(&self) -> usize {
        self.templates.iter().filter(|t| t.is_some()).count()
    }

    /// The number of the attached client `token`.
    fn host_id(&self, token: u64) -> Option<usize> {
        self.hosts
            .iter()
            .find(|(_, h)| h.token == token)
            .map(|(id, _)| id)
    }

    /// Closes the client `token`, releasing everything it holds (as when its process dies).
    pub fn close_host(&mut self, token: u64) {
        if let Some(id) = self.host_id(token) {
            // A spread context's satellite closes when its home says (in order with what
            // the home sent it before).
            if self
                .hosts
                .get(id)
                .is_some_and(|h| h.satellite_of().is_some())
            {
                return;
            }
            self.release_host(id);
            self.hosts.remove(id);
        }
        self.forget_freed_qps();
        self.publish();
    }

    /// What the RNIC holds, per client, for management tools (rnic-ctl): device and port
    /// attributes, GIDs, and every client's objects with its QPs' current state, PSNs and
    /// (with `qp_counters`) counters.
    pub fn report(&self, qp_counters: bool) -> NicReport {
        let clients = self
            .hosts
            .values()
            .map(|h| {
                let o = h.objects();
                let qps: Vec<_> = o
                    .qps
                    .iter()
                    .filter_map(|q| self.dev.query_qp(*q).ok())
                    .collect();
                let counters = if qp_counters {
                    o.qps
                        .iter()
                        .filter_map(|q| self.dev.qp_counters(*q).map(|c| (*q, c)))
                        .collect()
                } else {
                    Vec::new()
                };
                let mrs = o
                    .mrs
                    .iter()
                    .map(|k| (*k, self.dev.mr(*k).map_or(0, |m| m.length)))
                    .collect();
                // A spread context's satellite: its QPs only (the rest are the home's
                // replicas, reported there; `Runtime::inspect` adds these QPs to it).
                let replica = h.satellite_of().is_some();
                let (pds, cqs, srqs, mrs) = if replica {
                    Default::default()
                } else {
                    (o.pds, o.cqs, o.srqs, mrs)
                };
                ClientReport {
                    token: h.token,
                    satellite: replica,
                    pid: h.pid,
                    uid: h.uid,
                    comm: h.comm.clone(),
                    pds,
                    cqs,
                    srqs,
                    mrs,
                    qps,
                    qp_counters: counters,
                    area_bytes: o.area_bytes,
                    counters: h.counters,
                }
            })
            .collect();
        NicReport {
            // As `query_device` and `query_port` report them to applications.
            attr: serve::device_attr(&self.dev),
            port: serve::port_attr(&self.dev),
            gids: self.dev.gids().to_vec(),
            mac: self.mac,
            clients,
        }
    }

    /// The RNIC is stopping: every client's QPs go to the error state (their work requests
    /// flush to the completion rings) and every client gets the device-fatal event, so
    /// applications see an error rather than a silent stop.
    pub fn shutdown_hosts(&mut self) {
        let ids: Vec<usize> = self.hosts.iter().map(|(id, _)| id).collect();
        for id in ids {
            // Work requests already in the post ring were posted before the stop: they
            // complete (flushed) like the rest. One ring's worth: a client refilling its ring
            // cannot delay the stop.
            self.serve_posts(id, ferroce_host::abi::POST_RING);
            self.fail_host(id);
        }
        self.publish();
        for h in self.hosts.values_mut() {
            h.deliver_event(&roce::verbs::AsyncEvent::DeviceFatal);
        }
    }

    /// Bytes of shared areas the attached clients hold.
    pub fn host_area_bytes(&self) -> u64 {
        self.hosts.values().map(|h| h.area_bytes()).sum()
    }

    /// What each attached client holds, with its label.
    pub fn host_objects(&self) -> Vec<(String, crate::host::HostObjects)> {
        self.hosts
            .values()
            .map(|h| (h.label.clone(), h.objects()))
            .collect()
    }

    /// The sizes host interfaces of this RNIC need.
    pub fn host_limits(&self) -> HostLimits {
        HostLimits::of(self.dev.config())
    }

    /// The device's limits.
    pub fn device_limits(&self) -> roce::engine::DeviceLimits {
        self.dev.config().limits
    }

    /// Attached application contexts.
    pub fn host_count(&self) -> usize {
        // Satellites of spread contexts are counted at their home.
        self.hosts
            .values()
            .filter(|h| h.satellite_of().is_none())
            .count()
    }

    /// Routes queue positions, completions and events to the hosts owning their objects;
    /// returns how many completions and events were delivered. Positions go first: an
    /// application that polls a completion may post into the slot it freed at once (verbs
    /// semantics), so the slot must already read as retired.
    fn publish(&mut self) -> usize {
        let mut work = 0;
        self.dev.take_moved(
            &mut self.moved_qps,
            &mut self.moved_srqs,
            &mut self.ready_cqs,
        );
        for &q in &self.moved_qps {
            let owner = self.dev.qp_index(q).and_then(|s| self.owners.qp(s));
            if let Some(h) = owner.and_then(|o| self.hosts.get(o)) {
                serve::publish_qp(&self.dev, h, q);
            }
        }
        for &s in &self.moved_srqs {
            if let Some(h) = self.owners.srq(s).and_then(|o| self.hosts.get(o)) {
                serve::publish_srq(&self.dev, h, s);
            }
        }
        for id in 0..self.hosts.id_bound() {
            if self.hosts.get(id).is_some_and(|h| h.pending_cq_count() > 0) {
                work += self.retry_host_cqs(id);
            }
        }
        for i in 0..self.ready_cqs.len() {
            let cq = self.ready_cqs[i];
            if let Some(id) = self.owners.cq(cq) {
                work += self.move_completions(id, cq);
            }
        }
        work += self.route_cm_events();
        while let Some(ev) = self.dev.poll_event() {
            use roce::verbs::AsyncEvent as E;
            let owner = match ev {
                E::QpFatal(q)
                | E::QpRequestError(q)
                | E::QpAccessError(q)
                | E::QpLastWqeReached(q)
                | E::SqDrained(q) => self.dev.qp_index(q).and_then(|s| self.owners.qp(s)),
                E::SrqLimitReached(s) => self.owners.srq(roce::engine::SrqId(s)),
                E::CqError(c) => self.owners.cq(roce::engine::CqId(c)),
                E::PortActive | E::PortError | E::DeviceFatal => {
                    for h in self.hosts.values_mut() {
                        h.deliver_event(&ev);
                    }
                    work += 1;
                    continue;
                }
            };
            if let Some(h) = owner.and_then(|o| self.hosts.get_mut(o)) {
                h.deliver_event(&ev);
                work += 1;
            }
        }
        if self.spreads() && self.shard().0 != 0 {
            work += self.send_satellite_events();
        }
        work
    }

    /// Mbufs of the transmit pool in use (for leak checks).
    pub fn pool_in_use(&self) -> u32 {
        self.pool.in_use()
    }

    /// One iteration; returns the amount of work done (0 = idle).
    pub fn poll(&mut self, now: u64) -> usize {
        self.now = now;
        let mut work = 0;
        // 1. Verbs commands first: a receive WR the application has posted is there for the
        // packets of this burst, as a doorbell is on a hardware NIC (processed after the
        // burst, an empty receive queue dropped UD messages whose WQEs were already
        // waiting in the ring). Contexts that closed are dropped.
        for id in 0..self.hosts.id_bound() {
            if self.hosts.contains(id) {
                work += self.serve_posts(id, 256);
                if self.hosts.get(id).is_some_and(|h| h.is_closed()) {
                    self.hosts.remove(id);
                }
            }
        }
        // Contexts spread over the workers: what the home sent a satellite and what came
        // back.
        work += self.serve_spread();
        self.forget_freed_qps();
        // UD messages that waited for a receive WQE: those that now have one (or whose
        // wait ran out) go to the engine, in arrival order per QP.
        if !self.held_rx.is_empty() {
            work += self.release_held(now);
        }
        // 2. Receive: internal loopback first (what this port sent to itself last
        // iteration), then the port's queue through the receive buffer.
        while let Some(mut m) = self.loopback.pop_front() {
            work += 1;
            if let Some(p) = self.rx_frame(now, &mut m) {
                self.hold_ud(now, p, m);
            }
        }
        work += self.receive(now);
        // The port's owner: what the other workers built goes out, what they addressed to
        // its QPs comes in.
        work += self.serve_shards(now);
        // 3. Timers.
        let pausing = self.poll_pause(now) | self.refresh_pauses(now);
        if self.dev.poll_timeout().is_some_and(|t| t <= now) {
            self.dev.handle_timeout(now);
            work += 1;
        }
        if self.neigh.poll_timeout().is_some_and(|t| t <= now) {
            self.neigh.handle_timeout(now);
            work += 1;
        }
        // 4. Transmit.
        while let Some(f) = self.neigh.poll_frame() {
            self.send_raw(now, &f);
            self.counters.tx_neighbor += 1;
            work += 1;
        }
        if !self.pending.is_empty() {
            self.retry_pending(now);
        }
        work += self.release_delayed(now);
        // The engine produces packets only while the port takes them: with frames the port
        // refused still waiting, nothing new is built, so send WQEs do not complete (UD and
        // UC complete when their packet is built) and the sender is held back, as a NIC's
        // send queue is by its wire.
        let mut budget = TX_BUDGET;
        while budget > 0 && self.txbuf.len() < BURST && self.dev.poll_transmit(now, &mut self.tx) {
            self.emit(now);
            budget -= 1;
            work += 1;
        }
        self.flush();
        // 5. Queue positions, completions and events; the other shards told of the frames
        // queued for them.
        work += self.publish();
        self.ring_shards();
        // A deadline close ahead (a paced packet's turn, a DCQCN rate step, an expiring ACK
        // timer) counts as work, so the worker does not sleep through it: an idle sleep
        // would stretch every paced gap to the sleep's length.
        // A paused or stormed priority counts too: pause expiry and the watchdog are timed.
        if work == 0
            && (pausing
                || !self.rx.frames.is_empty()
                || self
                    .dev
                    .poll_timeout()
                    .is_some_and(|t| t <= now + DEADLINE_SPIN_NS))
        {
            work = 1;
        }
        work
    }

    /// Takes frames off the port's queue into the receive buffer and hands the buffer's
    /// oldest to the engine; returns how many frames moved.
    ///
    /// At most `RX_BURSTS * BURST` frames are handled per iteration: more than one
    /// iteration's transmit budget, so a receiver keeps up with a sender on the same worker
    /// (with one burst of 32 against 64 transmitted per iteration, a loopback link
    /// overflowed). While the RNIC sends PFC, the buffer takes up to twice that per
    /// iteration, so a receiver that falls behind builds its backlog where it is counted per
    /// priority: past a lossless priority's XOFF threshold the link partner is paused, and
    /// resumed below XON. Without PFC the buffer takes only what is handled, and the backlog
    /// stays in the port's queue (on a ring link, the sender's port then refuses frames, which
    /// holds its sender back; on a NIC the queue overflows into the NIC's drop counter).
    fn receive(&mut self, now: u64) -> usize {
        let mut budget = RX_BURSTS * BURST;
        if self.cfg.fault.rx_pps > 0 {
            budget = budget.min(self.rx_tokens(now));
        }
        let target = if self.rx.ingress.is_some() {
            self.rx.max_frames
        } else {
            budget
        };
        let mut work = 0;
        for _ in 0..DRAIN_BURSTS {
            let room = target.saturating_sub(self.rx.frames.len());
            // A full buffer sending PFC still takes frames off the port, as a NIC's MAC does:
            // the link partner's own pause frames must not wait behind data (the data past
            // the buffer is a counted drop).
            if room == 0 && self.rx.ingress.is_none() {
                break;
            }
            let want = if room == 0 { BURST } else { room.min(BURST) };
            let n = self.wire.rx_burst(&mut self.rxbuf, want);
            if n == 0 {
                break;
            }
            work += n;
            let mut rx = std::mem::take(&mut self.rxbuf);
            for m in rx.drain(..) {
                self.buffer_frame(now, m);
            }
            self.rxbuf = rx;
            if n < want {
                break;
            }
        }
        let mut handled = 0;
        // A full UD wait list does not stop this loop (a UD message to hold then pushes the
        // oldest held one out, counted): while it stopped the port's queue, a peer that
        // filled the list for a QP with no receive WQEs stalled every other frame, RC and
        // CM included, for as long as it kept the list full.
        while handled < budget {
            let Some((p, charge, m)) = self.rx.frames.pop_front() else {
                break;
            };
            handled += 1;
            if let Some(f) = self
                .rx
                .ingress
                .as_mut()
                .and_then(|i| i.dequeue(p as usize, charge as u64))
            {
                self.send_pause(now, f);
            }
            // An RNIC over several workers: the frame may be another's to handle.
            let Some(mut m) = self.steer(now, m) else {
                continue;
            };
            if let Some(parsed) = self.rx_frame(now, &mut m) {
                self.hold_ud(now, parsed, m);
            }
        }
        if self.cfg.fault.rx_pps > 0 {
            self.rx.tokens -= handled as u64 * 1_000_000_000;
        }
        work.max(handled)
    }

    /// A frame off the port's queue into the receive buffer: a PFC or PAUSE frame acts at
    /// once (a pause is honoured within a frame time, and MAC control frames are never
    /// buffered); another is charged to its priority, and dropped (counted) if that
    /// priority's buffer is full.
    fn buffer_frame(&mut self, now: u64, mut m: Mbuf) {
        let Some(ingress) = self.rx.ingress.as_mut() else {
            self.rx.frames.push_back((0, 0, m));
            return;
        };
        let d = m.data();
        if d.len() >= 14 && d[12..14] == ethertype::MAC_CONTROL.to_be_bytes() {
            self.rx_frame(now, &mut m);
            return;
        }
        if self.rx.frames.len() >= self.rx.max_frames {
            self.counters.rx_frames += 1;
            self.counters.rx_buffer_discards += 1;
            return;
        }
        let p = self.dev.config().priorities.of_frame(d);
        let charge = m.buffer_bytes() as u32;
        let (fits, send) = ingress.enqueue(p as usize, charge as u64, now);
        let held = ingress.occupancy(p as usize);
        self.counters.rx_buffer_peak = self.counters.rx_buffer_peak.max(held);
        if let Some(f) = send {
            self.send_pause(now, f);
        }
        if fits {
            self.rx.frames.push_back((p, charge, m));
        } else {
            self.counters.rx_frames += 1;
            self.counters.rx_buffer_discards += 1;
        }
    }

    /// The frames `fault.rx_pps` lets the receiver handle now (the bucket holds one
    /// iteration's worth at most).
    fn rx_tokens(&mut self, now: u64) -> usize {
        const NS: u64 = 1_000_000_000;
        let cap = (RX_BURSTS * BURST) as u64 * NS;
        let r = &mut self.rx;
        let elapsed = now.saturating_sub(r.tokens_at).min(NS);
        r.tokens = r
            .tokens
            .saturating_add(elapsed.saturating_mul(self.cfg.fault.rx_pps))
            .min(cap);
        r.tokens_at = now;
        (r.tokens / NS) as usize
    }

    /// Sends a PFC or PAUSE frame from the receive buffer ahead of the data waiting to
    /// leave (a paused peer must hear of it now, not behind a burst).
    fn send_pause(&mut self, now: u64, f: PauseFrame) {
        let frame = f.emit(self.mac);
        let Ok(mut m) = self.pool.alloc() else {
            self.counters.tx_nombuf += 1;
            return;
        };
        if !m.extend_from_slice(&frame) {
            self.counters.tx_dropped += 1;
            return;
        }
        match f {
            PauseFrame::Pfc { .. } => self.counters.tx_pfc += 1,
            PauseFrame::Pause { .. } => self.counters.tx_pause += 1,
        }
        self.tap(now, &[&frame]);
        self.txbuf.insert(0, m);
        self.flush();
    }

    /// Refreshes the XOFFs in force before the peer's pause runs out; returns whether the
    /// receive buffer is pausing the peer (the worker then keeps polling).
    fn refresh_pauses(&mut self, now: u64) -> bool {
        let Some(ingress) = self.rx.ingress.as_mut() else {
            return false;
        };
        let Some(t) = ingress.poll_timeout() else {
            return false;
        };
        if t <= now {
            let mut out = Vec::new();
            ingress.handle_timeout(now, &mut out);
            for f in out {
                self.send_pause(now, f);
            }
        }
        true
    }

    /// Whether a parsed RoCE frame is a UD message to hold: its QP has no receive WQE right
    /// now, or an earlier message for the QP is already waiting (order is kept per QP). Why
    /// hold at all: a software RNIC shares the CPUs with its applications, and an application
    /// that loses its time slice for a few milliseconds cannot repost receives meanwhile,
    /// while a hardware NIC keeps delivering whatever the application is doing; without a
    /// short wait, UD traffic between processes on a loaded host was dropped whenever the
    /// receiver was descheduled. The wait is bounded in time (`roce.ud_rx_hold_us`) and
    /// number (`roce.ud_rx_hold_frames`); 0 drops at once, as a NIC does.
    fn wants_hold(&self, p: &ParsedFrame) -> bool {
        if self.cfg.ud_rx_hold_us == 0 {
            return false;
        }
        let bth = &p.repr.transport.bth;
        let qpn = bth.dest_qp;
        // Only what the QP would take: a message with a wrong Q_Key (or none) goes to the
        // engine at once, which drops it, counted; a peer that does not know the Q_Key
        // cannot fill the wait.
        let Some(deth) = p.repr.transport.ext.deth else {
            return false;
        };
        matches!(
            bth.opcode,
            Opcode::UD_SEND_ONLY | Opcode::UD_SEND_ONLY_WITH_IMM
        ) && self
            .dev
            .ud_wait_for_wqe(qpn, deth.qkey)
            .is_some_and(|lacks| lacks || self.held_rx.iter().any(|h| h.qpn == qpn))
    }

    /// Holds a UD message (see `wants_hold`) with its parsed headers; when the wait list is
    /// full the oldest goes to the engine at once (which drops it, counted).
    fn hold_ud(&mut self, now: u64, parsed: ParsedFrame, m: Mbuf) {
        if self.held_rx.len() >= self.cfg.ud_rx_hold_frames.max(1) as usize {
            if let Some(old) = self.held_rx.pop_front() {
                self.counters.rx_ud_hold_expired += 1;
                self.dev.handle_parsed(now, &old.parsed, &[old.mbuf.data()]);
            }
        }
        self.counters.rx_ud_held += 1;
        self.held_rx.push_back(HeldUd {
            since: now,
            qpn: parsed.repr.transport.bth.dest_qp,
            parsed,
            mbuf: m,
        });
    }

    /// Delivers held UD messages whose QP has a receive WQE or whose wait ran out; returns
    /// how many went.
    fn release_held(&mut self, now: u64) -> usize {
        let limit = self.cfg.ud_rx_hold_us as u64 * 1000;
        let mut done = 0;
        let mut blocked: [Option<roce::types::Qpn>; 8] = [None; 8];
        let mut nblocked = 0;
        let mut i = 0;
        while i < self.held_rx.len() {
            let (t, qpn) = (self.held_rx[i].since, self.held_rx[i].qpn);
            let is_blocked = blocked[..nblocked].contains(&Some(qpn));
            let expired = now.saturating_sub(t) > limit;
            if !is_blocked && (expired || !self.dev.ud_lacks_recv_wqe(qpn)) {
                let h = self.held_rx.remove(i).expect("in range");
                if expired {
                    self.counters.rx_ud_hold_expired += 1;
                    tracing::debug!(
                        ?qpn,
                        "UD message waited too long for a receive WQE: dropped"
                    );
                }
                // Filtered, counted, captured and parsed when it arrived.
                self.dev.handle_parsed(now, &h.parsed, &[h.mbuf.data()]);
                done += 1;
                continue;
            }
            // A QP whose first waiting message stays keeps its later ones behind it.
            if !is_blocked {
                if nblocked == blocked.len() {
                    break; // many QPs waiting: the rest next time
                }
                blocked[nblocked] = Some(qpn);
                nblocked += 1;
            }
            i += 1;
        }
        done
    }

    fn tap(&mut self, now: u64, segs: &[&[u8]]) {
        if let Some(t) = self.tap.as_mut() {
            t.write(now, segs);
        }
    }

    /// Switches the capture on or off while running; false if no capture file is set.
    pub fn set_capture(&mut self, on: bool) -> bool {
        match self.tap.as_mut() {
            Some(t) => {
                t.on = on;
                let _ = t.w.flush();
                true
            }
            None => false,
        }
    }

    /// Takes one received frame: filters it at layer 2, classifies it, and parses a RoCE
    /// frame once (every header and the ICRC: `frame::parse_in_place` for a frame in one
    /// segment of its own, else `frame::parse_segments`), handing the engine
    /// the parsed headers. Returns them for a UD message to hold (see `wants_hold`), which
    /// the caller then keeps with its mbuf.
    fn rx_frame(&mut self, now: u64, m: &mut Mbuf) -> Option<ParsedFrame> {
        self.counters.rx_frames += 1;
        // A frame in one segment this mbuf alone holds (the usual case): a RoCE frame is
        // parsed and verified in place, its ICRC in one pass (`frame::parse_in_place`).
        if m.nb_segs() == 1 && m.is_exclusive() {
            return match self.rx_kind(now, &[m.data()])? {
                FrameKind::Roce | FrameKind::Cnp => {
                    // Parsed into the Nic's one ParsedFrame (some 290 bytes), not moved.
                    let mut p = self
                        .rx_parsed
                        .take()
                        .unwrap_or_else(|| Box::new(ParsedFrame::blank()));
                    let r = parse_in_place_into(m.data_mut(), &mut p).map(|()| &*p);
                    let hold = self.rx_roce(now, r, &[m.data()], true);
                    self.rx_parsed = Some(p);
                    hold
                }
                kind => self.rx_other(now, kind, &[m.data()]),
            };
        }
        // Segments in place (no copy) for the engine. A frame in more segments than we keep
        // references for, or whose first segment is too short to classify, is linearised.
        let mut segs: [&[u8]; 8] = [&[]; 8];
        let mut n = 0;
        let mut overflow = false;
        for s in m.segments() {
            if n == segs.len() {
                overflow = true;
                break;
            }
            segs[n] = s;
            n += 1;
        }
        if n > 1 {
            self.counters.rx_multiseg += 1;
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let linear: [&[u8]; 1];
        let segs: &[&[u8]] = if overflow || (n > 1 && segs[0].len() < 128) {
            scratch.clear();
            for s in m.segments() {
                scratch.extend_from_slice(s);
            }
            linear = [&scratch[..]];
            &linear
        } else {
            &segs[..n]
        };
        let hold = match self.rx_kind(now, segs) {
            None => None,
            Some(FrameKind::Roce | FrameKind::Cnp) => {
                let single = segs.len() == 1 && m.nb_segs() == 1;
                let parsed = parse_segments(segs);
                self.rx_roce(now, parsed.as_ref().map_err(|e| *e), segs, single)
            }
            Some(kind) => self.rx_other(now, kind, segs),
        };
        self.scratch = scratch;
        hold
    }

    /// A received frame's capture and layer-2 filter, then its kind (`None`: filtered out).
    fn rx_kind(&mut self, now: u64, segs: &[&[u8]]) -> Option<FrameKind> {
        if let Some(t) = self.tap.as_mut() {
            t.write(now, segs);
        }
        let first = segs.first().copied().unwrap_or(&[]);
        self.l2_accept(first).then(|| classify(first))
    }

    /// A parsed RoCE frame to the engine, or back to the caller to hold (a UD message in one
    /// segment waiting for a receive WQE; see `wants_hold`).
    fn rx_roce(
        &mut self,
        now: u64,
        parsed: Result<&ParsedFrame, roce::wire::Error>,
        segs: &[&[u8]],
        single: bool,
    ) -> Option<ParsedFrame> {
        self.counters.rx_roce += 1;
        match parsed {
            Err(e) => self.dev.reject_frame(&e),
            Ok(p) if single && self.wants_hold(p) => return Some(*p),
            Ok(p) => self.dev.handle_parsed(now, p, segs),
        }
        None
    }

    /// A frame that is not RoCE: pause frames, ARP, ICMP and ND, the rest counted.
    fn rx_other(&mut self, now: u64, kind: FrameKind, segs: &[&[u8]]) -> Option<ParsedFrame> {
        let first = segs.first().copied().unwrap_or(&[]);
        match kind {
            FrameKind::Pfc | FrameKind::Pause => {
                self.pause_frame(now, first);
                self.copy_to_shards(segs);
            }
            _ if is_ipv4_fragment(first) => self.counters.rx_ipv4_fragments += 1,
            kind => {
                // ARP, ICMP and ND are small: a multi-segment one is joined (rare path).
                let joined;
                let f = if segs.len() == 1 {
                    first
                } else {
                    joined = segs.concat();
                    &joined[..]
                };
                let consumed = self.neigh.handle_frame(now, f);
                if consumed || kind == FrameKind::Arp {
                    self.copy_to_shards(&[f]);
                }
                match (kind, consumed) {
                    (FrameKind::Arp, _) => self.counters.rx_arp += 1,
                    (_, true) => self.counters.rx_icmp += 1,
                    _ => self.counters.rx_other += 1,
                }
            }
        }
        None
    }

    /// Whether a frame is addressed to this RNIC at layer 2 (a NIC's address filter; the
    /// port itself may run promiscuous because our MAC is a software one): our VLAN - or, on
    /// a port without one, untagged or priority-tagged (VID 0, IEEE 802.1Q) - and our unicast
    /// MAC, broadcast for ARP, the IPv6 groups ND needs (all-nodes, our solicited-node
    /// groups) and the MAC-control group for PFC/PAUSE (01:80:C2:00:00:01). The rest is
    /// counted and dropped.
    fn l2_accept(&mut self, f: &[u8]) -> bool {
        let Ok(eth) = ethernet::Frame::new_checked(f) else {
            self.counters.rx_runts += 1;
            return false;
        };
        let vid = eth.tci().map(|t| t & 0x0fff);
        let vlan_ok = match (self.vlan, vid) {
            (None, None | Some(0)) => true,
            (Some(v), Some(x)) => x == v.vid,
            // PFC and PAUSE frames are never tagged (IEEE 802.3 Annex 31B): a VLAN port
            // takes them untagged.
            (Some(_), None) => eth.ethertype() == ethertype::MAC_CONTROL,
            _ => false,
        };
        if !vlan_ok {
            self.counters.rx_dropped_vlan += 1;
            tracing::trace!(?vid, "frame dropped: not our VLAN");
            return false;
        }
        let dst = eth.dst();
        let ok = if dst == self.mac {
            true
        } else if dst == [0xff; 6] {
            eth.ethertype() == ethertype::ARP
        } else if dst[..2] == [0x33, 0x33] {
            eth.ethertype() == ethertype::IPV6 && self.neigh.accepts_multicast(dst)
        } else {
            dst == MAC_CONTROL_GROUP && eth.ethertype() == ethertype::MAC_CONTROL
        };
        if !ok {
            self.counters.rx_dropped_mac += 1;
            tracing::trace!(dst = %ethernet::mac_to_string(&dst), "frame dropped: not our MAC");
        }
        ok
    }

    fn send_raw(&mut self, now: u64, frame: &[u8]) {
        let Ok(mut m) = self.pool.alloc() else {
            self.counters.tx_nombuf += 1;
            return;
        };
        if !m.extend_from_slice(frame) {
            self.counters.tx_dropped += 1;
            return;
        }
        self.tap(now, &[frame]);
        self.push_tx(now, m);
    }

    /// The mempool its frames come from.
    pub(crate) fn pool(&self) -> &Arc<Mempool> {
        &self.pool
    }

    /// How the RNIC reaches `dgid` (rdma_cm's address resolution): one of its own GIDs or a
    /// next hop with a known MAC is resolved; otherwise resolution starts (or goes on) and
    /// the caller asks again, until the neighbour table answers or gives up.
    pub(crate) fn reach(&mut self, dgid: Gid) -> ferroce_host::abi::Reach {
        use ferroce_host::abi::Reach;
        if self.dev.gids().contains(&dgid) {
            return Reach::Resolved;
        }
        match self.neigh.resolve(self.now, gid_ip(dgid)) {
            Resolve::Mac(_) => Reach::Resolved,
            Resolve::Pending => Reach::Pending,
            Resolve::Unreachable => Reach::Unreachable,
        }
    }

    /// Starts resolving the next hop towards `dgid` if it is not known yet (nothing is held:
    /// the QP's first packet finds the answer, or waits for it as usual).
    pub(crate) fn prime_next_hop(&mut self, dgid: Gid) {
        if !self.dev.gids().contains(&dgid) {
            let _ = self.neigh.resolve(self.now, gid_ip(dgid));
        }
    }

    /// Builds the engine's packet in `self.tx` into an mbuf and queues it.
    fn emit(&mut self, now: u64) {
        let dgid = self.tx.path.dgid;
        // To one of our own GIDs: internal loopback (as rxe and hardware RNICs do), the
        // frame addressed to our MAC and received by this port without touching the wire.
        let local = self.dev.gids().contains(&dgid);
        let slot = self.dev.qp_index(self.tx.qpn);
        let resolved = match self.tx.path.dmac {
            _ if local => Resolve::Mac(self.mac),
            Some(m) => Resolve::Mac(m),
            None => self.next_hop(now, slot, dgid),
        };
        if resolved == Resolve::Unreachable {
            self.unreachable(dgid, gid_ip(dgid));
            return;
        }
        // DSCP and ECN: the path's traffic class, or the port's defaults (roce.dscp/ecn).
        // ECT(0) goes on data only: ACKs and CNPs are not ECN-capable (a CNP never is; ref.
        // dcb.md), so congestion marks land on the packets whose sender can slow down.
        let mut tc = self.tx.path.traffic_class;
        if tc >> 2 == 0 {
            tc |= self.cfg.dscp << 2;
        }
        if self.cfg.ecn && tc & 3 == 0 && self.tx.ecn_capable() {
            tc |= 2; // ECT(0)
        }
        self.tx.path.traffic_class = tc;
        // The priority (PFC class) as the engine maps it (`roce.trust`): the VLAN PCP.
        let priority = self
            .dev
            .config()
            .priorities
            .priority(self.tx.path.traffic_class, self.tx.path.sl);
        if self.storm_drops(priority) {
            self.counters.tx_storm_dropped += 1;
            return;
        }
        let vlan = self.vlan.map(|v| VlanTag { pcp: priority, ..v });
        let dst = match resolved {
            Resolve::Mac(m) => m,
            _ => [0; 6],
        };
        self.ident = self.ident.wrapping_add(1);
        // The QP's header template, made again when what it was made from changed: the
        // Ethernet, IP and UDP headers are then one copy and four fields per packet.
        let same = |k: &TemplateKey| {
            k.path == self.tx.path && k.dst == dst && k.vlan == vlan && k.src == self.mac
        };
        let make = || HeaderTemplate::new(&self.tx.frame_repr(self.mac, dst, vlan, self.ident));
        let scratch;
        let tmpl = match slot.and_then(|s| self.templates.get_mut(s)) {
            Some(entry) => {
                if !entry.as_ref().is_some_and(|c| same(&c.key)) {
                    let Ok(tmpl) = make() else {
                        return;
                    };
                    let made = CachedTemplate {
                        key: TemplateKey {
                            path: self.tx.path,
                            src: self.mac,
                            dst,
                            vlan,
                        },
                        tmpl,
                    };
                    // The QP's box is reused: no allocation after its first packet.
                    match entry {
                        Some(c) => **c = made,
                        None => *entry = Some(Box::new(made)),
                    }
                }
                match entry {
                    Some(c) => &c.tmpl,
                    None => return,
                }
            }
            // Not a QP of this device's table: nothing to keep the template with.
            None => {
                let Ok(t) = make() else {
                    return;
                };
                scratch = t;
                &scratch
            }
        };
        let plen = self.tx.payload.len();
        let Ok(total) = tmpl.frame_len(&self.tx.transport, plen) else {
            return;
        };
        let Ok(mut m) = self.pool.alloc() else {
            self.counters.tx_nombuf += 1;
            return;
        };
        let Some(buf) = m.append(total) else {
            // Larger than an mbuf: the path MTU is configured above what the pool holds.
            self.counters.tx_dropped += 1;
            return;
        };
        match self.dev.emit_frame_from(&self.tx, tmpl, self.ident, buf) {
            Ok(()) => {}
            Err(EmitError::Memory(_)) => {
                // The MR went away while the packet was queued.
                self.counters.tx_dropped += 1;
                return;
            }
            Err(EmitError::Wire(_)) => return,
        }
        self.counters.tx_roce += 1;
        if local {
            // To a QP another worker of this RNIC owns: to that worker (not captured).
            let Err(m) = self.loop_to_shard(m) else {
                return;
            };
            // Captured once, by the receive path.
            if self.loopback.len() >= MAX_LOOPBACK {
                self.counters.tx_loopback_dropped += 1;
            } else {
                self.counters.tx_loopback += 1;
                self.loopback.push_back(m);
            }
            return;
        }
        if resolved == Resolve::Pending {
            if self.pending.len() >= MAX_PENDING {
                self.counters.tx_held_dropped += 1;
                return;
            }
            self.counters.tx_held += 1;
            self.pending.push_back(Held {
                gid: dgid,
                prio: priority,
                known: false,
                m,
            });
            self.dev.handle_event(DeviceEvent::PathHeld {
                qpn: self.tx.qpn,
                dgid,
            });
            return;
        }
        self.tap_mbuf(now, &m);
        self.push_tx(now, m);
    }

    /// The MAC for the packet in `self.tx`: from its QP's cached next hop while the
    /// neighbour table has not changed since (no table lookup per packet), else resolved and
    /// cached again.
    fn next_hop(&mut self, now: u64, slot: Option<usize>, dgid: Gid) -> Resolve {
        if let Some(h) = slot.and_then(|s| self.hops.get(s)) {
            if h.gen == self.neigh.generation() && h.dgid == dgid {
                return Resolve::Mac(h.mac);
            }
        }
        let r = self.neigh.resolve(now, gid_ip(dgid));
        if let (Resolve::Mac(mac), Some(h)) = (r, slot.and_then(|s| self.hops.get_mut(s))) {
            *h = NextHop {
                dgid,
                mac,
                gen: self.neigh.generation(),
            };
        }
        r
    }

    fn unreachable(&mut self, dgid: Gid, ip: IpAddr) {
        self.counters.tx_unresolved += 1;
        let n = self.dev.handle_event(DeviceEvent::PathUnreachable { dgid });
        if n > 0 {
            self.counters.qps_failed_unresolved += n as u64;
            tracing::warn!(
                "{}: no route or no answer for {ip}: {n} QP(s) moved to error",
                self.name
            );
        }
    }

    fn retry_pending(&mut self, now: u64) {
        let mut released: Option<Gid> = None;
        let paused = self.dev.paused();
        let n = self.pending.len();
        for i in 0..n {
            // Released a burst at a time, like what the engine builds: frames handed on wait
            // in the port's queue where a pause can no longer hold them.
            if self.txbuf.len() >= BURST {
                // The rest stay first, in order, ahead of those kept this turn.
                let kept = self.pending.len() - (n - i);
                self.pending.rotate_right(kept);
                break;
            }
            let Some(mut h) = self.pending.pop_front() else {
                break;
            };
            match self.neigh.resolve(now, gid_ip(h.gid)) {
                // Built before the pause, held for the address: it waits for the pause too
                // (PFC holds what the RNIC has not sent yet). Its QP need not: a UD QP's
                // datagrams on other priorities go on (RC QPs stay held until their packets
                // leave, which is what their ACK timers count from).
                Resolve::Mac(_) if paused & (1 << h.prio) != 0 => {
                    if !h.known {
                        h.known = true;
                        self.dev
                            .handle_event(DeviceEvent::PathKnown { dgid: h.gid });
                    }
                    self.pending.push_back(h)
                }
                Resolve::Mac(mac) => {
                    if released != Some(h.gid) {
                        released = Some(h.gid);
                        self.dev
                            .handle_event(DeviceEvent::PathResolved { dgid: h.gid, now });
                    }
                    // The destination MAC is not covered by the ICRC: patch it in place.
                    let mut m = h.m;
                    m.data_mut()[..6].copy_from_slice(&mac);
                    self.tap_mbuf(now, &m);
                    self.push_tx(now, m);
                }
                Resolve::Pending => self.pending.push_back(h),
                Resolve::Unreachable => {
                    self.counters.tx_held_dropped += 1;
                    self.unreachable(h.gid, gid_ip(h.gid));
                }
            }
        }
    }

    /// Queues a frame for the port, through the fault injector when one is configured: the
    /// faults are decided here, a delay holds the frame in the delay line until `now` +
    /// `fault.delay_us` ([`Nic::release_delayed`]).
    fn push_tx(&mut self, now: u64, m: Mbuf) {
        match self.fault.as_mut() {
            Some(f) => f.pass(now, m, &self.pool, &mut self.txbuf),
            None => self.txbuf.push(m),
        }
        if self.txbuf.len() >= BURST {
            self.flush();
        }
    }

    /// Sets the link's speed in Mb/s where it is not a whole number of Gb/s (`port.speed_gbps`):
    /// pause quanta are bit times at it.
    pub fn set_link_mbps(&mut self, mbps: u64) {
        self.pause = PauseState::new(self.pause.mode(), mbps.max(1));
        if self.rx.ingress.is_some() && self.rx.frames.is_empty() {
            self.rx.ingress = Some(rx_ingress(&self.cfg, mbps.max(1)));
        }
    }

    /// A PFC or PAUSE frame from the link partner: counted, and honoured per priority as
    /// `[pfc]` says (a priority the watchdog found stormed is not paused again until the
    /// storm ends).
    fn pause_frame(&mut self, now: u64, frame: &[u8]) {
        // Our own pause frame, echoed back (a packet socket hands back what is sent on it):
        // never a pause for us.
        if frame.get(6..12) == Some(&self.mac[..]) {
            self.counters.rx_pause_ignored += 1;
            return;
        }
        let Some(f) = PauseFrame::parse(frame) else {
            self.counters.rx_pause_malformed += 1;
            return;
        };
        // The watchdog hears of pauses only: an XON (zero quanta) ends a pause, so a
        // partner that has stopped pausing and sends XONs lets a stormed priority be
        // restored (dcb.md: SONiC's known trouble of a storm that turns from XOFF to XON
        // leaving the queue stormed).
        match f {
            PauseFrame::Pfc {
                class_enable,
                quanta,
            } => {
                self.counters.rx_pfc += 1;
                if let Some(w) = self.watchdog.as_mut() {
                    for p in (0..8).filter(|&p| class_enable & (1 << p) != 0 && quanta[p] != 0) {
                        w.pause_received(p, now);
                    }
                }
            }
            PauseFrame::Pause { quanta } => {
                self.counters.rx_pause += 1;
                if let Some(w) = self.watchdog.as_mut().filter(|_| quanta != 0) {
                    for p in 0..8 {
                        w.pause_received(p, now);
                    }
                }
            }
        }
        let before = self.pause.counters.rx_ignored;
        self.pause.handle_frame(now, &f);
        self.counters.rx_pause_ignored += self.pause.counters.rx_ignored - before;
        self.apply_pause(now);
    }

    /// Tells the engine which priorities are paused now: the link partner's pauses, less
    /// those the watchdog stopped honouring.
    fn apply_pause(&mut self, now: u64) {
        let mut mask = self.pause.paused_mask(now);
        if let Some(w) = &self.watchdog {
            for p in 0..8 {
                if w.stormed(p) {
                    mask &= !(1 << p);
                }
            }
        }
        if mask != self.dev.paused() {
            self.dev.set_paused(mask);
        }
    }

    /// Pause expiry and the storm watchdog; returns whether anything is paused or stormed
    /// (the worker then keeps polling).
    fn poll_pause(&mut self, now: u64) -> bool {
        if self.pause.mode() == dcb::pfc::Mode::Off {
            return false;
        }
        if self.pause.poll_timeout().is_some_and(|t| t <= now) {
            self.pause.handle_timeout(now);
        }
        let mut active = self.pause.paused_mask(now) != 0;
        if let Some(w) = self.watchdog.as_mut() {
            let stormed = (0..8).any(|p| w.stormed(p));
            if active || stormed {
                w.poll(&self.pause, now, &mut self.storm_events);
                active = true;
            }
        }
        for e in self.storm_events.drain(..) {
            match e {
                StormEvent::Detected(p) => {
                    self.counters.pfc_storms_detected += 1;
                    tracing::warn!(
                        port = %self.name,
                        priority = p,
                        "PFC storm: priority paused past the watchdog's detection time; \
                         its pauses are no longer honoured"
                    );
                }
                StormEvent::Restored(p) => {
                    self.counters.pfc_storms_restored += 1;
                    tracing::warn!(port = %self.name, priority = p, "PFC storm over");
                }
            }
        }
        self.apply_pause(now);
        active
    }

    /// Whether the frame in `self.tx` belongs to a priority the watchdog stormed with the
    /// drop action (it is then discarded rather than sent).
    fn storm_drops(&self, priority: u8) -> bool {
        self.watchdog
            .as_ref()
            .is_some_and(|w| w.action() == StormAction::Drop && w.stormed(priority as usize))
    }

    /// Sends the frames whose `fault.delay_us` is over; returns how many. While frames wait,
    /// the RNIC counts as busy (no idle sleep that would stretch the delay).
    fn release_delayed(&mut self, now: u64) -> usize {
        let Some(f) = self.fault.as_mut() else {
            return 0;
        };
        let n = f.release(now, &mut self.txbuf, BURST);
        let waiting = f.waiting();
        if n > 0 {
            self.flush();
        }
        n + usize::from(waiting)
    }

    fn flush(&mut self) {
        if self.txbuf.is_empty() {
            return;
        }
        let before = self.txbuf.len();
        let bytes: u64 = self.txbuf.iter().map(|m| m.pkt_len() as u64).sum();
        let sent = self.wire.tx_burst(&mut self.txbuf);
        self.counters.tx_frames += sent as u64;
        // Approximate bytes of what went (leftovers are at the front now).
        let left: u64 = self.txbuf.iter().map(|m| m.pkt_len() as u64).sum();
        self.counters.tx_bytes += bytes - left;
        if sent < before {
            self.counters.tx_retried += (before - sent) as u64;
            // Keep the leftovers for the next iteration (l3fwd frees them; RC would then have
            // to retransmit), but bound the backlog.
            while self.txbuf.len() > MAX_TX_BACKLOG {
                self.txbuf.pop();
                self.counters.tx_dropped += 1;
            }
        }
    }

    /// Flushes the capture file.
    pub fn flush_capture(&mut self) {
        if let Some(t) = self.tap.as_mut() {
            let _ = t.w.flush();
        }
    }
}

/// The receive buffer's PFC state for `[pfc]` at `speed_mbps`: XOFF frames carry the
/// longest pause (0xFFFF quanta) and are refreshed at half of it while the buffer stays
/// above XON.
fn rx_ingress(cfg: &RnicConfig, speed_mbps: u64) -> Ingress {
    Ingress::new(
        cfg.pfc.mode,
        speed_mbps,
        cfg.pfc.rx_buffer,
        cfg.pfc.rx_thresholds(),
        u16::MAX,
    )
}

/// Asks a hardware NIC to do PFC itself on `[pfc]`'s priorities: it then honours the link
/// partner's pauses and sends pauses from its own receive buffer's occupancy, which only it
/// can see (XOFF at 3/4 of a 128 KB buffer, XON at half, the longest pause). Virtual devices
/// cannot; there the dataplane honours received frames itself (and sends none). Returns how
/// many priorities the hardware took.
fn hardware_pfc(port: &Port, cfg: &RnicConfig) -> u32 {
    let dcb::pfc::Mode::Pfc { enabled } = cfg.pfc.mode else {
        return 0;
    };
    let mut n = 0;
    for priority in (0..8u8).filter(|p| enabled & (1 << p) != 0) {
        let s = pmd_bindings::PfcSettings {
            priority,
            rx_pause: true,
            tx_pause: true,
            high_water: 96 * 1024,
            low_water: 64 * 1024,
            pause_time: 0xffff,
        };
        match port.set_priority_flow_control(&s) {
            Ok(()) => n += 1,
            Err(pmd_bindings::Error::NotSupported { .. }) => {
                tracing::debug!(port = %port.name(), "PFC in software (the port cannot)");
                return 0;
            }
            Err(e) => {
                tracing::warn!(port = %port.name(), priority, "hardware PFC refused: {e}");
            }
        }
    }
    n
}

fn is_ipv4_fragment(f: &[u8]) -> bool {
    let Ok(eth) = ethernet::Frame::new_checked(f) else {
        return false;
    };
    if eth.ethertype() != ethertype::IPV4 {
        return false;
    }
    let ip = eth.payload();
    ip.len() >= 20 && (u16::from_be_bytes([ip[6], ip[7]]) & 0x3fff) != 0
}

impl Drop for Nic {
    fn drop(&mut self) {
        // Mbufs still held go back to the pool with the Vecs/queues (and the fault
        // injector's).
        self.flush_capture();
    }
}

/// One client's objects on an RNIC ([`Nic::report`]).
#[derive(Debug, Clone)]
pub struct ClientReport {
    /// The client's token (the same on every worker of a spread context).
    pub token: u64,
    /// A spread context's satellite (its QPs on another worker; merged into its home's
    /// report by `Runtime::inspect`).
    pub satellite: bool,
    /// Owning process (0: the RNIC's own process).
    pub pid: u32,
    /// Its user id.
    pub uid: u32,
    /// Its command name.
    pub comm: String,
    /// PDs.
    pub pds: Vec<roce::memory::PdId>,
    /// CQs.
    pub cqs: Vec<roce::engine::CqId>,
    /// SRQs.
    pub srqs: Vec<roce::engine::SrqId>,
    /// MRs: lkey and length.
    pub mrs: Vec<(roce::types::Lkey, u64)>,
    /// QPs as `query_qp` reports them.
    pub qps: Vec<roce::verbs::QpInfo>,
    /// Per-QP counters, when asked for.
    pub qp_counters: Vec<(roce::types::Qpn, roce::engine::QpCounters)>,
    /// Bytes of memory shared with the RNIC.
    pub area_bytes: u64,
    /// The client's host-interface counters.
    pub counters: ferroce_host::abi::HostCounters,
}

/// What an RNIC holds, for management tools ([`Nic::report`]).
#[derive(Debug, Clone)]
pub struct NicReport {
    /// Device attributes.
    pub attr: roce::engine::DeviceAttr,
    /// Port attributes.
    pub port: ferroce_host::abi::PortAttrData,
    /// GID table.
    pub gids: Vec<roce::types::Gid>,
    /// MAC in use.
    pub mac: [u8; 6],
    /// Clients and their objects.
    pub clients: Vec<ClientReport>,
}

/// The IP address a GID stands for (IPv4-mapped GIDs are IPv4).
fn gid_ip(gid: Gid) -> IpAddr {
    match gid.to_ipv4() {
        Some(a) => IpAddr::from(a),
        None => IpAddr::V6(gid.to_ipv6()),
    }
}
