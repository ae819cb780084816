"""tmpi-plugin-easgd under real ``mpiexec`` ranks and real Theano.

* synchronous and asynchronous exchanges against a hand computation of the
  paper's worker and center updates (``scripts/easgd_driver.py``),
* asynchronous ranks that stop at different times: every push answered,
  every rank ends with the center,
* the plain Theano MLP example trained with ``tmpi wrap --rule easgd``,
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
DRIVER = HERE / "scripts" / "easgd_driver.py"
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


def train_mlp(n, *rule_options):
    if not MLP.exists():
        pytest.skip("the tmpi repository's examples/ are not beside this plugin")
    options = [a for o in rule_options for a in ("--rule-option", o)]
    return succeeded(run(BIN / "tmpi", "wrap", "-n", n, "--seed", "1", "--rule", "easgd",
                         *options, MLP, "--epochs", "6", floatx="float32"))


# -- numerics ------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_exchange_rounds_match_hand_computation(mode):
    # 3 ranks, alpha 0.25, tau 2: one exchange after step 2, several by the
    # end; parameters and the center after every step, then the final center;
    # after step 2 the center goes through state_dict()/load_state_dict().
    stdout = succeeded(run(BIN / "mpiexec", "-n", "3", sys.executable, DRIVER, mode))
    assert "easgd %s OK on 3 ranks" % mode in stdout


@pytest.mark.mpi
def test_async_uneven_lengths_end_cleanly():
    # Ranks take 3, 6 and 9 steps, freely: rank 0 finishes first and must keep
    # answering the others, and everyone must end holding the same center.
    stdout = succeeded(run(BIN / "mpiexec", "-n", "3", sys.executable, DRIVER, "uneven"))
    assert "easgd uneven OK on 3 ranks" in stdout


# -- training ------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_mlp_two_ranks_reaches_one_process_accuracy(mode):
    stdout = train_mlp(2, "mode=" + mode)
    assert val_accuracy(stdout) >= 0.95, stdout[-2000:]
    assert "on 2 rank(s)" in stdout


@pytest.mark.mpi
def test_mlp_four_oversubscribed_ranks_train_and_end():
    # 4 ranks on a 2-core machine around a center held by rank 0.
    stdout = train_mlp(4, "mode=async")
    assert val_accuracy(stdout) >= 0.85, stdout[-2000:]
    assert "on 4 rank(s)" in stdout


# -- packaging and errors ------------------------------------------------------------

def test_listed_by_tmpi_plugins():
    rows = json.loads(succeeded(run(BIN / "tmpi", "plugins", "--json")))
    mine = [r for r in rows if r["distribution"] == "tmpi-plugin-easgd"]
    assert mine and mine[0]["provides"] == ["rule:easgd"] and "tmpi_rules" in mine[0]["hooks"]


@pytest.mark.parametrize("option, words", [
    ("alpha=0", "must be in (0, 1)"),
    ("alpha=-0.5", "must be in (0, 1)"),
    ("alpha=1.5", "must be in (0, 1)"),
    ("tau=-2", "must be > 0"),
    ("tau=0", "must be > 0"),
    ("tau=2.5", "is not a valid int"),
    ("mode=ring", "must be one of sync, async"),
])
def test_bad_knobs_are_clear_errors(option, words):
    # Checked by `tmpi wrap` before any rank starts.
    result = run(BIN / "tmpi", "wrap", "-n", "2", "--rule", "easgd", "--rule-option", option,
                 DRIVER, "sync")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tmpi: error: rule 'easgd'" in result.stderr and words in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.mpi
def test_center_moving_past_the_workers_mean_is_refused():
    # alpha 0.8 on 2 ranks: beta = N * alpha = 1.6 > 1 in the synchronous form.
    if not MLP.exists():
        pytest.skip("the tmpi repository's examples/ are not beside this plugin")
    result = run(BIN / "tmpi", "wrap", "-n", "2", "--rule", "easgd", "--rule-option",
                 "alpha=0.8", MLP, "--epochs", "1")
    assert result.returncode != 0
    assert "beta = N * alpha = 1.6" in result.stderr and "alpha <= 0.5" in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr
