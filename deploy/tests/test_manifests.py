"""The Kubernetes manifests of deploy/ (kubectl apply -k deploy/)."""

import os

import pytest

from support import DEPLOY, K8S_VERSIONS, REPO, module, no_problems, run, tool


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
