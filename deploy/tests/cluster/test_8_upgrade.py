"""Scenario 8: `helm upgrade` of a release an earlier chart installed.

The release is installed from the chart as it was at commit d50ef1e
(fixtures/imagegc-chart-d50ef1e.tgz: `git archive --prefix=imagegc/
d50ef1e:deploy/helm/imagegc`), before `gc.order`, `networkPolicy.
apiServerCIDRs` and later values existed, with a user's own values. It is
upgraded to this checkout's chart with README's command
(`--reset-then-reuse-values`): the new chart's defaults fill what the
earlier chart lacked, the user's values stay, and a new pod is Ready with a
configuration imagegc accepts. The control is the command README warns
against: `--reuse-values` replaces the new chart's defaults with the old
release's, so a template reading a value the earlier chart lacked fails
(`openshift.scc`: a nil pointer) or renders it as null (`order = null`,
which imagegc refuses).
"""

import os
import re

import yaml

from cluster import wait_for
from deploy import CHART, Deployment

EARLIER_CHART = os.path.join(os.path.dirname(__file__), "fixtures", "imagegc-chart-d50ef1e.tgz")
# The user's own values, set at install time on the earlier chart.
USER_CONFIG = {"gc.max_age": "9d", "gc.interval": "2m"}


def rendered_toml(helm_output):
    """imagegc.toml of the ConfigMap in `helm upgrade --dry-run`'s output."""
    manifest = helm_output.split("MANIFEST:", 1)[-1].split("NOTES:", 1)[0]
    for doc in yaml.safe_load_all(manifest):
        if doc and doc.get("kind") == "ConfigMap" and "imagegc.toml" in doc.get("data", {}):
            return doc["data"]["imagegc.toml"]
    raise AssertionError(f"no ConfigMap with imagegc.toml in:\n{helm_output[-3000:]}")


def test_upgrade_from_an_earlier_chart_takes_new_defaults_and_keeps_the_users_values(cluster):
    d = Deployment(cluster, "upgrade", "helm", USER_CONFIG, chart=EARLIER_CHART)
    d.apply()
    try:
        ns = d.namespace
        first = d.pod()["metadata"]["uid"]
        upgrade = ["upgrade", "imagegc", CHART, "--namespace", ns]

        # The control: --reuse-values drops the new chart's defaults, so a
        # template that reads a value the earlier chart lacked fails, or
        # renders it as null (`order = null`, which imagegc refuses).
        reused = cluster.helm(*upgrade, "--reuse-values", "--dry-run", check=False)
        if reused.returncode == 0:
            toml = rendered_toml(reused.stdout)
            assert re.search(r"^order = null$", toml, re.M), toml
        else:
            assert "nil pointer evaluating" in reused.stderr, reused.stderr

        # README's command.
        cluster.helm(*upgrade, "--reset-then-reuse-values", "--wait", "--timeout=120s")
        cluster.kubectl("-n", ns, "rollout", "status", "daemonset/imagegc", "--timeout=120s", timeout=130)
        toml = cluster.kubectl_json("-n", ns, "get", "configmap", "imagegc")["data"]["imagegc.toml"]
        assert re.search(r'^max_age = "9d"$', toml, re.M), toml
        assert re.search(r'^interval = "2m"$', toml, re.M), toml
        with open(os.path.join(CHART, "values.yaml")) as f:
            default_order = yaml.safe_load(f)["gc"]["order"]
        assert re.search(rf'^order = "{re.escape(default_order)}"$', toml, re.M), toml

        def upgraded_and_ready():
            pod = d.ready_pod()
            return pod if pod and pod["metadata"]["uid"] != first else None

        pod = wait_for("a Ready imagegc pod of the upgraded release", upgraded_and_ready, 120, 1)
        checked = cluster.kubectl("-n", ns, "exec", pod["metadata"]["name"], "--", "/imagegc", "check-config",
                                  check=False)
        assert checked.returncode == 0, f"check-config exited {checked.returncode}:\n{checked.stdout}{checked.stderr}"
        restarts = [s.get("restartCount", 0) for s in pod["status"].get("containerStatuses", [])]
        assert restarts == [0], (restarts, d.diagnostics())
    finally:
        d.delete()
