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

A device asked for that Theano could not open is never silent: Theano logs
one ``ERROR (theano.gpuarray)`` and computes on the CPU.  :func:`choose`
keeps Theano's words (:func:`watch_theano`), :func:`opened` tells each rank
what it asked for, what it got and why (the reliability plugin's device
check gathers them and speaks for the job), and :func:`fallback_line` says
it in one line.
"""
import logging
import os
import sys

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
    if environ is os.environ:
        watch_theano()
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


# -- a device asked for and not opened --------------------------------------------

#: The devices Theano's GPU backend opens (``device=cuda``, ``cuda1``, ``opencl0:0``).
DEVICE_PREFIXES = ("cuda", "opencl")

#: The run's ``warning`` record when ranks that asked for a device compute
#: on the CPU (set by the device check as the session starts, on rank 0;
#: ``--record`` writes it after its header), else ``None``.
notice = None


class _TheanoWords(logging.Handler):
    """Keeps the last error Theano's GPU backend logged (with its exception)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.text = None

    def emit(self, record):
        text = record.getMessage()
        error = record.exc_info[1] if record.exc_info else None
        if error is not None:
            text = "%s (%s)" % (text, _exception_text(error))
        self.text = text


_theano_words = _TheanoWords()


def watch_theano():
    """Keep what Theano's GPU backend logs when it cannot open its device
    (call before Theano is imported; Theano still prints it as before)."""
    logger = logging.getLogger("theano.gpuarray")
    if _theano_words not in logger.handlers:
        logger.addHandler(_theano_words)


def _exception_text(error):
    """``Type: message``, with pygpu's bytes messages as text."""
    message = error.args[0] if len(error.args) == 1 else str(error)
    if isinstance(message, bytes):
        message = message.decode("utf-8", "replace")
    return "%s: %s" % (type(error).__name__, str(message).strip())


def asked():
    """The device Theano was asked for (``cuda0``, ``opencl0:0``; ``device=cuda``
    is a numbered one by now), or ``None``: none, or Theano not imported."""
    theano = sys.modules.get("theano")
    device = str(theano.config.device) if theano is not None else ""
    return device if device.startswith(DEVICE_PREFIXES) else None


def why_not_opened():
    """Theano's reason for computing on the CPU although a device was asked
    for: pygpu missing (the import's error), or what its GPU backend logged
    when it could not open the device (no CUDA driver, pygpu too old, ...)."""
    gpuarray = sys.modules.get("theano.gpuarray")
    if gpuarray is not None and getattr(gpuarray, "pygpu", None) is None:
        try:
            import pygpu  # noqa: F401 - only its error is wanted
        except Exception as error:  # noqa: BLE001 - any failure is the reason
            return "pygpu could not be imported (%s)" % _exception_text(error)
    text = _theano_words.text
    if text is None and asked():
        # Theano was imported before tmpi could listen (the decorator's script
        # imports it first): ask pygpu itself.
        try:
            import pygpu
            pygpu.init(asked())
        except Exception as error:  # noqa: BLE001 - any failure is the reason
            text = "pygpu could not open %s (%s)" % (asked(), _exception_text(error))
    if text is None:
        return "Theano's GPU backend gave no reason here: see its ERROR (theano.gpuarray) above"
    return ("no CUDA driver here: " if "libcuda.so" in text else "") + text


def opened():
    """``(asked, got, why)`` of this process, once Theano is imported: the
    device asked for (``None``: none), the device Theano computes on
    (:func:`describe`) and, where a device was asked for and Theano computes
    on the CPU, why (:func:`why_not_opened`), else ``None``."""
    device = asked()
    got = describe() or "cpu"
    why = why_not_opened() if device is not None and got == "cpu" else None
    return device, got, why


def fallback_ranks(found):
    """The ranks that asked for a device and compute on the CPU, of
    ``found``: every rank's :func:`opened`, in rank order."""
    return [rank for rank, (device, got, _) in enumerate(found)
            if device is not None and got == "cpu"]


def fallback_line(found, required=False):
    """One line on ranks that asked for a device and compute on the CPU
    (``found``: every rank's :func:`opened`); ``None`` where every rank got
    its device.

    ``required`` (``--require-device``): the words of the error, else those
    of the warning printed before the first step.
    """
    cpu = fallback_ranks(found)
    if not cpu:
        return None
    size = len(found)
    devices = " and ".join(dict.fromkeys(found[r][0] for r in cpu))
    if size == 1:
        where = ("", ": the run computes on the CPU")
    elif len(cpu) == size:
        where = (" on any of the %d ranks" % size, ": all %d ranks compute on the CPU" % size)
    else:
        others = ", ".join(dict.fromkeys(got for _, got, _ in found if got != "cpu"))
        ranks = "rank%s %s of %d" % ("s" if len(cpu) > 1 else "", _ranks(cpu), size)
        where = (" on " + ranks, ": %s compute%s on the CPU (the others on %s)" % (
            ranks, "" if len(cpu) > 1 else "s", others))
    reasons = list(dict.fromkeys(found[r][2] for r in cpu))
    why = reasons[0] if len(reasons) == 1 else "; ".join(
        "rank %s: %s" % (_ranks([r for r in cpu if found[r][2] == reason]), reason)
        for reason in reasons)
    if required:
        return ("THEANO_FLAGS asks for device=%s (--require-device), but Theano opened no "
                "device%s. Theano's reason: %s. Set up Theano's GPU backend with `make gpu` "
                "(docs/gpu.md), or leave out --require-device to train on the CPU."
                % (devices, where[0], why.rstrip(".")))
    return ("warning: THEANO_FLAGS asks for device=%s, but Theano opened no device%s. "
            "Theano's reason: %s. `make gpu` sets up Theano's GPU backend (docs/gpu.md); "
            "--require-device makes this an error." % (devices, where[1], why.rstrip(".")))


def _ranks(ranks):
    return ", ".join(map(str, ranks[:-1])) + (" and " if len(ranks) > 1 else "") + \
        str(ranks[-1])
