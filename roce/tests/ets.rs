//! ETS in the RNIC (IEEE 802.1Qaz): with two QPs always ready on different priorities, the
//! link is shared by the classes' bandwidth shares, a strict class goes first, and without
//! ETS the QPs simply take turns. Simulated time, a 10 Gb/s link.

use dcb::ets::{EtsConfig, Tsa};
use roce::engine::DeviceConfig;
use roce::sim::{connect_per_sl, ConnectOpts, LinkConfig, Pair};
use roce::verbs::*;

const US: u64 = 1_000;
const MSG: u32 = 64 * 1024;

/// Payload bytes each of two QPs (priority 0, priority 3) wrote in 5 ms, both kept 8 deep.
fn shares(ets: Option<EtsConfig>) -> [u64; 2] {
    let cfg = || DeviceConfig {
        port_mtu: Mtu::M4096,
        ets,
        ..Default::default()
    };
    let mut p = Pair::new(cfg(), cfg(), LinkConfig::lossless(10, US), 3);
    let o = ConnectOpts {
        mtu: Mtu::M4096,
        mem_len: 8 * MSG as usize,
        depth: 16,
        ..Default::default()
    };
    let eps = connect_per_sl(&mut p, &o, &[0, 3]);
    let mut outstanding = [0u64; 2];
    let mut bytes = [0u64; 2];
    let until = 5_000 * US;
    while p.now < until {
        for (i, (a, b)) in eps.iter().enumerate() {
            for c in p.cqes(0, a) {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                outstanding[i] -= 1;
                bytes[i] += MSG as u64;
            }
            while outstanding[i] < 8 {
                let off = (outstanding[i] % 8) * MSG as u64;
                p.post(0, a, 1, b.write_to(off), &[a.sge(off, MSG)]);
                outstanding[i] += 1;
            }
        }
        let step = (p.now + 20 * US).min(until);
        p.run(step, |_| false);
        p.now = p.now.max(step);
    }
    bytes
}

fn ets(tsa: [Tsa; 8], bw: [u8; 8]) -> EtsConfig {
    let c = EtsConfig {
        prio_tc: [0, 1, 2, 3, 4, 5, 6, 7],
        tsa,
        bw_percent: bw,
    };
    c.validate().unwrap();
    c
}

#[test]
fn classes_share_the_link_by_their_ets_weights() {
    let even = shares(None);
    let half = shares(Some(EtsConfig::roce_default()));
    let mut bw = [0u8; 8];
    bw[0] = 20;
    bw[3] = 80;
    let skewed = shares(Some(ets([Tsa::Ets; 8], bw)));
    let mut tsa = [Tsa::Ets; 8];
    tsa[3] = Tsa::Strict;
    let mut bw = [0u8; 8];
    bw[0] = 100;
    let strict = shares(Some(ets(tsa, bw)));
    let ratio = |x: [u64; 2]| x[1] as f64 / x[0].max(1) as f64;
    eprintln!(
        "priority 3 / priority 0: no ETS {:.2}, 50/50 {:.2}, 80/20 {:.2}, strict {:.2}; totals \
         {:?} {:?} {:?} {:?}",
        ratio(even),
        ratio(half),
        ratio(skewed),
        ratio(strict),
        even,
        half,
        skewed,
        strict
    );
    assert!((0.9..1.1).contains(&ratio(even)), "round robin: {even:?}");
    assert!((0.9..1.1).contains(&ratio(half)), "50/50: {half:?}");
    assert!((3.5..4.5).contains(&ratio(skewed)), "80/20: {skewed:?}");
    assert!(
        strict[0] < strict[1] / 20,
        "a strict class goes first: {strict:?}"
    );
    // Work-conserving: the link stays busy whatever the split.
    let total = |x: [u64; 2]| x[0] + x[1];
    for x in [half, skewed, strict] {
        assert!(
            total(x) as f64 > 0.95 * total(even) as f64,
            "{x:?} vs {even:?}"
        );
    }
}
