"""The job directory: the files ranks leave for their launcher, and the
directories killed launchers left behind.

``tmpi wrap`` makes one ``tmpi-job-*`` directory per job in the temporary
directory and names itself in it (:func:`claim_job_dir`); each rank writes
its files there (:func:`rank_file`).  The
launcher removes it when the job ends, also on SIGINT and SIGTERM; a launcher
killed with SIGKILL cannot, so every launch first sweeps the directories whose
launcher is gone (:func:`sweep_job_dirs`).
"""
import mmap
import os
import re
import shutil
import socket
import struct
import tempfile
import time

from tmpi_adapters.process import channel


#: The job directory's name, and the file in it that names its launcher
#: (``"<pid> <start time> <host>"``), so that a later launch can tell a
#: directory whose launcher was killed from one in use.
JOB_DIR_PREFIX = "tmpi-job-"
LAUNCHER_FILE = "launcher"
#: A job directory without a launcher file (being claimed, or an older
#: tmpi's) is left alone this long.
UNCLAIMED_AGE = 24 * 3600.0


# ------------------------------------------------------------- the rank files

#: The job directory of a rank ``tmpi wrap`` started (its environment).
JOB_DIR_ENV = "TMPI_JOB_DIR"
#: The launching ``tmpi`` process, so ranks on its machine can end the job if
#: it disappears (see :mod:`tmpi_adapters.reliability.watchdog`).
LAUNCHER_PID_ENV = "TMPI_LAUNCHER_PID"
LAUNCHER_HOST_ENV = "TMPI_LAUNCHER_HOST"


def job_dir():
    return os.environ.get(JOB_DIR_ENV)


def rank_file(directory, rank, kind):
    """``<directory>/rank<N>.<kind>``: the files a rank leaves for the launcher.

    ``pid`` (``"<pid> <host>"``, written at start), ``stderr`` (non-zero
    ranks' stderr), ``done`` (the script finished), ``exit`` (the script
    ended with a non-zero ``sys.exit``; holds the status), ``failed`` (a
    failure was reported and the job is being aborted), ``preempted`` (rank
    0 wrote the checkpoint a SIGTERM or SIGUSR1 asked for; holds its
    report), ``progress`` (rank 0's training step, :class:`Progress`).
    """
    return os.path.join(directory, "rank%d.%s" % (rank, kind))


_REMOTE = None


def remote():
    """True when this rank runs where its launcher's job directory is not
    (another machine, no shared file system) and the launcher gave it a
    :mod:`~tmpi_adapters.process.channel` to send its files through."""
    global _REMOTE
    if _REMOTE is None:
        directory = job_dir()
        _REMOTE = bool(os.environ.get(channel.CHANNEL_ENV) and directory and
                       not os.path.exists(os.path.join(directory, LAUNCHER_FILE)))
    return _REMOTE


#: The pipe through which a rank tells the ``tmpi wrap`` above it (an
#: enclosing MPI job's, :mod:`~tmpi_adapters.launch.supervise`) how its
#: script ended.
SUPERVISOR_FD_ENV = "TMPI_SUPERVISOR_FD"
#: The file where rank 0 keeps its training step for the ``tmpi wrap`` above
#: it (:class:`Progress`), when there is no job directory.
PROGRESS_FILE_ENV = "TMPI_PROGRESS_FILE"
#: The marks that say a rank ended the way tmpi knows of.
ENDINGS = ("done", "exit", "failed", "preempted")


def supervised():
    """True in a rank whose parent supervises it (:mod:`~tmpi_adapters.launch.supervise`)."""
    return os.environ.get(SUPERVISOR_FD_ENV, "").isdigit()


def mark(rank, kind, text="", life=True):
    """Leave ``rank<N>.<kind>`` in the job directory (no-op outside ``tmpi
    wrap``); a rank's ending goes to its supervisor too, where it has one.
    ``life=False``: from another process than the rank (its supervisor),
    which must not stand for the rank on the channel."""
    supervisor = os.environ.get(SUPERVISOR_FD_ENV, "")
    if kind in ENDINGS and supervisor.isdigit():
        try:
            os.write(int(supervisor), kind.encode() + b"\n")
        except OSError:
            pass
    directory = job_dir()
    if not directory:
        return
    if remote():
        channel.send_file(rank, kind, text, life=life)
        return
    try:
        os.makedirs(directory, exist_ok=True)
        with open(rank_file(directory, rank, kind), "w") as handle:
            handle.write(text)
    except OSError:
        pass  # the launcher only loses a detail of its final message


class Progress:
    """Rank 0's training step, kept where its launcher reads it after the job
    ended however it ended (:func:`read_progress`): a file mapped into memory,
    so that a step costs one store and no system call, and what was stored
    outlives a SIGKILL."""

    def __new__(cls, directory=None, rank=0, path=None):
        if path is None and remote():  # another machine: the launcher keeps the file
            return channel.ProgressSender(rank)
        return super().__new__(cls)

    def __init__(self, directory=None, rank=0, path=None):
        with open(path or rank_file(directory, rank, "progress"), "w+b") as handle:
            handle.truncate(8)
            self._map = mmap.mmap(handle.fileno(), 8)

    def write(self, step):
        struct.pack_into("<q", self._map, 0, step)


def read_progress(directory=None, rank=0, path=None):
    """The last step :class:`Progress` stored (in ``path``, or the job
    directory's file), or 0."""
    try:
        with open(path or rank_file(directory, rank, "progress"), "rb") as handle:
            return struct.unpack("<q", handle.read(8))[0]
    except (OSError, struct.error):
        return 0


def mark_checkpoint(path, step, finished):
    """Rank 0 wrote the checkpoint ``path`` (at training call ``step``): the
    launcher restarts from it even where it cannot see rank 0's files."""
    mark(0, "checkpoint", "%d %d %s" % (step, bool(finished), path))


def read_checkpoint_mark(directory):
    """``(path, step, finished)`` of :func:`mark_checkpoint`, or ``None``."""
    try:
        with open(rank_file(directory, 0, "checkpoint")) as handle:
            step, finished, path = handle.read().split(" ", 2)
        return path, int(step), finished == "1"
    except (OSError, ValueError):
        return None


class RankInfo:
    """What the launcher knows of one rank from its files in the job directory:
    its pid and host, and the pid of the supervisor it runs under, if any."""

    def __init__(self, rank, pid, host, supervisor=None):
        self.rank, self.pid, self.host, self.supervisor = rank, pid, host, supervisor


def read_ranks(directory):
    """``{rank: RankInfo}`` of every rank that has written its ``pid`` file."""
    ranks = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return ranks
    for name in names:
        match = re.match(r"rank(\d+)\.pid$", name)
        if not match:
            continue
        try:
            with open(os.path.join(directory, name)) as handle:
                fields = handle.read().split()
            ranks[int(match.group(1))] = RankInfo(
                int(match.group(1)), int(fields[0]), fields[1] if len(fields) > 1 else None,
                int(fields[2]) if len(fields) > 2 else None)
        except (OSError, ValueError, IndexError):
            continue  # being written
    return ranks


def has_mark(directory, rank, kind):
    return os.path.exists(rank_file(directory, rank, kind))


def process_state(pid):
    """The state letter of process ``pid`` in ``/proc`` (``"T"``: stopped,
    ``"Z"``: a zombie), or ``None``."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def process_alive(pid):
    """True while ``pid`` runs (a zombie waiting to be reaped counts as gone)."""
    state = process_state(pid)
    if state is not None:
        return state not in ("Z", "X")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not os.path.exists("/proc")  # /proc exists but had no entry: gone


def belongs_to_job(pid, directory):
    """True when process ``pid`` is a rank of the job using ``directory`` (not a
    stranger that reused a dead rank's pid)."""
    marker = ("%s=%s" % (JOB_DIR_ENV, directory)).encode()
    try:
        with open("/proc/%d/environ" % pid, "rb") as handle:
            return marker in handle.read().split(b"\0")
    except OSError:
        return False


# -------------------------------------------------------------- job directories

def process_start_time(pid):
    """When process ``pid`` started (clock ticks since boot), or ``None``."""
    try:
        with open("/proc/%d/stat" % pid) as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def claim_job_dir(directory):
    """Name this process as the launcher of ``directory``."""
    with open(os.path.join(directory, LAUNCHER_FILE), "w") as handle:
        handle.write("%d %s %s" % (os.getpid(), process_start_time(os.getpid()) or "-",
                                   socket.gethostname()))


def launcher_alive(directory):
    """False when the launcher that claimed ``directory`` on this machine is
    gone; True while it runs, or when that cannot be told (another machine's,
    or a directory just being claimed)."""
    try:
        with open(os.path.join(directory, LAUNCHER_FILE)) as handle:
            pid, started, host = handle.read().split()
    except (OSError, ValueError):
        try:
            return time.time() - os.stat(directory).st_mtime < UNCLAIMED_AGE
        except OSError:
            return True
    if host != socket.gethostname():
        return True
    return process_alive(int(pid)) and started in ("-", process_start_time(int(pid)))


def sweep_job_dirs(parent=None):
    """Remove the job directories of launchers that were killed (``kill -9``
    is the one way a launcher leaves its directory behind)."""
    parent = parent or tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(parent) if n.startswith(JOB_DIR_PREFIX)]
    except OSError:
        return
    for name in names:
        path = os.path.join(parent, name)
        try:
            if not os.path.isdir(path) or os.path.islink(path) or \
                    os.stat(path).st_uid != os.getuid():
                continue
        except OSError:
            continue
        if not launcher_alive(path):
            shutil.rmtree(path, ignore_errors=True)
