"""A ``--checkpoint-dir`` belongs to one job at a time, and to one script.

Real jobs under the installed mpiexec: a second job on a directory in use is
refused before it trains, naming the job that holds it; the lock goes with
its job however that job ends (a normal end, ``kill -9``); a resume from
another script's checkpoint is refused naming both scripts first.
"""
import os
import re

import pytest

from conftest import SCRIPTS, check, final_numbers, tmpi
from test_reliability import START_TIMEOUT, Job, checkpoints, own_lines

RESTART = SCRIPTS / "reliability_restart.py"
#: A job that trains until it is stopped.
FOREVER = "100000000"


def refusal(stderr):
    [line] = [line for line in own_lines(stderr).splitlines() if "is in use by" in line]
    return line


@pytest.mark.mpi
def test_a_second_job_on_a_directory_in_use_is_refused_until_the_first_is_gone(tmp_path):
    directory = tmp_path / "ck"
    first = Job("wrap", "-n", "2", "--checkpoint-dir", directory, "--checkpoint-every", "500",
                RESTART, FOREVER)
    try:
        first.wait_for_checkpoint(directory)
        written = checkpoints(directory)
        holder = first.rank_pid(0)
        second = tmpi("wrap", "-n", "2", "--checkpoint-dir", directory, RESTART, "300",
                      timeout=START_TIMEOUT)
        assert second.returncode == 6, second.stderr[-3000:]
        line = refusal(second.stderr)
        assert re.match(r"tmpi: error \(rank 0\): --checkpoint-dir %s is in use by another job "
                        r"\(reliability_restart\.py, pid %d on \S+, since [-0-9]+ [:0-9]+\): "
                        % (re.escape(str(directory)), holder), line), line
        assert "final params" not in second.stdout
        # The second job wrote nothing there (it would end with step 300's).
        assert written and not [n for n in checkpoints(directory) if n.endswith("300.tmpi")]
        # Killed without a chance to clean up, the first job leaves its lock
        # file, which is no longer anybody's.
        first.kill()
        first.process.wait(timeout=60)
    finally:
        first.kill()
    assert (directory / ".tmpi-lock").exists()  # a killed job's: nobody's lock
    third = check(tmpi("wrap", "-n", "2", "--checkpoint-dir", directory, RESTART, "300",
                       timeout=START_TIMEOUT))
    assert "final params" in third.stdout and "in use" not in third.stderr
    assert not (directory / ".tmpi-lock").exists()


def test_the_lock_goes_with_a_job_that_ended(tmp_path):
    directory = tmp_path / "ck"
    for _ in range(2):
        result = check(tmpi("wrap", "--checkpoint-dir", directory, RESTART, "300",
                            timeout=START_TIMEOUT))
        assert "in use" not in result.stderr and "final params" in result.stdout
        # Nothing but the checkpoints is left: the lock file went with the job.
        assert os.listdir(directory) == checkpoints(directory) != []


def test_a_checkpoint_of_another_script_is_refused_naming_both_scripts(tmp_path):
    directory = tmp_path / "ck"
    other = tmp_path / "other_restart.py"
    other.write_text(RESTART.read_text())
    check(tmpi("wrap", "--checkpoint-dir", directory, "--checkpoint-every", "100", other, "150",
               timeout=START_TIMEOUT))
    # Other arguments too: the scripts are what is said first.
    result = tmpi("wrap", "--checkpoint-dir", directory, "--resume", "auto", RESTART, "300",
                  timeout=START_TIMEOUT)
    assert result.returncode == 6, result.stderr[-3000:]
    said = [line for line in own_lines(result.stderr).splitlines() if line.startswith("tmpi:")]
    assert len(said) == 1 and re.match(
        r"tmpi: error(?: \(rank 0\))?: checkpoint %s/checkpoint-step\d+\.tmpi was written by a "
        r"run of other_restart\.py, and this run is reliability_restart\.py: resume continues "
        r"a run of the same script\." % re.escape(str(directory)), said[0]), said
    assert "script arguments" not in said[0] and "final params" not in result.stdout
    # A renamed script may go on, warned, with --allow-new-arguments.
    renamed = check(tmpi("wrap", "--checkpoint-dir", directory, "--resume", "auto",
                         "--allow-new-arguments", RESTART, "300", timeout=START_TIMEOUT))
    assert "tmpi: warning: checkpoint %s" % (directory / "checkpoint-step") in renamed.stdout + \
        renamed.stderr
    assert final_numbers(renamed.stdout, "params")
