#!/usr/bin/env bash
# One big pull, side by side (deploy/tests/cluster/bench_pull.py): the
# issue's node (the kubelet's image GC off, eviction at imagefs.available
# 30%, two workload pods, six old 25 MiB images) and a pod whose ~200 MiB
# image is pulled from the test bed's registry (about 35% to 77% in one
# step), on a fresh cluster per case: the kubelet alone, imagegc reacting
# at high 55 / low 45, imagegc with [kubernetes] (room before the pull),
# imagegc with gc.headroom. Prints pods evicted, seconds with
# DiskPressure, seconds until usage is back under the eviction line,
# images removed and the bytes the pods' images would take to pull again.
#
#   scripts/bench-pull.sh [--watch SECONDS] [--case NAME ...]
#   IMAGEGC_CLUSTER_RUNTIME=crio scripts/bench-pull.sh ...   on CRI-O
#
# Not run by CI (four clusters); CI runs the imagegc cases of
# deploy/tests/cluster/test_9_big_pull.py. Root on Debian 12; builds and
# installs what it needs as scripts/test-cluster.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/bench-pull.sh: the cluster mounts a filesystem and runs a kubelet: run as root" >&2
    exit 1
fi
. scripts/testbed-cluster.sh
prepare_cluster_suite
exec "$CLUSTER_PYTHON" deploy/tests/cluster/bench_pull.py "$@"
