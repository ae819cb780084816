"""Starting the ranks: ``mpiexec`` (the MPICH wheel's by default), or in-process
when already inside an MPI job or asked for one rank."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

from .errors import TmpiError
from .options import OPTIONS_ENV
from .runtime import JOB_DIR_ENV

#: Environment variables set by MPI launchers in each rank they start.
RANK_ENV = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")

#: Per-rank thread counts: one BLAS/OpenMP thread per rank unless the user
#: says otherwise, so N ranks on N cores do not fight.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

# Launcher chatter that repeats what tmpi reports itself.
_NOISE = re.compile(rb"^Abort\(\d+\) on node \d+ \(rank \d+ in comm \d+\): "
                    rb"application called MPI_Abort")


def inside_mpi_job(env=None):
    env = os.environ if env is None else env
    return any(name in env for name in RANK_ENV)


def find_mpiexec(explicit=None):
    """``--mpiexec``, ``$TMPI_MPIEXEC``, the one beside this Python, then ``$PATH``."""
    candidates = [explicit, os.environ.get("TMPI_MPIEXEC"),
                  os.path.join(os.path.dirname(sys.executable), "mpiexec"),
                  shutil.which("mpiexec")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
        if candidate and explicit == candidate:
            found = shutil.which(candidate)
            if found:
                return found
            raise TmpiError("--mpiexec %r is not an executable file." % candidate)
    raise TmpiError("no mpiexec found: install tmpi-adapters with its dependencies "
                    "(the mpich wheel provides one), load your cluster's MPI module, or "
                    "pass --mpiexec PATH.")


def rank_environment(options, threads_per_rank=1, env=None):
    env = dict(os.environ if env is None else env)
    env[OPTIONS_ENV] = options.to_env()
    for name in THREAD_ENV:
        env.setdefault(name, str(threads_per_rank))
    # Ranks print as they go, not when their buffers fill.
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _pump(source, sink):
    for line in iter(source.readline, b""):
        if not _NOISE.match(line):
            sink.write(line)
            sink.flush()
    source.close()


def launch(script, script_args, options, n=1, mpiexec=None, mpiexec_args=(),
           threads_per_rank=1):
    """Run ``script`` on ``n`` ranks; return the job's exit status.

    Inside an existing MPI job (``mpiexec -n 4 tmpi wrap ...``, ``srun tmpi
    wrap ...``) or with ``n == 1`` the current process becomes the rank.
    """
    if not os.path.isfile(script):
        raise TmpiError("script %r not found (working directory %s)." % (script, os.getcwd()))
    if not os.access(script, os.R_OK):
        raise TmpiError("script %r is not readable." % script)
    if n < 1:
        raise TmpiError("-n must be at least 1, not %d." % n)
    env = rank_environment(options, threads_per_rank)
    if inside_mpi_job() or (n == 1 and not mpiexec_args):
        os.environ.update({k: v for k, v in env.items() if k not in os.environ or
                           k == OPTIONS_ENV})
        from .runtime import main
        try:
            main([script] + list(script_args))
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        return 0
    command = [find_mpiexec(mpiexec), "-n", str(n)] + list(mpiexec_args) + [
        sys.executable, "-m", "tmpi_adapters.runtime", script] + list(script_args)
    with tempfile.TemporaryDirectory(prefix="tmpi-job-") as directory:
        env[JOB_DIR_ENV] = directory
        try:
            process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE)
        except OSError as exc:
            raise TmpiError("could not start %s: %s" % (command[0], exc))
        pump = threading.Thread(target=_pump, args=(process.stderr, sys.stderr.buffer),
                                daemon=True)
        pump.start()
        try:
            code = process.wait()
        except KeyboardInterrupt:
            process.terminate()
            code = process.wait()
        pump.join(timeout=5)
        return code
