"""Scenario 3: the runtime's root is on a filesystem of its own (the 1 GiB
loop-mounted ext4). The shipped manifests (no gc.image_fs_path, the
runtime's root mounted at its node path) measure that filesystem, not the
machine's disk. A wrong gc.image_fs_path (the state directory, on the
machine's disk) is reported as a mismatch, and no space pass runs on it.

On CRI-O the node's store is split (KEP-4191): images on the 1 GiB
filesystem, the containers' writable layers on a 512 MiB one. imagegc
measures the image filesystem (its gauges are the image store's statvfs),
reports the container filesystem beside it, and a container filling the
container filesystem past the high threshold removes no image."""

import json
import os

import pytest

import workloads as w
from cluster import CONTAINER_FS_SIZE, FS_SIZE, IMAGEGC_IMAGE, MIB, PAUSE_IMAGE, wait_for
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


def _statvfs(path):
    st = os.statvfs(path)
    return st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize


def test_a_split_store_is_measured_on_its_image_filesystem(cluster):
    if cluster.runtime != "crio":
        pytest.skip("only CRI-O splits its store here (imagestore); containerd keeps images and "
                    "writable layers on one filesystem")
    unused = [w.unused_image(cluster, f"split-{i}", 8 * MIB) for i in range(2)]
    # High 50: a container filesystem filled past it must remove nothing.
    d = Deployment(cluster, "split", "kustomize", {
        "gc.high_threshold_percent": 50, "gc.low_threshold_percent": 40, "gc.min_age": "1s",
        "gc.interval": "5s", "gc.usage_poll_interval": "5s"})
    d.apply()
    try:
        # A pod whose container writes 300 MiB into its writable layer: on
        # the container filesystem (512 MiB), not the image one.
        writer = w.workload_image(cluster, "split-writer")
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "split-writer", "namespace": "default", "labels": {"imagegc-test": "workload"}},
               "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                        "enableServiceLinks": False,
                        "containers": [{"name": "main", "image": writer, "imagePullPolicy": "Never",
                                        "command": ["/bin/sh", "-c", "/bin/busybox dd if=/dev/zero of=/data bs=1M "
                                                    "count=300 && exec /bin/sleep 2147483647"]}]}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
        w.wait_running(cluster, ["split-writer"])

        def container_fs_filled():
            capacity, available = _statvfs(cluster.container_fs)
            return (capacity - available) * 100 >= 55 * capacity
        wait_for("the container filesystem past 55%", container_fs_filled, 60, 1)
        ran = metric(d.scrape(), "imagegc_cycles_total", result="success") or 0
        wait_for("two more cycles", lambda: (metric(d.scrape(), "imagegc_cycles_total", result="success") or 0)
                 >= ran + 2, 40, 1)

        samples = d.scrape()
        # The image filesystem, measured: the image store's statvfs.
        capacity, available = _statvfs(cluster.crio_image_store)
        assert metric(samples, "imagegc_image_filesystem_capacity_bytes") == capacity
        assert abs(metric(samples, "imagegc_image_filesystem_available_bytes") - available) < 16 * MIB, (
            metric(samples, "imagegc_image_filesystem_available_bytes"), available)
        assert abs(capacity - FS_SIZE) < 0.1 * FS_SIZE
        # The container filesystem, reported beside it.
        mount = {"mount_point": cluster.container_fs}
        c_capacity, c_available = _statvfs(cluster.crio_root)
        assert metric(samples, "imagegc_container_filesystem_capacity_bytes", **mount) == c_capacity, samples
        assert abs(c_capacity - CONTAINER_FS_SIZE) < 0.1 * CONTAINER_FS_SIZE
        assert abs(metric(samples, "imagegc_container_filesystem_available_bytes", **mount) - c_available) \
            < 16 * MIB
        assert metric(samples, "imagegc_container_filesystem_usage_ratio", **mount) >= 0.5
        # Nothing removed: images free nothing on the container filesystem,
        # and the image filesystem is below high.
        assert (metric(samples, "image_garbage_collected_total", reason="space") or 0) == 0
        images = cluster.images()
        for ref in unused + [PAUSE_IMAGE, IMAGEGC_IMAGE, writer]:
            assert ref in images, f"{ref} was removed while only the container filesystem filled"
        # `imagegc images` names both filesystems.
        out = d.exec("/imagegc", "images").stdout
        assert f"image filesystem: {cluster.image_fs}: " in out, out
        assert f"container filesystem: {cluster.container_fs}: " in out, out
        logs = d.logs()
        assert "another filesystem than its images" in logs, logs[-3000:]
    finally:
        w.delete_pods(cluster)
        d.delete()
        w.clear_images(cluster, {PAUSE_IMAGE, IMAGEGC_IMAGE})
