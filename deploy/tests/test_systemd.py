"""The systemd unit (systemd/imagegc.service)."""

import pathlib
import re
import subprocess

from support import REPO, run, tool

REPO_PATH = pathlib.Path(REPO)


def test_systemd_analyze_verify(any_imagegc_bin, work):
    # verify wants ExecStart's binary to exist: check a copy pointing at the
    # binary just built, or at /bin/true.
    exe = any_imagegc_bin or "/bin/true"
    with open(f"{REPO}/systemd/imagegc.service", encoding="utf-8") as f:
        unit = f.read()
    assert re.search(r"^ExecStart=/usr/local/bin/imagegc run", unit, re.M), \
        "ExecStart is not /usr/local/bin/imagegc run ..."
    unit_dir = work / "unit"
    unit_dir.mkdir()
    path = unit_dir / "imagegc.service"
    path.write_text(re.sub(r"^ExecStart=/usr/local/bin/imagegc ", f"ExecStart={exe} ", unit, flags=re.M))
    analyze = tool("systemd-analyze")
    # verify exits 0 on unknown keys and prints a warning: any output fails.
    out = run(analyze, "verify", path)
    assert not out.strip(), f"systemd-analyze verify warns:\n{out}"
    # With the drop-ins README installs beside it (read from
    # imagegc.service.d/ next to the unit, as from /etc/systemd/system).
    dropins = unit_dir / "imagegc.service.d"
    dropins.mkdir()
    for name in ("kubernetes.conf", "registry-manifests.conf"):
        (dropins / name).write_text((REPO_PATH / "systemd" / name).read_text(encoding="utf-8"))
    out = run(analyze, "verify", path)
    assert not out.strip(), f"systemd-analyze verify warns with the drop-ins:\n{out}"
    # How exposed the service is, for the record (not a check).
    security = subprocess.run([analyze, "security", "--offline=yes", path], capture_output=True, text=True)
    print("systemd-analyze security:", *re.findall(r"Overall exposure level.*", security.stdout))
