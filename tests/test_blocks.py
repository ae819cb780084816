"""The Blocks adapter: its Blocks-free parts everywhere, real Blocks runs where Blocks is.

Blocks is not on PyPI, so CI has none: the tests that run a Blocks script skip
there with the reason below; detection, the extension's argument checking, the
arithmetic of monitoring shares and the missing-Blocks error are tested anyway.
"""
import importlib.util
import sys

import numpy as np
import pytest

from conftest import SCRIPTS, assert_close, check, final_numbers, mpiexec, run, tmpi
from tmpi_adapters.core.batches import batch_rows
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.frameworks import blocks as adapter
from tmpi_adapters.frameworks.blocks.functions import batch_digest
from tmpi_adapters.frameworks.blocks.monitoring import scale_share, share_fraction

HAVE_BLOCKS = all(importlib.util.find_spec(m) is not None for m in ("blocks", "fuel"))
needs_blocks = pytest.mark.skipif(not HAVE_BLOCKS, reason=(
    "Blocks is not installable from PyPI; install it from its repository to run these tests"))

MNIST = SCRIPTS / "blocks_mnist.py"
EXTENSION = SCRIPTS / "blocks_mnist_extension.py"
KEYS = ("train_cost", "train_error_rate", "train_example_cost",
        "train_total_gradient_norm", "valid_cost", "valid_error_rate", "valid_example_cost",
        "param_norms")


def numbers(result):
    """Every logged monitoring value and the final parameter norms of a run."""
    values = []
    for key in KEYS:
        found = final_numbers(result.stdout, key)
        assert found, key
        values += found
    return values


# ----------------------------------------------------------- without Blocks

def test_detection_prefers_blocks_and_registers_the_adapter():
    from tmpi_adapters.pluginmanager import available, get_plugin_manager
    hook = get_plugin_manager().hook.tmpi_detect_framework
    blocks_script = "import theano\nfrom blocks.main_loop import MainLoop\n"
    assert hook(source=blocks_script, path="train.py") == "blocks"
    assert hook(source="import theano.tensor as T\n", path="train.py") == "theano"
    assert hook(source="import blocksworld\n", path="train.py") != "blocks"
    assert available("frameworks")["blocks"] is adapter.BlocksAdapter


@pytest.mark.parametrize("kwargs,message", [
    ({"rule": "hogwild"}, "unknown rule 'hogwild'. Installed rules: "),
    ({"rule": 3}, "must be a rule name such as 'bsp'"),
    ({"rule_options": {"period": 0}}, "period=0 must be > 0"),
    ({"rule_options": {"tau": 2}}, "rule 'bsp' has no option 'tau'"),
    ({"rule_options": "tau=2"}, "must be a dict such as {'tau': 4}"),
    ({"scaling": "diagonal"}, "--scaling must be one of strong, weak"),
    ({"framework": "keras"}, "unknown option(s) framework"),
    ({"learning_rate": 0.1}, "unknown option(s) learning_rate"),
])
def test_extension_rejects_bad_arguments_clearly(kwargs, message):
    with pytest.raises(TmpiError) as error:
        adapter.Distributed(**kwargs)
    assert message in str(error.value)


def test_extension_needs_neither_blocks_nor_theano_to_be_created():
    code = ("import pickle, sys\n"
            "import tmpi_adapters as tmpi\n"
            "ext = tmpi.blocks.Distributed(rule='bsp', rule_options={'mode': 'avg'}, seed=4)\n"
            "assert 'blocks' not in sys.modules and 'theano' not in sys.modules\n"
            "ext = pickle.loads(pickle.dumps(ext))\n"
            "print(ext.name, ext.options.rule, ext.options.rule_options, ext.options.seed,\n"
            "      ext.options.framework)\n")
    result = check(run([sys.executable, "-c", code]))
    assert result.stdout.split() == ["Distributed", "bsp", "{'mode':", "'avg'}", "4", "blocks"]


def test_monitoring_shares_sum_to_the_one_process_value():
    # One batch of 7 rows split 3/4 over two ranks, as tmpi splits it.
    rng = np.random.RandomState(0)
    per_row = rng.rand(7)
    rows = [per_row[:3], per_row[3:]]
    old = np.float64(2.5)  # what the accumulator held before this batch
    cases = [
        # (additive, extensive, what one process adds/keeps, what a rank computes)
        (True, False, per_row.mean(), [r.mean() for r in rows]),     # Mean(cost, 1)
        (True, True, per_row.sum(), [r.sum() for r in rows]),        # mean(total, rows)
        (False, False, per_row.mean(), [r.mean() for r in rows]),    # TakeLast(cost)
    ]
    for additive, extensive, whole, parts in cases:
        shares = []
        for rank, part in enumerate(parts):
            before = old / 2  # each rank holds a share of the old value
            new = before + part if additive else part
            fraction = share_fraction(7, len(rows[rank]))
            shares.append(scale_share(before, new, fraction, True, additive, extensive))
        expected = old + whole if additive else whole
        assert abs(sum(shares) - expected) < 1e-12, (additive, extensive)
    # A rank that only ran a padding row adds nothing.
    padding = scale_share(old, old + 9.0, 0.0, False, True, True)
    assert padding == old


def test_batch_helpers():
    batch = {"features": np.zeros((5, 3)), "targets": np.zeros((5, 1)), "lr": np.float64(1)}
    assert batch_rows(batch.values()) == 5
    assert batch_rows([np.float64(1)]) is None
    one = batch_digest([np.arange(6).reshape(3, 2)], {})
    assert one == batch_digest([np.arange(6).reshape(3, 2)], {})
    assert one != batch_digest([np.arange(6).reshape(2, 3)], {})


@pytest.mark.skipif(HAVE_BLOCKS, reason="needs an environment without Blocks")
def test_missing_blocks_is_one_clear_error():
    result = tmpi("wrap", MNIST)  # detected as a Blocks script from its imports
    assert result.returncode != 0
    assert "the Blocks adapter needs Blocks" in result.stderr, result.stderr
    assert "install it from its repository" in result.stderr
    assert "Traceback" not in result.stderr


# ----------------------------------------------------------- with real Blocks

@pytest.fixture(scope="module")
def momentum_one_rank():
    return numbers(check(tmpi("wrap", "-n", "1", MNIST, "--epochs", "2")))


@needs_blocks
@pytest.mark.mpi
def test_two_ranks_match_one_rank_with_momentum(momentum_one_rank, tmp_path):
    path = tmp_path / "checkpoint.tar"
    result = check(tmpi("wrap", "-n", "2", "--framework", "blocks", "--rule", "bsp", MNIST,
                        "--epochs", "2", "--checkpoint", path))
    two = numbers(result)
    # Parameters, TrainingDataMonitoring and DataStreamMonitoring, per epoch.
    assert_close(two, momentum_one_rank, 1e-8)
    # One voice: Printing ran on rank 0 only; Checkpoint wrote rank 0's loop.
    assert result.stdout.count("TRAINING HAS BEEN FINISHED") == 1
    assert result.stdout.count("BEFORE FIRST EPOCH") == 1
    code = ("import sys, numpy as np\n"
            "import tmpi_adapters\n"
            "from blocks.serialization import load, load_parameters\n"
            "values = load_parameters(open(sys.argv[1], 'rb'))\n"
            "print(sorted(values))\n"
            "print(' '.join('%.17g' % np.linalg.norm(values[k]) for k in sys.argv[2:]))\n"
            "print(type(load(open(sys.argv[1], 'rb')).algorithm._function).__name__)\n")
    names = ["/mlp/linear_0.W", "/mlp/linear_0.b", "/mlp/linear_1.W", "/mlp/linear_1.b"]
    saved = check(run([sys.executable, "-c", code, path] + names)).stdout.splitlines()
    assert saved[0] == repr(sorted(names))
    norms = [float(v) for v in saved[1].split()]
    assert_close(sorted(norms), sorted(final_numbers(result.stdout, "param_norms")), 1e-12)
    # The pickled main loop compiles its training function again when resumed.
    assert saved[2] == "LazyTrainingFunction"


@needs_blocks
@pytest.mark.mpi
def test_three_ranks_uneven_shares_match_one_rank_with_scale():
    # Batches of 50 rows split 16/17/17 over 3 ranks; 97 validation rows in the
    # last validation batch.
    args = [MNIST, "--epochs", "2", "--step-rule", "scale", "--batch-size", "50"]
    one = numbers(check(tmpi("wrap", "-n", "1", *args)))
    three = numbers(check(tmpi("wrap", "-n", "3", *args)))
    assert_close(three, one, 1e-8)


@needs_blocks
@pytest.mark.mpi
def test_extension_under_mpiexec_matches_one_rank(momentum_one_rank):
    result = check(mpiexec(2, sys.executable, EXTENSION, "--epochs", "2"))
    assert_close(numbers(result), momentum_one_rank, 1e-8)
    assert result.stdout.count("TRAINING HAS BEEN FINISHED") == 1
    assert "on 2 rank(s)" in result.stdout


@needs_blocks
@pytest.mark.mpi
def test_a_finish_request_on_one_rank_stops_every_rank():
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output", MNIST,
                        "--finish-on-rank", "1", "5"))
    assert "[rank 0] final iterations 5" in result.stdout
    assert "[rank 1] final iterations 5" in result.stdout


@needs_blocks
@pytest.mark.mpi
def test_ranks_reading_different_batches_is_a_clear_error():
    result = tmpi("wrap", "-n", "2", MNIST, "--rank-dependent-shuffle")
    assert result.returncode != 0
    assert "the first training batch differs between ranks" in result.stderr
    assert "Original exception" not in result.stderr and "Traceback" not in result.stderr
