#!/usr/bin/env bash
# Runs imagegc's benchmarks and prints their figures (BENCHMARKS.md says
# what each measures, its target, and the figures on the reference machine).
#
#   scripts/bench.sh                 every bench, once (about 5 minutes once built;
#                                    reclaim on three runtimes took 191 s of it here)
#   scripts/bench.sh planner state   only these
#   BENCH_RUNS=3 scripts/bench.sh    each bench three times, for medians and spread
#
# Benches: planner state reclaim cycle footprint.
# reclaim and cycle start private runtimes on loop-mounted filesystems, like
# the end-to-end tests: they must run as root, with containerd, runc, ctr,
# mkfs.ext4, losetup and gcc (installed here with apt-get when missing).
# reclaim runs on every runtime of the test bed's matrix: Debian's
# containerd 1.6, containerd 2.x and CRI-O (with conmon, skopeo and the
# registry, installed here too); containerd 2.x and CRI-O are built from
# their Go modules the first time (scripts/testbed-runtimes.sh; kept under
# target/runtimes or $IMAGEGC_RUNTIMES_DIR). `cargo bench --bench reclaim --
# crio` (or containerd_1_6, containerd_2, and shared or unshared) runs part
# of it.
# Builds the release binary first (reclaim and footprint run it).
# Full output goes to target/bench-logs/; the summary lines are printed at
# the end. Other work on the machine skews the timings: run it idle.
set -euo pipefail
cd "$(dirname "$0")/.."

all=(planner state reclaim cycle footprint)
selected=("$@")
if [ ${#selected[@]} -eq 0 ]; then
    selected=("${all[@]}")
fi
for bench in "${selected[@]}"; do
    case " ${all[*]} " in
        *" $bench "*) ;;
        *) echo "scripts/bench.sh: unknown bench '$bench' (choose from: ${all[*]})" >&2; exit 2 ;;
    esac
done
runs="${BENCH_RUNS:-1}"

needs_root=()
for bench in "${selected[@]}"; do
    case "$bench" in reclaim | cycle) needs_root+=("$bench") ;; esac
done
if [ ${#needs_root[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "scripts/bench.sh: ${needs_root[*]} start containerd on loop-mounted filesystems: run as root" >&2
        echo "(or choose benches that do not: scripts/bench.sh planner state footprint)" >&2
        exit 1
    fi
    . scripts/testbed-deps.sh
    install_testbed_deps
fi
case " ${selected[*]} " in
    *" reclaim "*)
        . scripts/testbed-runtimes.sh
        build_testbed_runtimes
        echo "==> reclaim runs on containerd 1.6, containerd 2.x and CRI-O"
        ;;
esac

echo "==> machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), \
$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "==> cargo build --release --bin imagegc"
cargo build --locked --release --bin imagegc
echo "==> building the benches"
bench_args=()
for bench in "${selected[@]}"; do bench_args+=(--bench "$bench"); done
cargo bench --locked --no-run "${bench_args[@]}"

logs=target/bench-logs
mkdir -p "$logs"
for bench in "${selected[@]}"; do rm -f "$logs/$bench"-*.log; done
started=$(date +%s)
for run in $(seq 1 "$runs"); do
    for bench in "${selected[@]}"; do
        log="$logs/$bench-$run.log"
        echo "==> $bench (run $run of $runs; load $(cut -d' ' -f1-3 /proc/loadavg)); full output in $log"
        set +e
        cargo bench --locked --bench "$bench" 2>&1 | tee "$log" |
            grep -v -E '^(testbed |Benchmarking |Found [0-9]+ outliers|  [0-9]+ \([0-9.]+%\) (high|low) )|^ +(change:|Performance has|No change in|Change within)'
        status=("${PIPESTATUS[@]}")
        set -e
        if [ "${status[0]}" -ne 0 ]; then
            echo "scripts/bench.sh: $bench failed; see $log" >&2
            exit 1
        fi
    done
done

echo
echo "==> summary ($runs run(s), $(($(date +%s) - started)) s; load now $(cut -d' ' -f1-3 /proc/loadavg))"
for bench in "${selected[@]}"; do
    cat "$logs/$bench"-*.log | grep -E '^(planner:|state:|reclaim/)|^(cycle/[a-z]+|footprint): .*(target|VmHWM)' || true
done
