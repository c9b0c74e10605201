#!/usr/bin/env python3
"""The whole `imagegc plan --output json` process over 10,000 images: how
many write(2) calls it makes for its answer (strace -c) and how long it
takes, against the fake CRI runtime (examples/fake_runtime.rs) on a unix
socket. Run as root after `cargo build --release --bin imagegc --example
fake_runtime`:

    python3 benches/plan_output.py [IMAGEGC ...]

Each IMAGEGC binary (default target/release/imagegc) is measured on the
same runtime; prints the stdout size, the write(2) count and the median and
range of 5 wall-clock runs of the whole process.
"""
import os
import statistics
import subprocess
import sys
import tempfile
import time

IMAGES = 10_000
RUNS = 5


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    binaries = sys.argv[1:] or [os.path.join(root, "target/release/imagegc")]
    fake_bin = os.path.join(root, "target/release/examples/fake_runtime")
    if not os.path.exists(fake_bin):
        fake_bin = os.path.join(root, "target/debug/examples/fake_runtime")
    work = tempfile.mkdtemp(prefix="imagegc-plan-output-")
    socket = os.path.join(work, "cri.sock")
    fake = subprocess.Popen([fake_bin, socket], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
    try:
        assert fake.stdout.readline().strip() == "ready"
        for i in range(IMAGES):
            fake.stdin.write(f"image registry.example.com/app{i}:1.{i % 7} {1_000_000 + i}\n")
        fake.stdin.flush()
        answered = 0
        while answered < IMAGES:
            if fake.stdout.readline().strip() == "ok":
                answered += 1
        state = os.path.join(work, "state")
        os.makedirs(state, mode=0o700)
        config = os.path.join(work, "imagegc.toml")
        with open(config, "w") as f:
            f.write(f'[runtime]\nendpoint = "unix://{socket}"\n[gc]\nimage_fs_path = "{work}"\n[state]\ndir = "{state}"\n')
        command = ["--config", config, "plan", "--output", "json"]
        for binary in binaries:
            trace = os.path.join(work, "strace.txt")
            out = subprocess.run(
                ["strace", "-f", "-c", "-e", "trace=write,writev", "-o", trace, binary, *command],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                check=True,
            )
            writes = sum(
                int(line.split()[3]) for line in open(trace) if line.strip().endswith((" write", " writev"))
            )
            times = []
            for _ in range(RUNS):
                started = time.perf_counter()
                subprocess.run([binary, *command], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
                times.append((time.perf_counter() - started) * 1000)
            print(
                f"{binary}: {len(out.stdout)} bytes, {writes} write/writev calls, "
                f"{statistics.median(times):.1f} ms ({min(times):.1f}-{max(times):.1f}) whole process, {RUNS} runs"
            )
    finally:
        fake.stdin.write("quit\n")
        fake.stdin.flush()
        fake.wait(timeout=10)


if __name__ == "__main__":
    main()
