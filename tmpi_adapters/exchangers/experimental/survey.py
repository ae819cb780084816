"""What this machine offers the GPU exchangers, and which one to choose.

EXPERIMENTAL (see the package doc): written without a GPU.  Everything here
but the CuPy and MPI queries is plain Python, tested everywhere.

- availability: CuPy, a visible GPU, NCCL (:func:`gpu_problem`,
  :func:`nccl_problem`), each answered as the sentence a user reads;
- which GPU a rank uses (:func:`device_for_local_rank`) and whether two ranks
  share one (:func:`shared_gpus`);
- whether the MPI library reads device memory (:func:`cuda_aware_problem`);
- whether the models live on a GPU (:func:`buffers_on_gpu`) and the exchanger
  every rank can run (:func:`choose_exchanger`).
"""
import ctypes
import ctypes.util
import functools
import os
import socket
import subprocess
import sys
import warnings

from tmpi_adapters.errors import TmpiError

GPU_INSTALL = "pip install tmpi-adapters[gpu]"
#: Set to 1 (or 0) to declare that the MPI library is (or is not) CUDA-aware
#: when it cannot say so itself.
CUDA_AWARE_ENV = "TMPI_CUDA_AWARE_MPI"


# ----------------------------------------------------------------- CuPy, GPUs, NCCL

@functools.lru_cache(maxsize=None)
def _cupy_or_reason():
    """``(cupy, None)`` or ``(None, why it cannot be imported)``."""
    try:
        with warnings.catch_warnings():
            # CuPy warns at import when NCCL is absent; nccl_problem() says so
            # where it matters.
            warnings.simplefilter("ignore")
            import cupy
    except ImportError as error:
        return None, "CuPy is not installed (%s; %s)" % (error, GPU_INSTALL)
    except Exception as error:  # a broken CUDA install raises other errors
        return None, "CuPy cannot be imported (%s: %s)" % (type(error).__name__, error)
    return cupy, None


def require_cupy():
    """The ``cupy`` module; :class:`~tmpi_adapters.errors.TmpiError` saying why not."""
    cupy, reason = _cupy_or_reason()
    if cupy is None:
        raise TmpiError(reason)
    return cupy


def _device_count():
    """``(devices visible, None)`` or ``(0, why CuPy could not count them)``."""
    cupy, reason = _cupy_or_reason()
    if cupy is None:
        return 0, reason
    try:
        return int(cupy.cuda.runtime.getDeviceCount()), None
    except Exception as error:
        if ctypes.util.find_library("cuda") is None:
            # The CUDA runtime then blames the driver's version; say what is missing.
            return 0, "no CUDA GPU is visible (no NVIDIA driver: libcuda.so is not installed)"
        return 0, "no CUDA GPU is visible (CUDA reports: %s)" % (error,)


@functools.lru_cache(maxsize=None)
def visible_gpu_count():
    """Number of CUDA devices this process sees (``CUDA_VISIBLE_DEVICES`` applied);
    0 when CuPy or a driver is missing."""
    return _device_count()[0]


@functools.lru_cache(maxsize=None)
def gpu_problem():
    """Why no GPU can be used (``None`` when at least one is visible)."""
    count, problem = _device_count()
    if problem is None and count == 0:
        problem = "no CUDA GPU is visible (%s)" % describe_visible_devices()
    return problem


def nccl_module():
    """``cupy.cuda.nccl``, imported without CuPy's warning about a missing NCCL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    return nccl


@functools.lru_cache(maxsize=None)
def nccl_problem():
    """Why CuPy cannot use NCCL (``None`` when it can)."""
    cupy, reason = _cupy_or_reason()
    if cupy is None:
        return reason
    try:
        nccl = nccl_module()
    except Exception as error:
        return "CuPy's NCCL module cannot be imported (%s)" % (error,)
    if not getattr(nccl, "available", False):
        return ("CuPy cannot load the NCCL library (libnccl.so.2); "
                "pip install nvidia-nccl-cu12 (part of %s)" % GPU_INSTALL)
    return None


# ------------------------------------------------------------------ device choice

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


# ---------------------------------------------------------------- CUDA-aware MPI

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
    code = ("from %s import query_cuda_support_here as q; "
            "s, lib = q(); print('?' if s is None else int(s)); print(lib)" % __name__)
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


# ------------------------------------------------------------- choosing one

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
