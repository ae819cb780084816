"""Preemption: SIGTERM or SIGUSR1 ends a run with a checkpoint of the step it reached.

A scheduler that preempts a job sends SIGTERM, and a grace period later
SIGKILL; SLURM can send SIGUSR1 ahead of that (``--signal``).  With
``--checkpoint-dir`` each rank notes such a signal here instead of dying
(:func:`install`, before Theano is imported, so the note is never missed).
Rank 0 acts on it: at the start of its next call of a compiled function (the
step in flight has finished) the checkpointer writes a checkpoint, as for
``--checkpoint-every``, and raises :class:`Preempted`; the job then ends with
:data:`PREEMPTED`, and the same command with ``--resume auto`` continues
exactly.  When that step does not end within ``--preempt-grace`` seconds
(:data:`GRACE`: a rank stopped or stuck, its host gone), whoever started the
ranks (``tmpi wrap``'s launcher, or each rank's own ``tmpi wrap`` under
``srun``) stops them anyway, ends with :data:`PREEMPTED` too, and names the
newest checkpoint on disk and the steps lost (:func:`overdue_report`).
No rank waits for another and nothing travels per step: under BSP
every rank holds rank 0's state after each step, so rank 0's checkpoint is
the job's (a parameter rule's checkpoint is rank 0's in any case).  A rank
other than 0 that receives the signal tells rank 0 in its next heartbeat
(:mod:`~tmpi_adapters.reliability.watchdog`); ``mpiexec`` (MPICH's) passes
both signals on to every rank, and ``tmpi wrap`` passes SIGUSR1 to the job
when it receives either.

Nothing here imports numpy, Theano or MPI: ranks install it as they start.
"""
import os
import signal

from tmpi_adapters.process.failure import DEPARTURE as _DEPARTURE

#: The exit status of a preempted job: resumable (``EX_TEMPFAIL``, "try again").
PREEMPTED = 75
#: The signals that ask for a checkpoint and a stop.
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

#: Seconds the step in flight has, after the signal, to end and rank 0 to
#: write its checkpoint, before the job is stopped anyway: well inside
#: Slurm's ``KillWait`` (30 s by default), after which SIGKILL comes.
GRACE = 20.0

#: Seconds from rank 0's last heartbeat to the moment every rank of an
#: enclosing job leaves together after a preemption (defined where rank 0
#: leaves: :mod:`tmpi_adapters.process.failure`).
DEPARTURE = _DEPARTURE

#: Set in the ranks' environment when ``tmpi wrap`` was started with SIGINT
#: ignored (in the background, by a batch system): the ranks ignore it too,
#: as they would have inherited (an MPI launcher resets it).
IGNORE_SIGINT_ENV = "TMPI_IGNORE_SIGINT"

#: The name of the signal that asked this rank to stop (``"SIGTERM"``), or
#: ``None``; read once per call by the checkpointer.
requested = None


class Preempted(SystemExit):
    """Raised on rank 0 at the start of a call once the preemption checkpoint
    is written: a ``SystemExit``, so that the script's ``except Exception``
    does not take it for an error of its own while its ``finally`` blocks run."""

    def __init__(self, message):
        super().__init__(PREEMPTED)
        self.message = message


def wanted(options):
    """True when ``options`` make signals checkpoint: a ``--checkpoint-dir``,
    and strong scaling (a weak-scaling run cannot be resumed)."""
    return bool(options.extra.get("checkpoint_dir")) and options.scaling != "weak"


def install(options):
    """Note SIGTERM and SIGUSR1 (:data:`requested`) instead of dying, when
    :func:`wanted`; a signal the process ignores (``nohup``) stays ignored,
    and so does SIGINT where ``tmpi wrap`` ignored it (:data:`IGNORE_SIGINT_ENV`)."""
    if os.environ.get(IGNORE_SIGINT_ENV) == "1":
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread
            pass
    if not wanted(options):
        return
    for number in SIGNALS:
        try:
            if signal.getsignal(number) != signal.SIG_IGN:
                signal.signal(number, _note)
        except ValueError:  # not the main thread: signals keep their handlers
            return


def request(name):
    """Ask for a checkpoint and a stop (a signal, or another rank's heartbeat)."""
    global requested
    if requested is None:
        requested = name


def _note(number, frame):
    request(signal.Signals(number).name)


def bounds(options):
    """``(grace, checkpoint directory)`` of ``options`` when :func:`wanted`,
    else ``None``: ``--preempt-grace`` (checked by the reliability plugin)
    in seconds, and ``--checkpoint-dir`` made absolute."""
    if not wanted(options):
        return None
    value = options.extra.get("preempt_grace")
    directory = os.path.abspath(os.path.expanduser(options.extra["checkpoint_dir"]))
    return (GRACE if value is None else float(value)), directory


def overdue_report(name, grace, directory, progress=None, written=None, here=True,
                   stuck=None):
    """The ``tmpi: preempted:`` line of a job stopped because its step in
    flight did not end within the grace.

    Parameters
    ----------
    name : str
        The signal that asked for the stop (``"SIGTERM"``).
    grace : float
        ``--preempt-grace``, in seconds.
    directory : str
        ``--checkpoint-dir``.
    progress : int or None
        The training steps rank 0 had completed, when known.
    written : tuple or None
        ``(path, step)`` of the last checkpoint rank 0 said it wrote.
    here : bool
        Whether rank 0's disk is this machine's: else only ``written`` is known.
    stuck : str or None
        Which ranks held the step up, in words, when known.
    """
    from tmpi_adapters.reliability.checkpoint.fileformat import newest_whole
    head = ("tmpi: preempted: the step in flight did not end within %g s of the %s "
            "(--preempt-grace)%s, so the job was stopped; it ends with status %d."
            % (grace, name, ": %s" % stuck if stuck else "", PREEMPTED))
    path, step = newest_whole(directory) if here else (None, None)
    if written is not None and (path is None or written[1] > step):
        path, step = written
    if path is None:
        where = directory if here else "%s on rank 0's host" % directory
        lost = (", and the %d step(s) rank 0 had completed are lost" % progress
                if progress else "")
        return ("%s No checkpoint of this run is in %s: the same command with --resume auto "
                "starts from the beginning%s." % (head, where, lost))
    if progress is not None and progress >= step:
        lost = ("; rank 0 had completed step %d, so %d step(s) are lost"
                % (progress, progress - step))
    else:
        lost = ""
    return ("%s The newest checkpoint on disk is %s (step %d)%s: the same command with "
            "--resume auto continues from step %d." % (head, path, step, lost, step))
