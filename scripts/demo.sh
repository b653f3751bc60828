#!/usr/bin/env bash
# The main job on the embedded default: two ferroce RNICs in one process joined back to back by
# a DPDK ring link (10.99.0.1 and 10.99.0.2, path MTU 4096), moving real RDMA traffic with
# rnic-perf (perftest's tests, loops and tables) - no NIC, hugepages or configuration needed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ferroce-tools --bin rnic-perf
PERF=target/release/rnic-perf
run() {
  echo
  echo "### rnic-perf $* --loopback"
  "$PERF" "$@" --loopback
}
# --baseline: each figure beside this machine's memcpy of the same 64 KiB, so a reader can
# tell whether the machine is behaving (figures vary threefold between machines of a kind).
run write_bw -s 65536 -n 20000 --report_gbits --baseline
run read_bw -s 65536 -n 20000 --report_gbits --baseline
run send_bw -s 65536 -n 20000 --report_gbits --baseline
run atomic_bw -A FETCH_AND_ADD -n 100000
run write_lat -s 8 -n 10000
run send_lat -s 8 -n 10000
echo
echo "Every table above is perftest's (ib_write_bw, ib_read_bw, ib_send_bw, ib_atomic_bw,"
echo "ib_write_lat, ib_send_lat); the last lines of each test are the two RNICs' counters, and"
echo "for the bandwidth tests the machine's memcpy of the message size, with each result as a"
echo "fraction of it."
