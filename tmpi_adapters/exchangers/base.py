"""The Exchanger: one interface for moving parameter and gradient buffers.

Rules never talk to MPI directly; they call an :class:`Exchanger`.  Every
method works on contiguous buffers (numpy arrays for the ``mpi`` exchanger,
device arrays for GPU exchangers) and never pickles array data.  Where a
method has to copy (packing many arrays into one fused buffer, or making a
non-contiguous array contiguous) its docstring says so.

Reductions
----------
``allreduce(arrays, op="mean", weight=w)`` computes, for every array ``a``,
``sum_r(w_r * a_r) / sum_r(w_r)`` over ranks ``r`` in **one** collective per
bucket: the weight travels as one extra element of the fused buffer.  With
``weight=None`` the mean is ``sum_r(a_r) / size``; ``op="sum"`` is the plain sum.

Transfer precision
------------------
``precision`` is ``None``/``"native"`` (each array travels in its own dtype),
``"fp32"``, ``"fp16"`` or ``"bf16"``.  Reduced precisions halve the bytes on the
wire; partial sums are always accumulated in float32 and results are returned
in each array's own dtype.

Borrowed results
----------------
Inside ``with exchanger.borrowing():`` an ``allreduce`` without ``out`` may
return views of the exchanger's own fused buffers (or, on one rank, the input
arrays themselves) instead of fresh arrays: no copy out.  Such results are
valid until the next ``allreduce`` of the same array signature and must not be
modified.  The in-graph gradient exchange uses this; exchangers that ignore it
stay correct.

Statistics
----------
``exchanger.stats`` (an :class:`ExchangeStats`) accumulates the seconds spent
waiting for other ranks to arrive (``wait_s``) apart from the seconds spent
moving and reducing data, so the recorder can tell stragglers from bandwidth.
Exchangers that do not fill it report everything as communication.
"""
from __future__ import annotations

import abc
import contextlib
import sys
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np

from tmpi_adapters.exchangers.waiting import oversubscribed, wait_for
from tmpi_adapters.options import check_precision

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterator, Sequence
    from types import FrameType

    from tmpi_adapters.exchangers.envelope import Envelope
    from tmpi_adapters.exchangers.lockstep import Lockstep

    #: An array an exchanger moves: a ``numpy.ndarray``, or for an exchanger
    #: whose :attr:`~Exchanger.memory` is ``"device"`` also a device array
    #: (CuPy's, or anything with ``__cuda_array_interface__``), which no one
    #: class names.
    Array = Any
    #: ``on_stall(what, waited, frame)``: see :class:`Exchanger`.
    StallHandler = Callable[[str, float, FrameType], bool | None]

_T = TypeVar("_T")

REDUCE_OPS = ("mean", "sum")

#: Pass as ``source`` to :meth:`Exchanger.irecv`/:meth:`Exchanger.probe` to
#: accept a message from any rank.
ANY_SOURCE = -1
#: Pass as ``tag`` to accept any tag.
ANY_TAG = -1


class Request(abc.ABC):
    """A pending non-blocking operation."""

    @abc.abstractmethod
    def test(self) -> bool:
        """Return True once the operation has completed (never blocks)."""

    @abc.abstractmethod
    def wait(self, timeout: float | None = None) -> Any:
        """Block until done (raising :class:`~tmpi_adapters.errors.StallError`
        after ``timeout`` seconds) and return the operation's result: for a
        receive, ``(source, tag)``."""

    @abc.abstractmethod
    def cancel(self) -> None:
        """Cancel a receive that has not matched yet."""


class ExchangeStats:
    """Where an exchanger's time went since the last :meth:`take`.

    Attributes
    ----------
    wait_s : float
        Seconds spent at synchronisation points waiting for the slowest rank.
    transfer_s : float
        Seconds spent in collectives after every rank had arrived.
    wire_bytes : int
        Bytes this rank handed to collectives (after any precision reduction).
    collectives : int
        Number of collective operations started.
    last_total_weight : float or None
        The total weight of the most recent weighted mean (the global sample
        count of a step), or ``None``.
    """

    __slots__ = ("wait_s", "transfer_s", "wire_bytes", "collectives", "last_total_weight")
    wait_s: float
    transfer_s: float
    wire_bytes: int
    collectives: int
    last_total_weight: float | None

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.wait_s = 0.0
        self.transfer_s = 0.0
        self.wire_bytes = 0
        self.collectives = 0
        self.last_total_weight = None

    def take(self) -> dict[str, float | None]:
        """Return the counters as a dict and start counting from zero."""
        values = {name: getattr(self, name) for name in self.__slots__}
        self.reset()
        return values


def check_reduce_op(op: str) -> str:
    if op not in REDUCE_OPS:
        from tmpi_adapters.errors import ConfigError
        raise ConfigError("unknown reduction %r; choose 'mean' or 'sum'" % (op,))
    return op


class Exchanger(abc.ABC):
    """Moves buffers between the ``size`` ranks of one job.

    Parameters
    ----------
    comm : object, optional
        The communicator; the MPI exchanger takes an ``mpi4py`` communicator
        (``MPI.COMM_WORLD`` by default).
    precision : str
        Default transfer precision of :meth:`allreduce` (see module doc).
    bucket_bytes : int or None
        Largest fused buffer one collective carries; ``None`` fuses everything
        of one dtype into a single collective.
    timeout : float or None
        Seconds any wait may last before it is reported (``None``: forever).
    on_stall : callable, optional
        ``on_stall(what, waited, frame) -> bool``: called when a wait passes
        ``timeout``; ``True`` keeps waiting, anything else raises
        :class:`~tmpi_adapters.errors.StallError`.  The session passes the
        ``tmpi_stall`` hook here.
    """

    #: The name users pass to ``--exchanger``.
    name: str | None = None
    #: Where the buffers it takes live: ``"host"`` or ``"device"``.
    memory = "host"

    def __init__(self, comm: object = None, precision: str | None = None,
                 bucket_bytes: int | None = None, timeout: float | None = None,
                 on_stall: StallHandler | None = None) -> None:
        self.precision = check_precision(precision)
        self.bucket_bytes = bucket_bytes
        self.timeout = timeout
        self.on_stall = on_stall

    _borrow_depth = 0
    on_stall: StallHandler | None = None

    def stalled(self, what: str, waited: float, frame: FrameType | None = None) -> None:
        """A wait passed ``timeout``: ask :attr:`on_stall`, else raise
        :class:`~tmpi_adapters.errors.StallError`.

        ``frame`` is the frame of the waiting loop: it stays on the stack
        exactly as long as the wait lasts, which is how the watchdog learns
        that the wait is over.
        """
        if frame is None:
            frame = sys._getframe(1)
        if self.on_stall is not None and self.on_stall(what, waited, frame):
            return
        from tmpi_adapters.errors import StallError
        raise StallError("rank %d waited %.0f s in %s; other ranks never reached it. "
                         "Every rank must call the training function the same number "
                         "of times." % (self.rank, waited, what))

    def wait_for(self, test: Callable[[], object], what: str | Callable[[], str],
                 timeout: float | None = None, patient: bool = True) -> None:
        """Call ``test()`` until it returns true, reporting a stall after
        ``timeout`` seconds (the exchanger's by default) through
        :meth:`stalled`; see :func:`tmpi_adapters.exchangers.waiting.wait_for`."""
        wait_for(test, what, self.timeout if timeout is None else timeout, self.stalled,
                 patient=patient, crowded=oversubscribed(self.size))

    #: What :meth:`set_envelope` was last told (``None``: nothing).
    lockstep_envelope: Envelope | None = None

    def set_envelope(self, envelope: Envelope | None) -> None:
        """Say what this rank is doing (an
        :class:`~tmpi_adapters.exchangers.envelope.Envelope`, or ``None``) for
        the collectives that follow: exchangers that check lockstep carry it
        in each collective's message; others only keep it."""
        self.lockstep_envelope = envelope

    @contextlib.contextmanager
    def enveloped(self, envelope: Envelope | None) -> Iterator[Envelope | None]:
        """The collectives of the block carry ``envelope``; the envelope
        before it holds again after it (an evaluation inside a step)."""
        saved = self.lockstep_envelope
        self.set_envelope(envelope)
        try:
            yield envelope
        finally:
            self.set_envelope(saved)

    @property
    def stats(self) -> ExchangeStats:
        """This exchanger's :class:`ExchangeStats`."""
        stats = self.__dict__.get("_stats")
        if stats is None:
            stats = self.__dict__["_stats"] = ExchangeStats()
        return stats

    @contextlib.contextmanager
    def borrowing(self) -> Iterator[Exchanger]:
        """Let ``allreduce`` calls without ``out`` return borrowed results
        (see the module doc): views of internal buffers, valid until the next
        allreduce of the same signature, never to be modified."""
        self._borrow_depth += 1
        try:
            yield self
        finally:
            self._borrow_depth -= 1

    @property
    def borrow(self) -> bool:
        """True inside :meth:`borrowing`."""
        return self._borrow_depth > 0

    rank = 0
    size = 1
    #: Whether :meth:`isend`, :meth:`irecv` and :meth:`probe` work (asynchronous
    #: rules need them).
    point_to_point = True
    #: The :class:`~tmpi_adapters.exchangers.lockstep.Lockstep` of exchangers
    #: that check every collective's envelope (``None``: this one does not).
    lockstep: Lockstep | None = None

    @classmethod
    def unavailable_reason(cls, size: int | None = None) -> str | None:
        """Why this exchanger cannot run on this machine (``None`` when it can),
        for a job of ``size`` ranks when given.

        GPU exchangers answer e.g. "CuPy is not installed" or "no CUDA GPU is
        visible"; tests skip with this text and ``--exchanger`` errors show it.
        """
        return None

    # -- collectives -----------------------------------------------------
    @abc.abstractmethod
    def allreduce(self, arrays: Sequence[Array], op: str = "mean", weight: float | None = None,
                  precision: str | None = None, out: Sequence[Array] | None = None,
                  ops: Sequence[str] | None = None, total: float | None = None) -> list[Array]:
        """Reduce many arrays across ranks in as few collectives as possible.

        Parameters
        ----------
        arrays : sequence of arrays
            Any shapes and float dtypes; the same list (shapes, dtypes, order)
            on every rank.  They are packed into fused buffers (one copy in,
            one copy out).
        op : {"mean", "sum"}
        weight : float, optional
            This rank's weight in a weighted mean, usually its sample count.
            A rank with weight 0 contributes nothing.
        precision : str, optional
            Overrides the exchanger's default transfer precision.
        out : sequence of arrays, optional
            Where to write results (may be ``arrays`` itself for in-place).
        ops : sequence of {"mean", "sum"}, optional
            Each array's own reduction, overriding ``op``: one message can
            carry weighted means and sums (a training step's gradients and
            its metric accumulators).  With ``weight`` 0 a rank adds nothing
            to the sums either.
        total : float, optional
            Every rank's ``weight`` summed, when the caller knows it (the
            global batch's rows): then the weights need not travel.

        Returns
        -------
        list of arrays
            The reduced arrays, each in its input's dtype and shape.
        """

    #: Whether :meth:`start_allreduce` returns before the reduction has ended
    #: (the exchange can then overlap the rest of a training step).
    overlaps = False

    def start_allreduce(self, arrays: Sequence[Array], ops: Sequence[str] | None,
                        weight: float | None = None, total: float | None = None,
                        precision: str | None = None, slot: Hashable = None) -> Reduction:
        """Start :meth:`allreduce` (with ``ops``) and return an object whose
        ``progress()`` moves it on without blocking (True once it has ended)
        and whose ``finish()`` waits for and returns the results.  Reductions
        in flight at once are given different ``slot`` values.  Exchangers
        that cannot leave a collective running (:attr:`overlaps` false)
        reduce at once."""
        return Finished(self.allreduce(arrays, ops=ops, weight=weight, total=total,
                                       precision=precision))

    @abc.abstractmethod
    def broadcast(self, arrays: Sequence[Array], root: int = 0) -> Sequence[Array]:
        """Overwrite ``arrays`` on every rank with the root's values, in place.

        Arrays must be writable and contiguous; the list is packed into one
        fused buffer per dtype (one copy each way).  Returns ``arrays``.
        """

    @abc.abstractmethod
    def allgather_rows(self, array: Array) -> Array:
        """Concatenate every rank's ``array`` along axis 0 (rank order).

        Row counts may differ between ranks; the other dimensions and the dtype
        must agree.  Returns a new array.
        """

    def allgather_counted(self, data: Array, counts: Sequence[int],
                          out: Array | None = None) -> Array:
        """Every rank's bytes ``data`` (a uint8 array of ``counts[rank]``
        bytes; every rank knows every rank's count) joined in rank order,
        written to ``out`` where given.  Exchangers that can gather without
        first telling each other the lengths override this; by default it is
        :meth:`allgather_rows`."""
        joined = self.allgather_rows(np.ascontiguousarray(data, dtype=np.uint8).reshape(-1))
        if out is None:
            return joined
        out[:] = joined
        return out

    def counted_gather(self, counts: Sequence[int]) -> CountedGather:
        """A :meth:`allgather_counted` of these ``counts`` prepared once, to
        run many times (a step's couplings): see :class:`CountedGather`."""
        return CountedGather(self, counts)

    @abc.abstractmethod
    def allgather_object(self, obj: _T) -> list[_T]:
        """Gather a small picklable object (metadata, never arrays) from every
        rank: every rank's, in rank order."""

    @abc.abstractmethod
    def barrier(self, timeout: float | None = None) -> None:
        """Wait until every rank has reached this point."""

    # -- point to point --------------------------------------------------
    def send(self, array: Array, dest: int, tag: int = 0) -> None:
        """Blocking send of one contiguous array (copied first if not contiguous)."""
        self.isend(array, dest, tag).wait()

    def recv(self, out: Array, source: int = ANY_SOURCE, tag: int = ANY_TAG,
             timeout: float | None = None) -> tuple[int, int]:
        """Blocking receive into ``out``; returns ``(source, tag)``."""
        return self.irecv(out, source, tag).wait(timeout)

    @abc.abstractmethod
    def isend(self, array: Array, dest: int, tag: int = 0) -> Request:
        """Non-blocking send; keep ``array`` unchanged until the returned
        :class:`Request` completes."""

    @abc.abstractmethod
    def irecv(self, out: Array, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Request:
        """Non-blocking receive into ``out``; returns a :class:`Request` whose
        ``wait()`` gives ``(source, tag)``."""

    @abc.abstractmethod
    def probe(self, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> tuple[int, int] | None:
        """``(source, tag)`` of a message ready to be received, or ``None``."""

    # -- conveniences ----------------------------------------------------
    def allreduce_scalars(self, values: Sequence[float], op: str = "mean",
                          weight: float | None = None) -> list[float]:
        """Reduce a few Python floats (metrics) as one float64 collective."""
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        return [float(v) for v in self.allreduce([arr], op=op, weight=weight)[0]]

    def close(self) -> None:
        """Release communicators and buffers."""


class CountedGather:
    """An :meth:`Exchanger.allgather_counted` prepared for one set of
    ``counts``: write this rank's bytes into :attr:`message`, call
    :meth:`run`, read each rank's bytes in :attr:`blocks`.  The buffers are
    the gather's own and reused by every run; exchangers that can do better
    than a copy each way (the ``mpi`` one) return their own subclass from
    :meth:`Exchanger.counted_gather`."""

    def __init__(self, exchanger: Exchanger, counts: Sequence[int]) -> None:
        self.exchanger, self.counts = exchanger, [int(c) for c in counts]
        ends = np.cumsum(self.counts, dtype=np.int64)
        self.joined = np.empty(int(sum(self.counts)), dtype=np.uint8)
        self.blocks = [self.joined[int(e) - c:int(e)] for e, c in zip(ends, self.counts)]
        self.message = np.empty(self.counts[exchanger.rank], dtype=np.uint8)

    def run(self) -> None:
        """Gather every rank's :attr:`message` into :attr:`blocks`."""
        self.exchanger.allgather_counted(self.message, self.counts, out=self.joined)

    def start(self) -> None:
        """Start a :meth:`run` that :meth:`finish` ends, leaving the rank
        free to compute in between (here the gather runs whole at once)."""
        self.run()

    def finish(self) -> None:
        """End the gather :meth:`start` began: :attr:`blocks` hold every rank's bytes."""

    def free(self) -> None:
        """Let go of what the gather holds in the exchanger (nothing here)."""


class Reduction(Protocol):
    """What :meth:`Exchanger.start_allreduce` returns: a reduction under way."""

    def progress(self) -> bool:
        """Move the reduction on without blocking; True once it has ended."""

    def finish(self) -> list[Array]:
        """Wait for the reduction to end; the reduced arrays."""


class Finished:
    """A :meth:`Exchanger.start_allreduce` that ended when it started."""

    def __init__(self, results: list[Array]) -> None:
        self.results = results

    def progress(self) -> bool:
        return True

    def finish(self) -> list[Array]:
        return self.results


def pack_plan(arrays: Sequence[Array]) -> list[tuple[np.dtype[Any], list[int]]]:
    """Group array indices by dtype, keeping order: ``[(dtype, [i, ...]), ...]``."""
    groups: dict[np.dtype[Any], list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(np.dtype(a.dtype), []).append(i)
    return list(groups.items())
