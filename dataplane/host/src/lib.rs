//! ferroce's host interface: how an application in another process (or in the RNIC's own
//! process) uses an RNIC's queue pairs through shared memory, in two layers, the way io_uring
//! keeps its uapi header apart from liburing:
//!
//! - [`abi`]: only the shared layout both sides agree on: memory areas, rings and their slots,
//!   the index area, limits, and the control protocol's messages (rnicd's socket). No DPDK,
//!   no policy.
//! - [`app`]: the application's side: [`app::Verbs`] implemented by [`app::Client`] over the
//!   rings (producer of posts, consumer of completions and events), the connection to rnicd
//!   ([`app::remote`]) and the process-wide registry of moved pages ([`app::shadow`]).
//!
//! The worker's side (which decodes the untrusted slots and drives the engine) is in the
//! `dataplane` crate (`dataplane::host`). The client libraries (the Rust API, the C client,
//! the drop-in libibverbs) depend on this crate only.

#![warn(missing_docs)]

pub mod abi;
pub mod app;

pub use app::{Buffer, Channel, Client, Mr, Verbs};
pub use roce::memory::MwType;
