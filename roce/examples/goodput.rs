//! Goodput of RC WRITEs under random loss in the simulator, relative to a lossless link: the
//! baseline a later selective-repeat design must beat. Deterministic (simulated time).
//!
//! `cargo run --release -p roce --example goodput`

use roce::engine::DeviceConfig;
use roce::sim::{connect, ConnectOpts, LinkConfig, Pair};
use roce::verbs::{Mtu, WcStatus, WrOp};

fn run(loss: f64, seed: u64) -> (f64, u64) {
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    };
    let mut link = LinkConfig::lossless(25, 2_000);
    link.loss = loss;
    let mut p = Pair::new(cfg.clone(), cfg, link, seed);
    let o = ConnectOpts {
        mtu: Mtu::M4096,
        mem_len: 1 << 20,
        timeout: 8, // ~1 ms local ACK timeout
        retry_cnt: 7,
        depth: 64,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    let msg = 65536u32;
    let total = 3000u64;
    let (mut posted, mut done) = (0u64, 0u64);
    let deadline = 60_000_000_000;
    p.run(deadline, |p| {
        while posted < total && posted - done < 32 {
            p.post(
                0,
                &a,
                posted,
                WrOp::Write {
                    remote_addr: b.addr,
                    rkey: b.rkey,
                },
                &[a.sge(0, msg)],
            );
            posted += 1;
        }
        for c in p.cqes(0, &a) {
            assert_eq!(c.status, WcStatus::Success, "loss {loss}");
            done += 1;
        }
        done == total
    });
    let secs = p.now as f64 / 1e9;
    let gbps = done as f64 * msg as f64 * 8.0 / secs / 1e9;
    (gbps, p.a.dev.qp_counters(a.qpn).unwrap().retransmitted_pkts)
}

fn main() {
    println!(
        "RC WRITE 64 KiB, MTU 4096, 25 Gb/s link, 2 us delay, ACK timeout ~1 ms, 3000 messages"
    );
    println!(
        "{:>8} {:>12} {:>10} {:>14}",
        "loss", "goodput Gb/s", "relative", "retransmitted"
    );
    let (base, _) = run(0.0, 1);
    for loss in [0.0, 0.001, 0.01, 0.05] {
        let (g, r) = run(loss, 1);
        println!(
            "{:>7.1}% {:>12.2} {:>9.1}% {:>14}",
            loss * 100.0,
            g,
            100.0 * g / base,
            r
        );
    }
}
