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
use roce::wire::frame;
use roce::wire::icrc::Icrc;

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

fn frames(c: &mut Criterion) {
    let mut g = c.benchmark_group("frame");
    g.throughput(Throughput::Elements(1));
    // 4 KiB: the payload's passes dominate; 64 B: the per-packet work.
    for (name, len) in [("4k", 4096usize), ("64", 64)] {
        let payload = vec![0x5au8; len];
        let (repr, buf) = frame::example_write(false, false, &payload);
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
