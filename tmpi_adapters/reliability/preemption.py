"""Preemption: SIGTERM or SIGUSR1 ends a run with a checkpoint of the step it reached.

A scheduler that preempts a job sends SIGTERM, and a grace period later
SIGKILL; SLURM can send SIGUSR1 ahead of that (``--signal``).  With
``--checkpoint-dir`` each rank notes such a signal here instead of dying
(:func:`install`, before Theano is imported, so the note is never missed).
Rank 0 acts on it: at the start of its next call of a compiled function (the
step in flight has finished) the checkpointer writes a checkpoint, as for
``--checkpoint-every``, and raises :class:`Preempted`; the job then ends with
:data:`PREEMPTED`, and the same command with ``--resume auto`` continues
exactly.  No rank waits for another and nothing travels per step: under BSP
every rank holds rank 0's state after each step, so rank 0's checkpoint is
the job's (a parameter rule's checkpoint is rank 0's in any case).  A rank
other than 0 that receives the signal tells rank 0 in its next heartbeat
(:mod:`~tmpi_adapters.reliability.watchdog`); ``mpiexec`` (MPICH's) passes
both signals on to every rank, and ``tmpi wrap`` passes SIGUSR1 to the job
when it receives either.

Nothing here imports numpy, Theano or MPI: ranks install it as they start.
"""
import signal

#: The exit status of a preempted job: resumable (``EX_TEMPFAIL``, "try again").
PREEMPTED = 75
#: The signals that ask for a checkpoint and a stop.
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

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
    :func:`wanted`; a signal the process ignores (``nohup``) stays ignored."""
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
