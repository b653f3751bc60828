//! Data Center Bridging, sans-IO: PFC pause state, ETS scheduling, ECN marking and DCQCN
//! rate control. Like `roce`, it reads no clock and does no I/O.

#![deny(unsafe_code)]
#![warn(missing_docs)]
