"""Keeping an exchanger's collectives in lockstep: numbering, envelopes, the check.

Every collective the ``mpi`` exchanger issues gets the next sequence number
and the envelope of what the rank is doing (:mod:`.envelope`).  Its first
message carries one slot per rank; each rank writes its token in its own
slot.  After the reduction :meth:`Lockstep.check_slots` compares; on a
mismatch every rank that completed the collective learns what the others
were doing from a short gather on a communicator of its own (with a
deadline: a rank that is stuck elsewhere is named by what it sent) and
raises :class:`~tmpi_adapters.errors.LockstepError`.

:attr:`Lockstep.current` tells the watchdog which collective a rank waits
in, so that ranks stuck in collectives that cannot match are reported within
seconds rather than after the stall timeout.
"""
import time

import numpy as np

from tmpi_adapters.errors import LockstepError
from tmpi_adapters.exchangers import codecs
from tmpi_adapters.exchangers.envelope import (OUTSIDE, drift_message, mismatch_message,
                                               only_data_differs, only_params_differ,
                                               token_limit)
from tmpi_adapters.exchangers.waiting import START_SECONDS, wait_for

#: Bytes of one rank's description in a mismatch report.
_DESCRIPTION_BYTES = 240
#: Seconds ranks wait for each other's descriptions after a mismatch.
_REPORT_SECONDS = 5.0


class _GaveUp(Exception):
    pass


class _Collective:
    """The context of :meth:`Lockstep.collective` (a class, not a generator:
    a step's couplings enter one each, with the caches full of arrays)."""

    __slots__ = ("lockstep", "what", "outer")

    def __init__(self, lockstep, what):
        self.lockstep, self.what = lockstep, what

    def __enter__(self):
        lockstep = self.lockstep
        lockstep.sequence += 1
        envelope = lockstep.envelope or OUTSIDE
        self.outer = lockstep.current
        lockstep.current = {"sequence": lockstep.sequence, "description": envelope.describe(),
                            "what": self.what, "since": time.time(), "token": None}
        lockstep._tokens.append((lockstep.sequence, envelope))
        lockstep.exchanger.stats.collectives += self.outer is None
        return envelope

    def __exit__(self, *exc):
        self.lockstep._tokens.pop()
        self.lockstep.current = self.outer
        return False


class _Waiting:
    """The context of :meth:`Lockstep.waiting` (a class, as :class:`_Collective`)."""

    __slots__ = ("lockstep", "current", "outer")

    def __init__(self, lockstep, current):
        self.lockstep, self.current = lockstep, current

    def __enter__(self):
        self.outer = self.lockstep.current
        self.lockstep.current = self.current

    def __exit__(self, *exc):
        self.lockstep.current = self.outer
        return False


class Lockstep:
    """The sequence and envelopes of one exchanger's collectives.

    Attributes
    ----------
    envelope : Envelope or None
        What this rank is doing now (set by the session for a training
        step); collectives outside any get :data:`~.envelope.OUTSIDE`.
    sequence : int
        Collectives started so far.
    current : dict or None
        ``{"sequence", "token", "description", "since"}`` of the collective
        this rank is in, ``None`` between collectives.
    """

    def __init__(self, exchanger, enabled=True):
        self.exchanger = exchanger
        #: Envelopes travel and are checked (``TMPI_ENVELOPES=0`` turns them
        #: off, for ``tmpi bench`` to measure what they cost).
        self.enabled = enabled
        self.envelope = None
        self.sequence = 0
        self.current = None
        self._control = None
        self._tokens = []  # (sequence, envelope) of the collectives being run

    def collective(self, what):
        """One collective: numbered, published for the watchdog; as a
        context, gives its envelope."""
        return _Collective(self, what)

    def begin(self):
        """A collective left running while the rank goes on (a bucket of an
        overlapped exchange): numbered now, its envelope kept, checked when
        it ends.  Returns ``(sequence, envelope)`` for :meth:`write_slots`
        and :meth:`check_slots`."""
        self.sequence += 1
        self.exchanger.stats.collectives += 1
        return self.sequence, self.envelope or OUTSIDE

    def waiting(self, what, sequence, envelope, token):
        """Publish, for the watchdog, that this rank waits for collective
        ``sequence`` (``token``: what :meth:`write_slots` wrote for it); a context."""
        return _Waiting(self, {"sequence": sequence, "description": envelope.describe(),
                               "what": what, "since": time.time(), "token": token})

    # -- the slots ------------------------------------------------------------------
    @property
    def slots(self):
        """Elements of a message's header that the envelope takes."""
        return self.exchanger.size if self.enabled else 0

    def _sequence(self, sequence=None):
        if sequence is not None:
            return sequence
        return self._tokens[-1][0] if self._tokens else self.sequence

    def _token(self, group, envelope, sequence=None):
        token = envelope.token(self._sequence(sequence),
                               token_limit(group.wire.dtype, group.fmt))
        if self.current is not None and sequence is None:
            self.current["token"] = token
        return token

    def write_slots(self, group, envelope, weight, sequence=None):
        """Fill ``group``'s header: this rank's token in its slot, zeros in the
        others', then the travelling ``weight`` (if any).  ``sequence``: that
        of a collective from :meth:`begin` (default: the one being run).
        Returns the token (``None`` when envelopes are off)."""
        size, rank = self.slots, self.exchanger.rank
        header = group.wire[:group.header]
        header.fill(0)
        token = None
        if size:
            token = self._token(group, envelope, sequence)
            if group.fmt is not None:
                codecs.encode(np.array([token], dtype=np.float32), 1.0,
                              header[rank:rank + 1], group.fmt)
            else:
                header[rank] = token
        if weight is not None:
            header[size] = weight
        return token

    def check_slots(self, group, envelope, weight, sequence=None):
        """After the reduction: every rank's token must be this rank's.
        Returns the summed weight when one travelled, else ``None``."""
        size = self.slots
        header = group.wire[:group.header]
        if size:
            if group.fmt is not None:
                slots = np.empty(size, dtype=np.float32)
                codecs.decode(header[:size], slots, group.fmt)
            else:
                slots = header[:size]
            if sequence is None and self.current:
                mine = self.current["token"]
            else:
                mine = self._token(group, envelope, sequence)
            tokens = [int(round(float(t))) for t in slots]
            if any(t != mine for t in tokens):
                self.mismatch(envelope, tokens, mine, sequence)
        if weight is None:
            return None
        return float(header[size])

    # -- a mismatch -------------------------------------------------------------------
    def mismatch(self, envelope, tokens, mine, sequence=None):
        """Raise :class:`LockstepError` naming what every rank was doing."""
        sequence = self._sequence(sequence)
        mine_text = envelope.describe()
        described = self._gather_descriptions(mine_text)
        descriptions = {}
        for rank, token in enumerate(tokens):
            if rank in described:
                descriptions[rank] = described[rank]
            elif token == mine:
                descriptions[rank] = mine_text
            elif token == 0:
                descriptions[rank] = "took part in another kind of collective"
            else:
                descriptions[rank] = "something else (it did not say what in time)"
        if only_data_differs(descriptions) and len(described) == len(tokens):
            self._same_generators()
        if only_params_differ(descriptions) and len(described) == len(tokens) and \
                envelope.samples is not None:
            error = LockstepError(drift_message(descriptions, *self._first_drift(envelope)))
            error.sequence = sequence
            raise error
        error = LockstepError(mismatch_message(descriptions, self.exchanger.rank))
        error.sequence = sequence
        raise error

    def _same_generators(self):
        """Give every rank rank 0's numpy and Python random generators.

        Ranks handed different batches mostly drew them from generators that
        went apart (data loaders shuffling from threads); a script that goes
        on after the error (a test runner running its next test) then draws
        alike again.  Every rank is here: they all found the same mismatch.
        """
        import pickle
        import random
        control, root = self._control, self.exchanger.rank == 0
        state = pickle.dumps((np.random.get_state(), random.getstate()))
        length = np.array([len(state)], dtype=np.int64)
        if not self._bcast(control, length):
            return
        buffer = (np.frombuffer(bytearray(state), dtype=np.uint8) if root
                  else np.zeros(int(length[0]), dtype=np.uint8))
        if not self._bcast(control, buffer):
            return
        numpy_state, python_state = pickle.loads(buffer.tobytes())
        np.random.set_state(numpy_state)
        random.setstate(python_state)

    @staticmethod
    def _bcast(control, buffer):
        """Rank 0's ``buffer`` on every rank within a few seconds; ``False`` if not."""
        request = control.Ibcast(buffer, root=0)

        def give_up(what, waited, frame):
            raise _GaveUp()
        try:
            wait_for(request.Test, "rank 0's random generators", _REPORT_SECONDS, give_up)
        except _GaveUp:
            return False
        return True

    def _first_drift(self, envelope):
        """``(name, relative spread)`` of the first variable whose sampled
        values differ between ranks (every rank is here: they all found
        that only the parameters' digests differ), or ``(None, 0)``."""
        names, sums = envelope.samples
        mine = np.asarray(sums, dtype=np.float64)
        control = self._control
        if control is None or not mine.size:
            return None, 0.0
        everyone = np.zeros(mine.size * self.exchanger.size, dtype=np.float64)
        request = control.Iallgather(mine, everyone)

        def give_up(what, waited, frame):
            raise _GaveUp()
        try:
            wait_for(request.Test, "the drift report", _REPORT_SECONDS, give_up)
        except _GaveUp:
            return None, 0.0
        table = everyone.reshape(self.exchanger.size, mine.size)
        for k, name in enumerate(names):
            column = table[:, k]
            if not np.all(column == column[0]):
                top = max(float(np.max(np.abs(column))), 1e-300)
                return name, float(np.max(column) - np.min(column)) / top
        return None, 0.0

    def _gather_descriptions(self, text):
        """``{rank: description}`` from every rank that reports within a few seconds."""
        exchanger = self.exchanger
        control = self._control
        if control is None:
            return {exchanger.rank: text}
        mine = np.zeros(_DESCRIPTION_BYTES, dtype=np.uint8)
        raw = text.encode("utf-8", "replace")[:_DESCRIPTION_BYTES]
        mine[:len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        everyone = np.zeros(_DESCRIPTION_BYTES * exchanger.size, dtype=np.uint8)
        request = control.Iallgather(mine, everyone)

        def give_up(what, waited, frame):
            raise _GaveUp()

        try:
            wait_for(request.Test, "the mismatch report", _REPORT_SECONDS, give_up)
        except _GaveUp:
            return {exchanger.rank: text}
        found = {}
        for rank in range(exchanger.size):
            chunk = everyone[rank * _DESCRIPTION_BYTES:(rank + 1) * _DESCRIPTION_BYTES]
            found[rank] = chunk.tobytes().rstrip(b"\0").decode("utf-8", "replace")
        return found

    def open(self):
        """Duplicate the communicator for mismatch reports (collective: called
        by every rank when the exchanger is made)."""
        exchanger = self.exchanger
        if exchanger.size > 1 and self._control is None:
            control, request = exchanger.comm.Idup()
            exchanger.wait_for(request.Test, "starting the exchanger",
                               max(exchanger.timeout or 0.0, START_SECONDS))
            self._control = control

    def close(self):
        if self._control is not None:
            self._control.Free()
            self._control = None
