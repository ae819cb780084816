"""tmpi-plugin-gosgd under real ``mpiexec`` ranks and real Theano.

* the gossip mix against a hand computation (``scripts/gosgd_driver.py``),
* ranks that stop at different times: nothing lost, nobody left waiting,
* the plain Theano MLP example trained with ``tmpi wrap --rule gosgd``,
* bad knob values rejected with a clear message before anything starts.

:mod:`tmpi_adapters.testing` starts the ranks and reads their output.
"""
from pathlib import Path

import pytest

from tmpi_adapters.testing import (held_back, listed_plugin, mpiexec, rejected_rule_option,
                                   succeeded, tmpi, train_mlp, val_accuracy)

DRIVER = Path(__file__).resolve().parent / "scripts" / "gosgd_driver.py"


# -- numerics ------------------------------------------------------------------

@pytest.mark.mpi
def test_gossip_rounds_match_hand_computation():
    # 3 ranks, p = 0.5, 4 steps: pushes and skipped pushes both happen; each
    # step's parameters and sum-weights, then the final average, are checked;
    # half-way the state goes through state_dict()/load_state_dict().
    stdout = mpiexec(DRIVER, "rounds", ranks=3)
    assert "gosgd rounds OK on 3 ranks" in stdout


@pytest.mark.mpi
def test_uneven_lengths_end_cleanly_and_lose_nothing():
    # Ranks take 3, 6 and 9 steps with no step-wise synchronisation: the
    # weights must still add up to 1 and the weighted models to the start
    # plus every gradient step, every message sent must have been mixed in,
    # and the job must end.
    stdout = mpiexec(DRIVER, "uneven", ranks=3)
    assert "gosgd uneven OK on 3 ranks" in stdout


@pytest.mark.mpi
def test_no_rank_waits_for_another_while_training():
    # Rank 1 is held at its third step until rank 0 has taken all its steps
    # (--outputs local: the steps' losses are not averaged across ranks):
    # a rule that made the ranks meet at every step would stall here.
    result = held_back("gosgd")
    assert "rank 0 took 30 steps while rank 1 was held" in succeeded(result)


# -- training ------------------------------------------------------------------

@pytest.mark.mpi
def test_mlp_two_ranks_reaches_one_process_accuracy():
    stdout = train_mlp("gosgd", ranks=2)
    assert val_accuracy(stdout) >= 0.95, stdout[-2000:]
    assert "on 2 rank(s)" in stdout


@pytest.mark.mpi
def test_mlp_four_oversubscribed_ranks_train_and_end():
    # 4 ranks on a 2-core machine, each pushing after one step in four.
    stdout = train_mlp("gosgd", ranks=4, rule_options=["gossip_probability=0.25"])
    assert val_accuracy(stdout) >= 0.85, stdout[-2000:]
    assert "on 4 rank(s)" in stdout


# -- packaging and errors ------------------------------------------------------------

def test_listed_by_tmpi_plugins():
    row = listed_plugin("tmpi-plugin-gosgd")
    assert row["provides"] == ["rule:gosgd"] and "tmpi_rules" in row["hooks"], row


@pytest.mark.parametrize("option, words", [
    ("gossip_probability=1.5", "must be in [0, 1]"),
    ("gossip_probability=-0.1", "must be in [0, 1]"),
    ("gossip_probability=often", "is not a valid float"),
    ("final_average=maybe", "is not a valid boolean"),
    ("period=3", "has no option 'period'"),
])
def test_bad_knobs_are_clear_errors(option, words):
    # Checked by `tmpi wrap` before any rank starts.
    stderr = rejected_rule_option("gosgd", option, DRIVER, "rounds")
    assert words in stderr, stderr


def test_without_the_plugin_the_error_names_the_distribution():
    # What a user sees where this plugin is not installed (autoloading off
    # stands in for the uninstalled distribution); the driver never runs.
    result = tmpi("wrap", "--framework", "theano", "--rule", "gosgd", DRIVER,
                  env={"TMPI_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 2
    assert "unknown rule 'gosgd'" in result.stderr, result.stderr
    assert "pip install tmpi-plugin-gosgd" in result.stderr, result.stderr
