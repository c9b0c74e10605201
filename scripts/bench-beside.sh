#!/usr/bin/env bash
# Living beside the kubelet's own image GC left at its defaults (85/80,
# eviction at imagefs.available 15%), imagegc at 55/45, on a private
# single-node cluster (deploy/tests/cluster/bench_beside.py): the fill goes
# past imagegc's high threshold, and after the kubelet's first period the
# kubelet must have removed nothing (every image gone is in imagegc's
# journal, imagegc_images_removed_by_others_total 0) and evicted no pod.
#
#   scripts/bench-beside.sh [--watch SECONDS]
#
# Not run by CI: it watches through the kubelet's 5-minute period (7
# minutes by default); CI runs the kubelet at its defaults through its
# eviction manager's looks, with imagegc below it and above it
# (deploy/tests/cluster/test_7_beside_kubelet.py). Root on
# Debian 12; builds and installs what it needs as scripts/test-cluster.sh
# does.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/bench-beside.sh: the cluster mounts a filesystem and runs a kubelet: run as root" >&2
    exit 1
fi
. scripts/testbed-cluster.sh
prepare_cluster_suite
exec "$CLUSTER_PYTHON" deploy/tests/cluster/bench_beside.py "$@"
