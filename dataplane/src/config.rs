//! RNIC configuration: a TOML file plus `key=value` overrides (the CLI maps its flags onto
//! them), validated at start with errors that name the key and the problem.
//!
//! ```toml
//! [eal]
//! args = "--no-huge --no-pci -m 512 --no-shconf"   # default: software arguments
//!
//! [port]
//! device = "net_af_packet0,iface=tap0"   # vdev devargs or a PCI address
//! mtu = 1500                               # IP MTU of the link
//!
//! [address]
//! mac = "02:00:00:99:00:03"
//! ipv4 = ["10.99.0.3/24"]
//! ipv6 = ["fd00:99::3/64"]
//! gateway = "10.99.0.1"
//!
//! [roce]
//! path_mtu = 1024      # upper limit of QP path MTUs (and the UD message size)
//! dscp = 26
//! ecn = true           # mark ECT(0)
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use dcb::dcqcn::RpParams;
use dcb::ecn::Red;
use dcb::ets::{EtsConfig, Tsa};
use dcb::pfc::{Mode, StormAction, Thresholds};
use roce::engine::cc::CongestionConfig;
use roce::engine::Trust;
use roce::types::Gid;
use roce::verbs::Mtu;
use roce::wire::ethernet::{mac_to_string, parse_mac};
use serde::Deserialize;

/// A configuration problem, naming the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("config {key}: {problem}")]
pub struct ConfigError {
    /// The dotted key, e.g. `address.ipv4[0]`.
    pub key: String,
    /// What is wrong.
    pub problem: String,
}

fn err<T>(key: &str, problem: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError {
        key: key.to_string(),
        problem: problem.into(),
    })
}

/// QPs per RNIC unless `roce.max_qp` says otherwise.
pub const DEFAULT_MAX_QP: u32 = 16384;
/// The most `roce.max_qp` may be.
pub const MAX_QP_LIMIT: u32 = 262_144;
/// Unacknowledged PSNs per QP unless `roce.send_window` says otherwise: rxe's 128, so interop
/// behaves as with rxe.
pub const DEFAULT_SEND_WINDOW: u32 = 128;
/// The most `roce.send_window` may be: well inside half the 24-bit PSN space, where PSN
/// comparisons stay unambiguous.
pub const MAX_SEND_WINDOW: u32 = 1 << 22;
/// Highest `worker.thread` (worker threads are numbered from 0).
pub const MAX_WORKER_THREAD: u32 = 63;
/// Upper limits of keys the command line (`set`) and a file (`validate`) both check: a
/// file value is held to the same bound as a `--set` one.
const MAX_HOLD_US: u32 = 10_000_000;
const MAX_HOLD_FRAMES: u32 = 65_536;
const MAX_DELAY_US: u32 = 10_000_000;
const MAX_WATCHDOG_MS: u32 = 3_600_000;
/// Idle spins and pauses before a worker sleeps: beyond this it never really idles.
const MAX_IDLE_POLLS: u32 = 1 << 24;
/// A worker's idle sleep: past a second an idle port (which has no wake-up) would answer
/// the wire that late.
const MAX_IDLE_SLEEP_US: u32 = 1_000_000;
/// The switch model's thresholds and headroom (KiB): its buffer is at most 1 GiB.
const MAX_SWITCH_KB: u32 = 1 << 20;

/// The most messages a queue between spread contexts' workers may hold.
pub const MAX_SPREAD_QUEUE: u32 = 65536;

/// `v`, or `default` when unset, if it is at most `max`; else the error names `key`.
fn at_most(key: &str, v: Option<u32>, default: u32, max: u32) -> Result<u32, ConfigError> {
    match v.unwrap_or(default) {
        v if v > max => err(key, format!("{v} exceeds {max}")),
        v => Ok(v),
    }
}

/// The file as written (every field optional; defaults applied in [`RawConfig::validate`]).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    /// `[eal]`
    #[serde(default)]
    pub eal: RawEal,
    /// `[port]`
    #[serde(default)]
    pub port: RawPort,
    /// `[address]`
    #[serde(default)]
    pub address: RawAddress,
    /// `[roce]`
    #[serde(default)]
    pub roce: RawRoce,
    /// `[worker]`
    #[serde(default)]
    pub worker: RawWorker,
    /// `[capture]`
    #[serde(default)]
    pub capture: RawCapture,
    /// `[fault]`
    #[serde(default)]
    pub fault: RawFault,
    /// `[host]`: rnicd's socket and per-client limits.
    #[serde(default)]
    pub host: RawHost,
    /// `[dcqcn]`: ECN congestion control.
    #[serde(default)]
    pub dcqcn: RawDcqcn,
    /// `[pfc]`: PFC or PAUSE frames, honoured and sent.
    #[serde(default)]
    pub pfc: RawPfc,
    /// `[ets]`: bandwidth between the RNIC's traffic classes.
    #[serde(default)]
    pub ets: RawEts,
    /// `[switch]`: an emulated switch between the RNIC and its port.
    #[serde(default)]
    pub switch: RawSwitch,
}

/// `[switch]`: an emulated switch on DPDK (`dataplane::switch`: shared buffer, shaped links,
/// delay, ECN marking, PFC) between the RNIC and its port, so a congested or long link shows
/// on any port: the RNIC on switch port 0 (a ring link in the process), the port on switch
/// port 1. Off unless `enabled`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawSwitch {
    /// Put the switch in (default false).
    pub enabled: Option<bool>,
    /// Rate of the port's link, Mb/s, both ways (default 10000).
    pub rate_mbps: Option<f64>,
    /// Rate of the RNIC's link to the switch, Mb/s (default `rate_mbps`).
    pub rnic_mbps: Option<f64>,
    /// Propagation delay on every egress, us (default 0; at most 10 s).
    pub delay_us: Option<u32>,
    /// Shared buffer, KiB (default 4096).
    pub buffer_kb: Option<u32>,
    /// ECN marking (RED on the bytes queued in a class, at dequeue): start, KiB.
    pub ecn_kmin_kb: Option<u32>,
    /// ECN marking: full `ecn_pmax` at this many KiB.
    pub ecn_kmax_kb: Option<u32>,
    /// ECN marking probability at Kmax (default 0.2).
    pub ecn_pmax: Option<f64>,
    /// Priorities with PFC at the switch (default none).
    pub pfc: Option<Vec<u8>>,
    /// XOFF per ingress port and priority, KiB (default 200).
    pub xoff_kb: Option<u32>,
    /// XON, KiB (default XOFF less 8, two 4 KiB frames).
    pub xon_kb: Option<u32>,
    /// What an ingress port may bring in above XOFF before drops, KiB (default 256).
    pub headroom_kb: Option<u32>,
    /// Capture every frame the switch sends to this file.
    pub pcap: Option<String>,
    /// Probability a frame the switch sends is dropped.
    pub loss: Option<f64>,
    /// Probability it is sent twice.
    pub duplicate: Option<f64>,
    /// Probability one bit of it is flipped.
    pub corrupt: Option<f64>,
    /// Probability it is held back behind the next one on its port (at most 100 us).
    pub reorder: Option<f64>,
    /// Seed of those faults (default 1).
    pub seed: Option<u64>,
}

/// `[ets]`: Enhanced Transmission Selection (IEEE 802.1Qaz) between the RNIC's traffic
/// classes, as `mlnx_qos --prio_tc/--tsa/--tcbw` set it. Off unless a key is set; unset keys
/// take the usual RoCE setup (priority n -> class n; classes 6 and 7 strict; 3 and 0 half
/// each).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawEts {
    /// Class of each priority 0..7.
    pub prio_tc: Option<Vec<u8>>,
    /// Selection of each class 0..7: `strict` or `ets`.
    pub tsa: Option<Vec<String>>,
    /// Share of each class in percent (ETS classes summing to 100, strict ones 0).
    pub bw: Option<Vec<u8>>,
}

/// `[pfc]`: PFC (802.1Qbb) or PAUSE (802.3x) frames from the link partner hold the RNIC's
/// packets of the paused priorities; a storm watchdog stops honouring a priority paused for
/// too long (SONiC's PFC watchdog). The RNIC sends them too, from its receive buffer's
/// occupancy per priority (frames taken off the port and not yet handled).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawPfc {
    /// `off` (default: pause frames counted only), `pfc` or `pause`.
    pub mode: Option<String>,
    /// Priorities PFC is enabled on (default [3], the usual RoCE class).
    pub priorities: Option<Vec<u8>>,
    /// A priority paused without a break this long is a storm, ms (default 200; 0: no
    /// watchdog).
    pub watchdog_ms: Option<u32>,
    /// A storm ends after this long without a pause frame for it, ms (default 200, or twice
    /// `watchdog_ms` when only that is set).
    pub restore_ms: Option<u32>,
    /// During a storm: `drop` (default: the priority's packets are discarded) or `forward`
    /// (they are sent regardless of pauses).
    pub watchdog_action: Option<String>,
    /// Receive buffer per priority, KiB of mbuf memory the waiting frames hold (default
    /// 1024). A lossy priority's frames past it are dropped (counted).
    pub rx_buffer_kb: Option<u32>,
    /// Of that, the headroom kept for what the peer sends after an XOFF, KiB (default half the
    /// buffer): XOFF when a lossless priority holds `rx_buffer_kb - rx_headroom_kb`, XON at
    /// half of that.
    pub rx_headroom_kb: Option<u32>,
}

/// `[dcqcn]`: DCQCN's notification point (CNPs for CE-marked packets) and reaction point
/// (per-QP rate cut on CNPs, packets paced). Parameters carry the mlx5 names
/// (drivers/infiniband/hw/mlx5/cong.c); unset ones take the variant's defaults (ref. dcb.md).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawDcqcn {
    /// Reaction point on (mlx5 `roce_rp/enable`; default false).
    pub rp: Option<bool>,
    /// Notification point on (mlx5 `roce_np/enable`; default false).
    pub np: Option<bool>,
    /// `firmware` (NVIDIA ConnectX semantics, default) or `paper` (SIGCOMM'15).
    pub variant: Option<String>,
    /// Line rate a QP returns to, Mb/s (default: `port.speed_gbps`).
    pub line_rate_mbps: Option<u32>,
    /// Increase timer, us.
    pub rp_time_reset: Option<u32>,
    /// Byte counter, bytes (0: off).
    pub rp_byte_reset: Option<u64>,
    /// Stage threshold F.
    pub rp_threshold: Option<u32>,
    /// Additive increase, Mb/s.
    pub rp_ai_rate: Option<f64>,
    /// Hyper increase, Mb/s.
    pub rp_hai_rate: Option<f64>,
    /// Largest cut, percent.
    pub rp_min_dec_fac: Option<u32>,
    /// Minimum rate, Mb/s.
    pub rp_min_rate: Option<f64>,
    /// Rate set on the first CNP, Mb/s (0: keep).
    pub rp_rate_to_set_on_first_cnp: Option<f64>,
    /// Alpha gain, read as g = (1024 - value) / 1024 (docs/dcb.md says why).
    pub rp_dce_tcp_g: Option<u32>,
    /// Alpha period, us.
    pub rp_dce_tcp_rtt: Option<u32>,
    /// At most one cut per this period, us.
    pub rp_rate_reduce_monitor_period: Option<u32>,
    /// Alpha on the first CNP, 1024ths.
    pub rp_initial_alpha_value: Option<u32>,
    /// The cut is RC x alpha / 2^rp_gd (firmware).
    pub rp_gd: Option<u32>,
    /// Target rate = current rate on every cut.
    pub rp_clamp_tgt_rate: Option<bool>,
    /// Target rate = current rate on a cut after a timer increase.
    pub rp_clamp_tgt_rate_ati: Option<bool>,
    /// At most one CNP per QP per this many us (paper: 50; firmware: a few; 0: one per
    /// CE-marked packet). Default 4, or 50 with `variant = "paper"`.
    pub np_min_time_between_cnps: Option<u32>,
    /// DSCP of the CNPs sent (default 48).
    pub np_cnp_dscp: Option<u8>,
    /// 802.1p priority of the CNPs sent (default 6).
    pub np_cnp_prio: Option<u8>,
}

/// `[host]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawHost {
    /// rnicd's Unix socket (default /run/ferroce/rnicd.sock).
    pub socket: Option<String>,
    /// Group that owns the socket (default: rnicd's own).
    pub group: Option<String>,
    /// The socket's permission bits, octal (default "0660").
    pub mode: Option<String>,
    /// Clients attached at once (default 64, at most 65534).
    pub max_clients: Option<u32>,
    /// QPs per client (default: a quarter of the device's).
    pub max_qps: Option<u32>,
    /// CQs per client (default: a quarter of the device's).
    pub max_cqs: Option<u32>,
    /// MRs per client (default: a quarter of the device's).
    pub max_mrs: Option<u32>,
    /// PDs per client (default: a quarter of the device's).
    pub max_pds: Option<u32>,
    /// SRQs per client (default: a quarter of the device's).
    pub max_srqs: Option<u32>,
    /// Bytes of memory a client shares with the RNIC: buffers and registered memory
    /// (default 16 GiB).
    pub max_area_bytes: Option<u64>,
    /// Memory areas (mappings) per client (default 1024).
    pub max_areas: Option<u32>,
    /// Bytes of queue memory the RNIC allocates for a client's QPs, SRQs and CQs (default
    /// 256 MiB).
    pub max_queue_bytes: Option<u64>,
}

/// `[eal]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawEal {
    /// Extra EAL arguments, whitespace separated (replace the software defaults when set).
    pub args: Option<String>,
    /// `--file-prefix`.
    pub file_prefix: Option<String>,
}

/// `[port]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawPort {
    /// vdev devargs (`net_...`) or a PCI address.
    pub device: Option<String>,
    /// IP MTU of the link.
    pub mtu: Option<u32>,
    /// Receive descriptors.
    pub rx_desc: Option<u32>,
    /// Transmit descriptors.
    pub tx_desc: Option<u32>,
    /// Mbufs in the pool.
    pub mbufs: Option<u32>,
    /// Promiscuous mode.
    pub promiscuous: Option<bool>,
    /// Link speed in Gb/s (default 100): pause quanta are bit times at it and DCQCN's line
    /// rate is it. The speed a driver reports is not read: set this to a real port's.
    pub speed_gbps: Option<u32>,
}

/// `[address]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawAddress {
    /// MAC address (default: the port's).
    pub mac: Option<String>,
    /// IPv4 addresses with prefix length.
    #[serde(default)]
    pub ipv4: Vec<String>,
    /// IPv6 addresses with prefix length.
    #[serde(default)]
    pub ipv6: Vec<String>,
    /// IPv4 gateway for off-subnet peers.
    pub gateway: Option<String>,
    /// IPv6 gateway for off-subnet peers.
    pub gateway6: Option<String>,
}

/// `[roce]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawRoce {
    /// Largest path MTU (bytes).
    pub path_mtu: Option<u32>,
    /// VLAN id to tag frames with.
    pub vlan: Option<u16>,
    /// 802.1p priority for tagged frames.
    pub pcp: Option<u8>,
    /// DSCP of RoCE packets.
    pub dscp: Option<u8>,
    /// Mark packets ECN-capable (ECT(0)).
    pub ecn: Option<bool>,
    /// Credit advertisement: `receive-queue` (default) or `unlimited` (like rxe).
    pub credits: Option<String>,
    /// Merge ACKs of one receive batch (default true; false sends one per AckReq, like rxe).
    pub ack_coalescing: Option<bool>,
    /// How long a UD message that finds no receive WQE waits for one (microseconds; 0 drops
    /// at once, as a hardware NIC does). Default 50000.
    pub ud_rx_hold_us: Option<u32>,
    /// How many such messages wait at most per port. Default 1024.
    pub ud_rx_hold_frames: Option<u32>,
    /// Queue pairs per RNIC (default 16384, at most 262144): the size of the QP table, which
    /// is indexed by QPN (no hashing), and of each client's index area (16 bytes a QP).
    pub max_qp: Option<u32>,
    /// PSNs a requester may have unacknowledged (default 128, rxe's; up to 2^22). A link whose
    /// bandwidth-delay product exceeds 128 packets needs more to keep one QP busy.
    pub send_window: Option<u32>,
    /// A requester sets AckReq at least every this many packets of a message (default 64,
    /// rxe's RXE_MAX_PKT_PER_ACK, and wire-exact with rxe only then; never less often than the
    /// send window needs, whatever is set here). With the window of 128,
    /// a message longer than the window draws one ACK per window and the sender idles half
    /// of each round trip on a long link; a quarter or an eighth of the window keeps it
    /// moving.
    pub ack_every: Option<u32>,
    /// Which field gives a packet its priority (PFC class): `pcp` (the QP's SL, default) or
    /// `dscp` (DSCP / 8), as mlx5's `trust`.
    pub trust: Option<String>,
}

/// `[worker]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawWorker {
    /// Idle iterations spent spinning before yielding.
    pub idle_spin: Option<u32>,
    /// Idle iterations that yield the CPU (sched_yield) before sleeping.
    pub idle_pause: Option<u32>,
    /// Sleep when idle, in microseconds.
    pub idle_sleep_us: Option<u32>,
    /// The longest idle sleep, in microseconds, that a worker idle for a while grows its
    /// sleep to (doubling from `idle_sleep_us`).
    pub idle_sleep_max_us: Option<u32>,
    /// Whether an in-process application thread waiting on a CQ or a reply runs the worker
    /// itself (run-to-completion; default true).
    pub app_drive: Option<bool>,
    /// The worker thread that drives this RNIC (RNICs with the same number share one).
    pub thread: Option<u32>,
    /// How many worker threads share this RNIC's QPs: `thread`, `thread + 1`, ... (1 by
    /// default).
    pub count: Option<u32>,
    /// Whether one context's QPs spread over those workers (CQs and SRQs shared by QPs on
    /// several workers); off by default: a context is on one worker.
    pub spread: Option<bool>,
    /// Messages each queue between a spread context's workers holds (1..=65536; 1024).
    pub spread_queue: Option<u32>,
}

/// `[capture]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawCapture {
    /// Write every frame sent and received to this pcap file.
    pub pcap: Option<String>,
    /// Bytes kept of each frame (default 262144, as tcpdump; 0 is refused).
    pub snaplen: Option<u32>,
    /// Start capturing at once (default true); it can be switched on and off while running.
    pub enabled: Option<bool>,
}

/// The outcome of one `rnicd --check` item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Checked and fine.
    Ok(String),
    /// Checked and wrong: the RNIC would not work.
    Fail(String),
    /// The configuration is right, but this machine lacks something it names (an interface
    /// that does not exist yet): rnicd could not start here now.
    NotReady(String),
    /// Cannot be known without starting the port.
    NeedsPort(String),
}

/// The device name of `rnicd --loopback`'s (and the tests') internal ring link between two
/// RNICs of one process: not a DPDK driver, made by the runtime itself.
pub const LOOPBACK_DEVICE: &str = "net_ring_loopback";

/// Drivers that create the kernel interface their `iface=` names (so it need not exist).
const CREATES_IFACE: &[&str] = &["net_tap", "net_tun"];

/// Virtual device drivers of DPDK 22.11 that carry Ethernet frames (`net_...` devargs).
pub const KNOWN_VDEV_DRIVERS: &[&str] = &[
    "net_af_packet",
    "net_af_xdp",
    "net_bonding",
    "net_failsafe",
    "net_memif",
    "net_null",
    "net_pcap",
    "net_ring",
    "net_tap",
    "net_tun",
    "net_vhost",
    "net_virtio_user",
];

/// The driver of a vdev's devargs: the name without its instance number (`net_tap0` ->
/// `net_tap`).
fn vdev_driver(device: &str) -> Option<&str> {
    let name = device.split(',').next()?.trim();
    name.starts_with("net_")
        .then(|| name.trim_end_matches(|c: char| c.is_ascii_digit()))
}

/// Why a port probably cannot be opened, when that can be told without DPDK: an unknown
/// vdev driver, or a vdev bound to a kernel interface that does not exist.
pub fn port_problem(device: &str) -> Option<String> {
    if device == LOOPBACK_DEVICE {
        return None;
    }
    if let Some(d) = vdev_driver(device) {
        if !KNOWN_VDEV_DRIVERS.contains(&d) {
            return Some(format!(
                "port.device {device}: DPDK has no virtual device driver {d} (known: {})",
                KNOWN_VDEV_DRIVERS.join(", ")
            ));
        }
    }
    if vdev_driver(device).is_some_and(|d| CREATES_IFACE.contains(&d)) {
        return None;
    }
    let iface = device_iface(device)?;
    (!Path::new("/sys/class/net").join(&iface).exists())
        .then(|| format!("port.device {device}: no network interface {iface} here"))
}

/// The kernel interface a vdev binds to (`iface=` of net_af_packet, net_tap, net_pcap's
/// `iface=`), if any.
fn device_iface(device: &str) -> Option<String> {
    device
        .split(',')
        .skip(1)
        .find_map(|kv| kv.trim().strip_prefix("iface="))
        .map(String::from)
}

/// `[fault]`: a fault-injecting transmit path, for testing recovery on real links.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawFault {
    /// Probability a frame is dropped.
    pub loss: Option<f64>,
    /// Probability a frame is sent twice.
    pub duplicate: Option<f64>,
    /// Probability one byte is flipped.
    pub corrupt: Option<f64>,
    /// Probability a frame is held back behind the next one (at most 100 us).
    pub reorder: Option<f64>,
    /// Probability an ECN-capable frame leaves with CE set, as a congested switch would
    /// mark it (drives the peer's DCQCN notification point without a switch).
    pub ce: Option<f64>,
    /// Hold every frame this many microseconds before it leaves (a long link, where this
    /// kernel has no netem). At most 10 s.
    pub delay_us: Option<u32>,
    /// Handle at most this many received frames per second (0: no limit): a receiver too
    /// slow for its link, whose backlog then builds in its receive buffer.
    pub rx_pps: Option<u64>,
    /// RNG seed.
    pub seed: Option<u64>,
}

/// An address with its prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr<A> {
    /// The address.
    pub addr: A,
    /// Prefix length.
    pub prefix: u8,
}

impl Cidr<Ipv4Addr> {
    /// Whether `a` is in this subnet.
    pub fn contains(&self, a: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - self.prefix)
        };
        u32::from(a) & mask == u32::from(self.addr) & mask
    }
}

impl Cidr<Ipv6Addr> {
    /// Whether `a` is in this subnet.
    pub fn contains(&self, a: Ipv6Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - self.prefix as u32)
        };
        u128::from(a) & mask == u128::from(self.addr) & mask
    }
}

/// Fault injection probabilities.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FaultConfig {
    /// Drop.
    pub loss: f64,
    /// Duplicate.
    pub duplicate: f64,
    /// Corrupt one byte.
    pub corrupt: f64,
    /// Swap with the next frame (or leave alone after 100 us if none comes).
    pub reorder: f64,
    /// Set CE on an ECN-capable frame.
    pub ce: f64,
    /// Hold every frame this long before it leaves (us).
    pub delay_us: u32,
    /// Received frames handled per second at most (0: no limit; receive side, so not part of
    /// [`FaultConfig::any`]).
    pub rx_pps: u64,
    /// Seed.
    pub seed: u64,
}

impl FaultConfig {
    /// Writes `loss`, `duplicate`, `corrupt` and `reorder` as TOML lines.
    fn push_probabilities(&self, t: &mut String) {
        for (k, v) in [
            ("loss", self.loss),
            ("duplicate", self.duplicate),
            ("corrupt", self.corrupt),
            ("reorder", self.reorder),
        ] {
            t.push_str(&format!("{k} = {v:?}\n"));
        }
    }

    /// Whether any fault is enabled.
    pub fn any(&self) -> bool {
        self.loss > 0.0
            || self.duplicate > 0.0
            || self.corrupt > 0.0
            || self.reorder > 0.0
            || self.ce > 0.0
            || self.delay_us > 0
    }
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct RnicConfig {
    /// EAL arguments (None: software defaults).
    pub eal_args: Option<Vec<String>>,
    /// EAL file prefix.
    pub file_prefix: Option<String>,
    /// Port: devargs or PCI address.
    pub device: String,
    /// IP MTU.
    pub mtu: u32,
    /// Receive descriptors.
    pub rx_desc: u16,
    /// Transmit descriptors.
    pub tx_desc: u16,
    /// Mbufs.
    pub mbufs: u32,
    /// Promiscuous.
    pub promiscuous: bool,
    /// Link speed to assume when the driver reports none, in Gb/s.
    pub speed_gbps: u32,
    /// MAC (None: the port's own).
    pub mac: Option<[u8; 6]>,
    /// IPv4 addresses.
    pub ipv4: Vec<Cidr<Ipv4Addr>>,
    /// IPv6 addresses.
    pub ipv6: Vec<Cidr<Ipv6Addr>>,
    /// IPv4 gateway.
    pub gateway: Option<Ipv4Addr>,
    /// IPv6 gateway.
    pub gateway6: Option<Ipv6Addr>,
    /// Largest path MTU.
    pub path_mtu: Mtu,
    /// VLAN id.
    pub vlan: Option<u16>,
    /// 802.1p priority.
    pub pcp: u8,
    /// DSCP.
    pub dscp: u8,
    /// ECT(0) marking.
    pub ecn: bool,
    /// Credits advertised from the receive queue (false: unlimited, like rxe).
    pub credits_from_rq: bool,
    /// Coalesce ACKs.
    pub ack_coalescing: bool,
    /// How long a UD message without a receive WQE waits for one (us; 0: dropped at once).
    pub ud_rx_hold_us: u32,
    /// How many such messages wait at most.
    pub ud_rx_hold_frames: u32,
    /// Queue pairs the RNIC holds.
    pub max_qp: u32,
    /// Unacknowledged PSNs a requester may have outstanding.
    pub send_window: u32,
    /// AckReq at least every this many packets (`roce.ack_every`).
    pub ack_every: u32,
    /// Idle spin iterations.
    pub idle_spin: u32,
    /// Idle iterations that yield the CPU.
    pub idle_pause: u32,
    /// Idle sleep (us).
    pub idle_sleep_us: u32,
    /// The longest idle sleep (us) a long-idle worker grows to (`worker.idle_sleep_max_us`).
    pub idle_sleep_max_us: u32,
    /// Whether in-process application threads run the worker while they wait
    /// (`worker.app_drive`): run-to-completion, no thread hop, the shortest round trip; off,
    /// the worker's own thread does all the work, in parallel with the application's.
    pub app_drive: bool,
    /// The worker thread that drives this RNIC (`worker.thread`; RNICs with the same number
    /// share one; 0 by default: one worker for all).
    pub worker_thread: u32,
    /// How many worker threads share the RNIC's QPs (`worker.count`): threads
    /// `worker_thread ..= worker_thread + worker_count - 1`, the first owning the port
    /// (docs/ARCHITECTURE.md, "Several workers per RNIC").
    pub worker_count: u32,
    /// Whether one context's QPs spread over the RNIC's workers (`worker.spread`; every
    /// context's home is the first worker, its QPs go to the workers in turn; docs/
    /// ARCHITECTURE.md, "One context over several workers").
    pub worker_spread: bool,
    /// Messages each queue between the workers of spread contexts holds
    /// (`worker.spread_queue`): posts and calls one way, completions and answers the other;
    /// past it they wait in order with their sender.
    pub spread_queue: u32,
    /// Capture file.
    pub pcap: Option<PathBuf>,
    /// Bytes kept per captured frame.
    pub snaplen: u32,
    /// Capturing from the start.
    pub capture_enabled: bool,
    /// Faults.
    pub fault: FaultConfig,
    /// rnicd's socket and client limits.
    pub host: HostConfig,
    /// ECN congestion control (`[dcqcn]`).
    pub dcqcn: CongestionConfig,
    /// Flow control from the link partner (`[pfc]`).
    pub pfc: PfcConfig,
    /// Which field gives a packet its priority (`roce.trust`).
    pub trust: Trust,
    /// ETS between traffic classes (`[ets]`; `None`: one round robin over every QP).
    pub ets: Option<EtsConfig>,
    /// An emulated switch between the RNIC and its port (`[switch]`; `None`: none). Its
    /// port 0 is the RNIC's link, port 1 the port's.
    pub switch: Option<SwitchSettings>,
}

/// `[pfc]`, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcConfig {
    /// PFC on some priorities, PAUSE, or off.
    pub mode: Mode,
    /// The storm watchdog (None: off).
    pub watchdog: Option<PfcWatchdog>,
    /// Receive buffer per priority, bytes of mbuf memory (`rx_buffer_kb`).
    pub rx_buffer: u64,
    /// Headroom above the XOFF threshold, bytes (`rx_headroom_kb`).
    pub rx_headroom: u64,
}

impl PfcConfig {
    /// Default receive buffer per priority (1 MiB: 240 full-size frames in 4 KiB mbufs).
    pub const DEFAULT_RX_BUFFER: u64 = 1 << 20;

    /// With PFC or PAUSE on, XOFF must be reachable within the frames the receive buffer
    /// may hold (a quarter of a pool of `mbufs`), each charged at least a 2 KiB mbuf: else
    /// no pause is ever sent and lossless frames are dropped. Checked by `validate`, and
    /// again by whoever turns PFC on afterwards (`--switch-pfc`).
    pub fn check_reachable(&self, mbufs: u32) -> Result<(), ConfigError> {
        let frames = mbufs as u64 / 4;
        let xoff = self.rx_thresholds().xoff;
        if self.mode != Mode::Off && xoff > frames * 2048 {
            return err(
                "pfc.rx_buffer_kb",
                format!(
                    "XOFF at {} KiB is more than the {frames} frames the receive buffer holds \
                     (a quarter of port.mbufs): raise port.mbufs or lower the buffer",
                    xoff >> 10
                ),
            );
        }
        Ok(())
    }

    /// The receive side's thresholds: XOFF at the buffer less its headroom, XON at half of
    /// XOFF (a gap of many frames, so a receiver that just keeps up does not send a pause
    /// frame per frame handled).
    pub fn rx_thresholds(&self) -> dcb::pfc::Thresholds {
        let xoff = self.rx_buffer.saturating_sub(self.rx_headroom);
        dcb::pfc::Thresholds {
            xoff,
            xon: xoff / 2,
        }
    }
}

impl Default for PfcConfig {
    fn default() -> PfcConfig {
        PfcConfig {
            mode: Mode::Off,
            watchdog: None,
            rx_buffer: Self::DEFAULT_RX_BUFFER,
            rx_headroom: Self::DEFAULT_RX_BUFFER / 2,
        }
    }
}

/// The PFC storm watchdog's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcWatchdog {
    /// Paused without a break this long: a storm (ms).
    pub detect_ms: u32,
    /// No pause frame for this long: the storm is over (ms).
    pub restore_ms: u32,
    /// What happens to the stormed priority meanwhile.
    pub action: StormAction,
}

/// What the switch is (per port rate and delay, buffer, marking, PFC).
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchSettings {
    /// Rate of every port's link, Mb/s, both ways: the switch sends to the port at it and
    /// takes frames from the port no faster (the link partner's frames wait in its own
    /// transmit ring meanwhile, which holds its sender back as a real link does).
    pub rate_mbps: f64,
    /// Per-port rates overriding `rate_mbps` (index = port), e.g. a slow receiver's port.
    pub port_mbps: Vec<f64>,
    /// Bytes above XOFF an ingress port and priority may still bring in before frames are
    /// dropped: at least what the link partner's transmit ring holds (it cannot recall
    /// frames handed to its NIC) plus a round trip at the port's rate.
    pub headroom: u64,
    /// Propagation delay added on every egress, us (at most 10 s).
    pub delay_us: u32,
    /// Shared buffer, bytes.
    pub buffer: u64,
    /// ECN marking at dequeue (`None`: none).
    pub red: Option<Red>,
    /// PFC towards the ingress ports (and honoured from them).
    pub pfc: Mode,
    /// XOFF/XON per ingress port and priority, bytes.
    pub thresholds: Thresholds,
    /// Capture every frame the switch sends, on any port, as it leaves (after marking; PFC
    /// frames included), like a mirror port.
    pub pcap: Option<std::path::PathBuf>,
    /// Record the bytes queued at every egress port this often, us (0: never); taken with
    /// `Runtime::take_switch_samples`.
    pub sample_us: u32,
    /// Faults on every frame the switch sends (loss, duplication, corruption, reordering;
    /// per egress port, each port's sequence seeded from `seed` and the port's number).
    pub fault: FaultConfig,
}

impl Default for SwitchSettings {
    /// 10 Gb/s, no delay, 4 MiB, no marking, no PFC, XOFF 200 KB, 256 KiB of headroom.
    fn default() -> Self {
        SwitchSettings {
            rate_mbps: 10_000.0,
            port_mbps: Vec::new(),
            headroom: 256 << 10,
            delay_us: 0,
            buffer: 4 << 20,
            red: None,
            pfc: Mode::Off,
            thresholds: Thresholds {
                xoff: 200_000,
                xon: 200_000 - 2 * 9000,
            },
            pcap: None,
            sample_us: 0,
            fault: FaultConfig::default(),
        }
    }
}

/// rnicd's socket and what each client may hold (`[host]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostConfig {
    /// Socket path.
    pub socket: PathBuf,
    /// Owning group of the socket.
    pub group: Option<String>,
    /// Permission bits of the socket.
    pub mode: u32,
    /// Clients at once.
    pub max_clients: u32,
    /// QPs per client (None: a quarter of the device's limit).
    pub max_qps: Option<u32>,
    /// CQs per client.
    pub max_cqs: Option<u32>,
    /// MRs per client.
    pub max_mrs: Option<u32>,
    /// PDs per client.
    pub max_pds: Option<u32>,
    /// SRQs per client.
    pub max_srqs: Option<u32>,
    /// Shared bytes per client.
    pub max_area_bytes: u64,
    /// Memory areas per client.
    pub max_areas: u32,
    /// Queue memory per client, bytes.
    pub max_queue_bytes: u64,
}

/// The most clients rnicd can tell apart (`host.max_clients`).
pub const MAX_CLIENTS: u32 = u16::MAX as u32 - 1;

/// The share of a device's objects a client may hold unless configured otherwise: a quarter,
/// so that no one client can take what every other needs (at least four clients can each
/// reach their limit), while one client alone still gets far more than perftest,
/// the rdma-core examples or an MPI rank use.
pub const DEFAULT_CLIENT_SHARE: u32 = 4;

impl HostConfig {
    /// The per-client limits on a device with `dev`'s limits: each configured value, or
    /// `1 / DEFAULT_CLIENT_SHARE` of the device's.
    pub fn client_limits(
        &self,
        dev: &roce::engine::DeviceLimits,
    ) -> ferroce_host::abi::ClientLimits {
        let share = |v: Option<u32>, d: u32| v.unwrap_or((d / DEFAULT_CLIENT_SHARE).max(1));
        ferroce_host::abi::ClientLimits {
            max_qps: share(self.max_qps, dev.max_qp),
            max_cqs: share(self.max_cqs, dev.max_cq),
            max_mrs: share(self.max_mrs, dev.max_mr),
            max_pds: share(self.max_pds, dev.max_pd),
            max_srqs: share(self.max_srqs, dev.max_srq),
            max_area_bytes: self.max_area_bytes,
            max_areas: self.max_areas,
            max_queue_bytes: self.max_queue_bytes,
        }
    }
}

fn parse_cidr<A: std::str::FromStr>(key: &str, s: &str, max: u8) -> Result<Cidr<A>, ConfigError> {
    let (a, p) = match s.split_once('/') {
        Some((a, p)) => (a, p),
        None => return err(key, format!("{s:?} needs a prefix length, e.g. {s}/24")),
    };
    let addr = a.trim().parse::<A>().map_err(|_| ConfigError {
        key: key.into(),
        problem: format!("{a:?} is not a valid address"),
    })?;
    let prefix: u8 = p.trim().parse().map_err(|_| ConfigError {
        key: key.into(),
        problem: format!("prefix length {p:?} is not a number"),
    })?;
    if prefix > max {
        return err(key, format!("prefix length {prefix} exceeds {max}"));
    }
    Ok(Cidr { addr, prefix })
}

fn prob(key: &str, v: Option<f64>) -> Result<f64, ConfigError> {
    match v {
        None => Ok(0.0),
        Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
        Some(p) => err(key, format!("{p} is not a probability in 0..=1")),
    }
}

impl RawConfig {
    /// Parses TOML text.
    pub fn parse(text: &str) -> Result<RawConfig, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let key = e
                .span()
                .map(|s| format!("line {}", text[..s.start].lines().count().max(1)))
                .unwrap_or_else(|| "file".into());
            ConfigError {
                key,
                problem: e.message().to_string(),
            }
        })
    }

    /// Reads and parses a TOML file.
    pub fn load(path: &Path) -> Result<RawConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            key: path.display().to_string(),
            problem: format!("cannot read: {e}"),
        })?;
        Self::parse(&text)
    }

    /// Applies one `key=value` override (keys as in the file: `port.device`,
    /// `address.ipv4` (comma-separated), `roce.path_mtu`...).
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let num = |v: &str| -> Result<u64, ConfigError> {
            v.parse().map_err(|_| ConfigError {
                key: key.into(),
                problem: format!("{v:?} is not a number"),
            })
        };
        let boolean = |v: &str| -> Result<bool, ConfigError> {
            match v {
                "true" | "yes" | "1" | "on" => Ok(true),
                "false" | "no" | "0" | "off" => Ok(false),
                _ => err(key, format!("{v:?} is not true/false")),
            }
        };
        let list = |v: &str| {
            v.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let small = |v: &str, max: u64| -> Result<u64, ConfigError> {
            let n = num(v)?;
            if n > max {
                return err(key, format!("{n} exceeds {max}"));
            }
            Ok(n)
        };
        // A comma-separated list of small numbers (priorities, classes, percentages).
        let bytes = |v: &str| -> Result<Vec<u8>, ConfigError> {
            let items: Vec<String> = list(v);
            items
                .iter()
                .map(|s| small(s, 255).map(|n| n as u8))
                .collect()
        };
        match key {
            "eal.args" => self.eal.args = Some(value.into()),
            "eal.file_prefix" => self.eal.file_prefix = Some(value.into()),
            "port.device" => self.port.device = Some(value.into()),
            "port.mtu" => self.port.mtu = Some(small(value, u32::MAX as u64)? as u32),
            "port.rx_desc" => self.port.rx_desc = Some(small(value, u32::MAX as u64)? as u32),
            "port.tx_desc" => self.port.tx_desc = Some(small(value, u32::MAX as u64)? as u32),
            "port.mbufs" => self.port.mbufs = Some(small(value, u32::MAX as u64)? as u32),
            "port.promiscuous" => self.port.promiscuous = Some(boolean(value)?),
            "port.speed_gbps" => self.port.speed_gbps = Some(small(value, u32::MAX as u64)? as u32),
            "address.mac" => self.address.mac = Some(value.into()),
            "address.ipv4" => self.address.ipv4 = list(value),
            "address.ipv6" => self.address.ipv6 = list(value),
            "address.gateway" => self.address.gateway = Some(value.into()),
            "address.gateway6" => self.address.gateway6 = Some(value.into()),
            "roce.path_mtu" => self.roce.path_mtu = Some(small(value, u32::MAX as u64)? as u32),
            "roce.vlan" => self.roce.vlan = Some(small(value, u16::MAX as u64)? as u16),
            "roce.pcp" => self.roce.pcp = Some(small(value, 255)? as u8),
            "roce.dscp" => self.roce.dscp = Some(small(value, 255)? as u8),
            "roce.ecn" => self.roce.ecn = Some(boolean(value)?),
            "roce.credits" => self.roce.credits = Some(value.into()),
            "roce.ack_coalescing" => self.roce.ack_coalescing = Some(boolean(value)?),
            "roce.ud_rx_hold_us" => {
                self.roce.ud_rx_hold_us = Some(small(value, MAX_HOLD_US as u64)? as u32)
            }
            "roce.ud_rx_hold_frames" => {
                self.roce.ud_rx_hold_frames = Some(small(value, MAX_HOLD_FRAMES as u64)? as u32)
            }
            "roce.max_qp" => self.roce.max_qp = Some(small(value, MAX_QP_LIMIT as u64)? as u32),
            "roce.trust" => self.roce.trust = Some(value.into()),
            "ets.tsa" => self.ets.tsa = Some(list(value)),
            "ets.bw" => self.ets.bw = Some(bytes(value)?),
            "ets.prio_tc" => self.ets.prio_tc = Some(bytes(value)?),
            "pfc.mode" => self.pfc.mode = Some(value.into()),
            "pfc.priorities" => self.pfc.priorities = Some(bytes(value)?),
            "pfc.watchdog_ms" => {
                self.pfc.watchdog_ms = Some(small(value, MAX_WATCHDOG_MS as u64)? as u32)
            }
            "pfc.restore_ms" => {
                self.pfc.restore_ms = Some(small(value, MAX_WATCHDOG_MS as u64)? as u32)
            }
            "pfc.watchdog_action" => self.pfc.watchdog_action = Some(value.into()),
            "pfc.rx_buffer_kb" => self.pfc.rx_buffer_kb = Some(small(value, 1 << 20)? as u32),
            "pfc.rx_headroom_kb" => self.pfc.rx_headroom_kb = Some(small(value, 1 << 20)? as u32),
            "roce.ack_every" => self.roce.ack_every = Some(small(value, u32::MAX as u64)? as u32),
            "roce.send_window" => {
                self.roce.send_window = Some(small(value, MAX_SEND_WINDOW as u64)? as u32)
            }
            "worker.idle_spin" => {
                self.worker.idle_spin = Some(small(value, MAX_IDLE_POLLS as u64)? as u32)
            }
            "worker.idle_pause" => {
                self.worker.idle_pause = Some(small(value, MAX_IDLE_POLLS as u64)? as u32)
            }
            "worker.idle_sleep_us" => {
                self.worker.idle_sleep_us = Some(small(value, MAX_IDLE_SLEEP_US as u64)? as u32)
            }
            "worker.idle_sleep_max_us" => {
                self.worker.idle_sleep_max_us = Some(small(value, MAX_IDLE_SLEEP_US as u64)? as u32)
            }
            "worker.app_drive" => self.worker.app_drive = Some(boolean(value)?),
            "worker.thread" => {
                self.worker.thread = Some(small(value, MAX_WORKER_THREAD as u64)? as u32)
            }
            "worker.count" => {
                self.worker.count = Some(small(value, MAX_WORKER_THREAD as u64 + 1)? as u32)
            }
            "worker.spread" => self.worker.spread = Some(boolean(value)?),
            "worker.spread_queue" => {
                self.worker.spread_queue = Some(small(value, MAX_SPREAD_QUEUE as u64)? as u32)
            }
            "capture.pcap" => self.capture.pcap = Some(value.into()),
            "capture.snaplen" => self.capture.snaplen = Some(small(value, u32::MAX as u64)? as u32),
            "capture.enabled" => self.capture.enabled = Some(boolean(value)?),
            "fault.loss" | "fault.duplicate" | "fault.corrupt" | "fault.reorder" | "fault.ce" => {
                let p: f64 = value.parse().map_err(|_| ConfigError {
                    key: key.into(),
                    problem: format!("{value:?} is not a number"),
                })?;
                match key {
                    "fault.loss" => self.fault.loss = Some(p),
                    "fault.duplicate" => self.fault.duplicate = Some(p),
                    "fault.corrupt" => self.fault.corrupt = Some(p),
                    "fault.ce" => self.fault.ce = Some(p),
                    _ => self.fault.reorder = Some(p),
                }
            }
            "fault.seed" => self.fault.seed = Some(num(value)?),
            "switch.enabled" => self.switch.enabled = Some(boolean(value)?),
            "switch.rate_mbps" | "switch.rnic_mbps" | "switch.ecn_pmax" | "switch.loss"
            | "switch.duplicate" | "switch.corrupt" | "switch.reorder" => {
                let v: f64 = value.parse().map_err(|_| ConfigError {
                    key: key.into(),
                    problem: format!("{value:?} is not a number"),
                })?;
                let w = &mut self.switch;
                *match key {
                    "switch.rate_mbps" => &mut w.rate_mbps,
                    "switch.rnic_mbps" => &mut w.rnic_mbps,
                    "switch.ecn_pmax" => &mut w.ecn_pmax,
                    "switch.loss" => &mut w.loss,
                    "switch.duplicate" => &mut w.duplicate,
                    "switch.corrupt" => &mut w.corrupt,
                    _ => &mut w.reorder,
                } = Some(v);
            }
            "switch.seed" => self.switch.seed = Some(num(value)?),
            "switch.delay_us" => self.switch.delay_us = Some(small(value, 10_000_000)? as u32),
            "switch.buffer_kb" | "switch.ecn_kmin_kb" | "switch.ecn_kmax_kb" | "switch.xoff_kb"
            | "switch.xon_kb" | "switch.headroom_kb" => {
                let v = Some(small(value, 1 << 20)? as u32);
                let w = &mut self.switch;
                match key {
                    "switch.buffer_kb" => w.buffer_kb = v,
                    "switch.ecn_kmin_kb" => w.ecn_kmin_kb = v,
                    "switch.ecn_kmax_kb" => w.ecn_kmax_kb = v,
                    "switch.xoff_kb" => w.xoff_kb = v,
                    "switch.xon_kb" => w.xon_kb = v,
                    _ => w.headroom_kb = v,
                }
            }
            "switch.pfc" => self.switch.pfc = Some(bytes(value)?),
            "switch.pcap" => self.switch.pcap = Some(value.into()),
            "fault.delay_us" => {
                self.fault.delay_us = Some(small(value, MAX_DELAY_US as u64)? as u32)
            }
            "fault.rx_pps" => self.fault.rx_pps = Some(small(value, 1 << 40)?),
            "host.socket" => self.host.socket = Some(value.into()),
            "host.group" => self.host.group = Some(value.into()),
            "host.mode" => self.host.mode = Some(value.into()),
            "host.max_clients" => {
                self.host.max_clients = Some(small(value, u32::MAX as u64)? as u32)
            }
            "host.max_qps" => self.host.max_qps = Some(small(value, u32::MAX as u64)? as u32),
            "host.max_cqs" => self.host.max_cqs = Some(small(value, u32::MAX as u64)? as u32),
            "host.max_mrs" => self.host.max_mrs = Some(small(value, u32::MAX as u64)? as u32),
            "host.max_pds" => self.host.max_pds = Some(small(value, u32::MAX as u64)? as u32),
            "host.max_srqs" => self.host.max_srqs = Some(small(value, u32::MAX as u64)? as u32),
            "host.max_area_bytes" => self.host.max_area_bytes = Some(num(value)?),
            "host.max_areas" => self.host.max_areas = Some(small(value, u32::MAX as u64)? as u32),
            "host.max_queue_bytes" => self.host.max_queue_bytes = Some(num(value)?),
            "dcqcn.rp" => self.dcqcn.rp = Some(boolean(value)?),
            "dcqcn.np" => self.dcqcn.np = Some(boolean(value)?),
            "dcqcn.variant" => self.dcqcn.variant = Some(value.into()),
            "dcqcn.rp_byte_reset" => self.dcqcn.rp_byte_reset = Some(num(value)?),
            "dcqcn.rp_clamp_tgt_rate" => self.dcqcn.rp_clamp_tgt_rate = Some(boolean(value)?),
            "dcqcn.rp_clamp_tgt_rate_ati" => {
                self.dcqcn.rp_clamp_tgt_rate_ati = Some(boolean(value)?)
            }
            "dcqcn.np_cnp_dscp" => self.dcqcn.np_cnp_dscp = Some(small(value, 63)? as u8),
            "dcqcn.np_cnp_prio" => self.dcqcn.np_cnp_prio = Some(small(value, 7)? as u8),
            "dcqcn.rp_ai_rate"
            | "dcqcn.rp_hai_rate"
            | "dcqcn.rp_min_rate"
            | "dcqcn.rp_rate_to_set_on_first_cnp" => {
                let v: f64 = value.parse().map_err(|_| ConfigError {
                    key: key.into(),
                    problem: format!("{value:?} is not a rate in Mb/s"),
                })?;
                if !(0.0..=1e7).contains(&v) {
                    return err(key, format!("{v} Mb/s is not in 0..=10000000"));
                }
                let d = &mut self.dcqcn;
                *match key {
                    "dcqcn.rp_ai_rate" => &mut d.rp_ai_rate,
                    "dcqcn.rp_hai_rate" => &mut d.rp_hai_rate,
                    "dcqcn.rp_min_rate" => &mut d.rp_min_rate,
                    _ => &mut d.rp_rate_to_set_on_first_cnp,
                } = Some(v);
            }
            k if k.starts_with("dcqcn.") => {
                let v = Some(small(value, u32::MAX as u64)? as u32);
                let d = &mut self.dcqcn;
                let slot = match &k["dcqcn.".len()..] {
                    "line_rate_mbps" => &mut d.line_rate_mbps,
                    "rp_time_reset" => &mut d.rp_time_reset,
                    "rp_threshold" => &mut d.rp_threshold,
                    "rp_min_dec_fac" => &mut d.rp_min_dec_fac,
                    "rp_dce_tcp_g" => &mut d.rp_dce_tcp_g,
                    "rp_dce_tcp_rtt" => &mut d.rp_dce_tcp_rtt,
                    "rp_rate_reduce_monitor_period" => &mut d.rp_rate_reduce_monitor_period,
                    "rp_initial_alpha_value" => &mut d.rp_initial_alpha_value,
                    "rp_gd" => &mut d.rp_gd,
                    "np_min_time_between_cnps" => &mut d.np_min_time_between_cnps,
                    _ => return err(key, "unknown key"),
                };
                *slot = v;
            }
            _ => return err(key, "unknown key"),
        }
        Ok(())
    }

    /// Checks everything and applies defaults.
    pub fn validate(&self) -> Result<RnicConfig, ConfigError> {
        let device = match self.port.device.as_deref().map(str::trim) {
            Some(d) if !d.is_empty() => d.to_string(),
            _ => {
                return err(
                    "port.device",
                    "missing: a DPDK vdev (e.g. net_af_packet0,iface=tap0) or a PCI address",
                )
            }
        };
        let mtu = self.port.mtu.unwrap_or(1500);
        if !(576..=9600).contains(&mtu) {
            return err("port.mtu", format!("{mtu} is not in 576..=9600"));
        }
        let desc = |key: &str, v: Option<u32>| -> Result<u16, ConfigError> {
            let v = v.unwrap_or(1024);
            if !(32..=16384).contains(&v) {
                return err(key, format!("{v} is not in 32..=16384"));
            }
            Ok(v as u16)
        };
        let rx_desc = desc("port.rx_desc", self.port.rx_desc)?;
        let tx_desc = desc("port.tx_desc", self.port.tx_desc)?;
        let mbufs = self.port.mbufs.unwrap_or(8192);
        let need = rx_desc as u32 + tx_desc as u32 + 1024;
        if mbufs < need {
            return err(
                "port.mbufs",
                format!("{mbufs} is fewer than rx_desc + tx_desc + 1024 = {need}"),
            );
        }
        let mac = match &self.address.mac {
            None => None,
            Some(s) => match parse_mac(s) {
                Some(m) if m[0] & 1 == 0 && m != [0; 6] => Some(m),
                Some(_) => return err("address.mac", format!("{s} is not a unicast address")),
                None => {
                    return err(
                        "address.mac",
                        format!("{s:?} is not a MAC address (aa:bb:cc:dd:ee:ff)"),
                    )
                }
            },
        };
        let mut ipv4 = Vec::new();
        for (i, s) in self.address.ipv4.iter().enumerate() {
            let key = format!("address.ipv4[{i}]");
            let c: Cidr<Ipv4Addr> = parse_cidr(&key, s, 32)?;
            if c.addr.is_multicast() || c.addr.is_broadcast() || c.addr.is_unspecified() {
                return err(&key, format!("{} is not a unicast address", c.addr));
            }
            ipv4.push(c);
        }
        let mut ipv6 = Vec::new();
        for (i, s) in self.address.ipv6.iter().enumerate() {
            let key = format!("address.ipv6[{i}]");
            let c: Cidr<Ipv6Addr> = parse_cidr(&key, s, 128)?;
            if c.addr.is_multicast() || c.addr.is_unspecified() {
                return err(&key, format!("{} is not a unicast address", c.addr));
            }
            ipv6.push(c);
        }
        if !ipv6.is_empty() && mtu < 1280 {
            return err("port.mtu", format!("{mtu} is below IPv6's minimum of 1280"));
        }
        let gateway = match &self.address.gateway {
            None => None,
            Some(s) => {
                let g: Ipv4Addr = s.parse().map_err(|_| ConfigError {
                    key: "address.gateway".into(),
                    problem: format!("{s:?} is not an IPv4 address"),
                })?;
                if !ipv4.iter().any(|c| c.contains(g)) {
                    return err(
                        "address.gateway",
                        format!("{g} is not in any configured IPv4 subnet"),
                    );
                }
                Some(g)
            }
        };
        let gateway6 = match &self.address.gateway6 {
            None => None,
            Some(s) => {
                let g: Ipv6Addr = s.parse().map_err(|_| ConfigError {
                    key: "address.gateway6".into(),
                    problem: format!("{s:?} is not an IPv6 address"),
                })?;
                let ll = g.segments()[0] & 0xffc0 == 0xfe80;
                if !ll && !ipv6.iter().any(|c| c.contains(g)) {
                    return err(
                        "address.gateway6",
                        format!("{g} is not link-local nor in a configured IPv6 subnet"),
                    );
                }
                Some(g)
            }
        };
        let fits = Mtu::for_ip_mtu(mtu, !ipv6.is_empty());
        let path_mtu = match self.roce.path_mtu {
            None => fits,
            Some(b) => match Mtu::from_bytes(b) {
                None => {
                    return err(
                        "roce.path_mtu",
                        format!("{b} is not one of 256, 512, 1024, 2048, 4096"),
                    )
                }
                Some(m) if m > fits => {
                    return err(
                        "roce.path_mtu",
                        format!(
                            "{b} does not fit the port MTU {mtu} (largest: {})",
                            fits.bytes()
                        ),
                    )
                }
                Some(m) => m,
            },
        };
        if let Some(v) = self.roce.vlan {
            if v > 4094 {
                return err("roce.vlan", format!("{v} is not in 0..=4094"));
            }
        }
        let pcp = self.roce.pcp.unwrap_or(0);
        if pcp > 7 {
            return err("roce.pcp", format!("{pcp} is not in 0..=7"));
        }
        let dscp = self.roce.dscp.unwrap_or(0);
        if dscp > 63 {
            return err("roce.dscp", format!("{dscp} is not in 0..=63"));
        }
        let max_qp = self.roce.max_qp.unwrap_or(DEFAULT_MAX_QP);
        if !(1..=MAX_QP_LIMIT).contains(&max_qp) {
            return err(
                "roce.max_qp",
                format!("{max_qp} is not in 1..={MAX_QP_LIMIT}"),
            );
        }
        let worker_thread = at_most("worker.thread", self.worker.thread, 0, MAX_WORKER_THREAD)?;
        let worker_count = self.worker.count.unwrap_or(1);
        if worker_count == 0 || worker_thread.saturating_add(worker_count) > MAX_WORKER_THREAD + 1 {
            return err(
                "worker.count",
                format!(
                    "{worker_count} workers from thread {worker_thread}: threads are numbered \
                     0..={MAX_WORKER_THREAD} and an RNIC needs at least one"
                ),
            );
        }
        if !max_qp.is_multiple_of(worker_count) {
            // Each worker's device holds an equal stripe of the QP numbers (QpnStripe).
            return err(
                "worker.count",
                format!("roce.max_qp ({max_qp}) must be a multiple of it ({worker_count})"),
            );
        }
        let send_window = self.roce.send_window.unwrap_or(DEFAULT_SEND_WINDOW);
        if !(1..=MAX_SEND_WINDOW).contains(&send_window) {
            return err(
                "roce.send_window",
                format!("{send_window} is not in 1..={MAX_SEND_WINDOW}"),
            );
        }
        let ack_every = self.roce.ack_every.unwrap_or(64);
        if ack_every == 0 || ack_every > MAX_SEND_WINDOW {
            return err(
                "roce.ack_every",
                format!("{ack_every} is not in 1..={MAX_SEND_WINDOW}"),
            );
        }
        let credits_from_rq = match self.roce.credits.as_deref() {
            None | Some("receive-queue") => true,
            Some("unlimited") => false,
            Some(o) => {
                return err(
                    "roce.credits",
                    format!("{o:?} is not receive-queue or unlimited"),
                )
            }
        };
        let eal_args = self
            .eal
            .args
            .as_ref()
            .map(|a| a.split_whitespace().map(String::from).collect());
        let snaplen = self.capture.snaplen.unwrap_or(262_144);
        if snaplen == 0 {
            return err("capture.snaplen", "0 would keep nothing of a frame");
        }
        let host = self.host_config()?;
        let dcqcn = self.dcqcn_config(self.port.speed_gbps.unwrap_or(100))?;
        let pfc = self.pfc_config()?;
        let ets = self.ets_config()?;
        let mut switch = self.switch_config()?;
        // An RNIC sending PFC behind its own switch: the switch honours it on the same
        // priorities unless `switch.pfc` says otherwise (else its XOFFs would be ignored and
        // the RNIC's buffer would drop what the ring used to hold back).
        if let (Some(w), None, Mode::Pfc { .. } | Mode::Pause) =
            (switch.as_mut(), &self.switch.pfc, pfc.mode)
        {
            w.pfc = match pfc.mode {
                Mode::Pause => Mode::Pfc { enabled: 0xff },
                m => m,
            };
        }
        pfc.check_reachable(mbufs)?;
        let trust = match self.roce.trust.as_deref() {
            None | Some("pcp") => Trust::Pcp,
            Some("dscp") => Trust::Dscp,
            Some(t) => return err("roce.trust", format!("{t:?} is not pcp or dscp")),
        };
        let fault = FaultConfig {
            loss: prob("fault.loss", self.fault.loss)?,
            duplicate: prob("fault.duplicate", self.fault.duplicate)?,
            corrupt: prob("fault.corrupt", self.fault.corrupt)?,
            reorder: prob("fault.reorder", self.fault.reorder)?,
            ce: prob("fault.ce", self.fault.ce)?,
            delay_us: at_most("fault.delay_us", self.fault.delay_us, 0, MAX_DELAY_US)?,
            rx_pps: match self.fault.rx_pps.unwrap_or(0) {
                r if r > 1_000_000_000 => {
                    return err("fault.rx_pps", format!("{r} exceeds 10^9 frames/s"))
                }
                r => r,
            },
            seed: self.fault.seed.unwrap_or(1),
        };
        Ok(RnicConfig {
            eal_args,
            file_prefix: self.eal.file_prefix.clone(),
            device,
            mtu,
            rx_desc,
            tx_desc,
            mbufs,
            promiscuous: self.port.promiscuous.unwrap_or(true),
            speed_gbps: self.port.speed_gbps.unwrap_or(100),
            mac,
            ipv4,
            ipv6,
            gateway,
            gateway6,
            path_mtu,
            vlan: self.roce.vlan,
            pcp,
            dscp,
            ecn: self.roce.ecn.unwrap_or(false),
            credits_from_rq,
            ack_coalescing: self.roce.ack_coalescing.unwrap_or(true),
            ud_rx_hold_us: at_most(
                "roce.ud_rx_hold_us",
                self.roce.ud_rx_hold_us,
                50_000,
                MAX_HOLD_US,
            )?,
            ud_rx_hold_frames: at_most(
                "roce.ud_rx_hold_frames",
                self.roce.ud_rx_hold_frames,
                1024,
                MAX_HOLD_FRAMES,
            )?,
            max_qp,
            send_window,
            ack_every,
            idle_spin: at_most(
                "worker.idle_spin",
                self.worker.idle_spin,
                256,
                MAX_IDLE_POLLS,
            )?,
            idle_pause: at_most(
                "worker.idle_pause",
                self.worker.idle_pause,
                4096,
                MAX_IDLE_POLLS,
            )?,
            idle_sleep_us: at_most(
                "worker.idle_sleep_us",
                self.worker.idle_sleep_us,
                100,
                MAX_IDLE_SLEEP_US,
            )?,
            idle_sleep_max_us: at_most(
                "worker.idle_sleep_max_us",
                self.worker.idle_sleep_max_us,
                1000,
                MAX_IDLE_SLEEP_US,
            )?,
            app_drive: self.worker.app_drive.unwrap_or(true),
            worker_thread,
            worker_count,
            worker_spread: self.worker.spread.unwrap_or(false),
            spread_queue: match self.worker.spread_queue.unwrap_or(1024) {
                0 => {
                    return err(
                        "worker.spread_queue",
                        "0: a queue holds at least one message",
                    )
                }
                q => at_most("worker.spread_queue", Some(q), 1024, MAX_SPREAD_QUEUE)?,
            },
            pcap: self.capture.pcap.as_ref().map(PathBuf::from),
            snaplen,
            capture_enabled: self.capture.enabled.unwrap_or(true),
            fault,
            host,
            dcqcn,
            pfc,
            trust,
            ets,
            switch,
        })
    }

    /// `[switch]` validated (`None` unless enabled).
    fn switch_config(&self) -> Result<Option<SwitchSettings>, ConfigError> {
        let w = &self.switch;
        if !w.enabled.unwrap_or(false) {
            return Ok(None);
        }
        let rate = |key: &str, v: Option<f64>, default: f64| -> Result<f64, ConfigError> {
            match v.unwrap_or(default) {
                r if r > 0.0 && r <= 400_000.0 => Ok(r),
                r => err(key, format!("{r} Mb/s is not in (0, 400000]")),
            }
        };
        let mbps = rate("switch.rate_mbps", w.rate_mbps, 10_000.0)?;
        let rnic = rate("switch.rnic_mbps", w.rnic_mbps, mbps)?;
        let delay_us = w.delay_us.unwrap_or(0);
        if delay_us > 10_000_000 {
            return err("switch.delay_us", format!("{delay_us} exceeds 10 s"));
        }
        let kib = |v: u32| v as u64 * 1024;
        let buffer = kib(w.buffer_kb.unwrap_or(4096));
        if !(64 << 10..=1 << 30).contains(&buffer) {
            return err("switch.buffer_kb", "between 64 KiB and 1 GiB");
        }
        let red = match (w.ecn_kmin_kb, w.ecn_kmax_kb) {
            (None, None) if w.ecn_pmax.is_none() => None,
            (Some(_), Some(hi)) if kib(hi) > buffer => {
                return err(
                    "switch.ecn_kmax_kb",
                    format!("{hi} KiB is more than the {} KiB buffer", buffer >> 10),
                )
            }
            (Some(lo), Some(hi)) if lo <= hi => {
                let pmax = w.ecn_pmax.unwrap_or(0.2);
                if !(pmax > 0.0 && pmax <= 1.0) {
                    return err("switch.ecn_pmax", format!("{pmax} is not in (0, 1]"));
                }
                Some(dcb::ecn::Red {
                    kmin: kib(lo),
                    kmax: kib(hi),
                    pmax,
                })
            }
            _ => {
                return err(
                    "switch.ecn_kmin_kb",
                    "ECN marking needs ecn_kmin_kb <= ecn_kmax_kb, both set",
                )
            }
        };
        let mut enabled = 0u8;
        for &p in w.pfc.as_deref().unwrap_or(&[]) {
            if p > 7 {
                return err("switch.pfc", format!("{p} is not a priority (0..=7)"));
            }
            enabled |= 1 << p;
        }
        for (key, v) in [
            ("switch.xoff_kb", w.xoff_kb),
            ("switch.xon_kb", w.xon_kb),
            ("switch.headroom_kb", w.headroom_kb),
        ] {
            at_most(key, v, 0, MAX_SWITCH_KB)?;
        }
        let xoff_kb = w.xoff_kb.unwrap_or(200);
        let xoff = kib(xoff_kb);
        let xon = kib(w.xon_kb.unwrap_or(xoff_kb.saturating_sub(8)));
        if xon >= xoff || xoff >= buffer {
            return err(
                "switch.xoff_kb",
                "XON must be below XOFF, and XOFF below the buffer",
            );
        }
        Ok(Some(SwitchSettings {
            rate_mbps: mbps,
            port_mbps: vec![rnic, mbps],
            headroom: kib(w.headroom_kb.unwrap_or(256)),
            delay_us,
            buffer,
            red,
            pfc: if enabled == 0 {
                Mode::Off
            } else {
                Mode::Pfc { enabled }
            },
            thresholds: dcb::pfc::Thresholds { xoff, xon },
            pcap: w.pcap.as_ref().map(PathBuf::from),
            sample_us: 0,
            fault: FaultConfig {
                loss: prob("switch.loss", w.loss)?,
                duplicate: prob("switch.duplicate", w.duplicate)?,
                corrupt: prob("switch.corrupt", w.corrupt)?,
                reorder: prob("switch.reorder", w.reorder)?,
                seed: w.seed.unwrap_or(1),
                ..Default::default()
            },
        }))
    }

    /// `[ets]` validated (`None` when no key is set).
    fn ets_config(&self) -> Result<Option<EtsConfig>, ConfigError> {
        let e = &self.ets;
        if e.prio_tc.is_none() && e.tsa.is_none() && e.bw.is_none() {
            return Ok(None);
        }
        let mut c = EtsConfig::roce_default();
        let eight = |key: &str, n: usize| -> Result<(), ConfigError> {
            if n != 8 {
                return err(key, format!("{n} values: one per priority or class, 8"));
            }
            Ok(())
        };
        if let Some(v) = &e.prio_tc {
            eight("ets.prio_tc", v.len())?;
            c.prio_tc.copy_from_slice(v);
        }
        if let Some(v) = &e.tsa {
            eight("ets.tsa", v.len())?;
            for (i, t) in v.iter().enumerate() {
                c.tsa[i] = match t.as_str() {
                    "strict" => Tsa::Strict,
                    "ets" => Tsa::Ets,
                    x => return err("ets.tsa", format!("{x:?} is not strict or ets")),
                };
            }
        }
        if let Some(v) = &e.bw {
            eight("ets.bw", v.len())?;
            c.bw_percent.copy_from_slice(v);
        }
        c.validate().map_err(|p| ConfigError {
            key: "ets".into(),
            problem: p,
        })?;
        Ok(Some(c))
    }

    /// `[pfc]` validated.
    fn pfc_config(&self) -> Result<PfcConfig, ConfigError> {
        let p = &self.pfc;
        let mut enabled = 0u8;
        for &prio in p.priorities.as_deref().unwrap_or(&[3]) {
            if prio > 7 {
                return err(
                    "pfc.priorities",
                    format!("{prio} is not a priority (0..=7)"),
                );
            }
            enabled |= 1 << prio;
        }
        let mode = match p.mode.as_deref().unwrap_or("off") {
            "off" => Mode::Off,
            "pfc" => Mode::Pfc { enabled },
            "pause" => Mode::Pause,
            m => return err("pfc.mode", format!("{m:?} is not off, pfc or pause")),
        };
        let action = match p.watchdog_action.as_deref().unwrap_or("drop") {
            "drop" => StormAction::Drop,
            "forward" => StormAction::Forward,
            a => {
                return err(
                    "pfc.watchdog_action",
                    format!("{a:?} is not drop or forward"),
                )
            }
        };
        let detect = at_most("pfc.watchdog_ms", p.watchdog_ms, 200, MAX_WATCHDOG_MS)?;
        at_most("pfc.restore_ms", p.restore_ms, 0, MAX_WATCHDOG_MS)?;
        let watchdog = (detect > 0).then(|| PfcWatchdog {
            detect_ms: detect,
            // SONiC's rule (dcb.md): 200 ms by default, twice the detection time when only
            // that was set.
            restore_ms: p
                .restore_ms
                .unwrap_or(p.watchdog_ms.map_or(200, |d| d.saturating_mul(2)))
                .max(1),
            action,
        });
        let buffer = p
            .rx_buffer_kb
            .unwrap_or((PfcConfig::DEFAULT_RX_BUFFER >> 10) as u32);
        if !(16..=65_536).contains(&buffer) {
            return err(
                "pfc.rx_buffer_kb",
                format!("{buffer} is not between 16 and 65536 KiB"),
            );
        }
        let headroom = p.rx_headroom_kb.unwrap_or(buffer / 2);
        if headroom >= buffer {
            return err(
                "pfc.rx_headroom_kb",
                format!("{headroom} leaves no room below it in a {buffer} KiB buffer"),
            );
        }
        // A frame is charged its whole mbuf (4 KiB and more): below a few of them the XOFF
        // threshold could sit where no frame lands before the buffer is full.
        if headroom < 16 {
            return err(
                "pfc.rx_headroom_kb",
                format!("{headroom} KiB: at least 16 (a few frames' mbufs)"),
            );
        }
        Ok(PfcConfig {
            mode,
            watchdog,
            rx_buffer: (buffer as u64) << 10,
            rx_headroom: (headroom as u64) << 10,
        })
    }

    /// `[dcqcn]` as the engine's congestion configuration.
    fn dcqcn_config(&self, speed_gbps: u32) -> Result<CongestionConfig, ConfigError> {
        let d = &self.dcqcn;
        let line = match d.line_rate_mbps {
            Some(0) => return err("dcqcn.line_rate_mbps", "0 would stop every QP"),
            Some(r) => r as f64,
            None => speed_gbps.max(1) as f64 * 1000.0,
        };
        let mut p = match d.variant.as_deref().unwrap_or("firmware") {
            "firmware" => RpParams::firmware(line),
            "paper" => RpParams::paper(line),
            v => return err("dcqcn.variant", format!("{v:?} is not firmware or paper")),
        };
        let us = |v: u32| v as u64 * 1000;
        if let Some(v) = d.rp_time_reset {
            p.timer = us(v.max(1));
        }
        if let Some(v) = d.rp_byte_reset {
            p.byte_counter = v;
        }
        if let Some(v) = d.rp_threshold {
            p.threshold = v;
        }
        for (key, v, slot) in [
            ("dcqcn.rp_ai_rate", d.rp_ai_rate, &mut p.ai_rate),
            ("dcqcn.rp_hai_rate", d.rp_hai_rate, &mut p.hai_rate),
            ("dcqcn.rp_min_rate", d.rp_min_rate, &mut p.min_rate),
            (
                "dcqcn.rp_rate_to_set_on_first_cnp",
                d.rp_rate_to_set_on_first_cnp,
                &mut p.rate_on_first_cnp,
            ),
        ] {
            if let Some(v) = v {
                if !(0.0..=1e7).contains(&v) {
                    return err(key, format!("{v} Mb/s is not in 0..=10000000"));
                }
                *slot = v;
            }
        }
        p.min_rate = p.min_rate.max(0.001);
        if let Some(v) = d.rp_min_dec_fac {
            if v > 100 {
                return err("dcqcn.rp_min_dec_fac", format!("{v} is not a percentage"));
            }
            p.min_dec_fac = v as f64 / 100.0;
        }
        if p.min_rate > line {
            return err(
                "dcqcn.rp_min_rate",
                format!("{} Mb/s is above the line rate {line} Mb/s", p.min_rate),
            );
        }
        if let Some(v) = d.rp_dce_tcp_g {
            if !(1..=1023).contains(&v) {
                return err("dcqcn.rp_dce_tcp_g", format!("{v} is not in 1..=1023"));
            }
            p.g = (1024 - v) as f64 / 1024.0;
        }
        if let Some(v) = d.rp_dce_tcp_rtt {
            p.alpha_period = us(v.max(1));
        }
        if let Some(v) = d.rp_rate_reduce_monitor_period {
            p.decrease_period = us(v.max(1));
        }
        if let Some(v) = d.rp_initial_alpha_value {
            if v > 1024 {
                return err("dcqcn.rp_initial_alpha_value", format!("{v} exceeds 1024"));
            }
            p.initial_alpha = v as f64 / 1024.0;
        }
        if let Some(v) = d.rp_gd {
            if v > 40 {
                return err("dcqcn.rp_gd", format!("{v} exceeds 40"));
            }
            p.gd = v;
        }
        if let Some(v) = d.rp_clamp_tgt_rate {
            p.clamp_tgt_rate = v;
        }
        if let Some(v) = d.rp_clamp_tgt_rate_ati {
            p.clamp_tgt_rate_after_time_inc = v;
        }
        let (cnp_dscp, cnp_prio) = (d.np_cnp_dscp.unwrap_or(48), d.np_cnp_prio.unwrap_or(6));
        if cnp_dscp > 63 {
            return err("dcqcn.np_cnp_dscp", format!("{cnp_dscp} is not in 0..=63"));
        }
        if cnp_prio > 7 {
            return err("dcqcn.np_cnp_prio", format!("{cnp_prio} is not in 0..=7"));
        }
        Ok(CongestionConfig {
            rp: d.rp.unwrap_or(false).then_some(p),
            np_min_interval_ns: d
                .np
                .unwrap_or(false)
                // The paper's NP sends at most one CNP per 50 us per flow (its RP cuts on
                // every CNP, so this is its cut interval too); the firmware's a few us.
                .then(|| {
                    let paper = p.variant == dcb::dcqcn::Variant::Paper;
                    us(d.np_min_time_between_cnps
                        .unwrap_or(if paper { 50 } else { 4 }))
                }),
            cnp_dscp,
            cnp_prio,
        })
    }

    fn host_config(&self) -> Result<HostConfig, ConfigError> {
        let h = &self.host;
        let mode = match h.mode.as_deref() {
            None => 0o660,
            Some(m) => match u32::from_str_radix(m.trim().trim_start_matches("0o"), 8) {
                Ok(v) if v <= 0o777 => v,
                _ => {
                    return err(
                        "host.mode",
                        format!("{m:?} is not octal permission bits like \"0660\""),
                    )
                }
            },
        };
        let socket = PathBuf::from(
            h.socket
                .as_deref()
                .unwrap_or(ferroce_host::abi::proto::DEFAULT_SOCKET),
        );
        if socket.as_os_str().len() > 107 {
            return err(
                "host.socket",
                "longer than a Unix socket path may be (107 bytes)",
            );
        }
        for (key, v) in [
            ("host.max_clients", h.max_clients),
            ("host.max_qps", h.max_qps),
            ("host.max_cqs", h.max_cqs),
            ("host.max_mrs", h.max_mrs),
            ("host.max_pds", h.max_pds),
            ("host.max_srqs", h.max_srqs),
            ("host.max_areas", h.max_areas),
        ] {
            if v == Some(0) {
                return err(key, "0 would refuse everything");
            }
        }
        // Clients are numbered by 16 bits on the worker (its owner tables), one value of
        // which means "nobody": more could not be told apart.
        if h.max_clients.is_some_and(|n| n > MAX_CLIENTS) {
            return err(
                "host.max_clients",
                format!("at most {MAX_CLIENTS} clients can be told apart"),
            );
        }
        for (key, v) in [
            ("host.max_queue_bytes", h.max_queue_bytes),
            ("host.max_area_bytes", h.max_area_bytes),
        ] {
            if v == Some(0) {
                return err(key, "0 would refuse everything");
            }
        }
        Ok(HostConfig {
            socket,
            group: h.group.clone(),
            mode,
            max_clients: h.max_clients.unwrap_or(64),
            max_qps: h.max_qps,
            max_cqs: h.max_cqs,
            max_mrs: h.max_mrs,
            max_pds: h.max_pds,
            max_srqs: h.max_srqs,
            max_area_bytes: h.max_area_bytes.unwrap_or(16 << 30),
            max_areas: h.max_areas.unwrap_or(1024),
            max_queue_bytes: h.max_queue_bytes.unwrap_or(256 << 20),
        })
    }
}

impl RnicConfig {
    /// The GID table, derived as rxe does: index 0 the link-local GID from the MAC, then the
    /// IPv4-mapped GID of each IPv4 address, then each IPv6 address.
    pub fn gids(&self, mac: [u8; 6]) -> Vec<Gid> {
        let mut g = vec![Gid::link_local_from_mac(mac)];
        g.extend(self.ipv4.iter().map(|c| Gid::from(c.addr)));
        g.extend(self.ipv6.iter().map(|c| Gid::from(c.addr)));
        g
    }

    /// Whether `ip` is on one of our subnets (else it goes through a gateway).
    pub fn on_link(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.ipv4.iter().any(|c| c.contains(a)),
            IpAddr::V6(a) => {
                a.segments()[0] & 0xffc0 == 0xfe80 || self.ipv6.iter().any(|c| c.contains(a))
            }
        }
    }

    /// A one-line summary for logs.
    /// What `rnicd --check` can check without starting the port, and what it cannot: an
    /// address peers can reach, a capture file that can be created, and for a vdev on a
    /// kernel interface (`iface=`), that the interface exists and its MTU holds `port.mtu`.
    pub fn preflight(&self) -> Vec<Check> {
        let mut out = Vec::new();
        let routable = !self.ipv4.is_empty() || !self.ipv6.is_empty();
        out.push(if routable {
            Check::Ok(format!("{} address(es)", self.ipv4.len() + self.ipv6.len()))
        } else {
            Check::Fail(
                "address.ipv4 / address.ipv6: no IP address; RoCEv2 peers address an RNIC by IP (only the MAC-derived link-local GID would exist)"
                    .into(),
            )
        });
        // PFC classifies what it receives by the configured trust: by PCP, an untagged
        // frame takes the port's default priority (`roce.pcp`, 0 unless set), so with no
        // VLAN and that priority not lossless, no untagged RoCE frame counts towards a pause
        // (dcb.md's RoCE setup trusts DSCP).
        if let (Mode::Pfc { enabled }, Trust::Pcp, None) = (self.pfc.mode, self.trust, self.vlan) {
            let default = self.pcp & 7;
            if enabled & (1 << default) == 0 {
                out.push(Check::Fail(format!(
                    "pfc: priorities are classified by PCP (roce.trust) but the port carries \
                     untagged frames (no roce.vlan): each takes the default priority {default} \
                     (roce.pcp), which is not lossless, so PFC never pauses them; set \
                     roce.trust = \"dscp\", roce.pcp to a lossless priority, or a VLAN"
                )));
            }
        }
        if let Some(p) = &self.pcap {
            let dir = p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            out.push(match std::fs::metadata(dir) {
                Ok(m) if m.is_dir() && !m.permissions().readonly() => {
                    Check::Ok(format!("capture.pcap {} can be created", p.display()))
                }
                Ok(_) => Check::Fail(format!(
                    "capture.pcap {}: {} is not a writable directory",
                    p.display(),
                    dir.display()
                )),
                Err(e) => Check::Fail(format!(
                    "capture.pcap {}: directory {}: {e}",
                    p.display(),
                    dir.display()
                )),
            });
        }
        if self.device == LOOPBACK_DEVICE {
            out.push(Check::Ok(
                "port.device net_ring_loopback: rnicd's internal ring link between its two RNICs"
                    .into(),
            ));
            return out;
        }
        // An unknown driver is an error of the configuration; a missing interface is this
        // machine's (the configuration may be right for where it will run).
        if let Some(p) = port_problem(&self.device) {
            out.push(if p.contains("no network interface") {
                Check::NotReady(format!(
                    "{p} (create it, or give the port of this machine, before starting rnicd)"
                ))
            } else {
                Check::Fail(p)
            });
            return out;
        }
        let driver_creates = vdev_driver(&self.device).is_some_and(|d| CREATES_IFACE.contains(&d));
        match device_iface(&self.device).filter(|_| !driver_creates) {
            Some(iface) => {
                let sys = Path::new("/sys/class/net").join(&iface);
                match std::fs::read_to_string(sys.join("mtu")) {
                    Ok(m) => match m.trim().parse::<u32>() {
                        Ok(if_mtu) if if_mtu < self.mtu => out.push(Check::Fail(format!(
                            "port.mtu {} exceeds {iface}'s MTU {if_mtu} (frames would be dropped; lower port.mtu or raise the interface's)",
                            self.mtu
                        ))),
                        Ok(if_mtu) => out.push(Check::Ok(format!(
                            "{iface} exists, MTU {if_mtu} >= port.mtu {}",
                            self.mtu
                        ))),
                        Err(_) => out.push(Check::NeedsPort(format!("{iface}'s MTU"))),
                    },
                    Err(_) => out.push(Check::NotReady(format!(
                        "port.device {}: no network interface {iface} here",
                        self.device
                    ))),
                }
            }
            None if driver_creates => out.push(Check::Ok(format!(
                "port.device {}: the driver creates its interface",
                self.device
            ))),
            None => out.push(Check::NeedsPort(format!(
                "that {} exists and takes MTU {} (checked when the port starts)",
                self.device, self.mtu
            ))),
        }
        if self.mac.is_none() {
            out.push(Check::NeedsPort(
                "the MAC address (the port's own; set address.mac to fix it)".into(),
            ));
        }
        out
    }

    /// One line describing the RNIC; `mac` is the MAC in use if known (None: not set, the
    /// port's own will be used).
    pub fn describe(&self, mac: Option<[u8; 6]>) -> String {
        let mac = match mac.or(self.mac) {
            Some(m) => mac_to_string(&m),
            None => "the port's".into(),
        };
        let ips: Vec<String> = self
            .ipv4
            .iter()
            .map(|c| format!("{}/{}", c.addr, c.prefix))
            .chain(self.ipv6.iter().map(|c| format!("{}/{}", c.addr, c.prefix)))
            .collect();
        format!(
            "{} mac {} ip [{}] mtu {} path_mtu {}",
            self.device,
            mac,
            ips.join(", "),
            self.mtu,
            self.path_mtu.bytes()
        )
    }

    /// The effective configuration as TOML, every key with its value (defaults included);
    /// `RawConfig::parse` of it gives this configuration back (`rnicd --print-config`).
    pub fn to_toml(&self) -> String {
        let q = |v: &str| format!("{v:?}");
        let list = |v: Vec<String>| {
            let items: Vec<String> = v.iter().map(|x| q(x)).collect();
            format!("[{}]", items.join(", "))
        };
        let mut t = String::new();
        let mut line = |k: &str, v: String| {
            t.push_str(&format!("{k} = {v}\n"));
        };
        let mut out = String::from("[eal]\n");
        match &self.eal_args {
            Some(a) => line("args", q(&a.join(" "))),
            None => line("# args", q("(software defaults)")),
        }
        if let Some(p) = &self.file_prefix {
            line("file_prefix", q(p));
        }
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[port]\n");
        let mut line = |k: &str, v: String| {
            t.push_str(&format!("{k} = {v}\n"));
        };
        line("device", q(&self.device));
        line("mtu", self.mtu.to_string());
        line("rx_desc", self.rx_desc.to_string());
        line("tx_desc", self.tx_desc.to_string());
        line("mbufs", self.mbufs.to_string());
        line("promiscuous", self.promiscuous.to_string());
        line("speed_gbps", self.speed_gbps.to_string());
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[address]\n");
        let mut line = |k: &str, v: String| {
            t.push_str(&format!("{k} = {v}\n"));
        };
        match self.mac {
            Some(m) => line("mac", q(&mac_to_string(&m))),
            None => line("# mac", q("(the port's own)")),
        }
        line(
            "ipv4",
            list(
                self.ipv4
                    .iter()
                    .map(|c| format!("{}/{}", c.addr, c.prefix))
                    .collect(),
            ),
        );
        line(
            "ipv6",
            list(
                self.ipv6
                    .iter()
                    .map(|c| format!("{}/{}", c.addr, c.prefix))
                    .collect(),
            ),
        );
        if let Some(g) = self.gateway {
            line("gateway", q(&g.to_string()));
        }
        if let Some(g) = self.gateway6 {
            line("gateway6", q(&g.to_string()));
        }
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[roce]\n");
        let mut line = |k: &str, v: String| {
            t.push_str(&format!("{k} = {v}\n"));
        };
        line("path_mtu", self.path_mtu.bytes().to_string());
        if let Some(v) = self.vlan {
            line("vlan", v.to_string());
        }
        line("pcp", self.pcp.to_string());
        line("dscp", self.dscp.to_string());
        line("ecn", self.ecn.to_string());
        line(
            "credits",
            q(if self.credits_from_rq {
                "receive-queue"
            } else {
                "unlimited"
            }),
        );
        line("ack_coalescing", self.ack_coalescing.to_string());
        line("ud_rx_hold_us", self.ud_rx_hold_us.to_string());
        line("ud_rx_hold_frames", self.ud_rx_hold_frames.to_string());
        line("max_qp", self.max_qp.to_string());
        line("send_window", self.send_window.to_string());
        line("ack_every", self.ack_every.to_string());
        line(
            "trust",
            q(match self.trust {
                Trust::Pcp => "pcp",
                Trust::Dscp => "dscp",
            }),
        );
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[worker]\n");
        let mut line = |k: &str, v: String| {
            t.push_str(&format!("{k} = {v}\n"));
        };
        line("idle_spin", self.idle_spin.to_string());
        line("idle_pause", self.idle_pause.to_string());
        line("idle_sleep_us", self.idle_sleep_us.to_string());
        line("idle_sleep_max_us", self.idle_sleep_max_us.to_string());
        line("app_drive", self.app_drive.to_string());
        line("thread", self.worker_thread.to_string());
        line("count", self.worker_count.to_string());
        line("spread", self.worker_spread.to_string());
        line("spread_queue", self.spread_queue.to_string());
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[capture]\n");
        let mut line = |k: &str, v: String| {
            t.push_str(&format!("{k} = {v}\n"));
        };
        match &self.pcap {
            Some(p) => line("pcap", q(&p.display().to_string())),
            None => line("# pcap", q("(no capture)")),
        }
        line("snaplen", self.snaplen.to_string());
        line("enabled", self.capture_enabled.to_string());
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[fault]\n");
        let f = &self.fault;
        f.push_probabilities(&mut t);
        t.push_str(&format!("ce = {:?}\n", f.ce));
        t.push_str(&format!("delay_us = {}\n", f.delay_us));
        t.push_str(&format!("rx_pps = {}\n", f.rx_pps));
        t.push_str(&format!("seed = {}\n", f.seed));
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[host]\n");
        let h = &self.host;
        t.push_str(&format!(
            "socket = {}\n",
            q(&h.socket.display().to_string())
        ));
        match &h.group {
            Some(g) => t.push_str(&format!("group = {}\n", q(g))),
            None => t.push_str("# group = \"(rnicd's own)\"\n"),
        }
        t.push_str(&format!("mode = \"{:04o}\"\n", h.mode));
        t.push_str(&format!("max_clients = {}\n", h.max_clients));
        for (k, v) in [
            ("max_qps", h.max_qps),
            ("max_cqs", h.max_cqs),
            ("max_mrs", h.max_mrs),
            ("max_pds", h.max_pds),
            ("max_srqs", h.max_srqs),
        ] {
            match v {
                Some(v) => t.push_str(&format!("{k} = {v}\n")),
                None => t.push_str(&format!(
                    "# {k} = \"(1/{DEFAULT_CLIENT_SHARE} of the device's limit)\"\n"
                )),
            }
        }
        t.push_str(&format!("max_area_bytes = {}\n", h.max_area_bytes));
        t.push_str(&format!("max_areas = {}\n", h.max_areas));
        t.push_str(&format!("max_queue_bytes = {}\n", h.max_queue_bytes));
        out.push_str(&std::mem::take(&mut t));
        out.push_str("\n[pfc]\n");
        let (mode, prios) = match self.pfc.mode {
            Mode::Off => ("off", 1u8 << 3),
            Mode::Pause => ("pause", 1 << 3),
            Mode::Pfc { enabled } => ("pfc", enabled),
        };
        t.push_str(&format!("mode = {}\n", q(mode)));
        let list: Vec<String> = (0..8)
            .filter(|p| prios & (1 << p) != 0)
            .map(|p| p.to_string())
            .collect();
        t.push_str(&format!("priorities = [{}]\n", list.join(", ")));
        match self.pfc.watchdog {
            Some(w) => {
                t.push_str(&format!("watchdog_ms = {}\n", w.detect_ms));
                t.push_str(&format!("restore_ms = {}\n", w.restore_ms));
                let a = match w.action {
                    StormAction::Drop => "drop",
                    StormAction::Forward => "forward",
                };
                t.push_str(&format!("watchdog_action = {}\n", q(a)));
            }
            None => t.push_str("watchdog_ms = 0\n"),
        }
        t.push_str(&format!("rx_buffer_kb = {}\n", self.pfc.rx_buffer >> 10));
        t.push_str(&format!(
            "rx_headroom_kb = {}\n",
            self.pfc.rx_headroom >> 10
        ));
        out.push_str(&std::mem::take(&mut t));
        if let Some(e) = &self.ets {
            out.push_str("\n[ets]\n");
            let join = |v: Vec<String>| v.join(", ");
            t.push_str(&format!(
                "prio_tc = [{}]\n",
                join(e.prio_tc.iter().map(|x| x.to_string()).collect())
            ));
            t.push_str(&format!(
                "tsa = [{}]\n",
                join(
                    e.tsa
                        .iter()
                        .map(|x| q(if *x == Tsa::Strict { "strict" } else { "ets" }))
                        .collect()
                )
            ));
            t.push_str(&format!(
                "bw = [{}]\n",
                join(e.bw_percent.iter().map(|x| x.to_string()).collect())
            ));
            out.push_str(&std::mem::take(&mut t));
        }
        if let Some(w) = &self.switch {
            out.push_str("\n[switch]\nenabled = true\n");
            t.push_str(&format!("rate_mbps = {:?}\n", w.rate_mbps));
            if let Some(r) = w.port_mbps.first() {
                t.push_str(&format!("rnic_mbps = {r:?}\n"));
            }
            t.push_str(&format!("delay_us = {}\n", w.delay_us));
            t.push_str(&format!("buffer_kb = {}\n", w.buffer >> 10));
            if let Some(r) = &w.red {
                t.push_str(&format!("ecn_kmin_kb = {}\n", r.kmin >> 10));
                t.push_str(&format!("ecn_kmax_kb = {}\n", r.kmax >> 10));
                t.push_str(&format!("ecn_pmax = {:?}\n", r.pmax));
            }
            let prios: Vec<String> = match w.pfc {
                Mode::Pfc { enabled } => (0..8)
                    .filter(|p| enabled & (1 << p) != 0)
                    .map(|p| p.to_string())
                    .collect(),
                _ => Vec::new(),
            };
            t.push_str(&format!("pfc = [{}]\n", prios.join(", ")));
            t.push_str(&format!("xoff_kb = {}\n", w.thresholds.xoff >> 10));
            t.push_str(&format!("xon_kb = {}\n", w.thresholds.xon >> 10));
            t.push_str(&format!("headroom_kb = {}\n", w.headroom >> 10));
            if let Some(p) = &w.pcap {
                t.push_str(&format!("pcap = {}\n", q(&p.display().to_string())));
            }
            w.fault.push_probabilities(&mut t);
            t.push_str(&format!("seed = {}\n", w.fault.seed));
            out.push_str(&std::mem::take(&mut t));
        }
        out.push_str("\n[dcqcn]\n");
        let c = &self.dcqcn;
        t.push_str(&format!("np = {}\n", c.np_min_interval_ns.is_some()));
        if let Some(ns) = c.np_min_interval_ns {
            t.push_str(&format!("np_min_time_between_cnps = {}\n", ns / 1000));
        }
        t.push_str(&format!("np_cnp_dscp = {}\n", c.cnp_dscp));
        t.push_str(&format!("np_cnp_prio = {}\n", c.cnp_prio));
        t.push_str(&format!("rp = {}\n", c.rp.is_some()));
        if let Some(p) = &c.rp {
            let variant = match p.variant {
                dcb::dcqcn::Variant::Paper => "paper",
                dcb::dcqcn::Variant::Firmware => "firmware",
            };
            t.push_str(&format!("variant = {}\n", q(variant)));
            t.push_str(&format!("line_rate_mbps = {}\n", p.line_rate as u64));
            for (k, v) in [
                ("rp_time_reset", p.timer / 1000),
                ("rp_byte_reset", p.byte_counter),
                ("rp_threshold", p.threshold as u64),
                ("rp_min_dec_fac", (p.min_dec_fac * 100.0).round() as u64),
                ("rp_dce_tcp_g", 1024 - (p.g * 1024.0).round() as u64),
                ("rp_dce_tcp_rtt", p.alpha_period / 1000),
                ("rp_rate_reduce_monitor_period", p.decrease_period / 1000),
                (
                    "rp_initial_alpha_value",
                    (p.initial_alpha * 1024.0).round() as u64,
                ),
                ("rp_gd", p.gd as u64),
            ] {
                t.push_str(&format!("{k} = {v}\n"));
            }
            for (k, v) in [
                ("rp_ai_rate", p.ai_rate),
                ("rp_hai_rate", p.hai_rate),
                ("rp_min_rate", p.min_rate),
                ("rp_rate_to_set_on_first_cnp", p.rate_on_first_cnp),
            ] {
                t.push_str(&format!("{k} = {v:?}\n"));
            }
            t.push_str(&format!("rp_clamp_tgt_rate = {}\n", p.clamp_tgt_rate));
            t.push_str(&format!(
                "rp_clamp_tgt_rate_ati = {}\n",
                p.clamp_tgt_rate_after_time_inc
            ));
        }
        out.push_str(&t);
        out
    }

    /// The rx and tx queues the RNIC asks of its port: one per worker (`worker.count`), so
    /// that each worker receives and sends on its own, unless something must see every
    /// frame in one place (a capture, fault injection, the receive rate limit, or the PFC
    /// receive buffer, all of which the port's owner keeps): then one, which the port's
    /// owner serves for all (docs/ARCHITECTURE.md, "Several workers per RNIC").
    pub fn port_queues(&self) -> u16 {
        let one_place = self.pcap.is_some()
            || self.fault.any()
            || self.fault.rx_pps > 0
            || self.pfc.mode != dcb::pfc::Mode::Off;
        if one_place {
            1
        } else {
            self.worker_count as u16
        }
    }

    /// One line describing the RNIC with the MAC in use.
    pub fn summary(&self, mac: [u8; 6]) -> String {
        self.describe(Some(mac))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_configuration_reads_back_the_same() {
        let c = ok(r#"
            [port]
            device = "net_af_packet0,iface=veth0"
            mtu = 4200
            [address]
            mac = "02:00:00:99:00:03"
            ipv4 = ["10.99.0.3/24"]
            ipv6 = ["fd00:99::3/64"]
            gateway = "10.99.0.1"
            [roce]
            path_mtu = 4096
            vlan = 100
            dscp = 26
            ecn = true
            credits = "unlimited"
            [capture]
            pcap = "/tmp/x.pcap"
            snaplen = 128
            [fault]
            loss = 0.01
        "#);
        assert_eq!(ok(&c.to_toml()), c);
        let d = ok("[port]\ndevice = \"net_null0\"");
        assert_eq!(ok(&d.to_toml()), d);
        for variant in ["firmware", "paper"] {
            let e = ok(&format!(
                "[port]\ndevice = \"net_null0\"\nspeed_gbps = 25\n[dcqcn]\nrp = true\nnp = true\n\
                 variant = \"{variant}\"\nrp_ai_rate = 7\nrp_min_rate = 0.5\nrp_dce_tcp_g = 1020\n\
                 np_min_time_between_cnps = 50\nnp_cnp_prio = 3"
            ));
            assert_eq!(ok(&e.to_toml()), e, "{variant}");
        }
    }

    #[test]
    fn dcqcn_takes_mlx5_names_and_refuses_nonsense() {
        let c = ok("[port]\ndevice = \"net_null0\"\nspeed_gbps = 25");
        assert_eq!(c.dcqcn.rp, None, "off unless asked for");
        assert_eq!(c.dcqcn.np_min_interval_ns, None);
        assert_eq!((c.dcqcn.cnp_dscp, c.dcqcn.cnp_prio), (48, 6));
        let mut r = RawConfig::parse("[port]\ndevice = \"net_null0\"\nspeed_gbps = 25").unwrap();
        r.set("dcqcn.rp", "on").unwrap();
        r.set("dcqcn.np", "on").unwrap();
        r.set("dcqcn.rp_time_reset", "55").unwrap();
        r.set("dcqcn.rp_hai_rate", "12.5").unwrap();
        r.set("dcqcn.rp_dce_tcp_g", "1019").unwrap();
        let c = r.validate().unwrap();
        let p = c.dcqcn.rp.unwrap();
        assert_eq!(p.line_rate, 25_000.0, "the line rate is the port's speed");
        assert_eq!(p.timer, 55_000);
        assert_eq!(p.hai_rate, 12.5);
        assert_eq!(p.g, 5.0 / 1024.0);
        assert_eq!(c.dcqcn.np_min_interval_ns, Some(4_000));
        // The paper's variant: its NP's 50 us, which is also its RP's interval between cuts.
        r.set("dcqcn.variant", "paper").unwrap();
        assert_eq!(r.validate().unwrap().dcqcn.np_min_interval_ns, Some(50_000));
        let bad = |k: &str, v: &str| {
            let mut r = RawConfig::parse("[port]\ndevice = \"net_null0\"").unwrap();
            match r.set(k, v) {
                Err(e) => e,
                Ok(()) => r.validate().unwrap_err(),
            }
        };
        assert_eq!(bad("dcqcn.variant", "tcp").key, "dcqcn.variant");
        assert_eq!(
            bad("dcqcn.rp_min_dec_fac", "150").key,
            "dcqcn.rp_min_dec_fac"
        );
        assert_eq!(bad("dcqcn.rp_dce_tcp_g", "0").key, "dcqcn.rp_dce_tcp_g");
        assert_eq!(bad("dcqcn.np_cnp_dscp", "64").key, "dcqcn.np_cnp_dscp");
        assert_eq!(bad("dcqcn.rp_ai_rate", "-1").key, "dcqcn.rp_ai_rate");
        assert_eq!(bad("dcqcn.line_rate_mbps", "0").key, "dcqcn.line_rate_mbps");
        assert_eq!(bad("dcqcn.rp_min_rate", "1e9").key, "dcqcn.rp_min_rate");
        assert_eq!(bad("dcqcn.rp_bogus", "1").key, "dcqcn.rp_bogus");
        assert_eq!(bad("fault.ce", "2").key, "fault.ce");
        assert_eq!(bad("pfc.mode", "on").key, "pfc.mode");
        assert_eq!(bad("pfc.priorities", "3,8").key, "pfc.priorities");
        assert_eq!(
            bad("pfc.watchdog_action", "ignore").key,
            "pfc.watchdog_action"
        );
        assert_eq!(bad("pfc.rx_buffer_kb", "8").key, "pfc.rx_buffer_kb");
        assert_eq!(bad("pfc.rx_headroom_kb", "1024").key, "pfc.rx_headroom_kb");
        assert_eq!(bad("pfc.rx_headroom_kb", "4").key, "pfc.rx_headroom_kb");
        assert_eq!(bad("fault.rx_pps", "2000000000").key, "fault.rx_pps");
        assert_eq!(bad("roce.ack_every", "0").key, "roce.ack_every");
        assert_eq!(bad("roce.ack_every", "5000000").key, "roce.ack_every");
        let mut r = RawConfig::parse("[port]\ndevice = \"net_null0\"\nmbufs = 4096").unwrap();
        for (k, v) in [("pfc.mode", "pfc"), ("pfc.rx_buffer_kb", "8192")] {
            r.set(k, v).unwrap();
        }
        assert_eq!(r.validate().unwrap_err().key, "pfc.rx_buffer_kb");
        assert_eq!(bad("roce.trust", "vlan").key, "roce.trust");
        assert_eq!(bad("ets.bw", "50,50").key, "ets.bw");
        assert_eq!(bad("ets.bw", "50,0,0,40,0,0,0,0").key, "ets");
        assert_eq!(
            bad("ets.tsa", "ets,ets,ets,ets,ets,ets,fast,strict").key,
            "ets.tsa"
        );
        assert_eq!(bad("ets.prio_tc", "0,1,2,3,4,5,6,9").key, "ets");
    }

    #[test]
    fn switch_reads_back_the_same_and_refuses_nonsense() {
        let none = ok("[port]\ndevice = \"net_null0\"\n[switch]\nrate_mbps = 5");
        assert_eq!(none.switch, None, "off unless enabled");
        let c = ok("[port]\ndevice = \"net_null0\"\n[switch]\nenabled = true\n\
                    rate_mbps = 1000\ndelay_us = 500\necn_kmin_kb = 20\necn_kmax_kb = 200\n\
                    pfc = [3]\npcap = \"/tmp/sw.pcap\"\nloss = 0.01\nreorder = 0.02\nseed = 9");
        let w = c.switch.clone().unwrap();
        assert_eq!(
            (w.rate_mbps, w.port_mbps.clone()),
            (1000.0, vec![1000.0, 1000.0])
        );
        assert_eq!(w.red.map(|r| (r.kmin, r.kmax)), Some((20 << 10, 200 << 10)));
        assert_eq!(w.pfc, Mode::Pfc { enabled: 1 << 3 });
        assert_eq!(
            (w.thresholds.xoff, w.thresholds.xon),
            (200 << 10, 192 << 10)
        );
        assert_eq!(ok(&c.to_toml()), c);
        for (k, v) in [
            ("switch.rate_mbps", "0"),
            ("switch.rnic_mbps", "1e9"),
            ("switch.delay_us", "20000000"),
            ("switch.buffer_kb", "1"),
            ("switch.ecn_kmin_kb", "300"),
            ("switch.ecn_kmax_kb", "9000"),
            ("switch.ecn_pmax", "1.5"),
            ("switch.pfc", "9"),
            ("switch.xoff_kb", "8000"),
            ("switch.loss", "1.5"),
            ("switch.reorder", "-0.1"),
        ] {
            let mut r = RawConfig::parse("[port]\ndevice = \"net_null0\"").unwrap();
            r.set("switch.enabled", "true").unwrap();
            r.set("switch.ecn_kmax_kb", "200").unwrap();
            let e = match r.set(k, v) {
                Err(e) => e,
                Ok(()) => r.validate().unwrap_err(),
            };
            assert!(e.key.starts_with("switch."), "{k}={v}: {e:?}");
        }
        // Marking that would start past the buffer.
        let mut r = RawConfig::parse("[port]\ndevice = \"net_null0\"").unwrap();
        for (k, v) in [
            ("switch.enabled", "true"),
            ("switch.ecn_kmin_kb", "20"),
            ("switch.ecn_kmax_kb", "9000"),
        ] {
            r.set(k, v).unwrap();
        }
        assert_eq!(r.validate().unwrap_err().key, "switch.ecn_kmax_kb");
    }

    #[test]
    fn ets_reads_back_the_same() {
        let none = ok("[port]\ndevice = \"net_null0\"");
        assert_eq!(none.ets, None, "off unless asked for");
        let c = ok("[port]\ndevice = \"net_null0\"\n[ets]\nbw = [20, 0, 0, 80, 0, 0, 0, 0]");
        let e = c.ets.unwrap();
        assert_eq!((e.bw_percent[0], e.bw_percent[3]), (20, 80));
        assert_eq!(e.tsa[6], Tsa::Strict, "the rest as the usual RoCE setup");
        assert_eq!(ok(&c.to_toml()), c);
    }

    #[test]
    fn pfc_and_trust_read_back_the_same() {
        let c = ok(
            "[port]\ndevice = \"net_null0\"\n[roce]\ntrust = \"dscp\"\n[pfc]\nmode = \"pfc\"\n\
                    priorities = [3, 4]\nwatchdog_ms = 50\nwatchdog_action = \"forward\"\n\
                    rx_buffer_kb = 256",
        );
        assert_eq!((c.pfc.rx_buffer, c.pfc.rx_headroom), (256 << 10, 128 << 10));
        assert_eq!(
            c.pfc.rx_thresholds(),
            dcb::pfc::Thresholds {
                xoff: 128 << 10,
                xon: 64 << 10
            }
        );
        assert_eq!(c.trust, Trust::Dscp);
        assert_eq!(c.pfc.mode, Mode::Pfc { enabled: 0b1_1000 });
        let w = c.pfc.watchdog.unwrap();
        assert_eq!(
            (w.detect_ms, w.restore_ms, w.action),
            (50, 100, StormAction::Forward),
            "restoration unset: twice the detection time (SONiC)"
        );
        assert_eq!(ok(&c.to_toml()), c);
        let off = ok("[port]\ndevice = \"net_null0\"\n[pfc]\nmode = \"pause\"\nwatchdog_ms = 0");
        assert_eq!((off.pfc.mode, off.pfc.watchdog), (Mode::Pause, None));
        assert_eq!(ok(&off.to_toml()), off);
    }

    /// The example shipped in docs/rnic.example.toml parses, validates, and mentions every
    /// key `--set` accepts.
    #[test]
    fn the_example_configuration_is_valid_and_complete() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/rnic.example.toml");
        let text = std::fs::read_to_string(path).unwrap();
        ok(&text);
        let src = include_str!("config.rs");
        for key in src
            .lines()
            .filter_map(|l| l.trim().strip_prefix('"'))
            .filter_map(|l| l.split_once("\" =>").map(|(k, _)| k))
            .filter(|k| k.contains('.') && !k.contains('"'))
        {
            let (section, name) = key.split_once('.').unwrap();
            assert!(text.contains(&format!("[{section}]")), "{section}");
            assert!(
                text.lines().any(|l| l
                    .trim_start_matches('#')
                    .trim_start()
                    .starts_with(&format!("{name} ="))),
                "the example does not mention {key}"
            );
        }
    }

    fn ok(text: &str) -> RnicConfig {
        RawConfig::parse(text).unwrap().validate().unwrap()
    }

    fn bad(text: &str) -> ConfigError {
        match RawConfig::parse(text) {
            Err(e) => e,
            Ok(r) => r.validate().unwrap_err(),
        }
    }

    #[test]
    fn full_file_and_defaults() {
        let c = ok(r#"
            [port]
            device = "net_af_packet0,iface=tap0"
            [address]
            mac = "02:00:00:99:00:03"
            ipv4 = ["10.99.0.3/24"]
            gateway = "10.99.0.1"
            [roce]
            dscp = 26
            ecn = true
        "#);
        assert_eq!(c.mtu, 1500);
        assert_eq!(c.path_mtu, Mtu::M1024, "1024 is the largest that fits 1500");
        assert_eq!(c.gateway, Some(Ipv4Addr::new(10, 99, 0, 1)));
        let gids = c.gids(c.mac.unwrap());
        assert_eq!(gids[1], Gid::from_ipv4([10, 99, 0, 3]));
        assert_eq!(gids[0].to_string(), "fe80::ff:fe99:3");
        assert!(c.on_link("10.99.0.77".parse().unwrap()));
        assert!(!c.on_link("10.98.0.1".parse().unwrap()));
        let j = ok("[port]\ndevice = \"net_ring0\"\nmtu = 9000\n");
        assert_eq!(j.path_mtu, Mtu::M4096);
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(bad("").key, "port.device");
        assert_eq!(
            bad("[port]\ndevice='x'\n[address]\nipv4=['10.0.0.1']").key,
            "address.ipv4[0]"
        );
        assert!(bad("[port]\ndevice='x'\n[address]\nipv4=['10.0.0.1/33']")
            .problem
            .contains("33"));
        assert_eq!(
            bad("[port]\ndevice='x'\n[address]\nipv4=['10.0.0.1/24']\ngateway='10.1.0.1'").key,
            "address.gateway"
        );
        assert_eq!(
            bad("[port]\ndevice='x'\n[address]\nmac='01:00:5e:00:00:01'").key,
            "address.mac"
        );
        assert_eq!(
            bad("[port]\ndevice='x'\n[roce]\npath_mtu=4096").key,
            "roce.path_mtu"
        );
        assert_eq!(
            bad("[port]\ndevice='x'\n[roce]\npath_mtu=1000").key,
            "roce.path_mtu"
        );
        assert_eq!(bad("[port]\ndevice='x'\nmtu=100").key, "port.mtu");
        assert_eq!(bad("[port]\ndevice='x'\n[roce]\ndscp=64").key, "roce.dscp");
        assert_eq!(
            bad("[port]\ndevice='x'\n[roce]\nmax_qp=0").key,
            "roce.max_qp"
        );
        assert_eq!(
            bad("[port]\ndevice='x'\n[roce]\nmax_qp=262145").key,
            "roce.max_qp"
        );
        assert_eq!(
            bad("[port]\ndevice='x'\n[roce]\nsend_window=0").key,
            "roce.send_window"
        );
        assert_eq!(
            bad("[port]\ndevice='x'\n[roce]\nsend_window=4194305").key,
            "roce.send_window"
        );
        assert_eq!(
            bad("[port]\ndevice='x'\n[fault]\nloss=2.0").key,
            "fault.loss"
        );
        assert_eq!(bad("[port]\ndevice='x'\nmbufs=10").key, "port.mbufs");
        // Client numbers are 16 bits on the worker: more clients could not be told apart.
        // A client shares no memory without area bytes: refused here, not at attach.
        assert_eq!(
            bad("[port]\ndevice='x'\n[host]\nmax_area_bytes=0").key,
            "host.max_area_bytes"
        );
        let e = bad("[port]\ndevice='x'\n[host]\nmax_clients=70000");
        assert_eq!(e.key, "host.max_clients");
        assert!(e.problem.contains("65534"), "{e}");
        assert_eq!(
            bad("[port]\ndevice='x'\n[host]\nmax_areas=0").key,
            "host.max_areas"
        );
        // Unknown keys and type errors in the file are reported with their line.
        let e = bad("[port]\ndevice='x'\nbogus=1");
        assert!(e.key.starts_with("line"), "{e}");
        assert!(e.problem.contains("bogus"), "{e}");
    }

    /// PFC on untagged frames classified by PCP can never pause (every received frame is
    /// priority 0): `--check` and rnicd's start say so, and not once trust is DSCP, a VLAN
    /// is set or priority 0 is lossless.
    #[test]
    fn pfc_that_cannot_classify_is_called_wrong() {
        let fails = |extra: &str| {
            ok(&format!(
                "[port]\ndevice='net_ring0'\n[address]\nipv4=['10.99.0.1/24']\n\
                 [pfc]\nmode='pfc'\n{extra}"
            ))
            .preflight()
            .into_iter()
            .filter(|c| matches!(c, Check::Fail(m) if m.contains("PCP")))
            .count()
        };
        assert_eq!(fails("priorities=[3]"), 1);
        assert_eq!(fails("priorities=[0,3]"), 0);
        assert_eq!(fails("priorities=[3]\n[roce]\ntrust='dscp'"), 0);
        assert_eq!(fails("priorities=[3]\n[roce]\nvlan=5"), 0);
        // Untagged frames take roce.pcp: lossless when it is a PFC priority, else not.
        assert_eq!(fails("priorities=[3]\n[roce]\npcp=3"), 0);
        assert_eq!(fails("priorities=[0]\n[roce]\npcp=3"), 1);
    }

    /// PFC turned on after validation (`--switch-pfc`) is checked the same way: a receive
    /// buffer whose XOFF the pool cannot reach passes with PFC off and fails once it is on.
    #[test]
    fn pfc_turned_on_later_is_checked_too() {
        let mut c = ok("[port]\ndevice='x'\n[pfc]\nrx_buffer_kb=65536");
        assert!(c.pfc.check_reachable(c.mbufs).is_ok());
        c.pfc.mode = Mode::Pfc { enabled: 1 << 3 };
        assert_eq!(
            c.pfc.check_reachable(c.mbufs).unwrap_err().key,
            "pfc.rx_buffer_kb"
        );
    }

    /// A file is held to the bounds `--set` applies: these values used to pass from a file
    /// and then abort the allocation (hold frames), overflow (worker thread, idle spins) or
    /// stall the port (an idle sleep of minutes).
    #[test]
    fn a_file_is_held_to_the_command_lines_bounds() {
        for (section, key, value) in [
            ("roce", "ud_rx_hold_frames", "4000000000"),
            ("roce", "ud_rx_hold_us", "4000000000"),
            ("worker", "thread", "4294967295"),
            ("worker", "idle_spin", "4294967295"),
            ("worker", "idle_pause", "4294967295"),
            ("worker", "idle_sleep_us", "600000000"),
            ("worker", "idle_sleep_max_us", "600000000"),
            ("fault", "delay_us", "4000000000"),
            ("pfc", "watchdog_ms", "4000000000"),
            ("pfc", "restore_ms", "4000000000"),
            ("switch", "headroom_kb", "4000000000"),
        ] {
            // (the switch model is validated only when enabled)
            let text = format!("[port]\ndevice='x'\n[{section}]\n{key}={value}")
                .replace("[switch]", "[switch]\nenabled=true");
            let e = bad(&text);
            assert_eq!(e.key, format!("{section}.{key}"), "{e}");
            // And the command line refuses the same value.
            let mut r = RawConfig::default();
            assert!(
                r.set(&format!("{section}.{key}"), value).is_err(),
                "{section}.{key}"
            );
        }
    }

    #[test]
    fn worker_count_spreads_an_rnic_over_threads() {
        let mut r = RawConfig::default();
        r.set("port.device", "net_ring0").unwrap();
        assert_eq!(
            r.validate().unwrap().worker_count,
            1,
            "one worker by default"
        );
        r.set("worker.count", "2").unwrap();
        r.set("worker.thread", "3").unwrap();
        let c = r.validate().unwrap();
        assert_eq!((c.worker_thread, c.worker_count), (3, 2));
        assert_eq!(c.port_queues(), 2, "a queue pair per worker");
        // What needs to see every frame in one place keeps the port to one queue pair.
        for (k, v) in [
            ("capture.pcap", "/tmp/x.pcap"),
            ("fault.loss", "0.01"),
            ("fault.rx_pps", "1000"),
            ("pfc.mode", "pfc"),
        ] {
            let mut r = r.clone();
            r.set(k, v).unwrap();
            assert_eq!(r.validate().unwrap().port_queues(), 1, "{k}");
        }
        assert!(c.to_toml().contains("count = 2"), "{}", c.to_toml());
        // One context over them: off by default, its queues bounded.
        assert!(!c.worker_spread);
        let mut s = r.clone();
        s.set("worker.spread", "true").unwrap();
        s.set("worker.spread_queue", "2").unwrap();
        let sc = s.validate().unwrap();
        assert!(sc.worker_spread && sc.spread_queue == 2);
        assert!(sc.to_toml().contains("spread = true"), "{}", sc.to_toml());
        s.set("worker.spread_queue", "0").unwrap();
        assert_eq!(s.validate().unwrap_err().key, "worker.spread_queue");
        assert!(s.set("worker.spread_queue", "65537").is_err());
        // No worker, past the last thread, or a QP table the workers cannot share equally.
        r.set("worker.count", "0").unwrap();
        assert_eq!(r.validate().unwrap_err().key, "worker.count");
        r.set("worker.count", "62").unwrap();
        assert_eq!(r.validate().unwrap_err().key, "worker.count");
        r.set("worker.count", "3").unwrap();
        let e = r.validate().unwrap_err();
        assert!(e.problem.contains("multiple"), "{e}");
        r.set("roce.max_qp", "3072").unwrap();
        assert_eq!(r.validate().unwrap().worker_count, 3);
    }

    #[test]
    fn overrides() {
        let mut r = RawConfig::default();
        r.set("port.device", "net_ring0").unwrap();
        r.set("address.ipv4", "10.99.0.3/24, 10.99.1.3/24").unwrap();
        r.set("roce.ecn", "yes").unwrap();
        let c = r.validate().unwrap();
        assert_eq!(c.ipv4.len(), 2);
        assert!(c.ecn);
        // Unset per-client limits are a quarter of the device's; set ones are kept.
        r.set("host.max_qps", "3").unwrap();
        let c = r.validate().unwrap();
        let dev = roce::engine::DeviceLimits::default();
        let l = c.host.client_limits(&dev);
        assert_eq!(l.max_qps, 3);
        assert_eq!(l.max_pds, dev.max_pd / DEFAULT_CLIENT_SHARE);
        assert_eq!(l.max_mrs, dev.max_mr / DEFAULT_CLIENT_SHARE);
        assert_eq!((l.max_areas, l.max_queue_bytes), (1024, 256 << 20));
        assert_eq!(r.set("port.nope", "1").unwrap_err().key, "port.nope");
        assert!(r.set("roce.ecn", "maybe").is_err());
        assert!(r.set("port.mtu", "lots").is_err());
    }
}
