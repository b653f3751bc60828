//! The worker loop (DPDK l2fwd style): one thread owns its RNICs, reads the TSC once per
//! iteration and turns it into the engine's `now`, polls every RNIC, and backs off when idle
//! (spin, then `pause`, then a short sleep) so several processes can share a 2-core machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::SegQueue;
use ferroce_host::abi::proto::STAT_GAUGES;
use ferroce_host::abi::ring::{wait_any, WaitWord};
use pmd_bindings::{Eal, Mempool};

use crate::doorbell::Doorbell;
use crate::host::HostEnd;
use crate::neighbor::NeighborCounters;
use crate::nic::{Nic, NicCounters};
use crate::switch::{SwitchDev, SwitchStats};

/// Idle back-off settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Idle iterations spent spinning.
    pub spin: u32,
    /// Further idle iterations that each yield the CPU (to application threads sharing it).
    pub pause: u32,
    /// Then sleep this long per iteration (microseconds).
    pub sleep_us: u32,
    /// A worker that keeps sleeping doubles its sleep every [`SLEEPS_PER_DOUBLING`] sleeps,
    /// up to this (microseconds), but never past the RNICs' next timed work
    /// ([`idle_sleep_us`]).
    pub sleep_max_us: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            spin: 256,
            pause: 4096,
            sleep_us: 100,
            sleep_max_us: 1000,
        }
    }
}

/// A snapshot of an RNIC's counters, published by the worker for tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NicSnapshot {
    /// Port counters.
    pub nic: NicCounters,
    /// Neighbour counters.
    pub neigh: NeighborCounters,
    /// Device counters of the engine.
    pub dev: roce::engine::DeviceCounters,
    /// Sum of every QP's counters.
    pub qps: roce::engine::QpCounters,
    /// Mbufs in use in the RNIC's pool.
    pub mbufs_in_use: u32,
    /// Objects the engine holds.
    pub objects: roce::engine::ObjectCounts,
    /// Application contexts attached.
    pub hosts: u32,
    /// Bytes of shared memory areas the attached contexts hold mapped on the worker.
    pub area_bytes: u64,
}

impl NicSnapshot {
    /// The snapshot's levels under their `STAT_GAUGES` names, for `rnic-ctl stat`.
    pub fn gauges(&self) -> impl Iterator<Item = (&'static str, u64)> {
        let o = &self.objects;
        let values = [
            u64::from(self.mbufs_in_use),
            u64::from(self.hosts),
            self.area_bytes,
            u64::from(o.pds),
            u64::from(o.mrs),
            u64::from(o.cqs),
            u64::from(o.qps),
            u64::from(o.srqs),
        ];
        STAT_GAUGES.into_iter().zip(values)
    }

    /// Adds another shard's snapshot of the same RNIC (`worker.count`): its port, engine,
    /// QP and object counters and its clients. The neighbour counters and the pool level
    /// stay this one's (the first shard's): the others' tables only learn from copies of
    /// what it received, and the pool is the RNIC's one pool.
    pub fn merge_shard(&mut self, o: &NicSnapshot) {
        self.nic.add(&o.nic);
        self.dev.add(&o.dev);
        self.qps.add(&o.qps);
        let (a, b) = (&mut self.objects, &o.objects);
        a.pds += b.pds;
        a.mrs += b.mrs;
        a.cqs += b.cqs;
        a.qps += b.qps;
        a.srqs += b.srqs;
        self.hosts += o.hosts;
        self.area_bytes += o.area_bytes;
    }
}

roce::counters!(
    /// A worker's load, published for tools with its RNICs' counters (about every
    /// millisecond): every field counts up from the worker's start.
    WorkerLoad {
        /// Iterations of the loop, by the worker's thread or an application thread.
        polls,
        /// Iterations that found work.
        busy_polls,
        /// Iterations an application thread ran (run-to-completion).
        driven_polls,
        /// Time from the start of each iteration that found work to the start of the next
        /// (ns): the worker's busy time, measured with the one clock read an iteration
        /// makes.
        busy_ns,
        /// Times the worker's thread went to sleep for want of work.
        sleeps,
        /// Time since the worker started (ns).
        elapsed_ns,
    }
);

impl WorkerLoad {
    /// The share of the time between `earlier` and `self` the worker was busy (0..=1).
    pub fn busy_since(&self, earlier: &WorkerLoad) -> f64 {
        let t = self.elapsed_ns.saturating_sub(earlier.elapsed_ns);
        if t == 0 {
            return 0.0;
        }
        (self.busy_ns.saturating_sub(earlier.busy_ns) as f64 / t as f64).min(1.0)
    }
}

/// Requests from other threads to a running worker.
pub enum Control {
    /// Attach an application context to RNIC `index`.
    AddHost(usize, Box<HostEnd>),
    /// Switch RNIC `index`'s capture on or off.
    SetCapture(usize, bool),
    /// Execute a client's control call on RNIC `nic` (the client is the host end with
    /// `token`) and send the result back.
    Call {
        /// RNIC index.
        nic: usize,
        /// The calling host end's token.
        token: u64,
        /// The call.
        cmd: ferroce_host::abi::Command,
        /// The memory area or ring the call names (`AddArea`, `CreateCq`).
        area: Option<Arc<ferroce_host::abi::area::Area>>,
        /// Where the result goes (a dropped receiver is ignored).
        reply: std::sync::mpsc::SyncSender<roce::engine::VerbsResult<ferroce_host::abi::ReplyData>>,
    },
    /// Report every RNIC's objects ([`crate::nic::Nic::report`]), with per-QP counters if
    /// asked.
    Inspect {
        /// Per-QP counters too.
        qp_counters: bool,
        /// Where the reports go, one per RNIC.
        reply: std::sync::mpsc::SyncSender<Vec<crate::nic::NicReport>>,
    },
    /// Close and release the client `token` of RNIC `nic` (its process went away).
    Close {
        /// RNIC index.
        nic: usize,
        /// The client's token.
        token: u64,
    },
    /// Panic the worker (tests of what applications see when the dataplane dies).
    #[doc(hidden)]
    Panic,
}

impl Control {
    /// The RNIC index the request names, if it names one (to route it to that RNIC's
    /// worker and renumber it there).
    pub fn nic_mut(&mut self) -> Option<&mut usize> {
        match self {
            Control::AddHost(nic, _)
            | Control::SetCapture(nic, _)
            | Control::Call { nic, .. }
            | Control::Close { nic, .. } => Some(nic),
            Control::Inspect { .. } | Control::Panic => None,
        }
    }
}

/// The queue through which other threads reach a worker, and the word a sleeping worker
/// also waits on, so a request wakes it at once.
#[derive(Default)]
pub struct Controls {
    q: SegQueue<Control>,
    /// Rung by every push while the worker sleeps.
    bell: Doorbell,
}

impl Controls {
    /// Queues `c` for the worker, waking it if it sleeps.
    pub fn push(&self, c: Control) {
        self.q.push(c);
        self.bell.ring();
    }

    /// Ends the worker's sleep, if it sleeps (e.g. so it sees its stop flag).
    pub fn wake(&self) {
        self.bell.wake();
    }

    /// Takes the oldest request.
    pub fn pop(&self) -> Option<Control> {
        self.q.pop()
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.q.is_empty()
    }
}

/// The queue through which other threads reach a worker.
pub type ControlQueue = Arc<Controls>;

/// An empty control queue.
pub fn control_queue() -> ControlQueue {
    Arc::new(Controls::default())
}

/// Converts TSC cycles to nanoseconds since the worker started: one multiply and a shift
/// per read (a 64x64->128 multiply by 10^9 * 2^32 / hz, computed once), no division.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    tsc0: u64,
    /// Nanoseconds per cycle in 32.32 fixed point.
    mult: u64,
}

impl Clock {
    /// A clock starting now (EAL must be initialised for the TSC frequency).
    pub fn new() -> Clock {
        Self::with_hz(pmd_bindings::eal::rdtsc(), pmd_bindings::eal::tsc_hz())
    }

    /// A clock starting now in any process: EAL's TSC frequency when EAL runs here, else
    /// the TSC measured against the monotonic clock over 20 ms (a client of rnicd has no
    /// EAL). For timestamps as perftest takes them (cycles, not a system call each).
    pub fn calibrated() -> Clock {
        let hz = pmd_bindings::eal::tsc_hz();
        if hz > 0 {
            return Self::with_hz(pmd_bindings::eal::rdtsc(), hz);
        }
        let (t, c) = (std::time::Instant::now(), pmd_bindings::eal::rdtsc());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let (ns, cycles) = (
            t.elapsed().as_nanos() as u64,
            pmd_bindings::eal::rdtsc().wrapping_sub(c),
        );
        let hz = (cycles as u128 * 1_000_000_000 / ns.max(1) as u128) as u64;
        Self::with_hz(pmd_bindings::eal::rdtsc(), hz)
    }

    fn with_hz(tsc0: u64, hz: u64) -> Clock {
        let mult = ((1_000_000_000u128 << 32) / hz.max(1) as u128).min(u64::MAX as u128);
        Clock {
            tsc0,
            mult: mult as u64,
        }
    }

    /// Nanoseconds for `cycles` TSC cycles.
    #[inline]
    fn ns(&self, cycles: u64) -> u64 {
        ((cycles as u128 * self.mult as u128) >> 32) as u64
    }

    /// Nanoseconds since start.
    #[inline]
    pub fn now(&self) -> u64 {
        self.ns(pmd_bindings::eal::rdtsc().wrapping_sub(self.tsc0))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// A worker: its RNICs, clock and back-off.
pub struct Worker {
    /// The RNICs this worker owns.
    pub nics: Vec<Nic>,
    clock: Clock,
    backoff: Backoff,
    idle: u32,
    control: ControlQueue,
    stats: Vec<Arc<Mutex<NicSnapshot>>>,
    last_stats: u64,
    /// One span per RNIC (`rnic{dev=ferroce0}`), entered while its engine runs, so the
    /// engine's logs (QP state changes, retransmissions, NAKs) name the device: QPN 0x11
    /// exists on each. Debug level: nothing to pay at the default log level.
    spans: Vec<tracing::Span>,
    /// Emulated switches polled in the same loop, and where their counters are published.
    switches: Vec<(SwitchDev, Arc<Mutex<SwitchStats>>)>,
    /// The load counters, and where they are published.
    load: WorkerLoad,
    load_slot: Option<Arc<Mutex<WorkerLoad>>>,
    /// When the last iteration started, and whether it found work.
    last_poll: u64,
    last_busy: bool,
}

/// Per-lcore mbuf cache of the RNICs' mempools, and how many mbufs a thread warms before it
/// runs a data path ([`Worker::warm_pools`]): one cache's worth.
pub const MEMPOOL_CACHE: u32 = 256;

impl Worker {
    /// Warms every mempool of the worker's RNICs for the calling thread
    /// (`Mempool::warm`: one lcore cache's worth of mbufs written and given back), so the
    /// first frames it builds do not each start with cache misses on a cold mbuf. Called
    /// once per thread, when it registers with the EAL to run the worker (the worker's own
    /// thread, or an application thread driving it).
    pub fn warm_pools(&self) {
        let mut warmed: Vec<&Arc<Mempool>> = Vec::new();
        for n in &self.nics {
            let p = n.pool();
            if !warmed.iter().any(|w| Arc::ptr_eq(w, p)) {
                p.warm(MEMPOOL_CACHE as usize);
                warmed.push(p);
            }
        }
    }

    /// A worker over `nics`.
    pub fn new(
        nics: Vec<Nic>,
        backoff: Backoff,
        control: ControlQueue,
        stats: Vec<Arc<Mutex<NicSnapshot>>>,
    ) -> Worker {
        let spans = (0..nics.len())
            .map(|i| tracing::debug_span!(target: "roce", "rnic", dev = %format!("ferroce{i}")))
            .collect();
        Worker {
            spans,
            nics,
            clock: Clock::new(),
            backoff,
            idle: 0,
            control,
            stats,
            last_stats: 0,
            switches: Vec::new(),
            load: WorkerLoad::default(),
            load_slot: None,
            last_poll: 0,
            last_busy: false,
        }
    }

    /// Publishes the worker's load into `slot` with its counters.
    pub fn publish_load_to(&mut self, slot: Arc<Mutex<WorkerLoad>>) {
        self.load_slot = Some(slot);
    }

    /// Adds an emulated switch to the loop; its counters are published into `slot`.
    pub fn add_switch(&mut self, sw: SwitchDev, slot: Arc<Mutex<SwitchStats>>) {
        self.switches.push((sw, slot));
    }

    /// Current time (ns).
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// One iteration over every RNIC; returns the work done.
    pub fn poll_once(&mut self) -> usize {
        let now = self.clock.now();
        if self.last_busy {
            self.load.busy_ns += now.saturating_sub(self.last_poll);
        }
        self.last_poll = now;
        let mut work = 0;
        for (nic, span) in self.nics.iter_mut().zip(&self.spans) {
            let _in = span.enter();
            work += nic.poll(now);
        }
        for (sw, _) in self.switches.iter_mut() {
            work += sw.poll(now);
        }
        work += self.process_control();
        // Counters for tools, about every millisecond (off the per-packet path).
        if now.wrapping_sub(self.last_stats) > 1_000_000 {
            self.last_stats = now;
            self.publish_stats(STATS_QPS_PER_SNAPSHOT);
        }
        self.last_busy = work > 0;
        self.load.polls += 1;
        self.load.busy_polls += self.last_busy as u64;
        work
    }

    /// Runs the control messages waiting (clients attached, calls, reports); returns how
    /// many.
    fn process_control(&mut self) -> usize {
        let mut work = 0;
        if !self.control.is_empty() {
            while let Some(c) = self.control.pop() {
                match c {
                    Control::AddHost(i, h) => {
                        if let Some(n) = self.nics.get_mut(i) {
                            let _ = n.add_host(*h);
                        }
                    }
                    Control::SetCapture(i, on) => {
                        if let Some(n) = self.nics.get_mut(i) {
                            n.set_capture(on);
                        }
                    }
                    Control::Call {
                        nic,
                        token,
                        cmd,
                        area,
                        reply,
                    } => {
                        let _in = self.spans.get(nic).map(|s| s.enter());
                        match self.nics.get_mut(nic) {
                            Some(n) => n.dispatch(token, cmd, area, reply),
                            None => {
                                let _ = reply
                                    .try_send(Err(roce::engine::VerbsError::NotFound("device")));
                            }
                        }
                    }
                    Control::Inspect { qp_counters, reply } => {
                        let r = self.nics.iter().map(|n| n.report(qp_counters)).collect();
                        let _ = reply.try_send(r);
                    }
                    Control::Close { nic, token } => {
                        if let Some(n) = self.nics.get_mut(nic) {
                            n.close_host(token);
                        }
                    }
                    Control::Panic => panic!("worker panic requested (Control::Panic)"),
                }
                work += 1;
            }
        }
        work
    }

    /// Names the RNICs' log spans after their indices in the runtime (`ferroce{i}`): a
    /// worker of several owns only some of them.
    pub fn name_devices(&mut self, indices: &[usize]) {
        self.spans = indices
            .iter()
            .map(|i| tracing::debug_span!(target: "roce", "rnic", dev = %format!("ferroce{i}")))
            .collect();
    }

    /// Publishes counter snapshots now, the QP totals brought up to date for at most
    /// `qps` QPs per RNIC (see `Device::counters_incremental`).
    pub fn publish_stats(&mut self, qps: usize) {
        for (nic, slot) in self.nics.iter_mut().zip(&self.stats) {
            let (dev, qps) = nic.dev.counters_incremental(qps);
            let snap = NicSnapshot {
                nic: nic.counters(),
                neigh: nic.neigh.counters,
                dev,
                qps,
                mbufs_in_use: nic.pool_in_use(),
                objects: nic.object_counts(),
                hosts: nic.host_count() as u32,
                area_bytes: nic.host_area_bytes(),
            };
            if let Ok(mut s) = slot.lock() {
                *s = snap;
            }
        }
        for (sw, slot) in &self.switches {
            if let Ok(mut s) = slot.lock() {
                *s = sw.snapshot();
            }
        }
        if let Some(slot) = &self.load_slot {
            if let Ok(mut l) = slot.lock() {
                // The iteration's own clock reading (publishing reads no clock of its own).
                *l = WorkerLoad {
                    elapsed_ns: self.last_poll,
                    ..self.load
                };
            }
        }
    }

    /// Backs off after an iteration that did `work`.
    #[inline]
    pub fn idle(&mut self, work: usize) {
        let mut waits = Vec::new();
        let action = self.idle_action(work, &mut waits);
        action.run(&waits);
        self.control.bell.disarm();
    }

    /// What to do after an iteration that did `work` (the caller does it, e.g. after
    /// letting go of a lock).
    /// A sleep is a wait on `waits` (filled here): every client's post ring, armed, and the
    /// control queue's word, so a post or a request ends it at once.
    #[inline]
    fn idle_action(&mut self, work: usize, waits: &mut Vec<WaitWord>) -> Idle {
        if work > 0 {
            self.idle = 0;
            return Idle::Spin;
        }
        self.idle = self.idle.saturating_add(1);
        let b = self.backoff;
        if self.idle <= b.spin {
            Idle::Spin
        } else if self.idle <= b.spin + b.pause {
            // Yield rather than pause: on these shared 2-core machines an application thread
            // (e.g. a latency test's ping-pong) may be waiting for this CPU, and a worker that
            // only pauses would hold it for its whole time slice (measured: ~240 us per
            // write_lat round trip instead of ~5 us). Alone on its CPU, a yield returns at once.
            Idle::Yield
        } else if b.sleep_us > 0 {
            waits.clear();
            let c = &self.control;
            // Armed before the look below (`Doorbell`; each ring's arm pairs likewise with
            // the clients' `notify`): a request or post that does not find us asleep is seen
            // by the checks below.
            waits.push(c.bell.arm());
            let mut busy = !c.is_empty();
            for n in &self.nics {
                busy |= n.prepare_sleep(waits);
            }
            if busy {
                c.bell.disarm();
                return Idle::Spin;
            }
            self.load.sleeps += 1;
            // Longer sleeps for a worker idle a while, never past its RNICs' next timed work
            // (an emulated switch shapes in real time: it keeps the base sleep).
            let now = self.last_poll;
            let mut until: Option<u64> = (!self.switches.is_empty()).then_some(0);
            for n in self.nics.iter_mut() {
                if let Some(t) = n.sleep_deadline(now) {
                    let left = t.saturating_sub(now);
                    until = Some(until.map_or(left, |u| u.min(left)));
                }
            }
            // The idle iterations past spinning and yielding are the sleeps in a row.
            let sleeps = self
                .idle
                .saturating_sub(b.spin.saturating_add(b.pause).saturating_add(1));
            Idle::Sleep(idle_sleep_us(&b, sleeps, until))
        } else {
            Idle::Yield
        }
    }

    /// Runs until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let w = self.poll_once();
            self.idle(w);
        }
        self.finish();
    }

    /// The end of a run: every client's pending posts and a final flush (`shutdown_hosts`),
    /// the last counters, the capture written out.
    pub fn finish(&mut self) {
        for n in self.nics.iter_mut() {
            n.shutdown_hosts();
        }
        // Exact: every QP's counts in the last snapshot.
        self.publish_stats(usize::MAX);
        for n in self.nics.iter_mut() {
            n.flush_capture();
        }
    }
}

/// Sleeps in a row after which a worker's idle sleep doubles ([`idle_sleep_us`]).
pub const SLEEPS_PER_DOUBLING: u32 = 64;

/// The idle sleep (us) of a worker that has slept `sleeps` times in a row with nothing to do:
/// `b.sleep_us` doubled every [`SLEEPS_PER_DOUBLING`] sleeps, at most `b.sleep_max_us`, and no
/// longer than `until_ns` (the time to its RNICs' next timed work, `None`: nothing timed),
/// though never below `b.sleep_us`. An idle worker wakes on posts, control calls and frames
/// between its shards (futex words), but a port's queue has no such wake-up: it is polled
/// when the sleep ends. At the base 100 us that is 10,000 wake-ups a second; an idle rnicd
/// spent a fifth of a core on them (`top`: 20-25%, two RNICs), and about a tenth of that at
/// 1 ms. A frame arriving after a long quiet spell waits up to the longer sleep; under
/// traffic nothing changes (the worker sleeps only after `spin + pause` idle iterations and
/// grows the sleep after [`SLEEPS_PER_DOUBLING`] more).
pub fn idle_sleep_us(b: &Backoff, sleeps: u32, until_ns: Option<u64>) -> u32 {
    let base = b.sleep_us as u64;
    if b.sleep_max_us as u64 <= base {
        return b.sleep_us;
    }
    let doublings = (sleeps / SLEEPS_PER_DOUBLING).min(31);
    let mut us = (base << doublings).min(b.sleep_max_us as u64);
    if let Some(ns) = until_ns {
        us = us.min((ns / 1000).max(base));
    }
    us as u32
}

/// How a worker waits after an idle iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Idle {
    Spin,
    Yield,
    Sleep(u32),
}

impl Idle {
    /// Waits as said; a sleep ends early when one of `waits` changes.
    fn run(self, waits: &[WaitWord]) {
        match self {
            Idle::Spin => std::hint::spin_loop(),
            Idle::Yield => std::thread::yield_now(),
            Idle::Sleep(us) => wait_any(waits, std::time::Duration::from_micros(us as u64)),
        }
    }
}

/// How long after an application thread last ran the worker its own thread keeps out of
/// the way (it then only sleeps): an application that polls its CQ in a loop runs the RNIC
/// itself and needs no second busy thread on the machine's cores.
const APP_DRIVE_WINDOW_NS: u64 = 200_000;

/// QPs whose counters one periodic snapshot (about every millisecond) takes into the port
/// totals. A QP's counters are about ten cache lines that the worker has usually let go: at
/// 1024 per snapshot the reads alone took most of the worker's time with 16K QPs busy
/// (`E2E_ONLY=qps cargo bench -p ferroce-benches --bench e2e`). At 64, an RNIC with up to 64
/// QPs has exact totals every snapshot, and with the default 16K each QP's counts reach the
/// totals within a quarter of a second; the last snapshot of a run is exact.
const STATS_QPS_PER_SNAPSHOT: usize = 64;

/// How long the worker's thread sleeps while an application thread drives.
const APP_DRIVE_SLEEP_US: u64 = 100;

thread_local! {
    /// This thread's EAL registration (an lcore id, hence mempool caches), made the first
    /// time it runs a worker; `None` inside if registration failed (it then runs without).
    static REGISTERED: std::cell::OnceCell<Option<pmd_bindings::eal::ThreadRegistration>> =
        const { std::cell::OnceCell::new() };
}

/// Registers the calling thread with the EAL the first time it runs a worker (the worker's
/// own thread, or an application thread driving it) and then warms `w`'s mempools for it
/// ([`Worker::warm_pools`]); later calls on the thread do nothing.
fn register(w: &Worker) {
    REGISTERED.with(|r| {
        r.get_or_init(|| {
            let reg = Eal::get().and_then(|e| e.register_thread().ok());
            if reg.is_some() {
                w.warm_pools();
            }
            reg
        });
    });
}

/// A worker shared by its own thread and the in-process application threads that run it
/// while they wait for it (run-to-completion, as DPDK's model and eRPC have it): a thread
/// that polls an empty CQ or waits for a control call's reply takes the worker if no one
/// else is running it and does one iteration itself, instead of yielding its CPU to the
/// worker's thread and waiting for a context switch. The worker's thread keeps the RNICs
/// going whenever no application thread has run them for [`APP_DRIVE_WINDOW_NS`] (an
/// application blocked in `wait_cq`, one that only posts, rnicd's remote clients), and
/// otherwise sleeps. Whoever runs the worker holds its lock for one iteration; nothing on
/// the per-packet path takes another lock.
pub struct WorkerCell {
    worker: Mutex<Worker>,
    /// When an application thread last ran the worker (the worker's clock), 0: never.
    driven_at: std::sync::atomic::AtomicU64,
    clock: Clock,
    stop: Arc<AtomicBool>,
    alive: Arc<AtomicBool>,
}

impl WorkerCell {
    /// A cell for `worker`, stopped by `stop`; `alive` is cleared if a thread running the
    /// worker panics.
    pub fn new(worker: Worker, stop: Arc<AtomicBool>, alive: Arc<AtomicBool>) -> WorkerCell {
        let clock = worker.clock;
        WorkerCell {
            worker: Mutex::new(worker),
            driven_at: std::sync::atomic::AtomicU64::new(0),
            clock,
            stop,
            alive,
        }
    }

    /// Runs one iteration of the worker in the calling (application) thread if nobody else
    /// is running it; returns whether it did any work. A panic in the engine is caught here
    /// and turns the device fatal for everyone, as the worker's thread dying does.
    pub fn drive(&self) -> bool {
        if self.stop.load(Ordering::Relaxed) || !self.alive.load(Ordering::Acquire) {
            return false;
        }
        let Ok(mut w) = self.worker.try_lock() else {
            return false;
        };
        register(&w);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            w.load.driven_polls += 1;
            w.poll_once()
        }));
        drop(w);
        match r {
            Ok(work) => {
                self.driven_at
                    .store(self.clock.now().max(1), Ordering::Relaxed);
                work > 0
            }
            Err(_) => {
                self.alive.store(false, Ordering::Release);
                false
            }
        }
    }

    /// The worker's own thread: runs the worker until `stop`, keeping out of the way while
    /// application threads drive it, then finishes it (`Worker::finish`). Returns at once if
    /// a panic in another thread poisoned the worker.
    pub fn run(&self) {
        let mut waits = Vec::new();
        let control = match self.worker.lock() {
            Ok(w) => {
                register(&w);
                w.control.clone()
            }
            Err(_) => return,
        };
        // A worker that died (its panic cleared `alive`) takes the others down with it:
        // their clients are told the device is gone, as the dead one's are.
        while !self.stop.load(Ordering::Relaxed) && self.alive.load(Ordering::Acquire) {
            let driven = self.driven_at.load(Ordering::Relaxed);
            if driven != 0 && self.clock.now().saturating_sub(driven) < APP_DRIVE_WINDOW_NS {
                std::thread::sleep(std::time::Duration::from_micros(APP_DRIVE_SLEEP_US));
                continue;
            }
            let action = {
                let Ok(mut w) = self.worker.lock() else {
                    return;
                };
                let work = w.poll_once();
                w.idle_action(work, &mut waits)
            };
            // Outside the lock: application threads may drive the worker meanwhile.
            action.run(&waits);
            control.bell.disarm();
            waits.clear();
        }
        if let Ok(mut w) = self.worker.lock() {
            w.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{idle_sleep_us, Backoff, Clock, SLEEPS_PER_DOUBLING};

    #[test]
    fn an_idle_workers_sleep_grows_to_its_cap_but_not_past_the_next_timer() {
        let b = Backoff::default(); // 100 us, growing to 1000 us
        let k = SLEEPS_PER_DOUBLING;
        // The base sleep for the first sleeps in a row, then doubling, then the cap.
        assert_eq!(idle_sleep_us(&b, 0, None), 100);
        assert_eq!(idle_sleep_us(&b, k - 1, None), 100);
        assert_eq!(idle_sleep_us(&b, k, None), 200);
        assert_eq!(idle_sleep_us(&b, 2 * k, None), 400);
        assert_eq!(idle_sleep_us(&b, 3 * k, None), 800);
        assert_eq!(idle_sleep_us(&b, 4 * k, None), 1000);
        assert_eq!(idle_sleep_us(&b, u32::MAX, None), 1000);
        // A timer 300 us ahead: the grown sleep stops there; one nearer than the base sleep
        // (or due) leaves the base sleep, as before the growth.
        assert_eq!(idle_sleep_us(&b, u32::MAX, Some(300_000)), 300);
        assert_eq!(idle_sleep_us(&b, u32::MAX, Some(40_000)), 100);
        assert_eq!(idle_sleep_us(&b, u32::MAX, Some(0)), 100);
        assert_eq!(idle_sleep_us(&b, 0, Some(5_000_000)), 100);
        // A cap at or below the base sleep turns growth off; a base above the cap stays.
        let flat = Backoff {
            sleep_max_us: 100,
            ..b
        };
        assert_eq!(idle_sleep_us(&flat, u32::MAX, None), 100);
        let long = Backoff {
            sleep_us: 3_000_000,
            ..b
        };
        assert_eq!(idle_sleep_us(&long, u32::MAX, Some(1000)), 3_000_000);
    }

    #[test]
    fn clock_converts_cycles_like_a_division() {
        for hz in [1_000_000_000u64, 2_399_999_000, 3_000_000_000, 25_000_000] {
            let c = Clock::with_hz(0, hz);
            for cycles in [0u64, 1, hz / 3, hz, 3600 * hz, 86_400 * 30 * hz] {
                let exact = (cycles as u128 * 1_000_000_000 / hz as u128) as u64;
                let got = c.ns(cycles);
                // Within 1 ns per second of elapsed time (the 32.32 multiplier's rounding).
                let tol = 1 + exact / 1_000_000_000;
                assert!(
                    got.abs_diff(exact) <= tol,
                    "hz {hz} cycles {cycles}: {got} vs {exact}"
                );
            }
        }
    }
}
