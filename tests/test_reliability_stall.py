"""Stalls: ranks waiting on a collective others never reach are reported by name."""
import pytest

from conftest import SCRIPTS, tmpi
from test_reliability import START_TIMEOUT, own_lines

STALL = SCRIPTS / "reliability_stall.py"


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [[], ["--overlap"]], ids=["fused", "overlap"])
def test_rank0_validating_alone_is_reported_and_the_job_goes_on(overlap):
    # Rank 0 spends 8 s in a loop of its own while rank 1 waits in the next
    # step's gradient exchange; with --stall-timeout 2 that is reported, and
    # when rank 0 comes back the job finishes normally (--on-stall report).
    # With --overlap rank 1 waits for a part it started.
    result = tmpi("wrap", "-n", "2", "--stall-timeout", "2", *overlap, STALL,
                  "rank0-validates", "8", timeout=START_TIMEOUT)
    stderr = own_lines(result.stderr)
    assert result.returncode == 0, stderr
    assert "final W" in result.stdout
    assert "tmpi: stall: rank 1 waited" in stderr and "in allreduce" in stderr
    assert "rank 0 has not reached it" in stderr, stderr
    # What each rank was doing, down to the line of the script.
    assert "rank 0: running the script after step 5 of train#0" in stderr
    assert "in validate_on_rank0_only" in stderr
    assert "rank 1: waiting" in stderr and "in step 6 of train#0" in stderr
    assert "The job keeps waiting" in stderr


@pytest.mark.mpi
def test_stall_aborts_on_request_naming_both_sides():
    # Rank 0 "validates" far longer than the stall timeout while rank 1 waits
    # in step 6: with --on-stall abort the report ends the job.  (Ranks that
    # run out of batches early are not a stall: they leave lockstep, and
    # tests/test_lockstep.py shows that case ending at once.)
    result = tmpi("wrap", "-n", "2", "--stall-timeout", "2", "--on-stall", "abort", STALL,
                  "rank0-validates", "60", timeout=START_TIMEOUT)
    stderr = own_lines(result.stderr)
    assert result.returncode == 4, stderr
    assert "tmpi: stall:" in stderr
    assert "rank 1: waiting" in stderr and "in step 6 of train#0" in stderr
    assert "rank 0: running the script after step 5 of train#0" in stderr, stderr
    assert "rank 0 has not reached it" in stderr
    assert "Ending the job (--on-stall abort)" in stderr
    assert stderr.count("tmpi: stall:") == 1
    assert "Traceback" not in stderr
