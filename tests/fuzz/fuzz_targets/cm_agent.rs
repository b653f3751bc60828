//! Fuzz target: `roce_fuzz::cm::run` (its module says what it checks).
#![cfg_attr(fuzzing, no_main)]

#[cfg(fuzzing)]
libfuzzer_sys::fuzz_target!(|data: &[u8]| roce_fuzz::cm::run(data));

/// Built outside `cargo fuzz` (as `cargo test --workspace` builds every binary): runs the
/// files named on the command line through the target once each.
#[cfg(not(fuzzing))]
fn main() {
    for f in std::env::args().skip(1) {
        roce_fuzz::cm::run(&std::fs::read(&f).expect("read input"));
    }
}
