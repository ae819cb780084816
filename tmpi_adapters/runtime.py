"""What runs inside each rank: output routing, the user's script, failures.

``python -m tmpi_adapters.runtime SCRIPT [ARGS...]`` is what ``tmpi wrap``
starts on every rank (options arrive in ``TMPI_OPTIONS``).
"""
import os
import runpy
import sys
import time
import traceback

from . import compat
from .errors import TmpiError
from .options import Options

JOB_DIR_ENV = "TMPI_JOB_DIR"

#: The stderr that failures are reported on, even when a rank's own stderr
#: has been sent to a log file.
_report_fd = 2


def mpi_rank_size():
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def job_dir():
    return os.environ.get(JOB_DIR_ENV)


def route_output(options, rank, size):
    """Only rank 0's output reaches the terminal unless ``all_ranks_output``.

    Other ranks' stdout goes to /dev/null and their stderr to
    ``$TMPI_JOB_DIR/rank<N>.stderr`` (kept for failure reports); with
    ``all_ranks_output`` every rank prints, each line prefixed ``[rank N]``.
    """
    global _report_fd
    if size == 1:
        return
    if options.all_ranks_output:
        from .session import rank_prefix_stream
        sys.stdout = rank_prefix_stream(sys.stdout, rank)
        sys.stderr = rank_prefix_stream(sys.stderr, rank)
        return
    if rank == 0:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    _report_fd = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    directory = job_dir()
    target = os.path.join(directory, "rank%d.stderr" % rank) if directory else os.devnull
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def report(text):
    """Write a failure report where the user sees it."""
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "replace")
    try:
        os.write(_report_fd, data)
    except OSError:
        pass


def describe_failure(error, rank, size):
    """The paragraph a user sees for an exception that ended a rank."""
    where = "" if size == 1 else " (rank %d)" % rank
    if isinstance(error, TmpiError):
        return "tmpi: error%s: %s" % (where, error)
    lines = traceback.format_exception(type(error), error, error.__traceback__)
    # Drop tmpi's own frames before the user's script so the traceback starts
    # where the user's code does.
    here = os.path.dirname(os.path.abspath(__file__))
    kept = [lines[0]] + [line for line in lines[1:-1]
                         if not line.lstrip().startswith('File "%s' % here)] + [lines[-1]]
    return "".join(kept) + "tmpi: rank %d of %d failed: %s: %s" % (
        rank, size, type(error).__name__, error)


def fail(error, rank, size):
    """Report ``error`` and end the whole job with a non-zero status."""
    code = getattr(error, "exit_code", 1)
    if size > 1 and rank != 0 and isinstance(error, TmpiError):
        # The same error usually happens on every rank: let rank 0 speak and
        # end the job; speak only if it has not within a moment.
        time.sleep(2.0)
    report(describe_failure(error, rank, size))
    if size > 1:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)


def import_theano_in_rank_order(options, rank, size):
    """Import Theano on rank 0 first so a cold compile cache is built once."""
    if options.compile_dirs == "per-rank":
        base = os.environ.get("TMPI_COMPILE_BASE") or os.path.join(
            os.path.expanduser("~"), ".theano")
        os.environ["THEANO_FLAGS"] = compat.theano_flags(
            base_compiledir=os.path.join(base, "tmpi-rank%d" % rank))
    if size == 1 or options.compile_dirs == "per-rank":
        import theano  # noqa: F401
        return
    from mpi4py import MPI
    if rank == 0:
        import theano  # noqa: F401,F811
        MPI.COMM_WORLD.Barrier()
    else:
        MPI.COMM_WORLD.Barrier()
        import theano  # noqa: F401,F811


def detect_framework(script, pm=None):
    """The framework a script uses, from the ``tmpi_detect_framework`` hook."""
    from .pluginmanager import get_plugin_manager
    pm = pm or get_plugin_manager()
    try:
        with open(script, encoding="utf-8", errors="replace") as handle:
            source = handle.read()
    except OSError:
        return None
    return pm.hook.tmpi_detect_framework(source=source, path=script)


def run_script(script, args, session):
    """Run ``script`` as ``__main__`` with ``sys.argv = [script] + args``."""
    script = os.path.abspath(script)
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script] + list(args)
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise
    finally:
        sys.argv = saved_argv
        if sys.path and sys.path[0] == os.path.dirname(script) and saved_path0 != sys.path[0]:
            sys.path.pop(0)


def main(argv=None):
    """Entry point of one rank."""
    compat.apply()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.exit("usage: python -m tmpi_adapters.runtime SCRIPT [ARGS...]")
    script, args = argv[0], argv[1:]
    options = Options.from_env()
    rank, size = mpi_rank_size()
    route_output(options, rank, size)
    session = None
    try:
        if directory := job_dir():
            with open(os.path.join(directory, "rank%d.pid" % rank), "w") as handle:
                handle.write(str(os.getpid()))
        if not options.framework:
            options.framework = detect_framework(script) or "theano"
        import_theano_in_rank_order(options, rank, size)
        from .session import Session
        session = Session(options, script=script).start()
        run_script(script, args, session)
        session.finish()
    except BaseException as error:  # noqa: B902 - every failure must end the job
        if session is not None and session.started:
            try:
                session.finish(error=error)
            except BaseException:
                pass
        if isinstance(error, KeyboardInterrupt):
            report("tmpi: interrupted (rank %d)" % rank)
            if size > 1:
                from mpi4py import MPI
                MPI.COMM_WORLD.Abort(130)
            sys.exit(130)
        fail(error, rank, size)


if __name__ == "__main__":
    main()
