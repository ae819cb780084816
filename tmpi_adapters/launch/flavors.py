"""The MPI launcher's own words: MPICH's hydra (also Intel MPI's) and Open
MPI's ``mpirun`` (PRRTE's ``prterun`` in Open MPI 5) take different options for
the same things, and behave differently where tmpi relies on them.

Open MPI, unlike hydra, refuses to start more ranks than a machine has cores
(its slots) and binds ranks to cores or packages itself, and will not run as
root unless told; ``tmpi wrap`` starts it the way it starts hydra: as many
ranks as asked (tmpi's own checks of memory and cores came first), every rank
bound by tmpi itself (:mod:`~tmpi_adapters.process.binding`: ``T`` cores for
``T`` BLAS threads), and as root where tmpi runs as root, as hydra does.
"""
import functools
import os
import re
import subprocess


@functools.lru_cache(maxsize=8)
def mpi_flavor(mpiexec):
    """``"hydra"`` (MPICH, Intel MPI), ``"openmpi"`` or ``None``."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if re.search(r"HYDRA|Intel\(R\) MPI", text):
        return "hydra"
    if re.search(r"Open MPI|OpenRTE|open-mpi|PRRTE|prterun", text):
        return "openmpi"
    return None


def job_args(flavor, n, slots):
    """Options of the launcher for a job of ``n`` ranks that tmpi starts on
    ``slots`` cores (this machine's, or what ``--hosts`` names): tmpi
    checked already whether that many fit."""
    if flavor != "openmpi":
        return []
    return ["--bind-to", "none"] + (["--oversubscribe"] if n > slots else [])


def job_environment(flavor, env):
    """``env`` with what the launcher needs to start the job as this user:
    Open MPI run by root needs it said (hydra does not ask)."""
    if flavor == "openmpi" and hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env
