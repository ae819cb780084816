"""The ``mpi`` exchanger: host (numpy) buffers over mpi4py.  Works everywhere.

How one ``allreduce`` travels
-----------------------------
1. **Scale.**  Every array is multiplied, as it is packed, by what it counts
   for: a weighted mean's ``weight / total``, a plain mean's ``1 / size``, a
   sum's 1.  When the caller knows the total weight (strong scaling: the
   global batch's rows) nothing else is needed.  When it does not, the
   weight travels as one more element of the buffer and the mean's arrays
   are divided by the summed weights afterwards; only fp16/bf16 transfer,
   whose codes could not hold the unscaled values, first sums the weights
   in a small collective of its own.
2. **Pack.**  The arrays of one dtype are copied into one flat buffer in that
   same pass (fp16/bf16 transfer converts there too, :mod:`.codecs`), after a
   small *header*: the envelope's slots (:mod:`.envelope`) and, when it
   travels, the weight.  With ``bucket_bytes`` the buffer is reduced in
   buckets of at most that size, one after the other.
3. **Reduce.**  Small buckets use MPI's ``Allreduce``.  Large ones are reduced
   as reduce-scatter then allgather: every rank receives the other ranks'
   copies of its 1/N share, sums them into its share of the buffer, and
   sends the reduced share to every other rank, which receives it in place.
   That moves 2(N-1)/N of the bytes per rank, the ring-allreduce minimum, and
   sums fp16/bf16 codes in float32 with one rounding at the end, with no
   user-defined MPI operation.  Every rank ends with bit-identical results.
4. **Check.**  The header's slots hold every rank's envelope token: a rank
   that was doing something else ends the job with a
   :class:`~tmpi_adapters.errors.LockstepError`.
5. **Unpack.**  Results are copied into ``out`` or fresh arrays, or, inside
   :meth:`~tmpi_adapters.exchangers.base.Exchanger.borrowing`, handed back as
   views of the buffer without a copy.

Broadcasts, gathers and barriers carry the envelope the same way, so every
collective this exchanger issues is checked.  ``TMPI_ALLREDUCE_ALGORITHM``
(``auto``, ``allreduce`` or ``rsag``) overrides the choice in step 3;
``auto`` switches at :data:`RSAG_MIN_BYTES`.
"""
import os
import pickle
import time

import numpy as np

from tmpi_adapters.errors import ConfigError
from tmpi_adapters.exchangers import codecs, progress
from tmpi_adapters.exchangers.base import (ANY_SOURCE, ANY_TAG, CountedGather, Exchanger,
                                           Finished, check_reduce_op)
from tmpi_adapters.exchangers.lockstep import Lockstep
from tmpi_adapters.exchangers.plans import (MPIRequest, PendingAllreduce, Plan,
                                            checked_total, split_counts)
from tmpi_adapters.exchangers.waiting import START_SECONDS
from tmpi_adapters.options import check_precision
from tmpi_adapters.pluginmanager import hookimpl

ALGORITHMS = ("auto", "allreduce", "rsag")
ALGORITHM_ENV = "TMPI_ALLREDUCE_ALGORITHM"
#: ``0`` turns the lockstep envelopes off (for measuring what they cost only).
ENVELOPES_ENV = "TMPI_ENVELOPES"
#: From this many bytes a bucket is reduced as reduce-scatter + allgather
#: (measured crossover with MPICH on shared memory: 256 KiB - 1 MiB).
RSAG_MIN_BYTES = 512 * 1024
#: Array signatures whose buffers are kept between calls.
_MAX_PLANS = 128



class _CountedGather(CountedGather):
    """The ``mpi`` exchanger's :class:`~.base.CountedGather`: one message (an
    8-byte envelope token, then :attr:`message`), the joined messages, views
    of every rank's token and bytes in them, and the gather itself as a
    persistent request (MPI 4's ``Allgatherv_init``: set up once, started
    each run, a third of a fresh ``Iallgatherv``'s cost) where the library
    has one."""

    def __init__(self, exchanger, counts):
        self.exchanger, self.counts = exchanger, [int(c) for c in counts]
        self.sizes = np.asarray([8 + c for c in self.counts], dtype=np.int64)
        starts = [0] + [int(e) for e in np.cumsum(self.sizes)[:-1]]
        self.sent = np.empty(int(self.sizes[exchanger.rank]), dtype=np.uint8)
        self.token = self.sent[:8].view(np.int64)
        self.message = self.sent[8:]
        self.joined = np.empty(int(self.sizes.sum()), dtype=np.uint8)
        self.tokens = [self.joined[o:o + 8].view(np.int64) for o in starts]
        self.blocks = [self.joined[o + 8:o + 8 + c] for o, c in zip(starts, self.counts)]
        #: The persistent request; ``None`` before the first run (and after
        #: :meth:`free`), ``False`` where the library has none.
        self.persistent = None
        #: ``(request, sequence, envelope, token)`` between :meth:`start` and :meth:`finish`
        self._running = None

    def _start(self, comm):
        if self.persistent is None:
            try:
                self.persistent = comm.Allgatherv_init(self.sent, [self.joined, self.sizes])
            except (AttributeError, NotImplementedError, self.exchanger.MPI.Exception):
                self.persistent = False  # an MPI before 4.0 (Open MPI 4, say)
            else:
                self.exchanger._gathers.append(self)  # freed when the exchanger closes
        if self.persistent:
            self.persistent.Start()
            return self.persistent
        return comm.Iallgatherv(self.sent, [self.joined, self.sizes])

    def run(self):
        exchanger = self.exchanger
        lockstep = exchanger.lockstep
        with lockstep.collective("allgather") as envelope:
            token = envelope.token(lockstep._sequence(), 2 ** 31) if lockstep.enabled else 0
            if lockstep.current is not None:
                lockstep.current["token"] = token
            self.token[0] = token
            exchanger.stats.wire_bytes += self.sent.size
            exchanger._wait(self._start(exchanger.comm), "allgather")
            self._check(envelope, token)

    def start(self):
        if self._running is not None:
            # A step that failed between a start and its finish: every rank
            # started the gather, so end it before its request starts again.
            self.finish()
        exchanger = self.exchanger
        lockstep = exchanger.lockstep
        sequence, envelope = lockstep.begin()
        token = envelope.token(sequence, 2 ** 31) if lockstep.enabled else 0
        self.token[0] = token
        exchanger.stats.wire_bytes += self.sent.size
        self._running = (self._start(exchanger.comm), sequence, envelope, token)

    def finish(self):
        request, sequence, envelope, token = self._running
        self._running = None
        lockstep = self.exchanger.lockstep
        with lockstep.waiting("allgather", sequence, envelope, token):
            self.exchanger._wait(request, "allgather")
        self._check(envelope, token, sequence)

    def _check(self, envelope, token, sequence=None):
        """Every rank's token, in front of its bytes, must be this rank's."""
        lockstep = self.exchanger.lockstep
        if lockstep.enabled:
            tokens = [int(t[0]) for t in self.tokens]
            if any(t != token for t in tokens):
                lockstep.mismatch(envelope, tokens, token, sequence)

    def free(self):
        if self.persistent:
            try:
                self.persistent.Free()
            except Exception:  # still running after a stall: the job is ending anyway
                pass
        self.persistent = None
        if self in self.exchanger._gathers:
            self.exchanger._gathers.remove(self)


class MPIExchanger(Exchanger):
    """Host buffers over ``mpi4py``: fused, weighted, optionally reduced
    precision, every collective checked by its envelope.

    Buffers are kept per array signature, so a training step allocates
    nothing after the first.

    Parameters
    ----------
    comm, precision, bucket_bytes, timeout, on_stall
        See :class:`~tmpi_adapters.exchangers.base.Exchanger`.
    algorithm : {"auto", "allreduce", "rsag"}, optional
        How buckets are reduced (module doc, step 3); default from
        ``$TMPI_ALLREDUCE_ALGORITHM``, else ``"auto"``.
    """

    name = "mpi"
    memory = "host"
    overlaps = True

    def __init__(self, comm=None, precision=None, bucket_bytes=None, timeout=None,
                 on_stall=None, algorithm=None):
        super().__init__(comm, precision, bucket_bytes, timeout, on_stall)
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        algorithm = algorithm or os.environ.get(ALGORITHM_ENV) or "auto"
        if algorithm not in ALGORITHMS:
            raise ConfigError("unknown allreduce algorithm %r (%s); choose one of %s"
                              % (algorithm, ALGORITHM_ENV, ", ".join(ALGORITHMS)))
        self.algorithm = algorithm
        self._buffers = {}
        self._counted = {}
        self._gathers = []  # the prepared gathers holding a persistent request
        self._plans = {}
        self._private = None
        self._progress = None       # the progress thread, or why there is none
        self._in_flight = 0         # started collectives not yet ended
        self.lockstep = Lockstep(self, enabled=os.environ.get(ENVELOPES_ENV, "1") != "0")
        if self.size > 1:
            # Made now, when every rank is known to be here: a communicator
            # made later, by a collective of its own, could pair with another.
            self.lockstep.open()
            self._p2p_comm()

    def set_envelope(self, envelope):
        self.lockstep_envelope = self.lockstep.envelope = envelope

    # -- waiting -----------------------------------------------------------
    def _wait(self, request, what, timeout=None):
        self.wait_for(request.Test, what, timeout)

    def _sync(self, request, what):
        """Wait at a synchronisation point; the time counts as waiting."""
        start = time.perf_counter()
        self.wait_for(request.Test, what)
        self.stats.wait_s += time.perf_counter() - start

    def _transfer(self, start, what, nbytes):
        """Start requests with ``start()`` and wait for all of them; the time,
        the start included, counts as transfer."""
        begin = time.perf_counter()
        requests = start()
        self.stats.wire_bytes += nbytes
        test = requests[0].Test if len(requests) == 1 else (
            lambda: self.MPI.Request.Testall(requests))
        self.wait_for(test, what, patient=False)
        self.stats.transfer_s += time.perf_counter() - begin

    # -- helpers -----------------------------------------------------------
    def _buffer(self, key, n, dtype):
        """A scratch array of at least ``n`` elements, reused between calls."""
        buf = self._buffers.get(key)
        if buf is None or buf.size < n or buf.dtype != dtype:
            buf = np.empty(max(n, 1), dtype=dtype)
            self._buffers[key] = buf
        return buf[:n]

    def _plan(self, arrays, precision, header, slot=None):
        key = (precision, header, slot) + tuple((a.shape, a.dtype.str) for a in arrays)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))
            plan = self._plans[key] = Plan(arrays, precision, header)
        return plan

    def _weight_sum(self, weight):
        """The total weight over ranks, in a collective of its own."""
        total = np.array([float(weight)])
        self._sync(self.comm.Iallreduce(self.MPI.IN_PLACE, total, op=self.MPI.SUM), "allreduce")
        return checked_total(float(total[0]))

    # -- collectives -------------------------------------------------------
    def allreduce(self, arrays, op="mean", weight=None, precision=None, out=None, ops=None,
                  total=None):
        """See :meth:`Exchanger.allreduce`.  Also:

        ops : sequence of {"mean", "sum"}, optional
            Each array's own reduction (``op`` for all by default): a step's
            gradients (weighted means) and its metric accumulators (sums)
            travel in one message.  With a ``weight`` of 0 (a rank running
            a padding row) this rank adds nothing to the sums either.
        total : float, optional
            The sum of every rank's ``weight``, when the caller knows it
            (the global batch's rows): no weight travels and nothing is
            divided afterwards.
        """
        check_reduce_op(op)
        precision = self.precision if precision is None else check_precision(precision)
        arrays = [np.asarray(a) for a in arrays]
        if ops is None:
            if weight is not None and op == "sum":
                raise ConfigError("a weight only makes sense with op='mean'")
            ops = [op] * len(arrays)
        else:
            ops = [check_reduce_op(o) for o in ops]
        if self.size == 1:
            if weight is not None:
                self.stats.last_total_weight = float(weight)
            return self._single_rank(arrays, out)
        with self.lockstep.collective("allreduce") as envelope:
            travels, factors = self._factors(ops, weight, total, precision)
            plan = self._plan(arrays, precision, self.lockstep.slots + int(travels))
            summed = None  # the travelling weights' sum, from the first group on
            for group in plan.groups:
                summed = self._reduce_group(group, arrays, factors, envelope,
                                            weight if travels else None, ops, summed)
            return plan.unpack(out, self.borrow)

    def start_allreduce(self, arrays, ops, weight=None, total=None, precision=None, slot=None):
        """Start :meth:`allreduce` of ``arrays`` (each reduced as its entry of
        ``ops`` says) and return at once a :class:`PendingAllreduce`, which
        moves on whenever it is polled and ends with ``finish()``.

        The arrays are packed now, so they may change afterwards.  Every
        dtype's buffer travels in one collective whatever ``bucket_bytes``
        says (the caller made the buckets); several may be in flight at
        once, each checked by its own envelope when it ends.  Exchanges in
        flight together need different ``slot`` values (any hashable): each
        slot has buffers of its own.
        """
        precision = self.precision if precision is None else check_precision(precision)
        arrays = [np.asarray(a) for a in arrays]
        ops = [check_reduce_op(o) for o in ops]
        if self.size == 1:
            return Finished(self._single_rank(arrays, None))
        travels, factors = self._factors(ops, weight, total, precision)
        plan = self._plan(arrays, precision, self.lockstep.slots + int(travels), slot)
        if self._progress is None:
            self._progress = progress.start(self._p2p_comm())
        return PendingAllreduce(self, plan, arrays, factors, ops,
                                weight if travels else None, self.borrow)

    def _factors(self, ops, weight, total, precision):
        """``(travels, factors)``: whether the weight travels in the buffer, and
        what each array is multiplied by as it is packed (module doc, step 1)."""
        travels = weight is not None and total is None and precision not in ("fp16", "bf16")
        if weight is None:
            mean = 1.0 / self.size
        elif total is not None:
            mean = float(weight) / checked_total(float(total))
            self.stats.last_total_weight = float(total)
        elif travels:
            mean = float(weight)
        else:
            total = self._weight_sum(weight)
            mean = float(weight) / total
            self.stats.last_total_weight = total
        # A rank running a padding row (weight 0) adds nothing to sums either.
        summed = 0.0 if weight == 0 else 1.0
        return travels, [mean if o == "mean" else summed for o in ops]

    def _single_rank(self, arrays, out):
        # Nothing travels: the mean of one rank is its own value.
        if out is None:
            return list(arrays) if self.borrow else [a.copy() for a in arrays]
        for a, o in zip(arrays, out):
            if o is not a:
                np.copyto(o, a, casting="unsafe")
        return list(out)

    def _reduce_group(self, group, arrays, factors, envelope, weight, ops, total=None):
        """Pack, reduce, check and unscale one dtype's group, bucket by bucket.

        A travelling ``weight`` is summed in the first group's header; the
        groups after it get that ``total`` (returned) to divide their means by.
        """
        step = group.n
        if self.bucket_bytes:
            step = max(group.header + 1, int(self.bucket_bytes) // group.wire.itemsize)
        for lo in range(0, group.n, step):
            hi = min(group.n, lo + step)
            group.pack(arrays, factors, lo, hi)
            if lo == 0 and group.header:
                self.lockstep.write_slots(group, envelope, weight)
            self._reduce_bucket(group, lo, hi)
            if lo == 0 and group.header:
                total = self.lockstep.check_slots(group, envelope, weight)
                if total is not None:
                    self.stats.last_total_weight = checked_total(total)
            if total is not None:
                group.divide_means(ops, 1.0 / total, lo, hi)
            group.finish(lo, hi)
        return total

    def _use_rsag(self, group, count):
        if group.fmt is not None or self.algorithm == "rsag":
            return True
        return self.algorithm == "auto" and count * group.wire.itemsize >= RSAG_MIN_BYTES

    def _reduce_bucket(self, group, lo, hi):
        MPI = self.MPI
        buf = group.wire[lo:hi]
        if self._use_rsag(group, hi - lo):
            self._rsag(group, buf)
        else:
            self._transfer(lambda: [self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)],
                           "allreduce", buf.nbytes)

    def _rsag(self, group, buf):
        """Reduce-scatter then allgather ``buf`` in place (module doc, step 3)."""
        for requests, nbytes in self.rsag_steps(group, buf):
            self._transfer(lambda: requests, "allreduce", nbytes)

    def rsag_steps(self, group, buf, alone=False, tag=1):
        """:meth:`_rsag` as its two transfers (also what a started reduction runs): yields each one's started
        requests and bytes, and sums the received shares in between.

        Point-to-point messages on a private communicator: with MPICH they
        run at shared-memory copy speed where ``Ialltoallv``/``Iallgatherv``
        take about twice as long.
        """
        comm, size, rank = self._p2p_comm(), self.size, self.rank
        counts, offsets = split_counts(buf.size, size)
        mine, start = counts[rank], offsets[rank]
        # Everyone talks to rank+1 first, rank+2 next...: no rank is swamped.
        peers = [(rank + k) % size for k in range(1, size)]
        if alone:  # overlapped buckets are reduced at once: each its own scratch
            scratch = getattr(group, "scratch", None)
            if scratch is None or scratch.size < (size - 1) * mine:
                scratch = group.scratch = np.empty(max((size - 1) * mine, 1), buf.dtype)
            scratch = scratch[:(size - 1) * mine]
        else:
            scratch = self._buffer(("scratch", buf.dtype.str), (size - 1) * mine, buf.dtype)
        parts = [scratch[k * mine:(k + 1) * mine] for k in range(size - 1)]
        # my share of every other rank's buffer
        yield ([comm.Irecv(part, source=peer, tag=tag) for peer, part in zip(peers, parts)]
               + [comm.Isend(buf[offsets[peer]:offsets[peer] + counts[peer]], dest=peer,
                             tag=tag) for peer in peers]), (buf.size - mine) * buf.itemsize
        own = buf[start:start + mine]
        if group.fmt is None:
            for part in parts:
                np.add(own, part, out=own)
        else:
            codecs.reduce_codes([own] + parts, own, group.fmt)
        # my reduced share to everyone, theirs into place
        yield ([comm.Irecv(buf[offsets[peer]:offsets[peer] + counts[peer]], source=peer,
                           tag=tag + 1) for peer in peers]
               + [comm.Isend(own, dest=peer, tag=tag + 1) for peer in peers]), \
            mine * buf.itemsize * (size - 1)

    def _p2p_comm(self):
        """A duplicate of the communicator for the exchanger's own messages, so
        they never meet a rule's sends and receives (``ANY_TAG`` included)."""
        if self._private is None:
            private, request = self.comm.Idup()
            self.wait_for(request.Test, "starting the exchanger",
                          max(self.timeout or 0.0, START_SECONDS))
            self._private = private
        return self._private

    def broadcast(self, arrays, root=0):
        """Overwrite ``arrays`` with the root's values: a sum to which only the
        root contributes, so that every rank checks the envelope."""
        if self.size == 1:
            return arrays
        with self.lockstep.collective("broadcast") as envelope:
            plan = self._plan(arrays, "native", self.lockstep.slots)
            factors = [1.0 if self.rank == root else 0.0] * len(arrays)
            ops = ["sum"] * len(arrays)
            for group in plan.groups:
                self._reduce_group(group, arrays, factors, envelope, None, ops)
            for index, view in (pair for g in plan.groups for pair in g.views()):
                arrays[index][...] = view
        return arrays

    def allgather_rows(self, array):
        array = np.ascontiguousarray(array)
        rows = self.allgather_object((array.shape[0], array.shape[1:], array.dtype.str))
        tails = {(shape, dtype) for _, shape, dtype in rows}
        if len(tails) != 1:
            raise ConfigError("allgather_rows: ranks disagree on trailing shape/dtype: %s"
                              % sorted(tails))
        per_row = int(np.prod(array.shape[1:], dtype=np.int64))
        counts = [r[0] * per_row for r in rows]
        result = np.empty((sum(r[0] for r in rows),) + array.shape[1:], dtype=array.dtype)
        if self.size == 1:
            result[...] = array
            return result
        self._wait(self.comm.Iallgatherv(array, [result, counts]), "allgather")
        return result

    def allgather_counted(self, data, counts, out=None):
        """Every rank's bytes ``data`` joined in rank order, when every rank
        knows every rank's length (``counts``, in bytes): one ``Iallgatherv``,
        no metadata first.  Each rank's envelope token travels in front of its
        bytes and is checked like a reduction's slots.  Returns the joined
        bytes without the tokens, as one uint8 array (``out`` where given)."""
        data = np.ascontiguousarray(data, dtype=np.uint8).reshape(-1)
        if out is None:
            out = np.empty(sum(counts), dtype=np.uint8)
        if self.size == 1:
            out[:] = data
            return out
        if data.size != counts[self.rank]:
            raise ConfigError("allgather_counted: this rank has %d bytes where %d were "
                              "announced" % (data.size, counts[self.rank]))
        gather = self._counted.get(tuple(counts))
        if gather is None:
            if len(self._counted) >= _MAX_PLANS:
                self._counted.pop(next(iter(self._counted))).free()
            gather = self._counted[tuple(counts)] = self.counted_gather(counts)
        gather.message[:] = data
        gather.run()
        at = 0
        for block in gather.blocks:
            out[at:at + block.size] = block
            at += block.size
        return out

    def counted_gather(self, counts):
        """See :meth:`Exchanger.counted_gather`: the bytes travel with this
        rank's envelope token in front, from and into the gather's own
        buffers, in a persistent collective where the library has one.  Freed
        when the exchanger closes."""
        return CountedGather(self, counts) if self.size == 1 else _CountedGather(self, counts)

    def allgather_object(self, obj):
        """Small metadata only: the sizes travel with the envelope first, then
        the pickles, both non-blocking so that a stall is reported."""
        if self.size == 1:
            return [obj]
        data = np.frombuffer(pickle.dumps(obj, protocol=4), dtype=np.uint8)
        with self.lockstep.collective("allgather"):
            lengths = np.zeros(self.size, dtype=np.int64)
            lengths[self.rank] = data.size
            lengths = self.allreduce([lengths], op="sum")[0]
            gathered = np.empty(int(lengths.sum()), dtype=np.uint8)
            self._wait(self.comm.Iallgatherv(data, [gathered, lengths]), "allgather")
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        return [pickle.loads(gathered[offsets[r]:offsets[r + 1]].tobytes())
                for r in range(self.size)]

    def barrier(self, timeout=None):
        """Every rank reaches this point: a reduction of the envelopes alone."""
        if self.size > 1 and not self.lockstep.enabled:
            self._wait(self.comm.Ibarrier(), "barrier", timeout)
        elif self.size > 1:
            with self.lockstep.collective("barrier") as envelope:
                plan = self._plan([], "native", self.size)
                group = plan.groups[0]
                self.lockstep.write_slots(group, envelope, None)
                buf = group.wire
                self.wait_for(self.comm.Iallreduce(self.MPI.IN_PLACE, buf,
                                                   op=self.MPI.SUM).Test,
                              "barrier (%s)" % envelope.describe(), timeout)
                self.lockstep.check_slots(group, envelope, None)

    # -- point to point ----------------------------------------------------
    def isend(self, array, dest, tag=0):
        array = np.ascontiguousarray(array)
        return MPIRequest(self, self.comm.Isend(array, dest=dest, tag=tag),
                          "send to rank %d" % dest, keep=array)

    def irecv(self, out, source=ANY_SOURCE, tag=ANY_TAG):
        if not (out.flags.c_contiguous and out.flags.writeable):
            raise ValueError("irecv needs a writable C-contiguous buffer")
        MPI = self.MPI
        source = MPI.ANY_SOURCE if source == ANY_SOURCE else source
        tag = MPI.ANY_TAG if tag == ANY_TAG else tag
        what = "receive from %s" % ("any rank" if source == MPI.ANY_SOURCE else "rank %d" % source)
        return MPIRequest(self, self.comm.Irecv(out, source=source, tag=tag), what, keep=out)

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG):
        MPI = self.MPI
        status = MPI.Status()
        source = MPI.ANY_SOURCE if source == ANY_SOURCE else source
        tag = MPI.ANY_TAG if tag == ANY_TAG else tag
        if self.comm.Iprobe(source=source, tag=tag, status=status):
            return status.Get_source(), status.Get_tag()
        return None

    @property
    def progress_unavailable(self):
        """Why no thread moves started collectives on (``None`` when one does,
        or before the first :meth:`start_allreduce`)."""
        return self._progress if isinstance(self._progress, str) else None

    def busy(self, change):
        """Count collectives in flight; the progress thread probes while any is."""
        self._in_flight += change
        if self._progress is not None and not isinstance(self._progress, str):
            self._progress.busy(self._in_flight > 0)

    def close(self):
        if self._progress is not None and not isinstance(self._progress, str):
            self._progress.close()
        self._progress = None
        self._buffers.clear()
        for gather in list(self._gathers):
            gather.free()
        self._gathers.clear()
        self._counted.clear()
        self._plans.clear()
        if self._private is not None:
            self._private.Free()
            self._private = None
        self.lockstep.close()


@hookimpl
def tmpi_exchangers():
    return {"mpi": MPIExchanger}


@hookimpl(trylast=True)
def tmpi_select_exchanger(session):
    return "mpi"
