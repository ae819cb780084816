"""A job survives a lost rank (--max-restarts, --min-ranks) and a preemption
(SIGTERM), and still ends with the uninterrupted run's result.

Ranks are really killed (SIGKILL) or signalled under the installed mpiexec,
every restart is a fresh mpiexec job, and the final parameters are compared
with an uninterrupted run's in float64 (1e-8 relative).
"""
import os
import re
import signal
import time

import pytest

from conftest import EXAMPLES, SCRIPTS, TMPI, assert_close, check, final_numbers, mpiexec, \
    rank_env, tmpi
from test_reliability import START_TIMEOUT, Job, checkpoints, own_lines
from test_reliability_input import refused_here

MLP = EXAMPLES / "theano_mlp" / "train.py"
RESTART = SCRIPTS / "reliability_restart.py"
CRASH = SCRIPTS / "reliability_crash.py"
#: Steps of reliability_restart.py: a few seconds on 2 ranks.
STEPS = "12000"


def killed_once(directory, *args, env=None, stays_down=None):
    """``tmpi wrap ARGS`` with rank 1 killed (SIGKILL) once the first
    checkpoint is in ``directory`` (after ``stays_down`` is created, if
    given); ``(status, stdout, stderr)`` of the whole job, restarts included."""
    job = Job("wrap", *args, env=env)
    try:
        job.wait_for_checkpoint(directory)
        if stays_down is not None:
            stays_down.touch()
        os.kill(job.rank_pid(1), signal.SIGKILL)
        code, stdout, stderr = job.finish(timeout=START_TIMEOUT)
    finally:
        job.kill()
    return code, stdout, own_lines(stderr)


def keras_env():
    return rank_env("float64", KERAS_BACKEND="theano")


# Each: (script and arguments, environment, what its final lines hold, checkpoint
# every): the first checkpoint comes early, so the job still trains for seconds
# when the test kills its rank.
FRAMEWORKS = {
    "theano": ([MLP, "--epochs", "150", "--batch-size", "50", "--seed", "7"], rank_env,
               ["val_loss", "param_norms"], "50"),
    "lasagne": ([SCRIPTS / "lasagne_mnist.py", "mlp", "60"], rank_env, ["train", "norms"],
                "50"),
    "keras": ([SCRIPTS / "keras_mlp.py", "--floatx", "float64", "--cases", "sgd-fit",
               "--epochs", "40"], keras_env, ["sgd-fit weights", "sgd-fit evaluate"], "25"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_killed_rank_is_restarted_and_the_result_is_the_uninterrupted_one(framework,
                                                                            tmp_path):
    script, env, keys, every = FRAMEWORKS[framework]
    directory = tmp_path / "ck"
    code, stdout, stderr = killed_once(
        directory, "-n", "2", "--checkpoint-dir", directory, "--checkpoint-every", every,
        "--max-restarts", "1", *script, env=env())
    assert code == 0, stderr[-3000:]
    assert "tmpi: restart 1 of 1 (rank 1 was killed by signal 9 (SIGKILL) at step " in stderr
    assert "continuing from %s" % (directory / "checkpoint-step") in stderr
    assert "on 2 rank(s)." in stderr
    assert "tmpi: the job was restarted 1 time(s); " in stderr
    uninterrupted = check(tmpi("wrap", "-n", "2", *script, env=env()))
    for key in keys:
        print("%s %s: restarted %s\n    uninterrupted %s" % (
            framework, key, final_numbers(stdout, key), final_numbers(uninterrupted.stdout, key)))
        assert_close(final_numbers(stdout, key), final_numbers(uninterrupted.stdout, key), 1e-8)


@pytest.fixture(scope="module")
def uninterrupted():
    """The final parameters of reliability_restart.py on 2 ranks, uninterrupted."""
    return final_numbers(check(tmpi("wrap", "-n", "2", RESTART, STEPS)).stdout, "params")


@pytest.mark.mpi
def test_rank_that_cannot_come_back_leaves_the_job_to_the_others(uninterrupted, tmp_path):
    directory, down = tmp_path / "ck", tmp_path / "down"
    code, stdout, stderr = killed_once(
        directory, "-n", "2", "--checkpoint-dir", directory, "--checkpoint-every", "500",
        "--max-restarts", "2", "--min-ranks", "1", RESTART, STEPS,
        env=rank_env(TMPI_TEST_STAYS_DOWN=down), stays_down=down)
    assert code == 0, stderr[-3000:]
    assert "tmpi: restart 1 of 2 (rank 1 was killed by signal 9 (SIGKILL) at step " in stderr
    # The restarted job's rank 1 kills itself as it starts: no step is made.
    assert ("tmpi: restart 2 of 2 (rank 1 was killed by signal 9 (SIGKILL) before it "
            "completed a step past step ") in stderr
    assert "on 1 rank(s), one fewer: it failed again at once (--min-ranks 1)." in stderr
    assert "tmpi: the job was restarted 2 time(s); " in stderr
    assert_close(final_numbers(stdout, "params"), uninterrupted, 1e-8)


@pytest.mark.mpi
def test_sigterm_to_tmpi_writes_a_checkpoint_and_the_job_resumes_exactly(uninterrupted,
                                                                         tmp_path):
    directory = tmp_path / "ck"
    # Without --checkpoint-every: this script shows no epochs, so no checkpoint
    # is due before the one the signal asks for.
    job = Job("wrap", "-n", "2", "--checkpoint-dir", directory, RESTART, STEPS)
    try:
        job.wait_for_output("step 1000")
        signalled = time.time()
        job.process.send_signal(signal.SIGTERM)
        code, stdout, stderr = job.finish()
    finally:
        job.kill()
    assert code == 75, stderr
    [name] = checkpoints(directory)
    print("checkpoint %s written %.3f s after SIGTERM" % (
        name, os.stat(directory / name).st_mtime - signalled))
    assert "tmpi: SIGTERM: rank 0 writes a checkpoint at the end of the step in flight" in stderr
    assert "tmpi: preempted: wrote %s at step " % (directory / name) in stderr
    assert "final params" not in stdout
    resumed = check(tmpi("wrap", "-n", "2", "--checkpoint-dir", directory, "--resume", "auto",
                         RESTART, STEPS))
    assert "tmpi: resuming from %s" % (directory / name) in resumed.stdout
    assert_close(final_numbers(resumed.stdout, "params"), uninterrupted, 1e-8)


@pytest.mark.mpi
def test_crash_that_repeats_at_once_is_restarted_once(tmp_path):
    # Rank 1 aborts before its first step, in every job.
    result = tmpi("wrap", "-n", "2", "--checkpoint-dir", tmp_path, "--max-restarts", "3",
                  CRASH, "abort", "0")
    stderr = own_lines(result.stderr)
    assert result.returncode == 134, stderr
    assert stderr.count("tmpi: restart ") == 1, stderr
    assert ("tmpi: restart 1 of 3 (rank 1 was killed by signal 6 (SIGABRT) before it "
            "completed a step): continuing from where the job began") in stderr
    assert ("tmpi: not restarting: rank 1 was killed by signal 6 (SIGABRT) again before the "
            "restarted job completed a step past its checkpoint (step 0): a restart would "
            "fail the same way.") in stderr


@pytest.mark.mpi
def test_restarts_end_after_max_restarts(tmp_path):
    # Rank 1 fails at step 12 in every job; a checkpoint is written after step 10.
    result = tmpi("wrap", "-n", "2", "--checkpoint-dir", tmp_path, "--checkpoint-every", "5",
                  "--max-restarts", "2", CRASH, "raise", "12")
    stderr = own_lines(result.stderr)
    assert result.returncode == 1, stderr
    why = "rank 1 of 2 failed: ValueError: batch 12 of rank 1 is unreadable"
    # Rank 0 has finished step 12 (11 if it was stopped just before it noted it).
    reached = [int(step) for step in re.findall(
        r"tmpi: restart [12] of 2 \(%s at step (\d+)\): continuing from %s \(step 10\) on "
        r"2 rank\(s\)\." % (re.escape(why), re.escape(str(
            tmp_path / "checkpoint-step00000010.tmpi"))), stderr)]
    assert len(reached) == 2 and set(reached) <= {11, 12}, stderr
    assert "tmpi: not restarting: %s, and the job has had its 2 restart(s)" % why in stderr
    assert "tmpi: the job was restarted 2 time(s); %d step(s) were computed again" % (
        sum(reached) - 20) in stderr


@pytest.mark.mpi
def test_the_scripts_own_exit_status_is_not_a_failure_to_restart(tmp_path):
    result = tmpi("wrap", "-n", "2", "--checkpoint-dir", tmp_path, "--max-restarts", "2",
                  CRASH, "sysexit", "5")
    assert result.returncode == 3, result.stderr
    assert "tmpi: restart" not in result.stderr


@pytest.mark.parametrize("args,text", [
    (["--max-restarts", "2"], "--max-restarts needs --checkpoint-dir"),
    (["--max-restarts", "-1"], "--max-restarts must be a whole number >= 0, not '-1'"),
    (["--max-restarts", "two"], "--max-restarts must be a whole number >= 0, not 'two'"),
    (["--min-ranks", "0"], "--min-ranks must be a whole number >= 1, not '0'"),
    (["--checkpoint-dir", "ck", "--min-ranks", "1"], "--min-ranks needs --max-restarts"),
    (["--checkpoint-dir", "ck", "--max-restarts", "1", "--min-ranks", "3"],
     "--min-ranks 3 is more than the 2 rank(s) the job starts with (-n 2)"),
    (["--checkpoint-dir", "ck", "--max-restarts", "1", "--scaling", "weak"],
     "--max-restarts needs --scaling strong"),
])
def test_bad_restart_options_are_refused_at_the_command_line(capsys, args, text):
    refused_here(capsys, "wrap", "-n", "2", *args, MLP, texts=[text])


@pytest.mark.mpi
def test_max_restarts_inside_an_mpi_job_is_refused(tmp_path):
    # The ranks were started by someone else's mpiexec: tmpi cannot start them again.
    result = mpiexec(1, TMPI, "wrap", "--checkpoint-dir", tmp_path, "--max-restarts", "1",
                     MLP, "--epochs", "1")
    assert result.returncode == 2, result.stderr
    assert "--max-restarts needs tmpi wrap to start the ranks itself" in result.stderr
