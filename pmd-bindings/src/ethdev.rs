//! Ethernet ports: probing (vdev devargs or an existing/PCI device), configuration, queue
//! ownership, bursts, link status, statistics and flow control.
//!
//! Ownership follows the l2fwd model: the [`Port`] is shared (control path: stats, link,
//! stop), while each rx/tx queue is taken exactly once as an [`RxQueue`] / [`TxQueue`] and
//! moved to the one thread (lcore) that polls it. Queue handles keep the port alive.

use std::any::Any;
use std::ffi::{CStr, CString};
use std::sync::{Arc, Mutex};

use crate::eal::{self, Eal};
use crate::error::{Error, Result};
use crate::mbuf::Mbuf;
use crate::mempool::Mempool;
use crate::sys;

/// `RTE_ETH_TX_OFFLOAD_MULTI_SEGS` (a macro bindgen cannot evaluate).
const TX_OFFLOAD_MULTI_SEGS: u64 = 1 << 15;
/// `RTE_ETH_RSS_IPV4 | RTE_ETH_RSS_NONFRAG_IPV4_UDP | RTE_ETH_RSS_IPV6 |
/// RTE_ETH_RSS_NONFRAG_IPV6_UDP` (rte_ethdev.h, DPDK 22.11): RoCEv2 flows differ by
/// address and UDP source port.
const RSS_IP_UDP: u64 = 1 << 2 | 1 << 5 | 1 << 8 | 1 << 11;
/// `RTE_ETH_RX_OFFLOAD_SCATTER`.
const RX_OFFLOAD_SCATTER: u64 = 1 << 13;

/// How to configure a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// Receive queues (with several, flows are spread over them by RSS on their IP
    /// addresses and UDP ports where the device supports it).
    pub rx_queues: u16,
    /// Transmit queues.
    pub tx_queues: u16,
    /// Receive descriptors per queue (adjusted to the driver's limits).
    pub rx_desc: u16,
    /// Transmit descriptors per queue (adjusted to the driver's limits).
    pub tx_desc: u16,
    /// IP MTU to configure (`None`: the driver's default, normally 1500).
    pub mtu: Option<u16>,
    /// Enable promiscuous mode (ignored where the driver has no such notion).
    pub promiscuous: bool,
    /// Take at most the queues the driver allows rather than fail with more: rx and tx
    /// queues alike, at most the smaller of the driver's two limits (the port's
    /// `rx_queue_count` and `tx_queue_count` then say what it got).
    pub fit_queues: bool,
}

impl Default for PortConfig {
    fn default() -> Self {
        PortConfig {
            rx_queues: 1,
            tx_queues: 1,
            rx_desc: 1024,
            tx_desc: 1024,
            mtu: None,
            promiscuous: true,
            fit_queues: false,
        }
    }
}

/// Link state (`rte_eth_link`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStatus {
    /// Link up.
    pub up: bool,
    /// Speed in Mb/s (0 when unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Basic port counters (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Packets dropped by the hardware because no descriptor was free.
    pub imissed: u64,
    /// Erroneous received packets.
    pub ierrors: u64,
    /// Failed transmissions.
    pub oerrors: u64,
    /// Receive mbuf allocation failures.
    pub rx_nombuf: u64,
}

/// Priority flow control settings for a real NIC (`rte_eth_dev_priority_flow_ctrl_set`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PfcSettings {
    /// 802.1p priority (0..=7).
    pub priority: u8,
    /// Honour received pause frames for this priority.
    pub rx_pause: bool,
    /// Send pause frames when the NIC's buffer for this priority fills.
    pub tx_pause: bool,
    /// High water mark (bytes) that triggers XOFF.
    pub high_water: u32,
    /// Low water mark (bytes) that triggers XON.
    pub low_water: u32,
    /// Pause quanta sent in XOFF frames.
    pub pause_time: u16,
}

/// Where a port comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Origin {
    /// Probed by us from devargs; removed (`rte_vdev_uninit`) when the port is dropped.
    Vdev(String),
    /// Probed by EAL (PCI, `--vdev`), only closed when dropped.
    Existing,
}

struct PortInner {
    id: u16,
    name: String,
    origin: Origin,
    _pool: Arc<Mempool>,
    queues: Mutex<QueueClaims>,
    /// Anything the port's driver points into that must outlive it (the ring pair's rings).
    _keepalive: Option<Box<dyn Any + Send + Sync>>,
    rx_queues: u16,
    tx_queues: u16,
    multi_seg_tx: bool,
}

#[derive(Default)]
struct QueueClaims {
    rx: Vec<bool>,
    tx: Vec<bool>,
    started: bool,
}

/// A configured and started Ethernet port. Cheap to clone (shared handle); the device is
/// stopped, closed and (if we probed it) removed when the last handle and queue are dropped.
#[derive(Clone)]
pub struct Port {
    inner: Arc<PortInner>,
}

impl std::fmt::Debug for Port {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Port")
            .field("id", &self.inner.id)
            .field("name", &self.inner.name)
            .finish()
    }
}

/// The device name part of a devargs string (`net_pcap0,rx_pcap=x` -> `net_pcap0`).
pub fn devargs_name(devargs: &str) -> &str {
    devargs.split(',').next().unwrap_or("").trim()
}

impl Port {
    /// Probes a virtual device from a devargs string at run time (e.g. `net_ring0`,
    /// `net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap`, `net_af_packet0,iface=tap0`), then
    /// configures and starts it with receive mbufs from `pool`.
    pub fn probe(devargs: &str, config: &PortConfig, pool: Arc<Mempool>) -> Result<Port> {
        Eal::require()?;
        let name = devargs_name(devargs);
        if name.is_empty() || !name.starts_with("net_") {
            return Err(Error::InvalidArgument(format!(
                "devargs {devargs:?} must start with a virtual device name such as net_ring0"
            )));
        }
        let cdev = CString::new(devargs)
            .map_err(|_| Error::InvalidArgument("devargs contain a NUL byte".into()))?;
        let id = {
            let _g = eal::control_lock();
            // SAFETY: EAL initialised; cdev is a valid C string.
            let ret = unsafe { sys::rte_dev_probe(cdev.as_ptr()) };
            if ret < 0 {
                return Err(Error::Dpdk {
                    op: "rte_dev_probe",
                    errno: -ret,
                    msg: format!(
                        "cannot probe {devargs:?}: {} (check the driver name and its arguments)",
                        crate::error::strerror(-ret)
                    ),
                });
            }
            match port_id_by_name(name) {
                Ok(id) => id,
                Err(e) => {
                    uninit_vdev(name);
                    return Err(e);
                }
            }
        };
        Self::setup(id, name, Origin::Vdev(name.to_string()), config, pool, None)
    }

    /// Uses a port EAL already knows (a PCI address such as `0000:00:08.0`, or a `--vdev`
    /// given at init), configures and starts it.
    pub fn open(name: &str, config: &PortConfig, pool: Arc<Mempool>) -> Result<Port> {
        Eal::require()?;
        let id = {
            let _g = eal::control_lock();
            port_id_by_name(name)?
        };
        Self::setup(id, name, Origin::Existing, config, pool, None)
    }

    /// Probes `spec` if it looks like devargs (`net_...`), else opens an existing port.
    pub fn probe_or_open(spec: &str, config: &PortConfig, pool: Arc<Mempool>) -> Result<Port> {
        if spec.starts_with("net_") {
            let name = devargs_name(spec);
            let exists = {
                let _g = eal::control_lock();
                port_id_by_name(name).is_ok()
            };
            if exists {
                return Self::open(name, config, pool);
            }
            Self::probe(spec, config, pool)
        } else {
            Self::open(spec, config, pool)
        }
    }

    pub(crate) fn setup(
        id: u16,
        name: &str,
        origin: Origin,
        config: &PortConfig,
        pool: Arc<Mempool>,
        keepalive: Option<Box<dyn Any + Send + Sync>>,
    ) -> Result<Port> {
        let fail = |e: Error, origin: &Origin| {
            close_port(id, origin);
            Err(e)
        };
        if config.rx_queues == 0 || config.tx_queues == 0 {
            return fail(
                Error::InvalidArgument("a port needs at least one rx and one tx queue".into()),
                &origin,
            );
        }
        let _g = eal::control_lock();
        let info = match dev_info(id) {
            Ok(i) => i,
            Err(e) => return fail(e, &origin),
        };
        let mut config = config.clone();
        if config.fit_queues {
            // Queues are wanted in pairs (an rx and a tx queue per poller): both kinds fit
            // the smaller of the two limits.
            let n = info.max_rx_queues.min(info.max_tx_queues).max(1);
            config.rx_queues = config.rx_queues.min(n);
            config.tx_queues = config.tx_queues.min(n);
        }
        let config = &config;
        if config.rx_queues > info.max_rx_queues || config.tx_queues > info.max_tx_queues {
            return fail(
                Error::InvalidArgument(format!(
                    "port {name}: {}x{} queues requested, driver allows {}x{}",
                    config.rx_queues, config.tx_queues, info.max_rx_queues, info.max_tx_queues
                )),
                &origin,
            );
        }
        if let Some(mtu) = config.mtu {
            // Name the limit rather than let rte_eth_dev_configure fail with a bare EINVAL.
            let (lo, hi) = (info.min_mtu, info.max_mtu);
            if hi != 0 && (mtu < lo || mtu > hi) {
                return fail(
                    Error::InvalidArgument(format!(
                        "port {name}: MTU {mtu} is outside what the device supports ({lo}..={hi})"
                    )),
                    &origin,
                );
            }
        }
        // SAFETY: rte_eth_conf is plain data; all-zero is DPDK's documented default.
        let mut conf: sys::rte_eth_conf = unsafe { std::mem::zeroed() };
        if let Some(mtu) = config.mtu {
            conf.rxmode.mtu = mtu as u32;
        }
        // Several rx queues: spread flows over them by RSS on the addresses and UDP ports,
        // as far as the device hashes them (a device without RSS delivers to queue 0).
        let rss_hf = RSS_IP_UDP & info.flow_type_rss_offloads;
        if config.rx_queues > 1 && rss_hf != 0 {
            conf.rxmode.mq_mode = sys::RTE_ETH_MQ_RX_RSS;
            conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
        }
        // Frames larger than one mbuf need scatter on receive and multi-segment transmit.
        let multi_seg_tx = info.tx_offload_capa & TX_OFFLOAD_MULTI_SEGS != 0;
        if multi_seg_tx {
            conf.txmode.offloads |= TX_OFFLOAD_MULTI_SEGS;
        }
        let frame = config.mtu.unwrap_or(1500) as usize + 18 + 4;
        if frame > pool.max_frame_len() && info.rx_offload_capa & RX_OFFLOAD_SCATTER != 0 {
            conf.rxmode.offloads |= RX_OFFLOAD_SCATTER;
        }
        // SAFETY: valid port id; conf is fully initialised.
        let ret =
            unsafe { sys::rte_eth_dev_configure(id, config.rx_queues, config.tx_queues, &conf) };
        if ret < 0 {
            let e = Error::from_errno("rte_eth_dev_configure", -ret);
            return fail(
                Error::InvalidArgument(format!(
                    "port {name}: {e} (MTU {}, {}x{} queues)",
                    config.mtu.unwrap_or(1500),
                    config.rx_queues,
                    config.tx_queues
                )),
                &origin,
            );
        }
        let (mut nrx, mut ntx) = (config.rx_desc, config.tx_desc);
        // SAFETY: valid port id and pointers to locals.
        let ret = unsafe { sys::rte_eth_dev_adjust_nb_rx_tx_desc(id, &mut nrx, &mut ntx) };
        if ret < 0 {
            return fail(
                Error::from_errno("rte_eth_dev_adjust_nb_rx_tx_desc", -ret),
                &origin,
            );
        }
        // SAFETY: valid port id.
        let socket = unsafe { sys::rte_eth_dev_socket_id(id) };
        let socket = if socket < 0 { 0 } else { socket as u32 };
        for q in 0..config.rx_queues {
            // SAFETY: configured port, queue index in range, pool alive (the port keeps it).
            let ret = unsafe {
                sys::rte_eth_rx_queue_setup(id, q, nrx, socket, std::ptr::null(), pool.as_ptr())
            };
            if ret < 0 {
                return fail(Error::from_errno("rte_eth_rx_queue_setup", -ret), &origin);
            }
        }
        for q in 0..config.tx_queues {
            // SAFETY: configured port, queue index in range.
            let ret = unsafe { sys::rte_eth_tx_queue_setup(id, q, ntx, socket, std::ptr::null()) };
            if ret < 0 {
                return fail(Error::from_errno("rte_eth_tx_queue_setup", -ret), &origin);
            }
        }
        // SAFETY: configured port.
        let ret = unsafe { sys::rte_eth_dev_start(id) };
        if ret < 0 {
            return fail(Error::from_errno("rte_eth_dev_start", -ret), &origin);
        }
        if config.promiscuous {
            // Virtual drivers without the notion report ENOTSUP; they deliver everything.
            // SAFETY: started port.
            let _ = unsafe { sys::rte_eth_promiscuous_enable(id) };
        }
        Ok(Port {
            inner: Arc::new(PortInner {
                id,
                name: name.to_string(),
                origin,
                _pool: pool,
                queues: Mutex::new(QueueClaims {
                    rx: vec![false; config.rx_queues as usize],
                    tx: vec![false; config.tx_queues as usize],
                    started: true,
                }),
                _keepalive: keepalive,
                rx_queues: config.rx_queues,
                tx_queues: config.tx_queues,
                multi_seg_tx,
            }),
        })
    }

    /// DPDK port id.
    pub fn id(&self) -> u16 {
        self.inner.id
    }

    /// Device name (`net_ring0`, a PCI address...).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether multi-segment mbufs can be transmitted (else chains must be linearised).
    pub fn multi_seg_tx(&self) -> bool {
        self.inner.multi_seg_tx
    }

    /// Number of rx queues.
    pub fn rx_queue_count(&self) -> u16 {
        self.inner.rx_queues
    }

    /// Number of tx queues.
    pub fn tx_queue_count(&self) -> u16 {
        self.inner.tx_queues
    }

    /// Takes ownership of rx queue `q` (once; released when the handle drops).
    pub fn rx_queue(&self, q: u16) -> Result<RxQueue> {
        Ok(RxQueue(self.claim(q, true)?))
    }

    /// Takes ownership of tx queue `q` (once; released when the handle drops).
    pub fn tx_queue(&self, q: u16) -> Result<TxQueue> {
        Ok(TxQueue(self.claim(q, false)?))
    }

    fn claim(&self, q: u16, rx: bool) -> Result<Claim> {
        let mut claims = self.inner.queues.lock().unwrap_or_else(|e| e.into_inner());
        let list = if rx { &mut claims.rx } else { &mut claims.tx };
        match list.get_mut(q as usize) {
            None => Err(Error::InvalidArgument(format!(
                "port {}: no {} queue {q}",
                self.inner.name,
                if rx { "rx" } else { "tx" }
            ))),
            Some(true) => Err(Error::InvalidArgument(format!(
                "port {}: {} queue {q} is already owned",
                self.inner.name,
                if rx { "rx" } else { "tx" }
            ))),
            Some(slot) => {
                *slot = true;
                Ok(Claim {
                    port: self.inner.clone(),
                    q,
                    rx,
                })
            }
        }
    }

    /// The port's MAC address.
    pub fn mac_addr(&self) -> Result<[u8; 6]> {
        let mut mac = sys::rte_ether_addr::default();
        // SAFETY: valid port id, pointer to a local.
        let ret = unsafe { sys::rte_eth_macaddr_get(self.inner.id, &mut mac) };
        Error::check("rte_eth_macaddr_get", ret)?;
        Ok(mac.addr_bytes)
    }

    /// Sets the port's MAC address (`NotSupported` on drivers that cannot).
    pub fn set_mac_addr(&self, mac: [u8; 6]) -> Result<()> {
        let mut addr = sys::rte_ether_addr { addr_bytes: mac };
        let _g = eal::control_lock();
        // SAFETY: valid port id, pointer to a local.
        let ret = unsafe { sys::rte_eth_dev_default_mac_addr_set(self.inner.id, &mut addr) };
        Error::check("rte_eth_dev_default_mac_addr_set", ret).map(|_| ())
    }

    /// The configured MTU.
    pub fn mtu(&self) -> Result<u16> {
        let mut mtu = 0u16;
        // SAFETY: valid port id, pointer to a local.
        let ret = unsafe { sys::rte_eth_dev_get_mtu(self.inner.id, &mut mtu) };
        Error::check("rte_eth_dev_get_mtu", ret)?;
        Ok(mtu)
    }

    /// Link status without waiting.
    pub fn link(&self) -> Result<LinkStatus> {
        let mut link = sys::rte_eth_link::default();
        // SAFETY: valid port id, pointer to a local.
        let ret = unsafe { sys::rte_eth_link_get_nowait(self.inner.id, &mut link) };
        Error::check("rte_eth_link_get_nowait", ret)?;
        Ok(LinkStatus {
            up: link.link_status() != 0,
            speed_mbps: if link.link_speed == u32::MAX {
                0
            } else {
                link.link_speed
            },
            full_duplex: link.link_duplex() != 0,
        })
    }

    /// Basic counters.
    pub fn stats(&self) -> Result<PortStats> {
        let mut s = sys::rte_eth_stats::default();
        // SAFETY: valid port id, pointer to a local.
        let ret = unsafe { sys::rte_eth_stats_get(self.inner.id, &mut s) };
        Error::check("rte_eth_stats_get", ret)?;
        Ok(PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    /// Resets the basic counters.
    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: valid port id.
        let ret = unsafe { sys::rte_eth_stats_reset(self.inner.id) };
        Error::check("rte_eth_stats_reset", ret).map(|_| ())
    }

    /// Extended, driver-specific counters as (name, value) pairs.
    pub fn xstats(&self) -> Result<Vec<(String, u64)>> {
        let id = self.inner.id;
        // SAFETY: a NULL array with size 0 asks for the count.
        let n = unsafe { sys::rte_eth_xstats_get_names(id, std::ptr::null_mut(), 0) };
        let n = Error::check("rte_eth_xstats_get_names", n)? as usize;
        let mut names = vec![sys::rte_eth_xstat_name::default(); n];
        let mut values = vec![sys::rte_eth_xstat::default(); n];
        // SAFETY: arrays of n entries each.
        let got = unsafe { sys::rte_eth_xstats_get_names(id, names.as_mut_ptr(), n as u32) };
        let got = Error::check("rte_eth_xstats_get_names", got)? as usize;
        // SAFETY: as above.
        let gotv = unsafe { sys::rte_eth_xstats_get(id, values.as_mut_ptr(), n as u32) };
        let gotv = Error::check("rte_eth_xstats_get", gotv)? as usize;
        let count = got.min(gotv).min(n);
        Ok(values[..count]
            .iter()
            .map(|v| {
                let name = names
                    .get(v.id as usize)
                    .map(|nm| {
                        // SAFETY: DPDK writes NUL-terminated names into fixed arrays.
                        unsafe { CStr::from_ptr(nm.name.as_ptr()) }
                            .to_string_lossy()
                            .into_owned()
                    })
                    .unwrap_or_else(|| format!("xstat{}", v.id));
                (name, v.value)
            })
            .collect())
    }

    /// Configures priority flow control on NICs that implement it in hardware. Virtual
    /// devices return [`Error::NotSupported`]; there PFC frames are ordinary packets that the
    /// dataplane handles itself.
    pub fn set_priority_flow_control(&self, pfc: &PfcSettings) -> Result<()> {
        if pfc.priority > 7 {
            return Err(Error::InvalidArgument(format!(
                "PFC priority {} is not 0..=7",
                pfc.priority
            )));
        }
        let mut conf = sys::rte_eth_pfc_conf::default();
        conf.fc.high_water = pfc.high_water;
        conf.fc.low_water = pfc.low_water;
        conf.fc.pause_time = pfc.pause_time;
        conf.fc.send_xon = 1;
        conf.fc.mode = match (pfc.rx_pause, pfc.tx_pause) {
            (false, false) => sys::RTE_ETH_FC_NONE,
            (true, false) => sys::RTE_ETH_FC_RX_PAUSE,
            (false, true) => sys::RTE_ETH_FC_TX_PAUSE,
            (true, true) => sys::RTE_ETH_FC_FULL,
        };
        conf.priority = pfc.priority;
        let _g = eal::control_lock();
        // SAFETY: valid port id, pointer to a local.
        let ret = unsafe { sys::rte_eth_dev_priority_flow_ctrl_set(self.inner.id, &mut conf) };
        Error::check("rte_eth_dev_priority_flow_ctrl_set", ret).map(|_| ())
    }

    /// Stops the port (queues stop delivering); [`Port::start`] restarts it.
    pub fn stop(&self) -> Result<()> {
        let _g = eal::control_lock();
        let mut claims = self.inner.queues.lock().unwrap_or_else(|e| e.into_inner());
        if claims.started {
            // SAFETY: valid port id.
            let ret = unsafe { sys::rte_eth_dev_stop(self.inner.id) };
            Error::check("rte_eth_dev_stop", ret)?;
            claims.started = false;
        }
        Ok(())
    }

    /// Starts a stopped port.
    pub fn start(&self) -> Result<()> {
        let _g = eal::control_lock();
        let mut claims = self.inner.queues.lock().unwrap_or_else(|e| e.into_inner());
        if !claims.started {
            // SAFETY: valid, configured port id.
            let ret = unsafe { sys::rte_eth_dev_start(self.inner.id) };
            Error::check("rte_eth_dev_start", ret)?;
            claims.started = true;
        }
        Ok(())
    }
}

impl Drop for PortInner {
    fn drop(&mut self) {
        let _g = eal::control_lock();
        if self.queues.get_mut().map(|c| c.started).unwrap_or(true) {
            // SAFETY: valid port id; no queue handle exists any more (they hold this Arc).
            unsafe { sys::rte_eth_dev_stop(self.id) };
        }
        close_port(self.id, &self.origin);
    }
}

/// Closes a port and, for a vdev we probed, removes the device so its name can be reused.
/// Must be called with the control lock held (or during setup before the port escapes).
fn close_port(id: u16, origin: &Origin) {
    // SAFETY: valid port id; nobody polls it any more.
    unsafe { sys::rte_eth_dev_close(id) };
    if let Origin::Vdev(name) = origin {
        uninit_vdev(name);
    }
}

fn uninit_vdev(name: &str) {
    if let Ok(c) = CString::new(name) {
        // SAFETY: valid C string; the device's ports are closed.
        unsafe { sys::rte_vdev_uninit(c.as_ptr()) };
    }
}

fn port_id_by_name(name: &str) -> Result<u16> {
    let c =
        CString::new(name).map_err(|_| Error::InvalidArgument("port name contains NUL".into()))?;
    let mut id = 0u16;
    // SAFETY: valid C string and pointer to a local.
    let ret = unsafe { sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) };
    if ret < 0 {
        return Err(Error::Dpdk {
            op: "rte_eth_dev_get_port_by_name",
            errno: -ret,
            msg: format!("no DPDK port named {name:?}"),
        });
    }
    Ok(id)
}

fn dev_info(id: u16) -> Result<sys::rte_eth_dev_info> {
    // SAFETY: plain data, zero is a valid initial state; DPDK fills it in.
    let mut info: sys::rte_eth_dev_info = unsafe { std::mem::zeroed() };
    // SAFETY: valid port id, pointer to a local.
    let ret = unsafe { sys::rte_eth_dev_info_get(id, &mut info) };
    Error::check("rte_eth_dev_info_get", ret)?;
    Ok(info)
}

/// A queue of a port taken by one handle; dropping it gives the queue back.
struct Claim {
    port: Arc<PortInner>,
    q: u16,
    rx: bool,
}

impl Drop for Claim {
    fn drop(&mut self) {
        if let Ok(mut c) = self.port.queues.lock() {
            let list = if self.rx { &mut c.rx } else { &mut c.tx };
            list[self.q as usize] = false;
        }
    }
}

/// Exclusive handle to one receive queue of a port.
pub struct RxQueue(Claim);

impl RxQueue {
    /// Receives up to the spare capacity of `out` (at most 65535) and appends the mbufs.
    /// Reserve the burst size once (e.g. `Vec::with_capacity(32)`) and clear it after use:
    /// the call then never allocates.
    #[inline]
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>) -> usize {
        self.rx_burst_max(out, usize::MAX)
    }

    /// Receives at most `max` frames (and at most the spare capacity of `out`), as
    /// [`RxQueue::rx_burst`] does: for a receiver that takes only what it has room for.
    #[inline]
    pub fn rx_burst_max(&mut self, out: &mut Vec<Mbuf>, max: usize) -> usize {
        let len = out.len();
        let room = (out.capacity() - len).min(max).min(u16::MAX as usize) as u16;
        if room == 0 {
            return 0;
        }
        // SAFETY: the queue is owned by this handle (one poller); the spare capacity holds
        // `room` slots; Mbuf is repr(transparent) over *mut rte_mbuf; DPDK initialises the
        // first `n` and hands us ownership of them.
        unsafe {
            let dst = out.as_mut_ptr().add(len) as *mut *mut sys::rte_mbuf;
            let n = sys::ferroce_rx_burst(self.0.port.id, self.0.q, dst, room) as usize;
            out.set_len(len + n);
            n
        }
    }

    /// Queue index.
    pub fn queue(&self) -> u16 {
        self.0.q
    }

    /// Port id.
    pub fn port_id(&self) -> u16 {
        self.0.port.id
    }
}

/// Exclusive handle to one transmit queue of a port.
pub struct TxQueue(Claim);

impl TxQueue {
    /// Sends mbufs from the front of `pkts`; returns how many the driver took. Those it did
    /// not take stay in `pkts`, in order, still owned by the caller (retry or drop them).
    #[inline]
    pub fn tx_burst(&mut self, pkts: &mut Vec<Mbuf>) -> usize {
        let len = pkts.len();
        if len == 0 {
            return 0;
        }
        let want = len.min(u16::MAX as usize) as u16;
        // SAFETY: the queue is owned by this handle; the first `want` entries are valid
        // mbufs; DPDK takes ownership of the first `n` it returns. We then move the rest to
        // the front without dropping the sent ones.
        unsafe {
            let base = pkts.as_mut_ptr();
            let n =
                sys::ferroce_tx_burst(self.0.port.id, self.0.q, base as *mut *mut _, want) as usize;
            if n > 0 {
                std::ptr::copy(base.add(n), base, len - n);
                pkts.set_len(len - n);
            }
            n
        }
    }

    /// Sends one mbuf; gives it back if the queue is full.
    #[inline]
    pub fn tx_one(&mut self, pkt: Mbuf) -> std::result::Result<(), Mbuf> {
        let mut raw = pkt.as_ptr();
        // SAFETY: queue owned by this handle; on success DPDK owns the mbuf.
        let n = unsafe { sys::ferroce_tx_burst(self.0.port.id, self.0.q, &mut raw, 1) };
        if n == 1 {
            std::mem::forget(pkt);
            Ok(())
        } else {
            Err(pkt)
        }
    }

    /// Queue index.
    pub fn queue(&self) -> u16 {
        self.0.q
    }

    /// Port id.
    pub fn port_id(&self) -> u16 {
        self.0.port.id
    }
}
