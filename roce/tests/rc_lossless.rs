//! RC on a lossless simulated link: random mixes of every opcode, in both directions, with
//! PSNs starting near the 2^24 wrap, sizes 0 B..1 MiB and every path MTU. Every WR must
//! complete in order with SUCCESS, target memory must equal the source, immediate data and
//! atomic results must be right.

use roce::engine::DeviceConfig;
use roce::sim::traffic::{OpKind, Traffic, TrafficSpec};
use roce::sim::{connect, ConnectOpts, LinkConfig, Pair, Rng};
use roce::verbs::Mtu;

const MTUS: [Mtu; 5] = [Mtu::M256, Mtu::M512, Mtu::M1024, Mtu::M2048, Mtu::M4096];

fn cfg() -> DeviceConfig {
    DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    }
}

fn run_seed(seed: u64, ops: usize, max_len: u32, kinds: &[OpKind]) {
    let mut rng = Rng::new(seed);
    let mtu = MTUS[(seed % 5) as usize];
    let near_wrap = |r: &mut Rng| 0x00ff_ffff - r.below(400) as u32;
    let psns = (near_wrap(&mut rng), near_wrap(&mut rng));
    let mem_len = 24 << 20;
    let mut p = Pair::new(cfg(), cfg(), LinkConfig::lossless(100, 1_000), seed);
    let o = ConnectOpts {
        mtu,
        psns,
        mem_len,
        ..Default::default()
    };
    let (a, b) = connect(&mut p, &o);
    let spec = TrafficSpec {
        ops_per_side: ops,
        max_len,
        kinds: kinds.to_vec(),
        bidirectional: true,
    };
    let mut t = Traffic::plan(&mut rng, &spec, mem_len as u64);
    let done = t.run(&mut p, [&a, &b], 60_000_000_000);
    if let Err(e) = t.verify([&a, &b], true) {
        panic!("seed {seed} mtu {mtu:?} psns {psns:x?} finished={done}: {e}");
    }
    assert!(done);
    let (dev, qp) = p.a.dev.counters();
    assert_eq!(dev.rx_malformed + dev.rx_icrc_encapsulated, 0);
    assert_eq!(
        qp.retransmitted_pkts, 0,
        "no retransmission on a lossless link"
    );
    assert_eq!(qp.local_ack_timeout_err, 0);
}

#[test]
fn random_mixes_of_every_opcode_complete_and_verify() {
    for seed in 0..60 {
        run_seed(seed, 40, 16 << 10, &OpKind::ALL);
    }
}

#[test]
fn large_messages_up_to_one_mib() {
    for seed in 100..110 {
        run_seed(seed, 12, 1 << 20, &OpKind::ALL);
    }
}

#[test]
fn zero_length_messages() {
    let mut p = Pair::new(cfg(), cfg(), LinkConfig::default(), 3);
    let (a, b) = connect(&mut p, &ConnectOpts::default());
    let spec = TrafficSpec {
        ops_per_side: 20,
        max_len: 0,
        kinds: vec![
            OpKind::Write,
            OpKind::WriteImm,
            OpKind::Read,
            OpKind::Send,
            OpKind::SendImm,
        ],
        bidirectional: true,
    };
    let mut t = Traffic::plan(&mut Rng::new(9), &spec, 1 << 20);
    assert!(t.run(&mut p, [&a, &b], 1_000_000_000));
    t.verify([&a, &b], true).unwrap();
}
