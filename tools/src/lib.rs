//! Shared code of the ferroce command-line tools (`rnicd`, `rnic-perf`, `rnic-ctl`,
//! `rnic-pcap`, `rnic-sim`).

#![warn(missing_docs)]

pub mod docgen;
pub mod dpdk_incast;
pub mod pcap_tool;
pub mod perf;
pub mod plot;
pub mod rnic_opts;
pub mod sim_tool;
pub mod soak;
pub mod sysfs;
