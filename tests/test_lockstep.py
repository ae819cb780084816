"""Ranks that leave lockstep end the job in seconds, naming what each was doing.

Real scripts under real ``mpiexec`` (``tests/scripts/lockstep.py``), each in a
way real scripts go wrong; every collective carries an envelope, checked
when it completes, so none of them mixes silently or hangs.
"""
import re
import subprocess
import time

import pytest

from conftest import SCRIPTS, rank_env, tmpi

SCRIPT = SCRIPTS / "lockstep.py"
#: What the issue allows from the divergence to the end of the job.
BOUND_S = 30


def wrap(mode, *options):
    env = rank_env("float64")
    env["THEANO_FLAGS"] += ",cxx="  # tiny graphs: no C compilation
    start = time.monotonic()
    result = tmpi("wrap", "-n", "2", *options, SCRIPT, mode, env=env, timeout=120)
    return result, time.monotonic() - start


def no_rank_left():
    found = subprocess.run(["pgrep", "-f", str(SCRIPT)], capture_output=True, text=True)
    return found.stdout.strip() == ""


@pytest.mark.mpi
@pytest.mark.parametrize("mode, ranks_said", [
    ("swapped", ["rank 0: the identical start of A#0", "rank 1: the identical start of B#1"]),
    # Each rank's own shard: other data in the very first step, long before
    # rank 1 runs out of batches.
    ("uneven", ["they were handed different batches", "rank 0: A#0 call 1 (32 rows), data #",
                "rank 1: A#0 call 1 (32 rows), data #"]),
    ("break", ["rank 0: A#0 call 5 (32 rows)", "rank 1: finished the script after 4"]),
    ("exit", ["rank 0: A#0 call 5 (32 rows)", "rank 1: finished the script after 4"]),
    ("caught", ["rank 0: A#0 call 5 (32 rows)", "rank 1: A#0 call 6 (32 rows)"]),
    ("rows", ["rank 0: A#0 call 1 (32 rows)", "rank 1: A#0 call 1 (16 rows)"]),
    ("eval", ["rank 0: evaluating validate", "rank 1: A#0 call 4 (32 rows)",
              "so it too must be called on every rank"]),
])
def test_divergence_ends_the_job_naming_each_rank(mode, ranks_said):
    result, seconds = wrap(mode)
    assert result.returncode == 7, result.stdout + result.stderr
    assert "ranks left lockstep" in result.stderr, result.stderr
    for text in ranks_said:
        assert text in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Apply node" not in result.stderr
    assert result.stderr.count("ranks left lockstep") == 1, result.stderr
    assert seconds < BOUND_S, seconds
    assert no_rank_left()


@pytest.mark.mpi
@pytest.mark.parametrize("mode, ranks_said", [
    ("swapped", ["rank 0: the identical start of A#0", "rank 1: the identical start of B#1"]),
    ("caught", ["rank 0: A#0 call 5 (32 rows)", "rank 1: A#0 call 6 (32 rows)"]),
    ("rows", ["rank 0: A#0 call 1 (32 rows)", "rank 1: A#0 call 1 (16 rows)"]),
])
def test_overlapped_parts_are_checked_as_the_fused_exchange(mode, ranks_said):
    # --overlap leaves each part's collective running while the step goes
    # on; its envelope is checked when it ends, as the fused exchange's.
    result, seconds = wrap(mode, "--overlap")
    assert result.returncode == 7, result.stdout + result.stderr
    for text in ranks_said:
        assert text in result.stderr, result.stderr
    assert result.stderr.count("ranks left lockstep") == 1, result.stderr
    assert "Traceback" not in result.stderr and seconds < BOUND_S
    assert no_rank_left()


@pytest.mark.mpi
def test_sys_exit_0_on_one_rank_is_its_script_ending_early():
    # sys.exit(0) (or None) is the script's end, as when it returns, so a
    # rank that leaves with it while the others train left lockstep: 7
    # (docs/reliability.md; a non-zero sys.exit(N) ends the job with N,
    # test_reliability.py).  Every rank's output shown, MPICH's own line on
    # the MPI_Abort that ends the job is not: tmpi's line is the last.
    result, seconds = wrap("exit", "--all-ranks-output")
    assert result.returncode == 7, result.stdout + result.stderr
    last = result.stderr.strip().splitlines()[-1]
    # (relayed with its rank's prefix, or, when the abort came first, from
    # the report the rank left for the launcher)
    assert re.match(r"(\[rank \d\] )?tmpi: error \(rank \d\): ranks left lockstep", last) and \
        "rank 1: finished the script after 4 call(s) of A#0" in last, result.stderr
    assert result.stderr.count("ranks left lockstep") == 1, result.stderr
    assert "MPI_Abort" not in result.stdout + result.stderr, result.stderr
    assert seconds < BOUND_S and no_rank_left()


@pytest.mark.mpi
def test_ranks_in_step_pass():
    result, _ = wrap("same")
    assert result.returncode == 0, result.stderr
    assert "done" in result.stdout


@pytest.mark.mpi
def test_start_up_has_a_deadline():
    # Rank 1 waits for rank 0, which imports Theano first: longer than 0.05 s.
    result, seconds = wrap("same", "--start-timeout", "0.05")
    assert result.returncode == 4, result.stdout + result.stderr
    assert "ranks started within" in result.stderr, result.stderr
    assert seconds < BOUND_S


@pytest.mark.mpi
@pytest.mark.parametrize("style", ["args", "givens"])
def test_ranks_handed_different_batches_of_the_same_shape_end_the_job(style):
    # Each rank loads its own rows: splitting them again would silently drop
    # half of every rank's data.
    script = SCRIPTS / "sharded_data.py"
    result = tmpi("wrap", "-n", "2", script, style, timeout=120)
    assert result.returncode == 7, result.stderr
    assert "they were handed different batches (rank 0: train#0 call 1 (16 rows), data #" \
        in result.stderr, result.stderr
    assert "run with --scaling weak" in result.stderr
    # The same data on every rank, or each rank's own under weak scaling, trains.
    for options, args in (((), ("same",)), (("--scaling", "weak"), ())):
        result = tmpi("wrap", "-n", "2", *options, script, style, *args, timeout=120)
        assert result.returncode == 0 and "final W" in result.stdout, result.stderr


@pytest.mark.mpi
def test_after_different_batches_a_script_that_goes_on_draws_alike_again():
    # A test runner catches the error and runs its next test: the ranks'
    # generators are rank 0's again, so the next batches agree.
    result = tmpi("wrap", "-n", "2", SCRIPTS / "diverged_generators.py", timeout=120)
    assert result.returncode == 0, result.stderr
    assert "caught: ranks left lockstep: they were handed different batches" in result.stdout
    assert "final loss" in result.stdout and "4 steps on 2 rank(s)" in result.stdout
