"""A real Slurm cluster on this machine, for tests of ``srun``/``sbatch`` jobs.

``tools/emulated-slurm`` runs Debian's daemons (munged, slurmctld on the
emulated host tmpi-h3, slurmd on tmpi-h1 and tmpi-h2) with a configuration of
its own; this module is its pytest side: the module-scoped :func:`slurm`
fixture brings a fresh cluster up, yields a :class:`Slurm`, and takes it down
at the end, jobs and all (the emulated hosts go with the ``emulated_hosts``
fixture it uses).

Where the emulated hosts cannot be made (not root, namespaces refused) the
tests that ask for it are skipped, saying why, as are they where Slurm is
not installed (``make slurm``: ``apt-get install slurmd slurmctld
slurm-client munge``, which ``.ci/run`` does), and under Open MPI (Slurm
starts its ranks through PMI-2, which the MPICH wheel speaks; Open MPI's
would need PMIx).
"""
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from hosts import ROOT, emulated_hosts  # noqa: F401 (the fixture it builds on)

#: The script that runs the cluster.
TOOL = ROOT / "tools" / "emulated-slurm"
#: Slurm's programs the tests and the tool need.
PROGRAMS = ("slurmctld", "slurmd", "munged", "srun", "sbatch", "scancel", "scontrol",
            "squeue", "sinfo")
#: The states of a job that has ended for good.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "BOOT_FAIL", "DEADLINE", "PREEMPTED")


class Slurm:
    """The running cluster.

    Attributes
    ----------
    nodes : list of str
        The compute nodes (emulated hosts), 2 CPUs each.
    env : dict
        The variables Slurm's commands need here (``SLURM_CONF``).
    shared : pathlib.Path
        A directory every node sees (outside ``/tmp``, which is each host's
        own), removed at the end.
    log : pathlib.Path
        slurmctld's log (debug level: it names the signals it sends).
    """

    def __init__(self, hosts, conf, shared, log):
        self.hosts = hosts
        self.nodes = hosts.names[:2]
        self.env = {"SLURM_CONF": conf}
        self.shared = shared
        self.log = Path(log)

    def environ(self, env):
        """``env`` with Slurm's variables added."""
        return dict(env, **self.env)

    def command(self, *args, env=None, timeout=60):
        """Run a Slurm command (``scontrol``, ``squeue``, ...); its result."""
        return subprocess.run([str(a) for a in args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, timeout=timeout,
                              env=self.environ(env or os.environ))

    def job_fields(self, job):
        """``scontrol show job``'s fields of ``job``, as a dict."""
        text = self.command("scontrol", "show", "job", job).stdout
        return dict(word.split("=", 1) for word in text.split() if "=" in word)

    def job_state(self, job):
        """``(state, restarts, exit code)`` of ``job`` as scontrol shows it."""
        fields = self.job_fields(job)
        return fields.get("JobState"), int(fields.get("Restarts", 0)), fields.get("ExitCode")

    def wait_until(self, job, test, what, timeout=300):
        """Wait until ``test(job_fields)`` holds; fail naming ``what`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            fields = self.job_fields(job)
            if test(fields):
                return fields
            if time.monotonic() > deadline:
                self.command("scancel", job)
                pytest.fail("Slurm job %s: %s did not come within %d s: %s" % (
                    job, what, timeout, fields))
            time.sleep(0.5)

    def wait_for_job(self, job, timeout=300):
        """Wait until ``job`` has ended for good (not pending, running or
        requeued); its :meth:`job_state`."""
        fields = self.wait_until(job, lambda fields: fields.get("JobState") in ENDED,
                                 "its end", timeout)
        return fields.get("JobState"), int(fields.get("Restarts", 0)), fields.get("ExitCode")

    def resume(self):
        """Every node back in service (a test may have killed its tasks)."""
        for node in self.nodes:
            self.command("scontrol", "update", "NodeName=%s" % node, "State=RESUME")


def unavailable(mpi_flavor):
    """Why the tests cannot have a cluster here (beyond the emulated hosts'
    reasons), or ``None``."""
    missing = [program for program in PROGRAMS if shutil.which(program) is None]
    if missing:
        return ("Slurm is not installed here (%s missing): make slurm (apt-get install slurmd "
                "slurmctld slurm-client munge)" % ", ".join(missing))
    if mpi_flavor == "openmpi":
        return ("this venv's MPI is Open MPI, whose ranks srun would start through PMIx; the "
                "cluster speaks PMI-2, which MPICH's wheel (make install) speaks")
    return None


def _tool(*args, timeout=180):
    return subprocess.run([str(TOOL)] + list(args), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def slurm(emulated_hosts):  # noqa: F811 (the fixture of hosts.py)
    """:class:`Slurm`: a fresh cluster, up for the test module."""
    from conftest import MPI_FLAVOR
    why = unavailable(MPI_FLAVOR)
    if why:
        pytest.skip(why)
    _tool("down")  # what an earlier run may have left
    made = _tool("up")
    if made.returncode != 0:
        _tool("down")
        pytest.fail("tools/emulated-slurm up failed (%d): %s" % (made.returncode,
                                                                 made.stderr.strip()))
    conf = _tool("env").stdout.strip().split("=", 1)[1]
    log = _tool("log").stdout.strip()
    shared = Path(tempfile.mkdtemp(prefix="tmpi-slurm-", dir="/var/tmp"))
    try:
        yield Slurm(emulated_hosts, conf, shared, log)
    finally:
        down = _tool("down")
        shutil.rmtree(shared, ignore_errors=True)
        assert down.returncode == 0, "tools/emulated-slurm down failed: %s" % down.stderr
