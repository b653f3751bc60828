//! The fuzz targets' bodies on the stable toolchain, as CI runs them: over the inputs that
//! once failed (`regressions/<target>/`, kept for good), over seeds made from the corpus
//! captures, and over pseudo-random inputs from a fixed seed. A short smoke, not a fuzzing
//! campaign (README, "Fuzzing").

use std::path::{Path, PathBuf};

use roce::sim::Rng;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

/// The files of `regressions/<target>/`, read.
fn regressions(target: &str) -> Vec<Vec<u8>> {
    let dir = root().join("regressions").join(target);
    let mut out: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(&dir)
        .map(|d| {
            d.map(|e| {
                let p = e.unwrap().path();
                let b = std::fs::read(&p).unwrap();
                (p, b)
            })
            .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.into_iter().map(|(_, b)| b).collect()
}

/// The frames of every corpus capture (Soft-RoCE stacks talking).
fn corpus_frames() -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    for data in captures() {
        for r in roce::pcap::Reader::new(&data).unwrap() {
            frames.push(r.unwrap().data.to_vec());
        }
    }
    frames
}

/// `n` inputs of up to `max` pseudo-random bytes.
fn random_inputs(seed: u64, n: usize, max: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| {
            let len = (rng.next_u64() as usize) % (max + 1);
            (0..len).map(|_| rng.next_u64() as u8).collect()
        })
        .collect()
}

/// Runs `run` over the target's regression inputs, then `seeds`, then `random` (seed,
/// count, longest) pseudo-random inputs; returns what each run returned.
fn smoke<R>(
    target: &str,
    seeds: Vec<Vec<u8>>,
    (seed, n, max): (u64, usize, usize),
    run: fn(&[u8]) -> R,
) -> Vec<R> {
    let mut inputs = regressions(target);
    inputs.extend(seeds);
    inputs.extend(random_inputs(seed, n, max));
    inputs.iter().map(|i| run(i)).collect()
}

/// The corpus captures' bytes.
fn captures() -> Vec<Vec<u8>> {
    let dir = root().join("../corpus");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no captures in {dir:?}");
    names.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

#[test]
fn parse_frame() {
    let mut seeds = Vec::new();
    for f in corpus_frames() {
        // The corpus frames whole, then cut at one place and with a byte flipped.
        let mut cut = vec![(f.len() / 3) as u8];
        cut.extend_from_slice(&f);
        seeds.push(cut.clone());
        let mid = cut.len() / 2;
        cut[mid] ^= 0x41;
        seeds.push(cut);
    }
    smoke(
        "parse_frame",
        seeds,
        (1, 2000, 300),
        ferroce_fuzz::frame::run,
    );
}

#[test]
fn pcap_reader() {
    let mut seeds = Vec::new();
    for data in captures() {
        // Whole (its first 4 KiB), truncated, and with a record length corrupted.
        let head = data[..data.len().min(4096)].to_vec();
        seeds.push(data[..data.len().min(77)].to_vec());
        let mut bad = head.clone();
        if bad.len() > 40 {
            bad[36] = 0xff;
            bad[37] = 0xff;
        }
        seeds.push(head);
        seeds.push(bad);
    }
    smoke(
        "pcap_reader",
        seeds,
        (2, 2000, 200),
        ferroce_fuzz::pcap::run,
    );
}

#[test]
fn rx_engine() {
    smoke(
        "rx_engine",
        Vec::new(),
        (3, 300, 400),
        ferroce_fuzz::rx::run,
    );
}

#[test]
fn nic_rx() {
    ferroce_fuzz::nic::self_check();
    smoke("nic_rx", Vec::new(), (9, 300, 400), ferroce_fuzz::nic::run);
}

/// Not a fuzz run: the RNIC drops what it keeps per QP with the QP (the real soak saw
/// rnicd's memory creep up by a header template per QP ever created).
#[test]
fn nic_templates_are_dropped_with_their_qps() {
    ferroce_fuzz::nic::templates_follow_qps();
}

/// Control calls of every common kind, one JSON request per line, in an order that builds
/// objects on each other (ids as a fresh client would get them, and nearby).
fn host_call_seeds() -> Vec<Vec<u8>> {
    use ferroce_host::abi::proto::{Body, Request};
    use ferroce_host::abi::Command;
    use roce::engine::{CqId, QpInit};
    use roce::memory::PdId;
    use roce::types::{Lkey, Qpn, Rkey};
    use roce::verbs::*;
    let init = |pd: u32, cq: u32| QpInit::rc(PdId(pd), CqId(cq));
    // One JSON request per line, as a client would send them.
    let lines = |calls: Vec<Command>| {
        let mut text = Vec::new();
        for (id, body) in calls.into_iter().enumerate() {
            let r = Request {
                id: id as u64,
                body: Body::Call(body),
            };
            text.extend_from_slice(serde_json::to_string(&r).unwrap().as_bytes());
            text.push(b'\n');
        }
        text
    };
    let mut seeds = Vec::new();
    // Ids below 8 name the client's own objects by rank (`ferroce_fuzz::nic::run_calls`).
    for (pd, cq) in [(0, 0), (1, 1), (9, 9)] {
        let calls = vec![
            Command::QueryDevice,
            Command::QueryPort,
            Command::QueryGid { index: 1 },
            Command::AllocPd,
            Command::AddArea { id: 1 },
            Command::RegMr {
                pd: PdId(pd),
                area: 1,
                offset: 0,
                len: 4096,
                access: Access::ALL,
                iova: 0x1000,
            },
            Command::CreateCq {
                cqe: 16,
                capacity: 64,
            },
            Command::CreateQp { init: init(pd, cq) },
            Command::ModifyQp {
                qpn: Qpn::new(0),
                attr: QpAttr {
                    state: Some(QpState::Init),
                    pkey_index: Some(0),
                    port: Some(1),
                    access: Some(Access::ALL),
                    ..Default::default()
                },
            },
            Command::QueryQp { qpn: Qpn::new(0) },
            Command::AllocMw {
                pd: PdId(pd),
                ty: roce::memory::MwType::Two,
            },
            Command::ResizeCq {
                cq: CqId(cq),
                cqe: 32,
            },
            Command::Counters { qpn: None },
            Command::DeregMr { lkey: Lkey(0x101) },
            Command::DeallocMw { rkey: Rkey(0x201) },
            Command::DestroyQp { qpn: Qpn::new(0) },
            Command::DestroyCq { cq: CqId(cq) },
            Command::RemoveArea { id: 1 },
            Command::DeallocPd { pd: PdId(pd) },
            Command::CmListen { service_id: 7 },
        ];
        seeds.push(lines(calls));
    }
    // Calls naming every small id of other clients' objects (this client has none, so
    // nothing is mapped): each must fail, the other tenant keeping everything.
    let mut calls = Vec::new();
    for i in 0..32u32 {
        calls.push(Command::DestroyQp {
            qpn: Qpn::new(0x10 + i),
        });
        calls.push(Command::DestroyCq { cq: CqId(i) });
        calls.push(Command::DeallocPd { pd: PdId(i) });
        calls.push(Command::DeregMr {
            lkey: Lkey(0x100 + i),
        });
    }
    seeds.push(lines(calls));
    seeds
}

#[test]
fn host_calls() {
    let seeds = host_call_seeds();
    // FERROCE_FUZZ_SEEDS=DIR writes them out, to start a corpus for `scripts/fuzz.sh run
    // host_calls` (JSON by hand is tedious).
    if let Ok(dir) = std::env::var("FERROCE_FUZZ_SEEDS") {
        for (i, s) in seeds.iter().enumerate() {
            std::fs::write(Path::new(&dir).join(format!("seed-{i}")), s).unwrap();
        }
    }
    let n = seeds.len();
    let ok = smoke(
        "host_calls",
        seeds,
        (10, 200, 400),
        ferroce_fuzz::nic::run_calls,
    );
    // The harness reaches the RNIC's calls: most of the first two seeds' 20 calls succeed;
    // the third names ids that are not the client's, and only its id-less calls do.
    assert!(
        ok[0] >= 15 && ok[1] >= 15 && ok[2] < 15 && ok[3] == 0,
        "calls that succeeded: {:?}",
        &ok[..n]
    );
}

#[test]
fn cm_agent() {
    // A connect, a delivery round, an accept, deliveries, an RTU and a disconnect.
    let script = vec![
        1, 0, 0, 0, 8, 1, 1, 1, 0, 0, 8, 0, 8, 0, 1, 3, 0, 8, 0, 5, 0, 8,
    ];
    smoke(
        "cm_agent",
        vec![script],
        (4, 500, 300),
        ferroce_fuzz::cm::run,
    );
}

#[test]
fn post_ring() {
    // Encoded posts (first byte odd) left as written (mask and cut 0): each must round-trip;
    // and the same with fewer cells published (cut not 0).
    let encoded = |cut: u8| {
        random_inputs(6, 2000, 600)
            .into_iter()
            .filter(|i| i.len() > 5)
            .map(move |mut i| {
                i[0] |= 1;
                (i[1], i[4]) = (0, cut);
                i
            })
    };
    let seeds = encoded(0).chain(encoded(3)).collect();
    let trips = smoke("post_ring", seeds, (5, 3000, 600), ferroce_fuzz::posts::run);
    let round_trips: usize = trips.iter().sum();
    assert!(round_trips > 500, "only {round_trips} posts round-tripped");
}

#[test]
fn config() {
    let example = std::fs::read(root().join("../../docs/rnic.example.toml")).unwrap();
    let mut with_sets = example.clone();
    with_sets.extend_from_slice(b"\0worker.count=2\nroce.path_mtu=9000\nfault.loss=2\nx=y\n");
    let valid = smoke(
        "config",
        vec![example, with_sets],
        (7, 2000, 300),
        ferroce_fuzz::config::run,
    );
    let n = regressions("config").len();
    assert!(
        valid[n],
        "the example configuration validates and round-trips"
    );
}

#[test]
fn neighbor() {
    // An ARP request for our address, an echo request, a neighbour solicitation, a
    // resolution and time passing.
    let script = vec![
        1, 5, 3, 0, 7, 0, 1, 3, 3, 7, 0, 10, 4, 1, 0, 0, 0, 3, 5, 0, 5, 7, 1,
    ];
    smoke(
        "neighbor",
        vec![script],
        (8, 2000, 300),
        ferroce_fuzz::neighbor::run,
    );
}
