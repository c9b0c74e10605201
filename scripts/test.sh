#!/usr/bin/env bash
# Runs every check and test imagegc has: formatting, lints, unit and
# integration tests, the end-to-end tests on every runtime of the matrix
# (Debian's containerd 1.6, containerd 2.x and CRI-O, each started privately
# by the tests on loop-mounted filesystems, so this must run as root), the
# cluster suite (a single-node Kubernetes running the manifests,
# scripts/test-cluster.sh, on containerd and again on CRI-O), the deployment
# checks, the systemd unit started in a private systemd
# (scripts/test-systemd.sh) and a time-boxed fuzz
# pass (IMAGEGC_SKIP_FUZZ=1 skips it). Installs what a fresh Debian 12 machine lacks, and builds containerd
# 2.x and CRI-O from their Go modules (kept under target/runtimes).
set -euo pipefail
cd "$(dirname "$0")/.."

# Each phase's header says when it started (minutes:seconds into the run),
# so that a run cut short by a time limit still shows where the time went.
phase() {
    printf '==> [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"
}

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: the end-to-end tests mount filesystems and run containerd: run as root" >&2
    exit 1
fi

. scripts/testbed-deps.sh
. scripts/testbed-runtimes.sh
. scripts/testbed-deploy-tools.sh
install_testbed_deps
install_deploy_packages

# Built in the background at the lowest CPU priority, beside the phases
# below (the runtimes' build first), which leave a core idle much of the
# time (downloads, tests waiting on runtimes, timers and each other): the
# cluster suites' tools from their Go modules (Kubernetes, etcd, helm,
# crictl, Prometheus: about 10 minutes on a cold machine), the static
# imagegc the systemd test, the cluster suites
# and the deployment checks run (4-6 minutes cold; target/<musl>/release
# and target/release, whose locks the phases' debug builds do not take),
# and the systemd test's node rootfs (debootstrap: 73-133 s the first
# time, mostly downloads); later, beside the cluster suites, the
# deployment checks and the fuzz pass (below). Each is waited for before
# the phase that needs it; one that failed fails the run with its log.
# Seconds each when already built.
declare -A background=()
beside() { # NICE NAME COMMAND...: runs COMMAND in a session of its own
    local nice=$1 name=$2
    shift 2
    # A session of its own is a scheduling group of its own (the kernel's
    # autogroup, on wherever the CPU controller is not in use), and groups
    # share the CPU as equals whatever their tasks' nice: at nice 19 alone,
    # each background build took as much CPU as all the phases together.
    # The group's own nice (/proc/PID/autogroup) sets its share; nice
    # orders its tasks.
    # shellcheck disable=SC2016 # expanded by the inner shell
    setsid bash -c 'echo "$1" 2>/dev/null >"/proc/$$/autogroup" || true; exec nice -n "$@"' \
        background "$nice" "$@" >"target/background-$name.log" 2>&1 &
    background[$name]=$!
}
in_background() { # NAME COMMAND...: at the lowest priority
    beside 19 "$@"
}
wait_background() { # NAME [--log]: --log shows the whole log, not its headers
    local name=$1 status=0 started=$SECONDS
    wait "${background[$name]}" || status=$?
    unset "background[$name]"
    phase "background job $name: waited $((SECONDS - started))s, exit $status (target/background-$name.log)"
    if [ "${2:-}" = --log ]; then
        cat "target/background-$name.log"
    else
        grep '^==>' "target/background-$name.log" || true
    fi
    if [ "$status" -ne 0 ]; then
        [ "${2:-}" = --log ] || tail -n 60 "target/background-$name.log"
        exit 1
    fi
}
stop_background() {
    local pid
    for pid in "${background[@]}"; do
        kill -- "-$pid" 2>/dev/null || true
    done
}
trap stop_background EXIT
mkdir -p target
in_background cluster-tools bash -euo pipefail -c '. scripts/testbed-cluster.sh; build_cluster_tools'
in_background systemd-rootfs scripts/test-systemd.sh --rootfs
in_background static-imagegc bash -euo pipefail -c '. scripts/testbed-cluster.sh; build_static_imagegc'

phase "the runtimes (scripts/testbed-runtimes.sh)"
build_testbed_runtimes

phase "cargo fmt --check"
cargo fmt --all -- --check
phase "cargo clippy (the package and its test kit, crates/imagegc-testkit)"
cargo clippy --locked --workspace --all-targets -- -D warnings
phase "cargo check of the library and binary alone (without dev-dependencies: the daemon never uses the test kit)"
cargo check --locked --lib --bins
phase "cargo check without the default features (no Kubernetes client: a pure CRI agent)"
cargo check --locked --lib --bins --no-default-features
phase "cargo test (unit and integration tests, the test kit's own, benches and examples as tests)"
# Integration tests: tests/NAME.rs and tests/NAME/main.rs; the end-to-end
# suite (tests/e2e) runs below, once per runtime.
targets=()
for test in tests/*.rs tests/*/main.rs; do
    name=${test#tests/}
    name=${name%/main.rs}
    name=${name%.rs}
    [ "$name" = e2e ] || targets+=(--test "$name")
done
# Tests that need root are #[ignore]d for a plain `cargo test`; run here.
# The invariant harness (tests/invariant) attacks the daemon with 300
# seeded iterations here (about 2 minutes), 50 in a plain `cargo test`; a
# failure prints the seed that replays it.
export IMAGEGC_INVARIANT_ITERATIONS=300
# --workspace adds the test kit's unit tests (the fake runtime, the OCI
# builder, the test bed's helpers).
cargo test --locked --workspace --lib --bins "${targets[@]}" -- --include-ignored
# The bench targets alone (`--benches` would also run the library's unit
# tests again, about a minute: the line above ran them all).
cargo test --locked --bench '*' --examples
# The end-to-end suite once per runtime, each timed: a runtime that cannot
# be built or started fails its suite with the reason.
cargo test --locked --test e2e --no-run
suite_times=()
for runtime in containerd_1_6 containerd_2 crio; do
    phase "end-to-end tests on $runtime"
    started=$SECONDS
    # (The test bed's own unit tests run with the test kit's, above.)
    cargo test --locked --test e2e -- --include-ignored "::$runtime"
    suite_times+=("$runtime $((SECONDS - started))s")
done
phase "end-to-end suite times: ${suite_times[*]}"
# The systemd unit as README's "With systemd" installs it, started in a
# private systemd (systemd-nspawn) on Debian's containerd, with its sandbox:
# cycles, reload, restart, stop, and the Kubernetes and registry drop-ins.
# About 50 s with the node's rootfs cached under target/systemd-testbed;
# debootstrap adds 73-133 s the first time (measured on 2 cores). The
# static imagegc and crictl it builds are the cluster suite's, which then
# finds them built.
wait_background systemd-rootfs
wait_background static-imagegc
phase "systemd unit (scripts/test-systemd.sh)"
started=$SECONDS
scripts/test-systemd.sh
phase "systemd unit time: $((SECONDS - started))s"
# imagegc deployed as users deploy it (kubectl apply -k, helm install) on a
# private single-node Kubernetes cluster, and its scenarios: the eviction
# race, the image filesystem, restarts (deploy/tests/cluster/). Builds
# Kubernetes, etcd, helm, crictl and Prometheus from their Go modules once.
wait_background cluster-tools
# Beside the cluster suites, which mostly wait on the kubelet (25 minutes):
# the deployment checks (scripts/check-deploy.sh: their tools, with the
# cluster tools' helm, then 4-5 minutes, most of it the live Prometheus
# scenario waiting on alerts), at the phases' priority, and the fuzz pass
# (scripts/fuzz.sh: cargo-fuzz and the instrumented targets, about 5
# minutes cold, then 60 s a target, however much CPU it gets), at the
# lowest. They share nothing with the cluster's node: their own ports
# (free ones, on 127.0.0.1), temporary directories, target directories and
# podman's own image store, and no network set-up. Their logs are shown
# when they are waited for, at the end.
if [ -x scripts/check-deploy.sh ]; then
    beside 0 deploy-checks scripts/check-deploy.sh
fi
if [ -z "${IMAGEGC_SKIP_FUZZ:-}" ]; then
    in_background fuzz bash -euo pipefail -c 'scripts/fuzz.sh build && scripts/fuzz.sh 60'
fi
phase "cluster suite (scripts/test-cluster.sh)"
started=$SECONDS
scripts/test-cluster.sh
phase "cluster suite time: $((SECONDS - started))s"
# On a node running CRI-O with a split image store, the scenarios whose
# outcome depends on the runtime: the deployment (kustomize; Helm's
# rendering is the same on either), the eviction race, the image
# filesystem (the split store is CRI-O's alone), README's install with
# CRI-O's component and values file, the pods' images kept, the big
# pull made room for before it (sized by the repository's history, and by
# its registry's manifest), and the upgrade from release 0.1.0 and back
# with kustomize (its image cached by the run above; Helm's is the same on
# either runtime). About 8 minutes. The rest (the controls
# without imagegc, the restarts, beside the kubelet's own collector, the
# other big pulls) passed on CRI-O too and need no CI time twice: the
# whole suite there is `IMAGEGC_CLUSTER_RUNTIME=crio scripts/test-cluster.sh`
# (about 14 minutes).
phase "cluster suite on CRI-O (IMAGEGC_CLUSTER_RUNTIME=crio scripts/test-cluster.sh, the runtime's scenarios)"
started=$SECONDS
c=deploy/tests/cluster
IMAGEGC_CLUSTER_RUNTIME=crio IMAGEGC_CLUSTER_SCENARIOS="$c/test_1_deploy.py::test_deploy_confined_scraped_and_collects_by_age[kustomize]
    $c/test_2_eviction.py::test_imagegc_frees_before_the_kubelet_evicts
    $c/test_3_image_fs.py
    $c/test_5_readme.py
    $c/test_6_kubernetes.py::test_pods_on_the_node_keep_their_images
    $c/test_9_big_pull.py::test_a_pod_watching_imagegc_makes_room_before_the_pull
    $c/test_9_big_pull.py::test_a_repository_never_seen_is_sized_by_its_registrys_manifest
    $c/test_8_upgrade.py::test_an_upgrade_from_the_last_release_keeps_its_history_and_images_and_rolls_back[kustomize]" \
    scripts/test-cluster.sh
phase "cluster suite on CRI-O time: $((SECONDS - started))s"
if [ -x scripts/check-deploy.sh ]; then
    # The static release binary the cluster suites built (what the
    # Containerfile ships): the checks build nothing more of it.
    wait_background deploy-checks --log
fi
if [ -z "${IMAGEGC_SKIP_FUZZ:-}" ]; then
    wait_background fuzz --log
fi
phase "all checks passed"
