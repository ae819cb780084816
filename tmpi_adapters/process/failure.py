"""What a rank says when the script fails, and how the job then ends: the
traceback of the user's code with library frames folded, one paragraph, the
``failed`` mark for the launcher, ``MPI_Abort``.
"""
import functools
import os
import sys
import sysconfig
import time
import traceback

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.process.jobdir import job_dir, mark, supervised
from tmpi_adapters.process.output import flush_partial_lines, report

#: Under a bare ``mpiexec`` (no ``tmpi wrap`` gathering reports) a failing
#: rank other than 0 waits this long before it reports: when rank 0 fails
#: too (the same error everywhere, the usual case) its abort ends the job
#: first and the error is printed once.
REPORT_GRACE = 2.0

#: Seconds from rank 0's last heartbeat to the moment every rank of an
#: enclosing job leaves together after a preemption (each hears it within a
#: heartbeat or two, says so to its ``tmpi wrap``, then waits for it; a loaded
#: machine may take seconds).
DEPARTURE = 5.0


#: tmpi's own package (installed, or an editable checkout's).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

#: Where installed libraries, tmpi and the standard library live: their
#: frames are summarised in failure reports, so the traceback shows the
#: user's code.
_LIBRARY_DIRS = tuple(sorted({os.path.realpath(p) + os.sep for p in (
    sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
    sysconfig.get_paths().get("stdlib"), _PACKAGE_DIR) if p}))


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
        named = [f.filename for f in hidden if not f.filename.startswith("<")] or \
            [hidden[-1].filename]  # numpy's "<__array_function__ internals>" names no library
        lines.append("  ... %d frame(s) inside libraries, from %s\n"
                     % (len(hidden), _library_name(named[-1])))
    if len(lines) == 1:
        return ""
    return "".join(lines)


def _library_name(filename):
    real = os.path.realpath(filename)
    if real.startswith(_PACKAGE_DIR + os.sep):
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
    notes = "".join(" " + note for note in getattr(error, "__notes__", ()))
    return "%stmpi: rank %d of %d failed: %s: %s%s" % (
        user_traceback(error), rank, size, type(error).__name__, _first_line(error), notes)


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
    flush_partial_lines()
    if size > 1 and rank != 0 and not job_dir():
        time.sleep(REPORT_GRACE)  # rank 0's abort, if it fails too, comes first
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


def leaves_together():
    """True where a preempted job's ranks each leave on their own with its
    status: the tasks of ``srun`` (each under its ``tmpi wrap``), whose
    status Slurm reads task by task.  Under an enclosing ``mpiexec`` rank 0
    aborts with it instead: hydra returns an abort's status, where ranks
    leaving one by one would have it kill the last ones (status 9)."""
    return supervised() and not job_dir() and "SLURM_PROCID" in os.environ


def end_preempted(session, preempted, size):
    """Rank 0 wrote the checkpoint a SIGTERM or SIGUSR1 asked for and said so
    (:class:`~tmpi_adapters.reliability.preemption.Preempted`): finish
    without a failure report and end the whole job with its status (the
    other ranks wait in the step rank 0 did not start)."""
    finish_after_failure(session, preempted)
    flush_partial_lines()
    if size > 1 and leaves_together():
        # srun's tasks: its last heartbeat told the other ranks, which leave
        # with this status too (watchdog), so that srun sees every task end
        # with it; an abort would have Slurm kill them all, and report that
        # instead.  They leave at the moment it named; it leaves just after.
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(DEPARTURE + 0.5)
        os._exit(preempted.code)
    if size > 1:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(preempted.code)
    sys.exit(preempted.code)


def ends_cleanly(error):
    """True for a tmpi error that means "nothing to do" (exit status 0): a
    requeued job whose run had already finished."""
    return isinstance(error, TmpiError) and error.exit_code == 0


def end_quietly(session, error, rank):
    """Every rank stops here without a failure (:func:`ends_cleanly`); rank
    0 says why."""
    finish_after_failure(session, error)
    if rank == 0:
        report("tmpi: %s" % error)


def exit_status(code):
    """The process status ``sys.exit(code)`` gives (a message is status 1)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1
