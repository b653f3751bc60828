//! Data Center Bridging, sans-IO: PFC pause state and the PFC watchdog ([`pfc`]), ETS
//! scheduling ([`ets`]), ECN marking ([`ecn`]), DCQCN rate control ([`dcqcn`]) and a per-QP
//! pacer ([`limiter`]), and a shared-buffer switch model ([`switch`]). Like `roce`, it reads no clock and does no I/O: time is an argument
//! (nanoseconds), so every rule is tested on simulated time. Facts and both DCQCN parameter
//! sets: ../shared/reference/dcb.md and docs/dcb.md.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod dcqcn;
pub mod ecn;
pub mod ets;
pub mod limiter;
pub mod pfc;
pub mod sim;
pub mod switch;
