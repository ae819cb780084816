"""One job at a time in a ``--checkpoint-dir``.

Two jobs writing checkpoints to one directory overwrite each other's files,
and a ``--resume auto`` then continues whichever wrote last.  Rank 0 of a
job that writes checkpoints therefore holds an exclusive lock on
:data:`NAME` in the directory for as long as it runs (:func:`hold`); a
second job's rank 0 is refused, naming the job that holds it.

The lock is the kernel's (``flock``): it goes with the process that holds
it however that process ends (``kill -9``, a node's out-of-memory killer),
so a dead job's lock never stands in the way.  The file holds the holder's
description for the refusal, and is removed when the job ends normally; the
file a killed job leaves is taken by the next job as it is.
A job restarted at once (``--max-restarts``) may find its previous rank 0
still exiting: a lock whose holder cannot be seen alive here is waited for,
up to :data:`WAIT` seconds.
"""
import fcntl
import os
import socket
import time

from tmpi_adapters.errors import CheckpointError
from tmpi_adapters.process.jobdir import process_state

#: The lock file in the checkpoint directory.
NAME = ".tmpi-lock"
#: Seconds a lock whose holder may be ending (it runs elsewhere, or is
#: exiting here) is waited for before the job is refused.
WAIT = 10.0


def hold(directory, script):
    """Lock ``directory`` for this process; returns what :func:`release`
    takes (the lock is also released when this process ends).
    :class:`CheckpointError` when another job holds it."""
    path = os.path.join(directory, NAME)
    deadline = time.monotonic() + WAIT
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise CheckpointError("cannot create the lock file %s: %s. Check "
                                  "--checkpoint-dir." % (path, exc.strerror or exc))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read(fd)
            os.close(fd)
            if _alive_here(holder) or time.monotonic() >= deadline:
                raise CheckpointError(
                    "--checkpoint-dir %s is in use by another job (%s): two jobs writing "
                    "checkpoints there would overwrite each other's, and --resume would "
                    "continue whichever wrote last. Give this job a --checkpoint-dir of its "
                    "own, or wait for that job to end." % (
                        directory, _describe(holder) or "its lock file %s says nothing more"
                        % path))
            time.sleep(0.2)
            continue
        except OSError as exc:
            os.close(fd)
            raise CheckpointError("cannot lock %s: %s. Check --checkpoint-dir (a file "
                                  "system without locks?)." % (path, exc.strerror or exc))
        if _same_file(fd, path):
            break
        os.close(fd)  # its holder removed it as we locked it: lock the file there now
    text = "%d %s %d %s" % (os.getpid(), socket.gethostname(), int(time.time()),
                            os.path.basename(script or "") or "-")
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode("utf-8", "replace"), 0)
    return fd, path


def release(held):
    """Let go of a lock :func:`hold` took, and remove its file (still
    holding it, so that a job waiting for it locks a file no one holds and
    tries again)."""
    if held is None:
        return
    fd, path = held
    try:
        if _same_file(fd, path):
            os.unlink(path)
    except OSError:
        pass
    os.close(fd)


def _same_file(fd, path):
    """True while ``path`` is the file open as ``fd``."""
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _read(fd):
    """``(pid, host, since, script)`` of the lock's holder, or ``None``."""
    try:
        words = os.pread(fd, 4096, 0).decode("utf-8", "replace").split(" ", 3)
        return int(words[0]), words[1], int(words[2]), words[3]
    except (OSError, ValueError, IndexError):
        return None


def _alive_here(holder):
    """True when the holder runs on this machine and is not a zombie."""
    if holder is None or holder[1] != socket.gethostname():
        return False
    return process_state(holder[0]) not in (None, "Z", "X")


def _describe(holder):
    if holder is None:
        return ""
    pid, host, since, script = holder
    return "%s, pid %d on %s, since %s" % (
        script if script != "-" else "a script", pid, host,
        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)))
