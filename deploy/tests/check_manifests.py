"""Checks what a schema cannot: that the files in deploy/ agree with each
other and with what the daemon needs.

- kustomization.yaml lists files that exist, and every Kubernetes manifest
  in deploy/ is either listed or one of the Prometheus Operator extras;
- the ConfigMap carries deploy/imagegc.toml verbatim, and that TOML has only
  known keys;
- the metrics port agrees everywhere: metrics.listen, containerPort, probes,
  scrape annotations, NetworkPolicy, PodMonitor;
- the runtime socket and the state directory are inside mounted volumes,
  with the state directory writable; the runtime's root is mounted
  read-only at its node path with HostToContainer propagation, and
  gc.image_fs_path is unset (the runtime's ImageFsInfo names what is
  measured);
- exactly three hostPath volumes;
- the security context drops every capability and stays uid 0 without
  privilege, and the grace period covers the daemon's 20 s shutdown;
- the PrometheusRule carries the same groups as prometheus-rules.yaml.

check(DEPLOY_DIR) returns the problems found; deploy/tests/test_manifests.py
runs it.
"""

import os
import tomllib

import yaml

CONFIG_KEYS = {
    "runtime": {"endpoint", "timeout"},
    "gc": {"interval", "usage_poll_interval", "high_threshold_percent", "low_threshold_percent",
           "min_age", "max_age", "dry_run", "image_fs_path", "thrash_window", "order",
           "high_inodes_percent", "low_inodes_percent"},
    "protect": {"images", "keep_recent_per_repository"},
    "state": {"dir"},
    "metrics": {"listen"},
    "kubelet": {"config"},
    "kubernetes": {"enabled", "protect_pods", "node_events", "pods_stale_after"},
}
OPERATOR_EXTRAS = {"prometheusrule.yaml", "podmonitor.yaml"}
SHUTDOWN_GRACE_SECONDS = 20  # the daemon's own bound on finishing a removal


class Problems(list):
    def check(self, ok, message):
        if not ok:
            self.append(message)
        return ok


def load_all(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def under(path, mount):
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def check(deploy):
    problems = Problems()
    kust = load_all(os.path.join(deploy, "kustomization.yaml"))[0]
    resources = kust.get("resources", [])
    objects = {}
    for name in resources:
        path = os.path.join(deploy, name)
        if problems.check(os.path.isfile(path), f"kustomization.yaml lists {name}, which does not exist"):
            for doc in load_all(path):
                objects[doc["kind"]] = doc
    for name in sorted(os.listdir(deploy)):
        if not name.endswith((".yaml", ".yml")) or name in resources or name == "kustomization.yaml":
            continue
        docs = load_all(os.path.join(deploy, name))
        if any("apiVersion" in d and "kind" in d for d in docs):
            problems.check(name in OPERATOR_EXTRAS, f"{name} is a manifest but kustomization.yaml does not list it")
    images = [i.get("name") for i in kust.get("images", [])]

    for kind in ("Namespace", "ServiceAccount", "ConfigMap", "DaemonSet", "NetworkPolicy"):
        problems.check(kind in objects, f"no {kind} among the kustomization's resources")
    if problems:
        return problems

    # The configuration.
    cm = objects["ConfigMap"]
    with open(os.path.join(deploy, "imagegc.toml"), encoding="utf-8") as f:
        toml_text = f.read()
    problems.check(cm["data"].get("imagegc.toml") == toml_text,
                   "configmap.yaml's imagegc.toml differs from deploy/imagegc.toml")
    config = tomllib.loads(toml_text)
    for section, keys in config.items():
        if problems.check(section in CONFIG_KEYS, f"imagegc.toml: unknown section [{section}]"):
            for key in keys:
                problems.check(key in CONFIG_KEYS[section], f"imagegc.toml: unknown key {section}.{key}")
    listen = config["metrics"]["listen"]
    port = int(listen.rsplit(":", 1)[1])
    problems.check(listen.startswith("0.0.0.0:"), f"metrics.listen is {listen}: probes and Prometheus reach the pod IP")

    # The DaemonSet.
    ds = objects["DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    meta = ds["spec"]["template"]["metadata"]
    (container,) = spec["containers"]
    problems.check(container["image"].rsplit(":", 1)[0] in images,
                   f"image {container['image']} has no entry in kustomization.yaml's images")
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
    problems.check(ports.get("metrics") == port, f"containerPort metrics is {ports.get('metrics')}, listen port {port}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container.get(probe, {}).get("httpGet", {})
        problems.check(get.get("path") == path, f"{probe} path is {get.get('path')}, expected {path}")
        problems.check(get.get("port") in ("metrics", port), f"{probe} port is {get.get('port')}")
    live = container["livenessProbe"]
    tolerated = live.get("periodSeconds", 10) * live.get("failureThreshold", 3)
    problems.check(tolerated >= 180, f"liveness gives up after {tolerated}s; allow at least 3 minutes")
    ann = meta.get("annotations", {})
    problems.check(ann.get("prometheus.io/port") == str(port), "prometheus.io/port annotation differs from the listen port")
    problems.check(ann.get("prometheus.io/path") == "/metrics", "prometheus.io/path annotation is not /metrics")
    problems.check(spec.get("terminationGracePeriodSeconds", 30) > SHUTDOWN_GRACE_SECONDS,
                   "terminationGracePeriodSeconds does not cover the daemon's 20 s shutdown")
    problems.check(spec.get("priorityClassName") == "system-node-critical", "priorityClassName is not system-node-critical")
    problems.check({"operator": "Exists"} in spec.get("tolerations", []), "no blanket toleration")
    problems.check(not spec.get("hostNetwork", False), "hostNetwork would expose the metrics port on the node")
    problems.check(spec.get("automountServiceAccountToken") is False, "the pod mounts a service account token")
    problems.check(objects["ServiceAccount"].get("automountServiceAccountToken") is False,
                   "the ServiceAccount allows token automounting")
    env = {e["name"]: e for e in container.get("env", [])}
    problems.check(env.get("NODE_NAME", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName",
                   "NODE_NAME is not taken from spec.nodeName")
    for name, path in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        problems.check(env.get(name, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == path,
                       f"{name} is not taken from {path}: imagegc cannot look for its own pod among the node's")

    sc = container.get("securityContext", {})
    problems.check(sc.get("capabilities", {}).get("drop") == ["ALL"], "capabilities are not all dropped")
    problems.check(not sc.get("capabilities", {}).get("add"), "capabilities are added")
    problems.check(sc.get("readOnlyRootFilesystem") is True, "root filesystem is writable")
    problems.check(sc.get("allowPrivilegeEscalation") is False, "privilege escalation is allowed")
    problems.check(not sc.get("privileged", False), "the container is privileged")
    problems.check(sc.get("runAsUser") == 0, "runAsUser is not 0: the root-owned 0660 CRI socket needs uid 0")
    seccomp = sc.get("seccompProfile") or spec.get("securityContext", {}).get("seccompProfile") or {}
    problems.check(seccomp.get("type") == "RuntimeDefault", "no RuntimeDefault seccomp profile")
    problems.check("limits" in container.get("resources", {}) and "memory" in container["resources"]["limits"],
                   "no memory limit")

    # Volumes and paths.
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    host_paths = [v for v in volumes.values() if "hostPath" in v]
    problems.check(len(host_paths) == 3,
                   f"{len(host_paths)} hostPath volumes; expected the runtime's socket directory, its root and the state directory")
    mounts = {m["mountPath"]: m for m in container.get("volumeMounts", [])}

    def mount_for(path):
        found = [m for p, m in mounts.items() if under(path, p)]
        return max(found, key=lambda m: len(m["mountPath"])) if found else None

    args = container.get("args", [])
    endpoint = args[args.index("--runtime-endpoint") + 1] if "--runtime-endpoint" in args else config["runtime"]["endpoint"]
    if problems.check(endpoint.startswith("unix:///"), f"runtime endpoint {endpoint!r} is not a unix socket path"):
        socket = endpoint[len("unix://"):]
        m = mount_for(socket)
        if problems.check(m is not None, f"the runtime socket {socket} is not mounted"):
            hp = volumes[m["name"]].get("hostPath", {})
            problems.check(hp.get("path") == m["mountPath"], f"{m['mountPath']} is not mounted from the same host path")
    config_mount = mount_for("/etc/imagegc/imagegc.toml")
    problems.check(config_mount is not None and "configMap" in volumes[config_mount["name"]],
                   "/etc/imagegc is not the ConfigMap")
    problems.check("/etc/imagegc/imagegc.toml" in args, "--config /etc/imagegc/imagegc.toml is not passed")
    state = config["state"]["dir"]
    m = mount_for(state)
    if problems.check(m is not None, f"state.dir {state} is not mounted"):
        problems.check(not m.get("readOnly", False), f"state.dir {state} is mounted read-only")
        hp = volumes[m["name"]].get("hostPath", {})
        problems.check(hp.get("type") == "DirectoryOrCreate", "the state hostPath is not DirectoryOrCreate")
    # The image filesystem: the runtime names it (ImageFsInfo) as a path under
    # its root, which must be mounted at the same path, read-only, following
    # the node's mounts; gc.image_fs_path stays unset so that this is what is
    # measured.
    problems.check("image_fs_path" not in config["gc"],
                   "gc.image_fs_path is set: imagegc must measure the mount point the runtime names")
    root = volumes.get("runtime-root")
    if problems.check(root is not None and "hostPath" in root, "no runtime-root hostPath volume (the runtime's root)"):
        m = [m for m in mounts.values() if m["name"] == "runtime-root"]
        if problems.check(len(m) == 1, "the runtime's root is not mounted"):
            (m,) = m
            problems.check(m["mountPath"] == root["hostPath"]["path"],
                           f"the runtime's root {root['hostPath']['path']} is mounted at {m['mountPath']}, not at the same path")
            problems.check(m.get("readOnly") is True, "the runtime's root is mounted writable")
            problems.check(m.get("mountPropagation") == "HostToContainer",
                           "the runtime's root is not mounted with mountPropagation HostToContainer")

    # Network policy and the operator extras.
    np = objects["NetworkPolicy"]
    np_ports = [p.get("port") for rule in np["spec"].get("ingress", []) for p in rule.get("ports", [])]
    problems.check(np_ports == [port], f"NetworkPolicy ingress ports {np_ports}, expected [{port}]")
    selector = ds["spec"]["selector"]["matchLabels"]
    problems.check(np["spec"]["podSelector"].get("matchLabels") == selector, "NetworkPolicy does not select the DaemonSet's pods")
    problems.check(all(meta["labels"].get(k) == v for k, v in selector.items()), "the pod template does not match the selector")
    pm = load_all(os.path.join(deploy, "podmonitor.yaml"))[0]
    problems.check(pm["spec"]["selector"]["matchLabels"] == selector, "PodMonitor does not select the DaemonSet's pods")
    problems.check([e.get("port") for e in pm["spec"]["podMetricsEndpoints"]] == ["metrics"], "PodMonitor does not scrape port metrics")
    pr = load_all(os.path.join(deploy, "prometheusrule.yaml"))[0]
    plain = load_all(os.path.join(deploy, "prometheus-rules.yaml"))[0]
    problems.check(pr["spec"]["groups"] == plain["groups"], "prometheusrule.yaml's groups differ from prometheus-rules.yaml")
    namespace = objects["Namespace"]["metadata"]["name"]
    for name, doc in list(objects.items()) + [("PodMonitor", pm), ("PrometheusRule", pr)]:
        if name != "Namespace":
            problems.check(doc["metadata"].get("namespace") == namespace, f"{name} is not in namespace {namespace}")
    return problems

