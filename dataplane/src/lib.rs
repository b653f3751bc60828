//! The ferroce runtime: worker lcores that poll DPDK ports, classify frames, drive the `roce`
//! engine and turn its output into frames; and the host interface through which applications
//! use queue pairs.

#![warn(missing_docs)]

pub mod config;
pub mod neighbor;
