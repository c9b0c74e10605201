"""The release workflow (.github/workflows): linted as GitHub runs it, and
built by the scripts CI runs, so that a broken release step fails CI."""

import glob
import os
import re

from support import REPO, run, tool

WORKFLOWS = sorted(glob.glob(os.path.join(REPO, ".github", "workflows", "*.yml")))


def test_workflows_pass_actionlint():
    assert WORKFLOWS, "no workflow under .github/workflows"
    run(tool("actionlint"), *WORKFLOWS)


def test_the_release_builds_with_the_scripts_ci_runs():
    with open(os.path.join(REPO, ".github", "workflows", "release.yml"), encoding="utf-8") as f:
        text = f.read()
    # The image and the binaries: scripts/build-image.sh, as the cluster
    # suite and the deployment checks build them; the chart: helm package.
    assert re.search(r"run: scripts/build-image\.sh --image .* --arch amd64,arm64", text), text
    assert "helm package deploy/helm/imagegc" in text
    # The tag must be the release commit's version.
    assert "release $version" in text and "check_manifests" in text
    for step in ("cosign sign", "sbom-action", "gh release create"):
        assert step in text, step
