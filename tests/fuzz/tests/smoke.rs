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
    let dir = root().join("../../tests/corpus");
    let mut frames = Vec::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "pcap"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no captures in {dir:?}");
    for p in names {
        let data = std::fs::read(&p).unwrap();
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

#[test]
fn parse_frame() {
    let mut inputs = regressions("parse_frame");
    for f in corpus_frames() {
        // The corpus frames whole, then cut at one place and with a byte flipped.
        let mut cut = vec![(f.len() / 3) as u8];
        cut.extend_from_slice(&f);
        inputs.push(cut.clone());
        let mid = cut.len() / 2;
        cut[mid] ^= 0x41;
        inputs.push(cut);
    }
    inputs.extend(random_inputs(1, 2000, 300));
    for i in &inputs {
        roce_fuzz::frame::run(i);
    }
}

#[test]
fn pcap_reader() {
    let mut inputs = regressions("pcap_reader");
    let dir = root().join("../../tests/corpus");
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|e| e == "pcap") {
            let data = std::fs::read(&p).unwrap();
            // Whole, truncated, and with a record length corrupted.
            inputs.push(data[..data.len().min(4096)].to_vec());
            inputs.push(data[..data.len().min(77)].to_vec());
            let mut bad = data[..data.len().min(4096)].to_vec();
            if bad.len() > 40 {
                bad[36] = 0xff;
                bad[37] = 0xff;
            }
            inputs.push(bad);
        }
    }
    inputs.extend(random_inputs(2, 2000, 200));
    for i in &inputs {
        roce_fuzz::pcap::run(i);
    }
}

#[test]
fn rx_engine() {
    let mut inputs = regressions("rx_engine");
    inputs.extend(random_inputs(3, 300, 400));
    for i in &inputs {
        roce_fuzz::rx::run(i);
    }
}

#[test]
fn cm_agent() {
    let mut inputs = regressions("cm_agent");
    // A connect, a delivery round, an accept, deliveries, an RTU and a disconnect, then
    // pseudo-random scripts.
    inputs.push(vec![1, 0, 0, 0, 8, 1, 1, 1, 0, 0, 8, 0, 8, 0, 1, 3, 0, 8, 0, 5, 0, 8]);
    inputs.extend(random_inputs(4, 500, 300));
    for i in &inputs {
        roce_fuzz::cm::run(i);
    }
}
