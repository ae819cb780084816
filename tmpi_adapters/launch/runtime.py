"""What runs inside each rank: the script, between tmpi's start and end.

``python -m tmpi_adapters.launch.runtime SCRIPT [ARGS...]`` (or ``-m MODULE
[ARGS...]``) is what ``tmpi wrap`` starts on every rank (options arrive in
``TMPI_OPTIONS``).  The script runs as ``python SCRIPT`` would run it
(:mod:`~tmpi_adapters.launch.target`): same ``sys.argv``, same ``sys.path``,
and its exit status is the rank's.  Its output goes where
:mod:`~tmpi_adapters.process.output` says; a failure ends the job as
:mod:`~tmpi_adapters.process.failure` says.
"""
import os
import socket
import sys

from tmpi_adapters.launch.target import (as_python_runs, detect_framework, parse_argv,
                                         run_target, take_decorator_options, target_file)
from tmpi_adapters.options import Options
from tmpi_adapters.process import binding, compat, devices
from tmpi_adapters.process.failure import (end_after_failure, end_preempted, end_quietly,
                                           ends_cleanly, exit_status, finish_after_failure)
from tmpi_adapters.process.jobdir import mark, supervised
from tmpi_adapters.process.output import flush_partial_lines, route_output
from tmpi_adapters.process.rank import mpi_rank_size
from tmpi_adapters.reliability import preemption


def quiet_compile_lock(options, size):
    """Theano's notes that a process waits for the compile cache's lock
    (``INFO (theano.gof.compilelock)``) are about tmpi's own ranks waiting
    for each other: kept out of the output unless every rank's is shown."""
    if size > 1 and not options.all_ranks_output:
        import logging
        # A filter, not a level: Theano sets the logger's level when it loads.
        logging.getLogger("theano.gof.compilelock").addFilter(
            lambda record: record.levelno > logging.INFO)


def import_theano_in_rank_order(options, rank, size):
    """Import Theano on rank 0 first so a cold compile cache is built once."""
    quiet_compile_lock(options, size)
    if options.compile_dirs == "per-rank":
        base = os.environ.get("TMPI_COMPILE_BASE") or os.path.join(
            os.path.expanduser("~"), ".theano")
        os.environ["THEANO_FLAGS"] = compat.theano_flags(
            base_compiledir=os.path.join(base, "tmpi-rank%d" % rank))
    if size == 1 or options.compile_dirs == "per-rank":
        import theano  # noqa: F401
        return
    if rank == 0:
        import theano  # noqa: F401,F811
        wait_for_every_rank(options, size)
    else:
        wait_for_every_rank(options, size)
        import theano  # noqa: F401,F811


def wait_for_every_rank(options, size):
    """The start-up meeting of all ranks, with the stall timeout as deadline."""
    from mpi4py import MPI

    from tmpi_adapters.errors import StallError
    from tmpi_adapters.exchangers.waiting import oversubscribed, wait_for

    def too_long(what, waited, frame):
        cores = os.cpu_count() or 1
        raise StallError(
            "not every one of the %d ranks started within %.0f s (--start-timeout). "
            "%sCheck the launcher's options (--mpiexec, --mpiexec-arg), or give the "
            "ranks more time with --start-timeout." % (
                size, waited, "%d ranks share %d cores here, so each starts slowly: use "
                "fewer ranks (-n). " % (size, cores) if size > 2 * cores else ""))

    wait_for(MPI.COMM_WORLD.Ibarrier().Test, "the start of every rank", options.start_timeout,
             too_long, crowded=oversubscribed(size))


def main(argv=None):
    """Entry point of one rank: run the script, then end with its exit status."""
    compat.apply()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.exit("usage: python -m tmpi_adapters.launch.runtime (SCRIPT | -m MODULE) [ARGS...]")
    target, args = parse_argv(argv)
    options = Options.from_env()
    preemption.install(options)  # before the launcher can name this rank
    rank, size = mpi_rank_size()
    route_output(options, rank, size)
    session = None
    try:
        mark(rank, "pid", "%d %s%s" % (os.getpid(), socket.gethostname(),
                                       # the tmpi process above this rank
                                       " %d" % os.getppid() if supervised() else ""))
        take_decorator_options(options, target, rank)
        if not options.framework:
            options.framework = detect_framework(target) or "theano"
        from mpi4py import MPI
        chosen = binding.settle(MPI.COMM_WORLD, options.bind)
        devices.choose(rank, threads=len(chosen) if size > 1 else None)
        import_theano_in_rank_order(options, rank, size)
        from tmpi_adapters.core.session import Session
        with as_python_runs(target, args):  # until the final checkpoint is written
            session = Session(options, script=target_file(target)).start()
            ended = run_target(target)
            if isinstance(ended, preemption.Preempted):
                raise ended
            code = 0 if ended is None else exit_status(ended.code)
            if ended is not None and not isinstance(ended.code, (int, type(None))):
                print(ended.code, file=sys.stderr, flush=True)  # as python does
            if code == 0:
                session.finish()
            else:
                # A deliberate exit (pytest's status, argparse's 2): the
                # script's status, no failure report, no end-of-run exchanges.
                finish_after_failure(session, ended)
    except BaseException as error:  # noqa: B902 - every failure must end the job
        if isinstance(error, preemption.Preempted):
            end_preempted(session, error, size)  # does not return
        if not ends_cleanly(error):
            end_after_failure(session, error, rank, size)  # does not return
        end_quietly(session, error, rank)  # nothing to do: a requeued finished run
        code = 0
    mark(rank, "done" if code == 0 else "exit", str(code))
    flush_partial_lines()
    sys.exit(code)


if __name__ == "__main__":
    # Run the importable module, not this ``__main__`` copy of it, so state set
    # here (the report descriptor) is the state other modules see.
    from tmpi_adapters.launch.runtime import main as _main
    _main()
