"""The ``mpi`` exchanger: host (numpy) buffers over mpi4py.  Works everywhere."""
import os
import time

import numpy as np

from ..errors import ConfigError, StallError
from ..exchanger import (ANY_SOURCE, ANY_TAG, Exchanger, Request, check_precision,
                         check_reduce_op, pack_plan)
from ..pluginmanager import hookimpl

_TRANSFER_DTYPES = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16}


def bf16_encode(values, out=None):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    if out is None:
        return rounded.astype(np.uint16)
    out[...] = rounded
    return out


def bf16_decode(bits):
    """bfloat16 bits (uint16) -> float32."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def _sum_fp16(inbuf, inoutbuf, datatype):
    a = np.frombuffer(inbuf, dtype=np.float16)
    b = np.frombuffer(inoutbuf, dtype=np.float16)
    np.add(a, b, out=b, dtype=np.float32, casting="unsafe")


def _sum_bf16(inbuf, inoutbuf, datatype):
    a = np.frombuffer(inbuf, dtype=np.uint16)
    b = np.frombuffer(inoutbuf, dtype=np.uint16)
    bf16_encode(bf16_decode(a) + bf16_decode(b), out=b)


class _Poller:
    """Waits on MPI requests without hogging a core, with a deadline."""

    def __init__(self, exchanger):
        self.exchanger = exchanger

    def wait(self, test, what, timeout):
        if test():
            return
        start = time.perf_counter()
        deadline = None if timeout is None else start + timeout
        spins = 0
        while not test():
            spins += 1
            if spins < 2000:
                os.sched_yield()
            else:
                # Past a few ms nobody is waiting on latency; let co-located
                # ranks (oversubscribed runs) have the core.
                time.sleep(min(1e-3, 1e-5 * (spins - 1999)))
            if deadline is not None and time.perf_counter() > deadline:
                self.exchanger.stalled(what, time.perf_counter() - start)
                deadline = None  # a handler that returns keeps waiting


class MPIRequest(Request):
    def __init__(self, exchanger, request, what, keep=None):
        self._exchanger = exchanger
        self._request = request
        self._what = what
        self._keep = keep  # buffers that must outlive the request
        from mpi4py import MPI
        self._status = MPI.Status()
        self._done = False

    def test(self):
        if not self._done:
            self._done = self._request.Test(self._status)
        return self._done

    def wait(self, timeout=None):
        if timeout is None:
            timeout = self._exchanger.timeout
        self._exchanger._poller.wait(self.test, self._what, timeout)
        return self._status.Get_source(), self._status.Get_tag()

    def cancel(self):
        if not self._done:
            self._request.Cancel()
            self._request.Wait()
            self._done = True


class MPIExchanger(Exchanger):
    """Host buffers over ``mpi4py``: fused, weighted, optionally reduced precision.

    Buffers are reused between calls with the same array signature, so a
    training step allocates nothing after the first.
    """

    name = "mpi"
    memory = "host"

    def __init__(self, comm=None, precision=None, bucket_bytes=None, timeout=None):
        super().__init__(comm, precision, bucket_bytes, timeout)
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._poller = _Poller(self)
        self._buffers = {}
        self._ops = {}
        self.stall_handler = None

    # -- waiting -----------------------------------------------------------
    def stalled(self, what, waited):
        """Called when a wait passes ``timeout``; raises unless a handler is set."""
        if self.stall_handler is not None:
            return self.stall_handler(what, waited)
        raise StallError("rank %d waited %.0f s in %s; other ranks never reached it. "
                         "Every rank must call the training function the same number "
                         "of times." % (self.rank, waited, what))

    def _wait(self, request, what, timeout=None):
        timeout = self.timeout if timeout is None else timeout
        self._poller.wait(request.Test, what, timeout)

    # -- helpers -----------------------------------------------------------
    def _buffer(self, key, n, dtype):
        buf = self._buffers.get(key)
        if buf is None or buf.size != n or buf.dtype != dtype:
            buf = np.empty(n, dtype=dtype)
            self._buffers[key] = buf
        return buf

    def _reduced_op(self, precision):
        if precision not in self._ops:
            fn = _sum_fp16 if precision == "fp16" else _sum_bf16
            self._ops[precision] = self.MPI.Op.Create(fn, commute=True)
        return self._ops[precision]

    # -- collectives -------------------------------------------------------
    def allreduce(self, arrays, op="mean", weight=None, precision=None, out=None):
        check_reduce_op(op)
        precision = self.precision if precision is None else check_precision(precision)
        arrays = [np.asarray(a) for a in arrays]
        if out is None:
            out = [np.empty_like(a) for a in arrays]
        if weight is not None and op == "sum":
            raise ConfigError("a weight only makes sense with op='mean'")
        if self.size == 1:
            for a, o in zip(arrays, out):
                if o is not a:
                    np.copyto(o, a)
            return list(out)
        if precision == "native":
            self._allreduce_native(arrays, out, op, weight)
        else:
            self._allreduce_reduced(arrays, out, op, weight, precision)
        return list(out)

    def _allreduce_native(self, arrays, out, op, weight):
        MPI = self.MPI
        for gi, (dtype, idx) in enumerate(pack_plan(arrays)):
            weighted = weight is not None and gi == 0
            n = sum(arrays[i].size for i in idx) + (1 if weighted else 0)
            buf = self._buffer(("ar", dtype.str, gi), n, dtype)
            pos = 0
            for i in idx:
                a = arrays[i]
                view = buf[pos:pos + a.size].reshape(a.shape)
                if weight == 0:
                    view[...] = 0  # even where this rank's values are NaN
                elif weight is not None:
                    np.multiply(a, weight, out=view, casting="unsafe")
                else:
                    np.copyto(view, a)
                pos += a.size
            if weighted:
                buf[-1] = weight
            self._wait(self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM), "allreduce")
            if weighted:
                total = float(buf[-1])
                if total <= 0:
                    raise ConfigError("weighted mean with a total weight of %r across ranks"
                                      % total)
            pos = 0
            for i in idx:
                a = arrays[i]
                view = buf[pos:pos + a.size].reshape(a.shape)
                if weight is not None:
                    np.divide(view, total, out=out[i], casting="unsafe")
                elif op == "mean":
                    np.divide(view, self.size, out=out[i], casting="unsafe")
                else:
                    np.copyto(out[i], view)
                pos += a.size

    def _allreduce_reduced(self, arrays, out, op, weight, precision):
        MPI = self.MPI
        factor = 1.0
        if weight is not None:
            total = np.array([float(weight)])
            self._wait(self.comm.Iallreduce(MPI.IN_PLACE, total, op=MPI.SUM), "allreduce")
            if total[0] <= 0:
                raise ConfigError("weighted mean with a total weight of %r across ranks"
                                  % float(total[0]))
            factor = float(weight) / float(total[0])
        elif op == "mean":
            factor = 1.0 / self.size
        n = sum(a.size for a in arrays)
        transfer = _TRANSFER_DTYPES[precision]
        buf = self._buffer(("ar", precision), n, transfer)
        scratch = self._buffer(("scratch", precision), n, np.float32)
        pos = 0
        for a in arrays:
            if factor == 0:
                scratch[pos:pos + a.size] = 0  # even where this rank's values are NaN
            else:
                np.multiply(a.reshape(-1), factor, out=scratch[pos:pos + a.size],
                            casting="unsafe")
            pos += a.size
        if precision == "bf16":
            bf16_encode(scratch, out=buf)
        else:
            np.copyto(buf, scratch, casting="unsafe")
        if precision == "fp32":
            request = self.comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        else:
            request = self.comm.Iallreduce(MPI.IN_PLACE, [buf, MPI.UINT16_T],
                                           op=self._reduced_op(precision))
        self._wait(request, "allreduce")
        result = bf16_decode(buf) if precision == "bf16" else buf
        pos = 0
        for a, o in zip(arrays, out):
            np.copyto(o, result[pos:pos + a.size].reshape(a.shape), casting="unsafe")
            pos += a.size

    def broadcast(self, arrays, root=0):
        if self.size == 1:
            return arrays
        for gi, (dtype, idx) in enumerate(pack_plan(arrays)):
            n = sum(arrays[i].size for i in idx)
            buf = self._buffer(("bc", dtype.str, gi), n, dtype)
            if self.rank == root:
                pos = 0
                for i in idx:
                    buf[pos:pos + arrays[i].size] = arrays[i].reshape(-1)
                    pos += arrays[i].size
            self._wait(self.comm.Ibcast(buf, root=root), "broadcast")
            pos = 0
            for i in idx:
                a = arrays[i]
                a[...] = buf[pos:pos + a.size].reshape(a.shape)
                pos += a.size
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

    def allgather_object(self, obj):
        if self.size == 1:
            return [obj]
        # Small metadata only: a non-blocking barrier first so a stall is
        # reported instead of hanging in the pickled gather.
        self.barrier()
        return self.comm.allgather(obj)

    def barrier(self, timeout=None):
        if self.size > 1:
            self._wait(self.comm.Ibarrier(), "barrier", timeout)

    # -- point to point ----------------------------------------------------
    def send(self, array, dest, tag=0):
        self.isend(array, dest, tag).wait()

    def recv(self, out, source=ANY_SOURCE, tag=ANY_TAG, timeout=None):
        return self.irecv(out, source, tag).wait(timeout)

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

    def close(self):
        for op in self._ops.values():
            op.Free()
        self._ops.clear()
        self._buffers.clear()


@hookimpl
def tmpi_exchangers():
    return {"mpi": MPIExchanger}


@hookimpl(trylast=True)
def tmpi_select_exchanger(session):
    return "mpi"
