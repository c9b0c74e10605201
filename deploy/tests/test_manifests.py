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
