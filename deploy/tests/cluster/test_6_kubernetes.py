"""Scenario 6: imagegc aware of the pods on its node ([kubernetes], the
deploy/components/kubernetes component).

A pod whose init container sleeps names a main image that is on the node
and used by no container: to the runtime it is unused. With the most
aggressive settings (high 1 %, low 0 %, min age 0, max age 1 s, a cycle
every 2 s) imagegc keeps it with reason `pod`, and the pod then starts
without a pull (imagePullPolicy: Never). The same with the component off
removes it and the pod fails with ErrImageNeverPull: the scenario is real.
The RBAC is exactly pods list/watch and nodes get everywhere and events
create/patch in `default` only, as the real API server says (`kubectl auth
can-i`); the node's name is confirmed (`imagegc_kubernetes_node_found`); images that cannot reach 0 %
post one FreeDiskSpaceFailed event on the Node; with the API server
stopped, cycles go on, and protection resumes when it returns."""

import json
import urllib.request

import workloads as w
from cluster import IMAGEGC_IMAGE, NODE, PAUSE_IMAGE, wait_for
from deploy import Deployment, metric

AGGRESSIVE = {"gc.high_threshold_percent": 1, "gc.low_threshold_percent": 0, "gc.min_age": "0s",
              "gc.max_age": "1s", "gc.interval": "2s", "gc.usage_poll_interval": "2s"}
ACCOUNT = "system:serviceaccount:imagegc:imagegc"


def starting_pod(cluster, name, init_image, main_image, sleep_s):
    """A pod whose init container sleeps `sleep_s` before its main container
    (imagePullPolicy: Never) starts on `main_image`."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": {"imagegc-test": "workload"}},
        "spec": {
            "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
            "enableServiceLinks": False, "nodeName": NODE,
            "initContainers": [{"name": "wait", "image": init_image, "imagePullPolicy": "Never",
                                "command": ["/bin/sleep", str(sleep_s)]}],
            "containers": [{"name": "main", "image": main_image, "imagePullPolicy": "Never",
                            "command": ["/bin/sleep", "2147483647"]}],
        },
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))


def hold(cluster, image):
    """A running pod on `image`, so that the most aggressive settings keep
    it (in use) for the init containers of the scenario's pods."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "holder", "namespace": "default", "labels": {"imagegc-test": "holder"}},
        "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False,
                 "enableServiceLinks": False, "nodeName": NODE,
                 "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never",
                                 "command": ["/bin/sleep", "2147483647"]}]},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(pod))
    w.wait_running(cluster, ["holder"])


def pod_state(cluster, name):
    """(phase, the main container's waiting reason or None)."""
    pod = cluster.kubectl_json("-n", "default", "get", "pod", name)
    waiting = [s.get("state", {}).get("waiting", {}).get("reason")
               for s in pod["status"].get("containerStatuses", []) if s["name"] == "main"]
    return pod["status"].get("phase"), (waiting[0] if waiting else None)


def plan_kept(d):
    """imagegc plan's kept images in the pod, by tag: (reason, pod)."""
    out = json.loads(d.exec("/imagegc", "plan", "--output", "json").stdout)
    kept = {}
    for k in out["kept"]:
        for tag in k.get("tags", []):
            kept[tag] = (k.get("reason"), k.get("pod"))
    return kept


def imagegc_node_events(cluster, reason):
    events = cluster.kubectl_json("get", "events", "--all-namespaces", "--field-selector",
                                  f"involvedObject.kind=Node,reason={reason}")["items"]
    return [e for e in events if (e.get("source") or {}).get("component") == "imagegc"]


def cycles(samples):
    """Cycles run, whatever their result (one that cannot reach 0 % counts
    as a failure)."""
    return sum(metric(samples, "imagegc_cycles_total", result=r) or 0 for r in ("success", "failure"))


def memory(d):
    """VmRSS and VmHWM of the imagegc process, for the report."""
    with open(f"/proc/{d.container_pid()}/status") as f:
        fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "VmHWM")))
    return {k: v.strip() for k, v in fields.items()}


def can_i(cluster, verb, resource, namespace="default"):
    p = cluster.kubectl("auth", "can-i", verb, resource, "-n", namespace, f"--as={ACCOUNT}", check=False)
    return p.stdout.strip() == "yes"


def test_pods_on_the_node_keep_their_images(cluster):
    init = w.workload_image(cluster, "k8s-init")
    hold(cluster, init)
    d = Deployment(cluster, "kube", "kustomize", AGGRESSIVE, components=["kubernetes"])
    d.apply()
    try:
        # The RBAC, as the real API server evaluates it.
        everywhere = [("list", "pods"), ("watch", "pods"), ("get", "nodes")]
        in_default = [("create", "events"), ("patch", "events")]
        never = [("get", "pods"), ("delete", "pods"), ("create", "pods"), ("update", "pods"), ("patch", "pods"),
                 ("create", "pods/eviction"), ("get", "secrets"), ("list", "secrets"), ("list", "nodes"),
                 ("watch", "nodes"), ("patch", "nodes"), ("get", "events"), ("delete", "events"),
                 ("update", "events"), ("list", "configmaps"), ("create", "serviceaccounts/token")]
        asked = everywhere + in_default + never
        for namespace in ("default", "kube-system", "imagegc"):
            allowed = everywhere + (in_default if namespace == "default" else [])
            got = {f"{v} {r}": can_i(cluster, v, r, namespace) for v, r in asked}
            want = {f"{v} {r}": (v, r) in allowed for v, r in asked}
            assert got == want, f"in {namespace}: {[k for k in got if got[k] != want[k]]}"

        wait_for("the pods listed", lambda: metric(d.scrape(), "imagegc_kubernetes_pods_watch_up") == 1.0, 30, 1)
        # Its Node exists and its own pod is among the node's pods.
        wait_for("the node's name confirmed", lambda: metric(d.scrape(), "imagegc_kubernetes_node_found") == 1.0,
                 30, 1)

        # A pod lands; its init container runs; its main image comes to the
        # node meanwhile and no container uses it.
        starting_pod(cluster, "starting", init, "registry.example/workload/k8s-main:1", 25)
        wait_for("the init container running", lambda: pod_state(cluster, "starting")[0] == "Pending"
                 and cluster.kubectl_json("get", "pod", "starting")["status"].get("initContainerStatuses", [{}])[0]
                 .get("state", {}).get("running"), 30, 0.5)
        main = w.workload_image(cluster, "k8s-main")
        ran = cycles(d.scrape())
        wait_for("three more cycles", lambda: cycles(d.scrape()) >= ran + 3, 30, 0.5)
        assert main in cluster.images(), f"{main}, named by a starting pod, was removed"
        kept = plan_kept(d)
        assert kept.get(main) == ("pod", "default/starting"), kept.get(main)
        assert metric(d.scrape(), "imagegc_kubernetes_pods") >= 1

        # The pod starts on it without a pull.
        wait_for("the pod Running", lambda: pod_state(cluster, "starting")[0] == "Running", 60, 0.5)

        # Images cannot bring usage to 0 %: one event on the Node, however
        # many cycles say so.
        wait_for("a FreeDiskSpaceFailed event from imagegc",
                 lambda: imagegc_node_events(cluster, "FreeDiskSpaceFailed"), 30, 1)
        ran = cycles(d.scrape())
        wait_for("five more cycles", lambda: cycles(d.scrape()) >= ran + 5, 30, 0.5)
        events = imagegc_node_events(cluster, "FreeDiskSpaceFailed")
        assert len(events) == 1 and events[0].get("count", 1) == 1, events
        assert events[0]["type"] == "Warning" and "not images" in events[0]["message"], events[0]
        everything = cluster.kubectl("get", "events", "--field-selector", "involvedObject.kind=Node").stdout
        assert "FreeDiskSpaceFailed" in everything, everything
        print(f"imagegc with [kubernetes] on, watching {metric(d.scrape(), 'imagegc_kubernetes_pods'):.0f} pods, "
              f"after {cycles(d.scrape()):.0f} cycles: {memory(d)}")

        # The API server goes away while a pod is starting: cycles go on,
        # readiness holds, and the last known pods keep their images.
        w.delete_pods(cluster)
        starting_pod(cluster, "during", init, "registry.example/workload/k8s-during:1", 60)
        wait_for("the init container running", lambda: cluster.kubectl_json("get", "pod", "during")["status"]
                 .get("initContainerStatuses", [{}])[0].get("state", {}).get("running"), 30, 0.5)
        during = w.workload_image(cluster, "k8s-during")
        pod = d.pod()
        cluster.stop_apiserver()
        try:
            # Read from the pod's address: kubectl has no API server now.
            wait_for("the watch down", lambda: metric(d.scrape(pod), "imagegc_kubernetes_pods_watch_up") == 0.0,
                     60, 1)
            ran = cycles(d.scrape(pod))
            wait_for("cycles while the API server is away", lambda: cycles(d.scrape(pod)) >= ran + 3, 30, 0.5)
            with urllib.request.urlopen(f"http://{pod['status']['podIP']}:9105/readyz", timeout=5) as r:
                assert r.status == 200
            assert during in cluster.images(), f"{during}, named by a pod known before the outage, was removed"
        finally:
            cluster.start_apiserver()
        # It returns: the watch lists again, and a new starting pod is kept.
        wait_for("the watch up again", lambda: metric(d.scrape(), "imagegc_kubernetes_pods_watch_up") == 1.0,
                 90, 1)
        starting_pod(cluster, "after", init, "registry.example/workload/k8s-after:1", 15)
        wait_for("the init container running", lambda: cluster.kubectl_json("get", "pod", "after")["status"]
                 .get("initContainerStatuses", [{}])[0].get("state", {}).get("running"), 60, 0.5)
        after = w.workload_image(cluster, "k8s-after")
        wait_for("the pod Running", lambda: pod_state(cluster, "after")[0] == "Running", 60, 0.5)
        assert after in cluster.images()
        logs = d.logs()
        assert "cannot watch the pods bound to this node" in logs, logs[-3000:]
    finally:
        w.delete_pods(cluster)
        w.delete_pods(cluster, selector="imagegc-test=holder")
        d.delete()
        w.clear_images(cluster, {PAUSE_IMAGE, IMAGEGC_IMAGE})


def test_without_the_component_a_starting_pods_image_is_removed(cluster):
    init = w.workload_image(cluster, "k8s-init")
    hold(cluster, init)
    d = Deployment(cluster, "nokube", "kustomize", AGGRESSIVE)
    d.apply()
    try:
        starting_pod(cluster, "unprotected", init, "registry.example/workload/k8s-gone:1", 15)
        wait_for("the init container running", lambda: cluster.kubectl_json("get", "pod", "unprotected")["status"]
                 .get("initContainerStatuses", [{}])[0].get("state", {}).get("running"), 30, 0.5)
        gone = w.workload_image(cluster, "k8s-gone")
        wait_for(f"{gone} removed", lambda: gone not in cluster.images(), 30, 0.5)
        wait_for("ErrImageNeverPull", lambda: pod_state(cluster, "unprotected")[1] == "ErrImageNeverPull", 60, 0.5)
        assert metric(d.scrape(), "imagegc_kubernetes_pods_watch_up") == 0.0
        print(f"imagegc with [kubernetes] off, after {cycles(d.scrape()):.0f} cycles: {memory(d)}")
    finally:
        w.delete_pods(cluster)
        w.delete_pods(cluster, selector="imagegc-test=holder")
        d.delete()
        w.clear_images(cluster, {PAUSE_IMAGE, IMAGEGC_IMAGE})
