"""Each rank's device, chosen before Theano is imported.

Theano's GPU backend takes its device from ``THEANO_FLAGS`` (``device=cuda``,
``device=cuda1``, ``device=opencl0:0``) when it is imported.  Under tmpi:

* ``device=cuda`` (no number): the ranks of a host take the host's GPUs in
  turn, local rank modulo their number (``CUDA_VISIBLE_DEVICES`` respected);
  several ranks may share one.  A numbered device (``device=cuda0``) is the
  one every rank of the host uses, as the flags say.
* a Theano-MPI model's ``DEVICES`` list (``cuda0,cuda1``, passed as
  ``TMPI_DEVICES``): rank r takes entry r, unless ``THEANO_FLAGS`` names a
  device, or names none and the entry is a CUDA GPU where there is none.
* ``device=opencl...``: every rank uses the device named.  Each rank gets a
  kernel cache of its own (pocl's cache is not safe for processes that build
  the same kernel at once: ranks compiling together crashed or failed to build
  with one cache), and pocl as many threads as the rank's share of the cores.

Nothing here imports Theano.  :func:`describe` names the device a rank ended
up with, for the end-of-run summary; :func:`is_device_array` and
:func:`is_device_type` tell device values and variables from host ones.
"""
import os

#: Where launchers say which rank of its host a process is.
_LOCAL_RANK_ENV = ("MPI_LOCALRANKID", "OMPI_COMM_WORLD_LOCAL_RANK", "MV2_COMM_WORLD_LOCAL_RANK",
                   "SLURM_LOCALID", "PALS_LOCAL_RANKID")


def device_flag(flags):
    """The ``device`` that ``THEANO_FLAGS`` text ``flags`` sets (the last one
    wins, as in Theano), or ``None``."""
    found = None
    for entry in (flags or "").split(","):
        name, _, value = entry.partition("=")
        if name.strip() == "device":
            found = value.strip()
    return found


def with_device(flags, device):
    """``flags`` with its ``device`` set to ``device``."""
    kept = [e for e in (flags or "").split(",")
            if e.strip() and e.partition("=")[0].strip() != "device"]
    return ",".join(kept + ["device=" + device])


def local_rank(rank, environ=None):
    """This process's rank among those of its host: the launcher's word for
    it, else ``rank`` (tmpi's own launcher starts every rank on one host)."""
    environ = os.environ if environ is None else environ
    for name in _LOCAL_RANK_ENV:
        value = environ.get(name, "")
        if value.isdigit():
            return int(value)
    return rank


def gpu_count(environ=None):
    """The CUDA GPUs this process may use: ``CUDA_VISIBLE_DEVICES``' entries
    (up to the first that names no device, as CUDA reads it), else the
    driver's list of GPUs, else 1."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = 0
        for entry in visible.split(","):
            entry = entry.strip()
            if not entry or entry.startswith("-") or entry == "NoDevFiles":
                break
            count += 1
        return count
    try:
        return max(1, len(os.listdir("/proc/driver/nvidia/gpus")))
    except OSError:
        return 1


#: One device per rank, as a Theano-MPI ``DEVICES`` list gives them (``cuda0,cuda1``).
DEVICES_ENV = "TMPI_DEVICES"


def has_cuda(environ=None):
    """True where CUDA GPUs may be used: the NVIDIA driver lists some, or
    ``CUDA_VISIBLE_DEVICES`` names some."""
    environ = os.environ if environ is None else environ
    if environ.get("CUDA_VISIBLE_DEVICES") is not None:
        return gpu_count(environ) > 0
    return os.path.isdir("/proc/driver/nvidia/gpus")


def choose(rank, threads=None, environ=None):
    """Set this rank's device in ``environ`` (``os.environ``) before Theano is
    imported; ``threads``: the rank's share of the cores, if tmpi chose one."""
    environ = os.environ if environ is None else environ
    listed = [d.strip() for d in environ.get(DEVICES_ENV, "").split(",") if d.strip()]
    device = device_flag(environ.get("THEANO_FLAGS"))
    if device is None and rank < len(listed) and (
            listed[rank].startswith("opencl") or
            listed[rank].startswith("cuda") and has_cuda(environ)):
        # A device THEANO_FLAGS names wins (the cfg's cuda0,cuda1 on a CPU machine).
        device = listed[rank]
        environ["THEANO_FLAGS"] = with_device(environ.get("THEANO_FLAGS"), device)
    if device is None:
        return
    here = local_rank(rank, environ)
    if device == "cuda":
        count = gpu_count(environ)
        if count:
            environ["THEANO_FLAGS"] = with_device(environ.get("THEANO_FLAGS"),
                                                  "cuda%d" % (here % count))
    elif device.startswith("opencl") and not environ.get("POCL_CACHE_DIR"):
        base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        environ["POCL_CACHE_DIR"] = os.path.join(base, "pocl", "tmpi-rank%d" % here)
        if threads and not environ.get("POCL_MAX_PTHREAD_COUNT"):
            environ["POCL_MAX_PTHREAD_COUNT"] = str(threads)


def is_device_array(array):
    """True for a ``pygpu`` device array (what Theano's GPU backend computes)."""
    return type(array).__module__.startswith("pygpu")


def is_device_type(theano_type):
    """True for the Theano type of a device variable (a ``GpuArrayType``;
    Theano's host ``TensorType`` names a context too, "cpu")."""
    return any(c.__name__ == "GpuArrayType" for c in type(theano_type).__mro__)


def describe():
    """The device Theano computes on in this process (``"cpu"``, or
    ``"cuda0 (NVIDIA H100 80GB HBM3)"``), once Theano is imported."""
    import sys
    theano = sys.modules.get("theano")
    if theano is None:
        return None
    device = str(theano.config.device)
    gpuarray = sys.modules.get("theano.gpuarray")
    if device == "cpu" or not getattr(gpuarray, "pygpu_activated", False):
        return "cpu"  # a device Theano could not open leaves it on the CPU
    try:
        from theano.gpuarray.type import get_context
        return "%s (%s)" % (device, get_context(None).devname.strip())
    except Exception:  # noqa: BLE001 - the flag alone still says where
        return device
