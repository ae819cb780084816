"""The launching process's signals: Ctrl-C, SIGTERM and SIGHUP stop the job
(:func:`stopped_by_signals`); with ``--checkpoint-dir`` SIGTERM and SIGUSR1
ask it for a checkpoint and a stop instead (:class:`Preemption`)."""
import contextlib
import signal
import sys
import time

from tmpi_adapters.reliability.preemption import GRACE, PREEMPTED, SIGNALS


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the launching process: stop the job as for
    Ctrl-C, and exit with ``128 + signum``."""

    def __init__(self, signum):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def handled(numbers, handler, only_default=False):
    """Signals ``numbers`` go to ``handler`` until the block ends
    (``only_default``: only those the caller left at their default, so that
    what it ignores, under ``nohup`` say, stays ignored)."""
    saved = {}
    for number in numbers:
        try:
            if not only_default or signal.getsignal(number) == signal.SIG_DFL:
                saved[number] = signal.signal(number, handler)
        except ValueError:  # not the main thread: the handlers stay as they are
            break
    try:
        yield
    finally:
        for number, previous in saved.items():
            signal.signal(number, previous)


def _stop(signum, frame):
    raise Stopped(signum)


@contextlib.contextmanager
def stopped_by_signals(preemption=None):
    """While the job runs, SIGTERM and SIGHUP raise :class:`Stopped` (SIGINT
    raises ``KeyboardInterrupt``), so that the job is stopped and its
    directory removed instead of the launcher dying on the spot; with a
    :class:`Preemption`, SIGTERM and SIGUSR1 go to it instead."""
    with handled((signal.SIGHUP,) + (() if preemption else (signal.SIGTERM,)), _stop,
                 only_default=True), \
            handled(SIGNALS if preemption else (), preemption, only_default=True):
        yield


class Preemption:
    """The launcher's SIGTERM or SIGUSR1 when the ranks checkpoint on it
    (``--checkpoint-dir``; :mod:`~tmpi_adapters.reliability.preemption`):
    passed on to the job as SIGUSR1 (``mpiexec`` gives it to every rank), so
    that rank 0 writes a checkpoint at the end of the step in flight and the
    job ends with :data:`PREEMPTED`.  A second signal stops the job at once;
    so does the end of the ``grace`` (:meth:`overdue`), which the watch of
    the job acts on.

    Attributes
    ----------
    signal : str or None
        The name of the signal received.
    process : subprocess.Popen or None
        The ``mpiexec`` of the job that runs now.
    grace : float
        ``--preempt-grace``: seconds the step in flight has to end.
    directory : str or None
        ``--checkpoint-dir``, where the newest checkpoint is looked for when
        the grace passed.
    """

    def __init__(self, grace=GRACE, directory=None):
        self.signal = None
        self.process = None
        self.grace = grace
        self.directory = directory
        self._since = None

    def __call__(self, number, frame):
        if self.signal is not None:
            raise Stopped(number)
        self.signal = signal.Signals(number).name
        self._since = time.monotonic()
        sys.stdout.flush()
        sys.stderr.write("tmpi: %s: rank 0 writes a checkpoint at the end of the step in "
                         "flight, then the job ends with status %d (%s again stops it at "
                         "once; so does a step that has not ended in %g s, --preempt-grace)."
                         "\n" % (self.signal, PREEMPTED, self.signal, self.grace))
        sys.stderr.flush()
        self.pass_on()

    def overdue(self):
        """True once the grace has passed since the signal."""
        return self._since is not None and time.monotonic() - self._since >= self.grace

    def left(self):
        """Seconds of the grace left (``None`` before any signal)."""
        return None if self._since is None else \
            max(0.0, self.grace - (time.monotonic() - self._since))

    def pass_on(self):
        """Give the running job the signal (SIGUSR1: Open MPI's ``mpirun``
        passes it on too, where it would end the job on SIGTERM)."""
        if self.process is not None and self.process.poll() is None:
            try:
                self.process.send_signal(signal.SIGUSR1)
            except OSError:
                pass


def signals_ignored():
    """Let the job's clean-up finish even when Ctrl-C comes again."""
    return handled((signal.SIGINT, signal.SIGTERM, signal.SIGHUP), signal.SIG_IGN)
