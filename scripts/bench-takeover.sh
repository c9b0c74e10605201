#!/usr/bin/env bash
# Taking over from the kubelet's own image GC, side by side, on a private
# single-node cluster per case (deploy/tests/cluster/bench_takeover.py):
# the kubelet alone, imagegc alone, both, and the kubelet's GC off with only
# the eviction line (imagefs.available 30%). Prints a table: the first
# removal after the fill, who removed it, the final usage, the pods evicted,
# whether the pause image was kept.
#
#   scripts/bench-takeover.sh [--watch SECONDS] [kubelet|imagegc|both|eviction ...]
#
# Not run by CI: the kubelet's image GC runs every 5 minutes, so each case
# watches for up to 12 minutes (about 45 minutes for the four). Root on
# Debian 12; builds and installs what it needs as scripts/test-cluster.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/bench-takeover.sh: the cluster mounts a filesystem and runs a kubelet: run as root" >&2
    exit 1
fi
. scripts/testbed-cluster.sh
prepare_cluster_suite
exec "$CLUSTER_PYTHON" deploy/tests/cluster/bench_takeover.py "$@"
