#!/usr/bin/env python3
"""Starts `imagegc run` the way the DaemonSet does and checks what the
kubelet and Prometheus will see.

The daemon runs as uid 0 with an empty capability bounding set and
no_new_privs. With --rootfs it runs chrooted in the container image's
extracted filesystem, in its own mount namespace, with the root mounted
read-only, the configuration and the runtime's socket directory mounted
read-only and the state directory writable, as in deploy/daemonset.yaml.

No runtime answers on the socket, so the daemon must: serve /healthz (200)
and /readyz (503) and /metrics, refuse POST, stop on SIGTERM with exit code
0 well within the pod's grace period, and leave its state file behind.

Run by deploy/tests/test_daemon.py and test_image.py (smoke()), or alone:
  smoke_daemon.py --binary PATH --config TOML [--scrape-out FILE]
  smoke_daemon.py --rootfs DIR  --config TOML [--scrape-out FILE]
"""

import argparse
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

LISTEN = ("127.0.0.1", 9105)  # the default metrics.listen
SOCKET_DIR = "/run/containerd"
STATE_DIR = "/var/lib/imagegc"
CONFIG_DIR = "/etc/imagegc"
STOP_DEADLINE_SECONDS = 25  # below terminationGracePeriodSeconds (30)

libc = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 32, 4096, 16384, 1 << 18
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38


def check(call, what):
    if call != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(src, dst, fstype, flags):
    check(libc.mount(src and src.encode(), dst.encode(), fstype and fstype.encode(), flags, None), f"mount {dst}")


def bind(src, dst, read_only):
    mount(src, dst, None, MS_BIND)
    if read_only:
        mount(None, dst, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def drop_privileges():
    """Empty bounding set and no_new_privs: as uid 0, the exec'd daemon then
    has no capabilities at all (like capabilities.drop: [ALL])."""
    cap = 0
    while libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) == 0:
        cap += 1
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def enter_rootfs(rootfs, config_dir, socket_dir, state_dir):
    check(libc.unshare(CLONE_NEWNS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    bind(rootfs, rootfs, read_only=False)
    for d in (CONFIG_DIR, SOCKET_DIR, STATE_DIR, "/proc"):
        os.makedirs(rootfs + d, exist_ok=True)
    bind(config_dir, rootfs + CONFIG_DIR, read_only=True)
    bind(socket_dir, rootfs + SOCKET_DIR, read_only=True)
    bind(state_dir, rootfs + STATE_DIR, read_only=False)
    mount("proc", rootfs + "/proc", "proc", MS_NOSUID | MS_NODEV)
    mount(None, rootfs, None, MS_BIND | MS_REMOUNT | MS_RDONLY)
    os.chroot(rootfs)
    os.chdir("/")


def get(path, method="GET"):
    req = urllib.request.Request(f"http://{LISTEN[0]}:{LISTEN[1]}{path}", method=method)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def smoke(config, binary=None, rootfs=None, scrape_out=None):
    """Runs the daemon from BINARY, or as /imagegc chrooted in ROOTFS, with
    CONFIG; returns the problems found (none: all is as the kubelet and
    Prometheus need it). Writes the /metrics scrape to SCRAPE_OUT."""
    if (binary is None) == (rootfs is None):
        raise ValueError("give binary or rootfs")
    with socket.socket() as s:
        if s.connect_ex(LISTEN) == 0:
            return [f"{LISTEN[0]}:{LISTEN[1]} is already in use; stop what listens there"]

    work = tempfile.mkdtemp(prefix="imagegc-smoke-")
    problems = []
    proc = None
    try:
        config_dir = os.path.join(work, "config")
        socket_dir = os.path.join(work, "run")
        state_dir = os.path.join(work, "state")
        for d in (config_dir, socket_dir, state_dir):
            os.makedirs(d)
        os.chmod(state_dir, 0o755)
        with open(config, encoding="utf-8") as f:
            text = f.read()
        # Same configuration, but on loopback (this machine's own port), and
        # without the rootfs, measuring the temporary state directory.
        fs_path = STATE_DIR if rootfs else state_dir
        lines = []
        for line in text.splitlines():
            if line.startswith("listen ="):
                line = f'listen = "{LISTEN[0]}:{LISTEN[1]}"'
            elif line.startswith("image_fs_path =") and line != 'image_fs_path = ""':
                line = f'image_fs_path = "{fs_path}"'
            lines.append(line)
        with open(os.path.join(config_dir, "imagegc.toml"), "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

        if rootfs:
            exe = "/imagegc"
            argv = [exe, "run", "--config", f"{CONFIG_DIR}/imagegc.toml",
                    "--runtime-endpoint", f"unix://{SOCKET_DIR}/containerd.sock",
                    "--state-dir", STATE_DIR, "--log-format", "json"]

            def setup():
                enter_rootfs(os.path.abspath(rootfs), config_dir, socket_dir, state_dir)
                drop_privileges()
        else:
            exe = os.path.abspath(binary)
            argv = [exe, "run", "--config", os.path.join(config_dir, "imagegc.toml"),
                    "--runtime-endpoint", f"unix://{socket_dir}/containerd.sock",
                    "--state-dir", state_dir, "--log-format", "json"]
            setup = drop_privileges

        log_path = os.path.join(work, "daemon.log")
        log = open(log_path, "wb")
        proc = subprocess.Popen(argv, executable=exe, preexec_fn=setup, stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, env={"NODE_NAME": "smoke-node"})

        status = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status, _ = get("/healthz")
                break
            except OSError:
                time.sleep(0.1)
        if status is None:
            problems.append(f"the daemon did not answer on {LISTEN[0]}:{LISTEN[1]} (exit code {proc.poll()})")
        else:
            with open(f"/proc/{proc.pid}/status") as f:
                caps = {k: v.strip() for k, v in (l.split(":", 1) for l in f) if k.startswith("Cap")}
            if any(int(caps[k], 16) for k in ("CapEff", "CapPrm", "CapBnd")):
                problems.append(f"the daemon has capabilities: {caps}")
            time.sleep(1)
            checks = [("/healthz", "GET", 200), ("/readyz", "GET", 503), ("/metrics", "GET", 200),
                      ("/metrics", "POST", 405)]
            for path, method, want in checks:
                got, body = get(path, method)
                if got != want:
                    problems.append(f"{method} {path}: {got}, expected {want}")
                if path == "/metrics" and method == "GET":
                    if "imagegc_runtime_up 0" not in body:
                        problems.append("/metrics does not say imagegc_runtime_up 0")
                    if scrape_out:
                        with open(scrape_out, "w", encoding="utf-8") as f:
                            f.write(body)
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=STOP_DEADLINE_SECONDS)
                took = time.monotonic() - started
                if code != 0:
                    problems.append(f"exit code {code} after SIGTERM, expected 0")
                print(f"  stopped on SIGTERM in {took:.1f}s with exit code {code}")
            except subprocess.TimeoutExpired:
                problems.append(f"still running {STOP_DEADLINE_SECONDS}s after SIGTERM")
            if not os.listdir(state_dir):
                problems.append("nothing written to the state directory")
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if problems:
            with open(os.path.join(work, "daemon.log"), errors="replace") as f:
                sys.stdout.write("  daemon log:\n" + "".join("    " + l for l in f.readlines()[-20:]))
        shutil.rmtree(work, ignore_errors=True)
    if not problems:
        print("ok: healthz 200, readyz 503 without a runtime, metrics served, POST refused, "
              "no capabilities, clean SIGTERM, state saved")
    return problems


def main():
    parser = argparse.ArgumentParser()
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--binary")
    what.add_argument("--rootfs")
    parser.add_argument("--config", required=True)
    parser.add_argument("--scrape-out")
    args = parser.parse_args()
    problems = smoke(args.config, binary=args.binary, rootfs=args.rootfs, scrape_out=args.scrape_out)
    for p in problems:
        print(f"FAIL {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
