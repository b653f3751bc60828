//! The emulated switch on DPDK (`dataplane::switch`): RNICs joined through it by ring links
//! exchange real frames (ARP flooded, then forwarded by learned MAC); a slow egress with ECN
//! marking makes the receiver's CNPs slow the sender; a slow egress with PFC pauses the
//! sender's priority instead of dropping. Data is verified in every case.

use dataplane::config::{PfcConfig, RnicConfig};
use dataplane::runtime::{test_config, Runtime};
use dataplane::switch::SwitchSettings;
use dataplane::Verbs;
use dcb::ecn::Red;
use dcb::pfc::{Mode, Thresholds};
use ferroce_tests::{connect_pair_with, side, wait_cq, Side};
use roce::verbs::*;

fn pattern(seed: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32 ^ seed).wrapping_mul(0x9e37_79b1).rotate_left(7) as u8)
        .collect()
}

/// Two RNICs through a switch with `settings`; an RC QP from A to B.
fn switched(ca: RnicConfig, cb: RnicConfig, settings: &SwitchSettings) -> (Runtime, Side, Side) {
    let mtu = ca.path_mtu;
    let rt = Runtime::switched("ferroce-tests", vec![ca, cb], settings).expect("switched");
    // A 1 s ACK timeout: a slow port's queue delays ACKs by tens of milliseconds.
    let (a, b) = rc_pair(&rt, mtu, 18);
    (rt, a, b)
}

/// An RC QP from RNIC 0 of `rt` to RNIC 1 (8 MiB buffers), connected at `mtu` with ACK
/// timeout exponent `timeout`.
fn rc_pair(rt: &Runtime, mtu: Mtu, timeout: u8) -> (Side, Side) {
    let mut a = side(rt.open(0).unwrap(), QpType::Rc, 8 << 20, 256);
    let mut b = side(rt.open(1).unwrap(), QpType::Rc, 8 << 20, 256);
    connect_pair_with(&mut a, &mut b, mtu, (0x10, 0x77), QpType::Rc, timeout);
    (a, b)
}

/// RNIC A's configuration from its configuration file's `settings` (the switch in front
/// of it among them), on the loopback test defaults with a 50 us idle sleep.
fn configured(settings: &[(&str, &str)]) -> RnicConfig {
    let mut ra = dataplane::runtime::loopback_raw_config(3, 1024);
    ra.set("worker.idle_sleep_us", "50").unwrap();
    for (k, v) in settings {
        ra.set(k, v).unwrap();
    }
    ra.validate().unwrap()
}

/// Posts `n` WRITEs of `len` bytes of `data` (8 outstanding at most), waits for each, and
/// checks B's memory.
fn write_verified(a: &mut Side, b: &Side, n: u64, len: u32) {
    let data = pattern(n as u32, len as usize);
    a.buf.write(0, &data);
    let mut posted = 0;
    let mut done = 0;
    while done < n {
        while posted < n && posted - done < 8 {
            let sge = a.mr.sge(0, len);
            a.ctx
                .post_send(
                    a.qpn,
                    &SendWr {
                        wr_id: posted,
                        op: WrOp::Write {
                            remote_addr: b.mr.addr,
                            rkey: b.mr.rkey.unwrap(),
                        },
                        sg_list: &[sge],
                        flags: SendFlags::SIGNALED,
                        ud: None,
                    },
                )
                .expect("post_send");
            posted += 1;
        }
        let c = wait_cq(a, 1, 30);
        assert!(!c.is_empty(), "WRITE {done} did not complete");
        for x in &c {
            assert_eq!(x.status, WcStatus::Success, "{x:?}");
        }
        done += c.len() as u64;
    }
    assert_eq!(b.buf.to_vec(0, len as usize), data);
}

/// Waits up to 2 s for the switch's published counters to satisfy `f`.
fn switch_stats_until(
    rt: &Runtime,
    f: impl Fn(&dataplane::switch::SwitchStats) -> bool,
) -> dataplane::switch::SwitchStats {
    let t = std::time::Instant::now();
    loop {
        let s = rt.switch_stats(0).expect("a switch");
        if f(&s) || t.elapsed() > std::time::Duration::from_secs(2) {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

#[test]
fn rnics_talk_through_the_switch() {
    let (rt, mut a, b) = switched(
        test_config(3, 1024),
        test_config(4, 1024),
        &SwitchSettings::default(),
    );
    write_verified(&mut a, &b, 20, 10_000);
    let s = switch_stats_until(&rt, |s| s.model.tx_frames > 200);
    assert!(s.flooded >= 1, "the first ARP was flooded: {s:?}");
    assert!(s.model.tx_frames > 200, "{s:?}");
    assert_eq!(s.model.drops, [0, 0, 0]);
    drop((a, b));
    rt.stop();
}

/// B's port at 200 Mb/s, marking above 20 KB: B's notification point answers the marks with
/// CNPs, A's QP slows down; nothing is dropped.
#[test]
fn a_congested_switch_marks_and_the_sender_slows_down() {
    let settings = SwitchSettings {
        // A's port at 10 Gb/s, B's at 200 Mb/s: B's egress is the bottleneck.
        port_mbps: vec![10_000.0, 200.0],
        red: Some(Red {
            kmin: 20_000,
            kmax: 60_000,
            pmax: 0.5,
        }),
        ..Default::default()
    };
    let mut ca = test_config(3, 1024);
    ca.ecn = true;
    ca.dcqcn.rp = Some(dcb::dcqcn::RpParams::paper(10_000.0));
    let mut cb = test_config(4, 1024);
    cb.dcqcn.np_min_interval_ns = Some(50_000);
    let (rt, mut a, b) = switched(ca, cb, &settings);
    write_verified(&mut a, &b, 16, 64 * 1024);
    let s = switch_stats_until(&rt, |s| s.model.marked > 0);
    assert!(s.model.marked > 0, "{s:?}");
    assert_eq!(s.model.drops, [0, 0, 0]);
    let snaps = rt.stop();
    assert!(snaps[1].qps.np_cnp_sent > 0, "{:?}", snaps[1].qps);
    assert!(snaps[0].qps.rp_cnp_handled > 0, "{:?}", snaps[0].qps);
}

/// B's port at 100 Mb/s with PFC (XOFF 20 KB per ingress port): the switch pauses A's
/// priority 0 rather than dropping, A honours the pauses, the data arrives. What may still
/// arrive after an XOFF - A's transmit ring (16 frames) and the burst its RNIC holds (32) -
/// fits the 96 KiB of headroom, while A's send window (128
/// packets, 138 KB) does not:
/// without the pauses, frames are dropped.
#[test]
fn a_slow_egress_with_pfc_pauses_the_sender_instead_of_dropping() {
    let settings = SwitchSettings {
        port_mbps: vec![1_000.0, 100.0],
        headroom: 96 << 10,
        pfc: Mode::Pfc { enabled: 1 },
        thresholds: Thresholds {
            xoff: 20_000,
            xon: 10_000,
        },
        ..Default::default()
    };
    let pfc = PfcConfig {
        mode: Mode::Pfc { enabled: 1 },
        watchdog: None,
        ..Default::default()
    };
    let mut ca = test_config(3, 1024);
    ca.pfc = pfc;
    ca.speed_gbps = 1;
    ca.rx_desc = 16;
    ca.tx_desc = 16;
    let mut cb = test_config(4, 1024);
    cb.pfc = pfc;
    let (rt, mut a, b) = switched(ca, cb, &settings);
    write_verified(&mut a, &b, 8, 64 * 1024);
    let s = switch_stats_until(&rt, |s| s.model.pfc_xoff > 0);
    assert!(s.model.pfc_xoff > 0, "{s:?}");
    let snaps = rt.stop();
    assert_eq!(
        s.model.drops,
        [0, 0, 0],
        "lossless: {s:?} {:?}",
        snaps[0].nic
    );
    assert!(snaps[0].nic.rx_pfc > 0, "{:?}", snaps[0].nic);
    assert_eq!(
        snaps[0].qps.retransmitted_pkts, 0,
        "nothing lost, nothing resent"
    );
}

/// `[switch]` in an RNIC's configuration puts the emulated switch between the RNIC and its
/// port: here A's port is a ring link to B, and A's switch sends to it at 200 Mb/s, marking
/// above 20 KiB. A's WRITEs queue in the switch, get marked, B answers with CNPs that cross
/// the switch back to A, and A's QP slows down; nothing is dropped, the data arrives, and the
/// switch's capture holds the CE-marked frames.
#[test]
fn an_rnic_behind_the_switch_its_configuration_names() {
    let dir = std::env::temp_dir().join(format!("ferroce-cfgswitch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("switch.pcap");
    let ca = configured(&[
        ("roce.ecn", "true"),
        ("dcqcn.rp", "true"),
        ("dcqcn.variant", "paper"),
        ("switch.enabled", "true"),
        ("switch.rate_mbps", "200"),
        ("switch.rnic_mbps", "10000"),
        ("switch.ecn_kmin_kb", "20"),
        ("switch.ecn_kmax_kb", "60"),
        ("switch.ecn_pmax", "0.5"),
        ("switch.pcap", pcap.to_str().unwrap()),
    ]);
    let mut cb = test_config(4, 1024);
    cb.dcqcn.np_min_interval_ns = Some(50_000);
    let mtu = ca.path_mtu;
    let rt = Runtime::loopback("ferroce-tests", ca, cb).expect("loopback");
    let (mut a, b) = rc_pair(&rt, mtu, 18);
    write_verified(&mut a, &b, 16, 64 * 1024);
    let s = switch_stats_until(&rt, |s| s.model.marked > 0);
    assert!(s.model.marked > 0, "{s:?}");
    assert_eq!(s.model.drops, [0, 0, 0]);
    assert!(rt.switch_stats(1).is_none(), "one switch, A's");
    let snaps = rt.stop();
    assert!(snaps[1].qps.np_cnp_sent > 0, "{:?}", snaps[1].qps);
    assert!(snaps[0].qps.rp_cnp_handled > 0, "{:?}", snaps[0].qps);
    let bytes = std::fs::read(&pcap).unwrap();
    let frames = roce::pcap::Reader::new(&bytes)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|r| roce::wire::frame::classify(r.data) == roce::wire::frame::FrameKind::Roce)
        .filter(|r| r.data.len() > 15 && r.data[15] & 3 == 3)
        .count();
    assert!(frames > 0, "CE-marked frames in the switch's capture");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Faults at the switch (`switch.loss`, `duplicate`, `reorder`, `corrupt`): every frame it
/// sends, both ways, may be lost, doubled, held behind the next or have a bit flipped. RC
/// recovers: the data arrives whole, A resent what was lost, and the switch counted its
/// faults.
#[test]
fn rc_recovers_through_a_faulty_switch() {
    let ca = configured(&[
        ("switch.enabled", "true"),
        ("switch.loss", "0.02"),
        ("switch.duplicate", "0.01"),
        ("switch.reorder", "0.01"),
        ("switch.corrupt", "0.01"),
        ("switch.seed", "7"),
    ]);
    let mtu = ca.path_mtu;
    let rt = Runtime::loopback("ferroce-tests", ca, test_config(4, 1024)).expect("loopback");
    // A short ACK timeout (2^12 x 4.096 us = 17 ms): lost tails are resent soon.
    let (mut a, b) = rc_pair(&rt, mtu, 12);
    write_verified(&mut a, &b, 24, 64 * 1024);
    let s = rt.switch_stats(0).expect("A's switch");
    let snaps = rt.stop();
    assert!(s.faults.lost > 0 && s.faults.reordered > 0, "{s:?}");
    assert!(snaps[0].qps.retransmitted_pkts > 0, "{:?}", snaps[0].qps);
}
