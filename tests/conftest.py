"""Shared helpers: run real ranks under the installed mpiexec and read their output."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TMPI = str(BIN / "tmpi")
MPIEXEC = str(BIN / "mpiexec")
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"

#: Generous bound for one multi-rank run on a loaded 2-core machine; a hang
#: fails the test instead of stalling CI.
RUN_TIMEOUT = 600


def rank_env(floatx="float64", **extra):
    """Environment for a run: float64 Theano unless asked otherwise."""
    env = dict(os.environ)
    flags = [f for f in env.get("THEANO_FLAGS", "").split(",")
             if f and not f.startswith("floatX=")]
    env["THEANO_FLAGS"] = ",".join(flags + ["floatX=%s" % floatx, "blas.ldflags="])
    env.pop("TMPI_OPTIONS", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run(command, env=None, timeout=RUN_TIMEOUT, cwd=None):
    """Run a command; return CompletedProcess with text stdout/stderr."""
    return subprocess.run([str(c) for c in command], env=env or rank_env(), cwd=cwd or ROOT,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def tmpi(*args, env=None, timeout=RUN_TIMEOUT):
    """``tmpi ARGS...``"""
    return run([TMPI] + list(args), env=env, timeout=timeout)


def mpiexec(n, *args, env=None, timeout=RUN_TIMEOUT):
    """``mpiexec -n N ARGS...`` with the installed MPICH."""
    return run([MPIEXEC, "-n", str(n)] + list(args), env=env, timeout=timeout)


def check(result):
    """Assert a run succeeded, showing its output when it did not."""
    assert result.returncode == 0, "exit %d\n--- stdout\n%s\n--- stderr\n%s" % (
        result.returncode, result.stdout[-4000:], result.stderr[-4000:])
    return result


def final_numbers(stdout, key):
    """The floats on the last line starting with ``final <key>``."""
    lines = [line for line in stdout.splitlines() if line.startswith("final %s" % key)]
    assert lines, "no 'final %s' line in output:\n%s" % (key, stdout[-3000:])
    return [float(v) for v in re.findall(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?|nan|inf", lines[-1])]


def assert_close(a, b, rtol):
    assert len(a) == len(b), (a, b)
    for x, y in zip(a, b):
        assert abs(x - y) <= rtol * max(abs(x), abs(y), 1e-300), (a, b)


@pytest.fixture(scope="session")
def warm_theano():
    """Compile the MLP example once so later multi-rank runs hit a warm cache."""
    check(run([sys.executable, EXAMPLES / "theano_mlp" / "train.py", "--epochs", "1"]))
