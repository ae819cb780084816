"""Starting the ranks: ``mpiexec`` (the MPICH wheel's by default), or in-process
when already inside an MPI job or asked for one rank.

The launching process then watches the job it started
(:class:`~tmpi_adapters.launch.watch.JobWatch`), and with ``--max-restarts``
starts it again when a rank fails (:mod:`~tmpi_adapters.launch.restarts`).
Each job's directory (``tmpi-job-*`` in the temporary directory) goes when
it ends, also on SIGINT and SIGTERM; those a SIGKILL left are swept away by
the next launch.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.options import OPTIONS_ENV
from tmpi_adapters.process.jobdir import (JOB_DIR_ENV, JOB_DIR_PREFIX, LAUNCHER_HOST_ENV,
                                         LAUNCHER_PID_ENV, claim_job_dir, rank_file,
                                         sweep_job_dirs)
from tmpi_adapters.launch.flavors import job_args, job_environment, mpi_flavor
from tmpi_adapters.launch.supervise import SUPERVISED, die_with, rank_command
from tmpi_adapters.launch.target import as_target, find_module, target_argv
from tmpi_adapters.process.channel import CHANNEL_ENV, ChannelServer
from tmpi_adapters.process.threads import THREAD_ENV, default_threads, limit_blas_threads
from tmpi_adapters.launch.restarts import Restarts
from tmpi_adapters.launch.signals import Preemption, stopped_by_signals
from tmpi_adapters.launch.relay import OutputRelay
from tmpi_adapters.launch.watch import JobWatch
from tmpi_adapters.reliability import preemption
from tmpi_adapters.reliability.preemption import IGNORE_SIGINT_ENV

#: Environment variables set by MPI launchers in each rank they start.
RANK_ENV = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")


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
            raise TmpiError("--mpiexec %r is not an executable file. Pass the path of an "
                            "MPI launcher (mpiexec, mpirun) or leave --mpiexec out to use "
                            "the one installed with tmpi." % candidate)
    raise TmpiError("no mpiexec found: install tmpi-adapters with its dependencies "
                    "(the mpich wheel provides one), load your cluster's MPI module, or "
                    "pass --mpiexec PATH.")


def check_target(target):
    """Fail before launching when a script (a path) or module (``("module",
    name)``) cannot be run as ``python`` would run it."""
    kind, name = as_target(target)
    if kind == "module":
        find_module(name)
    else:
        check_script(name)


def check_script(script):
    """Fail before launching when ``script`` cannot be run as a Python script."""
    if os.path.isdir(script):
        raise TmpiError("script %r is a directory; pass the training script (a .py file) "
                        "inside it." % script)
    if not os.path.isfile(script):
        raise TmpiError("script %r not found (working directory %s)." % (script, os.getcwd()))
    try:
        with open(script, "rb") as handle:
            source = handle.read()
    except OSError as exc:
        raise TmpiError("script %r is not readable: %s." % (script, exc.strerror or exc))
    try:
        compile(source, script, "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        where = " at line %s" % exc.lineno if getattr(exc, "lineno", None) else ""
        detail = getattr(exc, "msg", None) or str(exc)
        raise TmpiError("script %r is not valid Python%s: %s. Check that it is the "
                        "training script and that it runs with `python %s`."
                        % (script, where, detail, script))


#: ``PYTHONHASHSEED`` of the ranks tmpi starts, unless the user set one.
#: Every rank hashes strings alike, job after job: sets and dicts of names
#: iterate in the same order on every rank, and Theano's compile-cache keys
#: (which hash strings) are found by every rank and every later job instead
#: of being added again by each process under the cache's lock.
RANK_HASH_SEED = "0"


def rank_environment(options, threads_per_rank=None, n=1, env=None):
    """The environment of the ranks: the options, the BLAS threads
    (``threads_per_rank`` wins over the environment's settings, the default
    of :func:`default_threads` does not), unbuffered output and, for more
    than one rank, one hash seed (:data:`RANK_HASH_SEED`; the user's own
    ``PYTHONHASHSEED`` wins)."""
    env = dict(os.environ if env is None else env)
    env[OPTIONS_ENV] = options.to_env()
    threads = threads_per_rank or default_threads(n)
    for name in THREAD_ENV:
        if threads_per_rank:
            env[name] = str(threads_per_rank)
        elif threads:
            env.setdefault(name, str(threads))
    # Ranks print as they go, not when their buffers fill.
    env.setdefault("PYTHONUNBUFFERED", "1")
    if n > 1:
        env.setdefault("PYTHONHASHSEED", RANK_HASH_SEED)
    return env


#: The memory a rank takes before the script's model (Python, numpy, Theano,
#: MPI and tmpi imported; about 140 MB measured), for :func:`check_capacity`.
RANK_MEMORY = 150 * 2 ** 20
#: Ranks per core beyond which a job cannot start in reasonable time here.
MOST_RANKS_PER_CORE = 16


def available_memory():
    """Bytes of memory available to new processes here (Linux), or ``None``."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_capacity(n, oversubscribe=False, cores=None, memory=None):
    """Refuse ``n`` ranks this machine cannot hold (``oversubscribe`` starts
    them anyway); say once when they outnumber its cores."""
    cores = cores or os.cpu_count() or 1
    memory = available_memory() if memory is None else memory
    if not oversubscribe:
        need = n * RANK_MEMORY
        if memory and need > memory:
            raise TmpiError(
                "-n %d needs at least %.1f GB of memory here (about %d MB a rank before "
                "the model) and %.1f GB is available. Use fewer ranks, or spread them over "
                "machines (your scheduler's allocation, or --mpiexec-arg=-hosts ...); "
                "--oversubscribe starts them anyway." % (
                    n, need / 1e9, RANK_MEMORY // 2 ** 20, memory / 1e9))
        if n > MOST_RANKS_PER_CORE * cores:
            raise TmpiError(
                "-n %d on %d core(s): more than %d ranks a core cannot start in reasonable "
                "time. Use fewer ranks, or spread them over machines; --oversubscribe "
                "starts them anyway." % (n, cores, MOST_RANKS_PER_CORE))
    if n > cores:
        sys.stderr.write("tmpi: note: %d ranks share %d core(s) here: they take turns, so "
                         "the job runs no faster than on %d rank(s).\n" % (n, cores, cores))
        sys.stderr.flush()


def launch(target, script_args, options, n=1, mpiexec=None, mpiexec_args=(),
           threads_per_rank=None, oversubscribe=False, hosts=None):
    """Run a script (a path) or module (``("module", name)``) on ``n`` ranks;
    return the job's exit status (the script's own when it calls ``sys.exit``).

    With ``n == 1`` the current process becomes the rank (unless
    ``--max-restarts``: a restart needs fresh processes).  Inside an existing
    MPI job (``mpiexec -n 4 tmpi wrap ...``, ``srun tmpi wrap ...``) the rank
    runs in a child that this process watches
    (:mod:`~tmpi_adapters.launch.supervise`), so that a rank killed there is
    named too.
    ``threads_per_rank`` sets the BLAS/OpenMP threads of each rank; by
    default ranks tmpi starts share the cores (:func:`default_threads`), and
    a rank tmpi did not start keeps what it has.  Ranks that cannot fit this
    machine are refused unless ``oversubscribe`` (:func:`check_capacity`).
    ``hosts`` (:class:`~tmpi_adapters.launch.hosts.HostSet`) starts them on
    other machines: each host's ranks then share out that host's cores.
    """
    target = as_target(target)
    check_target(target)
    if n < 1:
        raise TmpiError("-n must be at least 1, not %d." % n)
    restarts = Restarts.from_options(options, n)
    if hosts is not None:
        check_hosts(hosts, n, oversubscribe)
    if restarts is not None and inside_mpi_job():
        raise TmpiError("--max-restarts needs tmpi wrap to start the ranks itself, and this "
                        "tmpi runs inside an MPI job (srun, mpiexec) that started them. Run "
                        "`tmpi wrap -n N --max-restarts K ...` outside it (in the batch "
                        "script), or leave --max-restarts out and let the scheduler requeue "
                        "the job with --resume auto.")
    if inside_mpi_job() or (n == 1 and not mpiexec_args and restarts is None and
                            hosts is None):
        env = rank_environment(options, threads_per_rank, 1)
        os.environ.update({k: v for k, v in env.items() if k not in os.environ or
                           k == OPTIONS_ENV})
        if threads_per_rank:
            limit_blas_threads(threads_per_rank)
        if inside_mpi_job():
            from tmpi_adapters.launch.supervise import supervise
            # The rank runs as a child, so that this process can name it
            # when a signal kills it (the launcher kills the others at once).
            status = supervise(rank_command(target, script_args), die_with(os.getpid()),
                               preemption.bounds(options))
            if status is not None:
                return status
        from tmpi_adapters.launch.runtime import main
        try:
            main(target_argv(target) + list(script_args))
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
        return 0
    if not mpiexec_args and hosts is None:  # else the ranks may run elsewhere
        check_capacity(n, oversubscribe)
    if options.extra.get("progress"):
        # Rank 0's bar shows once Theano is imported, seconds from now.
        sys.stderr.write("tmpi: starting %d ranks (importing Theano) ...\n" % n)
        sys.stderr.flush()
    sweep_job_dirs()
    bounds = preemption.bounds(options)
    stop = Preemption(*bounds) if bounds else None

    def run_job(options, n):
        return start_job(target, script_args, options, n, mpiexec, mpiexec_args,
                         threads_per_rank, stop, hosts)
    with stopped_by_signals(stop):
        if restarts is None:
            return run_job(options, n).status
        return restarts.run(run_job, options, n, stop, hosts)


def start_job(target, script_args, options, n, mpiexec=None, mpiexec_args=(),
              threads_per_rank=None, stop=None, hosts=None):
    """Start ``n`` fresh ranks with ``mpiexec`` (on ``hosts``, when given)
    and watch them until they end; returns the :class:`JobWatch`, whose
    ``status`` is the job's."""
    # On hosts, each rank takes its share of its own host's cores when it starts.
    env = rank_environment(options, threads_per_rank, n)
    if hosts is not None and not threads_per_rank:
        for name in THREAD_ENV:
            if os.environ.get(name) is None:
                env.pop(name, None)
    executable = find_mpiexec(mpiexec)
    with tempfile.TemporaryDirectory(prefix=JOB_DIR_PREFIX) as directory:
        claim_job_dir(directory)
        env[JOB_DIR_ENV] = directory
        env[LAUNCHER_PID_ENV] = str(os.getpid())
        env[LAUNCHER_HOST_ENV] = socket.gethostname()
        channel = placement = None
        flavor = mpi_flavor(executable)
        job_environment(flavor, env)
        if hosts is not None:
            channel = ChannelServer(lambda rank, name, directory=directory:
                                    rank_file(directory, rank, name)).start()
            env[CHANNEL_ENV] = channel.address()
            placement = hosts.mpiexec_args(flavor, passed_on(env))
        # On hosts each rank runs under a small parent of its own, which tells
        # this launcher when a signal killed it (hydra names one rank, vaguely).
        command = [executable, "-n", str(n)] + (placement or []) + \
            job_args(flavor, n, hosts.slots if hosts is not None else os.cpu_count() or 1) + \
            list(mpiexec_args) + \
            (SUPERVISED if hosts is not None else []) + rank_command(target, script_args)
        relay = None
        if options.all_ranks_output:
            try:
                relay = OutputRelay(directory, n)
            except OSError:
                relay = None  # no pipes here: the ranks prefix their own lines
        # Started with SIGINT ignored (in the background, by a batch system or
        # CI), the whole job ignores it: mpiexec, which would act on it
        # whatever it inherited, in a process group of its own, out of reach
        # of a SIGINT to this one's; the ranks, whose launcher resets it, told.
        ignore_sigint = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        if ignore_sigint:
            env[IGNORE_SIGINT_ENV] = "1"
        try:
            process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE,
                                       preexec_fn=die_with(os.getpid()),
                                       process_group=0 if ignore_sigint else None)
        except OSError as exc:
            if channel is not None:
                channel.close()
            raise TmpiError("could not start %s: %s. Check --mpiexec, or install the "
                            "mpich wheel (pip install mpich)." % (command[0], exc))
        watch = JobWatch(process, directory, n, relay=relay, preemption=stop,
                         channel=channel, hosts=hosts).start()
        watch.wait()
        return watch


def check_hosts(hosts, n, oversubscribe=False):
    """Refuse more ranks than ``--hosts`` names (unless ``oversubscribe``), and
    ``--hosts`` inside an MPI job, whose launcher placed the ranks already."""
    if inside_mpi_job():
        raise TmpiError("--hosts and --hostfile are for tmpi wrap starting the ranks itself, "
                        "and this tmpi runs inside an MPI job (srun, mpiexec) that started "
                        "them: give the hosts to that launcher, or run tmpi wrap --hosts "
                        "outside it.")
    if n > hosts.slots and not oversubscribe:
        raise TmpiError("-n %d is more ranks than the %d that --hosts/--hostfile name (%s). "
                        "Leave -n out to start one rank a slot, name more slots "
                        "(HOST:RANKS), or pass --oversubscribe to place more ranks on them."
                        % (n, hosts.slots, hosts.describe()))


#: Variables of the ranks' environment that Open MPI must be told to pass on
#: to other machines (hydra passes the whole environment).
PASSED_ON = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHASHSEED", "PYTHONUNBUFFERED",
             "THEANO_FLAGS", "KERAS_BACKEND")


def passed_on(env):
    """The names of ``env`` a rank on another machine needs."""
    return sorted(name for name in env
                  if name.startswith("TMPI_") or name in PASSED_ON or name in THREAD_ENV)
