"""The scripts that run these checks."""

import pytest

from support import run, tool

# The entry point, what it sources to install the tools, and the image build.
SCRIPTS = ["scripts/check-deploy.sh", "scripts/testbed-deploy-tools.sh", "scripts/build-image.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck(script):
    # -x: follow what the entry point sources.
    run(tool("shellcheck"), "-x", script)
