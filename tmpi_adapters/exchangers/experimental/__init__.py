"""EXPERIMENTAL GPU exchangers: ``nccl`` and ``cuda-mpi``, for device buffers.

Read this before relying on them
--------------------------------
This code was written without a GPU and has **never run on one**.  CI has no
GPU: every test that needs one skips, naming the reason.  What runs
everywhere, and is tested, is the plain-Python part: availability checks and
their messages, device choice, the choice of exchanger, the 16-bit conversions
(shared with the ``mpi`` exchanger in :mod:`tmpi_adapters.exchangers.codecs`)
and the chunking arithmetic.

Expected to work (written for it, untested on hardware):

- ``nccl``: NCCL through ``cupy.cuda.nccl``, one GPU per rank; fused weighted
  ``allreduce`` (per-array ``ops``, a known ``total``) in native/fp32/fp16/bf16
  with float32 sums, ``broadcast``, ``allgather_rows``,
  ``allgather_object``, ``barrier``; host (numpy) arrays staged through the
  device.  Enough for synchronous rules (``bsp``, EASGD with ``mode=sync``).
- ``cuda-mpi``: the same collectives through a CUDA-aware MPI, ranks may share
  a GPU; point to point too (device arrays on device pointers, host arrays as
  they are), so asynchronous rules can use it.

Not supported:

- point to point over NCCL: the ``nccl`` exchanger's ``isend``, ``irecv`` and
  ``probe`` raise :class:`~tmpi_adapters.errors.TmpiError`; asynchronous rules
  (EASGD with ``mode=async``, GoSGD, ASGD) need ``--exchanger mpi`` or
  ``cuda-mpi``;
- ``bucket_bytes``: each dtype group travels in one collective;
- lockstep envelopes on device collectives: barriers and metadata gathers go
  through the ``mpi`` exchanger and are checked, the device collectives not.

Where a GPU is missing, ``--exchanger nccl`` (or ``cuda-mpi``) fails on every
rank before training with the reason (``unavailable_reason()``).

Modules
-------
:mod:`.survey`
    availability, visible devices, CUDA-awareness, choosing an exchanger;
:mod:`.device`
    :class:`~.device.DeviceExchanger`, the collectives both share;
:mod:`.nccl`, :mod:`.cuda_mpi`
    the two exchangers: the primitives that move bytes;
:mod:`.bench`
    ``python -m tmpi_adapters.exchangers.experimental.bench``: timings for the
    first session on GPUs.

This package is the plugin: it registers both exchangers (``tmpi_exchangers``)
and picks one when the models live on GPUs (``tmpi_select_exchanger``).
"""
import sys

from tmpi_adapters.exchangers.experimental import survey
from tmpi_adapters.exchangers.experimental.cuda_mpi import CudaMPIExchanger
from tmpi_adapters.exchangers.experimental.nccl import NCCLExchanger
from tmpi_adapters.pluginmanager import hookimpl

EXCHANGERS = {"nccl": NCCLExchanger, "cuda-mpi": CudaMPIExchanger}


@hookimpl
def tmpi_exchangers():
    return dict(EXCHANGERS)


def survey_this_rank(comm):
    """What this rank can run: ``{"nccl": reason, "cuda-mpi": reason, "gpu": identity}``.

    Collective over ``comm`` (it finds the rank's place on its machine).
    """
    local_rank, _ = survey.local_rank_and_size(comm)
    entry = {name: cls.unavailable_reason() for name, cls in EXCHANGERS.items()}
    entry["gpu"] = None
    if survey.gpu_problem() is None:
        device = survey.device_for_local_rank(local_rank, survey.visible_gpu_count())
        entry["gpu"] = survey.device_identity(survey.require_cupy(), device)
    return entry


@hookimpl(tryfirst=True)
def tmpi_select_exchanger(session):
    """``nccl`` (else ``cuda-mpi``) when the models live on GPUs, one per rank."""
    if not survey.buffers_on_gpu():
        return None
    comm = session.comm
    entry = survey_this_rank(comm)
    everyone = comm.allgather(entry) if session.size > 1 else [entry]
    name = survey.choose_exchanger(everyone)
    if name is None and session.rank == 0:
        why = survey.why_no_gpu_exchanger(everyone)
        print("tmpi: the models live on GPUs but no GPU exchanger can run (%s); "
              "exchanging through host memory with mpi" % why, file=sys.stderr, flush=True)
    return name
