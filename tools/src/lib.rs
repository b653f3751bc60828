//! Shared code of the ferroce command-line tools (`rnicd`, `rnic-perf`, `rnic-ctl`,
//! `rnic-pcap`).

#![warn(missing_docs)]

pub mod pcap_tool;
pub mod perf;
pub mod rnic_opts;
