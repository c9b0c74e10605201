"""Scenario 9: one big pull, over the network, by a pod.

The issue's node: the kubelet's image GC off, its eviction line at
imagefs.available 30% (70% used); two workload pods running; six unused
25 MiB images; imagegc from the overlay at high 55 / low 45. Then a pod
starts on an image of about 200 MiB that the node does not have: the
kubelet pulls it from a registry (the test bed's private one on
127.0.0.1, not `ctr import`), and the image filesystem goes from 35% to
76-77% in about 2 s (its blobs, then its unpack), in one step from below
high past the eviction line. A collector that only reacts is late by
construction; the kubelet's eviction manager looks every 10 s.

The history the imagegc cases need comes from a real earlier pull of the
same repository while imagegc runs: a pod pulls REG/pull/big:1 (the size
of big:2, other random bytes), the pod is deleted, big:1 is removed over
CRI (`crictl rmi`; the test waits until imagegc counts it removed by
others), and only then the node is prepared and the pod on REG/pull/big:2
created. With imagegc, no pod may be evicted, the pod on big:2 runs, and
the pull must never take usage past the eviction line (statvfs every
0.1 s): room is made BEFORE the pull. That last assertion is what tells
making room from reacting. Measured on containerd with neither feature:
the space pass past the line (it hurries) removed the old images 0.3-1.4 s
after the crossing; whether the kubelet then evicts depends on where its
10 s look falls: 0 pods in three runs, 1 pod in a fourth (the issue's
"evicted 1").

(a) `[kubernetes]` on (deploy/components/kubernetes), gc.headroom off, the
    issue's shape: imagegc sees the pod bound to the node before the
    kubelet pulls and makes room for its image, whose size it knows from
    the node's history of the repository (the previous tag's):
    `kubernetes.room_before_pulls` (on by default with [kubernetes]).
    The room is made before the pull: `imagegc_room_before_pulls_total`
    counts it.
(b) `gc.headroom = true`, no [kubernetes]: room kept above the eviction
    line for the largest pull of the last 7 days (big:1). Headroom keeps
    room for at most a quarter of the disk (src/policy/headroom.rs), and
    the issue's pull takes 42%: at the issue's shape the thresholds in
    force are 45/35, the node at 35% keeps its old images and the pull
    crosses the line all the same (the benchmark shows it). So this case
    runs the largest pull headroom covers, in the same shape: ~120 MiB
    (about 24% of the disk) onto a node at 51-52% (below high: as many
    old 25 MiB images as take it there), which without collection would
    end at about 76%. Measured: imagegc freed to 30% before the pod came,
    the pull peaked at 55%.
(d) `[kubernetes]` on with `kubernetes.registry_manifests` (the component
    deploy/components/registry-manifests), no history:
    the pod's image is of a repository this node never had, so only its
    registry's manifest can size it. The test bed's registry listens on
    127.0.0.1, where containerd pulls from; imagegc's pod reaches the node
    at the bridge's gateway, where the test forwards a port to it
    (`kubernetes.registry_endpoints` names it: a registry the runtime reaches
    on the node's loopback, as kind's local registry is). The room is made
    before the pull, as in (a). A second before the pod on big:2, a pod
    is created on an image of a registry that takes connections and never
    answers (a second endpoint): imagegc's lookup of it waits its 10 s,
    and the lookup of big:2 must not wait behind it. (Measured before
    lookups ran side by side: the suite's workload pods, imported with
    imagePullPolicy Never, were looked up too, their registry's name
    unresolvable from the pod, 10 s and 5 s; a pull that came within them
    waited its turn and was not sized in time: most likely the failures seen after the
    whole suite on CRI-O and once on containerd.)
(c) The control, the kubelet alone (no imagegc), the issue's shape: the
    pull takes usage to 77% and the kubelet evicts a pod (the first within
    10 s; measured: one workload pod within the test's wait).
The benchmark scripts/bench-pull.sh (deploy/tests/cluster/bench_pull.py)
runs these cases and the issue's shape for (b) on fresh clusters, each
watched for a minute, and prints them side by side (pods evicted,
seconds with DiskPressure, seconds until usage is back under the
eviction line, images removed, bytes to pull again).

The slower shape: the same bytes arriving as three pulls of ~70 MiB images
(about 14% of the disk each) by three pods one after another, each created
PACE (5) seconds after the previous one is Running (a rollout with
minReadySeconds), with imagegc at high 55 / low 45 and neither feature:
measured 36% to 50% to 64% (high crossed: imagegc freed to 44% within a
second) to 51-58%, then 48%. Reacting at high is in time there, as for the
fills of scenario 2.

Sizes are doubled on CRI-O, which stores an image once where containerd
keeps its blobs and its unpacked snapshot: the same share of the disk.
imagegc mounts the kubelet's file in every case (the kubelet-config
component): it reads the eviction line there; without it, it assumes the
kubelet's default line (15% available), and headroom keeps room above
the wrong line (measured: the thresholds stayed 55/45, the pull crossed).
imagegc's gc.min_age is 1 s and gc.usage_poll_interval 2 s, so that the
old images are older than its minimum age after two listings (the test
waits for them: `imagegc_cri_requests_total{method="ListImages"}`). The
kubelet's imageMinimumGCAge stays at its 2m: its records of images it
first sees at its reclaim are too young for it to remove them, and (c)
evicts every time (4 of 4 runs). The benchmark restarts the kubelet once
the old images are there, with imageMinimumGCAge 1s, so that its reclaim
may remove them first, as the issue says: then the kubelet alone removed
them and evicted no pod (3 of 3 runs, 7 s past the line), which the
issue's "evicted every workload pod" does not match.

Cost (pytest --durations, 2 cores): containerd (a) 51-55 s, (b) 47-51 s,
(c) 25-30 s, (d) 45 s, the slower shape 56 s; CRI-O (a) 60 s, (b) 61 s, (c) 41 s,
the slower shape 62 s, (d) 56 s (CI runs (a) and (d) there:
scripts/test.sh).
"""

import socket
import threading
import time

import workloads as w
from cluster import GATEWAY, IMAGEGC_IMAGE, MIB, PAUSE_IMAGE, wait_for
from conftest import record
from deploy import Deployment, metric

HIGH, LOW = 55, 45
# The kubelet's evictionHard imagefs.available 30% (cluster.py): usage
# above 70% is past its line.
EVICTION_USED = 70
OLD_IMAGES = 6
OLD = 25 * MIB
BIG = 200 * MIB
# The slower shape: three images of this size, one pod after another.
STEP = 70 * MIB
STEPS = 3
# Seconds between one step's pod Running and the next one's creation
# (a rollout with minReadySeconds: 5).
PACE = 5.0
# After the last pod is Running: one of the eviction manager's 10 s looks
# and a margin (the pull is over; usage past the line is asserted apart).
WATCH = 12.0
# The issue's node and pull: six old 25 MiB images (about 35%), then
# ~200 MiB (about 42% of the disk on either runtime).
ISSUE = {"big": BIG, "old": OLD_IMAGES}
# The largest pull gc.headroom keeps room for: a quarter of the disk
# (src/policy/headroom.rs; 120 MiB here, about 24%), onto a node at 52%
# (below high: as many old 25 MiB images as take it there), so that it
# too would take usage past the line from below high in one step.
QUARTER = {"big": 120 * MIB, "old_to": 52}
BASE = {"gc.high_threshold_percent": HIGH, "gc.low_threshold_percent": LOW, "gc.min_age": "1s",
        "gc.usage_poll_interval": "2s", "gc.headroom": False}
# Every case mounts the kubelet's file (deploy/components/kubelet-config):
# imagegc reads its eviction line there (30% available), else it assumes
# the kubelet's default (15%) and keeps room above that.
# (a): the feature is on by default with [kubernetes] on.
WITH_PODS = ({**BASE}, ["kubernetes", "kubelet-config"])
# (b)
WITH_HEADROOM = ({**BASE, "gc.headroom": True}, ["kubelet-config"])
# The slower shape: imagegc reacting at high only.
REACTING = ({**BASE}, ["kubelet-config"])


def scale(cluster):
    """2 on CRI-O (an image stored once), 1 on containerd (blob and snapshot)."""
    return 2 if cluster.runtime == "crio" else 1


def listings(d):
    return metric(d.scrape(), "imagegc_cri_requests_total", method="ListImages", code="OK") or 0


def wait_listed(d, times=2):
    """Until imagegc has listed the node `times` times from now: what is on
    the node now is in its records (and older than its 1 s minimum age)."""
    start = listings(d)
    wait_for(f"imagegc to list the images {times} times", lambda: listings(d) >= start + times, 60, 0.5)


def removed_by_others(d):
    return metric(d.scrape(), "imagegc_images_removed_by_others_total") or 0


class Pull:
    """Pods created one after another on registry images; the image
    filesystem's usage sampled every 0.1 s meanwhile (statvfs, in a thread
    of its own until `stop`), and the node's DiskPressure every 2 s."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.start = time.monotonic()
        self.timeline = [(0.0, cluster.usage()[0])]
        self.pressure = []
        self._pressure_at = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample_usage, daemon=True)
        self._thread.start()

    def _sample_usage(self):
        while not self._stop.wait(0.1):
            try:
                self.timeline.append((time.monotonic() - self.start, self.cluster.usage()[0]))
            except OSError:
                return

    def stop(self):
        """Stops sampling usage; the figures below are read after it."""
        self._stop.set()
        self._thread.join()
        return self

    def _sample_pressure(self):
        now = time.monotonic() - self.start
        if now - self._pressure_at >= 2:
            self._pressure_at = now
            try:
                self.pressure.append((now, w.disk_pressure(self.cluster)))
            except RuntimeError:
                pass

    def pod(self, name, image, timeout=240):
        """A pod on `image` (pulled: IfNotPresent), until it runs or fails
        (evicted while its image is pulled). Returns the seconds from its
        creation to then, and its phase and reason."""
        created = time.monotonic()
        w.run_pod(self.cluster, name, image, pull="IfNotPresent")
        while True:
            self._sample_pressure()
            phase, reason = w.pod_phase(self.cluster, name)
            if phase not in ("Pending", None):
                return time.monotonic() - created, phase, reason
            assert time.monotonic() - created < timeout, f"pod {name} on {image} not Running in {timeout}s"
            time.sleep(0.5)

    def watch(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self._sample_pressure()
            time.sleep(0.5)

    def peak(self):
        return max(u for _, u in self.timeline)

    def past_line(self):
        """Seconds from the first sample past the eviction line to the first
        at or under it after that: 0.0 if never past, None if still past."""
        first = next((i for i, (_, u) in enumerate(self.timeline) if u > EVICTION_USED), None)
        if first is None:
            return 0.0
        under = next((t for t, u in self.timeline[first:] if u <= EVICTION_USED), None)
        return None if under is None else round(under - self.timeline[first][0], 1)

    def pressure_seconds(self):
        """Seconds the node reported DiskPressure (2 s samples)."""
        return 2.0 * sum(1 for _, p in self.pressure if p)

    def every_second(self):
        """The timeline, one sample a second, for a report."""
        out, next_at = [], 0.0
        for t, u in self.timeline:
            if t >= next_at:
                out.append((round(t, 1), u))
                next_at = t + 1
        return out


def history(cluster, d, big1):
    """The node's earlier pull of the repository, while imagegc runs: a pod
    pulls big:1, goes, and big:1 is removed over CRI. Returns what big:1
    took on the image filesystem, in bytes (measured)."""
    available = cluster.usage()[2]
    p = Pull(cluster)
    try:
        _, phase, reason = p.pod("history", big1)
    finally:
        p.stop()
    assert phase == "Running", f"the pod on big:1: {phase} ({reason})"
    wait_listed(d)
    took = available - cluster.usage()[2]
    others = removed_by_others(d)
    w.delete_pods(cluster)
    cluster.crictl("rmi", big1)
    wait_for("imagegc to count big:1 removed by others", lambda: removed_by_others(d) > others, 60, 1)
    # containerd 2.x gives the space back after RemoveImage returns.
    wait_for("big:1's space back", lambda: cluster.usage()[2] >= available - 16 * MIB, 60, 0.5)
    return took


def prepare(cluster, tag, shape):
    """Two running workload pods on their own images and old unused images:
    `shape["old"]` of them, or as many as take usage to `shape["old_to"]`
    percent. What one costs is measured first (one imported and removed).
    Returns (workload pods, old image names, usage then, usage the node
    would have then had nothing been removed: imagegc may remove some
    while they arrive)."""
    pods = []
    for i in (1, 2):
        image = w.workload_image(cluster, f"{tag}-app{i}")
        pods.append(w.run_pod(cluster, f"{tag}-app{i}", image))
    w.wait_running(cluster, pods)
    size = OLD * scale(cluster)
    before = cluster.usage()[2]
    probe = w.unused_image(cluster, f"{tag}-probe", size)
    cost = max(1, before - cluster.usage()[2])
    cluster.crictl("rmi", probe)
    wait_for("the probe's space back", lambda: cluster.usage()[2] >= before - MIB, 60, 0.5)
    _, capacity, available = cluster.usage()
    count = shape.get("old", 0)
    if "old_to" in shape:
        count = max(0, int((available - capacity * (100 - shape["old_to"]) / 100) // cost))
    old = [w.unused_image(cluster, f"{tag}-old{i}", size) for i in range(count)]
    planned = -(-(capacity - available + count * cost) * 100 // capacity)
    return pods, old, cluster.usage()[0], planned


def cleanup(cluster):
    """The node as the next case needs it: no pod of the case, no image but
    the pause and imagegc images, and their space back. The sandboxes of
    deleted or evicted pods go first: their exited containers hold the
    case's big image's layers until the kubelet's container GC runs (once
    in CI the case after the control started at 56 %, above high, where
    35-36 % is usual: 21 % more, the big image's unpacked share)."""
    w.delete_pods(cluster)
    w.remove_dead_sandboxes(cluster)
    w.clear_images(cluster, {PAUSE_IMAGE, IMAGEGC_IMAGE})
    w.wait_space_settled(cluster)
    w.wait_no_disk_pressure(cluster, 90)


def deploy(cluster, tag, settings):
    """imagegc deployed with `settings` (config, components)."""
    config, components = settings
    d = Deployment(cluster, tag, "kustomize", config, components=components)
    d.apply()
    return d


def big_pull(cluster, tag, d, shape, kubelet_min_age=None, with_history=True, stuck=None):
    """The scenario of `shape` (ISSUE, QUARTER) with imagegc deployed (`d`, see `deploy`), or
    none (None: the kubelet alone, no history): the history, the node, the
    pod on big:2, WATCH seconds more. With `kubelet_min_age`, the kubelet
    is restarted with that imageMinimumGCAge once the old images are
    there, so that its reclaim may remove them. With `stuck` (an image
    reference), a pod on it is created a second before the pod on big:2.
    Returns the figures, the Pull and the workload pods;
    leaves the node as it is (see `cleanup`)."""
    big1 = w.registry_image(cluster, f"{tag}-big", 1, shape["big"] * scale(cluster))
    big2 = w.registry_image(cluster, f"{tag}-big", 2, shape["big"] * scale(cluster))
    events_before = {e["metadata"]["uid"] for e in w.eviction_events(cluster)}
    phases = [("pushed", time.monotonic())]
    share = None
    if d is not None and with_history:
        took = history(cluster, d, big1)
        share = -(-took * 100 // max(1, cluster.usage()[1]))
        phases.append(("history", time.monotonic()))
    pods, old, prepared, planned = prepare(cluster, tag, shape)
    phases.append(("prepared", time.monotonic()))
    listed = [w.cri_images_by_tag(cluster)]
    if kubelet_min_age:
        w.restart_kubelet(cluster, {"imageMinimumGCAge": kubelet_min_age})
        time.sleep(2)
    if d is not None:
        wait_listed(d)
        w.images_once_settled(cluster)
    assert planned < HIGH, f"usage {planned}% once prepared: the scenario starts below high ({HIGH}%)"
    assert share is None or planned + share > EVICTION_USED, (
        f"usage {planned}% once prepared and big:1 took {share}%: big:2 would not cross the line")
    phases.append(("settled", time.monotonic()))
    if stuck:
        w.run_pod(cluster, f"{tag}-stuck", stuck, pull="IfNotPresent")
        time.sleep(1)
    p = Pull(cluster)
    try:
        to_running, phase, reason = p.pod(f"{tag}-big", big2)
        listed.append(w.cri_images_by_tag(cluster))
        p.watch(WATCH)
    finally:
        p.stop()
    listed.append(w.cri_images_by_tag(cluster))
    events = [e for e in w.eviction_events(cluster) if e["metadata"]["uid"] not in events_before]
    images = cluster.images()
    figures = {"old_images": len(old), "prepared": planned, "after_imports": prepared, "big1_share": share,
               "before_pod": p.timeline[0][1], "peak": p.peak(),
               "past_line_s": p.past_line(), "disk_pressure_s": p.pressure_seconds(),
               "old_removed": len([o for o in old if o not in images]), "to_running_s": round(to_running, 1),
               "big_pod": f"{phase} {reason or ''}".strip(),
               "evicted": w.evicted_pods(cluster), "events": sorted({e["reason"] for e in events}),
               # Images listed once the node was prepared or when the pod
               # ran, and gone at the end: {tag or id: CRI size}.
               "gone": {k: v for k, v in {**listed[0], **listed[1]}.items() if k not in listed[2]}}
    if d is not None:
        samples = d.scrape()
        figures["hurried_passes"] = metric(samples, "imagegc_hurried_space_passes_total")
        figures["room_before_pulls"] = metric(samples, "imagegc_room_before_pulls_total")
    phases.append(("watched", time.monotonic()))
    figures["phases_s"] = {name: round(at - phases[i][1], 1) for i, (name, at) in enumerate(phases[1:])}
    print(f"{tag}: {figures}; timeline {p.every_second()}")
    return figures, p, pods


def said(d):
    """imagegc's log lines about coming pulls, their sizes and its passes."""
    words = ("registry", "coming pull", "making room", "eviction line", "starting a cycle")
    try:
        return [line for line in d.logs().splitlines() if any(w in line for w in words)][-30:]
    except Exception as e:  # a failure message must not fail itself
        return [f"(no log: {e})"]


def check_no_eviction(cluster, tag, figures, pods, d):
    """No pod evicted, and room made BEFORE the pull: usage never past the
    eviction line (statvfs every 0.1 s; a pull's bytes stay until
    something removes them). Without the second, a collector that only
    reacts would pass whenever it removes within the eviction manager's
    10 s (measured: 0.5 s past the line, then the old images gone)."""
    assert figures["evicted"] == [], f"pods evicted: {figures['evicted']} ({figures}; {d.diagnostics()[-3000:]})"
    assert figures["peak"] <= EVICTION_USED, (
        f"the pull took usage to {figures['peak']}%, past the eviction line ({EVICTION_USED}%) for "
        f"{figures['past_line_s']}s: no room was made before it ({figures}; imagegc said: {said(d)}; "
        f"{d.diagnostics()[-4000:]})")
    assert "Evicted" not in figures["events"], figures
    assert w.pod_phase(cluster, f"{tag}-big")[0] == "Running"
    for pod in pods:
        assert w.pod_phase(cluster, pod)[0] == "Running", pod


def imagegc_case(cluster, tag, settings, shape, with_history=True, stuck=None):
    """The scenario with imagegc deployed with `settings`: no pod evicted,
    usage never past the line. Returns the figures."""
    d = deploy(cluster, tag, settings)
    try:
        figures, _, pods = big_pull(cluster, tag, d, shape, with_history=with_history, stuck=stuck)
        # For any failure message below: what imagegc said of the pull.
        figures["said"] = said(d)
        print(f"{tag}: imagegc said: {figures['said']}")
        record(f"{tag}: pod on big:2 created to Running", figures["to_running_s"])
        check_no_eviction(cluster, tag, figures, pods, d)
        return figures
    finally:
        d.delete()
        cleanup(cluster)


def test_a_pod_watching_imagegc_makes_room_before_the_pull(cluster):
    """(a): the room made for the pull the pod brings, before it."""
    figures = imagegc_case(cluster, "podroom", WITH_PODS, ISSUE)
    assert (figures["room_before_pulls"] or 0) >= 1, figures


# A registry name no resolver knows (the kubelet's pull of it fails at
# once); imagegc reaches it at the silent listener its endpoint names.
SILENT_REGISTRY = "silent.invalid"


class Forward:
    """Forwards TCP connections to `address`:`port` (the bridge's gateway,
    which pods reach) to 127.0.0.1:`to` (the registry), until stopped.
    With `to` None, a registry that takes connections and never answers."""

    def __init__(self, address, to):
        self.listener = socket.create_server((address, 0))
        self.port = self.listener.getsockname()[1]
        self.to = to
        self.connections = 0
        self.held = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.to is None:
                self.held.append(client)
                continue
            upstream = socket.create_connection(("127.0.0.1", self.to))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a, b):
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self):
        self.listener.close()
        for client in self.held:
            client.close()


def test_a_repository_never_seen_is_sized_by_its_registrys_manifest(cluster):
    """(d): no history of the repository; the manifest sizes the pull."""
    # The bridge (and its gateway address) exists once a pod ran on it:
    # the earlier cases' pods, or else one started here.
    forward = silent = None
    try:
        try:
            forward = Forward(GATEWAY, cluster.ports["registry"])
        except OSError:
            # No bridge yet: a pod brings it up.
            w.run_pod(cluster, "bridge", w.workload_image(cluster, "bridge"))
            w.wait_running(cluster, ["bridge"])
            forward = Forward(GATEWAY, cluster.ports["registry"])
        # A pod stuck on an image of a registry that never answers (imagegc's
        # lookup of it waits its 10 s) is created a second before the pod on
        # big:2: the lookup of big:2 must not wait behind it.
        silent = Forward(GATEWAY, None)
        # The component turns registry_manifests on (with the node's
        # certificates and egress); the ConfigMap names the endpoints.
        endpoints = {cluster.registry: f"http://{GATEWAY}:{forward.port}",
                     SILENT_REGISTRY: f"http://{GATEWAY}:{silent.port}"}
        settings = ({**BASE, "kubernetes.registry_endpoints": endpoints},
                    ["kubernetes", "kubelet-config", "registry-manifests"])
        figures = imagegc_case(cluster, "manifest", settings, ISSUE, with_history=False,
                               stuck=f"{SILENT_REGISTRY}/stuck/app:1")
        assert (figures["room_before_pulls"] or 0) >= 1, figures
        assert forward.connections >= 1, "imagegc never read the registry"
        assert silent.connections >= 1, "imagegc never asked the silent registry: the case shows nothing"
    finally:
        for f in (forward, silent):
            if f:
                f.stop()


def test_headroom_keeps_room_for_the_largest_recent_pull(cluster):
    """(b)"""
    imagegc_case(cluster, "headroom", WITH_HEADROOM, QUARTER)


def test_without_imagegc_the_big_pull_evicts(cluster):
    """(c) The control: the issue's node and pull, no imagegc."""
    events_before = {e["metadata"]["uid"] for e in w.eviction_events(cluster)}
    try:
        big = w.registry_image(cluster, "alone-big", 2, BIG * scale(cluster))
        pods, _, _, planned = prepare(cluster, "alone", ISSUE)
        assert planned < HIGH, f"usage {planned}% once prepared: the scenario starts below high ({HIGH}%)"
        p = Pull(cluster)
        try:
            _, phase, reason = p.pod("alone-big", big)
            evicted = wait_for("a pod evicted by the kubelet", lambda: w.evicted_pods(cluster), 60, 1)
        finally:
            p.stop()
        events = [e for e in w.eviction_events(cluster) if e["metadata"]["uid"] not in events_before]
        figures = {"prepared": planned, "peak": p.peak(), "big_pod": f"{phase} {reason or ''}".strip(),
                   "evicted": evicted, "events": sorted({e["reason"] for e in events})}
        print(f"alone: {figures}; timeline {p.every_second()}")
        assert p.peak() > EVICTION_USED, f"the pull did not cross the eviction line: {figures}"
        assert evicted and "Evicted" in figures["events"], figures
    finally:
        cleanup(cluster)


def test_the_slower_shape_is_caught_by_reacting_at_high(cluster):
    """Three ~70 MiB pulls, one pod after another, imagegc at 55/45 alone."""
    steps = [w.registry_image(cluster, f"step{i}", 1, STEP * scale(cluster)) for i in range(1, STEPS + 1)]
    d = deploy(cluster, "slow", REACTING)
    events_before = {e["metadata"]["uid"] for e in w.eviction_events(cluster)}
    try:
        pods, old, prepared, planned = prepare(cluster, "slow", ISSUE)
        wait_listed(d)
        w.images_once_settled(cluster)
        assert planned < HIGH, f"usage {planned}% once prepared: the scenario starts below high ({HIGH}%)"
        p = Pull(cluster)
        try:
            for i, image in enumerate(steps, 1):
                if i > 1:
                    p.watch(PACE)
                _, phase, reason = p.pod(f"slow-step{i}", image)
                assert phase == "Running", f"the pod on {image}: {phase} ({reason})"
            p.watch(WATCH)
        finally:
            p.stop()
        evicted = w.evicted_pods(cluster)
        events = [e for e in w.eviction_events(cluster) if e["metadata"]["uid"] not in events_before]
        images = cluster.images()
        figures = {"prepared": prepared, "peak": p.peak(), "past_line_s": p.past_line(),
                   "disk_pressure_s": p.pressure_seconds(), "old_removed": len([o for o in old if o not in images]),
                   "evicted": evicted}
        print(f"slow: {figures}; timeline {p.every_second()}")
        assert evicted == [], f"pods evicted: {evicted} ({figures})"
        assert not [e for e in events if e["reason"] == "Evicted"], events
        assert p.peak() <= EVICTION_USED, f"usage went past the eviction line: {figures}"
        for i in range(1, STEPS + 1):
            assert w.pod_phase(cluster, f"slow-step{i}")[0] == "Running"
    finally:
        d.delete()
        cleanup(cluster)
