#!/usr/bin/env python3
"""The alerting rules and the dashboard against a live Prometheus scraping a
running imagegc.

Starts, all on 127.0.0.1 and in a temporary directory:
- a fake CRI runtime (examples/fake_runtime.rs) whose images, outages,
  image filesystem and failing calls this script controls;
- a fake API server (FakeApiServer) through which node-a watches the pods
  bound to it ([kubernetes]), which this script takes down and brings back;
- two `imagegc run`: node-a, which removes images, scraped with a `node`
  label as deploy/podmonitor.yaml adds it, and node-b, in dry run, scraped
  without one as through the prometheus.io annotations; both measure a small
  tmpfs this script fills and empties;
- Debian's `prometheus`, scraping both every second and evaluating
  deploy/prometheus-rules.yaml every second, with the windows scaled from
  minutes to seconds (gc.interval 5m becomes 5s).

Then it drives each condition on node-a and checks, through Prometheus's
HTTP API, that each alert fires on its condition and resolves after it,
that no alert fires while all is well (node-b, without [kubernetes], never
raises the pod watch's), that the alerts on imagegc's own
series hold while imagegc is down, that a restarted imagegc reports the
last success it had before, and that every dashboard query returns data,
with the node picker filtering. Prints the alert table (fires / resolves /
quiet when healthy). Needs root (it mounts a tmpfs).

Run by deploy/tests/test_prometheus.py (check()), or alone:
  live_prometheus.py --imagegc BIN --fake-runtime BIN --rules RULES.yaml
                     --dashboard DASHBOARD.json [--prometheus BIN] [--promtool BIN]
"""

import argparse
import http.server
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import yaml

INTERVAL = 5  # gc.interval in the test, seconds: the rules' 5m scaled
FS_BYTES = 16 << 20
PAGE = 4096
APP_BYTES = 512 << 10
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
ALERTS = [
    "ImagegcDown",
    "ImagegcAbsent",
    "ImagegcCollectionFailing",
    "ImagegcNoSuccessfulCycle",
    "ImagegcRuntimeDown",
    "ImagegcUsageAboveHigh",
    "ImagegcThrashing",
    "ImagegcPodWatchDown",
    "ImagegcPodsStale",
    "ImagegcImageFsMismatch",
    "ImagegcContainerMountsUnknown",
    "ImagegcImagesRemovedByOthers",
]
PODS_STALE_AFTER = 10  # kubernetes.pods_stale_after of node-a, seconds
API_TOKEN = "imagegc-live-test"


class Failure(Exception):
    pass


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, accept=None, timeout=5):
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return resp.headers.get("Content-Type", ""), resp.read().decode()


def scale_duration(text):
    """5m -> 5s, 1h -> 60s: the rules' minutes become seconds."""
    def one(m):
        n, unit = int(m.group(1)), m.group(2)
        return f"{n * 60 if unit == 'h' else n}s"
    return re.sub(r"\b(\d+)([mh])\b", one, text)


def scaled_rules(path):
    with open(path, encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    for group in doc["groups"]:
        for rule in group["rules"]:
            expr = rule["expr"]
            expr = re.sub(r"\[(\d+[mh])\]", lambda m: "[" + scale_duration(m.group(1)) + "]", expr)
            expr = re.sub(r"\b300\b", str(INTERVAL), expr)  # gc.interval in seconds
            rule["expr"] = expr
            if "for" in rule:
                rule["for"] = scale_duration(rule["for"])
    return doc


def promql_regex_escape(value):
    """A value as a regex matching only itself, inside a PromQL string (whose
    own escaping doubles the backslash), as Grafana writes multi-values."""
    return "".join("\\\\" + ch if ch in ".+*?[](){}^$|\\-" else ch for ch in value)


class Prometheus:
    def __init__(self, url):
        self.url = url

    def api(self, path, **params):
        query = urllib.parse.urlencode(params, doseq=True)
        _, body = http_get(f"{self.url}/api/v1/{path}?{query}")
        doc = json.loads(body)
        if doc.get("status") != "success":
            raise Failure(f"{path}: {doc}")
        return doc["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def query_range(self, expr, start, end):
        return self.api("query_range", query=expr, start=start, end=end, step="1")["result"]


class AlertWatch(threading.Thread):
    """Polls /api/v1/alerts and keeps every change of state per alert and
    instance: (time, alertname, instance, state)."""

    def __init__(self, prom):
        super().__init__(daemon=True)
        self.prom = prom
        self.lock = threading.Lock()
        self.current = {}
        self.events = []
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            try:
                alerts = self.prom.api("alerts")["alerts"]
            except Exception:  # Prometheus starting or stopping
                time.sleep(0.5)
                continue
            now = time.time()
            seen = {}
            for a in alerts:
                key = (a["labels"]["alertname"], a["labels"].get("instance", ""))
                seen[key] = a["state"]
            with self.lock:
                for key in set(seen) | set(self.current):
                    state = seen.get(key, "inactive")
                    if self.current.get(key, "inactive") != state:
                        self.events.append((now, key[0], key[1], state))
                self.current = seen
            time.sleep(0.5)

    def state(self, alert, instance):
        with self.lock:
            return self.current.get((alert, instance), "inactive")

    def active(self):
        with self.lock:
            return {k: v for k, v in self.current.items() if v != "inactive"}

    def events_since(self, since):
        with self.lock:
            return [e for e in self.events if e[0] >= since]


class FakeApiServer:
    """The API server imagegc on node-a watches its pods through, over plain
    HTTP with a bearer token (the kubeconfig it writes): the Node, the pods
    bound to the node (one, naming an image the node does not hold, so it
    protects nothing the scenarios remove), and a watch held open without
    events. While down it ends every watch and answers 503 to everything,
    as an API server that is restarting does."""

    def __init__(self, node):
        self.node = node
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.changed = threading.Condition()
        self.down = False
        self.closing = False
        self.server = None

    def start(self):
        api = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send_json(self, status, doc):
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                if api.down:
                    return self.send_json(503, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                "reason": "ServiceUnavailable", "code": 503})
                if self.headers.get("Authorization") != f"Bearer {API_TOKEN}":
                    return self.send_json(401, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                "reason": "Unauthorized", "code": 401})
                if url.path == f"/api/v1/nodes/{api.node}":
                    return self.send_json(200, {"apiVersion": "v1", "kind": "Node",
                                                "metadata": {"name": api.node}})
                if url.path != "/api/v1/pods" or query.get("fieldSelector") != [f"spec.nodeName={api.node}"]:
                    return self.send_json(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                "reason": "NotFound", "code": 404})
                if query.get("watch") in (["true"], ["1"]):
                    return self.watch(int(query.get("timeoutSeconds", ["290"])[0]))
                pod = {"metadata": {"name": "web", "namespace": "default", "resourceVersion": "1"},
                       "spec": {"nodeName": api.node, "containers": [{"name": "web", "image": "web:1"}]}}
                self.send_json(200, {"apiVersion": "v1", "kind": "PodList",
                                     "metadata": {"resourceVersion": "1"}, "items": [pod]})

            def watch(self, timeout):
                """Holds the watch open, without events, until the API
                server goes down or the watch's own timeout."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                with api.changed:
                    api.changed.wait_for(lambda: api.down or api.closing, timeout=timeout)
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def set_down(self, down):
        with self.changed:
            self.down = down
            self.changed.notify_all()

    def stop(self):
        if self.server:
            with self.changed:
                self.closing = True
                self.changed.notify_all()
            self.server.shutdown()
            self.server.server_close()

    def kubeconfig(self, path):
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump({
                "apiVersion": "v1", "kind": "Config", "current-context": "live",
                "clusters": [{"name": "live", "cluster": {"server": self.url}}],
                "users": [{"name": "imagegc", "user": {"token": API_TOKEN}}],
                "contexts": [{"name": "live", "context": {"cluster": "live", "user": "imagegc"}}],
            }, f)


def wait_for(what, predicate, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return time.time()
        time.sleep(0.25)
    raise Failure(f"timed out after {timeout}s waiting for {what}")


class Live:
    def __init__(self, args, work):
        self.args = args
        self.work = work
        self.procs = {}
        self.fs = os.path.join(work, "imagefs")
        self.filler = os.path.join(self.fs, "not-images")
        self.socket = os.path.join(work, "cri.sock")
        self.ports = {"a": free_port(), "b": free_port(), "prom": free_port()}
        self.inst = {n: f"127.0.0.1:{self.ports[n]}" for n in ("a", "b")}
        self.prom = Prometheus(f"http://127.0.0.1:{self.ports['prom']}")
        self.watch = AlertWatch(self.prom)
        self.api = FakeApiServer("node-a")
        self.table = {a: {"fires": [], "resolves": [], "quiet": None} for a in ALERTS}
        self.notes = []
        self.mounted = False

    # --- processes ---------------------------------------------------------

    def start_fake(self):
        fake = subprocess.Popen(
            [self.args.fake_runtime, self.socket],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(os.path.join(self.work, "fake.log"), "w"),
            text=True, bufsize=1,
        )
        self.procs["fake"] = fake
        if fake.stdout.readline().strip() != "ready":
            raise Failure("the fake runtime did not start")
        # The runtime keeps its images on the filesystem imagegc measures:
        # otherwise imagegc reports a mismatch and runs no space pass.
        self.fake(f"image-fs {self.fs}")

    def fake(self, command):
        fake = self.procs["fake"]
        fake.stdin.write(command + "\n")
        fake.stdin.flush()
        answer = fake.stdout.readline().strip()
        if answer != "ok":
            raise Failure(f"fake runtime: {command}: {answer}")

    def start_imagegc(self, node):
        state = os.path.join(self.work, f"state-{node}")
        os.makedirs(state, mode=0o700, exist_ok=True)
        config = os.path.join(self.work, f"imagegc-{node}.toml")
        with open(config, "w", encoding="utf-8") as f:
            f.write(
                f'[gc]\ninterval = "{INTERVAL}s"\nusage_poll_interval = "1s"\n'
                f"high_threshold_percent = 70\nlow_threshold_percent = 50\n"
                f'min_age = "0s"\nthrash_window = "1h"\nimage_fs_path = "{self.fs}"\n'
                f"dry_run = {'true' if node == 'b' else 'false'}\n"
                f'[state]\ndir = "{state}"\n[metrics]\nlisten = "{self.inst[node]}"\n'
            )
            if node == "a":
                # node-a watches its pods; node-b runs without [kubernetes],
                # where the pod watch alerts must stay quiet.
                kubeconfig = os.path.join(self.work, "kubeconfig")
                self.api.kubeconfig(kubeconfig)
                f.write(f'[kubernetes]\nenabled = true\nnode_name = "node-a"\nkubeconfig = "{kubeconfig}"\n'
                        f'node_events = false\npods_stale_after = "{PODS_STALE_AFTER}s"\n')
        env = dict(os.environ, NODE_NAME=f"node-{node}")
        log = open(os.path.join(self.work, f"imagegc-{node}.log"), "a")
        self.procs[node] = subprocess.Popen(
            [self.args.imagegc, "run", "--config", config, "--runtime-endpoint", f"unix://{self.socket}"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        wait_for(f"imagegc node-{node} to serve", lambda: self.scrape(node) is not None, 20)

    def stop_imagegc(self, node):
        proc = self.procs.pop(node)
        proc.send_signal(signal.SIGTERM)
        if proc.wait(timeout=25) != 0:
            raise Failure(f"imagegc node-{node} exited with {proc.returncode} on SIGTERM")

    def start_prometheus(self):
        rules = os.path.join(self.work, "rules.yaml")
        with open(rules, "w", encoding="utf-8") as f:
            yaml.safe_dump(scaled_rules(self.args.rules), f, sort_keys=False)
        config = os.path.join(self.work, "prometheus.yml")
        with open(config, "w", encoding="utf-8") as f:
            yaml.safe_dump({
                "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                "rule_files": [rules],
                "scrape_configs": [{
                    "job_name": "imagegc",
                    "static_configs": [
                        # As deploy/podmonitor.yaml's relabelling adds it.
                        {"targets": [self.inst["a"]], "labels": {"node": "node-a"}},
                        # As scraping through the prometheus.io annotations: no node label.
                        {"targets": [self.inst["b"]]},
                    ],
                }],
            }, f, sort_keys=False)
        check = subprocess.run([self.args.promtool, "check", "config", config], capture_output=True, text=True)
        if check.returncode != 0:
            raise Failure(f"promtool check config:\n{check.stdout}{check.stderr}")
        log = open(os.path.join(self.work, "prometheus.log"), "w")
        self.procs["prom"] = subprocess.Popen(
            [self.args.prometheus, f"--config.file={config}", f"--storage.tsdb.path={self.work}/tsdb",
             f"--web.listen-address=127.0.0.1:{self.ports['prom']}"],
            stdout=log, stderr=subprocess.STDOUT,
        )
        wait_for("Prometheus to be ready", self.prometheus_ready, 60)
        self.watch.start()

    def prometheus_ready(self):
        try:
            http_get(f"{self.prom.url}/-/ready", timeout=1)
            return True
        except (urllib.error.URLError, OSError):
            return False

    def cleanup(self):
        self.watch.stop.set()
        self.api.stop()
        for name, proc in self.procs.items():
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=25)
                except subprocess.TimeoutExpired:
                    proc.kill()
        if self.mounted:
            subprocess.run(["umount", self.fs], check=False)

    # --- the node ----------------------------------------------------------

    def scrape(self, node, accept=None):
        try:
            return http_get(f"http://{self.inst[node]}/metrics", accept=accept, timeout=2)
        except (urllib.error.URLError, OSError):
            return None

    def sample(self, node, name):
        scraped = self.scrape(node)
        if scraped is None:
            return None
        for line in scraped[1].splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def used_pages(self):
        st = os.statvfs(self.fs)
        return st.f_blocks - st.f_bavail, st.f_blocks

    def fill_to(self, ratio):
        """Grows or shrinks the file of data that is not images so that
        usage is `ratio` of the filesystem."""
        current = os.path.getsize(self.filler) if os.path.exists(self.filler) else 0
        used, total = self.used_pages()
        target = int(total * ratio) - (used - current // PAGE)
        with open(self.filler, "wb") as f:
            f.truncate(0)
            os.posix_fallocate(f.fileno(), 0, max(target, 1) * PAGE)

    def empty(self):
        if os.path.exists(self.filler):
            os.remove(self.filler)

    def add_app_image(self, backed):
        path = os.path.join(self.fs, "app-1.layer")
        if backed:
            with open(path, "wb") as f:
                os.posix_fallocate(f.fileno(), 0, APP_BYTES)
            self.fake(f"image app:1 {APP_BYTES} {path}")
        else:
            self.fake(f"image app:1 {APP_BYTES}")

    # --- assertions ---------------------------------------------------------

    def firing(self, alert, node="a"):
        instance = "" if alert == "ImagegcAbsent" else self.inst[node]
        return self.watch.state(alert, instance) == "firing"

    def expect_fires(self, alerts, since, phase, timeout):
        for alert in alerts:
            at = wait_for(f"{alert} to fire ({phase})", lambda a=alert: self.firing(a), timeout)
            self.table[alert]["fires"].append(f"{phase}: {at - since:.0f}s")

    def expect_resolves(self, alerts, since, phase, timeout):
        for alert in alerts:
            at = wait_for(f"{alert} to resolve ({phase})", lambda a=alert: not self.firing(a) and
                          self.watch.state(a, "" if a == "ImagegcAbsent" else self.inst["a"]) == "inactive", timeout)
            self.table[alert]["resolves"].append(f"{phase}: {at - since:.0f}s")

    def expect_quiet(self, seconds, phase):
        start = time.time()
        time.sleep(seconds)
        noisy = sorted({(e[1], e[2], e[3]) for e in self.watch.events_since(start) if e[3] != "inactive"})
        noisy += sorted((k[0], k[1], v) for k, v in self.watch.active().items())
        for alert in ALERTS:
            quiet = not any(n[0] == alert for n in noisy)
            prior = self.table[alert]["quiet"]
            self.table[alert]["quiet"] = (prior is None or prior) and quiet
        if noisy:
            raise Failure(f"alerts while all is well ({phase}): {sorted(set(noisy))}")

    # --- the dashboard ------------------------------------------------------

    def dashboard_queries(self, node_choice, start):
        with open(self.args.dashboard, encoding="utf-8") as f:
            dash = json.load(f)
        variables = {v["name"]: v for v in dash["templating"]["list"]}
        values = {"__rate_interval": "15s", "__interval": "1s", "__range": "5m", "__range_s": "300",
                  "datasource": "prometheus"}

        def substitute(expr):
            return re.sub(r"\$(?:\{(\w+)\}|(\w+))", lambda m: values[m.group(1) or m.group(2)], expr)

        # Grafana's way: each variable from its query, in order; "All"
        # without a custom value is every value found.
        for name, v in variables.items():
            if v["type"] != "query":
                continue
            inner = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", v["query"]["query"])
            series = self.prom.api("series", **{"match[]": substitute(inner.group(1))})
            found = sorted({s[inner.group(2)] for s in series if inner.group(2) in s})
            chosen = [node_choice] if name == "node" and node_choice else found
            if name == "node" and node_choice and node_choice not in found:
                raise Failure(f"the node picker does not offer {node_choice}: {found}")
            if chosen == found and v.get("allValue"):
                values[name] = v["allValue"]
            else:
                values[name] = "(" + "|".join(promql_regex_escape(c) for c in chosen) + ")" if chosen else "^$"
        results = []
        for panel in dash["panels"]:
            for target in panel.get("targets", []):
                expr = substitute(target["expr"])
                instant = target.get("instant") or target.get("range") is False
                if instant:
                    data = self.prom.query(expr)
                else:
                    data = self.prom.query_range(expr, start, time.time())
                results.append((panel["title"], target.get("refId"), expr, data))
        return results

    def check_dashboard(self, start):
        empty = []
        for title, ref, expr, data in self.dashboard_queries(None, start):
            if not data:
                empty.append(f"{title} {ref}: {expr}")
        if empty:
            raise Failure("dashboard queries without data:\n  " + "\n  ".join(empty))

        def stat(node, title):
            for t, _, _, data in self.dashboard_queries(node, start):
                if t == title:
                    return float(data[0]["value"][1])
            raise Failure(f"no panel {title!r}")

        for node, dry in (("node-a", 0), ("node-b", 1)):
            reporting, in_dry_run = stat(node, "Nodes reporting"), stat(node, "In dry run")
            if (reporting, in_dry_run) != (1, dry):
                raise Failure(f"node picker set to {node}: Nodes reporting {reporting}, In dry run {in_dry_run}; "
                              f"expected 1 and {dry}")

    # --- the scenario -------------------------------------------------------

    def run(self):
        os.makedirs(self.fs)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", self.fs], check=True)
        self.mounted = True
        self.start_fake()
        self.api.start()
        self.add_app_image(backed=True)
        # An image the runtime refuses to remove: the space pass counts a
        # removal failure on it.
        self.fake("image stuck:1 4096")
        self.fake("fail-remove stuck:1")
        self.start_imagegc("a")
        self.start_imagegc("b")

        # The exposition formats, as Prometheus and promtool ask for them.
        content_type, _ = self.scrape("a", accept=PROMETHEUS_ACCEPT)
        if not content_type.startswith("application/openmetrics-text"):
            raise Failure(f"Prometheus's Accept header got {content_type}")
        content_type, classic = self.scrape("a")
        if not content_type.startswith("text/plain; version=0.0.4"):
            raise Failure(f"no Accept header got {content_type}")
        lint = subprocess.run([self.args.promtool, "check", "metrics"], input=classic, capture_output=True, text=True)
        if lint.returncode != 0:
            raise Failure(f"promtool check metrics on the classic format:\n{lint.stdout}{lint.stderr}")

        self.start_prometheus()
        start = time.time()
        wait_for("both targets up", lambda: len(self.prom.query("up == 1")) == 2, 30)
        targets = self.prom.api("targets")["activeTargets"]
        errors = [t["lastError"] for t in targets if t["lastError"]]
        if errors:
            raise Failure(f"Prometheus cannot read imagegc's OpenMetrics: {errors}")
        wait_for("a successful cycle on node-a",
                 lambda: (self.sample("a", "imagegc_last_success_timestamp_seconds") or 0) > 0, 20)
        wait_for("node-a to list its pods", lambda: self.sample("a", "imagegc_kubernetes_pods_watch_up") == 1, 20)

        # Healthy: nothing fires.
        self.expect_quiet(3 * INTERVAL, "healthy, at the start")

        # 1. Usage above high as the kubelet rounds it, on data that is not
        # images: the one image goes, and usage stays at 69.5 % (70 % rounded
        # up). Then the image is pulled again.
        t = time.time()
        self.fill_to(0.6953 + APP_BYTES / FS_BYTES)
        wait_for("node-a to remove app:1 for space",
                 lambda: (self.sample("a", 'image_garbage_collected_total{reason="space"}') or 0) >= 1, 20)
        # The counter moves at the removal; the ratio once the cycle has
        # measured the disk again after it.
        seen = []

        def just_under_high():
            seen.append((self.sample("a", "imagegc_image_filesystem_usage_ratio"),
                         self.sample("a", "imagegc_space_pass_due")))
            return 0.69 < (seen[-1][0] or 0) < 0.70 and seen[-1][1] == 1

        try:
            wait_for("usage just under 0.70 with a space pass due", just_under_high, 10)
        except Failure:
            raise Failure(f"usage ratio and space pass due {seen[-1]}: wanted just under 0.70 and 1") from None
        ratio = seen[-1][0]
        self.notes.append(f"usage above high: exact ratio {ratio:.4f}, imagegc_space_pass_due 1")
        repulled = time.time()
        self.add_app_image(backed=False)
        self.expect_fires(["ImagegcThrashing"], repulled, "image pulled again", 20)
        self.expect_fires(["ImagegcUsageAboveHigh", "ImagegcCollectionFailing", "ImagegcNoSuccessfulCycle"],
                          t, "69.5 % full (70 % rounded up)", 45)
        t = time.time()
        self.empty()
        self.expect_resolves(["ImagegcUsageAboveHigh", "ImagegcCollectionFailing", "ImagegcNoSuccessfulCycle"],
                             t, "disk emptied", 30)
        self.expect_resolves(["ImagegcThrashing"], repulled, "after the re-pull (15s window)", 30)

        # 2. The runtime goes away and comes back.
        t = time.time()
        self.fake("stop")
        self.expect_fires(["ImagegcRuntimeDown", "ImagegcCollectionFailing", "ImagegcNoSuccessfulCycle"],
                          t, "runtime stopped", 45)
        t = time.time()
        self.fake("start")
        self.expect_resolves(["ImagegcRuntimeDown", "ImagegcCollectionFailing", "ImagegcNoSuccessfulCycle"],
                             t, "runtime back", 30)

        # 3. imagegc stops while its disk is full; every imagegc stops.
        t = time.time()
        self.fill_to(0.90)
        self.expect_fires(["ImagegcUsageAboveHigh"], t, "90 % full", 30)
        last_success = self.sample("a", "imagegc_last_success_timestamp_seconds")
        t = time.time()
        self.stop_imagegc("a")
        self.expect_fires(["ImagegcDown"], t, "imagegc on node-a stopped", 30)
        held = wait_for("3 intervals with node-a down", lambda: time.time() - t > 3 * INTERVAL, 30)
        if not self.firing("ImagegcUsageAboveHigh"):
            raise Failure("ImagegcUsageAboveHigh resolved while imagegc was down")
        self.notes.append(f"ImagegcUsageAboveHigh still firing {held - t:.0f}s after node-a stopped")
        t = time.time()
        self.stop_imagegc("b")
        self.expect_fires(["ImagegcAbsent"], t, "every imagegc stopped", 40)

        # Restarted: the last success is the one before the stop.
        t = time.time()
        self.start_imagegc("a")
        self.start_imagegc("b")
        restored = self.sample("a", "imagegc_last_success_timestamp_seconds")
        if not last_success or abs(restored - last_success) > 0.002:
            raise Failure(f"after a restart the last success is {restored}, before it was {last_success}")
        self.notes.append("imagegc_last_success_timestamp_seconds after a restart: the value before it")
        self.expect_resolves(["ImagegcDown", "ImagegcAbsent"], t, "imagegc started again", 30)
        t = time.time()
        self.empty()
        self.expect_resolves(["ImagegcUsageAboveHigh"], t, "disk emptied after the restart", 30)
        wait_for("every alert to resolve", lambda: not self.watch.active(), 60)

        # 4. The API server goes away for longer than pods_stale_after, and
        # comes back.
        t = time.time()
        self.api.set_down(True)
        self.expect_fires(["ImagegcPodsStale", "ImagegcPodWatchDown"], t, "API server down", 45)
        if self.sample("a", "imagegc_kubernetes_pods") != 0:
            raise Failure("the last known pods still protect after pods_stale_after")
        t = time.time()
        self.api.set_down(False)
        self.expect_resolves(["ImagegcPodWatchDown", "ImagegcPodsStale"], t, "API server back", 60)

        # 5. The runtime names another filesystem than the one imagegc
        # measures, then the same again.
        t = time.time()
        self.fake(f"image-fs {self.work}")
        self.expect_fires(["ImagegcImageFsMismatch"], t, "runtime's images elsewhere", 45)
        t = time.time()
        self.fake(f"image-fs {self.fs}")
        self.expect_resolves(["ImagegcImageFsMismatch"], t, "same filesystem again", 30)

        # 6. A container whose status the runtime cannot give: its mounts
        # are unknown. Then the runtime answers again.
        t = time.time()
        self.fake("fail-rpc ContainerStatus")
        self.fake("containers 1")
        self.expect_fires(["ImagegcContainerMountsUnknown"], t, "ContainerStatus failing", 45)
        t = time.time()
        self.fake("heal-rpc ContainerStatus")
        self.expect_resolves(["ImagegcContainerMountsUnknown"], t, "ContainerStatus answers", 30)
        wait_for("every alert to resolve", lambda: not self.watch.active(), 60)

        # 7. Someone else (the kubelet's image GC, crictl rmi) removes an
        # image imagegc has listed: counted as removed by others, and the
        # alert fires; it resolves once its window has passed.
        self.fake("image other:1 4096")
        t = time.time()
        wait_for("two cycles listing other:1", lambda: time.time() - t > 2 * INTERVAL, 30)
        t = time.time()
        self.fake("remove-image other:1")
        self.expect_fires(["ImagegcImagesRemovedByOthers"], t, "an image removed behind imagegc's back", 45)
        counted = self.sample("a", "imagegc_images_removed_by_others_total")
        if counted != 1:
            raise Failure(f"node-a counts {counted} images removed by others, not 1")
        t = time.time()
        self.expect_resolves(["ImagegcImagesRemovedByOthers"], t, "no removal by others since", 60)

        # Healthy again: nothing fires.
        self.expect_quiet(3 * INTERVAL, "healthy, at the end")
        self.check_dashboard(start)
        self.notes.append("dashboard: every query returns data; the node picker filters (node-a, node-b)")

    def print_table(self):
        print("| alert | fires (after the condition began) | resolves (after it ended) | quiet when healthy |")
        print("|---|---|---|---|")
        for alert, row in self.table.items():
            quiet = {True: "yes", False: "NO", None: "not checked"}[row["quiet"]]
            print(f"| {alert} | {'; '.join(row['fires']) or '-'} | {'; '.join(row['resolves']) or '-'} | {quiet} |")
        for note in self.notes:
            print(f"note: {note}")


def check(imagegc, fake_runtime, rules, dashboard, prometheus=None, promtool=None):
    """Runs the whole scenario and prints the alert table; returns what
    failed (with the last lines of the daemons' and Prometheus's logs), or
    None when everything held."""
    args = argparse.Namespace(imagegc=imagegc, fake_runtime=fake_runtime, rules=rules, dashboard=dashboard,
                              prometheus=prometheus or shutil.which("prometheus") or "/usr/bin/prometheus",
                              promtool=promtool or shutil.which("promtool") or "promtool")
    work = tempfile.mkdtemp(prefix="imagegc-live-")
    live = Live(args, work)
    failure = None
    started = time.time()
    try:
        live.run()
    except Failure as err:
        failure = str(err)
        for name in ("imagegc-a", "imagegc-b", "prometheus"):
            path = os.path.join(work, f"{name}.log")
            if os.path.exists(path):
                with open(path, encoding="utf-8", errors="replace") as f:
                    failure += f"\n--- last lines of {name}.log\n" + "".join(f.readlines()[-15:]).rstrip("\n")
    finally:
        live.cleanup()
        live.print_table()
        print(f"took {time.time() - started:.0f}s")
        shutil.rmtree(work, ignore_errors=True)
    return failure


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--imagegc", required=True)
    parser.add_argument("--fake-runtime", required=True)
    parser.add_argument("--rules", required=True)
    parser.add_argument("--dashboard", required=True)
    parser.add_argument("--prometheus")
    parser.add_argument("--promtool")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("live_prometheus.py: run as root (it mounts a tmpfs)")
        return 2
    failure = check(args.imagegc, args.fake_runtime, args.rules, args.dashboard, args.prometheus, args.promtool)
    if failure:
        print(f"FAIL {failure}")
    return 1 if failure else 0


if __name__ == "__main__":
    sys.exit(main())
