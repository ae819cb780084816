"""tmpi-plugin-asgd under real ``mpiexec`` ranks and real Theano.

* Downpour pushes and pulls against a hand computation
  (``scripts/asgd_driver.py``),
* ranks that stop at different times: every local step reaches the global
  parameters exactly once, nobody is left waiting,
* the plain Theano MLP example trained with ``tmpi wrap --rule asgd``,
* bad knob values rejected with a clear message.

:mod:`tmpi_adapters.testing` starts the ranks and reads their output.
"""
from pathlib import Path

import pytest

from tmpi_adapters.testing import (held_back, listed_plugin, mpiexec, rejected_rule_option,
                                   succeeded, train_mlp, val_accuracy)

DRIVER = Path(__file__).resolve().parent / "scripts" / "asgd_driver.py"


# -- numerics ------------------------------------------------------------------

@pytest.mark.mpi
def test_push_pull_rounds_match_hand_computation():
    # 3 ranks, tau 2: updates accumulate over two steps before each push; the
    # parameters of every rank and the global ones after every step, then the
    # last pushes at the end; after step 2 the accumulated updates and global
    # parameters go through state_dict()/load_state_dict().
    stdout = mpiexec(DRIVER, "rounds", ranks=3)
    assert "asgd rounds OK on 3 ranks" in stdout


@pytest.mark.mpi
def test_uneven_lengths_end_cleanly_and_lose_nothing():
    # Ranks take 3, 6 and 9 steps, freely: rank 0 finishes first and must keep
    # applying the others' pushes; no step may be lost or applied twice.
    stdout = mpiexec(DRIVER, "uneven", ranks=3)
    assert "asgd uneven OK on 3 ranks" in stdout


@pytest.mark.mpi
def test_no_rank_waits_for_another_while_training():
    # Rank 1 is held at its third step until rank 0 has taken all its steps
    # (--outputs local: the steps' losses are not averaged across ranks):
    # a rule that made the ranks meet at every step would stall here.
    result = held_back("asgd")
    assert "rank 0 took 30 steps while rank 1 was held" in succeeded(result)


# -- training ------------------------------------------------------------------

@pytest.mark.mpi
def test_mlp_two_ranks_reaches_one_process_accuracy():
    stdout = train_mlp("asgd", ranks=2)
    assert val_accuracy(stdout) >= 0.95, stdout[-2000:]
    assert "on 2 rank(s)" in stdout


@pytest.mark.mpi
def test_mlp_four_oversubscribed_ranks_train_and_end():
    # 4 ranks on a 2-core machine pushing to rank 0 every 2 steps, under the
    # rule's other name.
    stdout = train_mlp("downpour", ranks=4, rule_options=["tau=2"])
    assert val_accuracy(stdout) >= 0.85, stdout[-2000:]
    assert "on 4 rank(s)" in stdout


# -- packaging and errors ------------------------------------------------------------

def test_listed_by_tmpi_plugins_under_both_names():
    row = listed_plugin("tmpi-plugin-asgd")
    assert row["provides"] == ["rule:asgd", "rule:downpour"], row


@pytest.mark.parametrize("option, words", [
    ("tau=-1", "must be > 0"),
    ("tau=0", "must be > 0"),
    ("update_scale=0", "must be > 0"),
    ("update_scale=-0.5", "must be > 0"),
    ("alpha=0.5", "has no option 'alpha'"),
])
def test_bad_knobs_are_clear_errors(option, words):
    # Checked by `tmpi wrap` before any rank starts.
    stderr = rejected_rule_option("asgd", option, DRIVER, "rounds")
    assert words in stderr, stderr
