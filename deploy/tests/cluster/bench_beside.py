"""Living beside the kubelet's own image GC left at its defaults (not run by
CI: the kubelet's image GC runs at start and every 5 minutes, and its first
attempt after a start usually fails, so the case watches one period and a
margin, --watch seconds, 7 minutes by default; CI runs the kubelet at its
defaults through its eviction manager's looks,
deploy/tests/cluster/test_7_beside_kubelet.py).

A fresh cluster whose kubelet keeps its image GC on at its defaults
(imageGCHighThresholdPercent 85, imageGCLowThresholdPercent 80,
imageMinimumGCAge 2m) and its default eviction line (imagefs.available
15%), with imagegc at 55/45: thresholds below the kubelet's, so the kubelet
never finds work. Two running workload pods, old unused images, then a fill
of unused images past imagegc's high threshold (to FILL, 65%). Prints, after
watching through the kubelet's first period: the images gone, how many
imagegc's journal names (its own), how many it counted as removed by others
(imagegc_images_removed_by_others_total: must be 0, and every image gone
must be imagegc's), the pods evicted (must be none) and the final usage.

  python3 bench_beside.py [--watch SECONDS]

Environment as for scripts/test-cluster.sh (IMAGEGC_KUBERNETES_BIN,
IMAGEGC_CONTAINERD_BIN, IMAGEGC_STATIC_BIN); run as root.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import workloads as w  # noqa: E402
from cluster import MIB, PAUSE_IMAGE, Cluster  # noqa: E402
from conftest import build_imagegc_image  # noqa: E402
from deploy import Deployment, metric  # noqa: E402

HIGH, LOW, FILL = 55, 45, 65
IMAGEGC = {"gc.high_threshold_percent": HIGH, "gc.low_threshold_percent": LOW, "gc.min_age": "1s",
           "gc.usage_poll_interval": "5s"}


def run(watch):
    c = Cluster(os.environ["IMAGEGC_KUBERNETES_BIN"], os.environ["IMAGEGC_CONTAINERD_BIN"], w.KUBELET_DEFAULTS)
    row = {}
    try:
        c.up()
        kubelet_started = time.monotonic()
        build_imagegc_image(c, os.environ["IMAGEGC_STATIC_BIN"])
        c.ensure_imagegc_image = lambda: None
        d = Deployment(c, "beside", "kustomize", IMAGEGC)
        d.apply()
        for i in (1, 2):
            w.run_pod(c, f"app{i}", w.workload_image(c, f"beside-app{i}"))
        w.wait_running(c, ["app1", "app2"])
        for i in range(3):
            w.unused_image(c, f"old{i}", 40 * MIB)
        present = set(c.image_ids())
        f = w.Filler(c, "fill", 40 * MIB)
        while c.usage()[0] < FILL and f.count < 40:
            f.one()
            present |= c.image_ids()
        # Through the kubelet's first period after its start, and a margin.
        end = kubelet_started + watch
        while time.monotonic() < end:
            present |= c.image_ids()
            time.sleep(5)
        gone = present - c.image_ids()
        by_imagegc = d.removed_ids()
        samples = d.scrape()
        row.update(gone=len(gone), by_imagegc=len(gone & by_imagegc), not_imagegc=len(gone - by_imagegc),
                   counted_by_others=metric(samples, "imagegc_images_removed_by_others_total"),
                   evicted=len(w.evicted_pods(c)), usage=c.usage()[0], pause=PAUSE_IMAGE in c.images(),
                   watched=round(time.monotonic() - kubelet_started))
    except Exception as e:  # noqa: BLE001 - reported as the result
        row.update(error=str(e)[:300])
    finally:
        problems = c.down()
        if problems:
            row["teardown"] = problems
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--watch", type=float, default=420)
    args = parser.parse_args()
    row = run(args.watch)
    print(row)
    ok = ("error" not in row and "teardown" not in row and row["not_imagegc"] == 0
          and row["counted_by_others"] == 0 and row["evicted"] == 0 and row["pause"])
    print("the kubelet's GC at its defaults found no work beside imagegc" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
