//! The InfiniBand transport over RoCEv2, sans-IO: wire formats, ICRC, queue pairs, memory
//! regions, requester, responder and completer. No DPDK, no threads, no clock: time is an
//! argument, packets are byte slices in and `Transmit`s out (quinn-proto style).

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod cm;
pub mod engine;
pub mod memory;
pub mod pcap;
pub mod sim;
pub mod table;
pub mod types;
pub mod verbs;
pub mod wire;

pub use types::{Gid, Lkey, Msn, Pkey, Psn, Qkey, Qpn, Rkey};
