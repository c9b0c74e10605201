"""Images and pods of the scenarios: workload pods running their own image,
unused images to collect, filler images of incompressible data, and images
in the private registry that pods pull over the network."""

import json
import os
import time

import oci
from cluster import MIB, bare, wait_for


def workload_image(cluster, name):
    """A small image of its own (busybox plus a file that makes it unique)."""
    ref = f"registry.example/workload/{name}:1"
    cluster.build_and_import(ref, [cluster.busybox_layer, oci.layer([(f"/id/{name}", name.encode(), 0o644)])],
                             entrypoint=["/bin/sleep", "2147483647"])
    return ref


def unused_image(cluster, name, size=MIB):
    """An image nobody runs, of `size` random bytes (stored twice by
    containerd: the blob and the unpacked snapshot)."""
    ref = f"registry.example/unused/{name}:1"
    cluster.build_and_import(ref, [oci.random_layer(size, name)], entrypoint=["/bin/sleep", "1"])
    return ref


def registry_image(cluster, repository, tag, size, layers=1):
    """Pushes to the private registry (not onto the node) an image
    `cluster.registry`/pull/`repository`:`tag` of busybox and `layers`
    layers of random bytes, `size` in all (incompressible: what it takes
    on the node is what it weighs). Returns its name, for a pod to pull."""
    ref = f"{cluster.registry}/pull/{repository}:{tag}"
    tar = cluster.path("images", f"pull_{repository}_{tag}.tar")
    payload = [oci.random_layer(size // layers, f"{repository}-{tag}-{i}") for i in range(layers)]
    oci.write_image(tar, ref, [cluster.busybox_layer, *payload], entrypoint=["/bin/sleep", "2147483647"])
    del payload
    try:
        cluster.push_oci(tar, ref)
    finally:
        os.unlink(tar)
    return ref


def run_pod(cluster, name, image, namespace="default", pull="Never"):
    """A pod on `image`; `pull` is its imagePullPolicy (Never: the image
    was put on the node; IfNotPresent: the kubelet pulls it)."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": {"imagegc-test": "workload"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": pull,
                            "command": ["/bin/sleep", "2147483647"]}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    return name


def pod_phase(cluster, name, namespace="default"):
    """(phase, reason) of a pod, or (None, None) once it is gone."""
    p = cluster.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
    if p.returncode != 0:
        return None, None
    status = json.loads(p.stdout)["status"]
    return status.get("phase"), status.get("reason")


def wait_running(cluster, names, namespace="default", timeout=60):
    def running():
        pods = cluster.kubectl_json("-n", namespace, "get", "pods")["items"]
        phases = {p["metadata"]["name"]: p["status"].get("phase") for p in pods}
        return all(phases.get(n) == "Running" for n in names)
    wait_for(f"pods {names} Running", running, timeout, 0.5)


def delete_pods(cluster, namespace="default", selector="imagegc-test=workload"):
    cluster.kubectl("-n", namespace, "delete", "pods", "-l", selector, "--wait=true", "--ignore-not-found",
                    "--grace-period=1", timeout=120)


def evicted_pods(cluster, namespace="default"):
    pods = cluster.kubectl_json("-n", namespace, "get", "pods")["items"]
    return [p["metadata"]["name"] for p in pods if p["status"].get("reason") == "Evicted"]


def eviction_events(cluster):
    events = cluster.kubectl_json("get", "events", "--all-namespaces")["items"]
    return [e for e in events if e.get("reason") in ("Evicted", "EvictionThresholdMet")]


def disk_pressure(cluster):
    node = cluster.kubectl_json("get", "node", "localhost")
    return any(c["type"] == "DiskPressure" and c["status"] == "True" for c in node["status"]["conditions"])


def wait_no_disk_pressure(cluster, timeout=60):
    wait_for("no DiskPressure on the node", lambda: not disk_pressure(cluster), timeout, 1)
    # And the taint the node lifecycle controller puts, so pods schedule.
    def untainted():
        node = cluster.kubectl_json("get", "node", "localhost")
        return not any(t["key"] == "node.kubernetes.io/disk-pressure" for t in node["spec"].get("taints") or [])
    wait_for("the disk-pressure taint gone", untainted, timeout, 1)


class Filler:
    """Imports unused images of `size` random bytes, one at a time, and
    records the image filesystem's usage after each."""

    def __init__(self, cluster, prefix, size):
        self.cluster = cluster
        self.prefix = prefix
        self.size = size
        self.count = 0
        self.refs = []
        self.errors = []

    def one(self):
        self.count += 1
        name = f"{self.prefix}-{self.count}"
        try:
            self.refs.append(unused_image(self.cluster, name, self.size))
        except RuntimeError as e:
            # imagegc may remove an image while it is still being imported.
            self.errors.append(str(e))
        return self.cluster.usage()[0]


def remove_dead_sandboxes(cluster):
    """Removes, over CRI, the sandboxes of pods that ended or were deleted
    (NotReady) with their containers, as the kubelet's container GC does
    within its minute: an exited container holds its image's unpacked
    layers on disk after the image itself is removed (containerd lets the
    image go; its space comes back with the container)."""
    for sandbox in cluster.crictl("pods", "--state", "NotReady", "-q").stdout.split():
        cluster.crictl("rmp", "--force", sandbox, check=False)


def until_still(what, look, apart, timeout, same=lambda a, b: a == b):
    """Looks with `look()` every `apart` seconds until two looks in a row
    are the `same`; returns the last."""
    looks = [look()]

    def settled():
        time.sleep(apart)
        looks.append(look())
        return same(looks[-2], looks[-1])

    wait_for(what, settled, timeout, 0)
    return looks[-1]


def wait_space_settled(cluster, timeout=60):
    """Until the image filesystem's usage holds still (two looks 2 s apart
    within 1 MiB): a runtime that frees space in the background is done."""
    until_still("the image filesystem's usage to hold still", lambda: cluster.usage()[2], 2, timeout,
                lambda a, b: abs(a - b) < 1 << 20)


def clear_images(cluster, keep):
    """Removes every image over CRI but those named in `keep` (and those in use)."""
    for ref in cluster.images():
        if ref not in keep:
            cluster.crictl("rmi", ref, check=False)


# The kubelet's image GC and eviction line at their defaults, written out
# (imageGCHighThresholdPercent 85, imageGCLowThresholdPercent 80,
# imageMinimumGCAge 2m; evictionHard imagefs.available 15%). The node
# filesystem (the machine's disk) and memory stay out of the scenarios.
KUBELET_DEFAULTS = {"imageGCHighThresholdPercent": 85, "imageGCLowThresholdPercent": 80,
                    "imageMinimumGCAge": "2m",
                    "evictionHard": {"imagefs.available": "15%", "nodefs.available": "1%",
                                     "memory.available": "50Mi"}}


def restart_kubelet(cluster, overrides):
    """The kubelet restarted with `overrides` over the cluster's own
    configuration; returns once the node is Ready again."""
    cluster.kubelet_overrides = overrides
    cluster.stop_kubelet()
    cluster._start_kubelet()
    wait_for("the node Ready after the kubelet's restart", cluster._node_ready, 60, 0.5)


class KubeletLog:
    """The kubelet's log from now on: what its image GC (its 5-minute round)
    and its eviction manager's reclaim wrote about removing images."""

    # klog lines of pkg/kubelet/images/image_gc_manager.go (v1.34): a
    # round over the high threshold, the eviction manager's reclaim, and
    # each removal either makes.
    REMOVING = ("Disk usage on image filesystem is over the high threshold", "Attempting to delete unused images",
                "Removing image to free bytes")

    def __init__(self, cluster):
        self.path = cluster.path("logs", "kubelet.log")
        self.offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def lines(self):
        with open(self.path, errors="replace") as f:
            f.seek(self.offset)
            return f.read().splitlines()

    def removing(self):
        return [line for line in self.lines() if any(s in line for s in self.REMOVING)]


def cri_images(cluster):
    """{image id, bare (see `cluster.bare`): size in bytes} as the runtime
    reports them over CRI."""
    listed = json.loads(cluster.crictl("images", "-o", "json").stdout)["images"]
    return {bare(image["id"]): int(image.get("size") or 0) for image in listed}


def cri_images_by_tag(cluster):
    """{repo tag (or bare id, untagged): size in bytes} over CRI."""
    listed = json.loads(cluster.crictl("images", "-o", "json").stdout)["images"]
    return {name: int(image.get("size") or 0) for image in listed
            for name in (image.get("repoTags") or [bare(image["id"])])}


def images_once_settled(cluster, timeout=120):
    """The image ids on the node once another collector's removals have
    ended: two looks 5 s apart agree (the kubelet removes its batch in one
    pass)."""
    return until_still("the removals to end", lambda: set(cri_images(cluster)), 5, timeout)


def monotonic_ms():
    return int(time.monotonic() * 1000)


def per_image_cost(cluster, size):
    """The bytes one unused image of `size` random bytes takes on the image
    filesystem (measured: import one, remove it)."""
    before = cluster.usage()[2]
    ref = unused_image(cluster, "probe", size)
    after = cluster.usage()[2]
    cluster.crictl("rmi", ref)
    return before - after

