"""What the deployment checks share: where things are, running a command as
a check, finding a tool, and the rule for a missing one.

The rule (the one scripts/check-deploy.sh has always followed): a tool or
binary that the test command installs or builds must be there, and a check
that finds it missing fails; anything else missing (kubectl, Go, cargo, a
binary nobody asked to build) skips the check with the reason. The test
command lists what it installed and built in CHECK_DEPLOY_REQUIRED; run by
hand without it, every missing tool skips.
"""

import importlib
import os
import shlex
import shutil
import subprocess

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.dirname(TESTS)
REPO = os.path.dirname(DEPLOY)
CHART = os.path.join(DEPLOY, "helm", "imagegc")
# Kubernetes versions to validate against: 1.26 is the first kubelet that
# speaks only CRI v1, as imagegc does; 1.37 is the newest schema bundled.
K8S_VERSIONS = ("1.26.0", "1.37.0")
MUSL_TARGET = "x86_64-unknown-linux-musl"


def required():
    """What the test command installed or built (CHECK_DEPLOY_REQUIRED)."""
    return set(os.environ.get("CHECK_DEPLOY_REQUIRED", "").split())


def missing(name, why):
    """Fails the check when the test command provides NAME, else skips it."""
    if name in required():
        pytest.fail(f"{name}: {why}; scripts/check-deploy.sh installs or builds it "
                    "(CHECK_DEPLOY_REQUIRED), so it must be there: see its output above", pytrace=False)
    pytest.skip(f"{name}: {why}")


def tool(name):
    """The path of an executable on PATH."""
    path = shutil.which(name)
    if path is None:
        missing(name, "not found on PATH")
    return path


def module(name):
    """A Python module the checks use (installed into the test command's virtualenv)."""
    try:
        return importlib.import_module(name)
    except ImportError as err:
        missing(name, f"cannot import it ({err})")


def tail(text, lines=40):
    return "\n".join(text.rstrip("\n").split("\n")[-lines:])


def run(*cmd, cwd=REPO, env=None, input=None):
    """Runs a command as part of a check. A non-zero exit fails the check,
    naming the command and showing the end of its output (stdout and
    stderr, in order); otherwise the output is printed (pytest shows it with
    -rA) and returned."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, input=input, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    line = shlex.join(str(c) for c in cmd)
    if proc.returncode != 0:
        if proc.stdout.count("\n") > 40:
            print(f"$ {line}\n{proc.stdout}")  # the whole of it; the failure shows the end
        pytest.fail(f"{line} exited with {proc.returncode}:\n{tail(proc.stdout)}", pytrace=False)
    print(f"$ {line}\n{proc.stdout}", end="" if proc.stdout.endswith("\n") else "\n")
    return proc.stdout


def output(*cmd, cwd=REPO):
    """Runs a command and returns its stdout alone (stderr is printed)."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, text=True, capture_output=True)
    line = shlex.join(str(c) for c in cmd)
    if proc.stderr:
        print(f"$ {line} (stderr)\n{proc.stderr}")
    if proc.returncode != 0:
        pytest.fail(f"{line} exited with {proc.returncode}:\n{tail(proc.stderr)}", pytrace=False)
    return proc.stdout


def no_problems(problems, what):
    """Fails the check with each problem on its own line."""
    if problems:
        pytest.fail(f"{what}:\n" + "\n".join(f"  {p}" for p in problems), pytrace=False)
