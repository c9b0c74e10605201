"""Taking over from the kubelet's own image GC, side by side (not run by CI:
the kubelet's GC runs every 5 minutes, so each case watches for up to
--watch seconds, 12 minutes by default).

Each case gets a fresh cluster (its own kubelet configuration), two running
workload pods on their own images, old unused images, then a fill of
unused images to FILL (75) percent of the image filesystem, past the
eviction line of the last case, and watches:

  kubelet      the kubelet's image GC alone (high 60 / low 40)
  imagegc      imagegc alone (high 60 / low 40), the kubelet's GC off
  both         both on, the same thresholds
  eviction     the kubelet's GC off, evictionHard imagefs.available 30%,
               no imagegc: only the eviction manager frees space

and prints: the first removal after the fill (seconds), who removed it
(imagegc's journal names its removals; anything else is the kubelet's),
the final usage, the pods evicted, whether the pause image is still there.

  python3 bench_takeover.py [--watch SECONDS] [CASE...]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import workloads as w  # noqa: E402
from cluster import MIB, PAUSE_IMAGE, Cluster  # noqa: E402
from conftest import build_imagegc_image  # noqa: E402
from deploy import Deployment  # noqa: E402

HIGH, LOW, FILL = 60, 40, 75
GC_ON = {"imageGCHighThresholdPercent": HIGH, "imageGCLowThresholdPercent": LOW, "imageMinimumGCAge": "2m",
         "evictionHard": {"imagefs.available": "1%", "nodefs.available": "1%", "memory.available": "50Mi"}}
GC_OFF = {"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
          "evictionHard": {"imagefs.available": "1%", "nodefs.available": "1%", "memory.available": "50Mi"}}
EVICTION = {"imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99, "evictionPressureTransitionPeriod": "5s",
            "evictionHard": {"imagefs.available": "30%", "nodefs.available": "1%", "memory.available": "50Mi"}}
CASES = {
    "kubelet": (GC_ON, False),
    "imagegc": (GC_OFF, True),
    "both": (GC_ON, True),
    "eviction": (EVICTION, False),
}
IMAGEGC = {"gc.high_threshold_percent": HIGH, "gc.low_threshold_percent": LOW}


def run_case(name, watch):
    kubelet, with_imagegc = CASES[name]
    c = Cluster(os.environ["IMAGEGC_KUBERNETES_BIN"], os.environ["IMAGEGC_CONTAINERD_BIN"], kubelet)
    row = {"case": name}
    try:
        c.up()
        build_imagegc_image(c, os.environ["IMAGEGC_STATIC_BIN"])
        c.ensure_imagegc_image = lambda: None
        d = None
        if with_imagegc:
            d = Deployment(c, "bench", "kustomize", IMAGEGC)
            d.apply()
        for i in (1, 2):
            w.run_pod(c, f"app{i}", w.workload_image(c, f"bench-app{i}"))
        w.wait_running(c, ["app1", "app2"])
        for i in range(3):
            w.unused_image(c, f"old{i}", 40 * MIB)
        # Removals are watched from the start of the fill: a collector that
        # acts as soon as usage crosses high removes while the fill goes on
        # (a negative time: before the fill ended).
        present = set(c.images())
        removals = []  # (monotonic time, image reference)

        def look():
            now = set(c.images())
            for ref in present - now:
                removals.append((time.monotonic(), ref))
            present.intersection_update(now)

        f = w.Filler(c, "fill", 40 * MIB)
        crossed = None
        while c.usage()[0] < FILL:
            f.one()
            present.update(c.images())
            look()
            if crossed is None and c.usage()[0] >= HIGH:
                crossed = time.monotonic()
        filled = time.monotonic()
        end = filled + watch
        while time.monotonic() < end:
            look()
            if c.usage()[0] <= LOW:
                break
            time.sleep(2)
        look()
        first = by = None
        if removals:
            at, _ = min(removals)
            first = at - filled
            removed_by_imagegc = set()
            if d is not None:
                removed_by_imagegc = {t for e in d.history() for t in e.get("tags", [])}
            gone = {ref for _, ref in removals}
            by = "imagegc" if gone & removed_by_imagegc else "kubelet"
            if by == "imagegc" and gone - removed_by_imagegc:
                by = "both"
        row.update(first=first, by=by or "-", usage=c.usage()[0], evicted=len(w.evicted_pods(c)),
                   pause=PAUSE_IMAGE in c.images(),
                   crossed=None if crossed is None else crossed - filled)
    except Exception as e:  # noqa: BLE001 - one case's failure is its row
        row.update(error=str(e)[:200])
    finally:
        problems = c.down()
        if problems:
            row["teardown"] = problems
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--watch", type=float, default=720)
    parser.add_argument("cases", nargs="*", default=list(CASES))
    args = parser.parse_args()
    rows = []
    for name in args.cases:
        print(f"== {name}", flush=True)
        rows.append(run_case(name, args.watch))
        print(rows[-1], flush=True)
    print()
    print("times from the end of the fill (negative: during it)")
    print(f"{'case':10} {'high crossed':>13} {'first removal':>14} {'removed by':>11} {'final usage':>12} "
          f"{'pods evicted':>13} {'pause kept':>11}")
    for r in rows:
        if "error" in r:
            print(f"{r['case']:10} error: {r['error']}")
            continue
        first = "none" if r["first"] is None else f"{r['first']:+.0f}s"
        crossed = "-" if r["crossed"] is None else f"{r['crossed']:+.0f}s"
        print(f"{r['case']:10} {crossed:>13} {first:>14} {r['by']:>11} {str(r['usage']) + '%':>12} "
              f"{r['evicted']:>13} {'yes' if r['pause'] else 'NO':>11}")
    return 1 if any("error" in r or "teardown" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
