"""Ranks never share a core while cores are free: each binds itself at start.

Real jobs (``tmpi wrap``, and ranks an enclosing ``mpiexec`` started) report
where they may run; the sharing rules and the summary's warning are checked
on their own.
"""
import os
import re

import pytest

from conftest import SCRIPTS, TMPI, check, mpiexec, rank_env, tmpi
from tmpi_adapters.process import binding

WHERE = SCRIPTS / "where_ranks_run.py"
CORES = len(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(CORES < 2, reason="binding needs two cores to tell apart")


def placements(stdout):
    """``{rank: (cores, every thread's cores, blas threads)}`` from the script's lines."""
    found = {}
    for rank, cores, threads, blas in re.findall(
            r"rank (\d+) cores ([\d,]+) threads ([\d,|]+) blas (\w+)", stdout):
        found[int(rank)] = (cores, threads, blas)
    return found


@pytest.mark.mpi
@needs_two_cores
def test_tmpi_wrap_gives_each_rank_cores_of_its_own():
    found = placements(check(tmpi("wrap", "-n", "2", "--framework", "theano",
                                  "--all-ranks-output", WHERE)).stdout)
    assert set(found) == {0, 1}
    cores = [set(found[r][0].split(",")) for r in (0, 1)]
    assert not cores[0] & cores[1]
    for rank in (0, 1):
        # Every thread (BLAS' included) is on the rank's own cores.
        assert found[rank][1] == found[rank][0]
    summary = check(tmpi("wrap", "-n", "2", SCRIPTS / "givens_logreg.py")).stdout
    assert re.search(r"; cores [\d,-]+ \| [\d,-]+", summary)


@pytest.mark.mpi
@needs_two_cores
def test_bind_none_leaves_the_ranks_to_the_kernel():
    found = placements(check(tmpi("wrap", "-n", "2", "--framework", "theano", "--bind", "none",
                                  "--all-ranks-output", WHERE)).stdout)
    everything = ",".join(map(str, sorted(os.sched_getaffinity(0))))
    assert found[0][0] == found[1][0] == everything


@pytest.mark.mpi
@needs_two_cores
def test_ranks_an_enclosing_mpiexec_started_are_bound_and_share_the_threads():
    """``mpiexec -n 2 tmpi wrap``: each rank binds itself and runs its share
    of the cores as BLAS threads, as under tmpi wrap -n 2."""
    env = rank_env()
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    found = placements(check(mpiexec(2, TMPI, "wrap", "--framework", "theano",
                                     "--all-ranks-output", WHERE, env=env)).stdout)
    cores = [set(found[r][0].split(",")) for r in (0, 1)]
    assert not cores[0] & cores[1]
    share = str(max(1, CORES // 2))
    assert found[0][2] == found[1][2] == share


@pytest.mark.mpi
@needs_two_cores
def test_a_launchers_binding_is_kept():
    found = placements(check(mpiexec(2, "-bind-to", "core:1", TMPI, "wrap",
                                     "--framework", "theano", "--all-ranks-output", WHERE)).stdout)
    assert found[0][0] != found[1][0] and "," not in found[0][0] + found[1][0]


@pytest.mark.parametrize("given,rank,size,threads,expected", [
    ([0, 1], 0, 2, None, [0]),
    ([0, 1], 1, 2, None, [1]),
    ([0, 1, 2, 3], 1, 2, None, [2, 3]),
    ([0, 1, 2, 3], 1, 2, 1, [1]),
    ([4, 5, 6], 2, 3, None, [6]),
    ([0, 1], 2, 3, None, [0, 1]),       # more ranks than cores: all, the kernel balances
    ([0, 1, 2], 1, 2, 2, [0, 1, 2]),    # more threads than cores: all
])
def test_the_cores_given_are_shared_out(given, rank, size, threads, expected):
    assert binding.share(given, rank, size, threads) == sorted(expected)


def test_ranks_that_kept_one_core_while_another_was_free_are_found():
    assert binding.shared_while_free([([0, 1], [1, 1, 1, 0]), ([0, 1], [1, 1, 1])]) == \
        [(1, [0, 1])]
    assert binding.shared_while_free([([0, 1], [0, 0, 1]), ([0, 1], [1, 1, 0])]) == []
    assert binding.shared_while_free([([0], [0]), ([1], [1])]) == []
    # Three ranks, two cores: sharing one is the best there is.
    assert binding.shared_while_free([([0, 1], [0]), ([0, 1], [1]), ([0, 1], [1])]) == []
    assert binding.describe([0, 1, 2, 3]) == "0-3" and binding.describe([0, 2]) == "0,2"
