"""Deploying imagegc on the test cluster as users do (`kubectl apply -k` of
an overlay on deploy/, `helm install` of deploy/helm/imagegc), reading its
pods, logs and metrics, and a real Prometheus discovering it."""

import json
import os
import re
import time
import urllib.parse
import urllib.request

import yaml

import workloads
from cluster import GATEWAY, bare, free_port, wait_for

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
DEPLOY = os.path.join(REPO, "deploy")
CHART = os.path.join(DEPLOY, "helm", "imagegc")


def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def edit_toml(text, changes):
    """deploy/imagegc.toml with `changes` ({"gc.max_age": "20s", ...}) set,
    each replacing the key's line or added at the top of its section."""
    lines = text.splitlines()
    for dotted, value in changes.items():
        section, key = dotted.split(".", 1)
        header = lines.index(f"[{section}]")
        end = next((i for i in range(header + 1, len(lines)) if lines[i].startswith("[")), len(lines))
        line = f"{key} = {toml_value(value)}"
        for i in range(header + 1, end):
            if re.match(rf"^{re.escape(key)}\s*=", lines[i]):
                lines[i] = line
                break
        else:
            lines.insert(header + 1, line)
    return "\n".join(lines) + "\n"


def parse_metrics(text):
    """[(name, {label: value}, float)] of a Prometheus text scrape."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)', line)
        if not m:
            continue
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.append((m.group(1), labels, float(m.group(4))))
    return out


def metric(samples, name, **labels):
    for n, l, v in samples:
        if n == name and all(l.get(k) == v2 for k, v2 in labels.items()):
            return v
    return None


class Deployment:
    """One imagegc DaemonSet on the cluster, deployed with kustomize or Helm."""

    def __init__(self, cluster, name, how, config=None, namespace=None, components=(), chart=CHART, deploy=DEPLOY,
                 image=None, state_dir=True):
        self.cluster = cluster
        # The chart Helm installs (a directory or a packaged .tgz), and the
        # deploy/ directory the kustomize overlay builds on (a release's own,
        # for the upgrade scenario).
        self.chart = chart
        self.deploy = deploy
        # (repository, tag) of the image, set as an operator does (the
        # overlay's `images`, the chart's image.repository and image.tag);
        # None: the manifests' own name, the suite's image.
        self.image = image
        self.name = name
        self.how = how
        self.config = dict(config or {})
        # deploy/components/NAME added to the overlay (kustomize only). On a
        # CRI-O node, its component first, as README says to choose a runtime.
        self.components = (["crio"] if cluster.runtime == "crio" else []) + list(components)
        self.namespace = namespace or ("imagegc" if how == "kustomize" else f"imagegc-{name}")
        # The state directory on the node: the scenario's own, or with
        # state_dir=None the manifests' hostPath as shipped.
        self.state_dir = cluster.path("imagegc-state", name) if state_dir is True else state_dir
        self.overlay = cluster.path("work", f"overlay-{name}")

    # --- kustomize ----------------------------------------------------------

    def _daemonset_patch(self):
        """JSON patch ops on deploy/daemonset.yaml: the image is already on the
        node, and the runtime's paths are where the test cluster has them."""
        with open(os.path.join(self.deploy, "daemonset.yaml")) as f:
            ds = yaml.safe_load(f)
        spec = ds["spec"]["template"]["spec"]
        container = spec["containers"][0]
        volumes = [v["name"] for v in spec["volumes"]]
        mounts = [m["name"] for m in container["volumeMounts"]]
        c = self.cluster
        ops = [{"op": "replace", "path": "/spec/template/spec/containers/0/imagePullPolicy", "value": "Never"}]
        host_paths = {"runtime-socket-dir": c.socket_dir, "runtime-root": c.containerd_root, "state": self.state_dir}
        for name, path in host_paths.items():
            if path is None:
                continue
            ops.append({"op": "replace", "path": f"/spec/template/spec/volumes/{volumes.index(name)}/hostPath/path",
                        "value": path})
        # The runtime's root at the same path as on the node: the test
        # cluster's containerd root.
        ops.append({"op": "replace",
                    "path": f"/spec/template/spec/containers/0/volumeMounts/{mounts.index('runtime-root')}/mountPath",
                    "value": c.containerd_root})
        # The socket is mounted at /run/containerd in the pod, as shipped (at
        # /run/crio, as the crio component has it, on CRI-O).
        if "kubernetes" in self.components:
            # No kube-proxy here: the API server on the bridge's address
            # instead of the kubernetes Service's (what in-cluster clients
            # read from these two variables).
            for name, value in (("KUBERNETES_SERVICE_HOST", GATEWAY),
                                ("KUBERNETES_SERVICE_PORT", str(c.ports["apiserver"]))):
                ops.append({"op": "add", "path": "/spec/template/spec/containers/0/env/-",
                            "value": {"name": name, "value": value}})
        return ops

    def _write_overlay(self):
        os.makedirs(self.overlay, exist_ok=True)
        with open(os.path.join(self.deploy, "imagegc.toml")) as f:
            toml = edit_toml(f.read(), self.config)
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(self.deploy, self.overlay)],
            "components": [os.path.relpath(os.path.join(self.deploy, "components", c), self.overlay)
                           for c in self.components],
            "patches": [
                {"target": {"kind": "DaemonSet", "name": "imagegc"}, "patch": json.dumps(self._daemonset_patch())},
                {"target": {"kind": "ConfigMap", "name": "imagegc"},
                 "patch": json.dumps([{"op": "replace", "path": "/data/imagegc.toml", "value": toml}])},
            ],
        }
        if self.image:
            # README's overlay: the image by the operator's name and tag.
            kustomization["images"] = [{"name": "ghcr.io/imagegc/imagegc", "newName": self.image[0],
                                        "newTag": self.image[1]}]
        if "kubelet-config" in self.components:
            # The kubelet's file where the test cluster has it (the component
            # names kubeadm's path); mounted at the component's path in the
            # pod. Components apply before these patches: merged by name.
            kustomization["patches"].append({
                "target": {"kind": "DaemonSet", "name": "imagegc"},
                "patch": json.dumps({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "imagegc"},
                                     "spec": {"template": {"spec": {"volumes": [
                                         {"name": "kubelet-config",
                                          "hostPath": {"path": self.cluster.path("kubelet.yaml"),
                                                       "type": "File"}}]}}}})})
        with open(os.path.join(self.overlay, "kustomization.yaml"), "w") as f:
            yaml.safe_dump(kustomization, f)

    # --- helm ---------------------------------------------------------------

    HELM_KEYS = {"gc.max_age": "gc.maxAge", "gc.interval": "gc.interval", "gc.min_age": "gc.minAge",
                 "gc.high_threshold_percent": "gc.highThresholdPercent",
                 "gc.low_threshold_percent": "gc.lowThresholdPercent",
                 "gc.usage_poll_interval": "gc.usagePollInterval", "gc.image_fs_path": "gc.imageFsPath",
                 "protect.images": "protect.images"}

    def _helm_values(self):
        c = self.cluster
        values = {"image": {"pullPolicy": "Never"},
                  "runtime": {"socketDir": c.socket_dir, "endpoint": f"unix://{c.socket}",
                              "rootDir": c.runtime_root}}
        if self.state_dir is not None:
            values["stateHostPath"] = self.state_dir
        if self.image:
            values["image"].update(repository=self.image[0], tag=self.image[1])
        for key, value in self.config.items():
            section, leaf = self.HELM_KEYS[key].split(".")
            values.setdefault(section, {})[leaf] = value
        path = self.cluster.path("work", f"values-{self.name}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump(values, f)
        return path

    # --- lifecycle ------------------------------------------------------------

    def apply(self, timeout=90):
        self.cluster.ensure_imagegc_image()
        started = time.monotonic()
        if self.how == "kustomize":
            self._write_overlay()
            self.cluster.kubectl("apply", "-k", self.overlay)
        else:
            # On CRI-O, the chart's values for it first, as README says; the
            # test bed's paths over them.
            chart_dir = self.chart if os.path.isdir(self.chart) else CHART
            runtime_values = (["--values", os.path.join(chart_dir, "runtimes", "crio.yaml")]
                              if self.cluster.runtime == "crio" else [])
            self.cluster.helm("upgrade", "--install", "imagegc", self.chart, "--namespace", self.namespace,
                              "--create-namespace", *runtime_values, "--values", self._helm_values(), "--wait",
                              f"--timeout={timeout}s")
        try:
            self.cluster.kubectl("-n", self.namespace, "rollout", "status", "daemonset/imagegc",
                                 f"--timeout={timeout}s", timeout=timeout + 10)
            wait_for("a Ready imagegc pod", self.ready_pod, timeout, 0.5)
        except (RuntimeError, TimeoutError) as e:
            raise AssertionError(f"{e}\n{self.diagnostics()}") from None
        return time.monotonic() - started

    def diagnostics(self):
        """The pods' description, events and logs, for a failure message."""
        k = self.cluster.kubectl
        parts = [k("-n", self.namespace, "describe", "pods", check=False).stdout[-4000:],
                 k("-n", self.namespace, "logs", "daemonset/imagegc", "--tail=40", check=False).stdout,
                 k("-n", self.namespace, "logs", "daemonset/imagegc", "--previous", "--tail=40",
                   check=False).stdout]
        return "\n".join(parts)

    def reconfigure(self, config):
        """New settings: apply them and roll the pods (a ConfigMap change is
        not seen by a running pod)."""
        self.config.update(config)
        self.apply()
        self.cluster.kubectl("-n", self.namespace, "rollout", "restart", "daemonset/imagegc")
        try:
            self.cluster.kubectl("-n", self.namespace, "rollout", "status", "daemonset/imagegc", "--timeout=90s",
                                 timeout=100)
        except RuntimeError as e:
            raise AssertionError(f"{e}\n{self.diagnostics()}") from None
        wait_for("a Ready imagegc pod", self.ready_pod, 60, 0.5)

    def delete(self):
        if self.how == "kustomize":
            self.cluster.kubectl("delete", "-k", self.overlay, "--wait=true", "--ignore-not-found", timeout=180)
        else:
            self.cluster.helm("uninstall", "imagegc", "--namespace", self.namespace, "--wait", check=False)
            self.cluster.kubectl("delete", "namespace", self.namespace, "--wait=true", "--ignore-not-found",
                                 timeout=180)

    def pods(self):
        return self.cluster.kubectl_json("-n", self.namespace, "get", "pods", "-l",
                                         "app.kubernetes.io/name=imagegc")["items"]

    def ready_pod(self):
        for pod in self.pods():
            if pod["metadata"].get("deletionTimestamp"):
                continue
            statuses = pod["status"].get("containerStatuses", [])
            if statuses and all(s.get("ready") for s in statuses) and pod["status"].get("podIP"):
                return pod
        return None

    def pod(self):
        pod = self.ready_pod()
        assert pod is not None, f"no Ready imagegc pod in {self.namespace}"
        return pod

    def logs(self, pod=None):
        name = (pod or self.pod())["metadata"]["name"]
        return self.cluster.kubectl("-n", self.namespace, "logs", name, "--tail=-1").stdout

    def scrape(self, pod=None):
        pod = pod or self.pod()
        url = f"http://{pod['status']['podIP']}:9105/metrics"
        with urllib.request.urlopen(url, timeout=5) as r:
            return parse_metrics(r.read().decode())

    def exec(self, *argv):
        name = self.pod()["metadata"]["name"]
        return self.cluster.kubectl("-n", self.namespace, "exec", name, "--", *argv)

    def history(self):
        out = self.exec("/imagegc", "history", "--config", "/etc/imagegc/imagegc.toml", "--since", "24h",
                        "--output", "json").stdout
        return json.loads(out) if out.strip() else []

    def removed_ids(self):
        """The ids of the images imagegc's journal names, bare (see
        `cluster.bare`)."""
        return {bare(e["image"]) for e in self.history()}

    def removed_by_others(self, before):
        """Once another collector's removals have ended: the image ids gone
        since `before` ({bare id: size}), those of them imagegc's journal
        names, and the rest, which imagegc must count as removed by others: waits
        until it has, and returns its scrape then."""
        gone = set(before) - workloads.images_once_settled(self.cluster)
        by_imagegc = self.removed_ids()
        by_others = gone - by_imagegc

        def counted():
            s = self.scrape()
            return (metric(s, "imagegc_images_removed_by_others_total") == len(by_others)) and s

        samples = wait_for(f"imagegc to count the {len(by_others)} images removed by others", counted, 60, 2)
        return gone, by_imagegc, by_others, samples

    def container_pid(self, pod=None):
        pod = pod or self.pod()
        cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
        info = json.loads(self.cluster.crictl("inspect", cid).stdout)
        return info["info"]["pid"]


def process_confinement(pid):
    """uid, effective capabilities and whether / is read-only, of a process
    as the kernel sees it."""
    status = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            status[k] = v.strip()
    root_options = None
    with open(f"/proc/{pid}/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == "/":
                root_options = fields[5].split(",")
    return {"uid": status["Uid"].split(), "cap_eff": int(status["CapEff"], 16), "cap_prm": int(status["CapPrm"], 16),
            "cap_bnd": int(status["CapBnd"], 16), "no_new_privs": status.get("NoNewPrivs"),
            "root_read_only": root_options is not None and "ro" in root_options}


class Prometheus:
    """Debian's Prometheus, discovering pods through the test API server
    (kubernetes_sd_configs, role pod) and keeping those annotated
    prometheus.io/scrape, as the usual kubernetes-pods job does."""

    def __init__(self, cluster, binary):
        self.cluster = cluster
        self.binary = binary
        self.port = free_port()
        self.dir = cluster.path("prometheus")

    def start(self):
        os.makedirs(self.dir, exist_ok=True)
        pki = self.cluster.path("pki")
        config = {
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"},
            "scrape_configs": [{
                "job_name": "kubernetes-pods",
                "kubernetes_sd_configs": [{
                    "role": "pod",
                    "api_server": f"https://127.0.0.1:{self.cluster.ports['apiserver']}",
                    "tls_config": {"ca_file": f"{pki}/ca.crt", "cert_file": f"{pki}/admin.crt",
                                   "key_file": f"{pki}/admin.key"},
                }],
                "relabel_configs": [
                    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                     "action": "keep", "regex": "true"},
                    {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                     "action": "replace", "target_label": "__metrics_path__", "regex": "(.+)"},
                    {"source_labels": ["__address__", "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                     "action": "replace", "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
                     "target_label": "__address__"},
                    {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }],
        }
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            yaml.safe_dump(config, f)
        self.cluster._start("prometheus", [
            self.binary, f"--config.file={self.dir}/prometheus.yml", f"--storage.tsdb.path={self.dir}/data",
            f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"])
        wait_for("Prometheus ready", lambda: self._get("/-/ready", raw=True), 60, 0.5)
        return self

    def _get(self, path, raw=False):
        self.cluster._alive("prometheus")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
            body = r.read().decode()
        return body if raw else json.loads(body)

    def query(self, promql):
        answer = self._get("/api/v1/query?" + urllib.parse.urlencode({"query": promql}))
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def targets(self):
        return self._get("/api/v1/targets")["data"]["activeTargets"]
