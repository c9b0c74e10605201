"""The Helm chart (deploy/helm/imagegc): lint, then its renders with the
default values and with each ci/*-values.yaml, for each Kubernetes version:
every core resource through kubernetes-validate --strict, every PodMonitor,
ServiceMonitor and PrometheusRule against the prometheus-operator's own CRD
schemas; the default render against `kustomize build deploy/`; the other
renders against their values; the packaged chart; bad values refused; the
rendered imagegc.toml through `imagegc check-config`."""

import difflib
import filecmp
import os

import pytest

from support import CHART, DEPLOY, K8S_VERSIONS, REPO, missing, module, no_problems, output, run, tool

# name -> (release, namespace, values file or None). The default render uses
# release and namespace "imagegc", as deploy/ does.
SETS = {
    "default": ("imagegc", "imagegc", None),
    "everything": ("other", "gc-system", os.path.join(CHART, "ci", "everything-values.yaml")),
    "podmonitor": ("imagegc", "monitoring", os.path.join(CHART, "ci", "podmonitor-values.yaml")),
    "openshift": ("imagegc", "imagegc", os.path.join(CHART, "ci", "openshift-values.yaml")),
    "gke": ("imagegc", "imagegc", os.path.join(CHART, "ci", "gke-values.yaml")),
    "aks": ("imagegc", "imagegc", os.path.join(CHART, "ci", "aks-values.yaml")),
    # A mixed fleet: two releases in one namespace, split by nodeSelector.
    "fleet-al2023": ("imagegc-al2023", "imagegc", os.path.join(CHART, "ci", "fleet-al2023-values.yaml")),
    "fleet-bottlerocket": ("imagegc-bottlerocket", "imagegc", os.path.join(CHART, "ci", "fleet-bottlerocket-values.yaml")),
}
EACH = [(name, version) for name in SETS for version in K8S_VERSIONS]


def values_flags(name):
    values = SETS[name][2]
    return ["--values", values] if values else []


class Helm:
    """helm, and the chart's renders (rendered once per session)."""

    def __init__(self, binary, work):
        self.binary = binary
        self.work = work
        self.renders = {}

    def render(self, name, version):
        if (name, version) not in self.renders:
            release, namespace, _ = SETS[name]
            path = self.work / f"{name}-{version}.yaml"
            path.write_text(output(self.binary, "template", release, CHART, "--namespace", namespace,
                                   "--kube-version", version, *values_flags(name)))
            self.renders[(name, version)] = path
        return self.renders[(name, version)]


@pytest.fixture(scope="module")
def helm(work):
    path = os.environ.get("IMAGEGC_HELM")
    if not path:
        missing("helm", "IMAGEGC_HELM is unset (scripts/check-deploy.sh builds helm from its Go module, "
                        "when Go is installed in /usr/local/go/bin)")
    if not os.access(path, os.X_OK):
        missing("helm", f"IMAGEGC_HELM={path} is not an executable")
    renders = work / "helm"
    renders.mkdir()
    return Helm(path, renders)


@pytest.fixture(scope="module")
def operator_crds():
    path = os.environ.get("IMAGEGC_OPERATOR_CRDS")
    if not path:
        missing("operator-crds", "IMAGEGC_OPERATOR_CRDS is unset (scripts/check-deploy.sh downloads "
                                 "the prometheus-operator's Go module, when Go is installed)")
    if not os.path.isfile(os.path.join(path, "monitoring.coreos.com_podmonitors.yaml")):
        missing("operator-crds", f"no monitoring.coreos.com_podmonitors.yaml in IMAGEGC_OPERATOR_CRDS={path}")
    return path


def check_helm():
    module("yaml")
    module("jsonschema")
    import check_helm

    return check_helm


def test_helm_files_are_deploys_rules_and_dashboard():
    # helm package does not follow symlinks: the chart keeps copies.
    problems = [f"{CHART}/files/{f} differs from deploy/{f}: cp deploy/{f} {CHART}/files/{f}"
                for f in ("prometheus-rules.yaml", "grafana-dashboard.json")
                if not filecmp.cmp(os.path.join(DEPLOY, f), os.path.join(CHART, "files", f), shallow=False)]
    no_problems(problems, "the chart's copies")


def test_helm_every_value_has_its_readme_row():
    no_problems(check_helm().readme(CHART), "the chart's README.md")


@pytest.mark.parametrize("name,version", EACH)
def test_helm_lint_strict(helm, name, version):
    run(helm.binary, "lint", "--strict", "--kube-version", version, CHART, *values_flags(name))


@pytest.mark.parametrize("name,version", EACH)
def test_helm_template_core_resources_validate(helm, name, version):
    render = helm.render(name, version)
    core = f"{render}.core"
    no_problems(check_helm().split(render, core), f"{name} render")
    run(tool("kubernetes-validate"), "--strict", "--kubernetes-version", version, core)


# Each set must render the operator kinds it turns on; deploy/'s own
# operator extras, which kubectl apply -k does not cover, too.
CRD_CASES = [(name, version, kinds) for name, kinds in (
    ("default", []), ("everything", ["ServiceMonitor", "PrometheusRule"]),
    ("podmonitor", ["PodMonitor", "PrometheusRule"]), ("openshift", ["PodMonitor"])) for version in K8S_VERSIONS]
CRD_CASES += [("deploy/podmonitor.yaml", None, ["PodMonitor"]), ("deploy/prometheusrule.yaml", None, ["PrometheusRule"])]


@pytest.mark.parametrize("name,version,kinds", CRD_CASES, ids=[f"{n}-{v}" if v else n for n, v, _ in CRD_CASES])
def test_operator_resources_match_the_crds(helm, operator_crds, name, version, kinds):
    path = helm.render(name, version) if version else os.path.join(REPO, name)
    no_problems(check_helm().crds(path, operator_crds, kinds), f"{name} against the CRD schemas")


# The managed stacks' kinds each set must render, against their CRDs
# (deploy/tests/crds) or, for Cilium, check_helm.cilium.
PLATFORM_CASES = [("default", []), ("gke", [("monitoring.googleapis.com", "PodMonitoring"),
                                             ("monitoring.googleapis.com", "Rules"),
                                             ("cilium.io", "CiliumNetworkPolicy")]),
                  ("aks", [("azmonitoring.coreos.com", "PodMonitor")]),
                  ("everything", [("cilium.io", "CiliumNetworkPolicy")])]


@pytest.mark.parametrize("name,kinds", PLATFORM_CASES, ids=[n for n, _ in PLATFORM_CASES])
def test_managed_monitoring_and_cilium_resources_match_their_crds(helm, name, kinds):
    no_problems(check_helm().platform_crds(helm.render(name, "1.26.0"), kinds), f"{name} against the CRDs")


@pytest.mark.parametrize("name,namespace", [("default", "monitoring"), ("gke", "gmp-system"), ("aks", "kube-system"),
                                            ("openshift", "openshift-user-workload-monitoring")])
def test_helm_network_policy_admits_the_namespace_its_scraper_runs_in(helm, name, namespace):
    yaml = module("yaml")
    (policy,) = [d for d in yaml.safe_load_all(helm.render(name, "1.26.0").read_text())
                 if d and d["kind"] == "NetworkPolicy"]
    (peer,) = policy["spec"]["ingress"][0]["from"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": namespace}


def test_helm_cilium_policy_only_with_kubernetes_awareness(helm):
    yaml = module("yaml")
    docs = [d for d in yaml.safe_load_all(helm.render("gke", "1.26.0").read_text()) if d]
    (policy,) = [d for d in docs if d["kind"] == "CiliumNetworkPolicy"]
    (np,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    assert policy["spec"]["endpointSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"]
    (rule,) = policy["spec"]["egress"]
    assert rule["toEntities"] == ["kube-apiserver"]
    assert rule["toPorts"][0]["ports"] == [{"port": str(p["port"]), "protocol": p["protocol"]}
                                           for p in np["spec"]["egress"][0]["ports"]]
    import subprocess

    off = subprocess.run([helm.binary, "template", "imagegc", CHART, "--kube-version", "1.26.0",
                          "--set", "networkPolicy.ciliumApiServer=true"], capture_output=True, text=True, check=True)
    assert "CiliumNetworkPolicy" not in off.stdout, "a CiliumNetworkPolicy without kubernetes.enabled"


def test_helm_mixed_fleet_releases_share_a_namespace_and_split_the_nodes(helm):
    """The README's mixed fleet: two releases in one namespace, one per kind
    of node group, each selecting its node groups by a label: no resource
    name is taken twice, no node matches both, and each reads its nodes'
    kubelet file."""
    yaml = module("yaml")
    renders = {name: [d for d in yaml.safe_load_all(helm.render(name, "1.26.0").read_text()) if d]
               for name in ("fleet-al2023", "fleet-bottlerocket")}
    names = {}
    for name, docs in renders.items():
        for d in docs:
            key = (d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"])
            assert key not in names, f"{key} is in both {names.get(key)} and {name}"
            names[key] = name
    (al2023,), (bottlerocket,) = ([d for d in docs if d["kind"] == "DaemonSet"] for docs in renders.values())
    a = al2023["spec"]["template"]["spec"]["nodeSelector"]
    b = bottlerocket["spec"]["template"]["spec"]["nodeSelector"]
    assert any(k in b and a[k] != b[k] for k in a), f"a node may match both releases: {a} and {b}"
    assert al2023["spec"]["selector"] != bottlerocket["spec"]["selector"], "the DaemonSets select the same pods"
    env = {n: {e["name"]: e.get("value") for e in ds["spec"]["template"]["spec"]["containers"][0]["env"]}
           for n, ds in (("al2023", al2023), ("bottlerocket", bottlerocket))}
    assert env["al2023"]["IMAGEGC_KUBELET_CONFIG"] == "/etc/kubernetes/kubelet/config.json"
    assert env["bottlerocket"]["IMAGEGC_KUBELET_CONFIG"] == "/etc/kubernetes/kubelet/config"
    # Bottlerocket's pods run as container_t: no SELinux type is asked for.
    assert "seLinuxOptions" not in bottlerocket["spec"]["template"]["spec"]["containers"][0]["securityContext"]


def test_helm_default_render_is_the_kustomize_build(helm, kustomized):
    no_problems(check_helm().default(kustomized, helm.render("default", "1.26.0"), DEPLOY),
                "helm template (defaults) and kustomize build deploy/ disagree")


def test_helm_render_carries_its_values(helm):
    no_problems(check_helm().values(helm.render("everything", "1.26.0"), SETS["everything"][2], DEPLOY),
                "helm template with ci/everything-values.yaml")


def test_helm_openshift_values_grant_the_scc_and_set_the_contexts(helm):
    yaml = module("yaml")
    with open(SETS["openshift"][2], encoding="utf-8") as f:
        v = yaml.safe_load(f)
    docs = list(yaml.safe_load_all(helm.render("openshift", "1.26.0").read_text()))
    kinds = {}
    for d in docs:
        if d:
            kinds.setdefault(d["kind"], []).append(d)
    (role,) = kinds["ClusterRole"]
    assert role["rules"] == [{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                              "resourceNames": ["privileged"], "verbs": ["use"]}], role["rules"]
    (binding,) = kinds["RoleBinding"]
    assert binding["metadata"]["namespace"] == "imagegc"
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "imagegc", "namespace": "imagegc"}]
    (ds,) = kinds["DaemonSet"]
    pod = ds["spec"]["template"]["spec"]
    imagegc, sidecar = pod["containers"]
    assert sidecar == v["extraContainers"][0]
    security = imagegc["securityContext"]
    assert security["seLinuxOptions"] == {"type": "spc_t"}
    # The chart's own settings survive the merge.
    assert security["capabilities"] == {"drop": ["ALL"]} and security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False and security["runAsUser"] == 0
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}, "supplementalGroups": [0]}
    (config,) = [d for d in kinds["ConfigMap"] if "imagegc.toml" in d["data"]]
    assert 'listen = "127.0.0.1:9106"' in config["data"]["imagegc.toml"]


def notes(helm, work, *sets):
    """NOTES.txt as `helm install` prints it, rendered without a cluster:
    a copy of the chart with a template that runs it through tpl."""
    import shutil

    yaml = module("yaml")
    chart = work / "notes-chart"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        shutil.copy(chart / "templates" / "NOTES.txt", chart / "NOTES.txt")
        (chart / "templates" / "notes-test.yaml").write_text('notes: {{ tpl (.Files.Get "NOTES.txt") . | toJson }}\n')
    flags = [arg for s in sets for arg in ("--set", s)]
    rendered = output(helm.binary, "template", "imagegc", chart, "--kube-version", "1.26.0",
                      "--show-only", "templates/notes-test.yaml", *flags)
    return yaml.safe_load(rendered)["notes"]


@pytest.mark.parametrize("high,below", [(80, True), (84, True), (85, False), (90, False)])
def test_helm_notes_say_below_the_eviction_line_only_when_it_is(helm, work, high, below):
    text = notes(helm, work, f"gc.highThresholdPercent={high}", "gc.lowThresholdPercent=70")
    assert (f"imagegc starts at {high}% usage, below the kubelet's" in text) is below, text
    assert ("WARNING: imagegc starts at" in text) is not below, text


def test_every_configuration_key_is_a_chart_value():
    """Every key of config/imagegc.toml (the schema, every key listed) has
    its chart value: section.key in camelCase, but for the two the chart
    names by what it mounts."""
    import tomllib

    yaml = module("yaml")
    by_mount = {"state.dir": "stateHostPath", "kubelet.config": "kubelet.configPath"}
    with open(os.path.join(REPO, "config", "imagegc.toml"), "rb") as f:
        config = tomllib.load(f)
    with open(os.path.join(CHART, "values.yaml"), encoding="utf-8") as f:
        values = yaml.safe_load(f)
    missing_values = []
    for section, keys in config.items():
        for key in keys:
            name = f"{section}.{key}"
            first, *rest = key.split("_")
            path = by_mount.get(name, f"{section}.{first}{''.join(w.capitalize() for w in rest)}")
            node = values
            for part in path.split("."):
                node = node.get(part, KeyError) if isinstance(node, dict) else KeyError
            if node is KeyError:
                missing_values.append(f"{name}: no chart value {path}")
    assert len(config) >= 7, sorted(config)
    no_problems(missing_values, "configuration keys without a chart value")


@pytest.mark.parametrize("name", ["default", "everything", "gke", "aks", "fleet-al2023", "fleet-bottlerocket"])
def test_helm_mounts_the_kubelets_files_only_when_set(helm, name):
    # default: nothing mounted; everything: EKS's file and drop-in directory.
    no_problems(check_helm().kubelet(helm.render(name, "1.26.0"), SETS[name][2]), f"{name}: the kubelet's files")


def test_helm_pod_and_service_monitor_scrape_as_deploy_podmonitor(helm):
    no_problems(check_helm().monitors(helm.render("podmonitor", "1.26.0"), helm.render("everything", "1.26.0"),
                                      DEPLOY), "the chart's monitors")


def test_helm_package_renders_the_same(helm, work):
    # What users install is the package: it must carry files/ and render the
    # same as the directory.
    package = work / "package"
    run(helm.binary, "package", CHART, "--destination", package)
    (tgz,) = package.glob("imagegc-*.tgz")
    packaged = output(helm.binary, "template", "other", tgz, "--namespace", "gc-system", "--kube-version", "1.26.0",
                      "--values", SETS["everything"][2])
    directory = helm.render("everything", "1.26.0").read_text()
    diff = list(difflib.unified_diff(directory.splitlines(), packaged.splitlines(), "directory", "package",
                                     lineterm=""))
    assert not diff, "the packaged chart renders differently:\n" + "\n".join(diff[:60])


# What: the error must say MESSAGE for --set SET...
REFUSALS = [
    ("a misspelt key", "additional properties 'dryrun' not allowed", ["gc.dryrun=true"]),
    ("a percentage above 100", "/gc/highThresholdPercent", ["gc.highThresholdPercent=101"]),
    ("low at or above high", "gc.lowThresholdPercent (90) must be less than gc.highThresholdPercent (80)",
     ["gc.lowThresholdPercent=90"]),
    ("an endpoint outside the mounted directory", "runtime.endpoint", ["runtime.socketDir=/run/crio"]),
    ("an image filesystem path outside the runtime's root", "gc.imageFsPath", ["gc.imageFsPath=/var/lib/imagegc"]),
    ("one inode threshold", "set both or neither", ["gc.highInodesPercent=90"]),
    ("two monitors", "pick one", ["podMonitor.enabled=true", "serviceMonitor.enabled=true"]),
    ("max age below min age", "gc.maxAge (1m) must be greater than gc.minAge (2m)", ["gc.maxAge=1m"]),
    ("a poll longer than the interval", "gc.usagePollInterval (2h) must not be longer than gc.interval (1h)",
     ["gc.interval=1h", "gc.usagePollInterval=2h"]),
    ("an interval over a day", "gc.interval (2d) must be at most 1d", ["gc.interval=2d"]),
    ("a max age over a year", "gc.maxAge (400d) must be at most 365d", ["gc.maxAge=400d"]),
    ("a duration the binary cannot read", "/gc/minAge", ["gc.minAge=soon"]),
    ("two managed collectors", "pick one", ["gke.podMonitoring.enabled=true", "aks.podMonitor.enabled=true"]),
    ("a scrape namespace a managed collector does not scrape from", "gke.podMonitoring.enabled scrapes from gmp-system",
     ["gke.podMonitoring.enabled=true", "networkPolicy.scrapeNamespace=observability"]),
    ("user workload monitoring and a ServiceMonitor", "pick one",
     ["openshift.userWorkloadMonitoring=true", "serviceMonitor.enabled=true"]),
    ("a relative certificates directory", "/kubernetes/registryCertificates",
     ["kubernetes.registryCertificates=etc/pki"]),
]


@pytest.mark.parametrize("what,message,sets", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_helm_template_refuses_bad_values_naming_them(helm, what, message, sets):
    import subprocess

    flags = [arg for s in sets for arg in ("--set", s)]
    proc = subprocess.run([helm.binary, "template", "imagegc", CHART, "--kube-version", "1.26.0", *flags],
                          capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{what}: rendered with {' '.join(flags)}, expected a refusal"
    said = [line for line in out.splitlines() if message in line]
    assert said, f"{what}: the error does not say {message!r}:\n{out}"
    print(f"{what}: {said[0]}")


@pytest.mark.parametrize("name", SETS)
def test_helm_rendered_config_passes_check_config(helm, any_imagegc_bin, work, name):
    if any_imagegc_bin is None:
        pytest.skip("no imagegc binary (static, target/release or target/debug)")
    toml = work / f"helm-{name}.toml"
    check_helm().config(helm.render(name, "1.26.0"), toml)
    run(any_imagegc_bin, "check-config", "--config", toml)
