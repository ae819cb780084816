"""Each rank on cores of its own: no two ranks share a core while cores are free.

Left to the kernel, two ranks of a 2-core machine landed on the same core in 4
runs of 10 and stayed there: a rank waiting for the others (tmpi's wait loop
spins, yields, then sleeps) looks idle, so the load balancer does not move
it, and every collective then waits for the other rank's time slice (16 ms
steps instead of 0.7 ms).  So every rank binds itself when it starts,
whatever launched it:

* the ranks of a host share out the cores they were all given (the host's,
  or a job's cpuset), ``T`` each, ``T`` the rank's BLAS threads
  (``--threads-per-rank``, or the cores divided among the ranks);
* ranks that a launcher or scheduler already bound (``srun --cpu-bind``,
  ``mpiexec -bind-to``, Open MPI's default) keep their cores;
* ranks that need more cores than there are run on all of them, where the
  kernel balances them (they are all busy, so none looks idle);
* ``--bind none`` leaves the placement to the kernel.

Every thread of the rank is bound (BLAS may have started its threads
already), and the threads it starts later inherit the cores.  The rank's
cores and the core it was last seen on (:func:`current_cpu`, sampled every
few steps) go into the end-of-run summary, which warns when two ranks kept
running on one core while another was free.
"""
import os

#: This process's cores once :func:`settle` has run (for the summary).
BOUND = None


def cores():
    """The cores this process may run on, in order."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return list(range(os.cpu_count() or 1))


def share(given, local_rank, local_size, threads=None):
    """The cores of rank ``local_rank`` of ``local_size`` ranks that all were
    ``given`` the same cores: ``threads`` each (default: the cores divided
    among them, at least 1), contiguous.  Where they need more cores than
    there are, all of them: ranks that outnumber the cores are all busy, and
    the kernel balances busy ranks better than a fixed share (3 ranks on 2
    cores bound 2 and 1 would run at the pace of the shared core)."""
    per = threads or max(1, len(given) // local_size)
    if per * local_size <= len(given):
        return given[local_rank * per:(local_rank + 1) * per]
    return list(given)


def bind_threads(chosen):
    """Bind every thread of this process to ``chosen`` cores."""
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tasks = [0]
    for task in tasks:
        try:
            os.sched_setaffinity(task, chosen)
        except OSError:
            pass  # a thread that ended meanwhile


def bind(comm, mode="cores", threads=None):
    """Bind this rank (collective over ``comm``'s ranks): ``(its cores, the
    threads it should run)``, the threads being its share of its host's
    cores (``threads``, when given, wins)."""
    if comm.Get_size() == 1 or not hasattr(os, "sched_setaffinity"):
        return cores(), threads
    from mpi4py import MPI
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        masks = local.allgather(cores())
        rank, size = local.Get_rank(), local.Get_size()
    finally:
        local.Free()
    if len({tuple(m) for m in masks}) > 1:
        return masks[rank], threads or len(masks[rank])  # bound already, by a launcher
    share_of_cores = threads or max(1, len(masks[0]) // size)
    if mode == "none":
        return masks[0], share_of_cores
    chosen = share(masks[0], rank, size, threads)
    if chosen != masks[0]:
        bind_threads(chosen)
    return chosen, share_of_cores


def settle(comm, mode="cores"):
    """Bind this rank (:func:`bind`, collective) and, where nothing set the
    BLAS/OpenMP threads (an enclosing ``mpiexec`` or ``srun`` started the
    ranks), give the libraries the rank's share of the cores, as ``tmpi
    wrap -n N`` does for the ranks it starts.  Returns the rank's cores."""
    global BOUND
    from tmpi_adapters.process.threads import THREAD_ENV, limit_blas_threads
    given = next((int(os.environ[n]) for n in THREAD_ENV
                  if os.environ.get(n, "").isdigit()), None)
    BOUND, threads = bind(comm, mode, given)
    if comm.Get_size() > 1 and given is None and threads:
        limit_blas_threads(threads)
    return BOUND


def current_cpu():
    """The core this process ran on last (``/proc/self/stat``), or ``None``."""
    try:
        with open("/proc/self/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[36])
    except (OSError, IndexError, ValueError):
        return None


def shared_while_free(placements):
    """The ranks that kept running on one core while another of theirs was
    free: ``placements`` is per rank ``(cores, seen)``, ``seen`` the cores it
    was sampled on.  Returns ``[(core, [ranks])]``, empty when none did."""
    allowed = set().union(*(set(c) for c, _ in placements)) if placements else set()
    usual = {}
    for rank, (_, seen) in enumerate(placements):
        if seen:
            usual.setdefault(max(set(seen), key=seen.count), []).append(rank)
    stacked = [(core, ranks) for core, ranks in sorted(usual.items()) if len(ranks) > 1]
    if not stacked or len(allowed) <= len(usual):
        return []   # every core had its rank, or no samples
    return stacked


def describe(chosen):
    """``0-3`` or ``0,2``: a list of cores, short."""
    chosen = sorted(chosen)
    if chosen and chosen == list(range(chosen[0], chosen[-1] + 1)) and len(chosen) > 2:
        return "%d-%d" % (chosen[0], chosen[-1])
    return ",".join(str(c) for c in chosen)
