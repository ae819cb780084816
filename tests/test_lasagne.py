"""The Lasagne adapter: ordinary Lasagne scripts distributed exactly, through
``tmpi wrap`` and through the decorator, and clear errors when they cannot be."""
import re
import sys
from pathlib import Path

import pytest

from conftest import (EXAMPLES, SCRIPTS, assert_close, check, final_numbers, mpiexec,
                      rank_env, run, tmpi)

MNIST = SCRIPTS / "lasagne_mnist.py"
ERRORS = SCRIPTS / "lasagne_errors.py"
MLP_ARGS = ["mlp", "2"]


def numbers(result):
    """Training loss, validation and test numbers, then every parameter's norm."""
    return final_numbers(result.stdout, "train") + final_numbers(result.stdout, "norms")


def rank_outputs(stdout):
    """``{rank: text}`` from an --all-ranks-output run.

    Ranks write concurrently, so a line of one rank can be cut by another's
    prefixed line; every prefix starts a new piece of its rank's text.
    """
    pieces = re.split(r"\[rank (\d+)\] ", stdout)
    texts = {}
    for rank, piece in zip(pieces[1::2], pieces[2::2]):
        texts.setdefault(int(rank), []).append(piece.rstrip("\n"))
    return {rank: "\n".join(parts) + "\n" for rank, parts in texts.items()}


def decorated_copy(directory):
    """The MNIST-style script with the two lines a user adds (tmpi imported
    before Lasagne, whose 0.1 release needs tmpi's Theano 1.0 shim)."""
    source = MNIST.read_text()
    source = source.replace("import lasagne\n", "import tmpi_adapters as tmpi\nimport lasagne\n", 1)
    source = source.replace("def main(", '@tmpi.distributed(framework="lasagne", rule="bsp")\n'
                                         "def main(", 1)
    path = directory / "decorated_mnist.py"
    path.write_text(source)
    return path


@pytest.fixture(scope="module")
def mlp_one_rank():
    return numbers(check(tmpi("wrap", "-n", "1", MNIST, *MLP_ARGS)))


def test_framework_is_detected_from_the_scripts_imports():
    from tmpi_adapters.launch.target import detect_framework
    assert detect_framework(str(MNIST)) == "lasagne"
    assert detect_framework(str(EXAMPLES / "theano_mlp" / "train.py")) == "theano"


@pytest.mark.mpi
def test_wrap_with_dropout_two_ranks_match_one_rank(mlp_one_rank):
    # No --framework: detected. Dropout masks are drawn for the whole batch,
    # so the 2-rank run takes exactly the 1-rank steps.
    result = check(tmpi("wrap", "-n", "2", "--rule", "bsp", MNIST, *MLP_ARGS))
    assert_close(numbers(result), mlp_one_rank, 1e-8)
    assert result.stdout.count("Epoch 1 of 2") == 1
    assert "on 2 rank(s)" in result.stdout


@pytest.mark.mpi
def test_decorator_runs_alone_under_mpiexec_and_under_wrap(tmp_path, mlp_one_rank):
    script = decorated_copy(tmp_path)
    alone = check(run([sys.executable, script, *MLP_ARGS]))
    assert "on 1 rank(s)" in alone.stdout
    assert_close(numbers(alone), mlp_one_rank, 1e-12)

    two = check(mpiexec(2, sys.executable, script, *MLP_ARGS))
    assert "on 2 rank(s)" in two.stdout and two.stdout.count("Final results:") == 1
    assert_close(numbers(two), mlp_one_rank, 1e-8)

    # Under `tmpi wrap` the decorator joins the wrap's session; 100-row
    # batches split 33/33/34 over three ranks.
    three = check(tmpi("wrap", "-n", "3", script, *MLP_ARGS))
    assert "on 3 rank(s)" in three.stdout
    assert_close(numbers(three), mlp_one_rank, 1e-8)


@pytest.mark.mpi
def test_cnn_with_dropout_two_ranks_match_one_rank():
    one = numbers(check(tmpi("wrap", "-n", "1", MNIST, "cnn", "2")))
    two = numbers(check(tmpi("wrap", "-n", "2", MNIST, "cnn", "2")))
    assert_close(two, one, 1e-8)


@pytest.mark.mpi
def test_ranks_building_different_optimizers_name_the_state():
    result = tmpi("wrap", "-n", "2", ERRORS, "mismatch")
    assert result.returncode != 0
    assert "rank 1's model differs from rank 0's at optimizer state" in result.stderr
    assert "'W.adam[0]'" in result.stderr and "'W.momentum[0]'" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.mpi
def test_fixed_batch_input_layer_is_rebuilt_for_each_rank():
    # The InputLayer writes the batch (40 rows) into the conv graph: each
    # rank's graph is rebuilt for its 20 rows, and the losses are one process's.
    one = check(tmpi("wrap", "-n", "1", ERRORS, "fixed_batch"))
    two = check(tmpi("wrap", "-n", "2", ERRORS, "fixed_batch"))
    losses = [float(v) for v in re.findall(r"^loss (\S+)$", one.stdout, re.M)]
    assert len(losses) == 3
    assert_close([float(v) for v in re.findall(r"^loss (\S+)$", two.stdout, re.M)], losses,
                 1e-6)


@pytest.mark.mpi
def test_updates_never_compiled_into_a_function_is_warned_once_and_succeeds():
    result = check(tmpi("wrap", "-n", "2", ERRORS, "no_training"))
    assert "built updates with lasagne.updates.momentum but compiled no" in result.stderr
    assert result.stderr.count("lasagne.updates.momentum") == 1


def test_missing_lasagne_says_what_to_install(tmp_path):
    # A stand-in package that fails to import, as when Lasagne is absent.
    (tmp_path / "lasagne").mkdir()
    (tmp_path / "lasagne" / "__init__.py").write_text(
        "raise ImportError('No module named lasagne')\n")
    env = rank_env(PYTHONPATH=str(tmp_path))
    result = tmpi("wrap", "--framework", "lasagne", EXAMPLES / "theano_mlp" / "train.py",
                  env=env)
    assert result.returncode != 0
    assert re.search(r"--framework lasagne needs Lasagne.*pip install lasagne==0.1",
                     result.stderr), result.stderr
    assert "Traceback" not in result.stderr


def lasagne_version():
    """The version of the Lasagne the scripts import (a development tree on
    PYTHONPATH included)."""
    import importlib.util
    spec = importlib.util.find_spec("lasagne")
    if spec is None or not spec.origin:
        return (0, 0)
    text = open(spec.origin).read()
    found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", text)
    if found is None:
        from importlib.metadata import version
        return tuple(int(p) for p in re.findall(r"\d+", version("Lasagne"))[:2])
    return tuple(int(p) for p in re.findall(r"\d+", found.group(1))[:2])


@pytest.mark.mpi
@pytest.mark.skipif(lasagne_version() < (0, 2),
                    reason="BatchNormLayer arrived after Lasagne 0.1 (PyPI has only 0.1)")
def test_batchnorm_is_the_one_process_batchnorm():
    one = check(tmpi("wrap", "-n", "1", SCRIPTS / "lasagne_batchnorm.py"))
    for n in (2, 3):
        result = check(tmpi("wrap", "-n", str(n), "--all-ranks-output",
                            SCRIPTS / "lasagne_batchnorm.py"))
        outputs = rank_outputs(result.stdout)
        # The batch's mean and variance are the whole batch's (collectives in
        # the step), and so are the running averages Lasagne keeps through
        # default_update: every parameter is the one-process parameter.
        assert_close(final_numbers(outputs[0], "norms"), final_numbers(one.stdout, "norms"),
                     1e-10)
        assert final_numbers(outputs[0], "norms") == final_numbers(outputs[n - 1], "norms")
        assert "where the batch's rows meet" in outputs[0]


@pytest.mark.mpi
def test_recurrent_layers_distribute_their_rows_exactly():
    """A bidirectional RecurrentLayer precomputes its input over every step:
    (T, B, 2) merged to (T*B, 2), a window of each step on every rank, not a
    gather: 2 and 3 ranks give the one-process loss with one collective a step."""
    from tmpi_adapters.bench import scripts
    script = Path(scripts.__file__).parent / "lasagne_rnn.py"
    args = ["--steps", "3", "--batch-size", "12", "--length", "6", "--units", "5"]
    env = rank_env("float64")
    env["THEANO_FLAGS"] += ",cxx="
    one = check(tmpi("wrap", "-n", "1", "--framework", "lasagne", script, *args, env=env))
    for n in (2, 3):
        result = check(tmpi("wrap", "-n", str(n), "--framework", "lasagne", script, *args,
                            env=env))
        assert_close(final_numbers(result.stdout, "loss"),
                     final_numbers(one.stdout, "loss"), 1e-10)
        assert "1 collective per step" in result.stdout + result.stderr, result.stderr[-1500:]
