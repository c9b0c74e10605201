"""Checks the Helm chart's renders (deploy/helm/imagegc) against deploy/ and
against the values they were rendered from. Each check returns the problems
it found (an empty list: none); deploy/tests/test_helm.py runs them.

  split(RENDER, CORE_OUT)
      writes the resources of core Kubernetes kinds to CORE_OUT (for
      kubernetes-validate) and lists the Prometheus Operator ones; any other
      kind is a problem, so nothing goes unvalidated.
  crds(RENDER, CRD_DIR, KINDS)
      validates every PodMonitor, ServiceMonitor and PrometheusRule against
      the openAPIV3Schema of the operator's own CRD (CRD_DIR holds
      monitoring.coreos.com_*.yaml), strictly: a field the schema does not
      name is an error, as the API server would drop it silently. The KINDS
      listed must be present.
  config(RENDER, OUT)
      writes the imagegc.toml of the render's ConfigMap to OUT.
  default(KUSTOMIZED, RENDER, DEPLOY_DIR)
      the chart's default render and `kustomize build deploy/` agree: the
      DaemonSet's pod spec, its update strategy, the ServiceAccount, the
      NetworkPolicy, the ResourceQuota, and the configuration (the rendered
      imagegc.toml says what deploy/imagegc.toml says). Only what Helm
      legitimately changes is normalised: the labels it adds, resource
      names, and the pod's config checksum annotation.
  monitors(PODMONITOR_RENDER, SERVICEMONITOR_RENDER, DEPLOY_DIR)
      the chart's PodMonitor is deploy/podmonitor.yaml (less Helm's labels),
      and its ServiceMonitor's endpoint relabels as that PodMonitor does.
  readme(CHART_DIR)
      every value of values.yaml (down to the leaves values.schema.json
      describes) has its row in the chart's README.md, and the README names
      no value the chart does not have.
  values(RENDER, VALUES, DEPLOY_DIR)
      a non-default render carries its values: image, runtime socket,
      ports, paths, configuration, scrape namespace, resources, monitoring
      resources, and the rules and dashboard of deploy/ verbatim.

A render that cannot be checked at all (no ConfigMap with imagegc.toml, a
CRD without the version used) raises Unusable.
"""

import copy
import json
import os
import tomllib

import jsonschema
import yaml

CORE_KINDS = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap", "DaemonSet", "Namespace", "NetworkPolicy",
              "ResourceQuota", "Service",
              "ServiceAccount"}
OPERATOR_KINDS = {"PodMonitor": "podmonitors", "ServiceMonitor": "servicemonitors",
                  "PrometheusRule": "prometheusrules"}
# The CRDs of the managed monitoring stacks, copied from their providers'
# sources into deploy/tests/crds/ (its README names the commits):
# (API group, kind) -> file.
PLATFORM_CRDS = {
    ("monitoring.googleapis.com", "PodMonitoring"): "monitoring.googleapis.com_podmonitorings.yaml",
    ("azmonitoring.coreos.com", "PodMonitor"): "azmonitoring.coreos.com_podmonitors.yaml",
    ("monitoring.googleapis.com", "Rules"): "monitoring.googleapis.com_rules.yaml",
}
PLATFORM_CRD_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crds")
# CiliumNetworkPolicy: its CRD (cilium/cilium,
# pkg/k8s/apis/cilium.io/client/crds/v2/ciliumnetworkpolicies.yaml) is
# 400 KB; cilium() checks the few fields imagegc's policy uses instead.
CILIUM_POLICY = ("cilium.io", "CiliumNetworkPolicy")
# Cilium's entities (cilium/cilium, pkg/policy/api/entity.go).
CILIUM_ENTITIES = {"all", "world", "cluster", "host", "init", "remote-node", "health", "none", "kube-apiserver"}
# Where the API server listens: the kubernetes Service's port, the usual
# port of its endpoints, and MicroK8s's.
API_SERVER_PORTS = (443, 6443, 16443)
# Labels the chart adds to deploy/'s app.kubernetes.io/name.
HELM_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by",
               "helm.sh/chart"}


class Unusable(Exception):
    """A render or a CRD that the checks cannot read."""


class Problems(list):
    def check(self, ok, message):
        if not ok:
            self.append(message)
        return ok

    def same(self, what, got, want, theirs="expected"):
        """Reports each path where got (the chart's) differs from want."""
        for path, g, w in differences(got, want):
            self.append(f"{what}: {path or '.'}: the chart has {json.dumps(g)}, {theirs} {json.dumps(w)}")


def differences(got, want, path=""):
    if isinstance(got, dict) and isinstance(want, dict):
        for key in sorted(set(got) | set(want), key=str):
            yield from differences(got.get(key), want.get(key), f"{path}.{key}")
    elif isinstance(got, list) and isinstance(want, list) and len(got) == len(want):
        for i, (g, w) in enumerate(zip(got, want)):
            yield from differences(g, w, f"{path}[{i}]")
    elif got != want:
        yield path, got, want


def load(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


def by_kind(docs):
    out = {}
    for d in docs:
        out.setdefault(d["kind"], []).append(d)
    return out


def node_config_map(docs):
    maps = [d for d in docs if d["kind"] == "ConfigMap" and "imagegc.toml" in d.get("data", {})]
    if len(maps) != 1:
        raise Unusable(f"expected one ConfigMap with imagegc.toml, found {len(maps)}")
    return maps[0]


def kind_of(doc):
    """(API group, kind) of a document."""
    group = doc["apiVersion"].rsplit("/", 1)[0] if "/" in doc["apiVersion"] else ""
    return group, doc["kind"]


def split(render, out):
    docs = load(render)
    core = [d for d in docs if d["kind"] in CORE_KINDS]
    checked = {("monitoring.coreos.com", k) for k in OPERATOR_KINDS} | set(PLATFORM_CRDS) | {CILIUM_POLICY}
    other = sorted({f"{g}/{k}" for g, k in map(kind_of, docs) if k not in CORE_KINDS and (g, k) not in checked})
    if other:
        return [f"{render}: kinds neither validated as core nor against their CRDs: {other}"]
    with open(out, "w", encoding="utf-8") as f:
        yaml.safe_dump_all(core, f, sort_keys=False)
    print(f"{len(core)} core resources: {sorted(d['kind'] for d in core)}")
    print(f"other resources: {sorted('/'.join(kind_of(d)) for d in docs if d['kind'] not in CORE_KINDS)}")
    return []


def strict(schema):
    """The CRD's schema with additionalProperties false wherever it names
    properties and does not allow others (what kubeconform --strict does)."""
    schema = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return schema


def crd_schema(crd_dir, kind, version):
    path = os.path.join(crd_dir, f"monitoring.coreos.com_{OPERATOR_KINDS[kind]}.yaml")
    (crd,) = load(path)
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            schema = strict(v["schema"]["openAPIV3Schema"])
            # metadata is the API server's ObjectMeta, which the CRD leaves open.
            schema["properties"]["metadata"] = {"type": "object"}
            return schema
    raise Unusable(f"{path}: no version {version}")


def crds(render, crd_dir, expected):
    problems = Problems()
    docs = [d for d in load(render) if kind_of(d) in {("monitoring.coreos.com", k) for k in OPERATOR_KINDS}]
    for kind in expected:
        problems.check(any(d["kind"] == kind for d in docs), f"{render}: no {kind}")
    for d in docs:
        group, version = d["apiVersion"].split("/")
        if not problems.check(group == "monitoring.coreos.com", f"{d['kind']}: apiVersion {d['apiVersion']}"):
            continue
        validator = jsonschema.Draft7Validator(crd_schema(crd_dir, d["kind"], version))
        errors = sorted(validator.iter_errors(d), key=lambda e: list(e.absolute_path))
        for e in errors:
            path = ".".join(str(p) for p in e.absolute_path)
            problems.append(f"{d['kind']}/{d['metadata']['name']}: {path}: {e.message}")
        if not errors:
            print(f"{d['kind']}/{d['metadata']['name']} matches the {version} CRD schema")
    return problems


def platform_crds(render, expected):
    """Every PodMonitoring and Rules (GKE) and azmonitoring PodMonitor (AKS) in RENDER
    against the openAPIV3Schema of its vendored CRD, strictly, and every
    CiliumNetworkPolicy against cilium(); EXPECTED, (group, kind) pairs,
    must be present."""
    problems = Problems()
    docs = [d for d in load(render) if kind_of(d) in PLATFORM_CRDS or kind_of(d) == CILIUM_POLICY]
    for key in expected:
        problems.check(any(kind_of(d) == tuple(key) for d in docs), f"{render}: no {'/'.join(key)}")
    for d in docs:
        group, kind = kind_of(d)
        version = d["apiVersion"].rsplit("/", 1)[1]
        if (group, kind) == CILIUM_POLICY:
            problems.extend(cilium(d))
            continue
        path = os.path.join(PLATFORM_CRD_DIR, PLATFORM_CRDS[(group, kind)])
        (crd,) = load(path)
        versions = {v["name"]: v for v in crd["spec"]["versions"]}
        if not problems.check(crd["spec"]["group"] == group and version in versions,
                              f"{kind}/{d['metadata']['name']}: {path} has no {group}/{version}"):
            continue
        schema = strict(versions[version]["schema"]["openAPIV3Schema"])
        schema["properties"]["metadata"] = {"type": "object"}
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(d), key=lambda e: list(e.absolute_path))
        for e in errors:
            problems.append(f"{kind}/{d['metadata']['name']}: {'.'.join(str(p) for p in e.absolute_path)}: {e.message}")
        if not errors:
            print(f"{group}/{kind}/{d['metadata']['name']} matches its {version} CRD schema ({path})")
    return problems


def release_rules(deploy, metadata):
    """deploy/prometheus-rules.yaml with the names of the release whose
    rules resource has METADATA: the job ImagegcDown matches, and the
    namespace and DaemonSet the descriptions name."""
    name, namespace = metadata["name"], metadata["namespace"]
    with open(os.path.join(deploy, "prometheus-rules.yaml"), encoding="utf-8") as f:
        return yaml.safe_load(f.read().replace('job=~"(.*/)?imagegc"', f'job=~"(.*/)?{name}"')
                              .replace("kubectl -n imagegc get pods", f"kubectl -n {namespace} get pods")
                              .replace("kubectl -n imagegc get daemonset imagegc",
                                       f"kubectl -n {namespace} get daemonset {name}"))


def cilium(doc):
    """What imagegc's CiliumNetworkPolicy uses, as cilium.io/v2 defines it:
    an endpointSelector of labels, egress rules of known entities and ports
    given as strings with TCP, UDP or ANY."""
    problems = Problems()
    name = f"CiliumNetworkPolicy/{doc['metadata'].get('name')}"
    problems.check(doc["apiVersion"] == "cilium.io/v2", f"{name}: apiVersion {doc['apiVersion']}")
    spec = doc.get("spec", {})
    problems.check(set(spec) <= {"endpointSelector", "egress", "ingress", "description"},
                   f"{name}: spec fields {sorted(spec)}")
    selector = spec.get("endpointSelector", {})
    problems.check(set(selector) == {"matchLabels"} and all(isinstance(v, str) for v in selector["matchLabels"].values()),
                   f"{name}: endpointSelector {selector}")
    for i, rule in enumerate(spec.get("egress", [])):
        problems.check(set(rule) <= {"toEntities", "toPorts"}, f"{name}: egress {i} fields {sorted(rule)}")
        unknown = set(rule.get("toEntities", [])) - CILIUM_ENTITIES
        problems.check(not unknown, f"{name}: egress {i}: entities Cilium does not have: {sorted(unknown)}")
        for to in rule.get("toPorts", []):
            for port in to.get("ports", []):
                problems.check(set(port) <= {"port", "protocol", "endPort"} and isinstance(port.get("port"), str)
                               and port.get("protocol", "ANY") in ("TCP", "UDP", "SCTP", "ANY"),
                               f"{name}: egress {i}: port {port}")
    return problems


def config(render, out):
    with open(out, "w", encoding="utf-8") as f:
        f.write(node_config_map(load(render))["data"]["imagegc.toml"])


def without_helm_labels(labels):
    """The labels deploy/ would have: the chart's, less those Helm adds."""
    return {k: v for k, v in (labels or {}).items() if k not in HELM_LABELS}


def pod_spec(ds, name):
    spec = copy.deepcopy(ds["spec"]["template"]["spec"])
    spec["serviceAccountName"] = spec["serviceAccountName"].replace(name, "NAME")
    for v in spec.get("volumes", []):
        if "configMap" in v:
            v["configMap"]["name"] = v["configMap"]["name"].replace(name, "NAME")
    return spec


def default(kustomized, render, deploy):
    problems = Problems()

    def agree(what, chart_has, kustomize_has):
        problems.same(what, chart_has, kustomize_has, "kustomize has")

    kust, chart = by_kind(load(kustomized)), by_kind(load(render))
    for kind in ("ServiceAccount", "ConfigMap", "DaemonSet", "NetworkPolicy", "ResourceQuota"):
        problems.check(len(chart.get(kind, [])) == 1, f"the default render has {len(chart.get(kind, []))} {kind}")
        problems.check(len(kust.get(kind, [])) == 1, f"the kustomize build has {len(kust.get(kind, []))} {kind}")
    for kind in set(chart) - {"ServiceAccount", "ConfigMap", "DaemonSet", "NetworkPolicy", "ResourceQuota"}:
        problems.append(f"the default render has a {kind}, which `kubectl apply -k deploy/` does not create")
    if problems:
        return problems

    k_ds, c_ds = kust["DaemonSet"][0], chart["DaemonSet"][0]
    k_name, c_name = k_ds["metadata"]["name"], c_ds["metadata"]["name"]
    agree("DaemonSet pod spec (image, args, env, ports, probes, resources, securityContext, "
                  "volumes, mounts, tolerations, nodeSelector, priorityClassName)",
                  pod_spec(c_ds, c_name), pod_spec(k_ds, k_name))
    agree("DaemonSet updateStrategy", c_ds["spec"]["updateStrategy"], k_ds["spec"]["updateStrategy"])
    for what, c, k in (("DaemonSet labels", c_ds["metadata"]["labels"], k_ds["metadata"]["labels"]),
                       ("pod labels", c_ds["spec"]["template"]["metadata"]["labels"],
                        k_ds["spec"]["template"]["metadata"]["labels"]),
                       ("selector", c_ds["spec"]["selector"]["matchLabels"], k_ds["spec"]["selector"]["matchLabels"])):
        agree(what + " (without Helm's)", without_helm_labels(c), k)
    c_ann = dict(c_ds["spec"]["template"]["metadata"].get("annotations", {}))
    problems.check(len(c_ann.pop("checksum/config", "")) == 64, "the pod template has no checksum/config annotation")
    agree("pod annotations", c_ann, k_ds["spec"]["template"]["metadata"].get("annotations", {}))

    agree("ServiceAccount automountServiceAccountToken",
                  chart["ServiceAccount"][0].get("automountServiceAccountToken"),
                  kust["ServiceAccount"][0].get("automountServiceAccountToken"))
    c_np = copy.deepcopy(chart["NetworkPolicy"][0]["spec"])
    c_np["podSelector"]["matchLabels"] = without_helm_labels(c_np["podSelector"]["matchLabels"])
    agree("NetworkPolicy spec", c_np, kust["NetworkPolicy"][0]["spec"])
    agree("ResourceQuota spec", chart["ResourceQuota"][0]["spec"], kust["ResourceQuota"][0]["spec"])

    # The configuration: same settings (the comments differ).
    with open(os.path.join(deploy, "imagegc.toml"), "rb") as f:
        want = tomllib.load(f)
    got = tomllib.loads(node_config_map(load(render))["data"]["imagegc.toml"])
    agree("imagegc.toml settings", got, want)
    for kind in ("ConfigMap", "DaemonSet"):
        agree(f"{kind} namespace", chart[kind][0]["metadata"]["namespace"], kust[kind][0]["metadata"]["namespace"])
    return problems


def kubelet(render, values_file):
    """The kubelet's file and drop-in directory: nothing of them in the pod
    unless kubelet.configPath / kubelet.configDir are set (a hostPath a node
    lacks keeps the pod in ContainerCreating); when set, each mounted
    read-only at its own path from a hostPath of the right type, and named
    to imagegc by its environment variable."""
    problems = Problems()
    v = {}
    if values_file:
        with open(values_file, encoding="utf-8") as f:
            v = (yaml.safe_load(f) or {}).get("kubelet", {})
    (ds,) = by_kind(load(render))["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    volumes = {x["name"]: x for x in pod["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    for key, name, var, kind in (("configPath", "kubelet-config", "IMAGEGC_KUBELET_CONFIG", "File"),
                                 ("configDir", "kubelet-config-dir", "IMAGEGC_KUBELET_CONFIG_DIR", "Directory"),
                                 ("argsFile", "kubelet-args-file", "IMAGEGC_KUBELET_ARGS_FILE", "File")):
        path = v.get(key, "")
        if not path:
            problems.check(name not in volumes, f"kubelet.{key} unset, but volume {name} is in the pod")
            problems.check(name not in mounts, f"kubelet.{key} unset, but {name} is mounted")
            problems.check(var not in env, f"kubelet.{key} unset, but {var} is set")
            continue
        problems.same(f"{name} hostPath", volumes.get(name, {}).get("hostPath"), {"path": path, "type": kind})
        problems.same(f"{name} mount", mounts.get(name), {"name": name, "mountPath": path, "readOnly": True})
        problems.same(var, env.get(var), path)
    problems.check(not any(x.get("hostPath", {}).get("path", "").startswith(("/var/lib/kubelet", "/etc/kubernetes"))
                           for n, x in volumes.items() if n not in ("kubelet-config", "kubelet-config-dir", "kubelet-args-file")),
                   "a kubelet path is mounted under another name")
    return problems


def values(render, values_file, deploy):
    problems = Problems()
    with open(values_file, encoding="utf-8") as f:
        v = yaml.safe_load(f)
    docs = by_kind(load(render))

    def one(kind):
        found = docs.get(kind, [])
        if len(found) != 1:
            problems.append(f"{render}: {len(found)} {kind}, expected one")
            raise Unusable("\n".join(problems))
        return found

    (ds,) = docs["DaemonSet"]
    pod = ds["spec"]["template"]
    (c,) = pod["spec"]["containers"]
    port = v["metrics"]["port"]
    problems.same("image", c["image"], f"{v['image']['repository']}:{v['image']['tag']}")
    problems.same("imagePullPolicy", c["imagePullPolicy"], v["image"]["pullPolicy"])
    problems.same("imagePullSecrets", pod["spec"].get("imagePullSecrets"), v["imagePullSecrets"])
    args = c["args"]
    problems.same("--runtime-endpoint", args[args.index("--runtime-endpoint") + 1], v["runtime"]["endpoint"])
    problems.same("extra args", args[-len(v["extraArgs"]):], v["extraArgs"])
    problems.same("containerPort", c["ports"][0]["containerPort"], port)
    problems.same("prometheus.io/port", pod["metadata"]["annotations"].get("prometheus.io/port"), str(port))
    for key, value in v["podAnnotations"].items():
        problems.same(f"pod annotation {key}", pod["metadata"]["annotations"].get(key), value)
    for key, value in v["podLabels"].items():
        problems.same(f"pod label {key}", pod["metadata"]["labels"].get(key), value)
    problems.same("resources", c["resources"], v["resources"])
    problems.same("tolerations", pod["spec"]["tolerations"], v["tolerations"])
    problems.same("nodeSelector", pod["spec"]["nodeSelector"], v["nodeSelector"])
    volumes = {x["name"]: x for x in pod["spec"]["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    problems.same("runtime socket hostPath", volumes["runtime-socket-dir"]["hostPath"]["path"], v["runtime"]["socketDir"])
    problems.same("runtime socket mount", mounts["runtime-socket-dir"]["mountPath"], v["runtime"]["socketDir"])
    problems.same("state hostPath", volumes["state"]["hostPath"]["path"], v["stateHostPath"])
    root = v["runtime"]["rootDir"]
    problems.same("runtime root hostPath", volumes.get("runtime-root", {}).get("hostPath", {}).get("path"), root)
    problems.same("runtime root mount", mounts.get("runtime-root", {}).get("mountPath"), root)
    problems.check(mounts.get("runtime-root", {}).get("readOnly") is True, "the runtime's root is mounted writable")
    # The image carries its root certificates (SSL_CERT_FILE); a node
    # directory of further ones is mounted beside them, never over them.
    node_certs = (v["kubernetes"]["enabled"] and v["kubernetes"].get("registryManifests", False)
                  and v["kubernetes"].get("registryCertificates", ""))
    problems.same("node certificates hostPath", volumes.get("node-certificates", {}).get("hostPath"),
                  {"path": node_certs, "type": "Directory"} if node_certs else None)
    problems.same("node certificates mount", mounts.get("node-certificates"),
                  {"name": "node-certificates", "mountPath": "/etc/ssl/node-certs", "readOnly": True}
                  if node_certs else None)
    env = {e["name"]: e.get("value") for e in c.get("env", [])}
    problems.same("SSL_CERT_DIR", env.get("SSL_CERT_DIR"), "/etc/ssl/node-certs" if node_certs else None)
    problems.check("SSL_CERT_FILE" not in env, "the pod sets SSL_CERT_FILE: the image's bundle would not be read")
    problems.check(not any(m["mountPath"].rstrip("/") in ("/etc/ssl", "/etc/ssl/certs") for m in c["volumeMounts"]),
                   "a volume is mounted over the image's /etc/ssl/certs")
    problems.same("runtime root propagation", mounts.get("runtime-root", {}).get("mountPropagation"), "HostToContainer")
    for d in [x for kind in docs.values() for x in kind]:
        for key, value in v["commonLabels"].items():
            problems.same(f"{d['kind']} label {key}", d["metadata"]["labels"].get(key), value)

    toml = tomllib.loads(node_config_map(load(render))["data"]["imagegc.toml"])
    gc = v["gc"]
    want = {
        "runtime": {"endpoint": "", "timeout": v["runtime"]["timeout"], "sandbox_image": v["runtime"]["sandboxImage"]},
        "gc": {"interval": gc["interval"], "usage_poll_interval": "30s",
               "high_threshold_percent": gc["highThresholdPercent"], "low_threshold_percent": gc["lowThresholdPercent"],
               "min_age": gc["minAge"], "max_age": gc["maxAge"], "dry_run": gc["dryRun"],
               "thrash_window": "1h", "order": gc.get("order", "reuse"),
               "headroom": gc.get("headroom", False),
               "high_inodes_percent": gc["highInodesPercent"],
               "low_inodes_percent": gc["lowInodesPercent"]},
        "protect": {"images": v["protect"]["images"],
                    "keep_recent_per_repository": v["protect"]["keepRecentPerRepository"]},
        "state": {"dir": "/var/lib/imagegc"},
        "metrics": {"listen": v["metrics"].get("listen") or f"0.0.0.0:{port}"},
        "kubernetes": {"enabled": v["kubernetes"]["enabled"], "protect_pods": v["kubernetes"]["protectPods"],
                       "room_before_pulls": v["kubernetes"]["roomBeforePulls"],
                       "registry_manifests": v["kubernetes"].get("registryManifests", False),
                       "node_events": v["kubernetes"]["nodeEvents"],
                       "pods_stale_after": v["kubernetes"]["podsStaleAfter"]},
    }
    if not v.get("state", {}).get("usageLog", True):
        want["state"]["usage_log"] = False
    for key, value in (("node_name", v["kubernetes"].get("nodeName")), ("kubeconfig", v["kubernetes"].get("kubeconfig"))):
        if value:
            want["kubernetes"][key] = value
    if v["kubernetes"].get("registryEndpoints"):
        want["kubernetes"]["registry_endpoints"] = v["kubernetes"]["registryEndpoints"]
    for extra in v.get("extraVolumes", []):
        problems.same(f"extra volume {extra['name']}", volumes.get(extra["name"]), extra)
    for extra in v.get("extraVolumeMounts", []):
        problems.same(f"extra mount {extra['name']}", mounts.get(extra["name"]), extra)
    if v["kubernetes"]["enabled"]:
        # Exactly the RBAC imagegc needs, for its account, and its token:
        # pods list/watch and nodes get cluster-wide, events only in
        # `default`, where it posts them.
        (role,) = one("ClusterRole")
        problems.same("ClusterRole rules", role["rules"],
                      [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
                       {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}])
        (binding,) = one("ClusterRoleBinding")
        problems.same("ClusterRoleBinding role", binding["roleRef"]["name"], role["metadata"]["name"])
        problems.same("ClusterRoleBinding subject", [s["name"] for s in binding["subjects"]],
                      [pod["spec"]["serviceAccountName"]])
        (events,) = one("Role")
        problems.same("Role namespace", events["metadata"].get("namespace"), "default")
        problems.same("Role rules", events["rules"],
                      [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}])
        (events_binding,) = one("RoleBinding")
        problems.same("RoleBinding namespace", events_binding["metadata"].get("namespace"), "default")
        problems.same("RoleBinding role", events_binding["roleRef"], {"apiGroup": "rbac.authorization.k8s.io",
                                                                     "kind": "Role",
                                                                     "name": events["metadata"]["name"]})
        problems.same("RoleBinding subject", [s["name"] for s in events_binding["subjects"]],
                      [pod["spec"]["serviceAccountName"]])
        problems.same("automountServiceAccountToken", pod["spec"]["automountServiceAccountToken"], True)
    else:
        problems.check(not any(docs.get(k) for k in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")),
                       "RBAC without kubernetes.enabled")
    if gc["imageFsPath"]:
        want["gc"]["image_fs_path"] = gc["imageFsPath"]
    problems.same("imagegc.toml", toml, want)
    problems.check(mounts["state"]["mountPath"] == toml["state"]["dir"], "state.dir is not the state mount")

    (np,) = one("NetworkPolicy")
    (peer,) = np["spec"]["ingress"][0]["from"]
    managed = [ns for on, ns in ((v.get("gke", {}).get("podMonitoring", {}).get("enabled"), "gmp-system"),
                                 (v.get("aks", {}).get("podMonitor", {}).get("enabled"), "kube-system"),
                                 (v.get("openshift", {}).get("userWorkloadMonitoring"),
                                  "openshift-user-workload-monitoring")) if on]
    problems.same("scrape namespace", peer["namespaceSelector"]["matchLabels"],
                  {"kubernetes.io/metadata.name": (managed or [v["networkPolicy"].get("scrapeNamespace", "monitoring")])[0]})
    problems.same("scrape pods", peer.get("podSelector", {}).get("matchLabels"), v["networkPolicy"]["scrapePodLabels"])
    problems.same("NetworkPolicy port", np["spec"]["ingress"][0]["ports"], [{"protocol": "TCP", "port": port}])
    registries = v["kubernetes"]["enabled"] and v["kubernetes"].get("registryManifests", False)
    if v["kubernetes"]["enabled"]:
        cidrs = v["networkPolicy"].get("apiServerCIDRs", ["0.0.0.0/0", "::/0"])
        egress = [{"to": [{"ipBlock": {"cidr": c}} for c in cidrs],
                   "ports": [{"protocol": "TCP", "port": p} for p in API_SERVER_PORTS]}]
        if registries:
            egress.append({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}],
                           "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53},
                                     {"protocol": "TCP", "port": 443}]})
        problems.same("NetworkPolicy egress", np["spec"]["egress"], egress)
    else:
        problems.same("NetworkPolicy egress", np["spec"]["egress"], [])

    if v.get("serviceMonitor", {}).get("enabled"):
        (svc,) = one("Service")
        problems.same("Service port", svc["spec"]["ports"][0]["port"], port)
        problems.same("Service selector", svc["spec"]["selector"], ds["spec"]["selector"]["matchLabels"])
        (sm,) = one("ServiceMonitor")
        problems.same("ServiceMonitor selector", sm["spec"]["selector"]["matchLabels"], svc["metadata"]["labels"]
                      and {k: svc["metadata"]["labels"][k] for k in sm["spec"]["selector"]["matchLabels"]})
        for key, value in v["serviceMonitor"]["labels"].items():
            problems.same(f"ServiceMonitor label {key}", sm["metadata"]["labels"].get(key), value)
    if v.get("prometheusRule", {}).get("enabled"):
        (rule,) = one("PrometheusRule")
        problems.check(rule["spec"] == release_rules(deploy, rule["metadata"]),
                       "the PrometheusRule's spec is not deploy/prometheus-rules.yaml with the release's names")
        for key, value in v["prometheusRule"]["labels"].items():
            problems.same(f"PrometheusRule label {key}", rule["metadata"]["labels"].get(key), value)
    if v.get("gke", {}).get("rules", {}).get("enabled"):
        (rule,) = one("Rules")
        expected = release_rules(deploy, rule["metadata"])
        for group in expected["groups"]:
            group["interval"] = v["gke"]["rules"]["interval"]
        problems.check(rule["spec"] == expected,
                       "the Rules' spec is not deploy/prometheus-rules.yaml with the release's names and "
                       "gke.rules.interval")
    if v.get("grafanaDashboard", {}).get("enabled"):
        (dash,) = [d for d in docs["ConfigMap"] if "imagegc.toml" not in d["data"]]
        problems.same("dashboard namespace", dash["metadata"]["namespace"], v["grafanaDashboard"]["namespace"])
        problems.same("dashboard sidecar label", dash["metadata"]["labels"].get("grafana_dashboard"), "1")
        with open(os.path.join(deploy, "grafana-dashboard.json"), encoding="utf-8") as f:
            problems.check(json.loads(dash["data"]["imagegc.json"]) == json.load(f),
                           "the dashboard ConfigMap does not carry deploy/grafana-dashboard.json")
    return problems


def monitors(pod_render, service_render, deploy):
    problems = Problems()
    (want,) = load(os.path.join(deploy, "podmonitor.yaml"))
    pods = [d for d in load(pod_render) if d["kind"] == "PodMonitor"]
    services = [d for d in load(service_render) if d["kind"] == "ServiceMonitor"]
    if not problems.check(len(pods) == 1 and len(services) == 1, "expected one PodMonitor and one ServiceMonitor"):
        return problems
    spec = copy.deepcopy(pods[0]["spec"])
    spec["selector"]["matchLabels"] = without_helm_labels(spec["selector"]["matchLabels"])
    problems.same("PodMonitor spec", spec, want["spec"], "deploy/podmonitor.yaml has")
    (endpoint,) = services[0]["spec"]["endpoints"]
    (wanted,) = want["spec"]["podMetricsEndpoints"]
    for key in ("port", "path", "relabelings", "metricRelabelings"):
        problems.same(f"ServiceMonitor endpoint {key}", endpoint.get(key), wanted.get(key),
                      "deploy/podmonitor.yaml has")
    return problems


def value_paths(schema, values, prefix=""):
    """Dotted paths of values.yaml, down to where the schema stops naming
    properties (free-form maps such as resources are one value)."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        sub = schema.get("properties", {}).get(key, {})
        if isinstance(value, dict) and "properties" in sub:
            yield from value_paths(sub, value, path + ".")
        else:
            yield path


# Values whose README default describes them in words rather than as YAML.
DESCRIBED_DEFAULTS = {"affinity", "updateStrategy", "resources"}


def schema_at(schema, path):
    """The values.schema.json node of a dotted value path, or None."""
    node = schema
    for part in path.split("."):
        node = node.get("properties", {}).get(part)
        if node is None:
            return None
    return node


def value_at(values, path):
    node = values
    for part in path.split("."):
        node = node[part]
    return node


def readme(chart):
    """The README's values table against values.yaml and its schema: a row
    for every value and none for a value the chart lacks; each row's
    default, written as YAML in backquotes (one per value the row names,
    or one for all), is the value values.yaml sets (but for DESCRIBED_DEFAULTS, which the
    table describes); every value is in values.schema.json."""
    problems = Problems()
    with open(os.path.join(chart, "values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f)
    with open(os.path.join(chart, "values.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    with open(os.path.join(chart, "README.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| `")]
    documented = set()
    paths = set(value_paths(schema, values))
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        names = [part.strip().strip("`") for part in cells[0].split(",")]
        documented.update(names)
        if len(cells) < 2 or not set(names) <= paths:
            continue
        defaults = [d.strip() for d in cells[1].split("`, `")]
        if len(defaults) == 1:
            defaults *= len(names)  # one default said once for all the row names
        written = len(defaults) == len(names) and cells[1].startswith("`") and cells[1].endswith("`")
        if not written:
            problems.check(set(names) <= DESCRIBED_DEFAULTS,
                           f"README.md's default for {', '.join(names)} is not one YAML value in backquotes "
                           f"per value: {cells[1]!r}")
            continue
        for name, default in zip(names, defaults):
            text = default.strip("`")
            try:
                said = yaml.safe_load(text)
            except yaml.YAMLError as err:
                problems.append(f"README.md's default for {name}, {text!r}, is not YAML: {err}")
                continue
            actual = value_at(values, name)
            problems.check(said == actual, f"README.md says {name} defaults to {text}; values.yaml has "
                                           f"{json.dumps(actual)}")
    for path in sorted(paths - documented):
        problems.append(f"README.md has no row for the value {path}")
    for path in sorted(documented - paths):
        problems.append(f"README.md documents {path}, which values.yaml does not have")
    for path in sorted(paths):
        problems.check(schema_at(schema, path) is not None, f"values.schema.json does not describe {path}")
    print(f"{len(paths)} values, each with its README row, its default there and its schema")
    return problems
