#!/usr/bin/env python3
"""The whole `imagegc plan --output json` process, against the fake CRI
runtime (examples/fake_runtime.rs) on a unix socket. Run as root after
`cargo build --release --bin imagegc --example fake_runtime`:

    python3 benches/plan_output.py [IMAGEGC ...]

Each IMAGEGC binary (default target/release/imagegc) is measured on the same
runtime, in two parts:

1. 10,000 images, no containers: the stdout size, the write(2) count
   (strace -c) and the median and range of 5 wall-clock runs.
2. The same images and 5,000 running containers, against a bare Python gRPC
   client (benches/plan_client.py) that only lists the images and containers:
   `strace -f -c` of one run of each (write/writev calls, all syscalls), the
   RPCs each asked of the runtime (the fake counts them), then 7 rounds, each
   running every IMAGEGC and the client once, in turn. Both are timed from
   exec to exit (the client's interpreter start and imports included); the
   client also reports its own time from just before connecting to just after
   parsing. Each round's ratio imagegc/client is taken within the round.

The client runs in a venv under target/plan-client (made on the first run:
python3-venv from apt-get when missing, grpcio and grpcio-tools from PyPI;
the stubs generated there from proto/cri.proto).
"""
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

IMAGES = 10_000
CONTAINERS = 5_000
RUNS = 5
ROUNDS = 7
CLOCK_TICK_MS = 1000 / os.sysconf("SC_CLK_TCK")


def client_env(root):
    """The venv's python and the stubs' directory, made when missing."""
    base = os.path.join(root, "target/plan-client")
    venv = os.path.join(base, "venv")
    python = os.path.join(venv, "bin/python3")
    if not os.path.exists(os.path.join(venv, "bin/pip")):
        shutil.rmtree(venv, ignore_errors=True)
        if subprocess.run([sys.executable, "-m", "venv", venv]).returncode != 0:
            # Debian leaves ensurepip out of python3 itself.
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run(["apt-get", "install", "-y", "python3-venv"], check=True)
            subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    if subprocess.run([python, "-c", "import grpc, grpc_tools"], stderr=subprocess.DEVNULL).returncode != 0:
        subprocess.run([python, "-m", "pip", "install", "-q", "grpcio", "grpcio-tools"], check=True)
    gen = os.path.join(base, "gen")
    proto = os.path.join(root, "proto/cri.proto")
    stub = os.path.join(gen, "cri_pb2_grpc.py")
    if not os.path.exists(stub) or os.path.getmtime(stub) < os.path.getmtime(proto):
        os.makedirs(gen, exist_ok=True)
        subprocess.run(
            [python, "-m", "grpc_tools.protoc", f"-I{os.path.dirname(proto)}", f"--python_out={gen}",
             f"--grpc_python_out={gen}", proto],
            check=True,
        )
    return python, gen


class Fake:
    """The fake runtime, driven over its stdin."""

    def __init__(self, binary, socket):
        self.process = subprocess.Popen([binary, socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        bufsize=1)
        assert self.process.stdout.readline().strip() == "ready"

    def send(self, lines):
        """Sends commands and waits for their answers; returns the last."""
        for line in lines:
            self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = ""
        for _ in lines:
            answer = self.process.stdout.readline().strip()
            if not answer.startswith("ok"):
                raise RuntimeError(f"fake runtime: {answer}")
        return answer

    def calls(self):
        """RPC -> calls so far, as the fake counted them."""
        return dict(word.split("=") for word in self.send(["calls"]).split()[1:])

    def cpu_ms(self):
        """The fake's CPU time so far (utime + stime)."""
        fields = open(f"/proc/{self.process.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * CLOCK_TICK_MS

    def quit(self):
        self.process.stdin.write("quit\n")
        self.process.stdin.flush()
        self.process.wait(timeout=10)


def strace_counts(command, work):
    """Runs command under `strace -f -c`: (stdout, write+writev calls, all syscalls)."""
    trace = os.path.join(work, "strace.txt")
    out = subprocess.run(["strace", "-f", "-c", "-o", trace, *command], stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, check=True)
    writes = total = 0
    for line in open(trace):
        words = line.split()
        if len(words) >= 5 and words[-1] in ("write", "writev"):
            writes += int(words[3])
        if len(words) >= 5 and words[-1] == "total":
            total = int(words[3])
    return out.stdout, writes, total


def calls_between(fake, run):
    """What `run()` asked of the runtime: RPC -> calls."""
    before = fake.calls()
    result = run()
    after = fake.calls()
    return result, {rpc: int(n) - int(before.get(rpc, 0)) for rpc, n in after.items() if int(n) != int(before.get(rpc, 0))}


def timed(command):
    started = time.perf_counter()
    out = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, check=True, text=True)
    return (time.perf_counter() - started) * 1000, out.stdout


def spread(values, unit="ms"):
    return f"{statistics.median(values):.1f} {unit} ({min(values):.1f}-{max(values):.1f})"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binaries = sys.argv[1:] or [os.path.join(root, "target/release/imagegc")]
    fake_bin = os.path.join(root, "target/release/examples/fake_runtime")
    if not os.path.exists(fake_bin):
        fake_bin = os.path.join(root, "target/debug/examples/fake_runtime")
    python, stubs = client_env(root)
    client = [python, os.path.join(root, "benches/plan_client.py")]
    work = tempfile.mkdtemp(prefix="imagegc-plan-output-")
    socket = os.path.join(work, "cri.sock")
    fake = Fake(fake_bin, socket)
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    try:
        fake.send([f"image registry.example.com/app{i}:1.{i % 7} {1_000_000 + i}" for i in range(IMAGES)])
        state = os.path.join(work, "state")
        os.makedirs(state, mode=0o700)
        config = os.path.join(work, "imagegc.toml")
        with open(config, "w") as f:
            f.write(f'[runtime]\nendpoint = "unix://{socket}"\n[gc]\nimage_fs_path = "{work}"\n[state]\ndir = "{state}"\n')
        command = ["--config", config, "plan", "--output", "json"]

        print(f"== {IMAGES} images, no containers")
        for binary in binaries:
            out, writes, _ = strace_counts([binary, *command], work)
            times = [timed([binary, *command])[0] for _ in range(RUNS)]
            print(f"{binary}: {len(out)} bytes, {writes} write/writev calls, {spread(times)} whole process, {RUNS} runs")

        fake.send([f"containers {CONTAINERS}"])
        client_command = [*client, socket, stubs]
        def measure():
            print(f"== {IMAGES} images, {CONTAINERS} running containers; imagegc against a bare Python gRPC client")
            for name, run in [*((b, [b, *command]) for b in binaries), ("client", client_command)]:
                (out, writes, total), calls = calls_between(fake, lambda: strace_counts(run, work))
                asked = ", ".join(f"{rpc} {n}" for rpc, n in calls.items())
                print(f"{name}: strace -f -c: {writes} write/writev calls, {total} syscalls; {len(out)} bytes out; asked: {asked}")

            whole = {b: [] for b in binaries}
            fake_cpu = {b: [] for b in binaries}
            ratios = {b: [] for b in binaries}
            client_whole, client_inside, client_fake_cpu = [], [], []
            for _ in range(ROUNDS):
                for binary in binaries:
                    cpu = fake.cpu_ms()
                    whole[binary].append(timed([binary, *command])[0])
                    fake_cpu[binary].append(fake.cpu_ms() - cpu)
                cpu = fake.cpu_ms()
                elapsed, out = timed(client_command)
                client_fake_cpu.append(fake.cpu_ms() - cpu)
                counts = dict(word.split("=") for word in out.split())
                assert counts["images"] == str(IMAGES) and counts["containers"] == str(CONTAINERS), out
                client_whole.append(elapsed)
                client_inside.append(float(counts["in_process_ms"]))
                for binary in binaries:
                    ratios[binary].append(whole[binary][-1] / elapsed)
            for binary in binaries:
                print(f"{binary}: whole process {spread(whole[binary])}; fake runtime's CPU per run "
                      f"{statistics.mean(fake_cpu[binary]):.0f} ms (mean); "
                      f"ratio to the client's whole process {spread(ratios[binary], 'x')}")
            print(f"client: whole process {spread(client_whole)}, in process {spread(client_inside)}; "
                  f"fake runtime's CPU per run {statistics.mean(client_fake_cpu):.0f} ms (mean); {ROUNDS} rounds")

        measure()
        # What a node where the daemon runs has: each container's mounts,
        # learnt by a cycle and noted in the state directory.
        subprocess.run([binaries[0], "--config", config, "once", "--output", "json"], check=False,
                       capture_output=True)
        print("== the same, after `imagegc once` noted what it learnt of each container (containers.json)")
        measure()
        print(f"load average at end: {os.getloadavg()[0]:.2f}")
    finally:
        fake.quit()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
