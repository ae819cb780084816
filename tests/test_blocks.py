"""The Blocks adapter: its Blocks-free parts everywhere, real Blocks runs where Blocks is.

Blocks is not on PyPI, so CI has none: the tests that run a Blocks script skip
there with the reason below; detection, the extension's argument checking, the
arithmetic of monitoring shares and the missing-Blocks error are tested anyway.
"""
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, SCRIPTS, assert_close, check, final_numbers, mpiexec, run, tmpi
from tmpi_adapters.core.batches import batch_rows
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.frameworks import blocks as adapter
from tmpi_adapters.frameworks.blocks.functions import batch_digest
from tmpi_adapters.frameworks.blocks.monitoring import scale_share, share_fraction

HAVE_BLOCKS = all(importlib.util.find_spec(m) is not None for m in ("blocks", "fuel"))
needs_blocks = pytest.mark.skipif(not HAVE_BLOCKS, reason=(
    "Blocks is not on PyPI; `make blocks BLOCKS_SRC=path/to/blocks` installs it from a "
    "clone of its repository (docs/blocks.md) to run these tests"))

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


# ----------------------------------------------------------- installing Blocks

#: Where docs/blocks.md's commands put a clone of Blocks' repository.
BLOCKS_PLACEHOLDER = "path/to/blocks"


def commands(text):
    """The shell commands of ``text``, each as its words (continued lines joined)."""
    found = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        try:
            words = shlex.split(line)
        except ValueError:
            continue  # not one command of its own (make's view of a shell loop)
        if words:
            found.append(words)
    return found


def docs_install_commands():
    """The commands docs/blocks.md says `make blocks` runs, as words."""
    page = (ROOT / "docs" / "blocks.md").read_text()
    section = page.split("## Installing Blocks", 1)[1].split("\n## ", 1)[0]
    shown = [block for block in re.findall(r"```\n(.*?)```", section, re.S)
             if "drop_ext_modules.py" in block]
    assert len(shown) == 1, "docs/blocks.md shows no block of the commands make blocks runs"
    assert "make blocks BLOCKS_SRC=%s" % BLOCKS_PLACEHOLDER in section
    return commands(shown[0])


def with_blocks_at(words, path):
    return [str(path) if word == BLOCKS_PLACEHOLDER else word for word in words]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_blocks_runs_the_commands_the_docs_show(tmp_path):
    source = tmp_path / "blocks"  # `make -n` runs nothing: it needs no Blocks
    # --no-print-directory: under `make test` this make is a sub-make, which
    # would otherwise print "make[1]: Entering directory" lines among the commands.
    printed = subprocess.run(["make", "-n", "--no-print-directory", "blocks", "VENV=.venv",
                              "BLOCKS_SRC=%s" % source],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    made = commands(printed.stdout)
    shown = docs_install_commands()
    assert any("-c" in words and BLOCKS_PLACEHOLDER in words for words in shown), shown
    for words in shown:
        assert with_blocks_at(words, source) in made, (
            "docs/blocks.md shows a command make blocks does not run:\n  %s\nmake -n "
            "prints:\n%s" % (shlex.join(words), printed.stdout))
    # ... and in make's order, the install last.
    positions = [made.index(with_blocks_at(words, source)) for words in shown]
    assert positions == sorted(positions) and made[-1] == with_blocks_at(shown[-1], source)


def test_dropping_ext_modules_cuts_the_whole_argument(tmp_path):
    # Shaped as Fuel 0.2.0's: the last argument, over three lines, no comma after it.
    setup = tmp_path / "setup.py"
    setup.write_text("from setuptools import setup\nfrom distutils.extension import Extension\n"
                     "setup(\n    name='package',\n    entry_points={'a': ['b = c:d']},\n"
                     "    ext_modules=[Extension('package._x',\n"
                     "                           ['package/_x.c'],\n"
                     "                           extra_compile_args=['-O2'])]\n)\n")
    tool = [sys.executable, ROOT / "tools" / "drop_ext_modules.py", setup]
    check(run(tool))
    assert setup.read_text() == ("from setuptools import setup\nfrom distutils.extension "
                                 "import Extension\nsetup(\n    name='package',\n"
                                 "    entry_points={'a': ['b = c:d']},\n)\n")
    again = run(tool)  # nothing left to drop: said, and the file is left alone
    assert again.returncode != 0 and "passes no ext_modules argument" in again.stderr
    setup.write_text("setup(ext_modules=[x], name='p', ext_modules=y)\nsetup(\n")
    broken = run(tool)
    assert broken.returncode != 0 and "drop_ext_modules:" in broken.stderr
    assert "Traceback" not in broken.stderr


BLOCKS_SRC = os.environ.get("BLOCKS_SRC")


@pytest.mark.skipif(not BLOCKS_SRC, reason=(
    "set BLOCKS_SRC to a clone of Blocks' repository to run docs/blocks.md's install "
    "commands (they download Fuel 0.2.0 from PyPI)"))
def test_the_docs_commands_give_a_fuel_that_installs(tmp_path):
    source = os.path.abspath(BLOCKS_SRC)
    assert "name='blocks'" in open(os.path.join(source, "setup.py")).read(), (
        "BLOCKS_SRC=%s is not a clone of Blocks' repository" % BLOCKS_SRC)
    # Fuel's steps as the page shows them, into this test's own directory;
    # the install itself is `make blocks`, which this venv may not want.
    build = tmp_path / "fuel"
    for words in docs_install_commands():
        if words[:2] == ["rm", "-rf"] or "install" in words:
            continue
        words = [sys.executable if word == ".venv/bin/python" else
                 word.replace("build/fuel", str(build)) for word in words]
        check(run(words))
    setup = build / "fuel-0.2.0" / "setup.py"
    text = setup.read_text()
    assert "ext_modules" not in text and "name='fuel'" in text
    check(run([sys.executable, "-m", "py_compile", setup]))
    check(run([sys.executable, setup, "--version"], cwd=setup.parent))


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
