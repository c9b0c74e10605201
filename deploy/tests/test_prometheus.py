"""The alerting rules and the dashboard: their syntax, their unit tests,
the metrics they use, and a live Prometheus scraping a running imagegc."""

import os

import pytest

from support import DEPLOY, missing, module, no_problems, run, tool

DASHBOARD = os.path.join(DEPLOY, "grafana-dashboard.json")
RULES = os.path.join(DEPLOY, "prometheus-rules.yaml")
RULES_TEST = os.path.join(DEPLOY, "prometheus-rules.test.yaml")
PROMETHEUS_RULE = os.path.join(DEPLOY, "prometheusrule.yaml")


def check_metrics():
    module("promql_parser")
    module("yaml")
    import check_metrics

    return check_metrics


def test_promtool_check_rules():
    run(tool("promtool"), "check", "rules", RULES)


def test_promtool_test_rules():
    run(tool("promtool"), "test", "rules", RULES_TEST)


def test_dashboard_and_rules_use_exported_metrics_and_labels(work):
    # Against the list of series in check_metrics.py.
    emitted = work / "dashboard-rules.yaml"
    problems, notes = check_metrics().check(DASHBOARD, [RULES, PROMETHEUS_RULE], emit_rules=str(emitted))
    print("\n".join(f"note: {n}" for n in notes))
    no_problems(problems, "the dashboard and the rules")
    # Prometheus's own parser on every dashboard query.
    run(tool("promtool"), "check", "rules", emitted)


@pytest.fixture
def scrape(request):
    """IMAGEGC_METRICS_FILE, else the daemon's own scrape."""
    if os.environ.get("IMAGEGC_METRICS_FILE"):
        return os.environ["IMAGEGC_METRICS_FILE"]
    return str(request.getfixturevalue("daemon_scrape"))


def test_dashboard_and_rules_use_metrics_of_a_real_scrape(scrape):
    problems, notes = check_metrics().check(DASHBOARD, [RULES], scrape=scrape)
    print("\n".join(f"note: {n}" for n in notes))
    no_problems(problems, f"the dashboard and the rules against {scrape}")


def test_promtool_check_metrics_on_the_daemons_classic_scrape(daemon_scrape):
    # The daemon's scrape asked for no format: the classic text format,
    # which promtool reads. (promtool 2.42 reads only that format; the
    # OpenMetrics one is read by Prometheus itself in the live test.)
    text = daemon_scrape.read_text()
    assert "\n# EOF" not in "\n" + text, "a scrape without an Accept header got OpenMetrics"
    run(tool("promtool"), "check", "metrics", input=text)


@pytest.fixture(scope="module")
def fake_runtime_bin():
    """The fake CRI runtime (examples/fake_runtime.rs), built by the test command."""
    path = os.environ.get("IMAGEGC_FAKE_RUNTIME")
    if not path or not os.access(path, os.X_OK):
        missing("fake_runtime", f"IMAGEGC_FAKE_RUNTIME={path or ''} is not an executable")
    return path


def test_live_prometheus_alerts_fire_and_resolve_dashboard_queries(imagegc_bin, fake_runtime_bin, capsys):
    # Debian's prometheus scrapes two `imagegc run` on the fake runtime and
    # evaluates the rules with their windows scaled from minutes to seconds;
    # each alert must fire and resolve on its condition, nothing may fire
    # while all is well, and every dashboard query must return data. About
    # 3.5 minutes.
    if os.geteuid() != 0:
        pytest.skip("not root (mounts a tmpfs)")
    module("yaml")
    import live_prometheus

    prometheus, promtool = tool("prometheus"), tool("promtool")
    # The alert table is worth reading when all goes well too.
    with capsys.disabled():
        print()
        failure = live_prometheus.check(imagegc_bin, fake_runtime_bin, RULES, DASHBOARD, prometheus, promtool)
    if failure:
        pytest.fail(f"live Prometheus: {failure}", pytrace=False)
