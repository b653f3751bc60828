//! Set-up shared by the integration tests: each test crate includes this module with
//! `mod common;` and uses the part it needs (hence `dead_code` is allowed here).
#![allow(dead_code)]

use roce::engine::DeviceConfig;
use roce::sim::{connect, ConnectOpts, Endpoint, LinkConfig, Pair};
use roce::verbs::Mtu;

/// One second of virtual time, in ns.
pub const SEC: u64 = 1_000_000_000;

/// A device whose port MTU (4096) allows every path MTU the tests use.
pub fn cfg() -> DeviceConfig {
    DeviceConfig {
        port_mtu: Mtu::M4096,
        ..Default::default()
    }
}

/// Two [`cfg`] devices on a default link with fault seed `seed`, recording every frame.
pub fn recording_pair(seed: u64) -> Pair {
    recording_pair_of(cfg(), cfg(), seed)
}

/// Devices `a` and `b` on a default link with fault seed `seed`, recording every frame.
pub fn recording_pair_of(a: DeviceConfig, b: DeviceConfig, seed: u64) -> Pair {
    let mut p = Pair::new(a, b, LinkConfig::default(), seed);
    p.record = true;
    p
}

/// A [`recording_pair`] with one connection set up by `o`.
pub fn connected(seed: u64, o: &ConnectOpts) -> (Pair, Endpoint, Endpoint) {
    let mut p = recording_pair(seed);
    let (a, b) = connect(&mut p, o);
    (p, a, b)
}
