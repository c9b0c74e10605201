"""Scenario 4: the kubelet restarts, the runtime (containerd or CRI-O) restarts, the pod is
deleted (it must exit within seconds of SIGTERM, not at the 30 s grace
period's end), the DaemonSet is rolled: imagegc's history (the journal on
the hostPath state directory) survives each, and nothing is wrongly
removed (the pause image, the running pod's image, imagegc's own)."""

import time

import workloads as w
from cluster import IMAGEGC_IMAGE, PAUSE_IMAGE, bare, wait_for
from conftest import record
from deploy import Deployment, metric

CONFIG = {"gc.max_age": "20s", "gc.min_age": "1s", "gc.interval": "5s",
          "gc.usage_poll_interval": "5s"}


def test_history_survives_restarts_and_nothing_wrong_goes(cluster):
    running = w.workload_image(cluster, "restarts-app")
    w.run_pod(cluster, "restarts-app", running)
    w.wait_running(cluster, ["restarts-app"])
    victim = w.unused_image(cluster, "restarts-victim")
    d = Deployment(cluster, "restarts", "kustomize", CONFIG)
    d.apply()
    keep = (PAUSE_IMAGE, IMAGEGC_IMAGE, running)

    def history():
        # Right after a restart the kubelet may not know the pod yet for exec.
        return wait_for("imagegc history through kubectl exec", lambda: (d.history(),), 30, 1)[0]

    def removed_ids():
        return {bare(e["image"]) for e in history()}

    def check(step):
        wait_for(f"a Ready imagegc pod after {step}", d.ready_pod, 90, 0.5)
        wait_for(f"the runtime up after {step}", lambda: metric(d.scrape(), "imagegc_runtime_up") == 1.0, 60, 1)
        ids = removed_ids()
        assert victim_id in ids, f"after {step} the history lost the removal: {ids}"
        images = cluster.images()
        for ref in keep:
            assert ref in images, f"after {step}, {ref} was removed"
        tags = {t for e in history() for t in e.get("tags", [])}
        assert not tags & set(keep), f"after {step} the history shows a wrong removal: {tags & set(keep)}"

    try:
        victim_id = bare(cluster.images()[victim])
        wait_for("the victim removed by age", lambda: victim not in cluster.images(), 90, 1)
        wait_for("the removal in the history", lambda: victim_id in removed_ids(), 30, 1)

        cluster.stop_kubelet()
        cluster.start_kubelet()
        wait_for("node Ready after the kubelet restart", cluster._node_ready, 60, 0.5)
        check("a kubelet restart")

        cluster.stop_runtime()
        time.sleep(2)
        cluster.start_runtime()
        check(f"a {cluster.runtime} restart")

        old = d.pod()["metadata"]["name"]
        started = time.monotonic()
        cluster.kubectl("-n", d.namespace, "delete", "pod", old, "--wait=true", timeout=60)
        deleted = time.monotonic() - started
        record("pod delete: SIGTERM to gone", deleted)
        assert deleted < 10, f"the pod took {deleted:.1f}s to go: imagegc did not exit promptly on SIGTERM"
        wait_for("a new imagegc pod", lambda: (p := d.ready_pod()) and p["metadata"]["name"] != old, 60, 0.5)
        check("a pod delete")

        old = d.pod()["metadata"]["name"]
        started = time.monotonic()
        cluster.kubectl("-n", d.namespace, "rollout", "restart", "daemonset/imagegc")
        cluster.kubectl("-n", d.namespace, "rollout", "status", "daemonset/imagegc", "--timeout=90s", timeout=100)
        record("rollout restart: to the new pod Ready", time.monotonic() - started)
        assert d.pod()["metadata"]["name"] != old
        check("a rollout restart")
    finally:
        d.delete()
        w.delete_pods(cluster)
        w.clear_images(cluster, {PAUSE_IMAGE, IMAGEGC_IMAGE})
