"""One big pull, side by side (not run by CI: six fresh clusters, about
10 minutes on containerd; CI runs deploy/tests/cluster/test_9_big_pull.py).

The issue's node and pull (test_9_big_pull.py: the kubelet's image GC
off, eviction at imagefs.available 30%, two workload pods, six unused
25 MiB images, then a pod whose ~200 MiB image is pulled from the private
registry: about 35% to 77% in one step), once per case, each on a fresh
cluster:

  kubelet alone   no imagegc (the control)
  reacting        imagegc at high 55 / low 45, neither feature
  (a) pods        imagegc with [kubernetes] (room before the pull;
                  needs kubernetes.room_before_pulls in the engine)
  (b) headroom    imagegc with gc.headroom = true
and, in the shape CI's case (b) runs (the largest pull headroom covers:
~120 MiB, a quarter of the disk, onto a node at 51%), headroom and the
kubelet alone.

The imagegc cases first pull big:1 (same size) while imagegc runs, as the
history. Once the old images are there the kubelet is restarted with
imageMinimumGCAge 1s so that they are older than its minimum age too, as
in the issue: its eviction manager's reclaim may remove them before it
evicts. After the pod on big:2 is Running, --watch seconds more (60 by
default: six of the eviction manager's looks). Prints one row per case:
pods evicted, seconds the node reported DiskPressure, seconds from the
first crossing of the eviction line until usage was back under it,
images removed, and the bytes the node's pods' images that went would
take to pull again (CRI sizes; 0 where no pod's image went).

  python3 bench_pull.py [--watch SECONDS] [--case NAME ...]

Environment as for scripts/test-cluster.sh (IMAGEGC_KUBERNETES_BIN,
IMAGEGC_CONTAINERD_BIN, IMAGEGC_STATIC_BIN, IMAGEGC_CLUSTER_RUNTIME,
IMAGEGC_CRIO_BIN); run as root.
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))

import test_9_big_pull as t  # noqa: E402
import workloads as w  # noqa: E402
from cluster import MIB, Cluster  # noqa: E402
from conftest import build_imagegc_image  # noqa: E402

# name: (imagegc's settings or None, the shape)
CASES = {"kubelet alone": (None, t.ISSUE), "reacting": (t.REACTING, t.ISSUE), "(a) pods": (t.WITH_PODS, t.ISSUE),
         "(b) headroom": (t.WITH_HEADROOM, t.ISSUE),
         # What CI's case (b) runs: the largest pull gc.headroom covers.
         "(b) headroom, a quarter": (t.WITH_HEADROOM, t.QUARTER),
         "kubelet alone, a quarter": (None, t.QUARTER)}


def run(name, case, watch):
    settings, shape = case
    runtime = os.environ.get("IMAGEGC_CLUSTER_RUNTIME") or "containerd"
    c = Cluster(os.environ["IMAGEGC_KUBERNETES_BIN"], os.environ["IMAGEGC_CONTAINERD_BIN"], runtime=runtime,
                crio_bin=os.environ.get("IMAGEGC_CRIO_BIN"))
    row = {"case": name}
    try:
        c.up()
        build_imagegc_image(c, os.environ["IMAGEGC_STATIC_BIN"])
        c.ensure_imagegc_image = lambda: None
        t.WATCH = watch
        d = t.deploy(c, "bench", settings) if settings is not None else None
        figures, p, pods = t.big_pull(c, "bench", d, shape, kubelet_min_age="1s")
        named = {container["image"] for pod in c.kubectl_json("get", "pods")["items"]
                 for container in pod["spec"]["containers"]}
        gone = figures["gone"]
        row.update(evicted=len(figures["evicted"]), disk_pressure_s=figures["disk_pressure_s"],
                   back_under_line_s=p.past_line(), peak=figures["peak"], images_removed=len(gone),
                   repull_mib=round(sum(size for ref, size in gone.items() if ref in named) / MIB, 1),
                   old_removed=figures["old_removed"], prepared=figures["prepared"],
                   to_running_s=figures["to_running_s"], pods_images_gone=[ref for ref in gone if ref in named])
    except Exception as e:  # noqa: BLE001 - reported as the result
        row.update(error=str(e)[:500])
    finally:
        problems = c.down()
        if problems:
            row["teardown"] = problems
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--watch", type=float, default=60)
    parser.add_argument("--case", action="append", choices=list(CASES))
    args = parser.parse_args()
    rows = [run(name, CASES[name], args.watch) for name in (args.case or CASES)]
    columns = ["case", "evicted", "disk_pressure_s", "back_under_line_s", "peak", "images_removed",
               "repull_mib", "old_removed", "prepared", "to_running_s"]
    print(" | ".join(columns))
    for row in rows:
        print(" | ".join(str(row.get(k, "-")) for k in columns))
    for row in rows:
        if "error" in row or "teardown" in row:
            print(f"{row['case']}: {row.get('error', '')} {row.get('teardown', '')}")
    for row in rows:
        print(row)
    return 0 if all("error" not in row and "teardown" not in row for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
