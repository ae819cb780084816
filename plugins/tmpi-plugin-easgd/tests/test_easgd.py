"""tmpi-plugin-easgd under real ``mpiexec`` ranks and real Theano.

* synchronous and asynchronous exchanges against a hand computation of the
  paper's worker and center updates (``scripts/easgd_driver.py``),
* asynchronous ranks that stop at different times: every push answered,
  every rank ends with the center,
* the plain Theano MLP example trained with ``tmpi wrap --rule easgd``,
* bad knob values rejected with a clear message.

:mod:`tmpi_adapters.testing` starts the ranks and reads their output.
"""
from pathlib import Path

import pytest

from tmpi_adapters.testing import (held_back, listed_plugin, mlp_example, mpiexec,
                                   rejected_rule_option, succeeded, tmpi, train_mlp,
                                   val_accuracy)

DRIVER = Path(__file__).resolve().parent / "scripts" / "easgd_driver.py"


# -- numerics ------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_exchange_rounds_match_hand_computation(mode):
    # 3 ranks, alpha 0.25, tau 2: one exchange after step 2, several by the
    # end; parameters and the center after every step, then the final center;
    # after step 2 the center goes through state_dict()/load_state_dict().
    stdout = mpiexec(DRIVER, mode, ranks=3)
    assert "easgd %s OK on 3 ranks" % mode in stdout


@pytest.mark.mpi
def test_async_uneven_lengths_end_cleanly():
    # Ranks take 3, 6 and 9 steps, freely: rank 0 finishes first and must keep
    # answering the others, and everyone must end holding the same center.
    stdout = mpiexec(DRIVER, "uneven", ranks=3)
    assert "easgd uneven OK on 3 ranks" in stdout


@pytest.mark.mpi
def test_async_workers_never_wait_for_each_other_and_sync_ones_do():
    # Rank 1 is held at its third step until rank 0 has taken all its steps
    # (--outputs local: the steps' losses are not averaged across ranks).
    # The asynchronous form lets rank 0 go on; the synchronous form's
    # exchanges are collectives, so there rank 0 waits and the stall ends the job.
    result = held_back("easgd", ["mode=async", "tau=2"])
    assert "rank 0 took 30 steps while rank 1 was held" in succeeded(result)
    result = held_back("easgd", ["mode=sync", "tau=2"], stall_timeout=3)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "tmpi: stall:" in result.stderr and "rank 1 has not reached it" in result.stderr


# -- training ------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_mlp_two_ranks_reaches_one_process_accuracy(mode):
    stdout = train_mlp("easgd", ranks=2, rule_options=["mode=" + mode])
    assert val_accuracy(stdout) >= 0.95, stdout[-2000:]
    assert "on 2 rank(s)" in stdout


@pytest.mark.mpi
def test_mlp_four_oversubscribed_ranks_train_and_end():
    # 4 ranks on a 2-core machine around a center held by rank 0.
    stdout = train_mlp("easgd", ranks=4, rule_options=["mode=async"])
    assert val_accuracy(stdout) >= 0.85, stdout[-2000:]
    assert "on 4 rank(s)" in stdout


# -- packaging and errors ------------------------------------------------------------

def test_listed_by_tmpi_plugins():
    row = listed_plugin("tmpi-plugin-easgd")
    assert row["provides"] == ["rule:easgd"] and "tmpi_rules" in row["hooks"], row


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
    stderr = rejected_rule_option("easgd", option, DRIVER, "sync")
    assert words in stderr, stderr


@pytest.mark.mpi
def test_center_moving_past_the_workers_mean_is_refused():
    # alpha 0.8 on 2 ranks: beta = N * alpha = 1.6 > 1 in the synchronous form.
    result = tmpi("wrap", "-n", "2", "--rule", "easgd", "--rule-option", "alpha=0.8",
                  mlp_example(), "--epochs", "1")
    assert result.returncode != 0
    assert "beta = N * alpha = 1.6" in result.stderr and "alpha <= 0.5" in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr
