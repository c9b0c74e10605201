"""Checks that the Grafana dashboard and the alerting rules use only metrics
that imagegc exports, with label values it can produce.

Every PromQL expression is parsed with promql-parser; each series selector
must name an exported series (histograms export _bucket, _sum and _count)
and each equality matcher on one of imagegc's own labels must use one of the
label's values. The dashboard is also checked for structure: every panel
has queries, ids are unique, panels do not overlap, and every $variable it
uses is defined.

check(DASHBOARD, RULES, scrape=None, emit_rules=None) returns the problems
and notes; deploy/tests/test_prometheus.py runs it. Given a scrape of
/metrics, names are checked against that scrape instead of the list below,
and the differences between the two are noted. emit_rules writes every
dashboard query, with Grafana's variables replaced, as a recording rule, so
that `promtool check rules` can parse them with Prometheus's own parser.
"""

import json
import os
import re

import promql_parser
import yaml

# The series imagegc exports, and the values of its own labels.
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
EXPORTED = {
    "image_garbage_collected_total": {"reason": {"age", "space"}},
    "imagegc_freed_bytes_total": {"reason": {"age", "space"}},
    "imagegc_removal_failures_total": {},
    "imagegc_cycles_total": {"result": {"success", "failure"}},
    "imagegc_cycle_duration_seconds": {"le": None},  # histogram
    "imagegc_last_success_timestamp_seconds": {},
    "imagegc_image_filesystem_usage_ratio": {},
    "imagegc_image_filesystem_capacity_bytes": {},
    "imagegc_image_filesystem_available_bytes": {},
    "imagegc_high_threshold_ratio": {},
    "imagegc_low_threshold_ratio": {},
    "imagegc_images": {"state": {"in_use", "unused", "protected"}},
    "imagegc_runtime_up": {},
    "imagegc_dry_run": {},
    "imagegc_repulled_after_removal_total": {},
    "imagegc_images_removed_by_others_total": {},
    "imagegc_removal_candidates": {},
    "imagegc_space_unreachable": {},
    "imagegc_space_pass_due": {},
    "imagegc_image_fs_mismatch": {},
    "imagegc_container_mounts_unknown": {},
    "imagegc_consecutive_failed_cycles": {},
    "imagegc_start_time_seconds": {},
    "imagegc_kubernetes_pods_watch_enabled": {},
    "imagegc_kubernetes_pods_watch_up": {},
    "imagegc_kubernetes_pods": {},
    "imagegc_kubernetes_pods_stale": {},
    "imagegc_kubernetes_node_found": {},
    "imagegc_kubernetes_node_events_total": {
        "reason": {
            "FreeDiskSpaceFailed",
            "ImageGCFailed",
            "ImageRepullThrash",
            "SandboxImageUnknown",
            "ImagesRemovedByOthers",
        },
        "result": {"posted", "failed", "dropped"},
    },
    "imagegc_images_removed_by_others_total": {},
    "imagegc_removed_by_others_bytes_total": {},
    "imagegc_last_removal_by_others_timestamp_seconds": {},
    "imagegc_kubelet_config_read": {},
    "imagegc_kubelet_image_gc_enabled": {},
    "imagegc_high_threshold_above_eviction": {},
    "imagegc_node_info": {"node": None},  # any value
    "imagegc_build_info": {"version": None, "commit": None},  # any value
    "imagegc_coming_pulls_cannot_fit": {},
}
# Series of the list above that a rule uses before the daemon exports them:
# a scrape without one is noted, not a problem; a scrape with one is a
# problem, so that the entry goes once the daemon exports it.
NOT_YET_EXPORTED = set()
# Series Prometheus itself adds for every target, which rules may use.
PROMETHEUS_SERIES = {"up": {}}
HISTOGRAMS = {"imagegc_cycle_duration_seconds"}

# Grafana's variables, replaced by something PromQL can parse.
GRAFANA_VARIABLES = {
    "__rate_interval": "5m",
    "__interval": "1m",
    "__range": "1h",
    "__range_s": "3600",
    "__interval_ms": "60000",
}
VARIABLE = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+)|\[\[(\w+)\]\])")


def exported_series():
    """Series name -> {label: allowed values or None}."""
    series = {}
    for name, labels in EXPORTED.items():
        if name in HISTOGRAMS:
            for suffix in HISTOGRAM_SUFFIXES:
                series[name + suffix] = labels if suffix == "_bucket" else {}
        else:
            series[name] = labels
    return series


def scraped_series(path):
    """Series names and label values seen in a /metrics scrape."""
    series = {}
    sample = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s')
    label = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#"):
                continue
            m = sample.match(line)
            if not m:
                continue
            labels = series.setdefault(m.group(1), {})
            for name, value in label.findall(m.group(3) or ""):
                labels.setdefault(name, set()).add(value)
    return series


class Checker:
    def __init__(self, series):
        self.series = series
        self.problems = []
        self.used = set()
        self.checked = 0

    def problem(self, where, message):
        self.problems.append(f"{where}: {message}")

    def check_expr(self, where, expr):
        self.checked += 1
        try:
            ast = promql_parser.parse(expr)
        except ValueError as err:
            self.problem(where, f"PromQL does not parse ({err}): {expr}")
            return
        selectors = []

        def visit(node):
            if isinstance(node, promql_parser.VectorSelector):
                selectors.append(node)
            return True

        promql_parser.walk(ast, visit)
        if not selectors:
            self.problem(where, f"uses no metric: {expr}")
        for selector in selectors:
            name = selector.name
            matchers = list(selector.matchers.matchers)
            if not name:
                names = [m.value for m in matchers
                         if m.name == "__name__" and m.op == promql_parser.MatchOp.Equal]
                name = names[0] if names else None
            if name is None:
                self.problem(where, f"selector without a metric name: {expr}")
                continue
            self.used.add(name)
            if name not in self.series:
                self.problem(where, f"{name} is not a series imagegc exports")
                continue
            own = self.series[name]
            for m in matchers:
                if m.name in own and own[m.name] is not None and m.op == promql_parser.MatchOp.Equal:
                    if m.value not in own[m.name]:
                        allowed = ", ".join(sorted(own[m.name]))
                        self.problem(where, f'{name}{{{m.name}="{m.value}"}}: {m.name} is one of {allowed}')


def substitute(expr, defined):
    """Replaces Grafana's variables; reports undefined ones."""
    undefined = []

    def replace(m):
        name = m.group(1) or m.group(2) or m.group(3)
        if name in GRAFANA_VARIABLES:
            return GRAFANA_VARIABLES[name]
        if name not in defined:
            undefined.append(name)
        return ".*"

    return VARIABLE.sub(replace, expr), undefined


def check_dashboard(path, checker, emitted):
    with open(path, encoding="utf-8") as f:
        dash = json.load(f)
    where = os.path.basename(path)
    for key in ("title", "uid", "panels", "schemaVersion", "templating"):
        if key not in dash:
            checker.problem(where, f"no {key!r}")
    variables = {v["name"]: v for v in dash.get("templating", {}).get("list", [])}
    defined = set(variables)
    datasource_vars = {n for n, v in variables.items() if v.get("type") == "datasource"}

    def check_datasource(place, ds):
        if ds is None:
            return
        uid = ds.get("uid", "") if isinstance(ds, dict) else str(ds)
        m = VARIABLE.fullmatch(uid)
        if m and (m.group(1) or m.group(2) or m.group(3)) not in datasource_vars:
            checker.problem(place, f"datasource {uid} is not a datasource variable")

    for name, v in variables.items():
        if v.get("type") == "query":
            query = v.get("query")
            query = query.get("query") if isinstance(query, dict) else query
            inner = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query or "")
            if not inner:
                checker.problem(f"{where} variable ${name}", f"expected label_values(...), got {query!r}")
                continue
            expr, undefined = substitute(inner.group(1), defined - {name})
            for u in undefined:
                checker.problem(f"{where} variable ${name}", f"uses undefined ${u}")
            checker.check_expr(f"{where} variable ${name}", expr)
            check_datasource(f"{where} variable ${name}", v.get("datasource"))

    # A variable that panels filter on and that depends on another one
    # must not have a custom "All" value such as ".*": All would then
    # match every series, whatever the other variable selects.
    panel_exprs = json.dumps(dash.get("panels", []))
    for name, v in variables.items():
        query = v.get("query")
        query = query.get("query") if isinstance(query, dict) else query
        depends = VARIABLE.search(query or "")
        used = re.search(r"\$(\{)?" + re.escape(name) + r"\b", panel_exprs)
        if depends and used and v.get("includeAll") and v.get("allValue"):
            checker.problem(
                f"{where} variable ${name}",
                f"depends on another variable but its All value {v['allValue']!r} ignores it",
            )

    ids = set()
    cells = {}
    panels = []
    for p in dash.get("panels", []):
        panels.append(p)
        panels.extend(p.get("panels", []))
    for p in panels:
        title = p.get("title", "?")
        place = f"{where} panel {title!r}"
        if p.get("id") in ids:
            checker.problem(place, f"duplicate id {p.get('id')}")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] + g["w"] > 24:
            checker.problem(place, f"bad gridPos {g}")
        else:
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    if (x, y) in cells:
                        checker.problem(place, f"overlaps panel {cells[(x, y)]!r}")
                        break
                    cells[(x, y)] = title
                else:
                    continue
                break
        if p.get("type") == "row":
            continue
        check_datasource(place, p.get("datasource"))
        targets = p.get("targets") or []
        if not targets:
            checker.problem(place, "has no queries")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs):
            checker.problem(place, f"duplicate refId in {refs}")
        for t in targets:
            check_datasource(place, t.get("datasource"))
            expr = t.get("expr", "")
            if not expr.strip():
                checker.problem(place, f"query {t.get('refId')} has no expr")
                continue
            concrete, undefined = substitute(expr, defined)
            for u in undefined:
                checker.problem(place, f"uses undefined ${u}")
            checker.check_expr(f"{place} query {t.get('refId')}", concrete)
            emitted.append(concrete)


RUNBOOK = "https://github.com/imagegc/imagegc/blob/main/docs/runbook.md#"


def runbook_sections(rules_path):
    """The alert names docs/runbook.md has a `## Name` section for."""
    runbook = os.path.join(os.path.dirname(os.path.abspath(rules_path)), "..", "docs", "runbook.md")
    try:
        with open(runbook, encoding="utf-8") as f:
            return {line[3:].strip() for line in f if line.startswith("## ")}
    except OSError:
        return set()


def check_rules(path, checker):
    sections = runbook_sections(path)
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    if doc.get("kind") == "PrometheusRule":
        doc = doc.get("spec", {})
    where = os.path.basename(path)
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            name = rule.get("alert") or rule.get("record")
            checker.check_expr(f"{where} {name}", str(rule.get("expr", "")))
            if rule.get("alert"):
                labels = rule.get("labels", {})
                annotations = rule.get("annotations", {})
                if labels.get("severity") not in ("info", "warning", "critical"):
                    checker.problem(f"{where} {name}", "needs a severity label: info, warning or critical")
                # An alert about one imagegc names its node, or its
                # instance where the scrape adds no node label; absent()
                # has neither.
                if not str(rule.get("expr", "")).startswith("absent("):
                    for key in ("summary", "description"):
                        text = annotations.get(key, "")
                        if "$labels.instance" not in text or "$labels.node" not in text:
                            checker.problem(f"{where} {name}", f"annotation {key} should name $labels.node and $labels.instance")
                if name not in sections:
                    checker.problem(f"{where} {name}", "docs/runbook.md has no section for it")
                if annotations.get("runbook_url") != RUNBOOK + name.lower():
                    checker.problem(f"{where} {name}", f"runbook_url should be {RUNBOOK + name.lower()}")
                for key, text in annotations.items():
                    if re.search(r"\b\d+ (seconds|minutes|hours)\b|last hour", text):
                        checker.problem(f"{where} {name}", f"annotation {key} names a window, which users scale: {text}")


def check(dashboard, rules, scrape=None, emit_rules=None):
    """Checks the dashboard and each rules file against the series imagegc
    exports (the list above, or those of the scrape at SCRAPE). Returns the
    problems and the notes (what differs from the scrape, what no panel or
    rule shows, and a summary)."""
    source = "the list in check_metrics.py"
    series = exported_series()
    notes = []
    early = []
    if scrape:
        scraped = scraped_series(scrape)
        source = scrape
        listed = set(series)
        for name in sorted(NOT_YET_EXPORTED):
            if name in scraped:
                early.append(f"{name} is in the scrape: remove it from NOT_YET_EXPORTED in check_metrics.py")
            else:
                notes.append(f"not exported yet (NOT_YET_EXPORTED): {name}")
        for name in sorted(listed - set(scraped) - NOT_YET_EXPORTED):
            notes.append(f"listed here but not in the scrape: {name}")
        for name in sorted(set(scraped) - listed):
            notes.append(f"in the scrape but not listed here: {name}")
        # A scrape shows the values seen so far; keep the closed sets known
        # here for the labels it has, and accept any value for others.
        series = {
            name: {label: (series.get(name, {}).get(label)) for label in labels}
            for name, labels in scraped.items()
        } | {name: series[name] for name in NOT_YET_EXPORTED if name not in scraped}

    series.update(PROMETHEUS_SERIES)
    checker = Checker(series)
    emitted = []
    check_dashboard(dashboard, checker, emitted)
    for path in rules:
        check_rules(path, checker)

    if emit_rules:
        recording = [{"record": f"dashboard:query{i}", "expr": e} for i, e in enumerate(emitted)]
        with open(emit_rules, "w", encoding="utf-8") as f:
            yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}, f, sort_keys=False)

    unused = sorted(n for n in EXPORTED if not any(u == n or u.startswith(n + "_") for u in checker.used))
    if unused:
        notes.append(f"exported but shown nowhere: {', '.join(unused)}")
    notes.append(f"{checker.checked} expressions use {len(checker.used)} series ({source})")
    return early + checker.problems, notes
