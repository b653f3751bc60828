#!/usr/bin/env bash
# Fuzzing what ferroce reads from others (frames, captures, CM MADs, clients' post rings) with
# cargo-fuzz (libFuzzer, AddressSanitizer) on the machine's stable toolchain. The targets are
# in tests/fuzz/fuzz_targets, their bodies (and what each checks) in tests/fuzz/src.
#
#   scripts/fuzz.sh list                          the targets
#   scripts/fuzz.sh run TARGET [SECONDS] [ARGS]   fuzz one target (default 60 s); its corpus
#                                                 grows in tests/fuzz/corpus/TARGET, a crash
#                                                 lands in tests/fuzz/artifacts/TARGET; ARGS
#                                                 go to libFuzzer (e.g. -max_len=2000)
#   scripts/fuzz.sh smoke [RUNS]                  every target, RUNS executions each (default
#                                                 10000) from a fixed seed and an empty corpus
#                                                 (what `make test` runs)
#
# A crash found: replay it with `cargo run -p ferroce-fuzz --bin TARGET -- FILE` (the targets
# built without cargo-fuzz run the files they are given), fix it, and keep FILE in
# tests/fuzz/regressions/TARGET/, which the smoke test (`cargo test -p ferroce-fuzz`) runs.
set -euo pipefail
cd "$(dirname "$0")/../tests"

# cargo-fuzz passes -Zsanitizer=address, which RUSTC_BOOTSTRAP lets the stable compiler take.
# The workspace's release profile links with fat LTO, which loses the sanitizer coverage
# symbols (undefined __sancov_gen_*): fuzz builds go without it.
export RUSTC_BOOTSTRAP=1 CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16

if ! command -v cargo-fuzz >/dev/null; then
    echo "fuzz.sh: cargo-fuzz is not installed: cargo install --locked cargo-fuzz (make test-deps does)" >&2
    exit 1
fi

case "${1:-}" in
list)
    cargo fuzz list
    ;;
run)
    t=${2:?usage: fuzz.sh run TARGET [SECONDS] [ARGS]}
    secs=${3:-60}
    shift $(($# < 3 ? $# : 3))
    mkdir -p "fuzz/corpus/$t"
    cargo fuzz run "$t" "fuzz/corpus/$t" -- -max_total_time="$secs" -print_final_stats=1 "$@"
    ;;
smoke)
    runs=${2:-10000}
    corpus=$(mktemp -d)
    trap 'rm -rf "$corpus"' EXIT
    for t in $(cargo fuzz list); do
        mkdir -p "$corpus/$t"
        echo "== fuzz smoke: $t ($runs runs)"
        rc=0
        cargo fuzz run "$t" "$corpus/$t" -- -runs="$runs" -seed=1 -max_len=1024 \
            -print_final_stats=1 >"$corpus/$t.log" 2>&1 || rc=$?
        # libFuzzer's chatter hidden: the totals, and what a failure said.
        grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|Done)|panicked|ERROR|SUMMARY|Test unit written' "$corpus/$t.log" || true
        if [ "$rc" -ne 0 ]; then
            tail -40 "$corpus/$t.log" >&2
            echo "fuzz smoke: $t failed" >&2
            exit 1
        fi
    done
    ;;
*)
    sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
