//! Engine costs per packet, measured on one core with no I/O:
//!
//! * `requester/write_4k`: one 4 KiB RDMA WRITE per packet (path MTU 4096): post_send,
//!   poll_transmit, and one coalesced ACK handled per 32 packets.
//! * `responder/write_4k` and `responder/write_64`: `handle_frame` (parse, ICRC check, PSN and
//!   key checks, placement into memory) of WRITE_ONLY packets, plus polling the ACK each
//!   AckReq asks for. Frames are built outside the timed part.
//! * `memcpy_4k`: copying the same 4 KiB, the baseline for the data movement share.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roce::engine::{Device, DeviceConfig, Transmit};
use roce::memory::Memory;
use roce::sim::{connect, ConnectOpts, LinkConfig, Pair};
use roce::types::{Msn, Psn};
use roce::verbs::{Mtu, WrOp};
use roce::wire::aeth::AethRepr;
use roce::wire::bth::BthRepr;
use roce::wire::frame::TransportRepr;
use roce::wire::opcode::Opcode;
use roce::wire::reth::RethRepr;

fn pair() -> (Pair, roce::sim::Endpoint, roce::sim::Endpoint) {
    let cfg = DeviceConfig {
        port_mtu: Mtu::M4096,
        limits: roce::engine::DeviceLimits {
            max_qp_wr: 16384,
            ..Default::default()
        },
        ..Default::default()
    };
    let mut p = Pair::new(cfg.clone(), cfg, LinkConfig::default(), 1);
    let o = ConnectOpts {
        mtu: Mtu::M4096,
        mem_len: 1 << 20,
        depth: 16384,
        timeout: 0,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    (p, a, b)
}

/// Times `iters` operations in batches of at most `max`: `run(batch, tx)` prepares a batch
/// untimed, runs it, and returns how long the run took.
fn batched(iters: u64, max: u64, mut run: impl FnMut(u64, &mut Transmit) -> Duration) -> Duration {
    let mut tx = Transmit::default();
    let mut total = Duration::ZERO;
    let mut done = 0u64;
    while done < iters {
        let batch = (iters - done).min(max);
        total += run(batch, &mut tx);
        done += batch;
    }
    total
}

fn requester(c: &mut Criterion) {
    let (mut p, a, b) = pair();
    let mut g = c.benchmark_group("requester");
    g.throughput(Throughput::Elements(1));
    g.bench_function("write_4k", |bch| {
        bch.iter_custom(|iters| {
            batched(iters, 32, |batch, tx| {
                // The ACK for this batch, built before timing.
                let last =
                    p.a.dev
                        .query_qp(a.qpn)
                        .unwrap()
                        .attr
                        .sq_psn
                        .unwrap()
                        .add(batch as u32 - 1);
                let mut t = TransportRepr::new(BthRepr::new(Opcode::RC_ACK, a.qpn, last));
                t.ext.aeth = Some(AethRepr::ack(31, Msn::new(0)));
                let ack = p.craft(1, t, &[]);
                let start = Instant::now();
                for i in 0..batch {
                    p.a.dev
                        .post_send(
                            a.qpn,
                            &roce::verbs::SendWr {
                                wr_id: i,
                                op: WrOp::Write {
                                    remote_addr: b.addr,
                                    rkey: b.rkey,
                                },
                                sg_list: &[a.sge(0, 4096)],
                                flags: roce::verbs::SendFlags(0),
                                ud: None,
                            },
                        )
                        .unwrap();
                    assert!(p.a.dev.poll_transmit(0, tx));
                    black_box(&*tx);
                }
                p.a.dev.handle_frame(0, &ack);
                start.elapsed()
            })
        })
    });
    g.finish();
}

fn responder_case(c: &mut Criterion, name: &str, len: usize) {
    let (mut p, a, b) = pair();
    let payload = vec![0x5au8; len];
    let mut next_psn: Psn = a.sq_psn;
    let mut g = c.benchmark_group("responder");
    g.throughput(Throughput::Elements(1));
    g.bench_function(name, |bch| {
        bch.iter_custom(|iters| {
            batched(iters, 256, |batch, tx| {
                let frames: Vec<Vec<u8>> = (0..batch)
                    .map(|i| {
                        let mut t = TransportRepr::new(BthRepr::new(
                            Opcode(0x0a),
                            b.qpn,
                            next_psn.add(i as u32),
                        ));
                        t.bth.ack_req = i % 32 == 31 || i == batch - 1;
                        t.ext.reth = Some(RethRepr {
                            va: b.addr,
                            rkey: b.rkey,
                            len: len as u32,
                        });
                        p.craft(0, t, &payload)
                    })
                    .collect();
                let dev: &mut Device = &mut p.b.dev;
                let start = Instant::now();
                for f in &frames {
                    dev.handle_frame(0, f);
                    while dev.poll_transmit(0, tx) {
                        black_box(&*tx);
                    }
                }
                let elapsed = start.elapsed();
                next_psn = next_psn.add(batch as u32);
                elapsed
            })
        })
    });
    g.finish();
    let _ = b.mem.len();
}

fn responder(c: &mut Criterion) {
    responder_case(c, "write_4k", 4096);
    responder_case(c, "write_64", 64);
    let src = vec![1u8; 4096];
    let mut dst = vec![0u8; 4096];
    c.bench_function("memcpy_4k", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
}

criterion_group!(engine, requester, responder);
criterion_main!(engine);
