//! The worker's steady state allocates nothing: 10 000+ RDMA WRITE packets between two RNICs
//! (ring pair, one worker loop stepped on this thread, the application on this thread too)
//! with a counting global allocator.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dataplane::local::context;
use dataplane::nic::Nic;
use dataplane::runtime::{test_config, Runtime};
use dataplane::worker::{Backoff, Worker};
use dataplane::Verbs;
use ferroce_tests::{connect_pair, side};
use roce::verbs::*;

struct Counting;

static COUNT: AtomicBool = AtomicBool::new(false);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNT.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        if COUNT.load(Ordering::Relaxed) {
            ALLOCS.fetch_add(1, Ordering::Relaxed);
        }
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn steady_state_rdma_write_traffic_allocates_nothing() {
    let (ca, cb) = (test_config(3, 4096), test_config(4, 4096));
    dataplane::runtime::init_eal("ferroce-noalloc", &ca).unwrap();
    let _reg = pmd_bindings::Eal::get().unwrap().register_thread();
    let pool = Runtime::pool(&ca).unwrap();
    let (pa, pb) =
        pmd_bindings::ring_pair("noalloc", &Runtime::port_config(&ca), pool.clone()).unwrap();
    let mut nics = vec![
        Nic::new(ca, pa, pool.clone()).unwrap(),
        Nic::new(cb, pb, pool).unwrap(),
    ];
    let control = dataplane::worker::control_queue();
    let alive = Arc::new(AtomicBool::new(true));
    let limits = nics[0].host_limits();
    let (ctx_a, host_a) = context(control.clone(), 0, limits, alive.clone(), None).unwrap();
    let (ctx_b, host_b) = context(control.clone(), 1, limits, alive, None).unwrap();
    assert!(nics[0].add_host(host_a));
    assert!(nics[1].add_host(host_b));
    let mut w = Worker::new(
        nics,
        Backoff::default(),
        control,
        vec![Default::default(), Default::default()],
    );
    // Control calls wait for the worker: run it on a helper thread while setting up.
    let stop = Arc::new(AtomicBool::new(false));
    let (mut a, b, mut w) = std::thread::scope(|s| {
        let st = stop.clone();
        let h = s.spawn(move || {
            let _r = pmd_bindings::Eal::get().unwrap().register_thread();
            while !st.load(Ordering::Relaxed) {
                w.poll_once();
            }
            w
        });
        let mut a = side(ctx_a, QpType::Rc, 1 << 20, 512);
        let mut b = side(ctx_b, QpType::Rc, 1 << 20, 512);
        connect_pair(&mut a, &mut b, Mtu::M4096, (1, 2), QpType::Rc);
        stop.store(true, Ordering::Relaxed);
        let w = h.join().unwrap();
        (a, b, w)
    });
    let rkey = b.mr.rkey.unwrap();
    let mut wc = [roce::verbs::Completion::default(); 64];
    let mut run = |n_msgs: u64, a: &mut ferroce_tests::Side, w: &mut Worker| {
        let (mut posted, mut done) = (0u64, 0u64);
        while done < n_msgs {
            while posted < n_msgs && posted - done < 256 {
                let wr = SendWr {
                    wr_id: posted,
                    op: WrOp::Write {
                        remote_addr: b.mr.addr,
                        rkey,
                    },
                    sg_list: &[a.mr.sge(0, 16384)],
                    flags: SendFlags::SIGNALED,
                    ud: None,
                };
                if a.ctx.post_send(a.qpn, &wr).is_err() {
                    break;
                }
                posted += 1;
            }
            w.poll_once();
            let n = a.ctx.poll_cq(a.cq, &mut wc).unwrap();
            for c in &wc[..n] {
                assert_eq!(c.status, WcStatus::Success);
            }
            done += n as u64;
        }
    };
    // Warm up (ARP, queue growth), then count over 4 x 2500 messages of 16 KiB = 10 000 packets.
    run(2000, &mut a, &mut w);
    COUNT.store(true, Ordering::SeqCst);
    run(2500, &mut a, &mut w);
    COUNT.store(false, Ordering::SeqCst);
    let n = ALLOCS.load(Ordering::SeqCst);
    let (dev, qps) = w.nics[0].dev.counters();
    assert!(qps.sent_pkts >= 10_000 + 8000, "{qps:?} {dev:?}");
    assert_eq!(
        n, 0,
        "allocations during 10 000 packets of steady-state traffic"
    );
    // Dropping a context releases its objects on the worker: keep the worker running.
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let _r = pmd_bindings::Eal::get().unwrap().register_thread();
            while !stop.load(Ordering::Relaxed) {
                w.poll_once();
            }
        });
        drop(a);
        drop(b);
        stop.store(true, Ordering::Relaxed);
    });
}
