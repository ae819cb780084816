"""The one wait loop: poll a condition without hogging a core, with a deadline.

Everything in tmpi that waits for other ranks waits here: the exchangers'
collectives and point-to-point requests, an asynchronous rule's end of
training, the end-of-script meeting of the ranks.  So every wait can time
out and say what it waited for.

A *patient* wait (a synchronisation point, where a slow rank may keep us
for long) first polls flat out for :data:`SPIN_SECONDS` (a collective whose
ranks have all arrived completes in microseconds, and giving the core away
costs a scheduler time slice), then yields the core between polls, then
backs off to short sleeps.  An *impatient* wait follows a synchronisation
point, so every rank is there: it polls without pause, because MPI moves a
transfer only while it is polled.  With more ranks than cores every wait
yields: the rank being waited for needs the core.
"""
import os
import sys
import threading
import time

#: Seconds ranks may take to meet while starting (others may still be
#: importing Theano or compiling): far longer than a step's wait.
START_SECONDS = 600.0
#: Seconds a patient wait polls without yielding the core.
SPIN_SECONDS = 50e-6
#: Polls between two looks at the clock for the deadline.
_SPIN_CHECK = 256
_YIELD_CHECK = 64
#: Yields before a wait starts sleeping between polls.
_YIELDS = 2000
#: Polls before a wait sets up its deadline: a collective the other ranks
#: have reached already ends on the second (MPICH, shared memory), and the
#: rank that arrives last is the one every rank waits for.
_QUICK = 4


#: The wait each thread is in, by thread ident: what it waits for and since
#: when (read by the watchdog, which tells a rank blocked on others from a
#: rank at work).
_waits = {}


def current_wait(thread_ident):
    """The :class:`Deadline` of the wait thread ``thread_ident`` is in, or ``None``."""
    return _waits.get(thread_ident)


#: The cores here (asked once: every wait asks, and asking costs microseconds).
_CORES = os.cpu_count() or 1


def oversubscribed(size):
    """True when ``size`` ranks of this job outnumber the cores here."""
    return size > _CORES


class Deadline:
    """When a wait has lasted too long, and what to do then.

    ``on_timeout(what, waited, frame)`` is called once the wait passes
    ``timeout`` seconds (never with ``timeout=None``); if it returns, the
    wait goes on without a deadline.  ``frame`` is the waiting loop's frame:
    it stays on the stack exactly as long as the wait lasts, which is how a
    watchdog learns that the wait is over.
    """

    __slots__ = ("what", "on_timeout", "frame", "start", "at")

    def __init__(self, what, timeout, on_timeout, frame):
        self.what, self.on_timeout, self.frame = what, on_timeout, frame
        self.start = time.perf_counter()
        self.at = None if timeout is None else self.start + timeout

    def check(self):
        if self.at is not None and time.perf_counter() > self.at:
            self.at = None
            what = self.what() if callable(self.what) else self.what
            self.on_timeout(what, time.perf_counter() - self.start, self.frame)


def wait_for(test, what, timeout, on_timeout, patient=True, crowded=False):
    """Call ``test()`` until it returns true.

    Parameters
    ----------
    test : callable
        ``test() -> bool``; for MPI requests, their ``Test``.
    what : str or callable
        Names what is awaited in a stall report (a callable is asked only
        then, so it can name the ranks still missing).
    timeout : float or None
        Seconds before ``on_timeout`` is called; ``None``: never.
    on_timeout : callable
        ``on_timeout(what, waited, frame)``; raise to end the wait, return to
        keep waiting (see :class:`Deadline`).
    patient : bool
        A synchronisation point (spin briefly, then yield and sleep) or a
        transfer every rank has reached (poll flat out).
    crowded : bool
        More ranks than cores: always yield between polls.
    """
    for _ in range(_QUICK):
        if test():
            return
    deadline = Deadline(what, timeout, on_timeout, sys._getframe())
    thread = threading.get_ident()
    outer = _waits.get(thread)
    _waits[thread] = deadline
    try:
        _poll(test, deadline, patient, crowded)
    finally:
        if outer is None:
            del _waits[thread]
        else:
            _waits[thread] = outer
        # The deadline holds this frame and the frame the deadline: without
        # this, every frame below the wait (the script's too) lived on until
        # the cyclic garbage collector ran, with its locals and open files.
        deadline.frame = None


def _poll(test, deadline, patient, crowded):
    if not crowded:
        until = deadline.start + SPIN_SECONDS if patient else float("inf")
        polls = 0
        while time.perf_counter() < until:
            if test():
                return
            polls += 1
            if polls % _SPIN_CHECK == 0:
                deadline.check()
    spins = 0
    while not test():
        spins += 1
        if spins < _YIELDS:
            os.sched_yield()
        else:
            # Past a few ms nobody is waiting on latency; let co-located
            # ranks (oversubscribed runs) have the core.
            time.sleep(min(1e-3, 1e-5 * (spins - _YIELDS + 1)))
        if spins % _YIELD_CHECK == 0:
            deadline.check()
