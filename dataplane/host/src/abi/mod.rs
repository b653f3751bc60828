//! The host interface's ABI: what an application and the worker share, byte for byte, and
//! nothing else. Slots are `repr(C)` integers checked when read ([`slots`]): the worker never
//! trusts what an application wrote. The layout is specified in docs/host-protocol.md; the C
//! client's `ferroce.h` mirrors it.

pub mod area;
mod control;
pub mod proto;
pub mod ring;
pub mod slots;

pub use control::*;
