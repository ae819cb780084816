"""The ``cuda-mpi`` exchanger: device buffers handed to a CUDA-aware MPI by mpi4py.

EXPERIMENTAL (see the package doc): written without a GPU, never run on one.

mpi4py reads device pointers from ``__cuda_array_interface__``; MPI knows
nothing of CUDA streams, so the work queued on a buffer is waited for before
MPI gets it.  Ranks may share a GPU.
"""
from tmpi_adapters.exchangers.base import ANY_SOURCE, ANY_TAG
from tmpi_adapters.exchangers.experimental import survey
from tmpi_adapters.exchangers.experimental.device import DeviceExchanger, is_device_array
from tmpi_adapters.exchangers.plans import MPIRequest


class CudaMPIExchanger(DeviceExchanger):
    """Device buffers handed straight to a CUDA-aware MPI through mpi4py.

    Collectives are the blocking ones, after a non-blocking barrier (see
    :meth:`_collective`).  Point to point of device arrays goes to MPI on the
    device pointers; host arrays, and ``probe``, go to the ``mpi`` exchanger
    (:attr:`host`) as they are, without staging.
    """

    name = "cuda-mpi"

    @classmethod
    def unavailable_reason(cls, size=None):
        """Why ``cuda-mpi`` cannot run here: CuPy, a GPU, or a CUDA-aware MPI missing."""
        # Asking MPI costs a child process outside a rank: only when a GPU is there.
        return survey.gpu_problem() or survey.cuda_aware_problem()

    def _collective(self, what, call, *args, **kwargs):
        """Run a blocking MPI collective on device buffers.

        Some CUDA-aware MPIs (Open MPI 4) take device pointers only in blocking
        collectives; a non-blocking barrier first turns a missing rank into a
        reported stall instead of a hang.
        """
        self._stream.synchronize()
        self.wait_for(self.comm.Ibarrier().Test, what)
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

    # -- point to point ----------------------------------------------------------
    def isend(self, array, dest, tag=0):
        if not is_device_array(array):
            return self.host.isend(array, dest, tag)
        with self.cp.cuda.Device(self.device):
            array = self.cp.ascontiguousarray(array)
            # MPI reads the buffer from now on: what writes it must be done.
            self.cp.cuda.get_current_stream().synchronize()
        return MPIRequest(self, self.comm.Isend(array, dest=dest, tag=tag),
                          "send to rank %d" % dest, keep=array)

    def irecv(self, out, source=ANY_SOURCE, tag=ANY_TAG):
        if not is_device_array(out):
            return self.host.irecv(out, source, tag)
        if not out.flags.c_contiguous:
            raise ValueError("irecv needs a C-contiguous buffer")
        # Work queued on ``out`` must not overwrite what MPI delivers.
        self.cp.cuda.get_current_stream().synchronize()
        request = self.comm.Irecv(out, source=self.MPI.ANY_SOURCE if source == ANY_SOURCE
                                  else source, tag=self.MPI.ANY_TAG if tag == ANY_TAG else tag)
        peer = "any rank" if source == ANY_SOURCE else "rank %d" % source
        return MPIRequest(self, request, "receive from " + peer, keep=out)

    def probe(self, source=ANY_SOURCE, tag=ANY_TAG):
        return self.host.probe(source, tag)
