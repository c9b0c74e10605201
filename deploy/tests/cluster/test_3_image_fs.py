"""Scenario 3: the runtime's root is on a filesystem of its own (the 1 GiB
loop-mounted ext4). The shipped manifests (no gc.image_fs_path, the
runtime's root mounted at its node path) measure that filesystem, not the
machine's disk. A wrong gc.image_fs_path (the state directory, on the
machine's disk) is reported as a mismatch, and no space pass runs on it."""

import os

import workloads as w
from cluster import FS_SIZE, IMAGEGC_IMAGE, MIB, PAUSE_IMAGE, wait_for
from deploy import Deployment, metric


def test_shipped_manifests_measure_the_runtime_filesystem(cluster):
    d = Deployment(cluster, "fs", "kustomize")
    d.apply()
    try:
        def capacity():
            return metric(d.scrape(), "imagegc_image_filesystem_capacity_bytes")
        got = wait_for("imagegc_image_filesystem_capacity_bytes", capacity, 30, 1)
        root = os.statvfs("/")
        root_capacity = root.f_blocks * root.f_frsize
        assert abs(got - FS_SIZE) < 0.1 * FS_SIZE, f"capacity {got}, the loop filesystem has {FS_SIZE}"
        assert abs(got - root_capacity) > 0.1 * root_capacity, "imagegc measures the machine's disk"
        assert metric(d.scrape(), "imagegc_image_fs_mismatch") in (None, 0.0)
    finally:
        d.delete()


def test_a_wrong_image_fs_path_is_reported_and_frees_nothing(cluster):
    unused = [w.unused_image(cluster, f"mismatch-{i}", 8 * MIB) for i in range(3)]
    # The state directory, on the machine's disk: not the runtime's.
    d = Deployment(cluster, "mismatch", "kustomize", {
        "gc.image_fs_path": "/var/lib/imagegc", "gc.high_threshold_percent": 2,
        "gc.low_threshold_percent": 1, "gc.min_age": "1s", "gc.interval": "5s",
        "gc.usage_poll_interval": "5s"})
    d.apply()
    try:
        wait_for("imagegc_image_fs_mismatch 1",
                 lambda: metric(d.scrape(), "imagegc_image_fs_mismatch") == 1.0, 30, 1)
        logs = d.logs()
        warned = [line for line in logs.splitlines()
                  if "WARN" in line.upper() and "image_fs_path" in line and "not the filesystem the runtime" in line]
        assert warned, f"no warning naming image_fs_path and 'not the filesystem the runtime':\n{logs[-3000:]}"
        # Two more cycles (5 s apart): still nothing removed for space.
        wait_for("two more cycles", lambda: (metric(d.scrape(), "imagegc_cycles_total", result="success") or 0)
                 + (metric(d.scrape(), "imagegc_cycles_total", result="failure") or 0) >= 3, 40, 1)
        samples = d.scrape()
        assert (metric(samples, "image_garbage_collected_total", reason="space") or 0) == 0
        images = cluster.images()
        for ref in unused + [PAUSE_IMAGE, IMAGEGC_IMAGE]:
            assert ref in images, f"{ref} was removed while measuring the wrong filesystem"
    finally:
        d.delete()
        w.clear_images(cluster, {PAUSE_IMAGE, IMAGEGC_IMAGE})
