"""A thread that moves started collectives on while Theano computes.

MPI moves a non-blocking collective only while the process is inside an MPI
call.  Over shared memory a started exchange gets far before the next call;
over a network (TCP) it stalls once the socket buffers are full.  CPU Theano
runs a whole training step in C holding the GIL, so no Python thread can
call MPI during it.  While an overlapped exchange (``--overlap``) is in
flight, this module's thread, in C and without the GIL, calls
``MPI_Request_get_status`` every :data:`PERIOD_S` on a receive that no
message ever matches, and sleeps in between: the MPI library's progress
engine runs inside that call, and the exchanger's own requests are never
touched (it alone completes them).

MPICH's own asynchronous progress thread (``MPIR_CVAR_ASYNC_PROGRESS=1``)
polls without sleeping: on 2 cores with 2 ranks over TCP it doubled the
compute time of every step and moved nothing sooner.  Polling every 1 ms
kept a 2 Gbit/s link busy; every 50-200 µs cost more compute than it saved.

The thread is compiled on first use (:mod:`tmpi_adapters.native`) and needs
``MPI_THREAD_MULTIPLE``, which mpi4py asks for by default; without either,
exchanges move only when a part starts or is waited for (:func:`start`
says why).
"""
import atexit
import ctypes
import os

from tmpi_adapters import native

#: How long the thread sleeps between two polls.
PERIOD_S = 1e-3
#: Overrides :data:`PERIOD_S`, in microseconds.
PERIOD_ENV = "TMPI_PROGRESS_PERIOD_US"
#: The tag of the receive the thread polls (no message ever carries it).
NEVER_TAG = 32000
_NEVER = bytearray(8)

_SOURCE = r"""
#include <pthread.h>
#include <stdint.h>
#include <time.h>

typedef int (*get_status_fn)(intptr_t, int *, void *);

struct progress {
    get_status_fn get_status;
    intptr_t request;
    long period_ns;
    volatile int active, running;
    pthread_t thread;
    char status[256];
};

static void *loop(void *arg) {
    struct progress *p = arg;
    struct timespec pause = {0, p->period_ns};
    int flag;
    while (p->running) {
        if (p->active)
            p->get_status(p->request, &flag, p->status);
        nanosleep(&pause, 0);
    }
    return 0;
}

int tmpi_progress_start(struct progress *p) {
    p->running = 1;
    return pthread_create(&p->thread, 0, loop, p);
}

void tmpi_progress_active(struct progress *p, int on) { p->active = on; }

void tmpi_progress_stop(struct progress *p) {
    p->running = 0;
    pthread_join(p->thread, 0);
}
"""


class _State(ctypes.Structure):
    _fields_ = [("get_status", ctypes.c_void_p), ("request", ctypes.c_ssize_t),
                ("period_ns", ctypes.c_long),
                ("active", ctypes.c_int), ("running", ctypes.c_int),
                ("thread", ctypes.c_ulong), ("status", ctypes.c_char * 256)]


def _function_address(name):
    """Function ``name`` of the MPI library this process has loaded (mpi4py's)."""
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/" in line and ".so" in line}
    for path in sorted(paths):
        if "mpi" not in path.rsplit("/", 1)[-1].lower() or "mpi4py" in path:
            continue
        try:
            function = getattr(ctypes.CDLL(path), name)
        except (OSError, AttributeError):
            continue
        return ctypes.cast(function, ctypes.c_void_p).value
    return None


class Progress:
    """The running thread: :meth:`busy` turns its polls on and off."""

    def __init__(self, library, state, request):
        self._library, self._state, self._on = library, state, False
        self._request = request

    def busy(self, on):
        on = bool(on)
        if on != self._on:
            self._library.tmpi_progress_active(ctypes.byref(self._state), int(on))
            self._on = on

    def close(self):
        if self._state is not None:
            self._library.tmpi_progress_stop(ctypes.byref(self._state))
            self._state = None
            self._request.Cancel()
            self._request.Wait()


def start(comm):
    """A :class:`Progress` polling a receive on ``comm`` (an mpi4py
    communicator) that nothing ever matches, or the reason there can be none
    (a str)."""
    from mpi4py import MPI
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        return "MPI was started without MPI_THREAD_MULTIPLE"
    address = _function_address("MPI_Request_get_status")
    if address is None:
        return ("the MPI library's MPI_Request_get_status was not found among the loaded "
                "libraries")
    try:
        library = ctypes.CDLL(native.build(_SOURCE, "progress", flags=("-O2", "-pthread")))
    except Exception as exc:  # no compiler, a failed build: exchanges still work
        return "no C compiler could build it (%s)" % (getattr(exc, "stderr", "") or exc,)
    for name in ("tmpi_progress_start", "tmpi_progress_active", "tmpi_progress_stop"):
        getattr(library, name).restype = ctypes.c_int if name.endswith("start") else None
    library.tmpi_progress_active.argtypes = [ctypes.c_void_p, ctypes.c_int]
    # A receive from itself no send matches: testing it (without completing
    # it) runs the progress engine, and no request of the exchanger is touched.
    request = comm.Irecv(_NEVER, source=comm.Get_rank(), tag=NEVER_TAG)
    state = _State(get_status=address, request=MPI._handleof(request),
                   period_ns=int(float(os.environ.get(PERIOD_ENV) or PERIOD_S * 1e6) * 1e3))
    if library.tmpi_progress_start(ctypes.byref(state)) != 0:
        request.Cancel()
        request.Wait()
        return "the thread could not be started"
    thread = Progress(library, state, request)
    # Before mpi4py's MPI_Finalize (registered earlier, so run later).
    atexit.register(thread.close)
    return thread
