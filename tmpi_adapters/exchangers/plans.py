"""The ``mpi`` exchanger's buffers: fused plans, kept per array signature, that
pack, scale, convert and unpack the arrays (shared by the blocking and the
started reduction), and its requests: point-to-point ones and started
reductions."""
import time

import numpy as np

from tmpi_adapters.errors import ConfigError
from tmpi_adapters.exchangers import codecs
from tmpi_adapters.exchangers.base import Request, pack_plan


def split_counts(n, size):
    """Counts and offsets of ``size`` balanced contiguous shares of ``n`` elements."""
    bounds = [n * r // size for r in range(size + 1)]
    return [bounds[r + 1] - bounds[r] for r in range(size)], bounds[:-1]


class MPIRequest(Request):
    """A pending point-to-point operation, waited for with the exchanger's deadline."""

    def __init__(self, exchanger, request, what, keep=None):
        from mpi4py import MPI
        self._exchanger = exchanger
        self._request = request
        self._what = what
        self._keep = keep  # buffers that must outlive the request
        self._status = MPI.Status()
        self._done = False

    def test(self):
        if not self._done:
            self._done = self._request.Test(self._status)
        return self._done

    def wait(self, timeout=None):
        if timeout is None:
            timeout = self._exchanger.timeout
        self._exchanger.wait_for(self.test, self._what, timeout)
        return self._status.Get_source(), self._status.Get_tag()

    def cancel(self):
        if not self._done:
            self._request.Cancel()
            self._request.Wait()
            self._done = True


class Group:
    """The arrays of one dtype, packed back to back into one flat buffer after
    a header of ``header`` elements (the envelope's slots, maybe the weight).

    ``wire`` is what MPI moves (the arrays' dtype, float32, or uint16 codes
    of fp16/bf16); ``result`` holds the reduced values in the arrays' dtype
    and is ``wire`` itself when no conversion is needed.
    """

    def __init__(self, dtype, members, precision, header=0):
        self.dtype = dtype
        self.fmt = None
        wire_dtype = dtype
        if dtype.kind == "f":
            if precision in ("fp16", "bf16"):
                self.fmt, wire_dtype = precision, np.dtype(np.uint16)
            elif precision == "fp32":
                wire_dtype = np.dtype(np.float32)
        self.header = header
        self.members = []           # (array index, offset, size, shape)
        offset = header
        for index, shape, size in members:
            self.members.append((index, offset, size, shape))
            offset += size
        self.n = offset
        self.wire = np.zeros(self.n, dtype=wire_dtype)
        self.result = self.wire if wire_dtype == dtype else np.empty(self.n, dtype=dtype)

    def views(self):
        """``(array index, result view shaped like the array)`` per member."""
        return [(i, self.result[o:o + n].reshape(shape)) for i, o, n, shape in self.members]

    def pack(self, arrays, factors, lo, hi):
        """Copy (and scale, and encode) the arrays' elements ``[lo, hi)`` into the wire."""
        for index, offset, size, _ in self.members:
            a, b = max(lo, offset), min(hi, offset + size)
            if a >= b:
                continue
            factor = factors[index]
            flat = arrays[index].reshape(-1)  # a copy only for non-contiguous arrays
            src, dst = flat[a - offset:b - offset], self.wire[a:b]
            if factor == 0:
                dst.fill(0)  # even where this rank's values are NaN; 0 is +0.0 in fp16/bf16
            elif self.fmt is not None:
                codecs.encode(np.ascontiguousarray(src), factor, dst, self.fmt)
            elif factor == 1:
                np.copyto(dst, src, casting="unsafe")
            else:
                np.multiply(src, factor, out=dst, casting="unsafe")

    def divide_means(self, ops, scale, lo, hi):
        """After a travelling weight: the means' elements in ``[lo, hi)`` scaled
        by ``scale`` (one over the summed weight)."""
        for index, offset, size, _ in self.members:
            a, b = max(lo, offset), min(hi, offset + size)
            if a < b and ops[index] == "mean":
                np.multiply(self.wire[a:b], scale, out=self.wire[a:b], casting="unsafe")

    def finish(self, lo, hi):
        """Bring the wire's ``[lo, hi)`` back to the arrays' dtype, if it differs."""
        if self.result is self.wire:
            return
        wire, result = self.wire[lo:hi], self.result[lo:hi]
        if self.fmt is None:
            np.copyto(result, wire, casting="unsafe")
        elif result.dtype == np.float32:
            codecs.decode(wire, result, self.fmt)
        else:
            if getattr(self, "decoded", None) is None or self.decoded.size < hi - lo:
                self.decoded = np.empty(self.n, dtype=np.float32)  # kept: every step needs it
            decoded = self.decoded[:hi - lo]
            codecs.decode(wire, decoded, self.fmt)
            np.copyto(result, decoded, casting="unsafe")


class Plan:
    """Buffers for one array signature (shapes, dtypes, precision, header).

    The header goes in front of the first group: every collective checks
    the envelope in its first message.  Without arrays, the plan is the
    header alone (a barrier).
    """

    def __init__(self, arrays, precision, header=0):
        plan = pack_plan(arrays)
        if not plan:
            self.groups = [Group(np.dtype(np.float64), [], "native", header)]
            return
        self.groups = [Group(dtype, [(i, arrays[i].shape, arrays[i].size) for i in idx],
                             precision, header if k == 0 else 0)
                       for k, (dtype, idx) in enumerate(plan)]

    def unpack(self, out, borrow):
        """The reduced arrays, in order: copied into ``out`` (a list), else
        views of the buffers when ``borrow``, else fresh copies."""
        results = [None] * sum(len(g.members) for g in self.groups)
        for group in self.groups:
            for index, view in group.views():
                if out is not None:
                    np.copyto(out[index], view, casting="unsafe")
                    results[index] = out[index]
                elif borrow:
                    results[index] = view
                else:
                    results[index] = view.copy()
        return results


#: Pairs of point-to-point tags the collectives in flight at once cycle through.
_TAGS = 8192


class PendingAllreduce:
    """A started :meth:`~tmpi_adapters.exchangers.mpi.MPIExchanger.start_allreduce`.

    Each dtype's buffer is one collective: MPI's ``Iallreduce``, which the
    progress thread (:mod:`.progress`) moves on to its end, or, for fp16/bf16
    codes, the exchanger's reduce-scatter and allgather (:meth:`~tmpi_adapters.exchangers.mpi.MPIExchanger.rsag_steps`),
    whose second half starts at the first poll after the first has ended.
    :meth:`progress` never blocks; :meth:`finish` waits (with the
    exchanger's stall deadline), checks the envelopes and returns the
    results, borrowed when the exchange was started inside ``borrowing()``.
    """

    def __init__(self, exchanger, plan, arrays, factors, ops, weight, borrow):
        self.exchanger, self.plan, self.ops, self.weight = exchanger, plan, ops, weight
        self.borrow = borrow
        self.sequence, self.envelope = exchanger.lockstep.begin()
        self.results = self.total = self.token = None
        self.ended = False
        self.steps = [self._steps(group, arrays, factors) for group in plan.groups]
        self.requests = [next(steps) for steps in self.steps]
        exchanger.busy(+1)

    def _steps(self, group, arrays, factors):
        """Pack and start ``group``'s collective; after each yielded list of
        requests has completed, the next part; at the end the check."""
        exchanger, lockstep = self.exchanger, self.exchanger.lockstep
        group.pack(arrays, factors, 0, group.n)
        if group.header:
            self.token = lockstep.write_slots(group, self.envelope, self.weight,
                                              self.sequence)
        buf = group.wire
        if group.fmt is not None:
            # Codes MPI cannot sum.  Tags of its own: parts in flight
            # together move on in any order.
            tag = 3 + 2 * (self.sequence % _TAGS)
            for requests, nbytes in exchanger.rsag_steps(group, buf, alone=True, tag=tag):
                exchanger.stats.wire_bytes += nbytes
                yield requests
        else:
            MPI = exchanger.MPI
            exchanger.stats.wire_bytes += buf.nbytes
            yield [exchanger.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)]
        if group.header:
            self.total = lockstep.check_slots(group, self.envelope, self.weight, self.sequence)

    def _complete(self):
        """Every group is reduced: divide the means by a travelling weight's
        sum (the first group carried it), bring the wire to the arrays' dtypes."""
        exchanger = self.exchanger
        if self.total is not None:
            exchanger.stats.last_total_weight = checked_total(self.total)
        for group in self.plan.groups:
            if self.total is not None:
                group.divide_means(self.ops, 1.0 / self.total, 0, group.n)
            group.finish(0, group.n)

    def progress(self):
        """Move every part on as far as it goes now; True once all have ended."""
        if self.ended:
            return True
        MPI = self.exchanger.MPI
        try:
            for i, requests in enumerate(self.requests):
                while requests is not None and MPI.Request.Testall(requests):
                    requests = next(self.steps[i], None)
                self.requests[i] = requests
        except BaseException:
            self._end()
            raise
        if all(r is None for r in self.requests):
            self._end()
            self._complete()
        return self.ended

    def _end(self):
        if not self.ended:
            self.ended = True
            self.exchanger.busy(-1)

    def finish(self):
        """Wait until the exchange has ended; its results, in order."""
        if self.results is None:
            exchanger = self.exchanger
            begin = time.perf_counter()
            with exchanger.lockstep.waiting("allreduce", self.sequence, self.envelope,
                                            self.token):
                exchanger.wait_for(self.progress, "allreduce", patient=False)
            exchanger.stats.transfer_s += time.perf_counter() - begin
            self.results = self.plan.unpack(None, self.borrow)
        return self.results


def checked_total(total):
    """A summed weight, which must be positive."""
    if not total > 0:
        raise ConfigError("weighted mean with a total weight of %r across ranks" % total)
    return total
