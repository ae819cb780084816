"""What runs inside each rank: output routing, the user's script, failures.

``python -m tmpi_adapters.launch.runtime SCRIPT [ARGS...]`` is what ``tmpi wrap``
starts on every rank (options arrive in ``TMPI_OPTIONS``).
"""
import functools
import os
import runpy
import socket
import sys
import sysconfig
import traceback

from tmpi_adapters.launch import compat
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.options import Options

JOB_DIR_ENV = "TMPI_JOB_DIR"

#: The stderr that failures are reported on, even when a rank's own stderr
#: has been sent to a log file.
_report_fd = 2


def mpi_rank_size():
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def job_dir():
    return os.environ.get(JOB_DIR_ENV)


def rank_file(directory, rank, kind):
    """``<directory>/rank<N>.<kind>``: the files a rank leaves for the launcher.

    ``pid`` (``"<pid> <host>"``, written at start), ``stderr`` (non-zero
    ranks' stderr), ``done`` (the script finished), ``failed`` (a failure was
    reported and the job is being aborted).
    """
    return os.path.join(directory, "rank%d.%s" % (rank, kind))


def mark(rank, kind, text=""):
    """Leave ``rank<N>.<kind>`` in the job directory (no-op outside ``tmpi wrap``)."""
    directory = job_dir()
    if not directory:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        with open(rank_file(directory, rank, kind), "w") as handle:
            handle.write(text)
    except OSError:
        pass  # the launcher only loses a detail of its final message


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
    target = rank_file(directory, rank, "stderr") if directory else os.devnull
    if directory:
        # On other machines of a multi-node job the launcher's directory does
        # not exist; the file then stays local to that machine.
        os.makedirs(directory, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def rank_prefix_stream(stream, rank):
    """Wrap a text stream so every line starts with ``[rank N]``."""

    class Prefixed:
        def __init__(self):
            self._at_line_start = True

        def write(self, text):
            out = []
            for piece in text.splitlines(True):
                if self._at_line_start:
                    out.append("[rank %d] " % rank)
                out.append(piece)
                self._at_line_start = piece.endswith("\n")
            stream.write("".join(out))
            return len(text)

        def __getattr__(self, name):
            return getattr(stream, name)

    return Prefixed()


def report(text):
    """Write a failure report where the user sees it."""
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "replace")
    try:
        os.write(_report_fd, data)
    except OSError:
        pass


#: Where installed libraries and the standard library live: their frames are
#: summarised in failure reports, so the traceback shows the user's code.
_LIBRARY_DIRS = tuple(sorted({os.path.realpath(p) + os.sep for p in (
    sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
    sysconfig.get_paths().get("stdlib"), os.path.dirname(os.path.abspath(__file__)))
    if p}))


@functools.lru_cache(maxsize=4096)
def is_library_frame(filename):
    """True for a file of tmpi, the standard library or an installed package."""
    return os.path.realpath(filename).startswith(_LIBRARY_DIRS) or filename.startswith("<")


def user_traceback(error):
    """The traceback of ``error`` with library frames folded into one line each run.

    tmpi's own frames, the standard library's and installed packages' (Theano,
    numpy, mpi4py) say nothing the user can act on; the user's frames stay.
    """
    frames = traceback.extract_tb(error.__traceback__)
    lines, hidden = ["Traceback (most recent call last):\n"], []
    for frame in frames:
        if is_library_frame(frame.filename):
            hidden.append(frame)
            continue
        if hidden and len(lines) > 1:  # frames before the user's (runpy, tmpi) say nothing
            lines.append("  ... %d frame(s) inside libraries\n" % len(hidden))
        hidden = []
        lines.extend(traceback.format_list([frame]))
    if hidden and len(lines) > 1:
        lines.append("  ... %d frame(s) inside libraries, from %s\n"
                     % (len(hidden), _library_name(hidden[-1].filename)))
    if len(lines) == 1:
        return ""
    return "".join(lines)


def _library_name(filename):
    real = os.path.realpath(filename)
    if real.startswith(os.path.dirname(os.path.realpath(__file__)) + os.sep):
        return "tmpi"
    for prefix in _LIBRARY_DIRS:
        if real.startswith(prefix):
            rest = real[len(prefix):].split(os.sep)
            return rest[0] if rest[0] not in ("site-packages", "dist-packages") else rest[1]
    return os.path.basename(filename)


def _first_line(error, limit=2000):
    """The exception's message, cut where libraries append pages of debugging hints."""
    text = str(error)
    for marker in ("\nApply node that caused the error", "\nHINT:", "\nBacktrace when"):
        text = text.split(marker, 1)[0]
    return text if len(text) <= limit else text[:limit] + " ..."


def describe_failure(error, rank, size):
    """The paragraph a user sees for an exception that ended a rank."""
    where = "" if size == 1 else " (rank %d)" % rank
    if isinstance(error, KeyboardInterrupt):
        return "tmpi: interrupted%s" % where
    if isinstance(error, TmpiError):
        # Raised inside a compiled function, it carries Theano's notes on the node.
        return "tmpi: error%s: %s" % (where, _first_line(error))
    if isinstance(error, OSError) and error.filename is not None:
        return ("%stmpi: rank %d of %d failed: the script could not use %r: %s. Paths are "
                "relative to the working directory %s." % (
                    user_traceback(error), rank, size, error.filename,
                    error.strerror or error, os.getcwd()))
    return "%stmpi: rank %d of %d failed: %s: %s" % (
        user_traceback(error), rank, size, type(error).__name__, _first_line(error))


def fail(error, rank, size):
    """Report ``error`` and end the whole job with a non-zero status.

    Under ``tmpi wrap`` only rank 0 speaks for itself: the same error usually
    happens on every rank, and the launcher repeats the first failed rank's
    report (from its ``failed`` file) when no report reached the terminal.
    """
    code = 130 if isinstance(error, KeyboardInterrupt) else getattr(error, "exit_code", 1)
    text = describe_failure(error, rank, size)
    # mpiexec may end the job on MPI_Abort before it has forwarded a report.
    mark(rank, "failed", text)
    if rank == 0 or size == 1 or not job_dir():
        report(text)
    if size > 1:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)


def finish_after_failure(session, error):
    """Finish ``session``, if it started, telling the plugins of ``error``.

    A failure while finishing is dropped: ``error`` is the one to report.
    """
    if session is not None and session.started:
        try:
            session.finish(error=error)
        except BaseException:  # noqa: B902 - the first error is the one reported
            pass


def end_after_failure(session, error, rank, size):
    """What every front door does when the user's code fails on a rank:
    :func:`finish_after_failure`, then :func:`fail` (report, end the job)."""
    finish_after_failure(session, error)
    fail(error, rank, size)


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


def detect_framework(script, pm=None):
    """The framework a script uses, from the ``tmpi_detect_framework`` hook."""
    from tmpi_adapters.pluginmanager import get_plugin_manager
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
        sys.exit("usage: python -m tmpi_adapters.launch.runtime SCRIPT [ARGS...]")
    script, args = argv[0], argv[1:]
    options = Options.from_env()
    rank, size = mpi_rank_size()
    route_output(options, rank, size)
    session = None
    try:
        mark(rank, "pid", "%d %s" % (os.getpid(), socket.gethostname()))
        if not options.framework:
            options.framework = detect_framework(script) or "theano"
        import_theano_in_rank_order(options, rank, size)
        from tmpi_adapters.core.session import Session
        session = Session(options, script=script).start()
        run_script(script, args, session)
        session.finish()
        mark(rank, "done")
    except BaseException as error:  # noqa: B902 - every failure must end the job
        end_after_failure(session, error, rank, size)


if __name__ == "__main__":
    # Run the importable module, not this ``__main__`` copy of it, so state set
    # here (the report descriptor) is the state other modules see.
    from tmpi_adapters.launch.runtime import main as _main
    _main()
