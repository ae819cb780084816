"""Prints where this rank may run: ``rank R cores C threads T`` (its cores,
every thread's, and the BLAS threads the loaded library runs)."""
import os

import numpy as np
from mpi4py import MPI

from tmpi_adapters.process.threads import blas_threads

np.dot(np.ones((64, 64)), np.ones((64, 64)))   # BLAS has started its threads
threads = sorted({tuple(sorted(os.sched_getaffinity(int(t))))
                  for t in os.listdir("/proc/self/task")})
print("rank %d cores %s threads %s blas %s" % (
    MPI.COMM_WORLD.Get_rank(), ",".join(map(str, sorted(os.sched_getaffinity(0)))),
    "|".join(",".join(map(str, t)) for t in threads), blas_threads()), flush=True)
