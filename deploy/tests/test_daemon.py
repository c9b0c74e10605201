"""The static binary, and the daemon as the DaemonSet and the systemd unit
run it."""

import pytest

from support import no_problems, output, run, tool


def test_static_binary_links_no_shared_library(imagegc_bin):
    # What the Containerfile ships: a binary with no shared libraries, that
    # runs in an empty image.
    needed = [line for line in output(tool("readelf"), "-d", imagegc_bin).splitlines() if "(NEEDED)" in line]
    assert not needed, f"{imagegc_bin} links shared libraries:\n" + "\n".join(needed)
    run(imagegc_bin, "--version")


@pytest.mark.parametrize("config", ["deploy/imagegc.toml", "systemd/imagegc.toml"])
def test_check_config(imagegc_bin, config):
    run(imagegc_bin, "check-config", "--config", config)


def test_daemon_probes_metrics_sigterm_no_capabilities(daemon_smoke):
    problems, _ = daemon_smoke
    no_problems(problems, "imagegc run as the DaemonSet runs it, with no runtime")
