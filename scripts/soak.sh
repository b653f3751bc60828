#!/usr/bin/env bash
# The real soak (issue 26, docs/reliability.md): rnicd serving two RNICs joined by a DPDK ring
# link with fault injection on every frame, and rnic-perf client processes running a seeded
# mix of every test (RC/UC/UD, WRITE/READ/SEND/ATOMIC, 1 B .. 8 MiB, events, rdma_cm) with
# --verify, every tenth run with one process killed by SIGKILL mid-run. rnicd's memory and
# counters are sampled every second.
#
#   scripts/soak.sh MINUTES [rnic-soak options]    e.g. scripts/soak.sh 10 --seed 2
#
# Writes target/soak/{soak.csv,soak.png,runs.csv,summary.json,rnicd.log} (--out to change)
# and exits 0 only if every run ended as it should, rnicd came back to its idle state, no
# error beyond the injected faults was counted and its memory stayed flat.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 1 || ! $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; then
  echo "usage: scripts/soak.sh MINUTES [rnic-soak options]" >&2
  exit 2
fi
minutes=$1
shift
cargo build --release -q -p ferroce-tools --bin rnicd --bin rnic-perf --bin rnic-soak
exec target/release/rnic-soak --minutes "$minutes" --out target/soak "$@"
