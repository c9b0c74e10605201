#!/usr/bin/env python3
"""imagegc under systemd, installed and checked as an operator would.

Runs inside the node scripts/test-systemd.sh boots (a private systemd as
PID 1, Debian's containerd as containerd.service, the operator's checkout
at /src), as root, on Python's standard library alone. Each step says what
it does, runs the commands an operator would (README's own, read from
/src/README.md), and fails with what it expected and what it saw; the
unit's and containerd's journals are printed on a failure.

1. README's "With systemd" block installs and starts the unit: it is
   active once the daemon said READY=1 (Type=notify), a cycle is in the
   journal and the metrics answer on 127.0.0.1:9105.
2. The sandbox is in force on the running process: no capabilities, no
   new privileges, a seccomp filter, the filesystem read-only but
   /var/lib/imagegc, /root and /home hidden, its own /tmp, /dev, /proc
   view and host name; what systemd could not apply here is said.
3. `systemctl reload` applies a small gc.max_age: the image no container
   uses is removed, the one a running container uses and the sandbox
   image are kept; an invalid file is refused and the running
   configuration kept.
4. `systemctl restart`: the history in /var/lib/imagegc carries over; with
   metrics.listen on every address the unit still admits localhost only.
5. Kubernetes awareness by README's block (systemd/kubernetes.conf, the
   kubeconfig, `systemctl edit`): the API server at the address allowed is
   watched; the registry lookups (kubernetes.registry_manifests) are
   blocked by the unit's IP firewall until systemd/registry-manifests.conf
   is installed as README says, and then read the registry over TLS with
   the host's certificates.
6. `systemctl stop` ends it within seconds, exit status 0.
"""

import base64
import json
import os
import re
import shlex
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import oci  # noqa: E402  (deploy/tests/cluster/oci.py, copied beside this file)

SRC = "/src"
CONFIG = "/etc/imagegc/imagegc.toml"
STATE = "/var/lib/imagegc"
METRICS = "http://127.0.0.1:9105"
PAUSE = "imagegc.test/pause:1"
IN_USE = "imagegc.test/app:in-use"
UNUSED = "imagegc.test/app:unused"
# The test's other hosts, on the node's loopback interface under addresses
# that are not loopback ones (the unit's firewall tells them apart by
# address): documentation ranges, never routed.
API_ADDRESS = "198.51.100.7"
REGISTRY_ADDRESS = "203.0.113.5"
DNS_ADDRESS = "203.0.113.53"
REGISTRY = "registry.test"
NODE = "node-1"
# Two coming pulls: one of a registry found by its name (through DNS), one
# of a registry named by its address (a connection, no DNS).
COMING = f"{REGISTRY}/team/big:1"
COMING_BY_ADDRESS = f"{REGISTRY_ADDRESS}/team/big:1"
# The coming image's manifest: a config and two layers.
COMING_LAYERS = [40_000_000, 30_000_000]
COMING_CONFIG_SIZE = 1_000
# How long the daemon gets to stop: well under the unit's TimeoutStopSec
# (30 s), which would otherwise hide a daemon that ignores SIGTERM.
STOP_WITHIN = 10


class Failed(Exception):
    pass


def step(title):
    print(f"\n=== {title}", flush=True)


def ok(what):
    print(f"    ok: {what}", flush=True)


def expect(condition, message):
    if not condition:
        raise Failed(message)


def sh(*argv, timeout=120, env=None, cwd=None, quiet=False, stderr=True):
    """Runs argv (a shell line when one string), prints it, returns its
    output (stdout, and stderr after it unless told not to)."""
    shell = len(argv) == 1
    command = argv[0] if shell else [str(a) for a in argv]
    if not quiet:
        print(f"    $ {command if shell else shlex.join(command)}", flush=True)
    proc = subprocess.run(command, shell=shell, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL, env=None if env is None else {**os.environ, **env}, cwd=cwd)
    if proc.returncode != 0:
        raise Failed(f"{command!r} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return proc.stdout + proc.stderr if stderr else proc.stdout


def wait_for(what, probe, timeout, interval=0.2):
    """probe()'s first truthy value, within timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise Failed(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def show(*properties):
    out = sh("systemctl", "show", "imagegc", *[f"--property={p}" for p in properties], quiet=True)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def main_pid():
    pid = int(show("MainPID")["MainPID"])
    expect(pid > 0, "imagegc.service has no main process")
    return pid


# --- the journal ----------------------------------------------------------------

def cursor():
    """Where the journal ends now: what comes after is new."""
    last = sh("journalctl", "--no-pager", "-n", "1", "-o", "json", quiet=True).splitlines()
    return json.loads(last[-1])["__CURSOR"] if last else None


def entries(after=None, unit="imagegc"):
    """The unit's journal (its own lines and systemd's about it) after a
    cursor: each entry's fields, MESSAGE as text."""
    argv = ["journalctl", "--no-pager", "-u", unit, "-o", "json"]
    if after:
        argv.append(f"--after-cursor={after}")
    found = []
    for line in sh(*argv, quiet=True).splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE")
        if isinstance(message, list):  # not UTF-8: its bytes
            message = bytes(message).decode("utf-8", "replace")
        entry["MESSAGE"] = message or ""
        found.append(entry)
    return found


def messages(after=None, unit="imagegc"):
    return [entry["MESSAGE"] for entry in entries(after, unit)]


def wait_journal(what, pattern, after, timeout=60):
    """The first line of the unit's journal after `after` that matches."""
    regex = re.compile(pattern)
    return wait_for(f"{what} in `journalctl -u imagegc` (a line matching /{pattern}/)",
                    lambda: next((m for m in messages(after) if regex.search(m)), None), timeout, 0.5)


# --- metrics -------------------------------------------------------------------

def get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.status, response.read().decode()


def status_of(url):
    """The HTTP status url answers with, or why none."""
    try:
        return get(url)[0]
    except urllib.error.HTTPError as error:
        return error.code
    except (OSError, urllib.error.URLError) as error:
        return str(error)


def scrape():
    status, body = get(f"{METRICS}/metrics")
    expect(status == 200, f"GET {METRICS}/metrics answered {status}")
    samples = {}
    for line in body.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def scraped_when(condition):
    """A scrape whose samples meet condition, else None."""
    samples = scrape()
    return samples if condition(samples) else None


def metric(samples, name, **labels):
    """The sum of the samples of `name` whose labels include `labels`."""
    total, found = 0.0, False
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total, found = total + value, True
    return total if found else None


# --- the configuration, edited as an operator edits it ------------------------------

def edit_config(changes):
    """Sets `key = value` lines of /etc/imagegc/imagegc.toml; each key must
    be there once already (the shipped file names the keys the steps set)."""
    with open(CONFIG, encoding="utf-8") as f:
        text = f.read()
    for key, value in changes.items():
        text, n = re.subn(rf"^{re.escape(key)} = .*$", f"{key} = {value}", text, flags=re.M)
        expect(n == 1, f"{CONFIG} has {n} lines setting {key!r}: the shipped systemd/imagegc.toml changed")
    with open(CONFIG, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"    (edited {CONFIG}: {', '.join(f'{k} = {v}' for k, v in changes.items())})", flush=True)


# --- the runtime ----------------------------------------------------------------

def crictl(*args):
    return sh("crictl", *args, stderr=False).strip()


def image_ids():
    listing = json.loads(sh("crictl", "images", "-o", "json", quiet=True, stderr=False))
    return {tag: image["id"] for image in listing["images"] for tag in image.get("repoTags") or []}


def prepare_runtime(work):
    step("the runtime: containerd.service with a pause image, an image in use and one unused")
    sh("systemctl", "is-active", "containerd")
    wait_for("containerd's CRI to answer", lambda: subprocess.run(
        ["crictl", "version"], capture_output=True).returncode == 0, 30)
    busybox = oci.busybox_layer()
    for name, payload in [(PAUSE, b"pause"), (IN_USE, b"in use"), (UNUSED, b"unused")]:
        tar = os.path.join(work, name.rsplit("/", 1)[-1].replace(":", "-") + ".tar")
        oci.write_image(tar, name, [busybox, oci.layer([("/payload", payload, 0o644)])],
                        entrypoint=["/bin/sleep", "2147483647"])
        sh("ctr", "-n", "k8s.io", "images", "import", tar)
    pod = os.path.join(work, "pod.json")
    container = os.path.join(work, "container.json")
    with open(pod, "w", encoding="utf-8") as f:
        # The node's network: no CNI needed (TESTBED.md).
        json.dump({"metadata": {"name": "app", "namespace": "default", "uid": "app-1", "attempt": 0},
                   "log_directory": "/var/log/pods/app",
                   "linux": {"security_context": {"namespace_options": {"network": 2}}}}, f)
    with open(container, "w", encoding="utf-8") as f:
        json.dump({"metadata": {"name": "app", "attempt": 0}, "image": {"image": IN_USE},
                   "log_path": "app.log", "linux": {}}, f)
    pod_id = crictl("runp", pod)
    container_id = crictl("create", pod_id, container, pod)
    crictl("start", container_id)
    state = json.loads(sh("crictl", "inspect", container_id, quiet=True, stderr=False))["status"]["state"]
    expect(state == "CONTAINER_RUNNING", f"the container on {IN_USE} is {state}")
    ok(f"a running container uses {IN_USE}; no container uses {UNUSED}")
    # The node's addresses that are not loopback ones, for the test's API
    # server, registry and DNS server (and its metrics on every address).
    for address in (API_ADDRESS, REGISTRY_ADDRESS, DNS_ADDRESS):
        sh("ip", "address", "add", f"{address}/32", "dev", "lo")


# --- 1. README's install ------------------------------------------------------------

def readme_block(heading, index=0):
    """The index-th ```sh block under `heading` in README.md, as lines
    (comments after # kept: the shell drops them)."""
    with open(os.path.join(SRC, "README.md"), encoding="utf-8") as f:
        text = f.read()
    start = text.find(f"\n{heading}\n")
    expect(start >= 0, f"README.md has no section {heading!r}")
    end = text.find("\n## ", start + 1)
    blocks = re.findall(r"```sh\n(.*?)```", text[start:end], re.S)
    expect(len(blocks) > index, f"README.md's {heading!r} has no sh block number {index + 1}")
    return [line for line in blocks[index].splitlines() if line.strip()]


def install_by_readme():
    step("README's \"With systemd\": install and start")
    lines = readme_block("### With systemd")
    expect(lines[0].startswith("cargo build --release"),
           f"README's systemd block no longer starts with the build: {lines[0]!r}")
    expect(lines[-1].startswith("journalctl -u imagegc -f"),
           f"README's systemd block no longer ends with following the journal: {lines[-1]!r}")
    print(f"    (the binary is at {SRC}/target/release/imagegc already: built on the host; the journal is "
          "read below rather than followed)")
    started = cursor()
    for line in lines[1:-1]:
        sh(line, cwd=SRC)
    return started


def check_started(started):
    state = show("ActiveState", "SubState", "Type", "NotifyAccess", "ExecMainStartTimestampMonotonic",
                 "ActiveEnterTimestampMonotonic", "Result")
    expect(state["ActiveState"] == "active" and state["SubState"] == "running",
           f"imagegc.service is {state['ActiveState']}/{state['SubState']} after `systemctl enable --now`")
    expect(state["Type"] == "notify" and state["NotifyAccess"] == "main",
           f"imagegc.service is Type={state['Type']} NotifyAccess={state['NotifyAccess']}, not notify/main")
    # Type=notify: systemd counts it started only once READY=1 came through
    # the sandbox; until then the start job waits (and fails after
    # TimeoutStartSec).
    ready_ms = (int(state["ActiveEnterTimestampMonotonic"]) - int(state["ExecMainStartTimestampMonotonic"])) / 1000
    sh("systemctl", "is-active", "imagegc")
    ok(f"active (running) after READY=1, {ready_ms:.0f} ms after the process started")
    # The listener is bound before READY=1: it answers at once.
    status, body = get(f"{METRICS}/healthz")
    expect(status == 200, f"GET /healthz answered {status}: {body}")
    line = wait_journal("a cycle", r"cycle finished", started)
    ok(f"the journal shows a cycle: {line.strip()[:160]}")
    samples = wait_for("imagegc_cycles_total to count a cycle",
                       lambda: scraped_when(lambda s: (metric(s, "imagegc_cycles_total") or 0) >= 1), 30)
    expect(metric(samples, "imagegc_runtime_up") == 1, "imagegc_runtime_up is not 1")
    wait_for("/readyz to answer 200 (the runtime reached)", lambda: status_of(f"{METRICS}/readyz") == 200, 30)
    ok(f"{METRICS} answers: /healthz at once, /metrics with imagegc_cycles_total "
       f"{metric(samples, 'imagegc_cycles_total'):.0f} and imagegc_runtime_up 1, /readyz 200")


# --- 2. the sandbox --------------------------------------------------------------------

def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def proc_status(pid):
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        return dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)


def mounts(pid):
    """What the process sees mounted: mount point -> (per-mount options,
    filesystem type, super options, the mounted directory of its
    filesystem). A mount hidden under another (mounted over it, or over a
    directory above it) is left out: no path reaches it."""
    found = {}
    with open(f"/proc/{pid}/mountinfo", encoding="utf-8") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fields = left.split()
            fstype, _, super_options = right.split()
            found[fields[0]] = (fields[1], fields[4], (fields[5].split(","), fstype, super_options.split(","),
                                                       fields[3]))

    def under(path, top):
        return top == "/" and path != "/" or path.startswith(top + "/")

    def visible(mount_id, through=None):
        """Whether a path reaches mount_id (to its mount `through`, when
        given: one mounted on it)."""
        parent, point, _ = found[mount_id]
        for other, (other_parent, other_point, _) in found.items():
            if other in (mount_id, through):
                continue
            # Mounted over it, or over a directory on its path.
            if (other_parent == mount_id and other_point == point) or \
                    (other_parent == parent and under(point, other_point)):
                return False
        return parent not in found or visible(parent, mount_id)

    return {point: view for mount_id, (_, point, view) in found.items() if visible(mount_id)}


def in_its_mounts(pid, *argv):
    """argv run in the daemon's mount namespace (its view of the files)."""
    return subprocess.run(["nsenter", f"--target={pid}", "--mount", "--", *argv], capture_output=True,
                          text=True, timeout=30)


def check_sandbox():
    step("the sandbox, on the running process")
    props = show("NoNewPrivileges", "CapabilityBoundingSet", "AmbientCapabilities", "ProtectSystem",
                 "ReadWritePaths", "ReadOnlyPaths", "StateDirectory", "ProtectHome", "PrivateTmp", "PrivateDevices",
                 "ProtectProc", "ProcSubset", "ProtectHostname", "IPAddressDeny", "IPAddressAllow",
                 "RestrictAddressFamilies", "SystemCallFilter", "MemoryDenyWriteExecute", "MemoryMax")
    for key, value in props.items():
        shown = value if len(value) < 100 else value[:100] + "..."
        print(f"    systemctl show: {key}={shown}")
    pid = main_pid()
    status = proc_status(pid)
    expect(status["Uid"].split()[0] == "0", f"imagegc runs as uid {status['Uid']}, the unit says root")
    for cap in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        expect(int(status[cap], 16) == 0, f"imagegc's {cap} is {status[cap]}: CapabilityBoundingSet= is empty")
    ok("uid 0 with no capabilities at all (CapPrm, CapEff, CapBnd, CapAmb 0)")
    expect(status["NoNewPrivs"] == "1", f"imagegc's NoNewPrivs is {status['NoNewPrivs']}")
    ok("NoNewPrivileges (NoNewPrivs: 1)")
    expect(status["Seccomp"] == "2" and int(status.get("Seccomp_filters", "1")) >= 1,
           f"imagegc has no seccomp filter (Seccomp: {status['Seccomp']})")
    ok(f"seccomp filters in force (Seccomp: 2, {status.get('Seccomp_filters', '?')} filters: SystemCallFilter, "
       "RestrictAddressFamilies, RestrictNamespaces, MemoryDenyWriteExecute, ...)")

    table = mounts(pid)
    # Writable in its view: the state directory, its private /tmp and
    # /var/tmp, and the API file systems systemd leaves as they are
    # (ProtectSystem=strict's exceptions; /proc's tunables are read-only).
    allowed = {STATE, "/tmp", "/var/tmp", "/proc", "/dev/pts", "/dev/shm", "/dev/mqueue", "/dev/hugepages"}
    # (/run/user, /home and /root: inaccessible, empty, ProtectHome.)
    hidden = ("/run/user", "/home", "/root")
    writable = sorted(path for path, (options, *_) in table.items()
                      if "rw" in options and path not in allowed and not path.startswith(hidden))
    expect(not writable, f"writable in imagegc's view besides {STATE}: {', '.join(writable)} (ProtectSystem=strict, "
           "ReadOnlyPaths=/run)")
    expect("ro" in table["/"][0] and STATE in table and "rw" in table[STATE][0],
           f"imagegc's / is {table['/'][0]} and {STATE} {table.get(STATE)}")
    for private in ("/tmp", "/var/tmp"):
        expect(private in table and "systemd-private-" in table[private][3],
               f"imagegc's {private} is not its own (PrivateTmp): {table.get(private)}")
    for path in ("/etc/imagegc", "/usr/local/bin", "/var/lib/containerd", "/run", "/run/containerd", "/run/lock"):
        done = in_its_mounts(pid, "sh", "-c", f"echo x > {path}/.imagegc-write-probe")
        expect(done.returncode != 0 and "Read-only file system" in done.stderr,
               f"{path} is writable in imagegc's view: {done.stderr.strip() or 'the write succeeded'}")
    done = in_its_mounts(pid, "sh", "-c", f"echo x > {STATE}/.write-probe && rm {STATE}/.write-probe")
    expect(done.returncode == 0, f"{STATE} is not writable in imagegc's view: {done.stderr}")
    ok(f"every mount read-only but {STATE}, its own /tmp and /var/tmp, and /proc, /dev/shm, /dev/pts, "
       "/dev/mqueue, /dev/hugepages; /etc/imagegc, /usr/local/bin, /var/lib/containerd, /run, /run/containerd, "
       "/run/lock refuse writes (Read-only file system)")
    mode = os.stat(STATE).st_mode & 0o777
    expect(mode == 0o700, f"{STATE} has mode {mode:o}, the unit says StateDirectoryMode=0700")
    ok(f"{STATE} is mode 0700")
    for home in ("/root", "/home"):
        marker = f"{home}/.imagegc-test-marker"
        with open(marker, "w", encoding="utf-8"):
            pass
        seen = in_its_mounts(pid, "test", "-e", marker).returncode == 0
        os.unlink(marker)
        expect(not seen, f"{marker} is visible in imagegc's view (ProtectHome=yes)")
    ok("/root and /home are empty and inaccessible in its view (ProtectHome)")
    dev = in_its_mounts(pid, "ls", "/dev")
    expect(table["/dev"][1] == "tmpfs" and "loop-control" not in dev.stdout and "null" in dev.stdout,
           f"imagegc sees the host's devices: /dev is {table['/dev'][1]}: {dev.stdout.split()}")
    ok("a private /dev with the pseudo devices only (PrivateDevices)")
    proc_options = table["/proc"][2]
    expect("hidepid=invisible" in proc_options and "subset=pid" in proc_options,
           f"imagegc's /proc is mounted {','.join(proc_options)}: ProtectProc=invisible, ProcSubset=pid")
    ok("/proc shows its own processes only (hidepid=invisible, subset=pid)")
    expect(os.readlink(f"/proc/{pid}/ns/uts") != os.readlink("/proc/1/ns/uts"),
           "imagegc shares PID 1's UTS namespace (ProtectHostname)")
    ok("its own UTS namespace (ProtectHostname)")

    # What this systemd cannot apply, said rather than claimed.
    cgroup = read(f"/proc/{pid}/cgroup").strip().split("::", 1)[-1]
    memory_max = f"/sys/fs/cgroup{cgroup}/memory.max"
    if os.path.exists(memory_max):
        limit = read(memory_max).strip()
        expect(limit == props["MemoryMax"], f"{memory_max} is {limit}, the unit says MemoryMax={props['MemoryMax']}")
        ok(f"MemoryMax in force: {memory_max} = {limit}")
    else:
        controllers = read("/sys/fs/cgroup/cgroup.controllers").split()
        print(f"    NOT VERIFIED here: MemoryMax={props['MemoryMax']}: this systemd's cgroup v2 hierarchy has no "
              f"memory controller (controllers: {' '.join(controllers) or 'none'}; a cgroup v1 hybrid host keeps "
              "memory on v1), so no limit applies")
    # systemd's warnings about the unit (a directive it does not know or
    # cannot apply), since it was installed.
    warnings = [e["MESSAGE"] for e in entries() if e.get("_PID") == "1" and int(e.get("PRIORITY", 6)) <= 4]
    expect(not warnings, "systemd warned about the unit:\n" + "\n".join(warnings))
    ok("systemd logged no warning about the unit (the IP firewall is checked by what it blocks: steps 4 and 5)")


# --- 3. reload ---------------------------------------------------------------------------

def check_reload():
    step("systemctl reload: a small gc.max_age removes the unused image, keeps the used ones")
    ids = image_ids()
    expect({PAUSE, IN_USE, UNUSED} <= ids.keys(), f"the runtime lists {sorted(ids)}")
    edit_config({"interval": '"5s"', "usage_poll_interval": '"5s"', "min_age": '"5s"', "max_age": '"20s"'})
    sh(f"imagegc check-config --config {CONFIG} >/dev/null")
    mark = cursor()
    sh("systemctl", "reload", "imagegc")
    wait_journal("the reload", r"configuration reloaded; it applies from the next cycle", mark, timeout=30)
    ok("the daemon reread the file")
    removed = wait_journal(f"the removal of {UNUSED}", rf"removed image.*{re.escape(UNUSED)}", mark, timeout=120)
    expect("reason=age" in removed or "reason=\"age\"" in removed, f"removed for another reason: {removed}")
    ok(f"removed by age: {removed.strip()[:200]}")
    # One more cycle after it: nothing else goes.
    after_removal = cursor()
    wait_journal("a cycle after the removal", r"cycle finished", after_removal, timeout=30)
    ids = image_ids()
    expect(UNUSED not in ids, f"{UNUSED} is still listed")
    expect(IN_USE in ids and PAUSE in ids, f"an image in use went: the runtime lists {sorted(ids)}")
    ok(f"{IN_USE} (a running container's) and {PAUSE} (the pods' sandbox) are kept")
    history = json.loads(sh(f"imagegc history --config {CONFIG} --output json", stderr=False))
    expect([e for e in history if UNUSED in e.get("tags", [])],
           f"`imagegc history` does not list the removal of {UNUSED}: {history}")
    ok("`imagegc history` lists the removal")

    step("systemctl reload of an invalid file: refused, the running configuration kept")
    with open(CONFIG, encoding="utf-8") as f:
        valid = f.read()
    edit_config({"low_threshold_percent": "90"})
    mark = cursor()
    sh("systemctl", "reload", "imagegc")
    refused = wait_journal("the refusal", r"configuration reload rejected; keeping the running configuration",
                           mark, timeout=30)
    ok(f"refused: {refused.strip()[:200]}")
    wait_journal("a cycle after the refusal (interval 5s still in force)", r"cycle finished", mark, timeout=30)
    sh("systemctl", "is-active", "imagegc")
    ok("still active, cycling every 5 s as before")
    with open(CONFIG, "w", encoding="utf-8") as f:
        f.write(valid)
    print(f"    (restored {CONFIG})")


# --- 4. restart ------------------------------------------------------------------------

def first_seen():
    """image id -> first seen (unix ms), from the state file
    (`tail -n +3 records.state`)."""
    out = sh(f"tail -n +3 {STATE}/records.state", quiet=True)
    return {record[0]: record[1] for record in map(json.loads, out.splitlines())}


def answer(url, seconds=3):
    """'answered', 'timed out' (its packets dropped) or why else not."""
    try:
        get(url, timeout=seconds)
        return "answered"
    except urllib.error.HTTPError:
        return "answered"
    except (TimeoutError, urllib.error.URLError) as error:
        reason = getattr(error, "reason", error)
        return "timed out" if isinstance(reason, TimeoutError) or "timed out" in str(reason) else str(reason)


def check_restart():
    step("systemctl restart: the history in /var/lib/imagegc carries over")
    in_use_id = image_ids()[IN_USE]
    before = wait_for(f"the state file to record {IN_USE}", lambda: first_seen().get(in_use_id), 30)
    # Every address, to see what the unit admits (step 5 too).
    edit_config({"listen": '"0.0.0.0:9105"'})
    mark = cursor()
    sh("systemctl", "restart", "imagegc")
    sh("systemctl", "is-active", "imagegc")
    loaded = wait_journal("the history loaded", r"loaded image history|no state file|corrupt|unreadable", mark)
    expect("loaded image history" in loaded, f"the restarted daemon did not read its state: {loaded}")
    wait_journal("a cycle after the restart", r"cycle finished", mark)
    after = first_seen().get(in_use_id)
    expect(after == before, f"{IN_USE} first seen at {before} before the restart, {after} after")
    ok(f"{loaded[loaded.index('loaded'):].strip()}; {IN_USE} first seen at {before} ms before and after")
    history = json.loads(sh(f"imagegc history --config {CONFIG} --output json", stderr=False))
    expect([e for e in history if UNUSED in e.get("tags", [])], "the removal journal lost the removal")
    ok("the removal journal carries over")

    step("the unit admits localhost only (metrics.listen on every address)")
    got = answer(f"{METRICS}/healthz")
    expect(got == "answered", f"{METRICS}/healthz: {got}")
    ok(f"{METRICS} answers")
    other = f"http://{API_ADDRESS}:9105/healthz"
    got = answer(other)
    expect(got == "timed out", f"{other}: {got}, where the unit's firewall should drop it")
    ok(f"{other} (the node's own address, not loopback) gets no answer: IPAddressDeny=any in force")


# --- 5. Kubernetes and the registry -------------------------------------------------------

def make_certificates(work):
    """A CA, and one server certificate for the API server's address and
    the registry's name."""
    ca_key, ca, key, csr, cert = (os.path.join(work, n) for n in ("ca.key", "ca.crt", "tls.key", "tls.csr", "tls.crt"))
    ext = os.path.join(work, "ext.cnf")
    with open(ext, "w", encoding="utf-8") as f:
        f.write(f"subjectAltName=DNS:{REGISTRY},IP:{REGISTRY_ADDRESS},IP:{API_ADDRESS}\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    sh("openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "2",
       "-subj", "/CN=imagegc test CA", quiet=True)
    sh("openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={REGISTRY}", quiet=True)
    sh("openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
       "-days", "2", "-extfile", ext, quiet=True)
    return ca, cert, key


class Server:
    """An HTTPS server on ADDRESS:PORT in a thread; `requests` records
    (method, path) of each request."""

    def __init__(self, address, port, cert, key, respond):
        self.requests = []
        self.stopping = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                server.requests.append((self.command, self.path))
                respond(self, server)

            do_POST = do_PATCH = do_GET

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer((address, port), Handler)
        self.httpd.daemon_threads = True
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self):
        self.stopping.set()
        self.httpd.shutdown()


def reply(handler, status, body, content_type="application/json", headers=()):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(data)))
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(data)


def api_server(handler, server):
    """An API server knowing Node node-1 and one pod bound to it, whose
    image the node lacks (a coming pull). A watch is held open, quiet."""
    path, _, query = handler.path.partition("?")
    if handler.command == "GET" and path == f"/api/v1/nodes/{NODE}":
        return reply(handler, 200, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    if handler.command == "GET" and path == "/api/v1/pods" and f"spec.nodeName%3D{NODE}" in query:
        if "watch=true" in query or "watch=1" in query:
            handler.send_response(200)
            handler.send_header("Content-Type", "application/json")
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            handler.wfile.flush()
            server.stopping.wait(290)
            try:
                handler.wfile.write(b"0\r\n\r\n")
            except OSError:
                pass
            return None
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "big", "namespace": "default", "uid": "big-1", "resourceVersion": "1"},
               "spec": {"nodeName": NODE, "containers": [{"name": "big", "image": COMING},
                                                         {"name": "by-address", "image": COMING_BY_ADDRESS}]},
               "status": {"phase": "Pending"}}
        return reply(handler, 200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"},
                                    "items": [pod]})
    if handler.command in ("POST", "PATCH") and "/events" in path:
        length = int(handler.headers.get("Content-Length") or 0)
        return reply(handler, 201 if handler.command == "POST" else 200, handler.rfile.read(length))
    return reply(handler, 404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                "reason": "NotFound", "code": 404, "message": f"{path} not found"})


def coming_manifest():
    return json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "size": COMING_CONFIG_SIZE,
                   "digest": "sha256:" + "1" * 64},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "size": size,
                    "digest": "sha256:" + str(i) * 64} for i, size in enumerate(COMING_LAYERS, start=2)],
    }).encode()


def registry(handler, server):
    if handler.command == "GET" and handler.path == "/v2/team/big/manifests/1":
        return reply(handler, 200, coming_manifest(), "application/vnd.oci.image.manifest.v1+json")
    return reply(handler, 404, {"errors": [{"code": "MANIFEST_UNKNOWN", "message": handler.path}]})


class Dns:
    """A DNS server on ADDRESS:53 (UDP) that knows one name's IPv4
    address; `queries` records each name asked."""

    def __init__(self, address, name, ip):
        self.queries = []
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((address, 53))
        self.name, self.ip = name, socket.inet_aton(ip)
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self):
        while True:
            try:
                query, peer = self.sock.recvfrom(512)
            except OSError:
                return
            labels, at = [], 12
            while at < len(query) and query[at]:
                labels.append(query[at + 1:at + 1 + query[at]].decode("ascii", "replace"))
                at += 1 + query[at]
            qtype = struct.unpack(">H", query[at + 1:at + 3])[0]
            question = query[12:at + 5]
            name = ".".join(labels).lower()
            self.queries.append(name)
            known = name == self.name
            answers = b""
            if known and qtype == 1:
                answers = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + self.ip
            # A response, recursion available; NXDOMAIN for any other name.
            flags = 0x8180 if known else 0x8183
            header = struct.pack(">HHHHHH", struct.unpack(">H", query[:2])[0], flags, 1, 1 if answers else 0, 0, 0)
            self.sock.sendto(header + question + answers, peer)

    def stop(self):
        self.sock.close()


def editor(work, content):
    """A SYSTEMD_EDITOR for `systemctl edit`: puts `content` where the file
    it opens says to write."""
    path = os.path.join(work, "editor")
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"""#!/usr/bin/python3
import sys
marker = "### Anything between here and the comment below will become the new contents of the file"
content = {content!r}
text = open(sys.argv[-1]).read()
text = text.replace(marker + "\\n", marker + "\\n" + content, 1) if marker in text else content
open(sys.argv[-1], "w").write(text)
""")
    os.chmod(path, 0o755)
    return path


def check_kubernetes_and_registry(work):
    step("Kubernetes awareness under the unit, as README installs it")
    # The node's DNS server, not on loopback (as on most hosts without
    # systemd-resolved): the registry's name is resolved through it.
    with open("/etc/resolv.conf", "w", encoding="utf-8") as f:
        f.write(f"nameserver {DNS_ADDRESS}\n")
    dns = Dns(DNS_ADDRESS, REGISTRY, REGISTRY_ADDRESS)
    ca, cert, key = make_certificates(work)
    # The registry's CA in the host's certificates, as a private registry's
    # is added on Debian.
    sh("install", "-m", "0644", ca, "/usr/local/share/ca-certificates/imagegc-test-ca.crt")
    sh("update-ca-certificates")
    api = Server(API_ADDRESS, 6443, cert, key, api_server)
    reg = Server(REGISTRY_ADDRESS, 443, cert, key, registry)
    with open(ca, "rb") as f:
        ca_data = base64.b64encode(f.read()).decode()
    # The operator's kubeconfig, in the checkout where README's block runs.
    with open(os.path.join(SRC, "kubeconfig"), "w", encoding="utf-8") as f:
        json.dump({"apiVersion": "v1", "kind": "Config", "current-context": "node",
                   "clusters": [{"name": "test", "cluster": {"server": f"https://{API_ADDRESS}:6443",
                                                             "certificate-authority-data": ca_data}}],
                   "users": [{"name": "imagegc", "user": {"token": "imagegc-test-token"}}],
                   "contexts": [{"name": "node", "context": {"cluster": "test", "user": "imagegc"}}]}, f)
    override = f"[Service]\nIPAddressAllow={API_ADDRESS}\nEnvironment=NODE_NAME={NODE}\n"
    print(f"    (`systemctl edit imagegc` writes: {override.strip()!r})")
    for line in readme_block("### With systemd", 1):
        if line.startswith("systemctl edit"):
            # It edits on a terminal only: one made by script(1).
            line = f"script --quiet --return --command {shlex.quote(line)} /dev/null"
        sh(line, cwd=SRC, env={"SYSTEMD_EDITOR": editor(work, override)})
    props = show("IPAddressAllow", "Environment", "DropInPaths")
    expect(API_ADDRESS in props["IPAddressAllow"], f"IPAddressAllow={props['IPAddressAllow']} lacks {API_ADDRESS}")
    expect(f"NODE_NAME={NODE}" in props["Environment"], f"Environment={props['Environment']} lacks NODE_NAME")
    ok(f"drop-ins {props['DropInPaths']}: IPAddressAllow={props['IPAddressAllow']}, {props['Environment']}")

    # [kubernetes] as the shipped file's comment says, with the registry
    # lookups on.
    with open(CONFIG, encoding="utf-8") as f:
        text = f.read()
    for line in ("# [kubernetes]", "# enabled = true", '# kubeconfig = "/etc/imagegc/kubeconfig"'):
        expect(f"\n{line}\n" in text, f"{CONFIG} lacks the line {line!r}: the shipped systemd/imagegc.toml changed")
        text = text.replace(f"\n{line}\n", f"\n{line[2:]}\n", 1)
    text += "registry_manifests = true\n"
    with open(CONFIG, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"    (edited {CONFIG}: [kubernetes] enabled, kubeconfig, registry_manifests = true)")
    sh(f"imagegc check-config --config {CONFIG} >/dev/null")
    mark = cursor()
    sh("systemctl", "reload", "imagegc")
    line = wait_journal("the reload naming [kubernetes] as needing a restart", r"take effect only after a restart",
                        mark, timeout=30)
    expect("kubernetes" in line, f"the reload's warning does not name kubernetes: {line}")
    ok("a reload says [kubernetes] needs a restart")
    mark = cursor()
    sh("systemctl", "restart", "imagegc")
    samples = wait_for("imagegc_kubernetes_pods_watch_up 1 and imagegc_kubernetes_node_found 1",
                       lambda: scraped_when(lambda s: metric(s, "imagegc_kubernetes_pods_watch_up") == 1
                                            and metric(s, "imagegc_kubernetes_node_found") == 1), 60)
    try:
        wait_for("a watch", lambda: any(p.startswith("/api/v1/pods") and "watch=true" in p
                                        for _, p in api.requests), 30)
    except Failed:
        raise Failed(f"the API server saw no watch of the pods within 30 s: {api.requests}") from None
    ok(f"the API server at {API_ADDRESS} (allowed by the edit) lists and watches this node's pods; "
       f"imagegc_kubernetes_pods {metric(samples, 'imagegc_kubernetes_pods'):.0f}, Node {NODE} found (NODE_NAME)")

    step("registry lookups under the unit as it ships: blocked")
    for image, how in ((COMING, "its name not resolved: the DNS server is not on loopback"),
                       (COMING_BY_ADDRESS, "no connection: its packets are dropped (the connection times out)")):
        failed = wait_journal(f"the lookup of {image} to fail",
                              rf"could not size a coming pull.* image={re.escape(image)} ", mark, timeout=60)
        ok(f"{image}: {how}: ...{failed[failed.index(' error='):][:140]}")
    expect(not reg.requests and REGISTRY not in dns.queries,
           f"the registry was reached: DNS queries {dns.queries}, requests {reg.requests}")
    ok(f"neither the DNS server at {DNS_ADDRESS} nor the registry at {REGISTRY_ADDRESS} saw a packet")

    step("registry lookups with systemd/registry-manifests.conf, as README installs it")
    mark = cursor()
    for line in readme_block("### With systemd", 2):
        sh(line, cwd=SRC)
    expected = COMING_CONFIG_SIZE + sum(COMING_LAYERS) + len(coming_manifest())
    props = show("IPAddressAllow", "DropInPaths")
    print(f"    (IPAddressAllow={props['IPAddressAllow']})")
    for image in (COMING, COMING_BY_ADDRESS):
        sized = wait_journal(f"the lookup of {image}",
                             rf"coming pull sized by its registry's manifest image={re.escape(image)} ", mark,
                             timeout=60)
        expect(f"size_bytes={expected}" in sized, f"sized {sized}, expected size_bytes={expected}")
        ok(f"{image}: {sized[sized.index('size_bytes='):].strip()}")
    expect(REGISTRY in dns.queries, f"the DNS server was asked {dns.queries}")
    expect(("GET", "/v2/team/big/manifests/1") in reg.requests, f"the registry saw {reg.requests}")
    ok(f"{REGISTRY} resolved by the node's DNS server, both read over TLS with the host's certificates (the CA "
       "update-ca-certificates added)")
    answered = f"http://{API_ADDRESS}:9105/healthz"
    got = answer(answered)
    expect(got == "answered", f"{answered}: {got}")
    ok(f"as README says, the drop-in admits every address too: {answered} answers (metrics.listen 0.0.0.0)")
    api.stop()
    reg.stop()
    dns.stop()


# --- 6. stop -------------------------------------------------------------------------------

def check_stop():
    step("systemctl stop: within seconds, exit status 0")
    mark = cursor()
    started = time.monotonic()
    sh("systemctl", "stop", "imagegc", timeout=60)
    took = time.monotonic() - started
    state = show("ActiveState", "Result", "ExecMainCode", "ExecMainStatus")
    expect(took < STOP_WITHIN, f"`systemctl stop` took {took:.1f} s (TimeoutStopSec=30s)")
    expect(state["ActiveState"] == "inactive" and state["Result"] == "success",
           f"after stop: {state}")
    # ExecMainCode 1: CLD_EXITED (not killed by a signal).
    expect(state["ExecMainCode"] == "1" and state["ExecMainStatus"] == "0",
           f"imagegc did not exit 0 on SIGTERM: {state}")
    wait_journal("the state saved", r"shutting down: saving state", mark, timeout=10)
    ok(f"stopped in {took:.2f} s, exit status 0, state saved")


def diagnose():
    for argv in (["systemctl", "status", "imagegc", "--no-pager", "-l"],
                 ["journalctl", "--no-pager", "-u", "imagegc", "-n", "80"],
                 ["journalctl", "--no-pager", "-u", "containerd", "-n", "20"],
                 ["systemctl", "cat", "imagegc", "--no-pager"]):
        print(f"\n--- {shlex.join(argv)}", flush=True)
        print(subprocess.run(argv, capture_output=True, text=True).stdout, flush=True)


def main():
    started = time.monotonic()
    os.chdir("/")
    with tempfile.TemporaryDirectory() as work:
        try:
            prepare_runtime(work)
            check_started(install_by_readme())
            check_sandbox()
            check_reload()
            check_restart()
            check_kubernetes_and_registry(work)
            check_stop()
        except (Failed, subprocess.TimeoutExpired) as error:
            print(f"\nFAILED: {error}", flush=True)
            diagnose()
            return 1
        except Exception:
            traceback.print_exc()
            diagnose()
            return 1
    print(f"\nimagegc under systemd: every check passed in {time.monotonic() - started:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
