"""Testing tmpi and its rule plugins with real ranks and real Theano.

This module is the one place where tests start ``tmpi`` and ``mpiexec``.  A
rule's tests run them as a user would, and the ranks check themselves: each
runs a *driver* script that trains a tiny model and compares every rank's
parameters with a numpy re-computation of the rule
(``plugins/tmpi-plugin-gosgd/tests`` is the example to copy).  Nothing here
is mocked.

In the pytest module
    :class:`RuleConformance` holds what every rule plugin must pass (listed by
    ``tmpi plugins``, clear errors for bad knobs, the MLP example trained on
    2 and on 4 oversubscribed ranks, no waiting where the rule says so): a
    plugin's test module subclasses it and sets a few attributes.
    :func:`run_driver` runs a driver's checks on N ranks (:func:`mpiexec`
    any script), :func:`train_mlp` trains the repository's MLP example with
    ``tmpi wrap`` (read its accuracy with :func:`val_accuracy`),
    :func:`held_back` checks that no rank waits for another,
    :func:`rejected_rule_option` and :func:`refused_on_ranks` check that a
    bad knob is a clear error, :func:`listed_plugin` reads ``tmpi plugins``;
    :func:`tmpi`, :func:`run_ranks`, :func:`run` and :func:`run_in` run anything else, and
    :func:`succeeded`, :func:`final_numbers` and :func:`assert_close` read
    what it printed.
In the driver (every rank)
    :func:`run_checks` is its ``main``; the least-squares problem
    (:data:`INITIAL`, :data:`LR`, :func:`batch`, :func:`rows_of`,
    :func:`gradient`, :func:`loss`, :func:`build_least_squares`,
    :func:`parameters`) is what the checks train and re-compute;
    :func:`check` compares, :func:`wait_for` lets a rank wait for a message.

Theano runs in pure Python unless asked otherwise (``cxx=``, and no elemwise
fusion, which Python would evaluate element by element): the models are
small, and the ranks then never queue on the lock of the compile cache that
every Theano process on the machine shares.
"""
from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from tmpi_adapters.launch.launcher import RANK_HASH_SEED

try:
    import pytest
except ImportError:  # a driver's ranks run no tests
    pytest = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from collections.abc import Sequence

#: The directory of the running Python, where ``tmpi`` and ``mpiexec`` are.
BIN = Path(sys.executable).parent
#: Seconds one command may take: a hang fails the test instead of stalling CI.
TIMEOUT = 600
#: The plain Theano MLP example of the tmpi repository (absent where
#: tmpi_adapters is installed without the repository).
MLP_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "theano_mlp" / "train.py"
#: Theano's default name of its compile cache directory.
COMPILEDIR_FORMAT = ("compiledir_%(short_platform)s-%(processor)s-%(python_version)s-"
                     "%(python_bitwidth)s")
#: Flags that make Theano run in pure Python (see the module's docstring).
PURE_PYTHON_FLAGS = ["cxx=", "optimizer_excluding=fusion"]


# -- in the pytest module: running commands -----------------------------------------

def environment(floatx="float64", pure_python=True, **extra):
    """The environment of a command a test runs.

    The caller's ``THEANO_FLAGS`` are kept but for ``floatX``, which becomes
    ``floatx``; BLAS is not linked (``blas.ldflags=``) and, with
    ``pure_python``, Theano compiles no C.  ``TMPI_OPTIONS`` is dropped, so
    the command sees only the options it is given.  Every command gets the
    same ``PYTHONHASHSEED`` and, under pytest-xdist, its worker's own Theano
    compile cache (see the comments below).  ``extra`` adds variables
    (values made text).
    """
    env = dict(os.environ)
    env.pop("TMPI_OPTIONS", None)
    flags = [f for f in env.get("THEANO_FLAGS", "").split(",") if f and "floatX" not in f]
    flags += ["floatX=" + floatx, "blas.ldflags="] + (PURE_PYTHON_FLAGS if pure_python else [])
    env["THEANO_FLAGS"] = ",".join(flags)
    # The ranks' string hash for every process of the suite, plain python and
    # one rank too: Theano's compile cache keys hash strings, so with a hash
    # per process every process misses the key, takes the machine-wide
    # compile lock to add it, and queues.
    env["PYTHONHASHSEED"] = RANK_HASH_SEED
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and "compiledir_format" not in env["THEANO_FLAGS"]:
        # A compile cache per pytest-xdist worker: each cache's lock lets one
        # compilation through at a time, so one cache left a worker waiting.
        env["THEANO_FLAGS"] += ",compiledir_format=" + COMPILEDIR_FORMAT + "-" + worker
    env.update({key: str(value) for key, value in extra.items()})
    return env


def run(*command, floatx="float64", env=None, pure_python=True, timeout=TIMEOUT, cwd=None):
    """Run ``command`` (strings or paths) in :func:`environment`.

    ``env`` adds variables to it.  Returns the
    :class:`subprocess.CompletedProcess`, with text ``stdout`` and ``stderr``;
    a command still running after ``timeout`` seconds fails the test.
    """
    environ = environment(floatx, pure_python)
    environ.update({key: str(value) for key, value in (env or {}).items()})
    return run_in(environ, *command, timeout=timeout, cwd=cwd)


def run_in(environ, *command, timeout=TIMEOUT, cwd=None):
    """Run ``command`` (strings or paths) in exactly the environment
    ``environ``; what :func:`run` returns."""
    return subprocess.run([str(c) for c in command], env=environ, cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def tmpi(*args, **kwargs):
    """``tmpi ARGS...`` through :func:`run` (same keywords)."""
    return run(BIN / "tmpi", *args, **kwargs)


def run_ranks(ranks, *command, **kwargs):
    """``mpiexec -n RANKS COMMAND...`` (the installed MPI's) through :func:`run`."""
    return run(BIN / "mpiexec", "-n", ranks, *command, **kwargs)


def succeeded(result):
    """Assert that ``result`` exited 0, showing the ends of its output when
    not; returns its stdout."""
    assert result.returncode == 0, "exit %d\n--- stdout\n%s\n--- stderr\n%s" % (
        result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def mpiexec(script, *args, ranks=3):
    """Run ``python SCRIPT ARGS...`` on ``ranks`` ranks under real ``mpiexec``;
    asserts that the job succeeded and returns its stdout."""
    return succeeded(run_ranks(ranks, sys.executable, script, *args))


def run_driver(driver, rule, mode, ranks=3):
    """Run ``python DRIVER MODE`` on ``ranks`` ranks (:func:`mpiexec`) and
    assert that every check of :func:`run_checks` held: rank 0 printed
    :data:`CHECKS_HELD`.  Returns the stdout."""
    stdout = mpiexec(driver, mode, ranks=ranks)
    assert CHECKS_HELD % (rule, mode, ranks) in stdout, stdout[-3000:]
    return stdout


def final_numbers(stdout, key):
    """The decimal numbers (``1.5``, ``2.0e-3``, ``nan``) on the last line of
    ``stdout`` that starts with ``final KEY``."""
    lines = [line for line in stdout.splitlines() if line.startswith("final %s" % key)]
    assert lines, "no 'final %s' line in output:\n%s" % (key, stdout[-3000:])
    return [float(v) for v in re.findall(r"[-+]?\d+\.\d+(?:e[-+]?\d+)?|nan|inf", lines[-1])]


def assert_close(actual, expected, rtol):
    """Assert that two lists of numbers agree to ``rtol``, relative to the larger."""
    assert len(actual) == len(expected), (actual, expected)
    for a, b in zip(actual, expected):
        assert abs(a - b) <= rtol * max(abs(a), abs(b), 1e-300), (actual, expected)


# -- in the pytest module: a rule's behaviour ---------------------------------------

def rule_option_arguments(rule_options):
    """``["tau=2"]`` -> ``["--rule-option", "tau=2"]``."""
    return [a for o in rule_options for a in ("--rule-option", o)]


def mlp_example():
    """:data:`MLP_EXAMPLE`; skips the calling test where it is not there."""
    if not MLP_EXAMPLE.exists():
        pytest.skip("the tmpi repository's examples/ are not beside tmpi_adapters")
    return MLP_EXAMPLE


def train_mlp(rule, ranks, rule_options=(), epochs=6):
    """Train the MLP example (float32) with ``tmpi wrap -n RANKS --rule RULE``.

    ``rule_options`` are ``"name=value"`` texts, each passed as
    ``--rule-option``.  Asserts that the run succeeded and returns its stdout;
    skips where the example is not there.
    """
    return succeeded(tmpi("wrap", "-n", ranks, "--seed", "1", "--rule", rule,
                          *rule_option_arguments(rule_options), mlp_example(),
                          "--epochs", epochs, floatx="float32"))


def val_accuracy(stdout):
    """The last ``final val_loss L val_acc A`` line of the MLP example -> A."""
    found = re.findall(r"^final val_loss \S+ val_acc (\S+)", stdout, re.M)
    assert found, stdout[-3000:]
    return float(found[-1])


def rejected_rule_option(rule, option, script, *args):
    """Run ``tmpi wrap -n 2 --rule RULE --rule-option OPTION SCRIPT ARGS...``
    and assert that it is refused before any rank starts: exit status 2, a
    ``tmpi: error: rule 'RULE'`` line and no traceback.  Returns the stderr,
    for the test to look for the words that name the problem.

    ``SCRIPT`` never runs (a driver will do); the command names the framework
    (``--framework theano``), so that what the script imports does not matter.
    """
    result = tmpi("wrap", "-n", "2", "--framework", "theano", "--rule", rule,
                  "--rule-option", option, script, *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tmpi: error: rule '%s'" % rule in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


def refused_on_ranks(rule, rule_options, ranks=2):
    """Run the MLP example with ``tmpi wrap -n RANKS --rule RULE`` and
    ``rule_options`` that the rule refuses once it knows the ranks (a
    combination of knobs no single knob's check sees); assert that the job
    fails without a traceback.  Returns the stderr, for the test to look for
    the words that name the problem."""
    result = tmpi("wrap", "-n", ranks, "--rule", rule, *rule_option_arguments(rule_options),
                  mlp_example(), "--epochs", "1")
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result.stderr


@functools.lru_cache(maxsize=None)
def _plugin_rows():
    return json.loads(succeeded(tmpi("plugins", "--json")))


def listed_plugin(distribution):
    """The row of ``tmpi plugins --json`` for ``distribution``: a dict with
    ``provides``, ``hooks``, ...; asserts that there is one.  (``tmpi
    plugins`` runs once per test session.)"""
    rows = _plugin_rows()
    mine = [r for r in rows if r["distribution"] == distribution]
    assert mine, rows
    return mine[0]


#: A plain Theano script whose rank 1 is held at its third step until rank 0
#: has taken all of its steps: it ends only where no step waits for another rank.
HELD_BACK_SCRIPT = """\
import os, sys, time
import numpy as np
import theano
import theano.tensor as T
from mpi4py import MPI

rank, flag, steps = MPI.COMM_WORLD.Get_rank(), sys.argv[1], 30
x = T.matrix("x")
W = theano.shared(np.zeros((3, 2)), name="W")
loss = T.sqr(T.dot(x, W) - 1).mean()
train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
for step in range(steps):
    while rank == 1 and step == 2 and not os.path.exists(flag):
        time.sleep(0.01)
    train(np.ones((4, 3)))
if rank == 0:
    print("rank 0 took %d steps while rank 1 was held at its third" % steps)
    open(flag, "w").close()
"""
#: What :data:`HELD_BACK_SCRIPT` prints when no rank waited for another.
NOT_HELD_BACK = "rank 0 took 30 steps while rank 1 was held at its third"


def held_back(rule, rule_options=(), stall_timeout=10):
    """Run :data:`HELD_BACK_SCRIPT` with ``tmpi wrap -n 2 --outputs local --rule RULE``.

    Under a rule whose ranks never wait for each other while training, the
    job ends normally and rank 0 prints :data:`NOT_HELD_BACK`.  Under a
    synchronous rule rank 0 waits in its third step; after ``stall_timeout``
    seconds the stall is reported and the job ends with exit status 4
    (``--on-stall abort``).  Returns the :class:`subprocess.CompletedProcess`.
    """
    with tempfile.TemporaryDirectory() as directory:
        script = Path(directory) / "held_back.py"
        script.write_text(HELD_BACK_SCRIPT)
        return tmpi("wrap", "-n", "2", "--outputs", "local", "--stall-timeout", stall_timeout,
                    "--on-stall", "abort", "--rule", rule, *rule_option_arguments(rule_options),
                    script, Path(directory) / "released")


def _mpi(test):
    """``@pytest.mark.mpi``: the test starts real ranks."""
    return pytest.mark.mpi(test) if pytest is not None else test


class RuleConformance:
    """What every rule plugin must pass, for pytest: subclass it in the
    plugin's test module and set the attributes.

    ::

        class TestGoSGD(RuleConformance):
            rule, distribution = "gosgd", "tmpi-plugin-gosgd"
            asynchronous = True
            oversubscribed_options = ["gossip_probability=0.25"]
            bad_options = [("gossip_probability=1.5", "must be in [0, 1]")]

    The tests marked ``mpi`` start real ranks.  The numerics of the rule (its
    updates against a hand computation) are the plugin's own tests.
    """

    #: The ``--rule`` name.
    rule: str | None = None
    #: Further ``--rule`` names of the same class (ASGD's ``downpour``); the
    #: oversubscribed run uses the first, so that it trains under each name.
    aliases: Sequence[str] = ()
    #: The distribution that provides the rule (``tmpi-plugin-gosgd``).
    distribution: str | None = None
    #: Knobs (``"name=value"``) of the 2-rank MLP run and the held-back run.
    rule_options: Sequence[str] = ()
    #: Whether, under :attr:`rule_options`, no rank ever waits for another
    #: while training (the held-back run must end normally); ``False``: a
    #: held-back rank stalls the others, and the stall must be reported.
    asynchronous = False
    #: ``(rule_options, asynchronous)`` of the rule's other form, held back too
    #: (EASGD's ``(["mode=async"], True)``); ``None`` when it has one form.
    other_form: tuple[Sequence[str], bool] | None = None
    #: The validation accuracy the MLP example must reach on 2 ranks.
    mlp_accuracy = 0.95
    #: Knobs of the run on 4 ranks, more than this machine's cores.
    oversubscribed_options: Sequence[str] = ()
    #: The validation accuracy the oversubscribed run must reach.
    oversubscribed_accuracy = 0.85
    #: ``(option, words)``: a bad knob value that ``tmpi wrap`` refuses before
    #: any rank starts, and words of the error (a text, or a tuple of texts).
    bad_options: Sequence[tuple[str, str | tuple[str, ...]]] = ()
    #: ``(options, words)``: knobs (a list) that the rule refuses once the
    #: ranks start (a combination no single knob's check sees), and words of
    #: the error.
    refused_options: Sequence[tuple[Sequence[str], str | tuple[str, ...]]] = ()

    def pytest_generate_tests(self, metafunc):
        """The parameters of the tests below, from the subclass's attributes."""
        if "bad_option" in metafunc.fixturenames:
            cases = [pytest.param((True, [option], words), id=option)
                     for option, words in self.bad_options]
            # A refusal on the ranks starts them.
            cases += [pytest.param((False, list(options), words), marks=pytest.mark.mpi,
                                   id=" ".join(options) + " on the ranks")
                      for options, words in self.refused_options]
            metafunc.parametrize("bad_option", cases)
        if "form" in metafunc.fixturenames:
            forms = [(list(self.rule_options), self.asynchronous)]
            if self.other_form is not None:
                forms.append((list(self.other_form[0]), self.other_form[1]))
            metafunc.parametrize("form", forms, ids=[
                " ".join(o + ["asynchronous" if a else "synchronous"]) for o, a in forms])

    def test_listed_by_tmpi_plugins(self):
        row = listed_plugin(self.distribution)
        names = sorted((self.rule,) + tuple(self.aliases))
        assert row["provides"] == ["rule:" + name for name in names], row
        assert "tmpi_rules" in row["hooks"], row

    def test_bad_knobs_are_clear_errors(self, bad_option, tmp_path):
        before_start, options, words = bad_option
        if before_start:
            script = tmp_path / "train.py"
            script.write_text("raise SystemExit('a refused run must not start its script')\n")
            stderr = rejected_rule_option(self.rule, options[0], script)
        else:
            stderr = refused_on_ranks(self.rule, options)
        for text in [words] if isinstance(words, str) else words:
            assert text in stderr, stderr

    def test_without_the_plugin_the_error_names_the_distribution(self, tmp_path):
        # With autoloading off the plugin is installed but not loaded: the
        # error says which distribution provides the rule.
        script = tmp_path / "train.py"
        script.write_text("raise SystemExit('never runs')\n")
        result = tmpi("wrap", "--framework", "theano", "--rule", self.rule, script,
                      env={"TMPI_DISABLE_PLUGIN_AUTOLOAD": "1"})
        assert result.returncode == 2, result.stdout + result.stderr
        assert "unknown rule '%s'" % self.rule in result.stderr, result.stderr
        assert "provided by %s " % self.distribution in result.stderr, result.stderr
        assert "TMPI_DISABLE_PLUGIN_AUTOLOAD is set" in result.stderr, result.stderr

    @_mpi
    def test_mlp_on_two_ranks_reaches_the_accuracy(self):
        stdout = train_mlp(self.rule, 2, self.rule_options)
        assert "on 2 rank(s)" in stdout, stdout[-2000:]
        assert val_accuracy(stdout) >= self.mlp_accuracy, stdout[-2000:]

    @_mpi
    def test_mlp_on_four_oversubscribed_ranks_trains_and_ends(self):
        # More ranks than cores: waits that only work when every rank has a
        # core of its own hang or stall here.
        rule = (tuple(self.aliases) or (self.rule,))[0]
        stdout = train_mlp(rule, 4, self.oversubscribed_options)
        assert "on 4 rank(s)" in stdout, stdout[-2000:]
        assert val_accuracy(stdout) >= self.oversubscribed_accuracy, stdout[-2000:]

    @_mpi
    def test_a_held_back_rank_holds_back_only_synchronous_rules(self, form):
        # Rank 1 is held at its third step until rank 0 has taken all its
        # steps (--outputs local: the steps' losses are not averaged across
        # ranks).
        options, asynchronous = form
        if asynchronous:
            assert NOT_HELD_BACK in succeeded(held_back(self.rule, options))
        else:
            result = held_back(self.rule, options, stall_timeout=3)
            assert result.returncode == 4, result.stdout + result.stderr
            assert "tmpi: stall:" in result.stderr, result.stderr
            assert "rank 1 has not reached it" in result.stderr, result.stderr


# -- in the driver: the least-squares problem -------------------------------------------

#: Learning rate of the model's plain SGD.
LR = 0.1
#: Rows of a global batch that each rank trains on.
ROWS_PER_RANK = 2
#: The weights the data come from.
TRUE_W = np.array([1.0, -2.0, 0.5])
#: The model's starting ``[w, b]`` (identical on every rank).
INITIAL = np.array([0.2, 0.1, -0.3, 0.05])


def batch(step, size):
    """The global batch ``(x, y)`` of ``step`` on ``size`` ranks: identical
    on every rank; ``x`` is (``ROWS_PER_RANK * size``, 3) float64."""
    rng = np.random.RandomState(1000 + step)
    x = rng.normal(size=(ROWS_PER_RANK * size, 3))
    return x, x.dot(TRUE_W) + 0.3 + 0.1 * rng.normal(size=len(x))


def rows_of(rank, x, y):
    """The rows tmpi hands ``rank`` of a global batch (contiguous, equal parts)."""
    lo, hi = ROWS_PER_RANK * rank, ROWS_PER_RANK * (rank + 1)
    return x[lo:hi], y[lo:hi]


def gradient(flat, x, y):
    """Gradient of ``0.5 * mean((x w + b - y)^2)`` at ``flat = [w, b]``."""
    residual = x.dot(flat[:3]) + flat[3] - y
    return np.append(x.T.dot(residual) / len(y), residual.mean())


def loss(flat, x, y):
    """``0.5 * mean((x w + b - y)^2)`` at ``flat = [w, b]``."""
    return 0.5 * np.mean((x.dot(flat[:3]) + flat[3] - y) ** 2)


def build_least_squares():
    """The least-squares model written the plain Theano way (float64, plain
    SGD at :data:`LR`, starting at :data:`INITIAL`).

    Returns ``(train, w, b)``: ``train(x, y)`` takes one step and returns
    nothing, so nothing is averaged across ranks per step and ranks may take
    different numbers of steps; ``w`` (3,) and ``b`` () are its shared
    variables.
    """
    import theano
    import theano.tensor as T
    w = theano.shared(INITIAL[:3].copy(), name="w")
    b = theano.shared(np.float64(INITIAL[3]), name="b")
    x, y = T.dmatrix("x"), T.dvector("y")
    cost = 0.5 * T.mean((T.dot(x, w) + b - y) ** 2)
    gw, gb = theano.grad(cost, [w, b])
    # Little to optimise in a model this small.
    train = theano.function([x, y], [], updates=[(w, w - LR * gw), (b, b - LR * gb)],
                            name="train", mode="FAST_COMPILE")
    return train, w, b


def parameters(w, b):
    """The model's ``[w, b]`` as one flat float64 array (4,)."""
    return np.append(w.get_value(), b.get_value())


# -- in the driver: checking ------------------------------------------------------------

def check(actual, expected, what, rtol=1e-10):
    """Assert that ``actual`` is close to ``expected``, naming ``what`` when not."""
    if not np.allclose(actual, expected, rtol=rtol, atol=1e-12):
        raise AssertionError("%s: got %r, expected %r" % (what, actual, expected))


def wait_for(condition, what, timeout=60.0):
    """Call ``condition()`` until it returns true (``rule.poll(model) > 0``:
    a message arrived and was handled); ``RuntimeError`` naming ``what``
    after ``timeout`` seconds."""
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise RuntimeError("timed out waiting for " + what)
        time.sleep(1e-4)


def pure_python_theano():
    """Make the Theano this process imports next run in pure Python (no C
    compiler, and no warning about it).  :func:`run_checks` calls it."""
    os.environ["THEANO_FLAGS"] = ",".join(
        flag for flag in (os.environ.get("THEANO_FLAGS", ""), "cxx=") if flag)
    warnings.filterwarnings("ignore", message=".*no c\\+\\+ compiler")


#: What rank 0 of a driver prints when every check held (rule, mode, ranks).
CHECKS_HELD = "%s %s OK on %d ranks"


def run_checks(rule, mode, checks, rule_options=None):
    """A driver's ``main``: run ``checks[mode](session)`` on this rank.

    The session trains with ``rule`` and ``rule_options`` (texts, as on the
    command line), ``seed=7`` and a 300 s stall timeout, and prints no
    summary.  A failing check prints ``rank R: Error: message`` and ends the
    whole job, so that the other ranks are not left waiting; when every check
    held, rank 0 prints :data:`CHECKS_HELD` (``RULE MODE OK on N ranks``), the
    line :func:`run_driver` looks for.
    """
    pure_python_theano()
    from tmpi_adapters.options import Options
    from tmpi_adapters.core.session import Session
    options = Options(rule=rule, seed=7, stall_timeout=300, summary=False,
                      rule_options=dict(rule_options or {}))
    session = Session(options).start()
    try:
        checks[mode](session)
    except BaseException as error:
        print("rank %d: %s: %s" % (session.rank, type(error).__name__, error), flush=True)
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)
    if session.rank == 0:
        print(CHECKS_HELD % (rule, mode, session.size), flush=True)
