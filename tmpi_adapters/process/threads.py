"""BLAS/OpenMP threads per rank: how many, setting them, and reading them back.

Ranks that ``tmpi wrap`` starts on one machine share its cores
(:func:`default_threads`); one rank gets what plain ``python`` gets.  The
count is set through the environment before numpy loads its BLAS, or with
threadpoolctl once it has (:func:`limit_blas_threads`), and the end-of-run
summary reports what the loaded BLAS says (:func:`blas_threads`).
"""
import os

#: Environment variables that set BLAS/OpenMP threads, read when numpy loads.
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores():
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def default_threads(n):
    """BLAS/OpenMP threads of each of ``n`` ranks tmpi starts on this machine:
    the cores shared out, at least one; ``None`` for one rank (the libraries'
    own default, as under plain ``python``)."""
    return None if n <= 1 else max(1, usable_cores() // n)


def blas_threads():
    """BLAS threads of this process: what the loaded BLAS says (threadpoolctl),
    else the environment, else ``None``."""
    try:
        from threadpoolctl import threadpool_info
        counts = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        if counts:
            return max(counts)
    except Exception:  # noqa: B902 - only a detail of the summary line is lost
        pass
    for name in THREAD_ENV:
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return None


def limit_blas_threads(threads):
    """Set this process's BLAS/OpenMP threads now (BLAS is already loaded) and
    for what it starts."""
    for name in THREAD_ENV:
        os.environ[name] = str(threads)
    try:
        from threadpoolctl import threadpool_limits
        threadpool_limits(threads)
    except ImportError:
        pass
