"""Ranks an enclosing MPI job started (``mpiexec -n 2 tmpi wrap ...``): each
runs as a child of its ``tmpi wrap``, which names the rank when a signal
kills it and is otherwise not seen: the same results, failure reports and
preemption as ``tmpi wrap -n 2``.

Real ``mpiexec`` (the installed MPICH's hydra), real Theano; ranks are really
killed.  Hydra kills every other rank with SIGKILL at once, so the killed
rank's ``tmpi wrap`` is the only process left to speak.
"""
import os
import signal
import socket
import time
from pathlib import Path
from unittest import mock

import pytest

from conftest import MPI_FLAVOR, MPIEXEC, SCRIPTS, TMPI, final_numbers, mpiexec, rank_env, tmpi
from test_reliability import START_TIMEOUT, Job, checkpoints, own_lines, rank_of
from tmpi_adapters.launch.supervise import launcher_place

RESTART = SCRIPTS / "reliability_restart.py"
CRASH = SCRIPTS / "reliability_crash.py"
#: Steps of reliability_restart.py for a job that is stopped long before its end.
FOREVER = "10000000"
#: The BLAS/OpenMP variables a caller may have set: the ranks then choose their own.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def enclosing_env():
    env = rank_env()
    for name in THREAD_VARIABLES:
        env.pop(name, None)
    return env


class Enclosed(Job):
    """A :class:`Job` of ``mpiexec -n 2 tmpi wrap ARGS...``: its processes
    (mpiexec, each rank's tmpi wrap and the rank under it) carry the token."""

    def __init__(self, *args):
        # Job starts ``tmpi ARGS``; here tmpi is what mpiexec starts.
        with mock.patch("test_reliability.TMPI", MPIEXEC):
            super().__init__("-n", "2", TMPI, "wrap", *args, env=enclosing_env())

    def pid(self, rank, supervisor=False):
        """The process of ``rank`` that runs the script, or (``supervisor``)
        the tmpi wrap above it; both have the launcher's rank variables."""
        for pid, env in self.processes().items():
            try:
                runs_script = b"tmpi_adapters.launch.runtime" in \
                    Path("/proc/%d/cmdline" % pid).read_bytes()
            except OSError:
                continue
            if rank_of(env) == rank and runs_script != supervisor:
                return pid
        raise AssertionError("rank %d of the job has no such process" % rank)

    def left(self, within=5.0):
        """The job's processes still alive ``within`` seconds after its end
        (a rank goes with its tmpi wrap, a moment after it)."""
        deadline = time.monotonic() + within
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.processes()


@pytest.mark.mpi
@pytest.mark.parametrize("supervisor", [False, True], ids=["rank", "its-tmpi-wrap"])
def test_a_rank_killed_under_an_enclosing_mpiexec_is_named_and_nothing_is_left(supervisor):
    job = Enclosed(RESTART, FOREVER)
    try:
        job.wait_for_output("step 500", timeout=START_TIMEOUT)
        pid = job.pid(1, supervisor)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        code, stdout, stderr = job.finish()
        elapsed = time.monotonic() - killed
        left = job.left()
    finally:
        job.kill()
    print("job ended %.2f s after SIGKILL of rank 1's %s; status %d"
          % (elapsed, "tmpi wrap" if supervisor else "process", code))
    assert not left, "processes left behind: %s" % left
    # Hydra's status ORs the ranks' wait statuses: 137 from rank 1's tmpi
    # wrap, plus signal 9 (status 9, and MPICH's banner) when the other rank
    # it killed was reaped by then.
    if supervisor:
        # Nothing is left to speak: the launcher's own words alone (MPICH's
        # banner and status 9, Open MPI's notice and 137), and the rank went too.
        assert code == (9 if MPI_FLAVOR == "hydra" else 128 + 9), stderr
        assert "was killed by" not in stderr, stderr
        return
    assert code in (128 + 9, 9), stderr
    line = ("tmpi: rank 1 of 2 (pid %d on %s) was killed by signal 9 (SIGKILL): killed from "
            "outside (`kill -9`, a batch scheduler) or by the kernel's out-of-memory killer "
            "(see `dmesg`); the MPI launcher stops the other ranks.\n"
            % (pid, socket.gethostname()))
    assert own_lines(stderr).count("tmpi: ") == 1 and line in stderr, stderr


@pytest.mark.mpi
def test_an_undisturbed_job_is_the_same_as_under_tmpi_wrap():
    enclosed = mpiexec(2, TMPI, "wrap", RESTART, "2000", env=enclosing_env())
    assert enclosed.returncode == 0, enclosed.stderr
    own = tmpi("wrap", "-n", "2", RESTART, "2000", env=enclosing_env())
    assert own.returncode == 0, own.stderr
    assert final_numbers(enclosed.stdout, "params") == final_numbers(own.stdout, "params")
    share = max(1, len(os.sched_getaffinity(0)) // 2)
    assert "; %d BLAS thread%s per rank" % (share, "" if share == 1 else "s") in \
        enclosed.stdout + enclosed.stderr


@pytest.mark.mpi
def test_an_exception_is_reported_once_as_without_the_supervisor():
    result = mpiexec(2, TMPI, "wrap", CRASH, "raise", "300", env=enclosing_env())
    assert result.returncode == 1, result.stderr
    ours = [line for line in own_lines(result.stderr).splitlines() if line.startswith("tmpi:")]
    assert ours == ["tmpi: rank 1 of 2 failed: ValueError: batch 300 of rank 1 is unreadable"], \
        result.stderr


@pytest.mark.mpi
def test_a_rank_that_leaves_without_finishing_is_named():
    # os._exit(0) in rank 1's script: no failure, no signal; MPI only sees a
    # process that never finalized.  Its tmpi wrap knows the script did not end.
    result = mpiexec(2, TMPI, "wrap", CRASH, "exit", "300", env=enclosing_env())
    # Rank 1's tmpi wrap exits 1; hydra ORs in signal 9 when the other rank
    # it killed was reaped by then.
    assert result.returncode in (1, 9), result.stderr
    ours = [line for line in own_lines(result.stderr).splitlines() if line.startswith("tmpi:")]
    assert len(ours) == 1 and ours[0].startswith("tmpi: rank 1 of 2 (pid ") and \
        "left without finishing the script or finalizing MPI (os._exit" in ours[0], \
        result.stderr


@pytest.mark.mpi
def test_sigterm_to_a_ranks_tmpi_wrap_is_a_preemption(tmp_path):
    directory = tmp_path / "ck"
    job = Enclosed("--checkpoint-dir", directory, RESTART, FOREVER)
    try:
        job.wait_for_output("step 1000", timeout=START_TIMEOUT)
        os.kill(job.pid(0, supervisor=True), signal.SIGTERM)
        code, stdout, stderr = job.finish()
        left = job.left()
    finally:
        job.kill()
    assert code == 75, stderr
    [name] = checkpoints(directory)
    assert "tmpi: preempted: wrote %s at step " % (directory / name) in stderr
    assert "killed by" not in stderr and "final params" not in stdout
    assert not left, "processes left behind: %s" % left


@pytest.mark.parametrize("env,place", [
    ({"PMI_RANK": "1", "PMI_SIZE": "4"}, (1, 4)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}, (2, 3)),
    ({"PMIX_RANK": "0"}, (0, None)),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8"}, (5, 8)),
    ({}, (None, None)),
])
def test_the_rank_is_read_from_the_launchers_environment(env, place):
    assert launcher_place(env) == place
