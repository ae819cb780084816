"""A preemption is bounded: after SIGTERM or SIGUSR1, a step in flight that
does not end within ``--preempt-grace`` (a rank stopped with SIGSTOP holds it
up, as a frozen node would) no longer keeps the job: it ends with status 75,
one ``tmpi: preempted:`` line names the newest checkpoint on disk and the
steps that are lost, nothing of the job is left running, and ``--resume
auto`` continues from that checkpoint to the uninterrupted result.

Real signals to real processes under the installed mpiexec: ``tmpi wrap -n
2`` (its launcher bounds the job) and an enclosing ``mpiexec -n 2 tmpi wrap``
(each rank's ``tmpi wrap`` bounds its rank, as under ``srun``).
"""
import os
import re
import signal
import time

import pytest

from conftest import SCRIPTS, assert_close, check, final_numbers, tmpi
from test_enclosing import Enclosed
from test_reliability import START_TIMEOUT, Job, checkpoints, own_lines

RESTART = SCRIPTS / "reliability_restart.py"
#: Steps of reliability_restart.py: the job still trains when a rank is
#: stopped after "step 1000".
STEPS = "12000"
#: The grace of these tests, and what the job may take beyond it to end
#: (ranks killed, mpiexec reaped) on a loaded 2-core machine.
GRACE = 4
SLACK = 10
#: The line of a preemption whose grace passed.
OVERDUE = re.compile(
    r"tmpi: preempted: the step in flight did not end within %d s of the (SIG\w+) "
    r"\(--preempt-grace\)(?:: (.*?))?, so the job was stopped; it ends with status 75\. "
    r"(?:The newest checkpoint on disk is (\S+) \(step (\d+)\)(?:; rank 0 had completed "
    r"step (\d+), so (\d+) step\(s\) are lost)?: the same command with --resume auto "
    r"continues from step \d+\.|No checkpoint of this run is in (\S+): the same command with "
    r"--resume auto starts from the beginning(?:, and the (\d+) step\(s\) rank 0 had "
    r"completed are lost)?\.)$" % GRACE, re.M)


def stopped_then_signalled(job, stop_pids, signal_pids, number):
    """Stop ``stop_pids`` (SIGSTOP), let the other ranks reach the step they
    wait in, then send signal ``number`` to ``signal_pids``; ``(status,
    stdout, stderr, seconds from the signal to the end, processes left)``."""
    for pid in stop_pids:
        os.kill(pid, signal.SIGSTOP)
    time.sleep(2)  # a rank one step ahead finishes it, then waits for the stopped one
    signalled = time.monotonic()
    for pid in signal_pids:
        os.kill(pid, number)
    code, stdout, stderr = job.finish(timeout=GRACE + 60)
    took = time.monotonic() - signalled
    deadline = time.monotonic() + 5
    while job.processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    return code, stdout, own_lines(stderr), took, job.processes()


def overdue_line(stderr):
    found = OVERDUE.findall(stderr)
    assert len(found) == 1, stderr[-3000:]
    return found[0]


@pytest.fixture(scope="module")
def uninterrupted():
    """The final parameters of reliability_restart.py on 2 ranks, uninterrupted."""
    return final_numbers(check(tmpi("wrap", "-n", "2", RESTART, STEPS)).stdout, "params")


@pytest.mark.mpi
def test_sigterm_with_a_rank_stopped_ends_within_the_grace_and_resumes_exactly(
        tmp_path, uninterrupted):
    directory = tmp_path / "ck"
    command = ["-n", "2", "--checkpoint-dir", directory, "--checkpoint-every", "200",
               RESTART, STEPS]
    job = Job("wrap", "--preempt-grace", str(GRACE), *command)
    try:
        job.wait_for_output("step 1000", timeout=START_TIMEOUT)
        stopped = job.rank_pid(1)
        code, stdout, stderr, took, left = stopped_then_signalled(
            job, [stopped], [job.process.pid], signal.SIGTERM)
    finally:
        job.kill()
    print("ended %.2f s after SIGTERM (grace %d s)" % (took, GRACE))
    assert code == 75, stderr[-3000:]
    assert GRACE <= took < GRACE + SLACK, took
    assert not left, "processes left behind: %s" % left
    name, stuck, path, step, progress, lost, _, _ = overdue_line(stderr)
    assert name == "SIGTERM"
    assert stuck == "rank 1 (pid %d) is stopped (SIGSTOP)" % stopped, stderr[-3000:]
    # The newest checkpoint on disk, and the steps done since it.
    newest = checkpoints(directory)[-1]
    assert path == str(directory / newest) and int(step) == int(newest[15:23]), stderr
    assert int(progress) >= 1000 and int(lost) == int(progress) - int(step), stderr
    assert "tmpi: preempted: wrote" not in stderr and "final params" not in stdout
    resumed = check(tmpi("wrap", *command[:-2], "--resume", "auto", RESTART, STEPS))
    assert "tmpi: resuming from %s" % path in resumed.stdout
    assert_close(final_numbers(resumed.stdout, "params"), uninterrupted, 1e-8)


@pytest.mark.mpi
def test_sigusr1_with_rank_0_stopped_before_any_checkpoint(tmp_path):
    directory = tmp_path / "ck"
    job = Job("wrap", "-n", "2", "--checkpoint-dir", directory, "--preempt-grace", str(GRACE),
              RESTART, "100000000")
    try:
        job.wait_for_output("step 500", timeout=START_TIMEOUT)
        stopped = job.rank_pid(0)
        code, stdout, stderr, took, left = stopped_then_signalled(
            job, [stopped], [job.process.pid], signal.SIGUSR1)
    finally:
        job.kill()
    assert code == 75, stderr[-3000:]
    assert GRACE <= took < GRACE + SLACK, took
    assert not left, "processes left behind: %s" % left
    name, stuck, path, _, _, _, empty, done = overdue_line(stderr)
    assert name == "SIGUSR1" and stuck == "rank 0 (pid %d) is stopped (SIGSTOP)" % stopped
    # No --checkpoint-every and no epochs: nothing was written, and the
    # steps rank 0 completed (its step outlives it) are all lost.
    assert path == "" and empty == str(directory) and int(done) >= 500, stderr[-3000:]
    assert checkpoints(directory) == []


@pytest.mark.mpi
def test_under_an_enclosing_mpiexec_each_ranks_tmpi_wrap_bounds_the_preemption(tmp_path):
    directory = tmp_path / "ck"
    job = Enclosed("--checkpoint-dir", directory, "--checkpoint-every", "200",
                   "--preempt-grace", str(GRACE), RESTART, "100000000")
    try:
        job.wait_for_output("step 1000", timeout=START_TIMEOUT)
        stopped = job.pid(1)
        # As srun does on scancel: every task (each rank's tmpi wrap) gets it.
        code, stdout, stderr, took, left = stopped_then_signalled(
            job, [stopped], [job.pid(0, supervisor=True), job.pid(1, supervisor=True)],
            signal.SIGTERM)
    finally:
        job.kill()
    assert code == 75, stderr[-3000:]
    assert GRACE <= took < GRACE + SLACK, took
    assert not left, "processes left behind: %s" % left
    # Rank 1's tmpi wrap names its rank; rank 0's names the checkpoint.
    assert re.search(r"^tmpi: rank 1 of 2 \(pid %d on \S+\) was stopped \(SIGSTOP\) and held "
                     r"up the step in flight past --preempt-grace %d s after the SIGTERM; it "
                     r"was killed\.$" % (stopped, GRACE), stderr, re.M), stderr[-3000:]
    name, stuck, path, step, progress, lost, _, _ = overdue_line(stderr)
    assert path == str(directory / checkpoints(directory)[-1]), stderr[-3000:]
    assert int(lost) == int(progress) - int(step) and int(progress) >= 1000, stderr[-3000:]


@pytest.mark.parametrize("args, text", [
    (["--preempt-grace", "5"], "--preempt-grace needs --checkpoint-dir"),
    (["--checkpoint-dir", "ck", "--preempt-grace", "0"],
     "--preempt-grace must be a number of seconds > 0, not '0'"),
    (["--checkpoint-dir", "ck", "--preempt-grace", "soon"],
     "--preempt-grace must be a number of seconds > 0, not 'soon'"),
])
def test_bad_preempt_grace_is_refused_at_the_command_line(args, text):
    result = tmpi("wrap", *args, RESTART, "10")
    assert result.returncode == 2 and text in result.stderr, result.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_during_the_grace_stops_the_job_at_once(tmp_path, second):
    # Rank 1 frozen holds the step in flight; the second signal, 3 s into the
    # grace, waits neither for it nor for mpiexec to give up on the frozen
    # rank: the job ends at once with the signal's status.
    job = Job("wrap", "-n", "2", "--checkpoint-dir", tmp_path / "ck", "--preempt-grace", "60",
              RESTART, "100000000")
    try:
        job.wait_for_output("step 500", timeout=START_TIMEOUT)
        os.kill(job.rank_pid(1), signal.SIGSTOP)
        time.sleep(1)
        os.kill(job.process.pid, signal.SIGTERM)
        code, stdout, stderr, took, left = stopped_then_signalled(
            job, [], [job.process.pid], second)
    finally:
        job.kill()
    print("ended %.2f s after the second signal" % took)
    assert code == 128 + second, stderr[-3000:]
    assert took < 1.0, took
    assert not left, "processes left behind: %s" % left
    lines = stderr.strip().splitlines()
    assert lines[-1] == "tmpi: interrupted (%s): the job's 2 rank(s) were stopped." \
        % signal.Signals(second).name, stderr[-3000:]
