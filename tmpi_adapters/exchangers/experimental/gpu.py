"""GPU exchangers: device buffers over NCCL (CuPy) and CUDA-aware MPI.

Two exchangers share one implementation of the fused collectives and differ
only in the few primitives that move bytes:

``nccl``
    NCCL through ``cupy.cuda.nccl``.  Rank 0 makes the NCCL unique id and MPI
    broadcasts it; the collectives run on one NCCL communicator over all ranks.
    NCCL needs one GPU per rank.
``cuda-mpi``
    mpi4py on device arrays (anything exposing ``__cuda_array_interface__``),
    for MPI builds that are CUDA-aware.  Ranks may share a GPU.

Both take CuPy arrays (or any ``__cuda_array_interface__`` object).  Host
(numpy) arrays are accepted too: they are copied to the device, exchanged and
copied back, which costs two PCIe copies of the model per call on top of the
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
addition chain rounded once.

Point to point over NCCL
------------------------
MPI carries the envelopes (tags, ``ANY_SOURCE``, probing, cancelling), NCCL
the payload.  A transfer is a rendezvous: the sender posts an envelope; the
receiver that matches it posts its NCCL receive and answers "clear to send";
the sender then posts its NCCL send.  A send therefore completes only once a
receive has matched it, like ``MPI_Issend``, and it moves while the sender is
inside any call of this exchanger.  NCCL runs the operations of one
communicator in the order they were posted, so a receive still waiting for
its peer would hold up everything posted after it; each direction between two
ranks therefore gets its own two-rank NCCL communicator and stream (a
*channel*), made the first time that direction is used, on a helper thread so
that neither rank blocks while the other has not joined yet.
"""
import contextlib
import ctypes
import ctypes.util
import functools
import os
import socket
import subprocess
import sys
import threading
import time
import warnings

import numpy as np

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.exchangers.base import (ANY_SOURCE, ANY_TAG, Exchanger, Request, check_precision,
                         check_reduce_op, pack_plan)
from tmpi_adapters.pluginmanager import hookimpl

GPU_INSTALL = "pip install tmpi-adapters[gpu]"
#: Set to 1 (or 0) to declare that the MPI library is (or is not) CUDA-aware
#: when it cannot say so itself.
CUDA_AWARE_ENV = "TMPI_CUDA_AWARE_MPI"
#: Byte alignment of each array inside a packed byte buffer: every element
#: type CuPy kernels read stays aligned.
ALIGN = 16

# NCCL type names (attributes of cupy.cuda.nccl) for the dtypes it can reduce.
_NCCL_TYPES = {
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
}


# ----------------------------------------------------------------- availability

@functools.lru_cache(maxsize=None)
def _cupy_or_reason():
    """``(cupy, None)`` or ``(None, why it cannot be imported)``."""
    try:
        with warnings.catch_warnings():
            # CuPy warns at import when NCCL is absent; that is reported by
            # nccl_problem() where it matters.
            warnings.simplefilter("ignore")
            import cupy
    except ImportError as error:
        return None, "CuPy is not installed (%s; %s)" % (error, GPU_INSTALL)
    except Exception as error:  # a broken CUDA install raises other errors
        return None, "CuPy cannot be imported (%s: %s)" % (type(error).__name__, error)
    return cupy, None


def _cupy():
    cupy, reason = _cupy_or_reason()
    if cupy is None:
        raise TmpiError(reason)
    return cupy


@functools.lru_cache(maxsize=None)
def visible_gpu_count():
    """Number of CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applied);
    0 when CuPy or a driver is missing."""
    cupy, _ = _cupy_or_reason()
    if cupy is None:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0


@functools.lru_cache(maxsize=None)
def gpu_problem():
    """Why no GPU can be used (``None`` when at least one is visible)."""
    cupy, reason = _cupy_or_reason()
    if cupy is None:
        return reason
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as error:
        if ctypes.util.find_library("cuda") is None:
            # The CUDA runtime then blames the driver's version; say what is missing.
            return "no CUDA GPU is visible (no NVIDIA driver: libcuda.so is not installed)"
        return "no CUDA GPU is visible (CUDA reports: %s)" % (error,)
    if count == 0:
        return "no CUDA GPU is visible (%s)" % describe_visible_devices()
    return None


@functools.lru_cache(maxsize=None)
def nccl_problem():
    """Why CuPy cannot use NCCL (``None`` when it can)."""
    cupy, reason = _cupy_or_reason()
    if cupy is None:
        return reason
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from cupy.cuda import nccl
    except Exception as error:
        return "CuPy's NCCL module cannot be imported (%s)" % (error,)
    if not getattr(nccl, "available", False):
        return ("CuPy cannot load the NCCL library (libnccl.so.2); "
                "pip install nvidia-nccl-cu12 (part of %s)" % GPU_INSTALL)
    return None


def describe_visible_devices(environ=None):
    """``CUDA_VISIBLE_DEVICES`` as the user set it and what it leaves visible,
    for error messages."""
    environ = os.environ if environ is None else environ
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return "CUDA_VISIBLE_DEVICES is unset"
    if not parse_visible_devices(value):
        return "CUDA_VISIBLE_DEVICES=%r hides every GPU" % value
    return "CUDA_VISIBLE_DEVICES=%r" % value


def _nccl_module():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    return nccl


# ------------------------------------------------------------ CUDA-aware MPI

def query_cuda_support_here():
    """``(supported, library)`` from the MPI library loaded in this process.

    ``supported`` is True/False from ``MPIX_Query_cuda_support()`` (Open MPI,
    MPICH >= 4), or None when the library has no such function.
    """
    from mpi4py import MPI
    library = MPI.Get_library_version().strip().splitlines()[0].strip()
    for path in _loaded_mpi_libraries():
        try:
            function = getattr(ctypes.CDLL(path), "MPIX_Query_cuda_support")
        except (OSError, AttributeError):
            continue
        function.restype = ctypes.c_int
        return bool(function()), library
    return None, library


def _loaded_mpi_libraries():
    """Paths of the ``libmpi*`` shared objects mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/libmpi" in line}
    except OSError:
        return []
    return sorted(p for p in paths if os.path.basename(p).startswith("libmpi"))


@functools.lru_cache(maxsize=None)
def _cuda_support():
    if "mpi4py.MPI" in sys.modules:
        return query_cuda_support_here()
    # Outside a rank, ask a child process: initialising MPI in a test runner
    # or the CLI would leave a singleton MPI behind in it.
    code = ("from tmpi_adapters.exchangers.experimental.gpu import query_cuda_support_here as q; "
            "s, lib = q(); print('?' if s is None else int(s)); print(lib)")
    try:
        result = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, timeout=120)
        flag, library = (result.stdout.splitlines() + ["?", "MPI"])[:2]
    except (OSError, subprocess.SubprocessError):
        return None, "MPI"
    return {"1": True, "0": False}.get(flag.strip()), library


def cuda_aware_problem(environ=None):
    """Why MPI cannot be given device buffers (``None`` when it can)."""
    environ = os.environ if environ is None else environ
    declared = environ.get(CUDA_AWARE_ENV, "").strip().lower()
    if declared in ("1", "yes", "true", "on"):
        return None
    if declared in ("0", "no", "false", "off"):
        return "%s=%s says this MPI is not CUDA-aware" % (CUDA_AWARE_ENV, environ[CUDA_AWARE_ENV])
    supported, library = _cuda_support()
    return cuda_aware_message(supported, library)


def cuda_aware_message(supported, library):
    """The user-facing text for a CUDA-support answer (``None`` when supported)."""
    if supported:
        return None
    if supported is None:
        return ("cannot tell whether this MPI (%s) is CUDA-aware: it has no "
                "MPIX_Query_cuda_support(); set %s=1 if it is" % (library, CUDA_AWARE_ENV))
    return ("this MPI (%s) is not CUDA-aware (MPIX_Query_cuda_support() is 0); use "
            "an MPI built with CUDA support, or --exchanger nccl" % (library,))


# --------------------------------------------------------------- device choice

def parse_visible_devices(value):
    """The entries of a ``CUDA_VISIBLE_DEVICES`` value, in order.

    ``None`` (unset) means every device is visible; an empty list means none.
    CUDA stops at the first entry that is not a device, and so does this.
    """
    if value is None:
        return None
    entries = []
    for item in value.split(","):
        item = item.strip()
        if not item or item == "NoDevFiles" or item.startswith("-"):
            break
        entries.append(item)
    return entries


def device_for_local_rank(local_rank, visible_count):
    """The device index (among the visible ones) a rank uses: ``local_rank``
    modulo the number of visible devices.

    A launcher that gives each rank its own ``CUDA_VISIBLE_DEVICES`` makes every
    rank see one device, index 0; otherwise ranks of one machine take devices
    round-robin.
    """
    if visible_count <= 0:
        raise TmpiError("no CUDA GPU is visible to local rank %d (%s)"
                        % (local_rank, describe_visible_devices()))
    return local_rank % visible_count


def local_rank_and_size(comm):
    """This rank's index among the ranks on the same machine, and their count."""
    from mpi4py import MPI
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_rank(), local.Get_size()
    finally:
        local.Free()


def device_identity(cupy, device):
    """``(host name, PCI bus id)``: the same physical GPU gives the same pair
    whatever ``CUDA_VISIBLE_DEVICES`` each rank saw."""
    try:
        bus = cupy.cuda.runtime.deviceGetPCIBusId(device)
    except Exception:
        bus = "device %d" % device
    return socket.gethostname(), str(bus)


def shared_gpus(identities):
    """A sentence naming ranks that share a GPU, or ``None`` if each has its own.

    ``identities`` holds one ``(host, bus id)`` per rank, in rank order; an
    entry of ``None`` (a rank without a GPU) is reported too.
    """
    missing = [r for r, ident in enumerate(identities) if ident is None]
    if missing:
        return "rank(s) %s have no usable GPU" % ", ".join(map(str, missing))
    owners = {}
    for rank, ident in enumerate(identities):
        owners.setdefault(tuple(ident), []).append(rank)
    shared = [(ident, ranks) for ident, ranks in owners.items() if len(ranks) > 1]
    if not shared:
        return None
    (host, bus), ranks = shared[0]
    return "ranks %s share the GPU %s on %s" % (", ".join(map(str, ranks)), bus, host)


def buffers_on_gpu(environ=None):
    """Whether the models' shared variables live on a GPU (Theano ``device=cuda*``).

    Once Theano is imported its own answer counts: with ``device=cuda`` but no
    working pygpu it keeps shared variables on the host.
    """
    theano = sys.modules.get("theano")
    if theano is not None and getattr(theano, "config", None) is not None:
        device = str(getattr(theano.config, "device", ""))
        gpuarray = sys.modules.get("theano.gpuarray")
        if gpuarray is not None and not getattr(gpuarray, "pygpu_activated", False):
            return False
    else:
        environ = os.environ if environ is None else environ
        device = theano_flag(environ.get("THEANO_FLAGS", ""), "device") or ""
    return device.startswith(("cuda", "gpu"))


def theano_flag(flags, name):
    """The value of ``name`` in a ``THEANO_FLAGS`` string (last one wins), or None."""
    value = None
    for item in flags.split(","):
        key, sep, val = item.partition("=")
        if sep and key.strip() == name:
            value = val.strip()
    return value


def choose_exchanger(survey):
    """The GPU exchanger every rank can run, or ``None``.

    ``survey`` has one dict per rank: ``{"nccl": reason, "cuda-mpi": reason,
    "gpu": (host, bus id) or None}``.  A GPU exchanger is chosen only when it
    runs on every rank and every rank has a GPU of its own; NCCL first.
    """
    if shared_gpus([entry["gpu"] for entry in survey]):
        return None
    for name in ("nccl", "cuda-mpi"):
        if all(entry[name] is None for entry in survey):
            return name
    return None


def why_no_gpu_exchanger(survey):
    """The first reason :func:`choose_exchanger` found nothing, for the user."""
    for rank, entry in enumerate(survey):
        if entry["nccl"] and entry["cuda-mpi"]:
            return "rank %d: %s" % (rank, entry["nccl"])
    return shared_gpus([entry["gpu"] for entry in survey]) or "no exchanger runs on all ranks"


# ---------------------------------------------------------- transfer precision

def bf16_encode(values, xp=np):
    """float32 -> bfloat16 bits (uint16), rounding to nearest even.

    The same rounding as :func:`tmpi_adapters.exchangers.mpi.bf16_encode`,
    written for numpy or CuPy (``xp``) since CuPy has no bfloat16 dtype.
    """
    bits = xp.ascontiguousarray(values, dtype=xp.float32).view(xp.uint32)
    one, half = xp.uint32(1), xp.uint32(0x7FFF)
    shift = xp.uint32(16)
    return ((bits + half + ((bits >> shift) & one)) >> shift).astype(xp.uint16)


def bf16_decode(bits, xp=np):
    """bfloat16 bits (uint16) -> float32, for numpy or CuPy (``xp``)."""
    return (bits.astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def encode(values, precision, xp=np):
    """float32 values -> the 16-bit words sent for ``precision`` (fp16/bf16)."""
    if precision == "fp16":
        return values.astype(xp.float16).view(xp.uint16)
    if precision == "bf16":
        return bf16_encode(values, xp)
    raise ValueError("no 16-bit encoding for precision %r" % (precision,))


def decode(words, precision, xp=np):
    """The inverse of :func:`encode`: 16-bit words -> float32."""
    if precision == "fp16":
        return words.view(xp.float16).astype(xp.float32)
    if precision == "bf16":
        return bf16_decode(words, xp)
    raise ValueError("no 16-bit encoding for precision %r" % (precision,))


def chunking(n, size):
    """``(chunk, padded)`` for splitting ``n`` elements into ``size`` equal chunks."""
    chunk = max(1, -(-n // size))
    return chunk, chunk * size


def reduce_chunks(received, size, precision, xp=np):
    """Sum the ``size`` encoded chunks one rank received, in float32, and encode it.

    ``received`` holds ``size`` equal chunks of 16-bit words, rank order.
    """
    values = decode(received, precision, xp).reshape(size, -1)
    return encode(values.sum(axis=0, dtype=xp.float32), precision, xp)


def byte_layout(nbytes, align=ALIGN):
    """Offsets of arrays of ``nbytes`` each packed into one byte buffer, every
    one aligned to ``align`` bytes, and the buffer's length."""
    offsets, pos = [], 0
    for n in nbytes:
        pos = -(-pos // align) * align
        offsets.append(pos)
        pos += n
    return offsets, pos


def nccl_type_name(dtype):
    """The ``cupy.cuda.nccl`` constant that reduces ``dtype``; ConfigError if none."""
    name = _NCCL_TYPES.get(np.dtype(dtype).name)
    if name is None:
        raise ConfigError("NCCL cannot reduce arrays of dtype %s; use float16, float32 or "
                          "float64" % np.dtype(dtype))
    return name


# ----------------------------------------------------------------- the base

def is_device_array(array):
    return hasattr(array, "__cuda_array_interface__")


class _DeviceExchanger(Exchanger):
    """The fused collectives on device buffers; subclasses move the bytes.

    Subclasses implement ``_allreduce_sum(buf)`` (in place, sum over ranks),
    ``_alltoall(send, recv)`` and ``_allgather(mine, out)`` (equal parts, any
    dtype, by bytes), ``_bcast(buf, root)`` and point to point.
    """

    memory = "device"
    #: Whether ranks must each have their own GPU.
    one_gpu_per_rank = False
    _nccl = None  # set by NCCLExchanger; here so early waits find them
    _p2p = None

    def __init__(self, comm=None, precision=None, bucket_bytes=None, timeout=None):
        super().__init__(comm, precision, bucket_bytes, timeout)
        from mpi4py import MPI
        self.MPI = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self._agree_available()
        self.cp = _cupy()
        local_rank, _ = local_rank_and_size(self.comm)
        self.device = device_for_local_rank(local_rank, visible_gpu_count())
        self.cp.cuda.Device(self.device).use()
        if self.one_gpu_per_rank and self.size > 1:
            self._check_one_gpu_per_rank()
        # Non-blocking: work on the legacy default stream (NCCL's set-up of a
        # channel, say) must not wait behind a collective that waits for a peer.
        # The caller's work is waited for explicitly (see _working).
        self._stream = self.cp.cuda.Stream(non_blocking=True)

    # -- set-up ---------------------------------------------------------------
    def _agree_available(self):
        """Raise the same TmpiError on every rank if any rank cannot run this."""
        reason = type(self).unavailable_reason()
        reasons = self.comm.allgather(reason) if self.size > 1 else [reason]
        for rank, reason in enumerate(reasons):
            if reason:
                where = "" if self.size == 1 else " on rank %d" % rank
                raise TmpiError("the %s exchanger cannot run%s: %s"
                                % (self.name, where, reason))

    def _check_one_gpu_per_rank(self):
        identities = self.comm.allgather(device_identity(self.cp, self.device))
        problem = shared_gpus(identities)
        if problem:
            raise TmpiError("the %s exchanger needs one GPU per rank, but %s. Start at most "
                            "as many ranks per machine as it has GPUs, or use "
                            "--exchanger cuda-mpi." % (self.name, problem))

    # -- waiting --------------------------------------------------------------
    def _progress(self):
        """Advance pending point-to-point work; called from every wait."""

    def _check_async(self):
        """Raise if the transport reported an asynchronous error."""

    def _wait(self, test, what, timeout=None):
        """Poll ``test()`` until true, progressing meanwhile; stall after ``timeout``.

        Backs off like the ``mpi`` exchanger: yield first, then sleep up to
        1 ms so ranks sharing cores get them.
        """
        timeout = self.timeout if timeout is None else timeout
        self._progress()
        if test():
            return
        start = time.perf_counter()
        deadline = None if timeout is None else start + timeout
        spins = 0
        while True:
            self._progress()
            if test():
                return
            spins += 1
            if spins % 1024 == 0:
                self._check_async()
            if spins < 2000:
                os.sched_yield()
            else:
                time.sleep(min(1e-3, 1e-5 * (spins - 1999)))
            if deadline is not None and time.perf_counter() > deadline:
                self.stalled(what, time.perf_counter() - start, sys._getframe())
                deadline = None

    def _wait_stream(self, what, stream=None):
        """Wait until the work queued so far on ``stream`` (ours by default) is done."""
        event = (stream or self._stream).record()
        self._wait(lambda: event.done, what)

    def _wait_mpi(self, request, what, timeout=None):
        self._wait(request.Test, what, timeout)

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
    def allreduce(self, arrays, op="mean", weight=None, precision=None, out=None):
        check_reduce_op(op)
        precision = self.precision if precision is None else check_precision(precision)
        if weight is not None and op == "sum":
            raise ConfigError("a weight only makes sense with op='mean'")
        arrays = list(arrays)
        with self._working():
            targets, out = self._targets(arrays, out)
            inputs = [self._on_device(a) for a in arrays]
            if self.size == 1:
                for src, dst in zip(inputs, targets):
                    self.cp.copyto(dst, src.reshape(dst.shape), casting="unsafe")
            elif precision == "native":
                self._allreduce_native(inputs, targets, op, weight)
            else:
                self._allreduce_reduced(inputs, targets, op, weight, precision)
            return self._deliver(targets, out)

    def _allreduce_native(self, inputs, targets, op, weight):
        cp = self.cp
        total = None
        for gi, (dtype, idx) in enumerate(pack_plan(inputs)):
            weighted = weight is not None and gi == 0
            n = sum(inputs[i].size for i in idx) + (1 if weighted else 0)
            buf = cp.empty(n, dtype=dtype)
            self._pack(buf, [inputs[i] for i in idx], weight)
            if weighted:
                buf[-1] = weight
            self._allreduce_sum(buf)
            if weighted:
                total = float(buf[-1:].get()[0])
                check_total_weight(total)
            pos = 0
            for i in idx:
                view = buf[pos:pos + inputs[i].size].reshape(targets[i].shape)
                if weight is not None:
                    cp.divide(view, total, out=targets[i], casting="unsafe")
                elif op == "mean":
                    cp.divide(view, self.size, out=targets[i], casting="unsafe")
                else:
                    cp.copyto(targets[i], view, casting="unsafe")
                pos += inputs[i].size

    def _pack(self, buf, arrays, factor):
        """Copy ``arrays`` one after another into flat ``buf``, times ``factor``."""
        pos = 0
        for a in arrays:
            view = buf[pos:pos + a.size].reshape(a.shape)
            if factor == 0:
                view.fill(0)  # even where this rank's values are NaN
            elif factor is not None and factor != 1:
                self.cp.multiply(a, factor, out=view, casting="unsafe")
            else:
                self.cp.copyto(view, a, casting="unsafe")
            pos += a.size

    def _allreduce_reduced(self, inputs, targets, op, weight, precision):
        cp = self.cp
        factor = 1.0
        if weight is not None:
            total = self._host_sum(float(weight))
            check_total_weight(total)
            factor = float(weight) / total
        elif op == "mean":
            factor = 1.0 / self.size
        n = sum(a.size for a in inputs)
        chunk, padded = chunking(n, self.size)
        scratch = cp.zeros(padded, dtype=cp.float32)
        self._pack(scratch, inputs, factor)
        if precision == "fp32":
            self._allreduce_sum(scratch)
            result = scratch
        else:
            words = encode(scratch, precision, cp)
            received = cp.empty_like(words)
            self._alltoall(words, received)
            mine = reduce_chunks(received, self.size, precision, cp)
            self._allgather(mine, words)
            result = decode(words, precision, cp)
        pos = 0
        for target in targets:
            cp.copyto(target, result[pos:pos + target.size].reshape(target.shape),
                      casting="unsafe")
            pos += target.size

    def _host_sum(self, value):
        """Sum one float over ranks through MPI (weights: exact and tiny)."""
        buf = np.array([value], dtype=np.float64)
        self._wait_mpi(self.comm.Iallreduce(self.MPI.IN_PLACE, buf, op=self.MPI.SUM),
                       "allreduce")
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
                    buf[pos:pos + a.nbytes] = _bytes_of(self._on_device(a))
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
            mine[:array.nbytes] = _bytes_of(array)
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

    def allgather_object(self, obj):
        if self.size == 1:
            return [obj]
        # Small metadata only: a non-blocking barrier first so a stall is
        # reported instead of hanging in the pickled gather.
        self.barrier()
        return self.comm.allgather(obj)

    def barrier(self, timeout=None):
        if self.size > 1:
            self._wait_mpi(self.comm.Ibarrier(), "barrier", timeout)

    def _mpi_source_tag(self, source, tag):
        MPI = self.MPI
        return (MPI.ANY_SOURCE if source == ANY_SOURCE else source,
                MPI.ANY_TAG if tag == ANY_TAG else tag)


def check_total_weight(total):
    if total <= 0:
        raise ConfigError("weighted mean with a total weight of %r across ranks" % total)


def _bytes_of(array):
    """A flat uint8 view of a C-contiguous device array (0-d included)."""
    return array.reshape(-1).view("uint8")


def _check_receive_buffer(out):
    flags = getattr(out, "flags", None)
    if flags is None or not flags.c_contiguous or not getattr(flags, "writeable", True):
        raise ValueError("irecv needs a writable C-contiguous buffer")


# ------------------------------------------------------------- cuda-mpi

class _MPIRequest(Request):
    """An MPI request on device (or host) buffers."""

    def __init__(self, exchanger, request, what, keep=None):
        self._exchanger = exchanger
        self._request = request
        self._what = what
        self._keep = keep  # buffers that must outlive the request
        self._status = exchanger.MPI.Status()
        self._done = False

    def test(self):
        if not self._done:
            self._done = self._request.Test(self._status)
        return self._done

    def wait(self, timeout=None):
        self._exchanger._wait(self.test, self._what, timeout)
        return self._status.Get_source(), self._status.Get_tag()

    def cancel(self):
        if not self._done:
            self._request.Cancel()
            self._request.Wait()
            self._done = True


class CudaMPIExchanger(_DeviceExchanger):
    """Device buffers handed straight to a CUDA-aware MPI through mpi4py.

    mpi4py reads device pointers from ``__cuda_array_interface__``; MPI knows
    nothing of CUDA streams, so our stream is synchronised before every call.
    Collectives are the blocking ones, after a non-blocking barrier (see
    :meth:`_collective`).  Host arrays in point-to-point calls go to MPI as
    they are (no staging).
    """

    name = "cuda-mpi"

    @classmethod
    def unavailable_reason(cls, size=None):
        """Why ``cuda-mpi`` cannot run here: CuPy, a GPU, or a CUDA-aware MPI missing."""
        # Asking MPI costs a child process outside a rank: only when a GPU is there.
        return gpu_problem() or cuda_aware_problem()

    def _collective(self, what, call, *args, **kwargs):
        """Run a blocking MPI collective on device buffers.

        Some CUDA-aware MPIs (Open MPI 4) take device pointers only in blocking
        collectives; a non-blocking barrier first turns a missing rank into a
        reported stall instead of a hang.
        """
        self._stream.synchronize()
        self._wait_mpi(self.comm.Ibarrier(), what)
        call(*args, **kwargs)

    def _allreduce_sum(self, buf):
        self._collective("allreduce", self.comm.Allreduce, self.MPI.IN_PLACE, buf,
                         op=self.MPI.SUM)

    def _alltoall(self, send, recv):
        self._collective("allreduce", self.comm.Alltoall, send, recv)

    def _allgather(self, mine, out):
        self._collective("allgather", self.comm.Allgather, mine, out)

    def _bcast(self, buf, root):
        self._collective("broadcast", self.comm.Bcast, buf, root=root)

    def isend(self, array, dest, tag=0):
        if is_device_array(array):
            with self.cp.cuda.Device(self.device):
                array = self.cp.ascontiguousarray(array)
                self.cp.cuda.get_current_stream().synchronize()
        else:
            array = np.ascontiguousarray(array)
        return _MPIRequest(self, self.comm.Isend(array, dest=dest, tag=tag),
                           "send to rank %d" % dest, keep=array)

    def irecv(self, out, source=ANY_SOURCE, tag=ANY_TAG):
        _check_receive_buffer(out)
        source, tag = self._mpi_source_tag(source, tag)
        if is_device_array(out):
            # Work queued on ``out`` must not overwrite what MPI delivers.
            self.cp.cuda.get_current_stream().synchronize()
        what = "receive from %s" % ("any rank" if source == self.MPI.ANY_SOURCE
                                    else "rank %d" % source)
        return _MPIRequest(self, self.comm.Irecv(out, source=source, tag=tag), what,
                           keep=out)

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG):
        status = self.MPI.Status()
        source, tag = self._mpi_source_tag(source, tag)
        if self.comm.Iprobe(source=source, tag=tag, status=status):
            return status.Get_source(), status.Get_tag()
        return None


# ------------------------------------------------------------------ nccl

_CLEAR_TO_SEND = 1
_CHANNEL_SETUP = 2


class _Channel:
    """One direction between two ranks: a two-rank NCCL communicator and a stream.

    The sender is NCCL rank 0, the receiver rank 1.  The communicator is made on
    a helper thread because ``ncclCommInitRank`` blocks until the peer joins.
    """

    def __init__(self, cupy, device, unique_id, index):
        self.cp = cupy
        self.device = device
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.comm = None
        self.error = None
        self.waiting = []  # transfers matched before the communicator was ready
        self._thread = threading.Thread(target=self._connect, args=(unique_id, index),
                                        name="tmpi-nccl-channel", daemon=True)
        self._thread.start()

    def _connect(self, unique_id, index):
        try:
            self.cp.cuda.runtime.setDevice(self.device)
            self.comm = _nccl_module().NcclCommunicator(2, unique_id, index)
        except Exception as error:  # reported on the main thread by ready()
            self.error = error

    def ready(self):
        if self.error is not None:
            raise TmpiError("could not connect an NCCL channel: %s" % (self.error,))
        return self.comm is not None and not self._thread.is_alive()

    def post(self, method, buf, nbytes, peer):
        """Queue one NCCL send or receive of ``nbytes`` bytes on this channel."""
        nccl = _nccl_module()
        nccl.groupStart()
        try:
            getattr(self.comm, method)(buf.data.ptr, nbytes, nccl.NCCL_UINT8, peer,
                                       self.stream.ptr)
        finally:
            nccl.groupEnd()
        return self.stream.record()

    def close(self):
        self._thread.join(timeout=1.0)
        if self.comm is not None:
            self.stream.synchronize()
            self.comm.destroy()
            self.comm = None


class _NcclSend(Request):
    """A send waiting for "clear to send", then moving on its channel."""

    def __init__(self, exchanger, payload, dest, tag, envelope, header, ready):
        self.exchanger = exchanger
        self.payload = payload  # a contiguous device array, kept alive until done
        self.dest, self.tag = dest, tag
        self.envelope = envelope  # [seq, bytes], kept alive until ``header`` is sent
        self.header = header    # the MPI request of the envelope
        self.ready = ready      # event: the payload has been written
        self.event = None       # recorded once the NCCL send is queued
        self.done = payload.nbytes == 0  # nothing to move: done once cleared
        self.cleared = False

    def start(self, channel):
        """Queue the NCCL send (called once the receiver is clear to send)."""
        self.cleared = True
        if self.payload.nbytes:
            channel.stream.wait_event(self.ready)
            self.event = channel.post("send", self.payload, self.payload.nbytes, 1)

    def test(self):
        self.exchanger._progress()
        if not self.done and self.event is not None and self.event.done:
            self.done = True
        return self.done and self.cleared and self.header.Test()

    def wait(self, timeout=None):
        self.exchanger._wait(self.test, "send to rank %d" % self.dest, timeout)
        return self.dest, self.tag

    def cancel(self):
        """Sends are not cancelled (the receiver may have matched them already)."""


class _NcclRecv(Request):
    """A receive: its envelope, then its NCCL receive, then (host) a copy."""

    def __init__(self, exchanger, out, header, request, what):
        self.exchanger = exchanger
        self.out = out
        self.header = header    # [sender's seq, bytes], filled by ``request``
        self.request = request  # the MPI receive of the envelope
        self.what = what
        self.status = exchanger.MPI.Status()
        self.source = self.tag = None
        self.buffer = None
        self.event = None
        self.state = "matching"  # -> matched -> moving -> done | cancelled

    def advance(self):
        """Move along as far as possible without blocking; True once done."""
        if self.state == "matching" and self.request.Test(self.status):
            self.source, self.tag = self.status.Get_source(), self.status.Get_tag()
            self.state = "matched"
            self.exchanger._p2p.matched(self)
        if self.state == "moving" and (self.event is None or self.event.done):
            self._finish()
        return self.state in ("done", "cancelled")

    def start(self, channel):
        """Queue the NCCL receive (channel ready); the caller then clears the sender."""
        nbytes = int(self.header[1])
        if nbytes > self.out.nbytes:
            raise TmpiError("rank %d sent %d bytes but the receive buffer holds %d"
                            % (self.source, nbytes, self.out.nbytes))
        cp = self.exchanger.cp
        if is_device_array(self.out):
            self.buffer = _bytes_of(cp.asarray(self.out))[:nbytes]
        else:
            self.buffer = cp.empty(nbytes, dtype=cp.uint8)
        if nbytes:
            self.event = channel.post("recv", self.buffer, nbytes, 0)
        self.state = "moving"

    def _finish(self):
        if not is_device_array(self.out) and self.buffer.size:
            flat = self.out.reshape(-1).view(np.uint8)
            flat[:self.buffer.size] = self.buffer.get()
        self.buffer = None
        self.state = "done"

    def test(self):
        self.exchanger._progress()
        return self.advance()

    def wait(self, timeout=None):
        self.exchanger._wait(self.test, self.what, timeout)
        return self.source, self.tag

    def cancel(self):
        if self.state == "matching":
            self.request.Cancel()
            self.request.Wait(self.status)
            if self.status.Is_cancelled():
                self.state = "cancelled"
                self.exchanger._p2p.forget(self)
                return
            self.source, self.tag = self.status.Get_source(), self.status.Get_tag()
            self.state = "matched"
            self.exchanger._p2p.matched(self)
        # Already matched: like MPI, the receive completes instead.
        self.wait()


class _PointToPoint:
    """The rendezvous engine of the ``nccl`` exchanger (see the module doc).

    Two duplicates of the communicator keep envelopes (user tags) apart from
    control messages (clear-to-send, channel set-up).
    """

    def __init__(self, exchanger):
        self.x = exchanger
        self.envelopes = exchanger.comm.Dup()
        self.control = exchanger.comm.Dup()
        self.outgoing = {}   # dest -> _Channel (this rank sends)
        self.incoming = {}   # source -> _Channel (this rank receives)
        self.sends = {}      # seq -> _NcclSend waiting for clear-to-send
        self.receives = []   # _NcclRecv not finished
        self.early = {}      # source -> receives matched before its channel existed
        self.posted = []     # MPI requests of control messages in flight
        self.next_seq = 0

    # -- sending -----------------------------------------------------------------
    def isend(self, payload, dest, tag):
        cp = self.x.cp
        if dest == self.x.rank:
            raise TmpiError("the nccl exchanger cannot send to its own rank (%d)" % dest)
        if dest not in self.outgoing:
            unique_id = _nccl_module().get_unique_id()
            self.posted.append(self.control.isend(unique_id, dest=dest, tag=_CHANNEL_SETUP))
            self.outgoing[dest] = _Channel(cp, self.x.device, unique_id, 0)
        seq = self.next_seq
        self.next_seq += 1
        envelope = np.array([seq, payload.nbytes], dtype=np.int64)
        header = self.envelopes.Isend(envelope, dest=dest, tag=tag)
        send = _NcclSend(self.x, payload, dest, tag, envelope, header,
                         cp.cuda.get_current_stream().record())
        self.sends[seq] = send
        return send

    def _clear_to_send(self):
        """Start the sends whose receivers have matched them, in the order cleared."""
        status = self.x.MPI.Status()
        while self.control.Iprobe(source=self.x.MPI.ANY_SOURCE, tag=_CLEAR_TO_SEND,
                                  status=status):
            seq = np.zeros(1, dtype=np.int64)
            self.control.Recv(seq, source=status.Get_source(), tag=_CLEAR_TO_SEND)
            send = self.sends.pop(int(seq[0]))
            self.outgoing[send.dest].waiting.append(send)
        for channel in self.outgoing.values():
            self._drain(channel)

    # -- receiving ---------------------------------------------------------------
    def irecv(self, out, source, tag):
        header = np.zeros(2, dtype=np.int64)
        request = self.envelopes.Irecv(header, source=source, tag=tag)
        what = "receive from %s" % ("any rank" if source == self.x.MPI.ANY_SOURCE
                                    else "rank %d" % source)
        receive = _NcclRecv(self.x, out, header, request, what)
        self.receives.append(receive)
        return receive

    def matched(self, receive):
        """A receive found its envelope: queue it on its channel, in match order.

        The channel's set-up message travels on another communicator than the
        envelope and may arrive later: until then the receive waits apart.
        """
        if receive.source in self.incoming:
            self.incoming[receive.source].waiting.append(receive)
        else:
            self.early.setdefault(receive.source, []).append(receive)

    def forget(self, receive):
        if receive in self.receives:
            self.receives.remove(receive)

    def _accept_setups(self):
        """Join the channels other ranks opened towards this one."""
        status = self.x.MPI.Status()
        while self.control.Iprobe(source=self.x.MPI.ANY_SOURCE, tag=_CHANNEL_SETUP,
                                  status=status):
            peer = status.Get_source()
            unique_id = self.control.recv(source=peer, tag=_CHANNEL_SETUP)
            channel = _Channel(self.x.cp, self.x.device, unique_id, 1)
            channel.waiting = self.early.pop(peer, [])
            self.incoming[peer] = channel

    # -- both ----------------------------------------------------------------------
    def _drain(self, channel):
        """Start the transfers queued on ``channel`` once it is connected."""
        if not channel.waiting or not channel.ready():
            return
        for transfer in channel.waiting:
            transfer.start(channel)
            if isinstance(transfer, _NcclRecv):
                cleared = np.array([int(transfer.header[0])], dtype=np.int64)
                self.posted.append((self.control.Isend(cleared, dest=transfer.source,
                                                       tag=_CLEAR_TO_SEND), cleared))
        channel.waiting = []

    def progress(self):
        self._accept_setups()
        self._clear_to_send()
        for receive in list(self.receives):
            if receive.advance():
                self.receives.remove(receive)
        for channel in self.incoming.values():
            self._drain(channel)
        for receive in list(self.receives):
            if receive.advance():
                self.receives.remove(receive)
        self.posted = [p for p in self.posted if not _request_of(p).Test()]

    def probe(self, source, tag):
        status = self.x.MPI.Status()
        if self.envelopes.Iprobe(source=source, tag=tag, status=status):
            return status.Get_source(), status.Get_tag()
        return None

    def close(self):
        # Tearing an NCCL communicator down may wait for its peer: every rank
        # goes through the channels in the same (sender, receiver) order.
        channels = [((self.x.rank, peer), c) for peer, c in self.outgoing.items()]
        channels += [((peer, self.x.rank), c) for peer, c in self.incoming.items()]
        for _, channel in sorted(channels, key=lambda item: item[0]):
            channel.close()
        self.outgoing.clear()
        self.incoming.clear()
        for comm in (self.envelopes, self.control):
            comm.Free()


def _request_of(posted):
    return posted[0] if isinstance(posted, tuple) else posted


class NCCLExchanger(_DeviceExchanger):
    """Device buffers over NCCL through CuPy; one GPU per rank.

    Collectives run on one NCCL communicator over all ranks (its unique id is
    broadcast over MPI); point to point uses per-direction channels (see the
    module doc).  ``allgather_object`` and ``barrier`` use MPI.
    """

    name = "nccl"
    one_gpu_per_rank = True

    def __init__(self, comm=None, precision=None, bucket_bytes=None, timeout=None):
        super().__init__(comm, precision, bucket_bytes, timeout)
        if self.size > 1:
            nccl = _nccl_module()
            unique_id = self.comm.bcast(nccl.get_unique_id() if self.rank == 0 else None,
                                        root=0)
            with self.cp.cuda.Device(self.device):
                self._nccl = nccl.NcclCommunicator(self.size, unique_id, self.rank)
            self._p2p = _PointToPoint(self)

    @classmethod
    def unavailable_reason(cls, size=None):
        """Why ``nccl`` cannot run here: CuPy, a GPU or NCCL missing.

        With ``size``, also when this machine has fewer visible GPUs than
        ``size`` ranks started on it would need (NCCL cannot put two ranks
        of one communicator on one GPU).
        """
        problems = [gpu_problem()]
        if _cupy_or_reason()[0] is not None:
            problems.append(nccl_problem())
        if not any(problems) and size is not None and size > visible_gpu_count():
            problems.append("NCCL needs one GPU per rank: %d ranks, %d GPU(s) visible (%s)"
                            % (size, visible_gpu_count(), describe_visible_devices()))
        return "; ".join(p for p in problems if p) or None

    # -- primitives -----------------------------------------------------------------
    def _run(self, what, launch):
        """Queue NCCL work with ``launch(nccl, stream_ptr)`` and wait for it."""
        nccl = _nccl_module()
        launch(nccl, self._stream.ptr)
        self._wait_stream(what)

    def _allreduce_sum(self, buf):
        dtype = getattr(_nccl_module(), nccl_type_name(buf.dtype))
        self._run("allreduce", lambda nccl, s: self._nccl.allReduce(
            buf.data.ptr, buf.data.ptr, buf.size, dtype, nccl.NCCL_SUM, s))

    def _alltoall(self, send, recv):
        part = send.nbytes // self.size

        def launch(nccl, stream):
            nccl.groupStart()
            try:
                for peer in range(self.size):
                    at = peer * part
                    if peer == self.rank:
                        continue
                    self._nccl.send(send.data.ptr + at, part, nccl.NCCL_UINT8, peer, stream)
                    self._nccl.recv(recv.data.ptr + at, part, nccl.NCCL_UINT8, peer, stream)
            finally:
                nccl.groupEnd()
        mine = slice(self.rank * (send.size // self.size),
                     (self.rank + 1) * (send.size // self.size))
        recv[mine] = send[mine]
        self._run("allreduce", launch)

    def _allgather(self, mine, out):
        self._run("allgather", lambda nccl, s: self._nccl.allGather(
            mine.data.ptr, out.data.ptr, mine.nbytes, nccl.NCCL_UINT8, s))

    def _bcast(self, buf, root):
        self._run("broadcast", lambda nccl, s: self._nccl.bcast(
            buf.data.ptr, buf.nbytes, nccl.NCCL_UINT8, root, s))

    def _progress(self):
        if self._p2p is not None:
            self._p2p.progress()

    def _check_async(self):
        if self._nccl is not None:
            self._nccl.check_async_error()

    # -- point to point --------------------------------------------------------------
    def _need_peers(self):
        if self._p2p is None:
            raise TmpiError("point-to-point needs at least 2 ranks")

    def isend(self, array, dest, tag=0):
        self._need_peers()
        with self.cp.cuda.Device(self.device):
            payload = self.cp.ascontiguousarray(self._on_device(array))
            return self._p2p.isend(payload, dest, tag)

    def irecv(self, out, source=ANY_SOURCE, tag=ANY_TAG):
        self._need_peers()
        _check_receive_buffer(out)
        source, tag = self._mpi_source_tag(source, tag)
        with self.cp.cuda.Device(self.device):
            if is_device_array(out):
                # Work queued on ``out`` must not overwrite what NCCL delivers.
                self.cp.cuda.get_current_stream().synchronize()
            return self._p2p.irecv(out, source, tag)

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG):
        if self._p2p is None:
            return None
        self._p2p.progress()
        return self._p2p.probe(*self._mpi_source_tag(source, tag))

    def close(self):
        if self._p2p is not None:
            self._p2p.close()
            self._p2p = None
        if self._nccl is not None:
            self._stream.synchronize()
            self._nccl.destroy()
            self._nccl = None


# ------------------------------------------------------------------ hooks

@hookimpl
def tmpi_exchangers():
    return {"nccl": NCCLExchanger, "cuda-mpi": CudaMPIExchanger}


def survey_this_rank(comm):
    """What this rank can run: ``{"nccl": reason, "cuda-mpi": reason, "gpu": identity}``.

    Collective over ``comm`` (it finds the rank's place on its machine).
    """
    local_rank, _ = local_rank_and_size(comm)
    entry = {"nccl": NCCLExchanger.unavailable_reason(),
             "cuda-mpi": CudaMPIExchanger.unavailable_reason(), "gpu": None}
    if gpu_problem() is None:
        device = device_for_local_rank(local_rank, visible_gpu_count())
        entry["gpu"] = device_identity(_cupy(), device)
    return entry


@hookimpl(tryfirst=True)
def tmpi_select_exchanger(session):
    """``nccl`` (else ``cuda-mpi``) when the models live on GPUs, one per rank."""
    if not buffers_on_gpu():
        return None
    comm = session.comm
    entry = survey_this_rank(comm)
    survey = comm.allgather(entry) if session.size > 1 else [entry]
    name = choose_exchanger(survey)
    if name is None and session.rank == 0:
        why = why_no_gpu_exchanger(survey)
        print("tmpi: the models live on GPUs but no GPU exchanger can run (%s); "
              "exchanging through host memory with mpi" % why, file=sys.stderr, flush=True)
    return name


# -------------------------------------------------------------- measuring

def model_shapes(total_bytes, count=40):
    """Float32 shapes of ``count`` arrays adding up to about ``total_bytes``,
    large and small mixed as in a conv net (weights and biases)."""
    biases = [(64 * (i % 3 + 1),) for i in range(count // 2)]
    left = max(0, int(total_bytes / 4) - sum(b[0] for b in biases))
    parts = [i % 4 + 1 for i in range(count - len(biases))]
    weights = [(max(1, left * p // sum(parts) // 4), 4) for p in parts]
    return [shape for pair in zip(weights, biases) for shape in pair]


def bench(name, total_bytes, repeats, comm=None):
    """Median seconds of the exchanges of one model on every rank; rank 0's dict.

    ``raw`` is one sum of one flat float32 buffer of the same bytes through the
    same transport (the floor); ``fused_*`` the exchanger's weighted mean in
    each precision; ``per_array`` one exchanger call per array; ``host_staged``
    the fused exchange of numpy arrays.
    """
    from tmpi_adapters.pluginmanager import lookup
    exchanger = lookup("exchangers", name)(comm, timeout=600)
    cp = exchanger.cp
    shapes = model_shapes(total_bytes)
    arrays = [cp.random.standard_normal(s, dtype=cp.float32) for s in shapes]
    flat = cp.zeros(sum(a.size for a in arrays), dtype=cp.float32)
    on_host = [a.get() for a in arrays]
    weight = exchanger.rank + 1.0
    cases = {"raw": lambda: exchanger._allreduce_sum(flat)}
    for precision in ("native", "fp16", "bf16"):
        cases["fused_" + precision] = functools.partial(
            exchanger.allreduce, arrays, weight=weight, precision=precision, out=arrays)
    cases["per_array"] = lambda: [exchanger.allreduce([a], out=[a]) for a in arrays]
    cases["host_staged"] = lambda: exchanger.allreduce(on_host, weight=weight, out=on_host)
    result = {"exchanger": name, "ranks": exchanger.size, "bytes": int(flat.nbytes)}
    for case, run in cases.items():
        result[case] = _median_seconds(exchanger, run, repeats)
    result["fused_over_raw"] = result["fused_native"] / result["raw"]
    exchanger.close()
    return result


def _median_seconds(exchanger, run, repeats):
    run()  # warm-up: buffers, NCCL connections
    times = []
    for _ in range(repeats):
        exchanger.barrier()
        start = time.perf_counter()
        run()
        exchanger._wait_stream("bench")
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv=None):
    """``mpiexec -n N python -m tmpi_adapters.exchangers.experimental.gpu [--exchanger nccl] ...``"""
    import argparse
    import json
    parser = argparse.ArgumentParser(prog="python -m tmpi_adapters.exchangers.experimental.gpu",
                                     description="Time the GPU exchangers on this machine.")
    parser.add_argument("--exchanger", default="nccl", choices=["nccl", "cuda-mpi"])
    parser.add_argument("--mbytes", type=float, default=100.0, help="model size in MB")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    result = bench(args.exchanger, int(args.mbytes * 1e6), args.repeats)
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_rank() == 0:
        for key, value in result.items():
            print("%-16s %s" % (key, "%.6f" % value if isinstance(value, float) else value))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
