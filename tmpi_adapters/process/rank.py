"""Which rank this process is."""


def mpi_rank_size():
    """``(rank, size)`` of this process in MPI's world (mpi4py starts MPI)."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
