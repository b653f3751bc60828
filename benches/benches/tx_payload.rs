//! Zero-copy transmit against the one-pass copy (issue 22: "the copy stays for small payloads
//! where it is cheaper (measure the crossover)").
//!
//! One RoCE packet's payload handling, per payload size, in the two ways a sender can build it:
//!
//! * `copy`: what the data path does today. One mbuf: the 58 bytes of headers written, the
//!   payload copied from registered memory and summed in one pass (`Icrc::copy_from`), the
//!   ICRC appended.
//! * `zero_copy`: the payload attached as an external buffer (`pmd_bindings::ExtBuf`, one
//!   for the whole source, as a registration would hold it), so three segments: headers, the
//!   attached payload, and a 4-byte trailer mbuf (the ICRC must follow the payload, which
//!   lies in the application's memory). The ICRC still reads the payload.
//! * `zero_copy_per_wr`: as `zero_copy` with a shared-info (reference count and release
//!   callback) made per packet: what telling a one-packet WR's completion apart costs (a WR
//!   may complete only once the last mbuf referring to it is freed).
//!
//! Group `tx`: build and free (the free standing for the transmit completion). Group
//! `tx_rx`: build, then what the receiving end of an in-process link does with it (check the
//! ICRC over its segments, copy the payload into the destination), then free: the loopback
//! pair's whole per-byte work, as the e2e bench runs it. The source and destination are
//! 64 KiB, walked a packet at a time (the e2e bench's working set).
//!
//! `cargo bench -p ferroce-benches --bench tx_payload`; figures in docs/performance.md.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pmd_bindings::{EalBuilder, ExtBuf, Mbuf, Mempool};
use roce::wire::icrc::Icrc;

const HEADERS: usize = 58;
const WORKING_SET: usize = 65536;
const SIZES: [usize; 5] = [256, 512, 1024, 2048, 4096];

struct Fixture {
    pool: Arc<Mempool>,
    ext: ExtBuf,
    src: Vec<u8>,
    dst: Vec<u8>,
    headers: [u8; HEADERS],
    /// Where the next packet's payload starts, and where the last one's did.
    at: usize,
    last: usize,
}

impl Fixture {
    fn new() -> Fixture {
        EalBuilder::software("tx-payload-bench")
            .init()
            .expect("EAL");
        let pool =
            Mempool::new("txp", 4096, 256, pmd_bindings::mempool::ROCE_4K_DATA_ROOM).expect("pool");
        let src: Vec<u8> = (0..WORKING_SET).map(|i| (i * 31) as u8).collect();
        // SAFETY: `src` is never written, and outlives `ext` and every mbuf attached to it
        // (`ext` is the field declared, so dropped, before it; each mbuf is freed within its
        // iteration); its heap block does not move when the Vec moves into the fixture.
        let ext =
            unsafe { ExtBuf::from_raw_parts(src.as_ptr() as *mut u8, src.len(), Box::new(|| {})) };
        let mut headers = [0u8; HEADERS];
        for (i, b) in headers.iter_mut().enumerate() {
            *b = i as u8;
        }
        Fixture {
            pool,
            ext,
            src,
            dst: vec![0u8; WORKING_SET],
            headers,
            at: 0,
            last: 0,
        }
    }

    /// The next packet's payload offset in the working set.
    fn next(&mut self, len: usize) -> usize {
        if self.at + len > WORKING_SET {
            self.at = 0;
        }
        self.last = self.at;
        self.at += len;
        self.last
    }

    fn copy_packet(&mut self, len: usize) -> Mbuf {
        let at = self.next(len);
        let mut m = self.pool.alloc().expect("mbuf");
        let frame = m.append(HEADERS + len + 4).expect("room");
        frame[..HEADERS].copy_from_slice(&self.headers);
        let mut crc = Icrc::new();
        crc.update(&frame[..HEADERS]);
        let (payload, trailer) = frame[HEADERS..].split_at_mut(len);
        crc.copy_from(payload, &self.src[at..at + len]);
        trailer.copy_from_slice(&crc.finish().to_le_bytes());
        m
    }

    fn zero_copy_packet(&mut self, len: usize, per_wr: bool) -> Mbuf {
        let at = self.next(len);
        let mut head = self.pool.alloc().expect("mbuf");
        let mut body = self.pool.alloc().expect("mbuf");
        let mut tail = self.pool.alloc().expect("mbuf");
        head.append(HEADERS)
            .expect("room")
            .copy_from_slice(&self.headers);
        let mut crc = Icrc::new();
        crc.update(&self.headers);
        crc.update(&self.src[at..at + len]);
        if per_wr {
            // SAFETY: the region lies in `src`, which outlives every mbuf of the benchmark
            // (each is freed within its iteration) and is never written.
            let own = unsafe {
                ExtBuf::from_raw_parts(self.src.as_ptr().add(at) as *mut u8, len, Box::new(|| {}))
            };
            body.attach_extbuf(&own, 0, len).expect("attach");
        } else {
            body.attach_extbuf(&self.ext, at, len).expect("attach");
        }
        tail.append(4)
            .expect("room")
            .copy_from_slice(&crc.finish().to_le_bytes());
        head.chain(body).map_err(|_| ()).expect("chain");
        head.chain(tail).map_err(|_| ()).expect("chain");
        head
    }

    /// The receiving end: the ICRC over the frame's segments, then the payload into the
    /// destination (the check comes first: a bad packet must leave no trace, IBA).
    fn receive(&mut self, m: &Mbuf, len: usize) {
        let mut crc = Icrc::new();
        let mut segs = 0;
        for s in m.segments() {
            crc.update(s);
            segs += 1;
        }
        black_box(crc.finish());
        let dst = &mut self.dst[self.last..self.last + len];
        if segs == 1 {
            dst.copy_from_slice(&m.data()[HEADERS..HEADERS + len]);
        } else {
            let body = m.segments().nth(1).expect("payload segment");
            dst.copy_from_slice(body);
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // Every mbuf was freed inside its iteration: the ExtBuf's count is back to its own.
        assert_eq!(self.ext.refcnt(), 1, "an mbuf still refers to the source");
    }
}

fn payload(c: &mut Criterion) {
    let mut fx = Fixture::new();
    for (group, rx) in [("tx", false), ("tx_rx", true)] {
        let mut g = c.benchmark_group(format!("tx_payload/{group}"));
        for len in SIZES {
            g.throughput(Throughput::Bytes(len as u64));
            g.bench_with_input(BenchmarkId::new("copy", len), &len, |b, &len| {
                b.iter(|| {
                    let m = fx.copy_packet(len);
                    if rx {
                        fx.receive(&m, len);
                    }
                    drop(black_box(m));
                })
            });
            for (name, per_wr) in [("zero_copy", false), ("zero_copy_per_wr", true)] {
                g.bench_with_input(BenchmarkId::new(name, len), &len, |b, &len| {
                    b.iter(|| {
                        let m = fx.zero_copy_packet(len, per_wr);
                        if rx {
                            fx.receive(&m, len);
                        }
                        drop(black_box(m));
                    })
                });
            }
        }
        g.finish();
    }
    black_box(&fx.dst);
}

criterion_group!(benches, payload);
criterion_main!(benches);
