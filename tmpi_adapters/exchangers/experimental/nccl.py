"""The ``nccl`` exchanger: device buffers over NCCL through ``cupy.cuda.nccl``.

EXPERIMENTAL (see the package doc): written without a GPU, never run on one.

Rank 0 makes the NCCL unique id and MPI hands it to every rank; the
collectives run on one NCCL communicator over all ranks, on the exchanger's
stream.  NCCL needs one GPU per rank.  There is no point to point: asynchronous rules need
``--exchanger mpi`` or ``cuda-mpi``.
"""
import itertools

import numpy as np

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.exchangers.base import ANY_SOURCE, ANY_TAG
from tmpi_adapters.exchangers.experimental import survey
from tmpi_adapters.exchangers.experimental.device import DeviceExchanger

# NCCL type names (attributes of cupy.cuda.nccl) for the dtypes it can reduce.
NCCL_TYPES = {
    "float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
    "int8": "NCCL_INT8", "uint8": "NCCL_UINT8", "int32": "NCCL_INT32",
    "uint32": "NCCL_UINT32", "int64": "NCCL_INT64", "uint64": "NCCL_UINT64",
}
#: Polls of a wait between two looks for NCCL's asynchronous errors.
_ERROR_CHECK = 1024

NO_POINT_TO_POINT = (
    "the nccl exchanger does not support point-to-point transfers (send, receive, "
    "probe); asynchronous rules (easgd with mode=async, gosgd, asgd) need "
    "--exchanger mpi or --exchanger cuda-mpi")


def nccl_type_name(dtype):
    """The ``cupy.cuda.nccl`` constant that reduces ``dtype``; ConfigError if none."""
    name = NCCL_TYPES.get(np.dtype(dtype).name)
    if name is None:
        raise ConfigError("NCCL cannot reduce arrays of dtype %s; use float16, float32 or "
                          "float64" % np.dtype(dtype))
    return name


class NCCLExchanger(DeviceExchanger):
    """Device buffers over NCCL through CuPy; one GPU per rank; collectives only.

    ``allgather_object`` and ``barrier`` use MPI; ``isend``, ``irecv`` and
    ``probe`` raise :class:`~tmpi_adapters.errors.TmpiError`.
    """

    name = "nccl"
    one_gpu_per_rank = True
    #: No send/receive: what a caller checks before relying on them.
    point_to_point = False
    _nccl = None

    def __init__(self, comm=None, precision=None, bucket_bytes=None, timeout=None,
                 on_stall=None):
        super().__init__(comm, precision, bucket_bytes, timeout, on_stall)
        if self.size > 1:
            nccl = survey.nccl_module()
            unique_id = self.host.allgather_object(
                nccl.get_unique_id() if self.rank == 0 else None)[0]
            with self.cp.cuda.Device(self.device):
                self._nccl = nccl.NcclCommunicator(self.size, unique_id, self.rank)

    @classmethod
    def unavailable_reason(cls, size=None):
        """Why ``nccl`` cannot run here: CuPy, a GPU or NCCL missing.

        With ``size``, also when this machine has fewer visible GPUs than
        ``size`` ranks started on it would need (NCCL cannot put two ranks
        of one communicator on one GPU).
        """
        # Without CuPy both answer the same: say it once.
        problems = list(dict.fromkeys([survey.gpu_problem(), survey.nccl_problem()]))
        if not any(problems) and size is not None and size > survey.visible_gpu_count():
            problems.append("NCCL needs one GPU per rank: %d ranks, %d GPU(s) visible (%s)"
                            % (size, survey.visible_gpu_count(),
                               survey.describe_visible_devices()))
        return "; ".join(p for p in problems if p) or None

    # -- waiting --------------------------------------------------------------------
    def _watched(self, test):
        """A peer that died leaves NCCL kernels waiting forever: poll
        ``check_async_error`` too, so the wait ends with NCCL's error."""
        if self._nccl is None:
            return test
        polls = itertools.count(1)

        def watched():
            if next(polls) % _ERROR_CHECK == 0:
                self._nccl.check_async_error()
            return test()
        return watched

    # -- primitives -----------------------------------------------------------------
    def _run(self, what, launch):
        """Queue NCCL work with ``launch(nccl, stream_ptr)`` and wait for it."""
        launch(survey.nccl_module(), self._stream.ptr)
        self._wait_stream(what)

    def _allreduce_sum(self, buf):
        dtype = getattr(survey.nccl_module(), nccl_type_name(buf.dtype))
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

    # -- point to point: not supported ---------------------------------------------
    def isend(self, array, dest, tag=0):
        raise TmpiError(NO_POINT_TO_POINT)

    def irecv(self, out, source=ANY_SOURCE, tag=ANY_TAG):
        raise TmpiError(NO_POINT_TO_POINT)

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG):
        raise TmpiError(NO_POINT_TO_POINT)

    def close(self):
        if self._nccl is not None:
            self._stream.synchronize()
            self._nccl.destroy()
            self._nccl = None
        super().close()
