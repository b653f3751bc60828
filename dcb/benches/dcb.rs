//! Per-packet costs of the DCB state machines (each must be far below a packet's time: a
//! 1 KB packet lasts 80 ns at 100 Gb/s): an ETS pick among four busy TCs, a pacer check and
//! update, a DCQCN reaction point's per-packet work (byte counter and timers), a RED marking
//! decision, and a PFC pause lookup.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use dcb::dcqcn::{Rp, RpParams};
use dcb::ecn::{codepoint, Marker, Red};
use dcb::ets::{Ets, EtsConfig};
use dcb::limiter::Pacer;
use dcb::pfc::{Mode, PauseState};

fn benches(c: &mut Criterion) {
    let mut ets = Ets::new(EtsConfig::roce_default()).unwrap();
    let head = [
        Some(1086),
        Some(64),
        None,
        Some(4158),
        None,
        None,
        Some(90),
        None,
    ];
    c.bench_function("ets_pick", |b| {
        b.iter(|| black_box(ets.pick(black_box(&head), black_box(1 << 6))))
    });

    let mut pacer = Pacer::new(40_000.0, 4096);
    let mut now = 0u64;
    c.bench_function("pacer_check_and_send", |b| {
        b.iter(|| {
            now += 220;
            let t = pacer.next_allowed(black_box(now));
            if t <= now {
                pacer.on_send(now, 1086);
            }
            black_box(t)
        })
    });

    let mut rp = Rp::new(RpParams::firmware(100_000.0), 0);
    let mut t = 0u64;
    c.bench_function("dcqcn_rp_per_packet", |b| {
        b.iter(|| {
            t += 87;
            rp.on_sent(1086, t);
            if rp.poll_timeout() <= t {
                rp.handle_timeout(t);
            }
            black_box(rp.rate())
        })
    });

    let mut m = Marker::new(Red::scaled(100.0), 1);
    let mut q = 0u64;
    c.bench_function("red_mark", |b| {
        b.iter(|| {
            q = (q + 7919) % 2_000_000;
            black_box(m.mark(codepoint::ECT0, black_box(q)))
        })
    });

    let s = PauseState::new(Mode::Pfc { enabled: 1 << 3 }, 100_000);
    c.bench_function("pfc_is_paused", |b| {
        b.iter(|| black_box(s.is_paused(black_box(3), black_box(12345))))
    });
}

criterion_group!(dcb_benches, benches);
criterion_main!(dcb_benches);
