"""The Kubernetes manifests of deploy/ (kubectl apply -k deploy/)."""

import os

import pytest

from support import DEPLOY, K8S_VERSIONS, REPO, module, no_problems, output, run, tool


def resources():
    yaml = module("yaml")
    with open(os.path.join(DEPLOY, "kustomization.yaml"), encoding="utf-8") as f:
        return [os.path.join(DEPLOY, r) for r in yaml.safe_load(f)["resources"]]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_validate_strict_each_resource(version):
    run(tool("kubernetes-validate"), "--strict", "--kubernetes-version", version, *resources())


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kustomize_build_validates(kustomized, version):
    run(tool("kubernetes-validate"), "--strict", "--kubernetes-version", version, kustomized)


def crate_version():
    import tomllib

    with open(os.path.join(REPO, "Cargo.toml"), "rb") as f:
        return tomllib.load(f)["package"]["version"]


def test_kustomize_build_sets_the_image(kustomized):
    image = f"image: ghcr.io/imagegc/imagegc:{crate_version()}"
    assert image in kustomized.read_text(), f"the image is not set ({image})"


COMPONENTS = sorted(os.listdir(os.path.join(DEPLOY, "components")))


def build_with_component(work, component):
    """`kubectl kustomize` of an overlay of a copy of deploy/ with one
    component (kustomize wants relative paths), as parsed documents."""
    import shutil

    yaml = module("yaml")
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.skip("no kubectl here")
    root = work / f"component-{component}"
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(DEPLOY, root / "deploy", ignore=shutil.ignore_patterns("tests", "helm", "__pycache__"))
    (root / "overlay").mkdir()
    resources = ["../deploy"]
    if component == "scrape-namespace":
        # The component reads the namespace from the overlay's own local
        # ConfigMap, as its comment shows.
        (root / "overlay" / "scrape-namespace.yaml").write_text(SCRAPE_NAMESPACE)
        resources.append("scrape-namespace.yaml")
    (root / "overlay" / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{', '.join(resources)}]\ncomponents: [../deploy/components/{component}]\n")
    path = root / "built.yaml"
    path.write_text(output(kubectl, "kustomize", root / "overlay"))
    return path, [d for d in yaml.safe_load_all(path.read_text()) if d]


def operator_crds():
    """The prometheus-operator's CRDs (IMAGEGC_OPERATOR_CRDS), as test_helm.py finds them."""
    from support import missing

    path = os.environ.get("IMAGEGC_OPERATOR_CRDS")
    if not path or not os.path.isfile(os.path.join(path, "monitoring.coreos.com_podmonitors.yaml")):
        missing("operator-crds", f"no monitoring.coreos.com_podmonitors.yaml in IMAGEGC_OPERATOR_CRDS={path}")
    return path


# What each component adds besides core kinds, validated against its CRD:
# the operator's (from its Go module) or the managed stacks' (deploy/tests/crds).
COMPONENT_CRD_KINDS = {
    "scrape-openshift": [("monitoring.coreos.com", "PodMonitor")],
    "scrape-gke": [("monitoring.googleapis.com", "PodMonitoring")],
    "alerts-gke": [("monitoring.googleapis.com", "Rules")],
    "scrape-aks": [("azmonitoring.coreos.com", "PodMonitor")],
    "cilium-kube-apiserver": [("cilium.io", "CiliumNetworkPolicy")],
}


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_builds_and_validates(work, component):
    module("jsonschema")
    import check_helm

    path, _ = build_with_component(work, component)
    core = f"{path}.core"
    no_problems(check_helm.split(path, core), f"components/{component}")
    run(tool("kubernetes-validate"), "--strict", "--kubernetes-version", K8S_VERSIONS[0], core)
    kinds = COMPONENT_CRD_KINDS.get(component, [])
    operator = [k for g, k in kinds if g == "monitoring.coreos.com"]
    if operator:
        no_problems(check_helm.crds(path, operator_crds(), operator), f"components/{component} against the CRDs")
    no_problems(check_helm.platform_crds(path, [k for k in kinds if k[0] != "monitoring.coreos.com"]),
                f"components/{component} against the CRDs")


def test_every_component_is_listed_in_deploy_readme():
    with open(os.path.join(DEPLOY, "README.md"), encoding="utf-8") as f:
        text = f.read()
    unlisted = [c for c in COMPONENTS if f"`{c}`" not in text and f"`components/{c}`" not in text]
    no_problems(unlisted, "components deploy/README.md does not name")


def test_openshift_component_grants_the_privileged_scc_and_spc_t(work):
    _, docs = build_with_component(work, "openshift")
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    assert role["rules"] == [{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                              "resourceNames": ["privileged"], "verbs": ["use"]}], role["rules"]
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding"]
    assert binding["metadata"]["namespace"] == "imagegc" and binding["roleRef"]["name"] == role["metadata"]["name"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": ds["spec"]["template"]["spec"][
        "serviceAccountName"], "namespace": "imagegc"}]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    security = container["securityContext"]
    assert security["seLinuxOptions"] == {"type": "spc_t"}
    assert security["capabilities"] == {"drop": ["ALL"]} and security["privileged"] is False


def test_deploy_files_agree_ports_paths_mounts_security():
    module("yaml")
    import check_manifests

    no_problems(check_manifests.check(DEPLOY), "deploy/ files disagree")


def test_one_version_for_crate_chart_image_and_changelog():
    module("yaml")
    import check_manifests

    no_problems(check_manifests.versions(REPO), "the release's version differs")


def test_upgrade_commands_keep_new_chart_defaults():
    import check_manifests

    no_problems(check_manifests.upgrades(REPO), "README upgrade commands")


def kustomize_overlay(work, name, components, files=None):
    """`kustomize build` of an overlay of deploy/ with these components and
    extra resource files ({file name: YAML text}): the documents, or the
    failed build's error."""
    import shutil
    import subprocess

    yaml = module("yaml")
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here")
    overlay = work / f"overlay-{name}"
    overlay.mkdir()
    deploy = os.path.relpath(DEPLOY, overlay)
    for file, text in (files or {}).items():
        (overlay / file).write_text(text)
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [deploy, *(files or {})],
        "components": [f"{deploy}/components/{c}" for c in components]}))
    proc = subprocess.run([kubectl, "kustomize", str(overlay)], capture_output=True, text=True)
    if proc.returncode != 0:
        return None, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d], None


def network_policy(docs):
    (policy,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    return policy["spec"]


def test_kubernetes_component_reaches_the_api_server_on_its_usual_ports_and_microk8s(work):
    # 443: the kubernetes Service; 6443: the usual port of its endpoints;
    # 16443: MicroK8s's. Nothing else leaves the pod (no DNS: imagegc
    # reaches KUBERNETES_SERVICE_HOST, an address).
    base, _ = kustomize_overlay(work, "base", [])
    assert network_policy(base)["egress"] == []
    docs, error = kustomize_overlay(work, "kubernetes", ["kubernetes"])
    assert error is None, error
    assert network_policy(docs)["egress"] == [{
        "to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}],
        "ports": [{"protocol": "TCP", "port": p} for p in (443, 6443, 16443)],
    }]


def test_registry_manifests_component_turns_it_on_with_the_images_certificates_and_dns_and_https_out(work):
    docs, error = kustomize_overlay(work, "registries", ["kubernetes", "registry-manifests"])
    assert error is None, error
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["IMAGEGC_KUBERNETES"] == "true" and env["IMAGEGC_REGISTRY_MANIFESTS"] == "true", env
    # The image's root certificates (SSL_CERT_FILE, set by the image) are
    # read: nothing of the node's is mounted over them or named instead.
    assert not [m for m in container["volumeMounts"] if m["mountPath"].startswith("/etc/ssl")], container["volumeMounts"]
    assert "SSL_CERT_FILE" not in env and "SSL_CERT_DIR" not in env, env
    anywhere = [{"ipBlock": {"cidr": "0.0.0.0/0"}}, {"ipBlock": {"cidr": "::/0"}}]
    assert network_policy(docs)["egress"] == [
        {"to": anywhere, "ports": [{"protocol": "TCP", "port": p} for p in (443, 6443, 16443)]},
        {"to": anywhere, "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53},
                                   {"protocol": "TCP", "port": 443}]},
    ]


SCRAPE_NAMESPACE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: imagegc-scrape-namespace
  annotations:
    config.kubernetes.io/local-config: "true"
data:
  namespace: gmp-system
"""


def test_scrape_namespace_component_admits_the_namespace_the_overlay_names(work):
    # As deploy/components/scrape-namespace documents it: GKE's managed
    # collectors scrape from gmp-system.
    docs, error = kustomize_overlay(work, "scrape", ["kubernetes", "scrape-namespace"],
                                    {"scrape-namespace.yaml": SCRAPE_NAMESPACE})
    assert error is None, error
    (peer,) = network_policy(docs)["ingress"][0]["from"]
    assert peer == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gmp-system"}}}
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert ("ConfigMap", "imagegc-scrape-namespace") not in names, "the local ConfigMap would be applied"
    # Forgotten, it fails the build and names what is missing.
    _, error = kustomize_overlay(work, "scrape-forgotten", ["scrape-namespace"])
    assert error is not None and "imagegc-scrape-namespace" in error, error


def test_readme_blocks_the_cluster_suite_runs_are_there_and_parse():
    """deploy/tests/cluster/test_5_readme.py runs README's marked blocks on
    the cluster; without one, check here that each it runs is still marked,
    is bash, and says what that test relies on."""
    import re
    import subprocess

    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = {}
    # The cluster suite's own pattern (test_5_readme.readme_blocks).
    for m in re.finditer(r"<!-- readme-test: ([a-z-]+) -->\n([ \t]*)```sh\n(.*?)\n[ \t]*```", text, re.S):
        indent = m.group(2)
        lines = [line[len(indent):] if line.startswith(indent) else line for line in m.group(3).split("\n")]
        blocks[m.group(1)] = "\n".join(lines) + "\n"
    for name in ("install-kustomize", "install-helm", "verify", "confirm", "takeover-kustomize", "takeover-helm",
                 "uninstall-kustomize", "uninstall-helm"):
        assert name in blocks, f"README has no block marked readme-test: {name}"
        proc = subprocess.run(["bash", "-n"], input=blocks[name], capture_output=True, text=True)
        assert proc.returncode == 0, f"README block {name} is not bash: {proc.stderr}"
    assert "  # - ../deploy/components/k3s\n" in blocks["install-kustomize"]
    assert re.search(r"helm install [^\n]*\\\n", blocks["install-helm"])
    for how in ("kustomize", "helm"):
        assert "/imagegc check-config" in blocks[f"takeover-{how}"]
    assert "-l app.kubernetes.io/name=imagegc" in blocks["confirm"] and "spec.nodeName=" in blocks["confirm"]
    # The label and namespace the confirm block selects by are the pods'.
    yaml = module("yaml")
    with open(os.path.join(DEPLOY, "daemonset.yaml"), encoding="utf-8") as f:
        ds = yaml.safe_load(f)
    assert ds["metadata"]["namespace"] == "imagegc" and "kubectl -n imagegc get pod" in blocks["confirm"]
    assert ds["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "imagegc"
    with open(os.path.join(DEPLOY, "helm", "imagegc", "Chart.yaml"), encoding="utf-8") as f:
        assert yaml.safe_load(f)["name"] == "imagegc", "the chart's pods carry app.kubernetes.io/name: <chart name>"


def kubelet_parts(built):
    """The DaemonSet's kubelet volumes, mounts and variables in a build."""
    yaml = module("yaml")
    (ds,) = [d for d in yaml.safe_load_all(built) if d and d["kind"] == "DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    volumes = [v for v in pod["volumes"] if "kubelet" in v["name"]]
    mounts = [m for m in c["volumeMounts"] if "kubelet" in m["name"]]
    env = {e["name"]: e.get("value") for e in c.get("env", []) if e["name"].startswith("IMAGEGC_KUBELET")}
    return volumes, mounts, env


def test_the_kubelets_file_is_mounted_only_with_its_component(kustomized, work):
    # kubectl apply -k deploy/ mounts nothing of the kubelet's: a node that
    # keeps its file elsewhere, or has none, still starts the pod.
    assert kubelet_parts(kustomized.read_text()) == ([], [], {})
    # deploy/components/kubelet-config: kubeadm's file, read-only.
    import shutil

    from support import output

    overlay = work / "kubelet-config-overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(DEPLOY, overlay)}\n"
        f"components:\n  - {os.path.relpath(os.path.join(DEPLOY, 'components', 'kubelet-config'), overlay)}\n")
    # As the kustomized fixture builds deploy/: kubectl's kustomize, or kustomize.
    kubectl, kustomize = shutil.which("kubectl"), shutil.which("kustomize")
    build = [kubectl, "kustomize"] if kubectl else [kustomize, "build"]
    volumes, mounts, env = kubelet_parts(output(*build, str(overlay)))
    path = "/var/lib/kubelet/config.yaml"
    assert volumes == [{"name": "kubelet-config", "hostPath": {"path": path, "type": "File"}}]
    assert mounts == [{"name": "kubelet-config", "mountPath": path, "readOnly": True}]
    assert env == {"IMAGEGC_KUBELET_CONFIG": path}


def component_parts(work, name, components):
    """The DaemonSet's kubelet volumes, mounts and variables, and the
    NetworkPolicy's scrape namespace, of an overlay with COMPONENTS."""
    docs, error = kustomize_overlay(work, name, components)
    assert error is None, error
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    volumes, mounts, env = kubelet_parts(module("yaml").safe_dump(ds))
    (peer,) = network_policy(docs)["ingress"][0]["from"]
    return docs, (volumes, mounts, env), peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]


@pytest.mark.parametrize("component,volume,env", [
    # EKS AL2023 (awslabs/amazon-eks-ami, nodeadm/internal/kubelet/config.go):
    # the directory of config.json and config.json.d, which exists on every node.
    ("kubelet-config-eks-al2023",
     {"name": "kubelet-config", "hostPath": {"path": "/etc/kubernetes/kubelet", "type": "Directory"}},
     {"IMAGEGC_KUBELET_CONFIG": "/etc/kubernetes/kubelet/config.json",
      "IMAGEGC_KUBELET_CONFIG_DIR": "/etc/kubernetes/kubelet/config.json.d"}),
    # MicroK8s (canonical/microk8s, the kubelite patch's args file).
    ("kubelet-args-microk8s",
     {"name": "kubelet-args-file", "hostPath": {"path": "/var/snap/microk8s/current/args/kubelet", "type": "File"}},
     {"IMAGEGC_KUBELET_ARGS_FILE": "/var/snap/microk8s/current/args/kubelet"}),
    # AKS (Azure/AgentBaker, cse_config.sh): /etc/default/kubelet's
    # KUBELET_FLAGS on every node, kubeletconfig.json beside it where the
    # node pool has a kubelet configuration of its own.
    ("kubelet-config-aks",
     {"name": "kubelet-config", "hostPath": {"path": "/etc/default", "type": "Directory"}},
     {"IMAGEGC_KUBELET_CONFIG": "/etc/default/kubeletconfig.json",
      "IMAGEGC_KUBELET_ARGS_FILE": "/etc/default/kubelet"}),
    # Bottlerocket (bottlerocket-core-kit, kubelet-exec-start-conf: --config).
    ("kubelet-config-bottlerocket",
     {"name": "kubelet-config", "hostPath": {"path": "/etc/kubernetes/kubelet/config", "type": "File"}},
     {"IMAGEGC_KUBELET_CONFIG": "/etc/kubernetes/kubelet/config"}),
])
def test_kubelet_components_mount_read_only_what_they_name(work, component, volume, env):
    _, (volumes, mounts, got_env), _ = component_parts(work, component, [component])
    assert volumes == [volume]
    path = volume["hostPath"]["path"]
    assert mounts == [{"name": volume["name"], "mountPath": path, "readOnly": True}]
    assert got_env == env
    # Each variable names a path inside what is mounted.
    assert all(v == path or v.startswith(path.rstrip("/") + "/") for v in env.values()), env


def test_microk8s_args_file_goes_with_the_runtime_component(work):
    docs, (volumes, _, env), _ = component_parts(work, "microk8s-both", ["microk8s", "kubelet-args-microk8s"])
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    paths = [v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"] if "hostPath" in v]
    assert "/var/snap/microk8s/common/run" in paths and "/var/snap/microk8s/current/args/kubelet" in paths, paths


@pytest.mark.parametrize("component,namespace,kind", [
    ("scrape-gke", "gmp-system", ("monitoring.googleapis.com/v1", "PodMonitoring")),
    ("scrape-aks", "kube-system", ("azmonitoring.coreos.com/v1", "PodMonitor")),
    ("scrape-openshift", "openshift-user-workload-monitoring", ("monitoring.coreos.com/v1", "PodMonitor")),
])
def test_scrape_components_admit_their_collectors_and_select_imagegcs_pods(work, component, namespace, kind):
    docs, _, admitted = component_parts(work, component, [component])
    assert admitted == namespace
    (monitor,) = [d for d in docs if (d["apiVersion"], d["kind"]) == kind]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert monitor["metadata"]["namespace"] == ds["metadata"]["namespace"]
    assert monitor["spec"]["selector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    endpoints = monitor["spec"].get("endpoints") or monitor["spec"].get("podMetricsEndpoints")
    assert [(e["port"], e["path"]) for e in endpoints] == [("metrics", "/metrics")]
    # The node's name as `node`, which the alerts and the dashboard use;
    # the job ImagegcDown matches (job=~"(.*/)?imagegc": the name, or
    # namespace/name).
    if kind[1] == "PodMonitoring":
        assert "node" in monitor["spec"]["targetLabels"]["metadata"]
    else:
        assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"} in endpoints[0]["relabelings"]
    assert monitor["metadata"]["name"] == "imagegc"


def test_openshift_scrape_component_carries_deploys_podmonitor():
    yaml = module("yaml")
    with open(os.path.join(DEPLOY, "podmonitor.yaml"), encoding="utf-8") as f:
        want = yaml.safe_load(f)
    with open(os.path.join(DEPLOY, "components", "scrape-openshift", "podmonitor.yaml"), encoding="utf-8") as f:
        got = yaml.safe_load(f)
    assert got == want, "components/scrape-openshift/podmonitor.yaml differs from deploy/podmonitor.yaml"


def test_cilium_component_reaches_the_api_server_by_its_entity_on_the_kubernetes_ports(work):
    docs, _, _ = component_parts(work, "cilium", ["kubernetes", "cilium-kube-apiserver"])
    (policy,) = [d for d in docs if d["kind"] == "CiliumNetworkPolicy"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert policy["spec"]["endpointSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    (rule,) = policy["spec"]["egress"]
    assert rule["toEntities"] == ["kube-apiserver"]
    (ports,) = rule["toPorts"]
    # The same ports as the NetworkPolicy's egress to the API server.
    (egress,) = network_policy(docs)["egress"]
    assert ports["ports"] == [{"port": str(p["port"]), "protocol": p["protocol"]} for p in egress["ports"]]
