"""What the manifests and the chart render, before any cluster: the runtime
components (CRI-O, k3s, RKE2, MicroK8s) mount what they name and agree
with the chart's values for the same runtime; the kubelet's file is mounted
read-only and named to imagegc, by the component and by the Helm value; the
DaemonSet stays off virtual nodes and on the image's architectures; the
chart's alerts follow the release name; the shipped configurations stay
below the kubelet's default eviction line with no warning from imagegc.
These need kubectl, helm and the static imagegc, not the cluster."""

import os
import re
import subprocess
import tempfile

import pytest
import yaml

from conftest import _env
from deploy import CHART, DEPLOY, REPO

RUNTIMES = {
    # component: (socket directory, endpoint, runtime root)
    "crio": ("/run/crio", "unix:///run/crio/crio.sock", "/var/lib/containers/storage"),
    "k3s": ("/run/k3s/containerd", "unix:///run/k3s/containerd/containerd.sock",
            "/var/lib/rancher/k3s/agent/containerd"),
    "rke2": ("/run/k3s/containerd", "unix:///run/k3s/containerd/containerd.sock",
             "/var/lib/rancher/rke2/agent/containerd"),
    "microk8s": ("/var/snap/microk8s/common/run", "unix:///var/snap/microk8s/common/run/containerd.sock",
                 "/var/snap/microk8s/common/var/lib/containerd"),
}
KUBELET_FILE = "/var/lib/kubelet/config.yaml"


def tool(name):
    return os.path.join(_env("IMAGEGC_KUBERNETES_BIN"), name)


def run(*argv):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"{' '.join(argv)} exited {p.returncode}: {p.stderr}"
    return p.stdout


def kustomize(components):
    with tempfile.TemporaryDirectory(dir=os.path.join(REPO, "target")) as overlay:
        rel = os.path.relpath(DEPLOY, overlay)
        with open(os.path.join(overlay, "kustomization.yaml"), "w") as f:
            yaml.safe_dump({"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                            "resources": [rel], "components": [f"{rel}/components/{c}" for c in components]}, f)
        return list(yaml.safe_load_all(run(tool("kubectl"), "kustomize", overlay)))


def helm(release="imagegc", *sets, values=None):
    args = [tool("helm"), "template", release, CHART, "--namespace", "imagegc", "--kube-version", "1.34.4"]
    for s in sets:
        args += ["--set", s]
    if values:
        args += ["--values", values]
    return [d for d in yaml.safe_load_all(run(*args)) if d]


def daemonset(docs):
    return next(d for d in docs if d["kind"] == "DaemonSet")


def pod_view(ds):
    """What the runtime settings decide: host paths, mounts, the endpoint."""
    spec = ds["spec"]["template"]["spec"]
    c = spec["containers"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    args = c["args"]
    return {"volumes": volumes, "mounts": mounts, "env": env,
            "endpoint_arg": args[args.index("--runtime-endpoint") + 1], "spec": spec}


@pytest.mark.parametrize("component", sorted(RUNTIMES))
def test_a_runtime_component_mounts_what_it_names_and_agrees_with_the_chart(component):
    socket_dir, endpoint, root = RUNTIMES[component]
    v = pod_view(daemonset(kustomize([component])))
    assert v["volumes"]["runtime-socket-dir"]["hostPath"]["path"] == socket_dir
    assert v["mounts"]["runtime-socket-dir"]["mountPath"] == socket_dir
    assert v["mounts"]["runtime-socket-dir"]["readOnly"] is True
    assert endpoint.startswith(f"unix://{socket_dir}/")
    assert v["endpoint_arg"] == endpoint and v["env"]["IMAGEGC_RUNTIME_ENDPOINT"] == endpoint
    assert v["volumes"]["runtime-root"]["hostPath"]["path"] == root
    assert v["mounts"]["runtime-root"]["mountPath"] == root
    assert v["mounts"]["runtime-root"]["readOnly"] is True
    # The chart's values file for the same runtime says the same.
    h = pod_view(daemonset(helm(values=os.path.join(CHART, "runtimes", f"{component}.yaml"))))
    for name in ("runtime-socket-dir", "runtime-root"):
        assert h["volumes"][name] == v["volumes"][name], name
        assert h["mounts"][name] == v["mounts"][name], name
    assert h["env"]["IMAGEGC_RUNTIME_ENDPOINT"] == endpoint == h["endpoint_arg"]


def test_the_kubelet_file_is_mounted_read_only_and_named_by_the_component_and_the_chart():
    base = pod_view(daemonset(kustomize([])))
    assert "kubelet-config" not in base["volumes"] and "IMAGEGC_KUBELET_CONFIG" not in base["env"]
    for v in (pod_view(daemonset(kustomize(["kubelet-config"]))),
              pod_view(daemonset(helm("imagegc", f"kubelet.configPath={KUBELET_FILE}")))):
        assert v["volumes"]["kubelet-config"]["hostPath"] == {"path": KUBELET_FILE, "type": "File"}
        assert v["mounts"]["kubelet-config"] == {"name": "kubelet-config", "mountPath": KUBELET_FILE,
                                                 "readOnly": True}
        assert v["env"]["IMAGEGC_KUBELET_CONFIG"] == KUBELET_FILE
    helm_default = pod_view(daemonset(helm()))
    assert "kubelet-config" not in helm_default["volumes"]


def test_commands_run_in_the_pod_get_its_configuration_and_runtime():
    for v in (pod_view(daemonset(kustomize([]))), pod_view(daemonset(helm())),
              pod_view(daemonset(kustomize(["k3s"])))):
        assert v["env"]["IMAGEGC_CONFIG"] == "/etc/imagegc/imagegc.toml"
        assert v["env"]["IMAGEGC_RUNTIME_ENDPOINT"] == v["endpoint_arg"]


def test_the_daemonset_keeps_off_virtual_nodes_and_to_the_image_architectures():
    for spec in (pod_view(daemonset(kustomize([])))["spec"], pod_view(daemonset(helm()))["spec"]):
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"]
        assert len(terms) == 1
        exprs = {e["key"]: (e["operator"], e["values"]) for e in terms[0]["matchExpressions"]}
        assert exprs["eks.amazonaws.com/compute-type"] == ("NotIn", ["fargate"])
        assert exprs["type"] == ("NotIn", ["virtual-kubelet"])
        assert exprs["kubernetes.io/arch"] == ("In", ["amd64", "arm64"])
        assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}


@pytest.mark.parametrize("release,fullname", [("imagegc", "imagegc"), ("gc", "gc-imagegc")])
def test_the_charts_alerts_follow_the_release_name(release, fullname):
    docs = helm(release, "prometheusRule.enabled=true", "podMonitor.enabled=true")
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    monitor = next(d for d in docs if d["kind"] == "PodMonitor")
    # The Prometheus Operator names a PodMonitor's job <namespace>/<name>.
    job = f"{monitor['metadata']['namespace']}/{monitor['metadata']['name']}"
    down = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "ImagegcDown")
    assert f'up{{job=~"(.*/)?{fullname}"}}' in down["expr"], down["expr"]
    pattern = re.search(r'job=~"([^"]+)"', down["expr"]).group(1)
    assert re.fullmatch(pattern, job), (pattern, job)
    assert re.fullmatch(pattern, fullname)  # a ServiceMonitor's job: the Service's name
    absent = next(r for g in rule["spec"]["groups"] for r in g["rules"] if r.get("alert") == "ImagegcAbsent")
    assert f"get daemonset {fullname}" in absent["annotations"]["description"]


def check_config(config, kubelet_text):
    with tempfile.TemporaryDirectory() as d:
        kubelet = os.path.join(d, "config.yaml")
        with open(kubelet, "w") as f:
            f.write(kubelet_text)
        p = subprocess.run([_env("IMAGEGC_STATIC_BIN"), "check-config", "--config", config,
                            "--kubelet-config", kubelet], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    return p.stdout + p.stderr


def test_shipped_configurations_stay_below_the_kubelets_default_eviction_line():
    handed_over = "kind: KubeletConfiguration\nimageGCHighThresholdPercent: 100\nimageMaximumGCAge: 0s\n"
    rendered = next(d for d in helm() if d["kind"] == "ConfigMap")["data"]["imagegc.toml"]
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as chart_config:
        chart_config.write(rendered)
        chart_config.flush()
        for config in (os.path.join(DEPLOY, "imagegc.toml"), os.path.join(REPO, "systemd", "imagegc.toml"),
                       chart_config.name):
            out = check_config(config, handed_over)
            assert "warning" not in out.lower(), f"{config}:\n{out}"
    # The built-in defaults (80/75) are below it too.
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as empty:
        out = check_config(empty.name, handed_over)
    assert "warning" not in out.lower(), out
    # At 85 (the kubelet's own image GC threshold), imagegc would start where
    # the kubelet's default evictionHard evicts: it says so, naming the default.
    with tempfile.NamedTemporaryFile("w", suffix=".toml") as at_85:
        at_85.write("[gc]\nhigh_threshold_percent = 85\nlow_threshold_percent = 80\n")
        at_85.flush()
        out = check_config(at_85.name, handed_over)
    assert "imagefs.available 15%" in out and "the kubelet's default" in out, out


RBAC_RULES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
              {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]
EVENTS_RULES = [{"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]}]


def test_kubernetes_awareness_adds_exactly_its_rbac_token_and_egress():
    for docs in (kustomize([]), helm()):
        kinds = {d["kind"] for d in docs}
        assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}, kinds
        assert daemonset(docs)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    for name, docs in (("component", kustomize(["kubernetes"])), ("chart", helm("imagegc", "kubernetes.enabled=true"))):
        roles = [d for d in docs if d["kind"] == "ClusterRole"]
        assert len(roles) == 1 and roles[0]["rules"] == RBAC_RULES, (name, roles)
        bindings = [d for d in docs if d["kind"] == "ClusterRoleBinding"]
        assert len(bindings) == 1, (name, bindings)
        assert bindings[0]["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                          "name": roles[0]["metadata"]["name"]}, name
        account = next(d for d in docs if d["kind"] == "ServiceAccount")
        assert bindings[0]["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                            "namespace": "imagegc"}], name
        # Events only in `default`, where imagegc posts them.
        (events,) = [d for d in docs if d["kind"] == "Role"]
        assert events["metadata"]["namespace"] == "default" and events["rules"] == EVENTS_RULES, (name, events)
        (events_binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
        assert events_binding["metadata"]["namespace"] == "default", (name, events_binding)
        assert events_binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                             "name": events["metadata"]["name"]}, name
        assert events_binding["subjects"] == bindings[0]["subjects"], name
        spec = daemonset(docs)["spec"]["template"]["spec"]
        assert spec["automountServiceAccountToken"] is True, name
        assert spec["serviceAccountName"] == account["metadata"]["name"], name
        egress = next(d for d in docs if d["kind"] == "NetworkPolicy")["spec"]["egress"]
        assert egress == [{"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}],
                           "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 6443},
                                     {"protocol": "TCP", "port": 16443}]}], name
        # Turned on: by the component's variable, by the chart's file.
        env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
        config = next(d for d in docs if d["kind"] == "ConfigMap")["data"]["imagegc.toml"]
        enabled = env.get("IMAGEGC_KUBERNETES") == "true" or "[kubernetes]\nenabled = true" in config
        assert enabled, (name, env, config)
        assert "NODE_NAME" in env and "POD_NAME" in env and "POD_NAMESPACE" in env, name
