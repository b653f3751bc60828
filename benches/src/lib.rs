//! Helpers shared by ferroce's criterion benchmarks and end-to-end throughput runs (in
//! `benches/benches/`).

#![warn(missing_docs)]
