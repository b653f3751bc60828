//! The worker loop (DPDK l2fwd style): one thread owns its RNICs, reads the TSC once per
//! iteration and turns it into the engine's `now`, polls every RNIC, and backs off when idle
//! (spin, then `pause`, then a short sleep) so several processes can share a 2-core machine.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_queue::SegQueue;

use crate::host::HostEnd;
use crate::neighbor::NeighborCounters;
use crate::nic::{Nic, NicCounters};

/// Idle back-off settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Idle iterations spent spinning.
    pub spin: u32,
    /// Further idle iterations that each yield the CPU (to application threads sharing it).
    pub pause: u32,
    /// Then sleep this long per iteration (microseconds).
    pub sleep_us: u32,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            spin: 256,
            pause: 4096,
            sleep_us: 100,
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
}

/// Requests from other threads to a running worker.
pub enum Control {
    /// Attach an application context to RNIC `index`.
    AddHost(usize, HostEnd),
}

/// Converts TSC cycles to nanoseconds since the worker started.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    tsc0: u64,
    hz: u64,
}

impl Clock {
    /// A clock starting now (EAL must be initialised for the TSC frequency).
    pub fn new() -> Clock {
        Clock {
            tsc0: pmd_bindings::eal::rdtsc(),
            hz: pmd_bindings::eal::tsc_hz().max(1),
        }
    }

    /// Nanoseconds since start.
    #[inline]
    pub fn now(&self) -> u64 {
        let d = pmd_bindings::eal::rdtsc().wrapping_sub(self.tsc0);
        ((d as u128 * 1_000_000_000) / self.hz as u128) as u64
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
    control: Arc<SegQueue<Control>>,
    stats: Vec<Arc<Mutex<NicSnapshot>>>,
    last_stats: u64,
}

impl Worker {
    /// A worker over `nics`.
    pub fn new(
        nics: Vec<Nic>,
        backoff: Backoff,
        control: Arc<SegQueue<Control>>,
        stats: Vec<Arc<Mutex<NicSnapshot>>>,
    ) -> Worker {
        Worker {
            nics,
            clock: Clock::new(),
            backoff,
            idle: 0,
            control,
            stats,
            last_stats: 0,
        }
    }

    /// Current time (ns).
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    /// One iteration over every RNIC; returns the work done.
    pub fn poll_once(&mut self) -> usize {
        let now = self.clock.now();
        let mut work = 0;
        for nic in self.nics.iter_mut() {
            work += nic.poll(now);
        }
        if !self.control.is_empty() {
            while let Some(c) = self.control.pop() {
                match c {
                    Control::AddHost(i, h) => {
                        if let Some(n) = self.nics.get_mut(i) {
                            n.add_host(h);
                        }
                    }
                }
                work += 1;
            }
        }
        // Counters for tools, about every millisecond (off the per-packet path).
        if now.wrapping_sub(self.last_stats) > 1_000_000 {
            self.last_stats = now;
            self.publish_stats();
        }
        work
    }

    /// Publishes counter snapshots now.
    pub fn publish_stats(&mut self) {
        for (nic, slot) in self.nics.iter().zip(&self.stats) {
            let (dev, qps) = nic.dev.counters();
            let snap = NicSnapshot {
                nic: nic.counters,
                neigh: nic.neigh.counters,
                dev,
                qps,
                mbufs_in_use: nic.pool_in_use(),
            };
            if let Ok(mut s) = slot.lock() {
                *s = snap;
            }
        }
    }

    /// Backs off after an iteration that did `work`.
    #[inline]
    pub fn idle(&mut self, work: usize) {
        if work > 0 {
            self.idle = 0;
            return;
        }
        self.idle = self.idle.saturating_add(1);
        let b = self.backoff;
        if self.idle <= b.spin {
            std::hint::spin_loop();
        } else if self.idle <= b.spin + b.pause {
            // Yield rather than pause: on these shared 2-core machines an application thread
            // (e.g. a latency test's ping-pong) may be waiting for this CPU, and a worker that
            // only pauses would hold it for its whole time slice (measured: ~240 us per
            // write_lat round trip instead of ~5 us). Alone on its CPU, a yield returns at once.
            std::thread::yield_now();
        } else if b.sleep_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(b.sleep_us as u64));
        } else {
            std::thread::yield_now();
        }
    }

    /// Runs until `stop` is set.
    pub fn run(&mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let w = self.poll_once();
            self.idle(w);
        }
        self.publish_stats();
        for n in self.nics.iter_mut() {
            n.flush_capture();
        }
    }
}
