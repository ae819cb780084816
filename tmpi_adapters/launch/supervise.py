"""A rank that an enclosing MPI job started (``mpiexec -n 4 tmpi wrap ...``,
``srun tmpi wrap ...``) runs as a child of that ``tmpi wrap``, which stays to
say how it ended.

When a rank is killed (``kill -9``, the out-of-memory killer, a segfault) the
MPI launcher kills the other ranks at once, so no rank can report it, and the
launcher's own banner names a pid and a signal, not a rank.  The ``tmpi
wrap`` the launcher started therefore stays a small process (nothing but
tmpi's command line imported, MPI left to the rank) between the launcher and
the rank: the rank inherits its environment, standard streams, descriptors
(the launcher's PMI connection) and CPU affinity; the supervisor passes its
signals on and, when the rank dies of another signal, writes one line naming
the rank, its host and the likely cause in ``tmpi wrap -n N``'s words, then
exits with ``128 + N``.

With ``--checkpoint-dir`` it also bounds a preemption: when the rank has not
ended ``--preempt-grace`` seconds after a SIGTERM or SIGUSR1 (a rank stopped
or stuck holds the step up, so rank 0 never writes its checkpoint), the
supervisor kills it and exits with status 75; rank 0's names the newest
checkpoint on disk and the steps lost, a rank that was stopped (SIGSTOP)
is named by its own.

Under ``tmpi wrap --hosts`` each rank runs under one too
(``python -m tmpi_adapters.launch.supervise RANK-COMMAND``, :data:`SUPERVISED`):
there it says nothing itself but leaves a ``killed`` mark for the launcher
(over the channel from another host), so that every rank a signal killed is
named, where hydra's banner names one rank of the job, with its status alone.
"""
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

from tmpi_adapters.launch.signals import handled
from tmpi_adapters.launch.target import target_argv
from tmpi_adapters.launch.watch import describe_signal
from tmpi_adapters.process.jobdir import (PROGRESS_FILE_ENV, SUPERVISOR_FD_ENV, job_dir, mark,
                                         process_state, read_progress)
from tmpi_adapters.reliability.preemption import PREEMPTED, SIGNALS, overdue_report

#: The signals the supervisor passes on to its rank: a scheduler's preemption
#: (SIGTERM, SIGUSR1: the rank writes its checkpoint), Ctrl-C, and the rest an
#: MPI launcher forwards.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP,
             signal.SIGCONT)
#: Where MPI launchers name a rank, and the job's size, in its environment:
#: hydra's and Slurm's PMI, Open MPI, PMIx, Slurm; the first one set wins.
RANK_NAMES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
SIZE_NAMES = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "SLURM_NPROCS")


#: Seconds a supervisor whose rank a signal killed stays after saying so.
KILLED_GRACE = 0.5
#: The words before a rank's command that run it under a supervisor
#: (``tmpi wrap --hosts``).
SUPERVISED = [sys.executable, "-m", "tmpi_adapters.launch.supervise"]


def die_with(parent):
    """``preexec_fn``: the kernel kills the child (``mpiexec``, a rank) when
    ``parent`` dies, however it dies (``kill -9`` included)."""
    def arrange():
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGKILL)
        except (OSError, AttributeError):
            return  # not Linux: the ranks' own watchdog still notices
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)
    return arrange


def rank_command(target, script_args):
    """The command of one rank: the runtime with the script (or module) and
    its arguments, under this Python."""
    return [sys.executable, "-m", "tmpi_adapters.launch.runtime"] + target_argv(target) + \
        list(script_args)


def launcher_place(env=None):
    """``(rank, size)`` as the MPI launcher named them in the environment
    (``None`` for what it did not name), read without starting MPI: MPI
    belongs to the rank, which connects to the launcher itself."""
    env = os.environ if env is None else env

    def first(names):
        for name in names:
            if env.get(name, "").isdigit():
                return int(env[name])
        return None
    return first(RANK_NAMES), first(SIZE_NAMES)


class Forwarder:
    """The signal handler of the supervisor: each signal goes on to the rank
    (those that come before it is started, as soon as it is).

    Attributes
    ----------
    received : set of int
        The signals passed on: the rank's death by one of them was asked for.
    preempted : tuple or None
        ``(name, time.monotonic())`` of the first SIGTERM or SIGUSR1.
    """

    def __init__(self):
        self.child = None
        self.received = set()
        self.preempted = None
        self._pending = []
        self._ignored = set()

    def __call__(self, number, frame):
        if number in self._ignored:
            return
        self.received.add(number)
        if number in SIGNALS and self.preempted is None:
            self.preempted = (signal.Signals(number).name, time.monotonic())
        if self.child is None:
            self._pending.append(number)
        else:
            self._send(number)

    def ignore_from_now(self, number):
        """Take ``number`` as a signal to ignore, for good."""
        self._ignored.add(number)

    def start(self, child):
        self.child = child
        for number in self._pending:
            self._send(number)

    def _send(self, number):
        if self.child.returncode is None:
            try:
                os.kill(self.child.pid, number)
            except ProcessLookupError:  # ended between its wait and the signal
                pass


def supervise(command, preexec_fn=None, preemption=None):
    """Run one rank, ``command``, as a child and return its exit status, or
    ``None`` where it cannot be (then the caller runs the rank itself): no
    ``fork``; MPI started here already (``tmpi_adapters.wrap`` called by a
    script under ``mpiexec``), which holds the rank's one connection to the
    launcher; or a terminal on standard input (``srun --pty``), which a
    child in a process group of its own could not read.  ``preexec_fn``
    runs in the child before the rank starts (the launcher's
    ``PR_SET_PDEATHSIG``: the rank dies with the supervisor, so a launcher
    that kills the supervisor ends its rank too).  ``preemption``:
    ``(grace, checkpoint directory)`` when SIGTERM and SIGUSR1 checkpoint
    (``--checkpoint-dir``), to bound them."""
    if not hasattr(os, "fork") or "mpi4py.MPI" in sys.modules or os.isatty(0):
        return None
    forward = Forwarder()
    # The rank says through this pipe how its script ended (jobdir.mark).
    endings, said = os.pipe()
    os.environ[SUPERVISOR_FD_ENV] = str(said)
    os.set_inheritable(said, True)
    progress = None
    if preemption is not None:
        # Where rank 0 keeps its step, for the steps a bounded preemption loses.
        handle, progress = tempfile.mkstemp(prefix="tmpi-progress-")
        os.close(handle)
        os.environ[PROGRESS_FILE_ENV] = progress
    # A signal this process ignores (nohup) stays ignored, in the rank too.
    caught = [number for number in FORWARDED if signal.getsignal(number) != signal.SIG_IGN]
    blocked = False
    try:
        with handled(caught, forward):
            try:
                # Its own process group: hydra signals each rank's whole group, so
                # the rank then gets each signal once, from here.
                child = subprocess.Popen(command, close_fds=False, process_group=0,
                                         preexec_fn=preexec_fn)
            except OSError:
                return None
            finally:
                os.close(said)
                del os.environ[SUPERVISOR_FD_ENV]
                os.environ.pop(PROGRESS_FILE_ENV, None)
            forward.start(child)
            if preemption is None:
                status = child.wait()
            else:
                status = _wait_bounded(child, forward, preemption, progress)
            # The rank has ended; what is left is saying how, and the status.
            # A launcher that tears the job down meanwhile (srun's
            # --kill-on-bad-exit, as the first rank leaves) must not turn that
            # status into its signal's: from here this process ignores the
            # signals it passed on (held back while the handlers are put
            # back; one that came meanwhile is dropped once ignored).
            for number in caught:
                forward.ignore_from_now(number)
            signal.pthread_sigmask(signal.SIG_BLOCK, caught)
            blocked = True
        for number in caught:
            signal.signal(number, signal.SIG_IGN)
        ended = _read_all(endings)
    finally:
        if blocked:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, caught)
        os.close(endings)
        if progress is not None:
            os.unlink(progress)
    if status == "overdue":
        return PREEMPTED
    # Under tmpi wrap's own launcher (a job directory) the launcher speaks.
    quiet = bool(job_dir())
    if b"preempted" in ended or status < 0 and forward.preempted is not None and \
            -status not in forward.received:
        # The rank stopped for a preemption (its checkpoint is rank 0's), or
        # MPI made it crash as the others left for one: the job ends with
        # the preemption's status, which a batch script may requeue on.
        return PREEMPTED
    if status == 0 and not ended:
        if not quiet:
            report_left(child.pid)
        return 1
    if status >= 0:
        return status
    # Death by a signal passed on from here was asked for (a scheduler's
    # SIGTERM without --checkpoint-dir): not a failure to report.
    if -status not in forward.received:
        if quiet:
            rank, _ = launcher_place()
            if rank is not None:
                mark(rank, "killed", str(-status), life=False)
                # The MPI launcher tears the job down when this process ends:
                # a moment for the ranks killed at the same time (a host's
                # ranks, an out-of-memory kill) to have theirs named too.
                time.sleep(KILLED_GRACE)
        else:
            report_killed(child.pid, -status)
    return 128 - status


def _wait_bounded(child, forward, preemption, progress):
    """The rank's status, as ``child.wait()``; or ``"overdue"`` when it had
    not ended ``grace`` seconds after a preemption's signal: it is then
    killed, and this rank's words said."""
    grace, directory = preemption
    try:
        ended = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        ended = None
    try:
        while child.poll() is None:
            left = None if forward.preempted is None else \
                grace - (time.monotonic() - forward.preempted[1])
            if left is not None and left <= 0:
                break
            timeout = 1.0 if left is None else min(1.0, left + 0.01)
            if ended is not None:
                select.select([ended], [], [], timeout)
            else:
                time.sleep(min(timeout, 0.1))
    finally:
        if ended is not None:
            os.close(ended)
    if child.returncode is not None:
        return child.returncode
    stopped = process_state(child.pid) == "T"
    try:
        os.killpg(child.pid, signal.SIGKILL)  # the rank and anything it started
    except OSError:
        pass
    child.wait()
    rank, _ = launcher_place()
    who = "%s (pid %d on %s)" % (_who(), child.pid, socket.gethostname())
    if rank in (0, None):
        line = overdue_report(forward.preempted[0], grace, directory,
                              read_progress(path=progress), None, True,
                              "%s was stopped (SIGSTOP)" % who if stopped else None)
    elif stopped:
        line = ("tmpi: %s was stopped (SIGSTOP) and held up the step in flight past "
                "--preempt-grace %g s after the %s; it was killed." % (
                    who, grace, forward.preempted[0]))
    else:
        line = None
    if line:
        sys.stdout.flush()
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    return "overdue"


def _read_all(fd):
    """What the rank wrote to its end of the pipe (it has ended: no waiting)."""
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).split()


def _who():
    rank, size = launcher_place()
    return "a rank" if rank is None else "rank %d" % rank if size is None else \
        "rank %d of %d" % (rank, size)


def report_left(pid):
    """Say which rank left without ending its script (``os._exit``, a library
    that ended the process): the MPI launcher only sees a process that never
    finalized MPI."""
    sys.stdout.flush()
    sys.stderr.write("tmpi: %s (pid %d on %s) left without finishing the script or finalizing "
                     "MPI (os._exit, or a library that ended the process); the MPI launcher "
                     "stops the other ranks.\n" % (_who(), pid, socket.gethostname()))
    sys.stderr.flush()


def report_killed(pid, number):
    """Say which rank a signal killed, in :class:`~tmpi_adapters.launch.watch.JobWatch`'s
    words, before the launcher tears the job down."""
    sys.stdout.flush()
    sys.stderr.write("tmpi: %s (pid %d on %s) was killed by %s; the MPI launcher stops the "
                     "other ranks.\n" % (_who(), pid, socket.gethostname(),
                                         describe_signal(number)))
    sys.stderr.flush()


def main(argv=None):
    """``python -m tmpi_adapters.launch.supervise COMMAND...``: run one rank of
    a ``tmpi wrap --hosts`` job under this process (its ``killed`` mark), or
    in its place where it cannot be supervised."""
    command = list(sys.argv[1:] if argv is None else argv)
    status = supervise(command, die_with(os.getpid()))
    if status is None:
        os.execv(command[0], command)
    sys.exit(status)


if __name__ == "__main__":
    main()
