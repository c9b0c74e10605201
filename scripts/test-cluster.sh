#!/usr/bin/env bash
# The cluster suite: imagegc deployed as users deploy it (kubectl apply -k,
# helm install) on a private single-node Kubernetes cluster on 127.0.0.1,
# and the scenarios of deploy/tests/cluster/ run against it (pytest).
#
#   scripts/test-cluster.sh [PYTEST ARGS...]    e.g. -k eviction
#   IMAGEGC_CLUSTER_RUNTIME=crio scripts/test-cluster.sh ...   the node on CRI-O
#   IMAGEGC_CLUSTER_SCENARIOS="FILE::TEST ..." scripts/test-cluster.sh   those alone
#   IMAGEGC_CLUSTER_LONG=1 scripts/test-cluster.sh ...   also the scenarios
#       that wait out the kubelet's 5-minute image GC period
#       (deploy/tests/cluster/long_*.py; not run by CI)
#
# The node's runtime is containerd 2.x, or with IMAGEGC_CLUSTER_RUNTIME=crio
# CRI-O with a split image store (its images and the containers' writable
# layers on two loop-mounted filesystems; deploy/tests/cluster/cluster.py).
#
# Run as root on Debian 12. Installs what is missing (apt: runc, the CNI
# plugins, busybox-static, iptables, openssl, e2fsprogs; pip: pytest and
# PyYAML into target/cluster-venv), builds Kubernetes, etcd, helm and crictl
# (scripts/testbed-kubernetes.sh) and containerd 2.x
# (scripts/testbed-runtimes.sh) from their Go modules when not built yet,
# the static imagegc binary (musl, or static glibc where the musl target
# cannot be installed) and takes Prometheus out of Debian's package. The
# cluster lives in /tmp/igck-XXXXXX, containerd's root on its own 1 GiB
# loop-mounted ext4, and is removed at the end with everything the kubelet
# left outside it.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test-cluster.sh: the cluster mounts a filesystem and runs a kubelet: run as root" >&2
    exit 1
fi
started=$SECONDS
. scripts/testbed-cluster.sh
prepare_cluster_suite

suite_started=$SECONDS
status=0
paths=(deploy/tests/cluster)
# IMAGEGC_CLUSTER_SCENARIOS: the scenarios to run (pytest node ids), instead
# of them all.
if [ -n "${IMAGEGC_CLUSTER_SCENARIOS:-}" ]; then
    read -r -d '' -a paths <<<"$IMAGEGC_CLUSTER_SCENARIOS" || true
fi
if [ -n "${IMAGEGC_CLUSTER_LONG:-}" ]; then
    paths+=(deploy/tests/cluster/long_*.py)
fi
# (A scenario still running after 15 minutes fails: conftest.py.)
"$CLUSTER_PYTHON" -m pytest -p no:cacheprovider -v -rA --durations=0 "${paths[@]}" "$@" || status=$?
echo "==> cluster suite: $((SECONDS - suite_started))s (exit $status); with prerequisites $((SECONDS - started))s"
exit "$status"
