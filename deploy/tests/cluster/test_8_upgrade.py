"""Scenario 8: upgrades.

`helm upgrade` of a release an earlier chart installed: the release is
installed from the chart as it was at commit d50ef1e
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

An upgrade between two real builds, on each install path (kustomize and
Helm): release 0.1.0, its image built from its own commit's tree by its own
scripts/build-image.sh and installed with its own manifests or chart, runs
until it has history (a pod's image in use, a used image removed by age
and journaled, the state file in the manifests' hostPath with its records
and the memory of removed images, one of them with a usual break); then
README's upgrade as written (kustomize: the new checkout's deploy/ and
`newTag`, `kubectl apply -k`; Helm: `helm upgrade --reset-then-reuse-values
--set image.tag=NEW`) to this checkout's image, built by its
scripts/build-image.sh under the tag it gives this commit. Every pod then
runs the new binary (`imagegc --version`, `imagegc_build_info`), the state
file and the journal are carried over, the configuration keys the old
binary did not have take their defaults and the others keep their values,
no image goes (imagegc's own images are protected: nothing is due), and
no container restarts. Then the rollback the same way, back to 0.1.0: what
CHANGELOG.md says of the state file versions 0.1.0 reads decides whether
the history is kept or set aside, and the state file says which version
this build wrote.
"""

import json
import os
import re
import shutil
import subprocess
import time
import tomllib
import zlib

import pytest
import yaml

import releases
import workloads as w
from cluster import IMAGEGC_IMAGE, bare, wait_for
from conftest import record
from deploy import CHART, DEPLOY, REPO, Deployment, metric

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
    # The suite's image, named as a user who installed the earlier chart
    # names theirs (its own appVersion is an older tag).
    d = Deployment(cluster, "upgrade", "helm", USER_CONFIG, chart=EARLIER_CHART,
                   image=tuple(IMAGEGC_IMAGE.rsplit(":", 1)))
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


# --- between two releases ---------------------------------------------------

RELEASE = releases.RELEASE
CHANGELOG = os.path.join(REPO, "CHANGELOG.md")
# The test's settings: cycles every 5 s and age removal after 20 s, so that
# the release has removed a used image before the upgrade; imagegc's own
# images (both builds' and the suite's) protected, so that once that
# removal is done no image is due, and none may go during the upgrade or
# the rollback.
HISTORY_CONFIG = {"gc.interval": "5s", "gc.usage_poll_interval": "5s", "gc.min_age": "1s", "gc.max_age": "20s",
                  "protect.images": [releases.REPOSITORY, IMAGEGC_IMAGE.rsplit(":", 1)[0]]}
# A removed image the node once had, remembered with its usual break (two
# hours, straying by ten minutes) in the state file the release starts
# from, as a release that ran for days has one: minutes of a test teach no
# break. [id, last used, removed at (unix ms, set when written: older than
# 30 days is forgotten), usual break, spread]
REMEMBERED = ["sha256:" + "5eed" * 16, None, None, 7_200_000, 600_000]


class Builds:
    """The release's image and this checkout's, on the node, and the
    release's own deploy/ and chart."""

    def __init__(self, cluster):
        timings = {}
        # Started in the background when the session collected this scenario.
        self.old_tar, self.old_version = releases.wait_release_image(timings)
        self.new_tar, self.new_ref, self.new_version = releases.current_image(timings)
        self.old_ref = f"{releases.REPOSITORY}:{RELEASE}"
        self.new_tag = self.new_ref.rsplit(":", 1)[1]
        started = time.monotonic()
        cluster.import_oci(self.old_tar, self.old_ref, all_platforms=True)
        cluster.import_oci(self.new_tar, self.new_ref, all_platforms=True)
        timings["both images onto the node"] = time.monotonic() - started
        self.old_deploy = releases.release_tree(releases.RELEASE_COMMIT, "deploy",
                                                cluster.path("work", f"release-{RELEASE}"))
        for what, seconds in timings.items():
            record(f"upgrade, images: {what}", seconds)


@pytest.fixture(scope="module")
def release_builds(cluster):
    b = Builds(cluster)
    yield b
    cluster.remove_images([b.old_ref, b.new_ref])


def state_path(d):
    """The state directory on the node, as the DaemonSet running mounts it."""
    ds = d.cluster.kubectl_json("-n", d.namespace, "get", "daemonset", "imagegc")
    volumes = {v["name"]: v for v in ds["spec"]["template"]["spec"]["volumes"]}
    return volumes["state"]["hostPath"]["path"]


def write_state(directory, removed):
    """A state file of version 7, the one 0.1.0 writes (CHANGELOG): no
    records, `removed` remembered."""
    os.makedirs(directory, mode=0o700)
    now = int(time.time() * 1000)
    removed = [[image, now - 3 * 3_600_000, now - 3_600_000, *rest] for image, _, _, *rest in removed]
    head = {"saved_at": now, "records": 0, "removed": removed}
    payload = (json.dumps(head, separators=(",", ":")) + "\n").encode()
    with open(os.path.join(directory, "records.state"), "wb") as f:
        f.write(f"imagegc-state v7 crc32={zlib.crc32(payload):08x} len={len(payload):010}\n".encode() + payload)
    os.chmod(os.path.join(directory, "records.state"), 0o600)


def read_state(directory):
    """(version, head, {bare id: record line}) of the state file, its
    checksum and length verified."""
    with open(os.path.join(directory, "records.state"), "rb") as f:
        data = f.read()
    header, _, payload = data.partition(b"\n")
    m = re.match(rb"^imagegc-state v(\d+) crc32=([0-9a-f]{8}) len=(\d{10})$", header)
    assert m, header
    assert zlib.crc32(payload) == int(m.group(2), 16) and len(payload) == int(m.group(3)), header
    lines = payload.decode().splitlines()
    return int(m.group(1)), json.loads(lines[0]), {bare(r[0]): r for r in map(json.loads, lines[1:])}


def set_aside(directory):
    return sorted(n for n in os.listdir(directory) if n.startswith("records.state.corrupt"))


def carried(before, after):
    """What of the state `before` is not in `after` as it was: a record's
    first sighting, size, names, usual break and its spread, a use no
    earlier, and the memory of removed images."""
    _, head0, records0 = before
    _, head1, records1 = after
    lost = []
    for image, r in records0.items():
        r1 = records1.get(image)
        # [id, first seen, last used, size, pinned, tags, digests, ever used, usual break, spread]
        if r1 is None or r1[1] != r[1] or r1[3:7] != r[3:7] or r1[8:10] != r[8:10] or r1[2] < r[2] or r1[7] < r[7]:
            lost.append((r, r1))
    removed1 = {tuple(e) for e in head1.get("removed", [])}
    lost += [("removed", e) for e in head0.get("removed", []) if tuple(e) not in removed1]
    if (head1.get("last_success") or 0) < (head0.get("last_success") or 0):
        lost.append(("last_success", head0.get("last_success"), head1.get("last_success")))
    return lost


def flat(table, prefix=""):
    out = {}
    for key, value in table.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def build_info(samples):
    return [labels for name, labels, _ in samples if name == "imagegc_build_info"]


def changelog_state_versions(version):
    """(the state file versions `version` reads, the one it writes), as its
    CHANGELOG section says ("reads versions 1 to 7 and writes version 7")."""
    with open(CHANGELOG) as f:
        text = f.read()
    section = text.split(f"## [{version}]", 1)[1].split("\n## [", 1)[0]
    m = re.search(r"reads\s+versions\s+(\d+)\s+to\s+(\d+)\s+and\s+writes\s+version\s+(\d+)", section)
    assert m, f"CHANGELOG's {version} section names no state file versions it reads and writes"
    return range(int(m.group(1)), int(m.group(2)) + 1), int(m.group(3))


class Node:
    """What the node and the running imagegc say, for the checks."""

    def __init__(self, cluster, d):
        self.cluster = cluster
        self.d = d

    def pods(self):
        return [p for p in self.d.pods() if not p["metadata"].get("deletionTimestamp")]

    def runs(self, ref, version_line):
        """Every pod runs `ref`, Ready, not restarted, its binary saying
        `version_line`."""
        pods = self.pods()
        assert pods, self.d.diagnostics()
        for pod in pods:
            name = pod["metadata"]["name"]
            statuses = pod["status"].get("containerStatuses", [])
            assert [c["image"] for c in pod["spec"]["containers"]] == [ref], (name, pod["spec"]["containers"])
            assert statuses and all(s.get("ready") for s in statuses), (name, statuses, self.d.diagnostics())
            restarts = [s.get("restartCount", 0) for s in statuses]
            assert restarts == [0], (name, restarts, self.d.diagnostics())
            said = self.cluster.kubectl("-n", self.d.namespace, "exec", name, "--", "/imagegc", "--version")
            assert said.stdout.strip() == version_line, (said.stdout, version_line)
        return pods

    def cycles(self, at_least):
        """Waits until the running pod has done `at_least` successful cycles."""
        def done():
            return (metric(self.d.scrape(), "imagegc_cycles_total", result="success") or 0) >= at_least
        wait_for(f"{at_least} cycles of the running imagegc", done, 60, 1)

    def config(self):
        out = self.d.exec("/imagegc", "check-config", "--config", "/etc/imagegc/imagegc.toml").stdout
        return flat(tomllib.loads(out))


def defaults(binary, scratch):
    """The configuration `binary` takes with nothing set (its state
    directory aside: `scratch`)."""
    os.makedirs(scratch, exist_ok=True)
    path = os.path.join(scratch, "empty.toml")
    with open(path, "w") as f:
        f.write(f'[state]\ndir = "{scratch}"\n')
    out = subprocess.run([binary, "check-config", "--config", path], capture_output=True, text=True, check=True)
    shutil.rmtree(scratch, ignore_errors=True)
    return flat(tomllib.loads(out.stdout))


@pytest.mark.parametrize("how", ["kustomize", "helm"])
def test_an_upgrade_from_the_last_release_keeps_its_history_and_images_and_rolls_back(cluster, release_builds, how):
    b = release_builds
    phase_started = time.monotonic()

    def phase(name):
        nonlocal phase_started
        record(f"upgrade[{how}]: {name}", time.monotonic() - phase_started)
        phase_started = time.monotonic()

    # The operator's checkout of the release: its deploy/ and chart.
    checkout = cluster.path("work", f"operator-{how}")
    deploy = releases.operator_deploy(b.old_deploy, os.path.join(checkout, "deploy"))
    # In README's namespace: its Helm command names it.
    d = Deployment(cluster, f"release-{how}", how, HISTORY_CONFIG, namespace="imagegc", deploy=deploy,
                   chart=os.path.join(deploy, "helm", "imagegc"), image=(releases.REPOSITORY, RELEASE), state_dir=None)
    node = Node(cluster, d)
    app = w.workload_image(cluster, "upgrade-app")
    victim = w.workload_image(cluster, "upgrade-victim")
    state_dir = None
    try:
        w.run_pod(cluster, "upgrade-app", app)
        w.run_pod(cluster, "upgrade-victim", victim)
        w.wait_running(cluster, ["upgrade-app", "upgrade-victim"])
        victim_id = bare(cluster.images()[victim])

        # --- 0.1.0, until it has history
        with open(os.path.join(b.old_deploy, "daemonset.yaml")) as f:
            ds = yaml.safe_load(f)
        state_dir = next(v["hostPath"]["path"] for v in ds["spec"]["template"]["spec"]["volumes"]
                         if v["name"] == "state")
        assert not os.path.exists(state_dir), f"{state_dir} exists before the test: it would be used and removed"
        write_state(state_dir, [REMEMBERED])
        d.apply()
        assert state_path(d) == state_dir
        node.runs(b.old_ref, b.old_version)
        assert build_info(d.scrape()) == [{"version": RELEASE}], build_info(d.scrape())
        cluster.kubectl("delete", "pod", "upgrade-victim", "--wait=true", "--grace-period=1", timeout=60)
        wait_for("the used image removed by age", lambda: victim not in cluster.images(), 90, 1)
        wait_for("its removal journaled", lambda: victim_id in d.removed_ids(), 30, 1)

        def saved_with_history():
            s = read_state(state_dir)
            remembered = {e[0] for e in s[1].get("removed", [])}
            return bare(cluster.images()[app]) in s[2] and victim_id in {bare(i) for i in remembered} \
                and REMEMBERED[0] in remembered and s
        before = wait_for("the state file saved with the records and the removal", saved_with_history, 30, 1)
        reads, writes = changelog_state_versions(RELEASE)
        assert before[0] == writes and set_aside(state_dir) == [], (before[0], writes, set_aside(state_dir))
        # Nothing is due any more: what the node has now must stay.
        images = w.until_still("the node's images to hold still", cluster.image_ids, 6, 60)
        history = d.history()
        config = node.config()
        phase("0.1.0 installed, used, an image removed and journaled")

        # --- README's upgrade, as written: from the operator's checkout at
        # the new release, newTag and `kubectl apply -k`, or its Helm command.
        releases.operator_deploy(DEPLOY, deploy)
        if how == "kustomize":
            set_new_tag(d.overlay, b.new_tag)
            cluster.kubectl("apply", "-k", d.overlay)
        else:
            readme_helm_upgrade(cluster, checkout, b.new_tag)
        rolled(cluster, d, b.new_ref)
        phase("upgrade: the new pod Ready")
        pods = node.runs(b.new_ref, b.new_version)
        for pod in pods:
            labels = build_info(d.scrape(pod))
            assert len(labels) == 1 and set(labels[0]) == {"version", "commit"}, labels
            assert f"{labels[0]['version']} (commit {labels[0]['commit']})" in b.new_version, (labels, b.new_version)
        started_ms = metric(d.scrape(), "imagegc_start_time_seconds") * 1000
        node.cycles(2)
        after = wait_for("the new imagegc's save", lambda: (s := read_state(state_dir))[1]["saved_at"] > started_ms
                         and s, 30, 1)
        assert set_aside(state_dir) == [], set_aside(state_dir)
        assert carried(before, after) == [], carried(before, after)
        assert same_journal(history, d.history()), (history, d.history())
        new_config = node.config()
        changed = {k: (v, new_config.get(k)) for k, v in config.items() if new_config.get(k) != v}
        assert changed == {}, f"the upgrade changed configured values: {changed}"
        fresh = defaults(os.path.join(releases.target_dir(), releases.MUSL, "release", "imagegc"),
                         cluster.path("work", "defaults-check"))
        added = {k: (v, fresh.get(k)) for k, v in new_config.items() if k not in config and fresh.get(k) != v}
        assert added == {}, f"keys the release lacked that do not take their defaults: {added}"
        assert cluster.image_ids() == images, (images - cluster.image_ids(), cluster.image_ids() - images)
        node.runs(b.new_ref, b.new_version)
        phase("upgrade: checked (2 cycles)")

        # --- the rollback, the same way
        written = after[0]
        kept = written in reads
        releases.operator_deploy(b.old_deploy, deploy)
        if how == "kustomize":
            set_new_tag(d.overlay, RELEASE)
            cluster.kubectl("apply", "-k", d.overlay)
        else:
            readme_helm_upgrade(cluster, checkout, RELEASE)
        rolled(cluster, d, b.old_ref)
        phase("rollback: the 0.1.0 pod Ready")
        node.runs(b.old_ref, b.old_version)
        assert build_info(d.scrape()) == [{"version": RELEASE}], build_info(d.scrape())
        started_ms = metric(d.scrape(), "imagegc_start_time_seconds") * 1000
        node.cycles(2)
        back = wait_for("0.1.0's save", lambda: (s := read_state(state_dir))[1]["saved_at"] > started_ms and s, 30, 1)
        if kept:
            # CHANGELOG: 0.1.0 reads the version this build writes.
            assert set_aside(state_dir) == [], set_aside(state_dir)
            assert carried(after, back) == [], carried(after, back)
            assert same_journal(history, d.history()), (history, d.history())
        else:
            # CHANGELOG: 0.1.0 sets a newer file aside and starts afresh.
            assert len(set_aside(state_dir)) == 1, set_aside(state_dir)
            assert all(r[1] >= started_ms for r in back[2].values()), back[2]
        assert cluster.image_ids() == images, (images - cluster.image_ids(), cluster.image_ids() - images)
        node.runs(b.old_ref, b.old_version)
        phase(f"rollback: checked (history {'kept' if kept else 'set aside'}, 2 cycles)")
    finally:
        d.delete()
        w.delete_pods(cluster)
        cluster.remove_images([app, victim])
        if state_dir:
            shutil.rmtree(state_dir, ignore_errors=True)
        phase("teardown")


def readme_helm_upgrade(cluster, checkout, tag):
    """README's Helm upgrade command (its Upgrade section's block), NEW
    being `tag`, run with bash from the operator's checkout."""
    with open(os.path.join(REPO, "README.md")) as f:
        section = f.read().split("\n## Upgrade\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert "image.tag=NEW" in block, block
    env = dict(os.environ, KUBECONFIG=cluster.kubeconfig,
               PATH=f"{os.environ['IMAGEGC_KUBERNETES_BIN']}:{os.environ['PATH']}",
               HELM_CACHE_HOME=cluster.path("work", "helm-cache"), HELM_CONFIG_HOME=cluster.path("work", "helm-config"),
               HELM_DATA_HOME=cluster.path("work", "helm-data"))
    p = subprocess.run(["bash", "-euo", "pipefail", "-c", block.replace("NEW", tag)], cwd=checkout, env=env,
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, f"README's upgrade exited {p.returncode}:\n{block}\n{p.stdout}\n{p.stderr}"


def set_new_tag(overlay, tag):
    """README's step: `newTag` in the overlay set to the tag installed."""
    path = os.path.join(overlay, "kustomization.yaml")
    with open(path) as f:
        text = f.read()
    text, n = re.subn(r"(?m)^(\s*newTag: ).*$", lambda m: m.group(1) + json.dumps(tag), text)
    assert n == 1, text
    with open(path, "w") as f:
        f.write(text)


def rolled(cluster, d, ref):
    """Waits for the DaemonSet rolled to `ref`: its rollout done and a Ready
    pod on it, the old one gone."""
    try:
        cluster.kubectl("-n", d.namespace, "rollout", "status", "daemonset/imagegc", "--timeout=120s", timeout=130)
        def only_new():
            pods = d.pods()
            return pods and all([c["image"] for c in p["spec"]["containers"]] == [ref] for p in pods) \
                and d.ready_pod()
        wait_for(f"only pods of {ref}, Ready", only_new, 60, 0.5)
    except (RuntimeError, TimeoutError) as e:
        raise AssertionError(f"{e}\n{d.diagnostics()}") from None


def same_journal(old, new):
    """The journal `new` reads holds what `old` read, entry for entry (a
    newer `history` may say more of each)."""
    return len(old) == len(new) and all({k: n.get(k) for k in o} == o for o, n in zip(old, new))
