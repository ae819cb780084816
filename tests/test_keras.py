"""The Keras adapter: unmodified Keras 2 scripts on N ranks reproduce one process.

Every run is real: ``tmpi wrap`` starts MPICH ranks running Keras 2.3.1 on
Theano in float64; the scripts in ``tests/scripts/keras_*.py`` know nothing
of tmpi.
"""
import os
import re
import subprocess
import sys

import pytest

from conftest import SCRIPTS, TMPI, assert_close, check, final_numbers, rank_env, run, tmpi

MLP = SCRIPTS / "keras_mlp.py"
CALLBACKS = SCRIPTS / "keras_callbacks.py"
PROBE = SCRIPTS / "keras_write_probe"
CASES = ("sgd-fit", "adam-fit", "generator", "train-on-batch")
# 61-row batches split 30/31 over two ranks, so every step has uneven parts.
MLP_ARGS = ["--floatx", "float64", "--batch-size", "61"]


def keras_env(**extra):
    return rank_env("float64", KERAS_BACKEND="theano", **extra)


def results(stdout, case):
    """``{part: [floats]}`` of one case of keras_mlp.py."""
    found = {part: final_numbers(stdout, "%s %s" % (case, part))
             for part in ("history", "evaluate", "weights")}
    found["iterations"] = int(re.findall(r"^final %s iterations (\d+)" % case, stdout,
                                         re.MULTILINE)[-1])
    return found


def assert_same_results(got, expected, rtol=1e-7):
    for part in ("history", "evaluate", "weights"):
        assert_close(got[part], expected[part], rtol)
    assert got["iterations"] == expected["iterations"]


def one_lines(stdout, key):
    """The text of a one-rank run's ``final <key>`` lines."""
    return [line.split(" ", 2)[2] for line in stdout.splitlines()
            if line.startswith("final %s " % key)]


def rank_lines(stdout, rank, key):
    """The text of rank ``rank``'s ``final <key>`` lines (``--all-ranks-output``).

    Ranks share one pipe, so one rank's line may start in the middle of
    another's: each is read up to the next ``[rank`` or the end of the line.
    """
    pattern = r"\[rank %d\] final %s ([^\[\n]*)" % (rank, re.escape(key))
    return [text.strip() for text in re.findall(pattern, stdout)]


@pytest.fixture(scope="module")
def one_rank():
    return check(tmpi("wrap", "-n", "1", MLP, *MLP_ARGS, env=keras_env()))


@pytest.fixture(scope="module")
def two_ranks():
    # No --framework: the script imports keras, which the adapter detects.
    return check(tmpi("wrap", "-n", "2", MLP, *MLP_ARGS, env=keras_env()))


def test_keras_is_detected_and_not_imported_by_tmpi():
    from tmpi_adapters.frameworks.keras import KerasAdapter
    from tmpi_adapters.pluginmanager import get_plugin_manager, lookup
    detect = get_plugin_manager().hook.tmpi_detect_framework
    assert detect(source="import theano\nfrom keras.models import Sequential\n",
                  path="a.py") == "keras"
    assert detect(source="import keras.backend as K\n", path="a.py") == "keras"
    assert detect(source="import theano\n", path="a.py") == "theano"
    assert lookup("frameworks", "keras") is KerasAdapter
    # Every built-in plugin is imported by the plugin manager: Keras must not be.
    probe = ("import sys, tmpi_adapters.pluginmanager as p; p.get_plugin_manager(); "
             "print('keras' in sys.modules, 'theano' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], env=keras_env(), text=True,
                         stdout=subprocess.PIPE, check=True).stdout
    assert out.split() == ["False", "False"]


@pytest.mark.mpi
@pytest.mark.parametrize("case", CASES)
def test_two_ranks_match_one_rank(one_rank, two_ranks, case):
    assert_same_results(results(two_ranks.stdout, case), results(one_rank.stdout, case))


@pytest.mark.mpi
def test_one_progress_stream(one_rank, two_ranks):
    # sgd-fit, adam-fit and generator each print their epochs once.
    assert two_ranks.stdout.count("Epoch 1/3") == one_rank.stdout.count("Epoch 1/3") == 3
    assert two_ranks.stdout.count("final sgd-fit history") == 1
    assert "on 2 rank(s)" in two_ranks.stdout


@pytest.mark.mpi
def test_weak_scaling_with_linear_lr_scaling_is_a_doubled_batch(tmp_path):
    # Each rank takes every other sample (every other batch of the Sequence);
    # with 32 rows per rank and the learning rate doubled in the graph, two
    # ranks take exactly the steps one process takes with 64 rows and twice
    # the rate -- Adam included, which gradient scaling could not reproduce.
    common = ["--floatx", "float64", "--cases", "adam-fit,generator", "--no-shuffle",
              "--train-rows", "1472"]
    one = check(tmpi("wrap", "-n", "1", MLP, *common, "--batch-size", "64", "--lr", "0.1",
                     env=keras_env()))
    two = check(tmpi("wrap", "-n", "2", "--scaling", "weak", "--lr-scaling", MLP, *common,
                     "--batch-size", "32", "--lr", "0.05", env=keras_env()))
    for case in ("adam-fit", "generator"):
        expected = results(one.stdout, case)
        assert expected["iterations"] == 3 * 23
        assert_same_results(results(two.stdout, case), expected)
    assert "Train on 736 samples" in two.stdout


@pytest.mark.mpi
def test_weak_scaling_with_warmup_keeps_ranks_identical():
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output", "--scaling", "weak",
                        "--lr-scaling", "--warmup-steps", "10", MLP, *MLP_ARGS,
                        "--cases", "sgd-fit,train-on-batch", env=keras_env()))
    for case in ("sgd-fit", "train-on-batch"):
        weights = [rank_lines(result.stdout, rank, case + " weights") for rank in (0, 1)]
        assert weights[0] and weights[0] == weights[1], case
        loss, accuracy = [float(v) for v in
                          rank_lines(result.stdout, 0, case + " evaluate")[0].split()]
        assert accuracy > 0.8, result.stdout[-3000:]
    # fit: 750 samples per rank in batches of 61 make 13 steps per epoch.
    assert rank_lines(result.stdout, 1, "sgd-fit iterations") == ["39"]
    # train_on_batch loop: two calls make one step (the first call is split);
    # calls that only hand a rank its batch report the latest step's metrics.
    assert rank_lines(result.stdout, 0, "train-on-batch iterations") == ["38"]
    assert "nan" not in rank_lines(result.stdout, 0, "train-on-batch history")[0]


@pytest.mark.mpi
def test_weak_scaling_with_too_few_samples_is_a_clear_error():
    result = tmpi("wrap", "-n", "2", "--scaling", "weak", MLP, *MLP_ARGS, "--cases",
                  "sgd-fit", "--train-rows", "1", env=keras_env())
    assert result.returncode != 0
    assert "fit was given 1 samples for 2 ranks with --scaling weak" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.mpi
def test_callbacks_write_once_and_batchnorm_is_the_one_process_batchnorm(tmp_path):
    out = tmp_path / "out"
    log = tmp_path / "writes"
    env = keras_env(PYTHONPATH=PROBE, TMPI_PROBE_WATCH=out, TMPI_PROBE_LOG=log)
    result = check(run([TMPI, "wrap", "-n", "2", "--all-ranks-output", CALLBACKS,
                        "--floatx", "float64", "--out", out], env=env))
    stdout = result.stdout
    for key in ("moving_stats", "weights", "val_loss", "evaluate"):
        assert rank_lines(stdout, 0, key) and rank_lines(stdout, 0, key) == \
            rank_lines(stdout, 1, key), key
    # BatchNormalization's batch statistics and moving averages are the whole
    # batch's (collectives in the step): the one-process model, dropout included.
    one = check(run([TMPI, "wrap", "-n", "1", CALLBACKS, "--floatx", "float64", "--out",
                     tmp_path / "one"], env=keras_env()))
    for key in ("moving_stats", "weights"):
        got = [float(v) for v in rank_lines(stdout, 0, key)[0].split()]
        want = [float(v) for v in one_lines(one.stdout, key)[0].split()]
        # (The Dense bias before BatchNorm gets no gradient: rounding noise, 1e-16.)
        scale = max(abs(v) for v in want)
        assert all(abs(a - b) <= 1e-10 * scale for a, b in zip(got, want)), (key, got, want)
    evaluate = [float(v) for v in rank_lines(stdout, 0, "evaluate")[0].split()]
    for key in ("restored", "reloaded"):   # load_model and load_weights on every rank
        assert_close([float(v) for v in rank_lines(stdout, 1, key)[0].split()], evaluate,
                     1e-12)
    rows = (out / "log.csv").read_text().splitlines()
    assert rows[0].startswith("epoch,") and len(rows) == 1 + 4
    # Each write happened once over both ranks (whichever reached it first;
    # rank 0 as a rule): one process's writes, not one per rank.
    opened = [os.path.basename(line.split()[1]) for rank in (0, 1)
              if os.path.exists("%s.rank%d" % (log, rank))
              for line in open("%s.rank%d" % (log, rank)).read().splitlines()]
    assert set(opened) == {"best.h5", "log.csv", "final.h5", "weights.h5"}, opened
    assert [opened.count(name) for name in ("log.csv", "final.h5", "weights.h5")] == [1, 1, 1]
    assert 1 <= opened.count("best.h5") <= 4, opened   # once per improving epoch


@pytest.mark.mpi
def test_early_stopping_and_lr_schedule_agree_when_models_differ(tmp_path):
    # Parameter averaging every 1000 steps: the ranks' models drift apart, yet
    # EarlyStopping and ReduceLROnPlateau must act at the same epoch on both.
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output", "--rule-option", "mode=avg",
                        "--rule-option", "period=1000", CALLBACKS, "--floatx", "float64",
                        "--out", tmp_path, "--epochs", "6", "--patience", "1",
                        "--min-delta", "10", env=keras_env()))
    stdout = result.stdout
    assert rank_lines(stdout, 0, "weights") != rank_lines(stdout, 1, "weights")
    for key in ("epochs", "lr", "val_loss"):
        assert rank_lines(stdout, 0, key) and rank_lines(stdout, 0, key) == \
            rank_lines(stdout, 1, key), key
    assert rank_lines(stdout, 0, "epochs") == ["2"]
    assert float(rank_lines(stdout, 1, "lr")[0]) < 0.05
    assert stdout.count("early stopping") == 2   # once per rank, same epoch


COUPLED_EVAL = SCRIPTS / "keras_coupled_eval.py"


@pytest.mark.mpi
def test_evaluation_whose_rows_meet_gives_the_one_process_numbers():
    """A layer that centres the batch, a Pearson loss or metric, a plateau
    on val_loss: validation, evaluate, predict, the weights and the learning
    rate equal one process's on 2 and 3 ranks; the plain model (a control)
    still splits its evaluation."""
    def finals(result):
        return {line.split()[1]: [float(v) for v in line.split()[2:]]
                for line in result.stdout.splitlines() if line.startswith("final ")}
    one = finals(check(tmpi("wrap", "-n", "1", COUPLED_EVAL, env=keras_env())))
    assert len(one) == 5
    for ranks in (2, 3):
        result = check(tmpi("wrap", "-n", str(ranks), COUPLED_EVAL, env=keras_env()))
        got = finals(result)
        assert set(got) == set(one)
        for case, numbers in one.items():
            assert_close(got[case], numbers, 1e-10)
        whole = [line for line in result.stdout.splitlines() if "evaluates whole" in line]
        assert len(whole) == 4, whole     # every model but the plain one
        assert any("meet in its loss" in line for line in whole)
        assert any("a metric's running totals" in line for line in whole)
