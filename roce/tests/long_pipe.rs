//! Long pipes: one RC QP over a link whose bandwidth-delay product exceeds rxe's send window
//! of 128 PSNs. With the window rxe uses the QP can keep the link busy only part of the time;
//! with a window above the bandwidth-delay product it fills the link (`max_unacked_psns`,
//! rnicd's `roce.send_window`). Simulated time: 10 Gb/s, 0.5 ms each way.

use roce::engine::DeviceConfig;
use roce::sim::{connect, ConnectOpts, LinkConfig, Pair};
use roce::verbs::*;

const SEC: u64 = 1_000_000_000;
const MSG: usize = 1 << 20;
const MSGS: u64 = 24;
const LINK_GBPS: u64 = 10;

/// Goodput (Gb/s) of `MSGS` 1 MiB WRITEs, kept 8 deep, over the long link with a send window
/// of `window` PSNs and AckReq at least every `ack_every` packets.
fn goodput(window: u32, ack_every: u32) -> f64 {
    let cfg = || DeviceConfig {
        port_mtu: Mtu::M4096,
        max_unacked_psns: window,
        ack_every,
        ..Default::default()
    };
    let link = LinkConfig::lossless(LINK_GBPS, 500_000);
    let mut p = Pair::new(cfg(), cfg(), link, 1);
    let o = ConnectOpts {
        mtu: Mtu::M4096,
        mem_len: 8 * MSG,
        depth: 16,
        timeout: 20, // 4.3 s: far above the 1 ms round trip
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    let start = p.now;
    let (mut posted, mut done) = (0u64, 0u64);
    while done < MSGS {
        while posted < MSGS && posted - done < 8 {
            let off = (posted % 8) * MSG as u64;
            p.post(0, &a, posted, b.write_to(off), &[a.sge(off, MSG as u32)]);
            posted += 1;
        }
        let cq = a.cq;
        assert!(
            p.run(p.now + 10 * SEC, |p| p.a.dev.cq_has_entries(cq)),
            "no completion within 10 s of simulated time"
        );
        let c = p.cqes(0, &a);
        for x in &c {
            assert_eq!(x.status, WcStatus::Success, "{x:?}");
        }
        done += c.len() as u64;
    }
    let secs = (p.now - start) as f64 / SEC as f64;
    (MSGS * MSG as u64 * 8) as f64 / secs / 1e9
}

#[test]
fn a_window_above_the_bandwidth_delay_product_fills_a_long_pipe() {
    // The bandwidth-delay product: 10 Gb/s x 1 ms = 1.25 MB = 305 packets of 4 KiB.
    let rxe = goodput(128, 64);
    let wide = goodput(1024, 64);
    let payload_share = 4096.0 / (4096.0 + 70.0);
    eprintln!("1 ms RTT, 10 Gb/s: window 128 -> {rxe:.2} Gb/s, window 1024 -> {wide:.2} Gb/s");
    assert!(
        wide >= 0.9 * LINK_GBPS as f64 * payload_share,
        "a window above the BDP keeps the link busy: {wide:.2} Gb/s"
    );
    // 128 x 4 KiB per round trip: about 4.2 Gb/s at most.
    assert!(
        rxe < 0.5 * LINK_GBPS as f64,
        "rxe's window caps one QP on this pipe: {rxe:.2} Gb/s"
    );
}

/// With rxe's window of 128 and its AckReq every 64 packets, a 1 MiB WRITE (256 packets)
/// draws one ACK per window and the sender idles half of each round trip; AckReq every 16
/// packets (`roce.ack_every`) keeps the window moving, up to its limit (128 x 4 KiB per
/// round trip, about 4.2 Gb/s).
#[test]
fn frequent_ack_requests_keep_a_small_window_moving() {
    let sparse = goodput(128, 64);
    let dense = goodput(128, 16);
    eprintln!(
        "window 128, 1 ms RTT: AckReq every 64 -> {sparse:.2} Gb/s, every 16 -> {dense:.2} Gb/s"
    );
    assert!(dense > 1.3 * sparse, "{dense:.2} vs {sparse:.2} Gb/s");
    assert!(dense > 3.5, "near the window's limit: {dense:.2} Gb/s");
}

/// A window smaller than the AckReq spacing (here 32 PSNs with rxe's 64): the requester asks
/// for an ACK before the window closes, so a message longer than the window keeps moving
/// (without that, no ACK ever came and every WR ended in retry-exceeded).
#[test]
fn a_window_below_the_ack_spacing_still_moves() {
    let g = goodput(32, 64);
    eprintln!("window 32, AckReq every 64 asked: {g:.2} Gb/s");
    // 32 x 4 KiB per 1 ms round trip: about 1 Gb/s.
    assert!(g > 0.8, "{g:.2} Gb/s");
}
