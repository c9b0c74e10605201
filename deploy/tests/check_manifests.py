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
- the PrometheusRule carries the same groups as prometheus-rules.yaml, and
  components/alerts-gke's Rules the same evaluated every minute.

check(DEPLOY_DIR) returns the problems found; deploy/tests/test_manifests.py
runs it.

versions(REPO) returns the problems with the release's one version: the
crate's (Cargo.toml), the chart's version and appVersion, the image tag
kustomization.yaml sets (and the one daemonset.yaml names), the chart's
default image tag (empty, so that the template falls back to appVersion),
the tags README.md and the chart's README install and the cluster suite
builds all name it, and CHANGELOG.md has a section for it.

upgrades(REPO) returns the `helm upgrade` commands of the READMEs that
would drop a later chart's defaults: each keeps them with
--reset-then-reuse-values or a values file, never --reuse-values (which
reuses the old chart's defaults, so a value a later chart adds is empty).
"""

import os
import re
import tomllib

import yaml

CONFIG_KEYS = {
    "runtime": {"endpoint", "timeout"},
    "gc": {"interval", "usage_poll_interval", "high_threshold_percent", "low_threshold_percent",
           "min_age", "max_age", "dry_run", "image_fs_path", "thrash_window", "order", "headroom",
           "high_inodes_percent", "low_inodes_percent"},
    "protect": {"images", "keep_recent_per_repository"},
    "state": {"dir"},
    "metrics": {"listen"},
    "kubelet": {"config", "config_dir", "args_file"},
    "kubernetes": {"enabled", "protect_pods", "room_before_pulls", "registry_manifests", "node_events",
                   "pods_stale_after"},
}
OPERATOR_EXTRAS = {"prometheusrule.yaml", "podmonitor.yaml"}
IMAGE = "ghcr.io/imagegc/imagegc"
# The chart's image when image.tag is empty: the chart's appVersion.
CHART_IMAGE = '"{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"'
# A version as the READMEs' install commands and the cluster suite's image
# write it: an image reference (imagegc:0.1.0), a kustomize newTag, a Helm
# --set image.tag. A placeholder (imagegc:NEW) is not a version.
README_TAGS = re.compile(r"(?:imagegc:|newTag: |image\.tag=)(\d[\w.+-]*)")
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
    gmp = load_all(os.path.join(deploy, "components", "alerts-gke", "rules.yaml"))[0]
    problems.check(gmp["spec"]["groups"] == [dict(g, interval="1m") for g in plain["groups"]],
                   "components/alerts-gke/rules.yaml's groups are not prometheus-rules.yaml's evaluated every 1m")
    namespace = objects["Namespace"]["metadata"]["name"]
    for name, doc in list(objects.items()) + [("PodMonitor", pm), ("PrometheusRule", pr), ("Rules", gmp)]:
        if name != "Namespace":
            problems.check(doc["metadata"].get("namespace") == namespace, f"{name} is not in namespace {namespace}")
    return problems



def versions(repo):
    problems = Problems()
    with open(os.path.join(repo, "Cargo.toml"), "rb") as f:
        version = tomllib.load(f)["package"]["version"]
    chart_dir = os.path.join(repo, "deploy", "helm", "imagegc")
    chart = load_all(os.path.join(chart_dir, "Chart.yaml"))[0]
    problems.check(str(chart.get("version")) == version,
                   f"Chart.yaml's version is {chart.get('version')}, the crate's (Cargo.toml) is {version}")
    problems.check(str(chart.get("appVersion")) == version,
                   f"Chart.yaml's appVersion is {chart.get('appVersion')}, the crate's (Cargo.toml) is {version}")
    values = load_all(os.path.join(chart_dir, "values.yaml"))[0]
    tag = values.get("image", {}).get("tag")
    problems.check(tag in ("", version),
                   f"the chart's default image.tag is {tag!r}: leave it empty (the chart's appVersion, {version})")
    with open(os.path.join(chart_dir, "templates", "daemonset.yaml"), encoding="utf-8") as f:
        problems.check(f"image: {CHART_IMAGE}" in f.read(),
                       "the chart's DaemonSet does not take its image tag from image.tag, else appVersion")

    deploy = os.path.join(repo, "deploy")
    kust = load_all(os.path.join(deploy, "kustomization.yaml"))[0]
    tags = [i.get("newTag") for i in kust.get("images", []) if i.get("name") == IMAGE]
    problems.check([str(t) for t in tags] == [version],
                   f"kustomization.yaml sets the tag of {IMAGE} to {tags}, expected [{version!r}]")
    for doc in load_all(os.path.join(deploy, "daemonset.yaml")):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            problems.check(container["image"] == f"{IMAGE}:{version}",
                           f"deploy/daemonset.yaml's image is {container['image']}, expected {IMAGE}:{version}")

    for name in ("README.md", os.path.join("deploy", "helm", "imagegc", "README.md"),
                 os.path.join("deploy", "tests", "cluster", "cluster.py")):
        with open(os.path.join(repo, name), encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                for match in README_TAGS.finditer(line):
                    found = match.group(1)
                    problems.check(found == version, f"{name}:{number} names version {found}, the release is {version}")

    path = os.path.join(repo, "CHANGELOG.md")
    if problems.check(os.path.isfile(path), "there is no CHANGELOG.md"):
        with open(path, encoding="utf-8") as f:
            heading = re.compile(rf"^## \[{re.escape(version)}\]( |$)")
            problems.check(any(heading.match(line) for line in f),
                           f"CHANGELOG.md has no section for {version} (a line starting '## [{version}]')")
    return problems


UPGRADE_READMES = ("README.md", os.path.join("deploy", "README.md"), os.path.join("deploy", "helm", "imagegc", "README.md"))


def upgrades(repo):
    problems = Problems()
    for name in UPGRADE_READMES:
        with open(os.path.join(repo, name), encoding="utf-8") as f:
            text = f.read()
        for block in re.findall(r"```(?:sh|console|bash)\n(.*?)```", text, re.S):
            for command in re.sub(r"\\\n\s*", " ", block).split("\n"):
                if "helm upgrade" not in command:
                    continue
                words = command.split()
                if "--reuse-values" in words:
                    problems.append(f"{name}: {command.strip()!r} reuses the old chart's defaults: "
                                    "use --reset-then-reuse-values")
                elif not any(w in ("--reset-then-reuse-values", "-f") or w.startswith("--values") for w in words):
                    problems.append(f"{name}: {command.strip()!r} drops the values set on the release: "
                                    "use --reset-then-reuse-values or a values file")
    return problems
