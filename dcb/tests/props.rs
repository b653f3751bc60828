//! Properties over random event sequences: DCQCN rates stay within [min rate, line rate] and
//! finite for both variants; ETS only picks a TC that has a packet and is not paused; the
//! pacer never lets a long run exceed its rate by more than the burst.

use dcb::dcqcn::{Rp, RpParams};
use dcb::ets::{Ets, EtsConfig, TCS};
use dcb::limiter::Pacer;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Ev {
    Cnp(u64),
    Sent(u64, u64),
    Time(u64),
}

fn events() -> impl Strategy<Value = Vec<Ev>> {
    prop::collection::vec(
        prop_oneof![
            (0u64..200_000).prop_map(Ev::Cnp),
            (1u64..20_000_000, 0u64..200_000).prop_map(|(b, t)| Ev::Sent(b, t)),
            (0u64..2_000_000).prop_map(Ev::Time),
        ],
        1..400,
    )
}

proptest! {
    #[test]
    fn dcqcn_rates_stay_in_bounds(evs in events(), line in 1_000.0f64..400_000.0, fw in any::<bool>()) {
        let p = if fw { RpParams::firmware(line) } else { RpParams::paper(line) };
        let mut r = Rp::new(p, 0);
        let mut now = 0u64;
        for e in evs {
            match e {
                Ev::Cnp(dt) => { now += dt; r.on_cnp(now); }
                Ev::Sent(b, dt) => { now += dt; r.on_sent(b, now); }
                Ev::Time(dt) => { now += dt; }
            }
            if r.poll_timeout() <= now {
                r.handle_timeout(now);
            }
            prop_assert!(r.rate().is_finite() && r.target().is_finite() && r.alpha().is_finite());
            prop_assert!(r.rate() >= p.min_rate - 1e-9, "rate {} below min", r.rate());
            prop_assert!(r.rate() <= line + 1e-9 && r.target() <= line + 1e-9);
            prop_assert!((0.0..=1.0 + 1e-12).contains(&r.alpha()));
        }
    }

    #[test]
    fn ets_picks_only_ready_tcs(
        steps in prop::collection::vec((prop::array::uniform8(prop::option::of(64u32..9000)), any::<u8>()), 1..300)
    ) {
        let mut e = Ets::new(EtsConfig::roce_default()).unwrap();
        for (head, paused) in steps {
            match e.pick(&head, paused) {
                Some(t) => {
                    prop_assert!(t < TCS && head[t].is_some() && paused & (1 << t) == 0);
                }
                None => {
                    let ready = (0..TCS).any(|t| head[t].is_some() && paused & (1 << t) == 0
                        && (EtsConfig::roce_default().tsa[t] == dcb::ets::Tsa::Strict
                            || EtsConfig::roce_default().bw_percent[t] > 0));
                    prop_assert!(!ready, "a ready TC was not picked");
                }
            }
        }
    }

    #[test]
    fn pacer_holds_its_rate(rate in 10.0f64..100_000.0, sizes in prop::collection::vec(64u64..9000, 100..400), burst in 0u64..20_000) {
        let mut p = Pacer::new(rate, burst);
        let mut now = 0u64;
        let mut bytes = 0u64;
        for s in &sizes {
            now = p.next_allowed(now);
            p.on_send(now, *s);
            bytes += s;
        }
        // bytes <= rate x elapsed + burst + one packet (the last may start at `now`).
        let allowed = rate * 1e6 / 8.0 * (now as f64 / 1e9) + burst as f64 + 9000.0;
        prop_assert!(bytes as f64 <= allowed * 1.001, "{bytes} > {allowed}");
    }
}
