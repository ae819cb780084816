"""tmpi-plugin-asgd under real ``mpiexec`` ranks and real Theano.

* Downpour pushes and pulls against a hand computation
  (``scripts/asgd_driver.py``),
* ranks that stop at different times: every local step reaches the global
  parameters exactly once, nobody is left waiting,
* the plain Theano MLP example trained with ``tmpi wrap --rule asgd``,
* bad knob values rejected with a clear message.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
DRIVER = HERE / "scripts" / "asgd_driver.py"
#: The MLP example of the tmpi repository this plugin lives in.
MLP = HERE.parents[2] / "examples" / "theano_mlp" / "train.py"
BIN = Path(sys.executable).parent
#: A hang fails the test instead of stalling CI.
TIMEOUT = 900


def run(*command, floatx="float64"):
    """Run a command under real Theano; returns CompletedProcess (text).

    Theano runs in pure Python (``cxx=``, and no elemwise fusion, which Python
    would evaluate element by element): the models here are small, and ranks
    then never queue on the lock of the compile cache that every Theano
    process on the machine shares.
    """
    env = dict(os.environ)
    env.pop("TMPI_OPTIONS", None)
    flags = [f for f in env.get("THEANO_FLAGS", "").split(",") if f and "floatX" not in f]
    env["THEANO_FLAGS"] = ",".join(flags + ["floatX=" + floatx, "blas.ldflags=", "cxx=",
                                            "optimizer_excluding=fusion"])
    return subprocess.run([str(c) for c in command], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)


def succeeded(result):
    assert result.returncode == 0, "exit %d\n--- stdout\n%s\n--- stderr\n%s" % (
        result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def val_accuracy(stdout):
    """The example's ``final val_loss L val_acc A`` line -> A."""
    found = re.findall(r"^final val_loss \S+ val_acc (\S+)", stdout, re.M)
    assert found, stdout[-3000:]
    return float(found[-1])


def train_mlp(n, *rule_options, rule="asgd"):
    if not MLP.exists():
        pytest.skip("the tmpi repository's examples/ are not beside this plugin")
    options = [a for o in rule_options for a in ("--rule-option", o)]
    return succeeded(run(BIN / "tmpi", "wrap", "-n", n, "--seed", "1", "--rule", rule,
                         *options, MLP, "--epochs", "6", floatx="float32"))


# -- numerics ------------------------------------------------------------------

@pytest.mark.mpi
def test_push_pull_rounds_match_hand_computation():
    # 3 ranks, tau 2: updates accumulate over two steps before each push; the
    # parameters of every rank and the global ones after every step, then the
    # last pushes at the end; after step 2 the accumulated updates and global
    # parameters go through state_dict()/load_state_dict().
    stdout = succeeded(run(BIN / "mpiexec", "-n", "3", sys.executable, DRIVER, "rounds"))
    assert "asgd rounds OK on 3 ranks" in stdout


@pytest.mark.mpi
def test_uneven_lengths_end_cleanly_and_lose_nothing():
    # Ranks take 3, 6 and 9 steps, freely: rank 0 finishes first and must keep
    # applying the others' pushes; no step may be lost or applied twice.
    stdout = succeeded(run(BIN / "mpiexec", "-n", "3", sys.executable, DRIVER, "uneven"))
    assert "asgd uneven OK on 3 ranks" in stdout


# -- training ------------------------------------------------------------------

@pytest.mark.mpi
def test_mlp_two_ranks_reaches_one_process_accuracy():
    stdout = train_mlp(2)
    assert val_accuracy(stdout) >= 0.95, stdout[-2000:]
    assert "on 2 rank(s)" in stdout


@pytest.mark.mpi
def test_mlp_four_oversubscribed_ranks_train_and_end():
    # 4 ranks on a 2-core machine pushing to rank 0 every 2 steps, under the
    # rule's other name.
    stdout = train_mlp(4, "tau=2", rule="downpour")
    assert val_accuracy(stdout) >= 0.85, stdout[-2000:]
    assert "on 4 rank(s)" in stdout


# -- packaging and errors ------------------------------------------------------------

def test_listed_by_tmpi_plugins_under_both_names():
    rows = json.loads(succeeded(run(BIN / "tmpi", "plugins", "--json")))
    mine = [r for r in rows if r["distribution"] == "tmpi-plugin-asgd"]
    assert mine and mine[0]["provides"] == ["rule:asgd", "rule:downpour"], mine


@pytest.mark.parametrize("option, words", [
    ("tau=-1", "must be > 0"),
    ("tau=0", "must be > 0"),
    ("update_scale=0", "must be > 0"),
    ("update_scale=-0.5", "must be > 0"),
    ("alpha=0.5", "has no option 'alpha'"),
])
def test_bad_knobs_are_clear_errors(option, words):
    # Checked by `tmpi wrap` before any rank starts.
    result = run(BIN / "tmpi", "wrap", "-n", "2", "--rule", "asgd", "--rule-option", option,
                 DRIVER, "rounds")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tmpi: error: rule 'asgd'" in result.stderr and words in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr
