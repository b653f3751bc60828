//! What the safe wrappers cost over raw DPDK calls, measured side by side in one run:
//!
//! * `tx_net_null/*`: allocate a burst of 32 mbufs, write a 64-byte frame into each, transmit
//!   them to `net_null` (which frees them): the single-lcore tx rate (dpdk.md: ~33 Mpps for
//!   whole 64 B frames with `--no-huge`).
//! * `ring_roundtrip/*`: a burst of 32 frames a -> b over a ring pair and back b -> a.
//!
//! Each group has a `raw` variant written directly against `pmd_bindings::sys` (the shim) and
//! a `wrapper` variant using `Mempool`/`Mbuf`/`TxQueue`/`RxQueue`; criterion reports both in
//! elements (packets) per second.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pmd_bindings::{ring_pair, sys, EalBuilder, Mbuf, Mempool, Port, PortConfig};

const BURST: usize = 32;
const FRAME: [u8; 64] = {
    let mut f = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        f[i] = i as u8;
        i += 1;
    }
    f
};

fn setup() -> Arc<Mempool> {
    EalBuilder::software("pmd-bench").init().expect("EAL");
    Mempool::new("bench", 8192, 256, pmd_bindings::mempool::DEFAULT_DATA_ROOM).expect("pool")
}

fn tx_null(c: &mut Criterion, pool: &Arc<Mempool>) {
    let port = Port::probe("net_null_bench0", &PortConfig::default(), pool.clone()).unwrap();
    let mut txq = port.tx_queue(0).unwrap();
    let mut g = c.benchmark_group("tx_net_null");
    g.throughput(Throughput::Elements(BURST as u64));
    let pid = port.id();
    g.bench_function("raw", |b| {
        let mut ptrs = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        b.iter(|| unsafe {
            if sys::ferroce_pktmbuf_alloc_bulk(pool.as_ptr(), ptrs.as_mut_ptr(), BURST as u32) != 0
            {
                return;
            }
            for &m in &ptrs {
                let d = sys::ferroce_pktmbuf_append(m, 64) as *mut u8;
                std::ptr::copy_nonoverlapping(FRAME.as_ptr(), d, 64);
            }
            let n = sys::ferroce_tx_burst(pid, 0, ptrs.as_mut_ptr(), BURST as u16) as usize;
            for &m in &ptrs[n..] {
                sys::ferroce_pktmbuf_free(m);
            }
        })
    });
    let mut burst: Vec<Mbuf> = Vec::with_capacity(BURST);
    g.bench_function("wrapper", |b| {
        b.iter(|| {
            if pool.alloc_bulk(&mut burst, BURST).is_err() {
                return;
            }
            for m in burst.iter_mut() {
                m.append(64).unwrap().copy_from_slice(&FRAME);
            }
            txq.tx_burst(&mut burst);
            burst.clear();
        })
    });
    g.finish();
}

fn ring_roundtrip(c: &mut Criterion, pool: &Arc<Mempool>) {
    let (a, b) = ring_pair("bench", &PortConfig::default(), pool.clone()).unwrap();
    let mut g = c.benchmark_group("ring_roundtrip");
    g.throughput(Throughput::Elements(BURST as u64));
    let (pa, pb) = (a.id(), b.id());
    g.bench_function("raw", |bch| {
        let mut ptrs = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        let mut back = [std::ptr::null_mut::<sys::rte_mbuf>(); BURST];
        bch.iter(|| unsafe {
            if sys::ferroce_pktmbuf_alloc_bulk(pool.as_ptr(), ptrs.as_mut_ptr(), BURST as u32) != 0
            {
                return;
            }
            for &m in &ptrs {
                let d = sys::ferroce_pktmbuf_append(m, 64) as *mut u8;
                std::ptr::copy_nonoverlapping(FRAME.as_ptr(), d, 64);
            }
            let n = sys::ferroce_tx_burst(pa, 0, ptrs.as_mut_ptr(), BURST as u16) as usize;
            let r = sys::ferroce_rx_burst(pb, 0, back.as_mut_ptr(), BURST as u16) as usize;
            let e = sys::ferroce_tx_burst(pb, 0, back.as_mut_ptr(), r as u16) as usize;
            let r2 = sys::ferroce_rx_burst(pa, 0, ptrs.as_mut_ptr(), BURST as u16) as usize;
            black_box((n, e));
            for &m in &back[e..r] {
                sys::ferroce_pktmbuf_free(m);
            }
            sys::ferroce_pktmbuf_free_bulk(ptrs.as_mut_ptr(), r2 as u32);
        })
    });
    let mut atx = a.tx_queue(0).unwrap();
    let mut arx = a.rx_queue(0).unwrap();
    let mut btx = b.tx_queue(0).unwrap();
    let mut brx = b.rx_queue(0).unwrap();
    let mut burst: Vec<Mbuf> = Vec::with_capacity(BURST);
    let mut got: Vec<Mbuf> = Vec::with_capacity(BURST);
    g.bench_function("wrapper", |bch| {
        bch.iter(|| {
            if pool.alloc_bulk(&mut burst, BURST).is_err() {
                return;
            }
            for m in burst.iter_mut() {
                m.append(64).unwrap().copy_from_slice(&FRAME);
            }
            atx.tx_burst(&mut burst);
            burst.clear();
            brx.rx_burst(&mut got);
            btx.tx_burst(&mut got);
            got.clear();
            arx.rx_burst(&mut got);
            got.clear();
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let pool = setup();
    tx_null(c, &pool);
    ring_roundtrip(c, &pool);
}

criterion_group!(wrappers, benches);
criterion_main!(wrappers);
