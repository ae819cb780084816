"""Ranks compare their models by names, shapes, dtypes and order; names that
differ only by the counters Keras and Theano append (``dense_1``, ``dense_2``)
are the same variable, since something the process did earlier on one rank
(a test of a suite that took another path there) advances that rank's
counters.  And Keras' own tests' stand-in for Google Cloud Storage, one per
process, is written by every rank: a ``gs://`` URL is no file of the host.
"""
import pytest

from conftest import SCRIPTS, assert_close, check, final_numbers, rank_env, tmpi

NAMES = SCRIPTS / "signature_names.py"
HISTORY = SCRIPTS / "keras_suite_history.py"


@pytest.mark.mpi
def test_names_that_differ_by_a_counter_train_as_one_model():
    two = check(tmpi("wrap", "-n", "2", NAMES, "counter"))
    one = check(tmpi("wrap", "-n", "1", NAMES, "counter"))
    assert_close(final_numbers(two.stdout, "W"), final_numbers(one.stdout, "W"), 1e-12)


@pytest.mark.mpi
def test_names_that_differ_otherwise_are_still_a_mismatch():
    result = tmpi("wrap", "-n", "2", NAMES, "other")
    assert result.returncode == 3, result.stderr
    assert "rank 1's model differs from rank 0's at param #0: rank 0 has param 'W_hidden' " \
           "shape (3, 4) dtype float64, rank 1 has param 'W_output'" in result.stderr


@pytest.mark.mpi
def test_a_suites_history_on_one_rank_and_gcs_saves_run_as_on_one_process():
    env = rank_env("float64", KERAS_BACKEND="theano")
    two = check(tmpi("wrap", "-n", "2", "--all-ranks-output", HISTORY, env=env))
    one = check(tmpi("wrap", "-n", "1", HISTORY, env=env))
    # Rank 1 built a layer first: its model's weights are dense_2 and dense_3.
    assert "[rank 0] weights named dense_1/kernel" in two.stdout
    assert "[rank 1] weights named dense_2/kernel" in two.stdout
    # Each rank saved to its own stand-in for GCS and loaded the model back.
    assert two.stdout.count("final loaded equal True") == 2, two.stdout
    rank0 = "\n".join(line[len("[rank 0] "):] for line in two.stdout.splitlines()
                      if line.startswith("[rank 0] "))
    assert_close(final_numbers(rank0, "weights"), final_numbers(one.stdout, "weights"), 1e-8)
