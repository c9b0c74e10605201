"""Scenario 1: `kubectl apply -k` and `helm install` each bring a Ready
imagegc pod, confined as the manifests say; a real Prometheus finds it by
its prometheus.io annotations; an unused image goes by age, seen in the
logs and in the metrics; the pause image, imagegc's own image and running
pods' images stay."""

import pytest

import workloads as w
from cluster import IMAGEGC_IMAGE, PAUSE_IMAGE, wait_for
from conftest import record
from deploy import Deployment, process_confinement

# Age removal within seconds: a cycle every 5 s, images unused for 20 s go.
AGE_CONFIG = {"gc.max_age": "20s", "gc.min_age": "1s", "gc.interval": "5s",
              "gc.usage_poll_interval": "5s"}


@pytest.mark.parametrize("how", ["kustomize", "helm"])
def test_deploy_confined_scraped_and_collects_by_age(cluster, prometheus, how):
    running = w.workload_image(cluster, f"running-{how}")
    w.run_pod(cluster, f"running-{how}", running)
    w.wait_running(cluster, [f"running-{how}"])
    victim = w.unused_image(cluster, f"age-victim-{how}")
    d = Deployment(cluster, f"age-{how}", how, AGE_CONFIG)
    record(f"{how}: apply to a Ready imagegc pod", d.apply())
    try:
        pod = d.pod()
        # Confinement as the kernel sees the process: uid 0, no capability
        # at all, a read-only root filesystem, no privilege escalation.
        conf = process_confinement(d.container_pid(pod))
        assert conf["uid"] == ["0", "0", "0", "0"], conf
        assert conf["cap_eff"] == 0 and conf["cap_prm"] == 0 and conf["cap_bnd"] == 0, conf
        assert conf["root_read_only"], conf
        assert conf["no_new_privs"] == "1", conf

        # Prometheus discovers the pod through the API server and scrapes it.
        ns = d.namespace
        found = wait_for("imagegc_node_info{node=\"localhost\"} in Prometheus",
                         lambda: prometheus.query(f'imagegc_node_info{{node="localhost",namespace="{ns}"}}'), 60, 1)
        assert found[0]["metric"]["pod"] == pod["metadata"]["name"]
        target = [t for t in prometheus.targets() if t["labels"].get("namespace") == ns]
        assert target and target[0]["health"] == "up", target

        # The unused image goes by age.
        wait_for(f"{victim} removed by age", lambda: victim not in cluster.images(), 90, 1)
        logs = d.logs()
        lines = [line for line in logs.splitlines() if "removed image" in line and victim in line]
        assert lines, f"no 'removed image' line for {victim} in the logs:\n{logs[-3000:]}"
        assert "age" in lines[0], lines[0]
        wait_for("image_garbage_collected_total{reason=\"age\"} >= 1 in Prometheus",
                 lambda: prometheus.query(
                     f'image_garbage_collected_total{{reason="age",namespace="{ns}"}} >= 1'), 30, 1)

        images = cluster.images()
        for kept in (PAUSE_IMAGE, IMAGEGC_IMAGE, running):
            assert kept in images, f"{kept} was removed; images now: {sorted(images)}"
        history = d.history()
        removed = {tag for entry in history for tag in entry.get("tags", [])}
        assert removed & {PAUSE_IMAGE, IMAGEGC_IMAGE, running} == set(), history
    finally:
        d.delete()
        w.delete_pods(cluster)
