//! The ferroce runtime: worker lcores that poll DPDK ports, classify frames, drive the `roce`
//! engine and turn its output into frames; the worker's side of the host interface
//! ([`host`]), through which applications use queue pairs; and rnicd's daemon.
//!
//! The host interface's shared layout and the application's side are in `ferroce-host`
//! (re-exported here as [`abi`] and [`app`]), which does not depend on DPDK.

#![warn(missing_docs)]

pub mod config;
pub mod daemon;
pub mod doorbell;
pub mod fault;
pub mod host;
pub mod local;
pub mod neighbor;
pub mod nic;
pub mod runtime;
pub mod switch;
pub mod worker;

pub use ferroce_host::{abi, app};
pub use ferroce_host::{Buffer, Mr, Verbs};
pub use local::Context;
pub use roce::memory::MwType;
pub use runtime::{Runtime, StartError};
