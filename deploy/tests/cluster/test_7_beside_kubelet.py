"""Scenario 7: installed beside the kubelet's own image GC, left at its defaults.

What README's install step promises on a node where the kubelet's collector
cannot be turned off. The kubelet runs with its image GC at its defaults
(85/80, `imageMinimumGCAge` 2m) and its default eviction line
(imagefs.available 15%: 85% used); two workload pods run; old unused
images exist before the kubelet's restart, so that its image manager
detects them at start and may remove them once they are older than its
minimum age (the scenarios start then: about 2 minutes).

1. imagegc with the configuration it ships (high 80 / low 75, minimum age
   2m). Unused images fill the image filesystem through imagegc's high
   threshold on to where, were nothing removed, usage would be past the
   kubelet's high threshold and its eviction line (FILL_TO). imagegc keeps
   usage below 85% throughout (sampled every 0.25 s), so the kubelet,
   whichever of its paths looks (its 5-minute round or its eviction
   manager's reclaim every 10 s), finds nothing to do: its log shows no
   removal, imagegc counts no removal by others, every image gone is in
   imagegc's journal, no pod is evicted, the node never reports
   DiskPressure.
2. imagegc reconfigured above the kubelet (high 90 / low 85, the mistake
   `imagegc_high_threshold_above_eviction` reports). A fill past 85% makes
   the kubelet's eviction manager remove the old unused images; imagegc
   must count each as removed by others (`imagegc_images_removed_by_others_total`,
   `..._bytes_total`) and say so in `imagegc plan`, while its journal holds
   none of them. The kubelet's log, which case 1 reads to show that the
   kubelet removed nothing, shows these removals: the witness works.

The kubelet's 5-minute round removing images below imagegc's thresholds
waits out a period (its first attempt after a start fails on the image
filesystem's capacity, not known yet): long_kubelet_gc_round.py
(`IMAGEGC_CLUSTER_LONG=1 scripts/test-cluster.sh -k kubelet_gc_round`), and
the benchmark deploy/tests/cluster/bench_beside.py.

Cost: about 5 minutes (2 of them the kubelet's minimum age). Nothing here
assumes containerd: images are listed and sized over CRI.
"""

import math
import time

import pytest

import workloads as w
from cluster import IMAGEGC_IMAGE, MIB, PAUSE_IMAGE, bare, wait_for
from deploy import Deployment, metric

KUBELET_HIGH = w.KUBELET_DEFAULTS["imageGCHighThresholdPercent"]
# imagegc's shipped thresholds (deploy/imagegc.toml; test_0 checks they
# stay below the kubelet's default eviction line).
HIGH, LOW = 80, 75
# Case 2: imagegc above the kubelet's line.
ABOVE_HIGH, ABOVE_LOW = 90, 85
# The kubelet's minimum age (2m) from its restart, and a margin.
KUBELET_MIN_AGE = 120 + 10
# Image sizes, doubled on CRI-O, which keeps an image once where containerd
# keeps its blob and its unpacked snapshot: the same share of the disk each,
# in half the imports.
OLD = 25 * MIB
FILLER = 10 * MIB
# Old images up to here before the kubelet's restart.
OLD_TO = 66
# Case 1: where the fill would take usage without collection, past the
# kubelet's high threshold and its eviction line (both 85).
FILL_TO = 90
# One filler image every PACE seconds: about 2% of the disk each, so the
# fill climbs from imagegc's high to the kubelet's line in about 8 s.
PACE = 3.0


class Node:
    """The scenario's node once the kubelet has known the old images for
    longer than its minimum age."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.pods = []
        self.old = []
        self.cost = 0
        self.scale = 2 if cluster.runtime == "crio" else 1
        self.filler = FILLER * self.scale
        self.log = None
        self.d = Deployment(cluster, "beside", "kustomize")


def new_evictions(cluster, before):
    """Eviction events of the image or node filesystem since `before` (other
    signals, memory on a busy test machine, are not this scenario's)."""
    new = [(e["reason"], e.get("message", "")) for e in w.eviction_events(cluster)
           if e["metadata"]["uid"] not in before]
    print(f"beside: eviction events: {new}")
    return [(r, m) for r, m in new if r == "Evicted" or "imagefs" in m or "nodefs" in m]


@pytest.fixture(scope="module")
def node(cluster):
    base = {PAUSE_IMAGE, IMAGEGC_IMAGE}
    original = dict(cluster.kubelet_overrides)
    n = Node(cluster)
    try:
        for i in (1, 2):
            image = w.workload_image(cluster, f"beside-app{i}")
            n.pods.append((w.run_pod(cluster, f"beside-app{i}", image), image))
        w.wait_running(cluster, [p for p, _ in n.pods])
        n.cost = w.per_image_cost(cluster, n.filler)
        while cluster.usage()[0] < OLD_TO:
            n.old.append(w.unused_image(cluster, f"beside-old{len(n.old)}", OLD * n.scale))
            assert len(n.old) < 40, "the old images never reached OLD_TO"
        n.log = w.KubeletLog(cluster)
        w.restart_kubelet(cluster, {**original, **w.KUBELET_DEFAULTS})
        restarted = time.monotonic()
        n.d.apply()
        # imagegc first saw the old images at its first listing, the kubelet
        # at its restart: both minimum ages pass.
        wait_for("the old images older than both minimum ages",
                 lambda: time.monotonic() - restarted >= KUBELET_MIN_AGE, KUBELET_MIN_AGE + 10, 1)
        yield n
    finally:
        w.restart_kubelet(cluster, original)
        n.d.delete()
        w.delete_pods(cluster)
        w.clear_images(cluster, base)
        w.wait_no_disk_pressure(cluster, 90)


def test_at_the_kubelets_defaults_the_kubelet_finds_nothing_to_do(node, cluster):
    d = node.d
    samples = d.scrape()
    # No kubelet file mounted (the default): its defaults are assumed.
    assert metric(samples, "imagegc_kubelet_config_read") == 0
    assert metric(samples, "imagegc_kubelet_image_gc_enabled") == 1
    assert metric(samples, "imagegc_high_threshold_above_eviction") == 0
    config = d.exec("/imagegc", "check-config", "--config", "/etc/imagegc/imagegc.toml").stdout
    assert f"high_threshold_percent = {HIGH}\n" in config and f"low_threshold_percent = {LOW}\n" in config
    evictions_before = {e["metadata"]["uid"] for e in w.eviction_events(cluster)}
    present = set(cluster.image_ids())
    start_usage, capacity, _ = cluster.usage()
    assert start_usage < HIGH, f"usage {start_usage}% before the fill"
    steps = max(2, math.ceil((FILL_TO - start_usage) / 100 * capacity / node.cost))
    f = w.Filler(cluster, "beside-fill", node.filler)
    started = time.monotonic()
    timeline = [(0.0, start_usage)]
    pressure = []

    def sample():
        timeline.append((round(time.monotonic() - started, 2), cluster.usage()[0]))

    for _ in range(steps):
        next_at = time.monotonic() + PACE
        f.one()
        present |= cluster.image_ids()
        while time.monotonic() < next_at:
            sample()
            time.sleep(0.25)
        pressure.append(w.disk_pressure(cluster))
    # Two more of the eviction manager's 10 s looks.
    end = time.monotonic() + 25
    while time.monotonic() < end:
        sample()
        time.sleep(0.25)
    pressure.append(w.disk_pressure(cluster))
    would_be = start_usage + 100 * steps * node.cost / capacity
    peak = max(u for _, u in timeline)
    crossed = next((t for t, u in timeline if u >= HIGH), None)
    gone = present - cluster.image_ids()
    by_imagegc = d.removed_ids()
    samples = d.scrape()
    print(f"beside: usage {start_usage}% before the fill, {steps} images would take it to {would_be:.0f}%; "
          f"imagegc's high crossed at {crossed}s, peak {peak}%; {len(gone)} images gone; "
          f"import errors {f.errors[:3]}; timeline {timeline[::8]}")
    assert would_be >= KUBELET_HIGH + 2, f"the fill would only reach {would_be:.0f}%"
    assert crossed is not None, f"the fill never crossed imagegc's high {HIGH}%: {timeline}"
    assert peak < KUBELET_HIGH, f"usage reached {peak}%, the kubelet's threshold: {timeline[-60:]}"
    assert node.log.removing() == [], node.log.removing()
    assert metric(samples, "imagegc_images_removed_by_others_total") == 0
    assert gone and gone <= by_imagegc, f"gone but not in imagegc's journal: {gone - by_imagegc}"
    assert metric(samples, "image_garbage_collected_total", reason="space") >= 1
    assert not any(pressure), "the node reported DiskPressure"
    assert w.evicted_pods(cluster) == []
    assert not new_evictions(cluster, evictions_before)
    images = cluster.images()
    assert PAUSE_IMAGE in images
    for _, image in node.pods:
        assert image in images, f"{image}, in use, was removed"


def test_above_the_kubelets_line_imagegc_counts_what_the_kubelet_removes(node, cluster):
    d = node.d
    d.reconfigure({"gc.high_threshold_percent": ABOVE_HIGH, "gc.low_threshold_percent": ABOVE_LOW})
    samples = d.scrape()
    assert metric(samples, "imagegc_high_threshold_above_eviction") == 1
    assert metric(samples, "imagegc_images_removed_by_others_total") == 0
    before = w.cri_images(cluster)
    old_ids = {bare(i) for i in (cluster.images().get(ref) for ref in node.old) if i}
    assert old_ids, "no old image left for the kubelet to remove"
    # Young unused images past the kubelet's line, below imagegc's high.
    f = w.Filler(cluster, "above-fill", node.filler)
    peak = cluster.usage()[0]
    while cluster.usage()[0] < KUBELET_HIGH + 2 and not set(before) - set(w.cri_images(cluster)):
        peak = max(peak, f.one())
        before.update({i: s for i, s in w.cri_images(cluster).items() if i not in before})
        assert f.count < 30, "the fill never reached the kubelet's line"
    started = time.monotonic()
    wait_for("the kubelet to remove an old image", lambda: old_ids - set(w.cri_images(cluster)), 60, 1)
    gone, by_imagegc, by_others, samples = d.removed_by_others(before)
    print(f"beside, above: fill to {peak}% with {f.count} images; the kubelet removed {len(gone)} "
          f"({sum(before[i] for i in gone)} bytes) in {time.monotonic() - started:.0f}s; "
          f"pods evicted {w.evicted_pods(cluster)}")
    assert peak < ABOVE_HIGH, f"the fill went to {peak}%, past imagegc's high {ABOVE_HIGH}%"
    assert gone & by_imagegc == set(), f"imagegc removed {gone & by_imagegc} below its high threshold"
    assert by_others and by_others <= old_ids, f"{by_others} are not the old images {old_ids}"
    assert metric(samples, "imagegc_removed_by_others_bytes_total") == sum(before[i] for i in by_others)
    assert metric(samples, "imagegc_last_removal_by_others_timestamp_seconds") > 0
    plan = d.exec("/imagegc", "plan", "--config", "/etc/imagegc/imagegc.toml").stdout
    assert f"another collector removed {len(by_others)} image(s)" in plan, plan
    # The witness case 1 relies on.
    removing = node.log.removing()
    assert sum("Removing image to free bytes" in line for line in removing) >= len(by_others), removing
    assert PAUSE_IMAGE in cluster.images()
