"""Long scenario (not run by CI): the kubelet's own 5-minute image GC round
removing images beside imagegc.

  IMAGEGC_CLUSTER_LONG=1 scripts/test-cluster.sh -k kubelet_gc_round

The kubelet's image GC is turned on with its thresholds BELOW imagegc's
(kubelet 40/30, imagegc 55/45): unused images fill the image filesystem
to between the two high thresholds, so only the kubelet collects, and
imagegc must count every image the kubelet removed as removed by others
(`imagegc_images_removed_by_others_total`, `..._bytes_total`), and say
so in `imagegc plan`, while its journal holds none of them.

The kubelet runs its image GC at start and every 5 minutes after
(`StartGarbageCollection`: `wait.Until(..., ImageGCPeriod)`, 5 minutes);
the first attempt after a start usually fails with InvalidDiskCapacity
(TESTBED.md), so the scenario costs one period. Images it may remove must
have been detected before (`imageMinimumGCAge` counts from detection): the
fill comes before the kubelet's restart. CI runs the same counting with the
kubelet at its defaults, whose eviction manager removes within seconds
(test_7_beside_kubelet.py); the kubelet's GC at its defaults above imagegc's
thresholds, watched through a period: deploy/tests/cluster/bench_beside.py.

Nothing here assumes containerd: images are listed and sized over CRI.
"""

import time

import workloads as w
from cluster import IMAGEGC_IMAGE, MIB, PAUSE_IMAGE, wait_for
from conftest import record
from deploy import Deployment, metric

KUBELET_HIGH, KUBELET_LOW = 40, 30
HIGH, LOW = 55, 45
FILLER = 20 * MIB
# The kubelet's period, one failed first attempt, and a margin.
KUBELET_GC_WITHIN = 7 * 60
IMAGEGC_CONFIG = {"gc.high_threshold_percent": HIGH, "gc.low_threshold_percent": LOW, "gc.min_age": "1s",
                  "gc.usage_poll_interval": "5s"}


def listings(d):
    return metric(d.scrape(), "imagegc_cri_requests_total", method="ListImages", code="OK") or 0


def test_imagegc_counts_what_the_kubelet_gc_round_removes(cluster):
    base = {PAUSE_IMAGE, IMAGEGC_IMAGE}
    original = dict(cluster.kubelet_overrides)
    d = Deployment(cluster, "beside", "kustomize", IMAGEGC_CONFIG)
    d.apply()
    try:
        samples = d.scrape()
        # No kubelet file mounted (the default): its defaults are assumed.
        assert metric(samples, "imagegc_kubelet_config_read") == 0
        assert metric(samples, "imagegc_kubelet_image_gc_enabled") == 1
        assert metric(samples, "imagegc_images_removed_by_others_total") == 0
        # Unused images, to between the kubelet's high and imagegc's.
        f = w.Filler(cluster, "beside-fill", FILLER)
        while cluster.usage()[0] < KUBELET_HIGH + 3:
            f.one()
            assert f.count < 60, "the fill never reached the kubelet's high threshold"
        usage = cluster.usage()[0]
        assert usage < HIGH, f"the fill went to {usage}%, past imagegc's high {HIGH}%"
        # imagegc has listed every one of them (a poll every 5 s).
        seen = listings(d)
        wait_for("two more listings by imagegc", lambda: listings(d) >= seen + 2, 30, 1)
        before = w.cri_images(cluster)
        evictions_before = {e["metadata"]["uid"] for e in w.eviction_events(cluster)}
        started = time.monotonic()
        log = w.KubeletLog(cluster)
        w.restart_kubelet(cluster, {**original, "imageGCHighThresholdPercent": KUBELET_HIGH,
                                  "imageGCLowThresholdPercent": KUBELET_LOW, "imageMinimumGCAge": "1s"})
        wait_for("the kubelet's image GC to remove an image",
                 lambda: set(before) - set(w.cri_images(cluster)), KUBELET_GC_WITHIN, 2)
        record("beside: the kubelet's restart to its first removal", time.monotonic() - started)
        gone, by_imagegc, by_others, samples = d.removed_by_others(before)
        print(f"beside: fill to {usage}% with {f.count} images; the kubelet removed {len(gone)} "
              f"({sum(before[i] for i in gone)} bytes) in {time.monotonic() - started:.0f}s after its restart")
        assert by_imagegc == set(), f"imagegc removed {by_imagegc} below its high threshold"
        assert len(by_others) >= 1
        # The kubelet's log says so too (the witness test_7 relies on).
        assert sum("Removing image to free bytes" in line for line in log.removing()) >= len(by_others)
        assert metric(samples, "imagegc_removed_by_others_bytes_total") == sum(before[i] for i in by_others)
        assert metric(samples, "imagegc_last_removal_by_others_timestamp_seconds") > 0
        assert metric(samples, "image_garbage_collected_total", reason="space") == 0
        plan = d.exec("/imagegc", "plan", "--config", "/etc/imagegc/imagegc.toml").stdout
        assert f"another collector removed {len(by_others)} image(s)" in plan, plan
        assert PAUSE_IMAGE in cluster.images()
        assert w.evicted_pods(cluster) == []
        # The disk this scenario fills never reached the kubelet's eviction
        # line (other signals, memory on a busy test machine, are not this
        # scenario's: they are printed).
        new = [(e["reason"], e.get("message", "")) for e in w.eviction_events(cluster)
               if e["metadata"]["uid"] not in evictions_before]
        print(f"beside: eviction events during the scenario: {new}")
        assert not [(r, m) for r, m in new if r == "Evicted" or "imagefs" in m or "nodefs" in m], new
    finally:
        w.restart_kubelet(cluster, original)
        d.delete()
        w.clear_images(cluster, base)
        w.wait_no_disk_pressure(cluster, 90)
