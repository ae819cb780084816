"""The ``mpi`` exchanger's buffers: fused plans, kept per array signature, and
its requests."""
import numpy as np

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
