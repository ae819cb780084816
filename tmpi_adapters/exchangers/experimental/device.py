"""The shared base of the GPU exchangers: the fused collectives on device buffers.

EXPERIMENTAL (see the package doc): written without a GPU, never run on one.

:class:`DeviceExchanger` implements the exchanger interface once for device
buffers; :mod:`.nccl` and :mod:`.cuda_mpi` supply the few primitives that move
bytes.  Both take CuPy arrays (or any ``__cuda_array_interface__`` object).
Host (numpy) arrays are accepted too: they are copied to the device, exchanged
and copied back, two PCIe copies of the model per call on top of the
collective.  Results come back where the inputs were.

Precision
---------
``native`` reduces each dtype group in its own dtype, the weight travelling as
one extra element, exactly as the ``mpi`` exchanger does.  ``fp32`` reduces one
float32 buffer.  ``fp16``/``bf16`` never add two 16-bit numbers: each rank
sends chunk ``j`` of its encoded buffer to rank ``j`` (all-to-all), rank ``j``
sums the chunks it received in float32, encodes that one sum and an allgather
returns every chunk.  Each rank moves ``(N-1)/N`` of the 16-bit buffer twice,
half the bytes of a float32 ring allreduce, and every sum is one float32
addition chain rounded once.  The conversions are :mod:`~tmpi_adapters.exchangers.codecs`'
array-module-generic ones, run by CuPy.

MPI's share of the work (small metadata, barriers, probing, point to point of
host arrays) goes through an ``mpi`` exchanger on the same communicator,
:attr:`DeviceExchanger.host`; every wait is the one wait loop,
:meth:`~tmpi_adapters.exchangers.base.Exchanger.wait_for`.
"""
import contextlib

import numpy as np

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.exchangers import codecs
from tmpi_adapters.exchangers.base import Exchanger, check_reduce_op, pack_plan
from tmpi_adapters.options import check_precision
from tmpi_adapters.exchangers.experimental import survey
from tmpi_adapters.exchangers.mpi import MPIExchanger

#: Byte alignment of each array inside a packed byte buffer: every element
#: type CuPy kernels read stays aligned.
ALIGN = 16


def is_device_array(array):
    return hasattr(array, "__cuda_array_interface__")


def bytes_of(array):
    """A flat uint8 view of a C-contiguous device array (0-d included)."""
    return array.reshape(-1).view("uint8")


def check_total_weight(total):
    """``total``, if it is a positive sum of weights (NaN is not)."""
    if not total > 0:
        raise ConfigError("weighted mean with a total weight of %r across ranks" % total)
    return total


def chunking(n, size):
    """``(chunk, padded)`` for splitting ``n`` elements into ``size`` equal chunks."""
    chunk = max(1, -(-n // size))
    return chunk, chunk * size


def reduce_chunks(received, size, precision, xp=np):
    """Sum the ``size`` encoded chunks one rank received, in float32, and encode it.

    ``received`` holds ``size`` equal chunks of 16-bit words, rank order.
    """
    values = codecs.decode_words(received, precision, xp=xp).reshape(size, -1)
    return codecs.encode_words(values.sum(axis=0, dtype=xp.float32), precision, xp=xp)


def byte_layout(nbytes, align=ALIGN):
    """Offsets of arrays of ``nbytes`` each packed into one byte buffer, every
    one aligned to ``align`` bytes, and the buffer's length."""
    offsets, pos = [], 0
    for n in nbytes:
        pos = -(-pos // align) * align
        offsets.append(pos)
        pos += n
    return offsets, pos


class DeviceExchanger(Exchanger):
    """The fused collectives on device buffers; subclasses move the bytes.

    Subclasses implement ``_allreduce_sum(buf)`` (in place, sum over ranks),
    ``_alltoall(send, recv)`` and ``_allgather(mine, out)`` (equal parts, any
    dtype, by bytes), ``_bcast(buf, root)`` and point to point.

    Parameters
    ----------
    comm, precision, bucket_bytes, timeout, on_stall
        See :class:`~tmpi_adapters.exchangers.base.Exchanger`.
    """

    memory = "device"
    #: Whether ranks must each have their own GPU.
    one_gpu_per_rank = False

    def __init__(self, comm=None, precision=None, bucket_bytes=None, timeout=None,
                 on_stall=None):
        super().__init__(comm, precision, bucket_bytes, timeout, on_stall)
        #: The ``mpi`` exchanger on the same ranks, for what MPI does here.
        self.host = MPIExchanger(comm, timeout=timeout, on_stall=on_stall)
        self.MPI, self.comm = self.host.MPI, self.host.comm
        self.rank, self.size = self.host.rank, self.host.size
        self._agree_available()
        self.cp = survey.require_cupy()
        local_rank, _ = survey.local_rank_and_size(self.comm)
        self.device = survey.device_for_local_rank(local_rank, survey.visible_gpu_count())
        self.cp.cuda.Device(self.device).use()
        if self.one_gpu_per_rank and self.size > 1:
            self._check_one_gpu_per_rank()
        # Non-blocking: work on the legacy default stream must not wait behind
        # a collective that waits for a peer.  The caller's work is waited for
        # explicitly (see _working).
        self._stream = self.cp.cuda.Stream(non_blocking=True)

    # -- set-up ---------------------------------------------------------------
    def _agree_available(self):
        """Raise the same TmpiError on every rank if any rank cannot run this."""
        reason = type(self).unavailable_reason()
        for rank, reason in enumerate(self.host.allgather_object(reason)):
            if reason:
                where = "" if self.size == 1 else " on rank %d" % rank
                raise TmpiError("the %s exchanger cannot run%s: %s"
                                % (self.name, where, reason))

    def _check_one_gpu_per_rank(self):
        identities = self.host.allgather_object(survey.device_identity(self.cp, self.device))
        problem = survey.shared_gpus(identities)
        if problem:
            raise TmpiError("the %s exchanger needs one GPU per rank, but %s. Start at most "
                            "as many ranks per machine as it has GPUs, or use "
                            "--exchanger cuda-mpi." % (self.name, problem))

    # -- waiting --------------------------------------------------------------
    def _watched(self, test):
        """``test`` as polled while waiting; a transport that reports errors
        asynchronously (NCCL) wraps it to raise them."""
        return test

    def _wait(self, test, what, timeout=None):
        """Poll ``test()`` in the one wait loop until true; a stall after ``timeout``."""
        self.wait_for(self._watched(test), what, timeout)

    def _wait_stream(self, what):
        """Wait until the work queued so far on our stream is done."""
        event = self._stream.record()
        self._wait(lambda: event.done, what)

    # -- staging ---------------------------------------------------------------
    @contextlib.contextmanager
    def _working(self):
        """Run on our device and stream, after what the caller already queued."""
        cp = self.cp
        with cp.cuda.Device(self.device):
            self._stream.wait_event(cp.cuda.get_current_stream().record())
            with self._stream:
                yield

    def _on_device(self, array):
        """A device view of ``array``: itself when on a device, a copy when on the host."""
        return self.cp.asarray(array)

    def _targets(self, arrays, out):
        """Device arrays to write results into, and the list handed back.

        Results go where the inputs (or ``out``) live: host inputs get host
        results, copied back by :meth:`_deliver`.
        """
        cp = self.cp
        if out is None:
            out = [cp.empty(a.shape, a.dtype) if is_device_array(a)
                   else np.empty(np.shape(a), np.asarray(a).dtype) for a in arrays]
        targets = [cp.asarray(o) if is_device_array(o) else cp.empty(o.shape, o.dtype)
                   for o in out]
        return targets, list(out)

    def _deliver(self, targets, out):
        """Copy device results to host outputs (after our stream finished)."""
        self._wait_stream("copying results")
        for target, o in zip(targets, out):
            if not is_device_array(o):
                np.copyto(o, target.get(), casting="unsafe")
        return out

    # -- collectives -----------------------------------------------------------
    def allreduce(self, arrays, op="mean", weight=None, precision=None, out=None, ops=None,
                  total=None):
        """See :meth:`Exchanger.allreduce`; ``ops`` (each array's own reduction)
        and ``total`` (every rank's weight summed, when the caller knows it)
        mean what they mean to the ``mpi`` exchanger."""
        check_reduce_op(op)
        precision = self.precision if precision is None else check_precision(precision)
        arrays = list(arrays)
        ops = [op] * len(arrays) if ops is None else [check_reduce_op(o) for o in ops]
        if weight is not None and "mean" not in ops:
            raise ConfigError("a weight only makes sense with op='mean'")
        with self._working():
            targets, out = self._targets(arrays, out)
            inputs = [self._on_device(a) for a in arrays]
            if self.size == 1:
                for src, dst in zip(inputs, targets):
                    self.cp.copyto(dst, src.reshape(dst.shape), casting="unsafe")
                return self._deliver(targets, out)
            # Native precision carries an unknown total as one more element;
            # 16-bit codes could not hold unscaled values, so they sum it first.
            travels = weight is not None and total is None and precision == "native"
            if weight is not None and total is None and not travels:
                total = self._host_sum(float(weight))
            if total is not None:
                self.stats.last_total_weight = total = check_total_weight(float(total))
            mean = (1.0 / self.size if weight is None
                    else float(weight) if travels else float(weight) / total)
            factors = [mean if o == "mean" else 1.0 for o in ops]
            if precision == "native":
                self._allreduce_native(inputs, targets, factors, ops,
                                       float(weight) if travels else None)
            else:
                self._allreduce_reduced(inputs, targets, factors, precision)
            return self._deliver(targets, out)

    def _allreduce_native(self, inputs, targets, factors, ops, weight):
        """One sum per dtype group; a travelling ``weight`` is the first group's
        last element, and the means are divided by its sum afterwards."""
        cp = self.cp
        total = None
        for gi, (dtype, idx) in enumerate(pack_plan(inputs)):
            travels = weight is not None and gi == 0
            buf = cp.empty(sum(inputs[i].size for i in idx) + int(travels), dtype=dtype)
            self._pack(buf, [inputs[i] for i in idx], [factors[i] for i in idx])
            if travels:
                buf[-1] = weight
            self._allreduce_sum(buf)
            if travels:
                total = check_total_weight(float(buf[-1:].get()[0]))
                self.stats.last_total_weight = total
            pos = 0
            for i in idx:
                view = buf[pos:pos + inputs[i].size].reshape(targets[i].shape)
                if total is not None and ops[i] == "mean":
                    cp.divide(view, total, out=targets[i], casting="unsafe")
                else:
                    cp.copyto(targets[i], view, casting="unsafe")
                pos += inputs[i].size

    def _pack(self, buf, arrays, factors):
        """Copy ``arrays`` one after another into flat ``buf``, each times its factor."""
        pos = 0
        for a, factor in zip(arrays, factors):
            view = buf[pos:pos + a.size].reshape(a.shape)
            if factor == 0:
                view.fill(0)  # even where this rank's values are NaN
            elif factor != 1:
                self.cp.multiply(a, factor, out=view, casting="unsafe")
            else:
                self.cp.copyto(view, a, casting="unsafe")
            pos += a.size

    def _allreduce_reduced(self, inputs, targets, factors, precision):
        """fp32: one float32 sum; fp16/bf16: all-to-all, float32 sums, allgather
        (module doc).  The arrays arrive scaled by ``factors``."""
        cp = self.cp
        n = sum(a.size for a in inputs)
        chunk, padded = chunking(n, self.size)
        scratch = cp.zeros(padded, dtype=cp.float32)
        self._pack(scratch, inputs, factors)
        if precision == "fp32":
            self._allreduce_sum(scratch)
            result = scratch
        else:
            words = codecs.encode_words(scratch, precision, xp=cp)
            received = cp.empty_like(words)
            self._alltoall(words, received)
            mine = reduce_chunks(received, self.size, precision, cp)
            self._allgather(mine, words)
            result = codecs.decode_words(words, precision, xp=cp)
        pos = 0
        for target in targets:
            cp.copyto(target, result[pos:pos + target.size].reshape(target.shape),
                      casting="unsafe")
            pos += target.size

    def _host_sum(self, value):
        """Sum one float over ranks through MPI (weights: exact and tiny)."""
        buf = np.array([value], dtype=np.float64)
        request = self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM)
        self.wait_for(request.Test, "allreduce")
        return float(buf[0])

    def broadcast(self, arrays, root=0):
        if self.size == 1:
            return arrays
        cp = self.cp
        with self._working():
            offsets, length = byte_layout([a.nbytes for a in arrays])
            buf = cp.empty(length, dtype=cp.uint8)
            if self.rank == root:
                for a, pos in zip(arrays, offsets):
                    buf[pos:pos + a.nbytes] = bytes_of(self._on_device(a))
            self._bcast(buf, root)
            if self.rank != root:
                for a, pos in zip(arrays, offsets):
                    self._write_back(a, buf[pos:pos + a.nbytes])
            self._wait_stream("broadcast")
        return arrays

    def _write_back(self, array, raw):
        """Overwrite ``array`` (host or device) in place from its bytes ``raw``."""
        values = raw.view(np.dtype(array.dtype)).reshape(array.shape)
        if is_device_array(array):
            self.cp.asarray(array)[...] = values
        else:
            self._wait_stream("copying results")
            array[...] = values.get()

    def allgather_rows(self, array):
        cp = self.cp
        host = not is_device_array(array)
        with self._working():
            array = cp.ascontiguousarray(self._on_device(array))
            rows = self.allgather_object((array.shape[0], array.shape[1:], array.dtype.str))
            tails = {(shape, dtype) for _, shape, dtype in rows}
            if len(tails) != 1:
                raise ConfigError("allgather_rows: ranks disagree on trailing shape/dtype: %s"
                                  % sorted(tails))
            row_bytes = array.dtype.itemsize * int(np.prod(array.shape[1:], dtype=np.int64))
            most = max(r[0] for r in rows) * row_bytes
            mine = cp.zeros(max(most, 1), dtype=cp.uint8)
            mine[:array.nbytes] = bytes_of(array)
            gathered = cp.empty(mine.size * self.size, dtype=cp.uint8)
            if self.size == 1:
                gathered[...] = mine
            else:
                self._allgather(mine, gathered)
            parts = [gathered[r * mine.size:r * mine.size + count * row_bytes]
                     for r, (count, _, _) in enumerate(rows)]
            result = cp.concatenate(parts).view(array.dtype).reshape(
                (sum(r[0] for r in rows),) + array.shape[1:])
            self._wait_stream("allgather")
        return result.get() if host else result

    def set_envelope(self, envelope):
        """Kept, and handed to :attr:`host`: its barriers and metadata gathers
        check lockstep; the device collectives do not carry envelopes."""
        super().set_envelope(envelope)
        self.host.set_envelope(envelope)

    def allgather_object(self, obj):
        return self.host.allgather_object(obj)

    def barrier(self, timeout=None):
        self.host.barrier(timeout)

    def close(self):
        self.host.close()
