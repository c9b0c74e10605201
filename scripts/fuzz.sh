#!/usr/bin/env bash
# Fuzzes the configuration loader and the state file reader with cargo-fuzz
# (libFuzzer): each target runs for SECONDS (default 60), starting from the
# seeds in fuzz/corpus/<target>/ and keeping what it finds in fuzz/work/
# (not committed). Prints the executions per target. Exits 1 when a target
# crashes, panics or hangs; the input is then in fuzz/artifacts/<target>/
# and `cargo fuzz run <target> <that file>` replays it.
#
#   scripts/fuzz.sh [SECONDS]
#   scripts/fuzz.sh build     installs cargo-fuzz and builds the targets only
#                             (scripts/test.sh, in the background, early)
#
# Installs cargo-fuzz when it is missing (a few minutes: cargo compiles it).
# cargo-fuzz passes nightly-only -Z flags to rustc; RUSTC_BOOTSTRAP=1 makes a
# stable toolchain accept them, so no nightly is needed. FUZZ_SANITIZER
# picks the sanitizer (default address; `none` is faster).
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=
if [ "${1:-}" = build ]; then
    build_only=1
    shift
fi
seconds="${1:-60}"
sanitizer="${FUZZ_SANITIZER:-address}"
targets=(config state)

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "==> installing cargo-fuzz"
    started=$(date +%s)
    cargo install cargo-fuzz --locked
    echo "==> cargo-fuzz installed in $(($(date +%s) - started))s"
fi

export RUSTC_BOOTSTRAP=1
echo "==> building the fuzz targets (sanitizer: $sanitizer)"
started=$(date +%s)
cargo fuzz build --sanitizer "$sanitizer"
echo "==> built in $(($(date +%s) - started))s"
if [ -n "$build_only" ]; then
    exit 0
fi

failed=()
for target in "${targets[@]}"; do
    work="fuzz/work/$target"
    log="fuzz/work/$target.log"
    mkdir -p "$work"
    echo "==> fuzzing $target for ${seconds}s"
    status=0
    # -timeout: an input taking longer than 10 s is a hang, reported as a crash.
    cargo fuzz run --sanitizer "$sanitizer" "$target" "$work" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -max_len=8192 -timeout=10 -print_final_stats=1 >"$log" 2>&1 || status=$?
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
    corpus=$(find "$work" -type f | wc -l)
    if [ "$status" -ne 0 ]; then
        echo "!! $target failed (exit $status) after ${executions:-?} executions; the end of $log:"
        tail -n 40 "$log"
        failed+=("$target")
    else
        echo "$target: ${executions:-?} executions in ${seconds}s, $corpus inputs in $work"
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "==> fuzzing found a crash in: ${failed[*]}"
    exit 1
fi
echo "==> no crash"
