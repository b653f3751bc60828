//! The ferroce runtime: worker lcores that poll DPDK ports, classify frames, drive the `roce`
//! engine and turn its output into frames; and the host interface through which applications
//! use queue pairs.

#![warn(missing_docs)]

pub mod area;
pub mod client;
pub mod config;
pub mod daemon;
pub mod host;
pub mod neighbor;
pub mod nic;
pub mod proto;
pub mod ring;
pub mod runtime;
pub mod shadow;
pub mod slots;
pub mod worker;

pub use host::{Buffer, Context, Mr, Verbs};
pub use roce::memory::MwType;
pub use runtime::{Runtime, StartError};
