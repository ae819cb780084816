"""Testing a rule plugin with real ranks and real Theano.

A rule's tests start ``mpiexec`` and ``tmpi`` as a user would, and the ranks
check themselves: each runs a *driver* script that trains a tiny model and
compares every rank's parameters with a numpy re-computation of the rule
(``plugins/tmpi-plugin-gosgd/tests`` is the example to copy).  Nothing here
is mocked.

In the pytest module
    :func:`mpiexec` runs a driver on N ranks, :func:`train_mlp` trains the
    repository's MLP example with ``tmpi wrap`` (read its accuracy with
    :func:`val_accuracy`), :func:`held_back` checks that no rank waits for
    another, :func:`rejected_rule_option` checks that a bad knob
    is a clear error, :func:`listed_plugin` reads ``tmpi plugins``;
    :func:`tmpi` and :func:`run` run anything else.
In the driver (every rank)
    :func:`run_checks` is its ``main``; the least-squares problem
    (:data:`INITIAL`, :data:`LR`, :func:`batch`, :func:`rows_of`,
    :func:`gradient`, :func:`loss`, :func:`build_least_squares`,
    :func:`parameters`) is what the checks train and re-compute;
    :func:`check` compares, :func:`wait_for` lets a rank wait for a message.

Theano runs in pure Python throughout (``cxx=``, and no elemwise fusion,
which Python would evaluate element by element): the models are small, and
the ranks then never queue on the lock of the compile cache that every Theano
process on the machine shares.
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

#: The directory of the running Python, where ``tmpi`` and ``mpiexec`` are.
BIN = Path(sys.executable).parent
#: Seconds one command may take: a hang fails the test instead of stalling CI.
TIMEOUT = 900
#: The plain Theano MLP example of the tmpi repository (absent where
#: tmpi_adapters is installed without the repository).
MLP_EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "theano_mlp" / "train.py"


# -- in the pytest module ---------------------------------------------------------------

def run(*command, floatx="float64", env=None):
    """Run ``command`` (strings or paths) under pure-Python Theano.

    ``TMPI_OPTIONS`` of the calling process is dropped, so the command sees
    only the options it is given; ``env`` adds variables.  Returns the
    :class:`subprocess.CompletedProcess`, with text ``stdout`` and ``stderr``.
    """
    environment = dict(os.environ)
    environment.pop("TMPI_OPTIONS", None)
    flags = [f for f in environment.get("THEANO_FLAGS", "").split(",")
             if f and "floatX" not in f]
    environment["THEANO_FLAGS"] = ",".join(flags + ["floatX=" + floatx, "blas.ldflags=",
                                                    "cxx=", "optimizer_excluding=fusion"])
    environment.update(env or {})
    return subprocess.run([str(c) for c in command], env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)


def tmpi(*args, **kwargs):
    """``tmpi ARGS...`` through :func:`run` (same keywords)."""
    return run(BIN / "tmpi", *args, **kwargs)


def succeeded(result):
    """Assert that ``result`` exited 0, showing the ends of its output when
    not; returns its stdout."""
    assert result.returncode == 0, "exit %d\n--- stdout\n%s\n--- stderr\n%s" % (
        result.returncode, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def mpiexec(script, *args, ranks=3):
    """Run ``python SCRIPT ARGS...`` on ``ranks`` ranks under real ``mpiexec``;
    asserts that the job succeeded and returns its stdout."""
    return succeeded(run(BIN / "mpiexec", "-n", ranks, sys.executable, script, *args))


def mlp_example():
    """:data:`MLP_EXAMPLE`; skips the calling test where it is not there."""
    if not MLP_EXAMPLE.exists():
        import pytest
        pytest.skip("the tmpi repository's examples/ are not beside tmpi_adapters")
    return MLP_EXAMPLE


def train_mlp(rule, ranks, rule_options=(), epochs=6):
    """Train the MLP example (float32) with ``tmpi wrap -n RANKS --rule RULE``.

    ``rule_options`` are ``"name=value"`` texts, each passed as
    ``--rule-option``.  Asserts that the run succeeded and returns its stdout;
    skips where the example is not there.
    """
    options = [a for o in rule_options for a in ("--rule-option", o)]
    return succeeded(tmpi("wrap", "-n", ranks, "--seed", "1", "--rule", rule, *options,
                          mlp_example(), "--epochs", epochs, floatx="float32"))


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


def listed_plugin(distribution):
    """The row of ``tmpi plugins --json`` for ``distribution``: a dict with
    ``provides``, ``hooks``, ...; asserts that there is one."""
    rows = json.loads(succeeded(tmpi("plugins", "--json")))
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


def held_back(rule, rule_options=(), stall_timeout=10):
    """Run :data:`HELD_BACK_SCRIPT` with ``tmpi wrap -n 2 --outputs local --rule RULE``.

    Under a rule whose ranks never wait for each other while training, the
    job ends normally and rank 0 prints ``rank 0 took 30 steps while rank 1
    was held at its third``.  Under a synchronous rule rank 0 waits in its
    third step; after ``stall_timeout`` seconds the stall is reported and the
    job ends with exit status 4 (``--on-stall abort``).  Returns the
    :class:`subprocess.CompletedProcess`.
    """
    options = [a for o in rule_options for a in ("--rule-option", o)]
    with tempfile.TemporaryDirectory() as directory:
        script = Path(directory) / "held_back.py"
        script.write_text(HELD_BACK_SCRIPT)
        return tmpi("wrap", "-n", "2", "--outputs", "local", "--stall-timeout", stall_timeout,
                    "--on-stall", "abort", "--rule", rule, *options, script, Path(directory) / "released")


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


def run_checks(rule, mode, checks, rule_options=None):
    """A driver's ``main``: run ``checks[mode](session)`` on this rank.

    The session trains with ``rule`` and ``rule_options`` (texts, as on the
    command line), ``seed=7`` and a 300 s stall timeout, and prints no
    summary.  A failing check prints ``rank R: Error: message`` and ends the
    whole job, so that the other ranks are not left waiting; when every check
    held, rank 0 prints ``RULE MODE OK on N ranks``, the line the test looks
    for.
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
        print("%s %s OK on %d ranks" % (rule, mode, session.size), flush=True)
