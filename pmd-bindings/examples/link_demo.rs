//! Frames through two DPDK ports joined back to back: port a sends bursts of frames, port b
//! receives, verifies and echoes them, port a receives the echoes and verifies them again.
//! Prints the frame rate per size and the ports' own counters.
//!
//! `cargo run --release -p pmd-bindings --example link_demo`

use std::time::Instant;

use pmd_bindings::mempool::ROCE_4K_DATA_ROOM;
use pmd_bindings::{ring_pair, EalBuilder, Mbuf, Mempool, PortConfig};

const BURST: usize = 32;

fn fill(buf: &mut [u8], seq: u32) {
    buf[..6].copy_from_slice(&[0x02, 0, 0, 0x99, 0, 0x04]);
    buf[6..12].copy_from_slice(&[0x02, 0, 0, 0x99, 0, 0x03]);
    buf[12..14].copy_from_slice(&[0x88, 0xb5]);
    buf[14..18].copy_from_slice(&seq.to_be_bytes());
    for (i, b) in buf.iter_mut().enumerate().skip(18) {
        *b = (i as u32).wrapping_add(seq) as u8;
    }
}

fn check(buf: &[u8], len: usize) -> bool {
    if buf.len() != len || len < 18 {
        return false;
    }
    let seq = u32::from_be_bytes(buf[14..18].try_into().unwrap());
    buf.iter()
        .enumerate()
        .skip(18)
        .all(|(i, &b)| b == (i as u32).wrapping_add(seq) as u8)
}

fn main() {
    let eal = EalBuilder::software("link_demo").init().expect("EAL init");
    println!("{} - {:?}", pmd_bindings::dpdk_version(), eal.argv());
    let pool = Mempool::new("demo", 8192, 256, ROCE_4K_DATA_ROOM).expect("mempool");
    let cfg = PortConfig {
        mtu: Some(4200),
        ..PortConfig::default()
    };
    let (a, b) = ring_pair("demo", &cfg, pool.clone()).expect("ring pair");
    let (mut atx, mut arx) = (a.tx_queue(0).unwrap(), a.rx_queue(0).unwrap());
    let (mut btx, mut brx) = (b.tx_queue(0).unwrap(), b.rx_queue(0).unwrap());
    println!(
        "{:>8} {:>10} {:>12} {:>12} {:>10}",
        "#bytes", "#frames", "Mpps(a->b->a)", "Gb/s(a->b)", "verified"
    );
    for &size in &[64usize, 1024, 1500, 4200] {
        let total: u32 = if size > 2000 { 200_000 } else { 1_000_000 };
        let (mut sent, mut echoed, mut ok) = (0u32, 0u32, 0u32);
        let mut burst: Vec<Mbuf> = Vec::with_capacity(BURST);
        let mut rx: Vec<Mbuf> = Vec::with_capacity(BURST);
        let start = Instant::now();
        while echoed < total {
            if sent < total && burst.is_empty() {
                let n = BURST.min((total - sent) as usize);
                if pool.alloc_bulk(&mut burst, n).is_ok() {
                    for m in burst.iter_mut() {
                        fill(m.append(size).expect("room"), sent);
                        sent += 1;
                    }
                }
            }
            atx.tx_burst(&mut burst);
            brx.rx_burst(&mut rx);
            ok += rx.iter().filter(|m| check(m.data(), size)).count() as u32;
            btx.tx_burst(&mut rx);
            rx.clear(); // what the echo could not send is dropped (freed)
            arx.rx_burst(&mut rx);
            echoed += rx.len() as u32;
            ok += rx.iter().filter(|m| check(m.data(), size)).count() as u32;
            rx.clear();
        }
        let secs = start.elapsed().as_secs_f64();
        println!(
            "{:>8} {:>10} {:>12.2} {:>12.2} {:>10}",
            size,
            total,
            total as f64 / secs / 1e6,
            total as f64 * size as f64 * 8.0 / secs / 1e9,
            if ok == 2 * total { "yes" } else { "NO" }
        );
        assert_eq!(ok, 2 * total, "corrupted or lost frames");
    }
    let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
    println!("port a: {sa:?}\nport b: {sb:?}");
    drop((atx, arx, btx, brx, a, b));
    println!("mbufs in use after close: {}", pool.in_use());
}
