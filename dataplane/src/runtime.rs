//! Starting ferroce: EAL, pools, ports, RNICs and the worker that polls them; opening
//! application contexts on them.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pmd_bindings::mempool::ROCE_4K_DATA_ROOM;
use pmd_bindings::{ring_pair, Eal, EalBuilder, Mempool, Port, PortConfig};

use crate::config::{RawConfig, RnicConfig};
use crate::host::host_end;
use crate::local::{context, Context, LocalChannel};
use crate::nic::Nic;
use crate::switch::{QueueSample, SwitchDev, SwitchSettings, SwitchStats};
use crate::worker::{Backoff, Control, NicSnapshot, Worker, WorkerCell, WorkerLoad};
use ferroce_host::abi::{ClientLimits, HostLimits};
use ferroce_host::app::ClientRings;

/// Why the runtime could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// DPDK refused something.
    #[error("DPDK: {0}")]
    Dpdk(#[from] pmd_bindings::Error),
    /// Configuration problem.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Initialises the EAL for this process from `cfg` (or reuses it if already up).
pub fn init_eal(program: &str, cfg: &RnicConfig) -> Result<&'static Eal, StartError> {
    if let Some(e) = Eal::get() {
        return Ok(e);
    }
    let mut b = match &cfg.eal_args {
        Some(args) => EalBuilder::new(program).args(args.iter()),
        None => EalBuilder::software(program),
    };
    if let Some(p) = &cfg.file_prefix {
        b = b.file_prefix(p);
    }
    match b.init() {
        Ok(e) => Ok(e),
        // Another thread won the race: use its EAL.
        Err(pmd_bindings::Error::AlreadyInitialized) => Eal::require().map_err(Into::into),
        Err(e) => Err(e.into()),
    }
}

static POOL_SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

fn pool_for(cfg: &RnicConfig) -> Result<Arc<Mempool>, StartError> {
    let n = POOL_SEQ.fetch_add(1, Ordering::Relaxed);
    let name = format!("rnic{}_{}", std::process::id() % 100_000, n);
    Ok(Mempool::new(
        &name,
        cfg.mbufs,
        crate::worker::MEMPOOL_CACHE,
        ROCE_4K_DATA_ROOM,
    )?)
}

fn port_config(cfg: &RnicConfig) -> PortConfig {
    PortConfig {
        rx_queues: cfg.port_queues(),
        tx_queues: cfg.port_queues(),
        fit_queues: true,
        rx_desc: cfg.rx_desc,
        tx_desc: cfg.tx_desc,
        mtu: Some(cfg.mtu as u16),
        promiscuous: cfg.promiscuous,
    }
}

/// An RNIC on `port`: directly, or - with `[switch]` - on port 0 of an emulated switch (a
/// ring link in this process) whose port 1 is `port`. The RNIC keeps the port's MAC unless
/// its configuration names one.
fn nic_on(
    mut cfg: RnicConfig,
    port: Port,
    pool: Arc<Mempool>,
) -> Result<(Vec<Nic>, Option<SwitchDev>), StartError> {
    let Some(settings) = cfg.switch.clone() else {
        let count = cfg.worker_count;
        return Ok((
            Nic::sharded(cfg, port, pool, count).map_err(StartError::Other)?,
            None,
        ));
    };
    if cfg.mac.is_none() {
        cfg.mac = Some(
            port.mac_addr()
                .map_err(|e| StartError::Other(format!("{}: {e}", port.name())))?,
        );
    }
    let rnic_mbps = settings
        .port_mbps
        .first()
        .copied()
        .unwrap_or(settings.rate_mbps);
    let n = POOL_SEQ.fetch_add(1, Ordering::Relaxed);
    let (nics, p_sw) = switch_link(cfg, rnic_mbps, &format!("swp{n}"), &pool)?;
    let mut sw = SwitchDev::new(vec![p_sw, port], pool, &settings).map_err(StartError::Other)?;
    sw.pin(nics[0].mac(), 0);
    Ok((nics, Some(sw)))
}

/// An RNIC (its shards, `worker.count`) on a ring link named `name` to a switch port, the
/// link at `mbps`; returns the RNIC and the switch's end.
fn switch_link(
    mut cfg: RnicConfig,
    mbps: f64,
    name: &str,
    pool: &Arc<Mempool>,
) -> Result<(Vec<Nic>, Port), StartError> {
    // Both ends of a link agree on its speed: pause quanta are bit times of the link, and
    // DCQCN's line rate defaults to it.
    cfg.speed_gbps = ((mbps / 1000.0).ceil() as u32).max(1);
    // The ring stands for the RNIC's MAC and the wire, past the point where a pause holds
    // frames: kept short, so what still arrives after an XOFF (the ring and one burst) fits
    // the switch's headroom.
    let mut pc = port_config(&cfg);
    // The switch serves one queue of each of its ports.
    (pc.rx_queues, pc.tx_queues) = (1, 1);
    pc.rx_desc = pc.rx_desc.min(SWITCH_LINK_DESC);
    pc.tx_desc = pc.tx_desc.min(SWITCH_LINK_DESC);
    let (p_rnic, p_sw) = ring_pair(name, &pc, pool.clone())?;
    let count = cfg.worker_count;
    let mut nics = Nic::sharded(cfg, p_rnic, pool.clone(), count).map_err(StartError::Other)?;
    for nic in &mut nics {
        nic.set_link_mbps(mbps as u64);
    }
    Ok((nics, p_sw))
}

/// Clears the worker's liveness flag when dropped.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// Frames a ring link between an RNIC and an emulated switch holds (see
/// [`Runtime::switched`]).
pub const SWITCH_LINK_DESC: u16 = 16;
/// A worker thread of a runtime: its control queue, the worker itself (which in-process
/// contexts of its RNICs may run while they wait) and its thread.
struct WorkerSlot {
    control: crate::worker::ControlQueue,
    cell: Arc<WorkerCell>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Its load, as it last published it.
    load: Arc<Mutex<WorkerLoad>>,
    /// The runtime's indices of its RNICs (of their shards it drives).
    rnics: Vec<usize>,
}

/// Running RNICs and their workers: one worker thread per distinct `worker.thread` among
/// the RNICs' configurations (one for all by default; an RNIC with `worker.count` n runs on
/// threads `worker.thread` to `worker.thread + n - 1`, one shard on each), each owning its
/// RNICs (shards) outright.
pub struct Runtime {
    stop: Arc<AtomicBool>,
    alive: Arc<AtomicBool>,
    workers: Vec<WorkerSlot>,
    /// Where RNIC `i` runs: for each of its shards, its worker and its index among that
    /// worker's RNICs.
    placement: Vec<Vec<(usize, usize)>>,
    /// The shard the next client of RNIC `i` is given (round robin).
    next_shard: Vec<AtomicUsize>,
    /// Each RNIC's shards' counter snapshots.
    stats: Vec<Vec<Arc<Mutex<NicSnapshot>>>>,
    switch_stats: Mutex<Vec<Arc<Mutex<SwitchStats>>>>,
    switch_samples: Mutex<Vec<Arc<Mutex<Vec<QueueSample>>>>>,
    configs: Vec<RnicConfig>,
    macs: Vec<[u8; 6]>,
    limits: Vec<HostLimits>,
    dev_limits: Vec<roce::engine::DeviceLimits>,
}

impl Runtime {
    /// Starts one RNIC per configuration on its own port, driven by the workers their
    /// `worker.thread` names (one for all by default).
    pub fn start(program: &str, cfgs: Vec<RnicConfig>) -> Result<Runtime, StartError> {
        let first = cfgs
            .first()
            .ok_or_else(|| StartError::Other("no RNIC configured".into()))?;
        init_eal(program, first)?;
        let mut nics = Vec::new();
        let mut switches = Vec::new();
        for cfg in cfgs {
            let pool = pool_for(&cfg)?;
            let mut pc = port_config(&cfg);
            // Behind a switch, the port carries frames for the RNIC's MAC, not its own.
            pc.promiscuous |= cfg.switch.is_some();
            let port = Port::probe_or_open(&cfg.device, &pc, pool.clone()).map_err(|e| {
                match crate::config::port_problem(&cfg.device) {
                    // DPDK's errno for these is misleading (EFAULT, EPERM): name the cause.
                    Some(p) => StartError::Other(p),
                    None => e.into(),
                }
            })?;
            let (nic, sw) = nic_on(cfg, port, pool)?;
            nics.push(nic);
            switches.extend(sw);
        }
        Self::spawn_with(nics, switches)
    }

    /// Two RNICs in this process joined back to back by an in-process DPDK link (a ring
    /// pair): `a` and `b` give their addresses; their `port.device` is ignored.
    pub fn loopback(program: &str, a: RnicConfig, b: RnicConfig) -> Result<Runtime, StartError> {
        init_eal(program, &a)?;
        // Both ends of the ring pair receive into one pool (the pair is created with one); each
        // RNIC transmits from it too.
        let pool = pool_for(&a)?;
        let n = POOL_SEQ.fetch_add(1, Ordering::Relaxed);
        // Queue q of one end's transmit is queue q of the other's receive: both ends take a
        // queue per worker only if both have as many (each end polls only its own).
        let mut pc = port_config(&a);
        if b.port_queues() != a.port_queues() {
            (pc.rx_queues, pc.tx_queues) = (1, 1);
        }
        let (pa, pb) = ring_pair(&format!("lo{n}"), &pc, pool.clone())?;
        let (na, sa) = nic_on(a, pa, pool.clone())?;
        let (nb, sb) = nic_on(b, pb, pool)?;
        Self::spawn_with(vec![na, nb], sa.into_iter().chain(sb).collect())
    }

    /// Starts RNICs on ports the caller already set up (e.g. one end of a ring pair whose other
    /// end a test drives by hand). EAL must be initialised.
    pub fn with_ports(ports: Vec<(RnicConfig, Port, Arc<Mempool>)>) -> Result<Runtime, StartError> {
        let mut nics = Vec::new();
        let mut switches = Vec::new();
        for (cfg, port, pool) in ports {
            let (nic, sw) = nic_on(cfg, port, pool)?;
            nics.push(nic);
            switches.extend(sw);
        }
        Self::spawn_with(nics, switches)
    }

    /// Starts a worker over RNICs the caller built (and may have configured through
    /// `Nic::dev` before any frame is processed, e.g. to replay a capture into a ready QP).
    pub fn with_nics(nics: Vec<Nic>) -> Result<Runtime, StartError> {
        Self::spawn(nics)
    }

    /// A pool for a test port with this configuration.
    pub fn pool(cfg: &RnicConfig) -> Result<Arc<Mempool>, StartError> {
        pool_for(cfg)
    }

    /// The port settings the runtime uses for `cfg`.
    pub fn port_config(cfg: &RnicConfig) -> PortConfig {
        port_config(cfg)
    }

    /// RNICs with `cfgs`, each joined by a ring link (of [`SWITCH_LINK_DESC`] frames) to its
    /// own port of an emulated switch
    /// (`crate::switch`), all in one worker: real frames through a shared-buffer switch with
    /// shaped egress, delay, ECN marking and PFC.
    pub fn switched(
        program: &str,
        cfgs: Vec<RnicConfig>,
        settings: &SwitchSettings,
    ) -> Result<Runtime, StartError> {
        let first = cfgs
            .first()
            .ok_or_else(|| StartError::Other("a switched runtime needs RNICs".into()))?;
        if cfgs.iter().any(|c| c.switch.is_some()) {
            return Err(StartError::Other(
                "the RNICs of a switched runtime are on its switch already: [switch] does not apply"
                    .into(),
            ));
        }
        init_eal(program, first)?;
        let pool = pool_for(first)?;
        let n = POOL_SEQ.fetch_add(1, Ordering::Relaxed);
        let mut nics = Vec::new();
        let mut ports = Vec::new();
        for (i, cfg) in cfgs.into_iter().enumerate() {
            let mbps = settings
                .port_mbps
                .get(i)
                .copied()
                .unwrap_or(settings.rate_mbps);
            let (nic, p_sw) = switch_link(cfg, mbps, &format!("sw{n}p{i}"), &pool)?;
            nics.push(nic);
            ports.push(p_sw);
        }
        let sw = SwitchDev::new(ports, pool, settings).map_err(StartError::Other)?;
        Self::spawn_with(nics, vec![sw])
    }

    /// The queue samples emulated switch `index` recorded since the last call
    /// (`SwitchSettings::sample_us`), oldest first.
    pub fn take_switch_samples(&self, index: usize) -> Vec<QueueSample> {
        let slot = match self.switch_samples.lock() {
            Ok(slots) => slots.get(index).cloned(),
            Err(_) => None,
        };
        let Some(slot) = slot else {
            return Vec::new();
        };
        let taken = match slot.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(_) => Vec::new(),
        };
        taken
    }

    /// The counters of emulated switch `index` (published about every millisecond).
    pub fn switch_stats(&self, index: usize) -> Option<SwitchStats> {
        let slots = self.switch_stats.lock().ok()?;
        let s = slots.get(index)?.lock().ok()?.clone();
        Some(s)
    }

    fn spawn(nics: Vec<Nic>) -> Result<Runtime, StartError> {
        Self::spawn_with(nics.into_iter().map(|n| vec![n]).collect(), Vec::new())
    }

    /// Starts the workers over `rnics` (each RNIC's shards, see `Nic::sharded`) and
    /// `switches` (numbered in this order for [`Runtime::switch_stats`]): one per distinct
    /// worker thread of the shards (shard k of an RNIC runs on `worker.thread + k`), in
    /// ascending order; the switches run on the first.
    fn spawn_with(rnics: Vec<Vec<Nic>>, switches: Vec<SwitchDev>) -> Result<Runtime, StartError> {
        if rnics.is_empty() || rnics.iter().any(|r| r.is_empty()) {
            return Err(StartError::Other("no RNIC configured".into()));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let alive = Arc::new(AtomicBool::new(true));
        let stats: Vec<Vec<_>> = rnics
            .iter()
            .map(|r| {
                r.iter()
                    .map(|_| Arc::new(Mutex::new(NicSnapshot::default())))
                    .collect()
            })
            .collect();
        let configs: Vec<RnicConfig> = rnics.iter().map(|r| r[0].config().clone()).collect();
        let macs = rnics.iter().map(|r| r[0].mac()).collect();
        let limits = rnics.iter().map(|r| r[0].host_limits()).collect();
        let dev_limits = rnics.iter().map(|r| r[0].device_limits()).collect();
        let thread_of = |i: usize, k: usize| configs[i].worker_thread + k as u32;
        let mut threads: Vec<u32> = rnics
            .iter()
            .enumerate()
            .flat_map(|(i, r)| (0..r.len()).map(move |k| (i, k)))
            .map(|(i, k)| thread_of(i, k))
            .collect();
        threads.sort_unstable();
        threads.dedup();
        // Per worker: (RNIC index, shard's stats slot, shard).
        type Placed = (usize, Arc<Mutex<NicSnapshot>>, Nic);
        let mut groups: Vec<Vec<Placed>> = threads.iter().map(|_| Vec::new()).collect();
        let mut placement = Vec::with_capacity(rnics.len());
        for (i, shards) in rnics.into_iter().enumerate() {
            let mut places = Vec::with_capacity(shards.len());
            for (k, nic) in shards.into_iter().enumerate() {
                let w = threads
                    .binary_search(&thread_of(i, k))
                    .expect("every shard's thread is listed");
                places.push((w, groups[w].len()));
                groups[w].push((i, stats[i][k].clone(), nic));
            }
            placement.push(places);
        }
        let mut switches = Some(switches);
        let mut switch_stats = Vec::new();
        let mut switch_samples = Vec::new();
        let mut workers = Vec::new();
        for (w, group) in groups.into_iter().enumerate() {
            let mut indices = Vec::with_capacity(group.len());
            let mut own_stats = Vec::with_capacity(group.len());
            let mut nics = Vec::with_capacity(group.len());
            for (i, slot, nic) in group {
                indices.push(i);
                own_stats.push(slot);
                nics.push(nic);
            }
            let c = &configs[indices[0]];
            let backoff = Backoff {
                spin: c.idle_spin,
                pause: c.idle_pause,
                sleep_us: c.idle_sleep_us,
                sleep_max_us: c.idle_sleep_max_us,
            };
            let control = crate::worker::control_queue();
            let mut worker = Worker::new(nics, backoff, control.clone(), own_stats);
            worker.name_devices(&indices);
            let load = Arc::new(Mutex::new(WorkerLoad::default()));
            worker.publish_load_to(load.clone());
            for sw in switches.take().into_iter().flatten() {
                let slot = Arc::new(Mutex::new(SwitchStats::default()));
                switch_stats.push(slot.clone());
                switch_samples.push(sw.samples());
                worker.add_switch(sw, slot);
            }
            let cell = Arc::new(WorkerCell::new(worker, stop.clone(), alive.clone()));
            let (a2, cell2) = (alive.clone(), cell.clone());
            // Thread names are cut at 15 bytes.
            let name = match w {
                0 => "ferroce-worker".to_string(),
                _ => format!("ferroce-wk{w}"),
            };
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                // Cleared when this thread ends, also by a panic (the guard drops while
                // unwinding), so applications get DeviceFatal instead of waiting forever;
                // the other workers see it and stop too.
                let _alive = AliveGuard(a2);
                // Registers the thread with the EAL (`worker::register`) and runs the worker.
                cell2.run();
            });
            let thread = match spawned {
                Ok(t) => t,
                Err(e) => {
                    // Stop the workers already running before giving up.
                    stop_workers(&stop, &workers);
                    return Err(StartError::Other(format!("cannot start a worker: {e}")));
                }
            };
            workers.push(WorkerSlot {
                control,
                cell,
                thread: Mutex::new(Some(thread)),
                load,
                rnics: indices,
            });
        }
        Ok(Runtime {
            stop,
            alive,
            workers,
            next_shard: placement.iter().map(|_| AtomicUsize::new(0)).collect(),
            placement,
            stats,
            switch_stats: Mutex::new(switch_stats),
            switch_samples: Mutex::new(switch_samples),
            configs,
            macs,
            limits,
            dev_limits,
        })
    }

    /// The worker and index there of the shard of RNIC `index` that takes its next client:
    /// clients are spread over an RNIC's shards in turn, each client's objects all on one
    /// (with `worker.spread`, the first shard is every client's home).
    fn place(&self, index: usize) -> (&WorkerSlot, usize) {
        let shards = &self.placement[index];
        // With `worker.spread` every context's home is the first shard, and its QPs are
        // placed on all of them (`nic/spread.rs`).
        let k = if self.configs[index].worker_spread {
            0
        } else {
            self.next_shard[index].fetch_add(1, Ordering::Relaxed) % shards.len()
        };
        let (w, i) = shards[k];
        (&self.workers[w], i)
    }

    /// How many workers RNIC `index` is spread over (`worker.count`; 0 if there is no
    /// such RNIC).
    pub fn shards(&self, index: usize) -> usize {
        self.placement.get(index).map_or(0, |p| p.len())
    }

    /// How many worker threads run.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// How many worker threads are still running (a worker's death stops the others; a
    /// stopped runtime has none).
    pub fn workers_running(&self) -> usize {
        self.workers
            .iter()
            .filter(|w| {
                w.thread
                    .lock()
                    .map(|t| t.as_ref().is_some_and(|t| !t.is_finished()))
                    .unwrap_or(false)
            })
            .count()
    }

    /// Worker `w`'s load as it last published it (about every millisecond), and the
    /// runtime's indices of its RNICs.
    pub fn worker_load(&self, w: usize) -> Option<(WorkerLoad, Vec<usize>)> {
        let slot = self.workers.get(w)?;
        let load = slot.load.lock().map(|l| *l).unwrap_or_default();
        Some((load, slot.rnics.clone()))
    }

    /// The worker that drives RNIC `index` (the one owning its port, if it has several).
    pub fn worker_of(&self, index: usize) -> Option<usize> {
        self.placement.get(index).map(|p| p[0].0)
    }

    /// Every RNIC's report ([`crate::nic::Nic::report`]), in RNIC order, gathered from every
    /// worker; `None` if a worker does not answer within `timeout`.
    pub fn inspect(
        &self,
        qp_counters: bool,
        timeout: std::time::Duration,
    ) -> Option<Vec<crate::nic::NicReport>> {
        let deadline = std::time::Instant::now() + timeout;
        let replies: Vec<_> = self
            .workers
            .iter()
            .map(|w| {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                w.control.push(Control::Inspect {
                    qp_counters,
                    reply: tx,
                });
                rx
            })
            .collect();
        let mut per_worker = Vec::new();
        for rx in replies {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            per_worker.push(rx.recv_timeout(left).ok()?);
        }
        let mut out = Vec::with_capacity(self.placement.len());
        for shards in &self.placement {
            // One report per RNIC: the port's owner's, with every shard's clients.
            let (w, i) = shards[0];
            let mut r: crate::nic::NicReport = per_worker[w].get(i)?.clone();
            for &(w, i) in &shards[1..] {
                for c in &per_worker[w].get(i)?.clients {
                    // A spread context's satellite: its QPs join its home's report.
                    let home = r
                        .clients
                        .iter_mut()
                        .find(|h| c.satellite && h.token == c.token && !h.satellite);
                    match home {
                        Some(h) => {
                            h.qps.extend(c.qps.iter().cloned());
                            h.qp_counters.extend(c.qp_counters.iter().cloned());
                        }
                        None => r.clients.push(c.clone()),
                    }
                }
            }
            out.push(r);
        }
        Some(out)
    }

    /// Opens an application context on RNIC `index`.
    pub fn open(&self, index: usize) -> Result<Context, StartError> {
        if index >= self.configs.len() {
            return Err(StartError::Other(format!("no RNIC {index}")));
        }
        let (w, i) = self.place(index);
        let (ctx, host) = context(
            w.control.clone(),
            i,
            self.limits[index],
            self.alive.clone(),
            // Run-to-completion unless the RNIC's configuration leaves the work to the
            // worker's own thread (`worker.app_drive`).
            self.configs[index].app_drive.then(|| w.cell.clone()),
        )
        .map_err(|e| StartError::Other(e.to_string()))?;
        w.control.push(Control::AddHost(i, Box::new(host)));
        Ok(ctx)
    }

    /// Attaches a client of another process to RNIC `index` (rnicd): makes its rings and
    /// the worker's end (labelled with the owner's `pid` and `comm`), and returns the rings
    /// (to send to the client) and the channel that runs its control calls.
    pub fn attach_host(
        &self,
        index: usize,
        client_limits: ClientLimits,
        pid: u32,
        uid: u32,
        comm: &str,
    ) -> Result<(ClientRings, LocalChannel), StartError> {
        if index >= self.configs.len() {
            return Err(StartError::Other(format!("no RNIC {index}")));
        }
        let who = format!("ferroce-{pid}");
        let (rings, mut host) = host_end(self.limits[index], client_limits, &who)
            .map_err(|e| StartError::Other(format!("cannot make the client's rings: {e}")))?;
        host.pid = pid;
        host.uid = uid;
        host.comm = comm.to_string();
        host.label = format!("pid {pid} ({comm})");
        // rnicd's connection threads relay remote clients' calls: the worker's own thread
        // answers them (the clients run in other processes and cannot run it).
        let (w, i) = self.place(index);
        let chan = LocalChannel::new(w.control.clone(), i, host.token, self.alive.clone(), None);
        w.control.push(Control::AddHost(i, Box::new(host)));
        Ok((rings, chan))
    }

    /// The sizes a client of RNIC `index` needs (its index area's layout).
    pub fn host_limits(&self, index: usize) -> HostLimits {
        self.limits[index]
    }

    /// The limits of RNIC `index`'s device (what per-client limits are a share of).
    pub fn device_limits(&self, index: usize) -> roce::engine::DeviceLimits {
        self.dev_limits[index]
    }

    /// How many RNICs run.
    pub fn len(&self) -> usize {
        self.configs.len()
    }

    /// Whether no RNIC runs (never, once started).
    pub fn is_empty(&self) -> bool {
        self.configs.is_empty()
    }

    /// Whether the worker is still running.
    pub fn alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Sends a request to the worker of the RNIC it names (rnicd's admin requests; RNIC
    /// indices are the runtime's). `Inspect` goes to every worker, its reports gathered in
    /// RNIC order ([`Runtime::inspect`] waits for them itself); `Panic` to the first.
    pub fn control(&self, mut c: Control) {
        if let Some(nic) = c.nic_mut() {
            // An index past the RNICs: dropped, as a worker drops one past its own.
            let Some(shards) = self.placement.get(*nic) else {
                return;
            };
            match c {
                // A client is on one shard: the others know no such token and ignore it.
                Control::Close { token, .. } => {
                    for &(w, i) in shards {
                        self.workers[w]
                            .control
                            .push(Control::Close { nic: i, token });
                    }
                }
                // The capture, and what names no client, are the port's owner's.
                mut c => {
                    let (w, i) = shards[0];
                    if let Some(nic) = c.nic_mut() {
                        *nic = i;
                    }
                    self.workers[w].control.push(c);
                }
            }
            return;
        }
        match c {
            Control::Inspect { qp_counters, reply } => {
                if let [w] = &self.workers[..] {
                    w.control.push(Control::Inspect { qp_counters, reply });
                } else if let Some(r) = self.inspect(qp_counters, std::time::Duration::from_secs(5))
                {
                    let _ = reply.try_send(r);
                }
            }
            // The first worker: a worker's death stops the others (WorkerCell::run).
            c => self.workers[0].control.push(c),
        }
    }

    /// Switches RNIC `index`'s capture on or off (it needs `capture.pcap`); false if there
    /// is no such RNIC or it has no capture file.
    pub fn set_capture(&self, index: usize, on: bool) -> bool {
        match self.configs.get(index) {
            Some(c) if c.pcap.is_some() => {
                self.control(Control::SetCapture(index, on));
                true
            }
            _ => false,
        }
    }

    /// Makes the (first) worker panic (for tests of what applications see when the
    /// dataplane dies; the other workers stop with it).
    #[doc(hidden)]
    pub fn inject_worker_panic(&self) {
        self.control(Control::Panic);
    }

    /// Configuration of RNIC `index`.
    pub fn config(&self, index: usize) -> &RnicConfig {
        &self.configs[index]
    }

    /// MAC of RNIC `index`.
    pub fn mac(&self, index: usize) -> [u8; 6] {
        self.macs[index]
    }

    /// Latest counter snapshot of RNIC `index` (about 1 ms old), summed over its shards.
    pub fn stats(&self, index: usize) -> NicSnapshot {
        let mut sum = NicSnapshot::default();
        for (k, slot) in self.stats[index].iter().enumerate() {
            let s = slot.lock().map(|s| *s).unwrap_or_default();
            match k {
                0 => sum = s,
                _ => sum.merge_shard(&s),
            }
        }
        sum
    }

    /// Stops the worker; RNICs, ports and pools are released.
    pub fn stop(self) -> Vec<NicSnapshot> {
        self.stop_worker()
    }

    /// Stops the worker (every client's QPs go to error and clients get the device-fatal
    /// event first) and returns the final counters; later calls find it stopped.
    pub fn stop_worker(&self) -> Vec<NicSnapshot> {
        self.shutdown();
        (0..self.stats.len()).map(|i| self.stats(i)).collect()
    }

    fn shutdown(&self) {
        stop_workers(&self.stop, &self.workers);
    }
}

/// Sets `stop` and waits for every worker's thread to end.
fn stop_workers(stop: &AtomicBool, workers: &[WorkerSlot]) {
    stop.store(true, Ordering::Release);
    // A sleeping worker sees the flag now, not at the end of its sleep.
    for w in workers {
        w.control.wake();
    }
    for w in workers {
        let t = w.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(t) = t {
            let _ = t.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The raw configuration of one end of a loopback pair (its `port.device` is not used):
/// MAC 02:00:00:99:00:`host`, 10.99.0.`host`/24, path MTU `path_mtu` and a port MTU that
/// fits it.
pub fn loopback_raw_config(host: u8, path_mtu: u32) -> RawConfig {
    let mut r = RawConfig::default();
    r.set("port.device", crate::config::LOOPBACK_DEVICE)
        .expect("key");
    r.set("address.mac", &format!("02:00:00:99:00:{host:02x}"))
        .expect("key");
    r.set("address.ipv4", &format!("10.99.0.{host}/24"))
        .expect("key");
    r.set(
        "port.mtu",
        &path_mtu.saturating_add(200).max(1500).to_string(),
    )
    .expect("key");
    r.set("roce.path_mtu", &path_mtu.to_string()).expect("key");
    r
}

/// A configuration for tests: [`loopback_raw_config`] with a short idle sleep.
pub fn test_config(host: u8, path_mtu: u32) -> RnicConfig {
    let mut r = loopback_raw_config(host, path_mtu);
    r.set("worker.idle_sleep_us", "50").expect("key");
    r.validate().expect("test config is valid")
}
