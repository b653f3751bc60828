//! Wire-layer costs.
//!
//! * `icrc/<impl>/<size>`: CRC-32 throughput for 64, 256, 1024 and 4096 bytes with
//!   `Icrc::update` (crc32fast below `icrc::SUM_MIN` bytes, its own 512-bit fold from there
//!   where the CPU has it), crc32fast alone and crc-fast, beside `memcpy/<size>` of the same
//!   bytes as the baseline measured in the same run; `copy_then_crc` and `copy_and_crc`: a payload copied
//!   and summed in two passes and in one (`Icrc::copy_from`).
//! * `frame/parse_verify_{4k,64}_write`, `frame/parse_verify_in_place_{4k,64}_write` and
//!   `frame/build_{4k,64}_write`: a 4 KiB and a 64 B RDMA WRITE ONLY frame parsed with ICRC
//!   verification (from a borrowed frame, and in place in the caller's own), and built
//!   (headers + payload copy + ICRC).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use roce::types::{Psn, Qpn, Rkey};
use roce::wire::bth::BthRepr;
use roce::wire::ethernet::EthernetRepr;
use roce::wire::frame::{self, FrameRepr, IpRepr, TransportRepr};
use roce::wire::icrc::Icrc;
use roce::wire::ipv4::{Ecn, Ipv4Repr};
use roce::wire::opcode::Opcode;
use roce::wire::reth::RethRepr;

fn crc(c: &mut Criterion) {
    let mut g = c.benchmark_group("icrc");
    for size in [64usize, 256, 1024, 4096] {
        let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
        let mut dst = vec![0u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("icrc_update", size), &data, |b, d| {
            b.iter(|| {
                let mut h = Icrc::new();
                h.update(black_box(d));
                h.finish()
            })
        });
        g.bench_with_input(BenchmarkId::new("crc32fast", size), &data, |b, d| {
            b.iter(|| {
                let mut h = crc32fast::Hasher::new();
                h.update(black_box(d));
                h.finalize()
            })
        });
        g.bench_with_input(BenchmarkId::new("crc-fast", size), &data, |b, d| {
            b.iter(|| {
                let mut h = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32IsoHdlc);
                h.update(black_box(d));
                h.finalize()
            })
        });
        g.bench_with_input(BenchmarkId::new("memcpy", size), &data, |b, d| {
            b.iter(|| {
                dst.copy_from_slice(black_box(d));
                black_box(&dst);
            })
        });
        // A transmitted payload: copied into the frame and summed, in two passes (what the
        // frame builder did) and in one (`Icrc::copy_from`, what it does from 512 bytes).
        g.bench_with_input(BenchmarkId::new("copy_then_crc", size), &data, |b, d| {
            b.iter(|| {
                dst.copy_from_slice(black_box(d));
                let mut h = Icrc::new();
                h.update(&dst);
                h.finish()
            })
        });
        g.bench_with_input(BenchmarkId::new("copy_and_crc", size), &data, |b, d| {
            b.iter(|| {
                let mut h = Icrc::new();
                h.copy_from(&mut dst, black_box(d));
                h.finish()
            })
        });
    }
    // A frame's ICRC region below the folding threshold (a 64 B WRITE's is 120 bytes):
    // crc32fast's byte loop against the zero-padded fold (`icrc::compute_short`).
    for size in [40usize, 120] {
        let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
        g.bench_with_input(BenchmarkId::new("region_byte_loop", size), &data, |b, d| {
            b.iter(|| roce::wire::icrc::compute(black_box(d), false, 20))
        });
        g.bench_with_input(BenchmarkId::new("region_folded", size), &data, |b, d| {
            b.iter(|| roce::wire::icrc::compute_short(black_box(d), false, 20))
        });
    }
    g.finish();
}

fn write_frame(len: usize) -> (FrameRepr, Vec<u8>) {
    let mut t = TransportRepr::new(BthRepr::new(Opcode(0x0a), Qpn::new(0x12), Psn::new(1)));
    t.bth.ack_req = true;
    t.ext.reth = Some(RethRepr {
        va: 0x1000,
        rkey: Rkey(0x1234),
        len: len as u32,
    });
    let repr = FrameRepr {
        eth: EthernetRepr {
            dst: [2, 0, 0, 0x99, 0, 2],
            src: [2, 0, 0, 0x99, 0, 3],
            vlan: None,
            ethertype: 0,
        },
        ip: IpRepr::V4(Ipv4Repr {
            src: [10, 99, 0, 3],
            dst: [10, 99, 0, 2],
            dscp: 26,
            ecn: Ecn::Ect0,
            ident: 1,
            dont_frag: true,
            ttl: 64,
            protocol: 17,
            payload_len: 0,
        }),
        udp_src_port: 0xc000,
        udp_checksum: 0,
        transport: t,
    };
    let payload = vec![0x5au8; len];
    let mut buf = vec![0u8; repr.frame_len(len).unwrap()];
    repr.emit(&mut buf, &payload).unwrap();
    (repr, buf)
}

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame");
    g.throughput(Throughput::Elements(1));
    // 4 KiB: the payload's passes dominate; 64 B: the per-packet work.
    for (name, len) in [("4k", 4096usize), ("64", 64)] {
        let (repr, buf) = write_frame(len);
        let payload = vec![0x5au8; len];
        let mut out = vec![0u8; buf.len()];
        g.bench_function(format!("parse_verify_{name}_write"), |b| {
            b.iter(|| frame::parse(black_box(&buf)).unwrap())
        });
        let mut own = buf.clone();
        g.bench_function(format!("parse_verify_in_place_{name}_write"), |b| {
            b.iter(|| frame::parse_in_place(black_box(&mut own)).unwrap())
        });
        g.bench_function(format!("build_{name}_write"), |b| {
            b.iter(|| repr.emit(black_box(&mut out), black_box(&payload)).unwrap())
        });
    }
    g.finish();
}

criterion_group!(wire, crc, frames);
criterion_main!(wire);
