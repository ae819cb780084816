"""tmpi under a real Slurm cluster: Debian's slurmctld, slurmd and munge on two
emulated hosts (tests/slurm.py, tools/emulated-slurm), real srun, sbatch and
scancel, float64.

- ``srun -N 2 --ntasks-per-node 2 tmpi wrap`` gives ``tmpi wrap -n 4``'s numbers.
- The README's sbatch template, preempted by the SIGUSR1 of its own
  ``#SBATCH --signal=USR1@120`` before the time limit, ends its first run
  with status 75 on every task, requeues itself and continues with
  ``--resume auto`` to exactly the uninterrupted result.  So it does when
  ``scancel --signal=TERM`` comes while a node's ranks are frozen and the
  step in flight cannot end (``--preempt-grace``).
- A node's tasks killed: the job ends, naming each rank killed and its node.
"""
import os
import re
import signal
import subprocess
import time

import pytest

from conftest import BIN, EXAMPLES, ROOT, SCRIPTS, TMPI, assert_close, check, final_numbers, \
    rank_env, run, tmpi
from hosts import emulated_hosts  # noqa: F401 (the fixture slurm builds on)
from slurm import slurm  # noqa: F401 (the fixture)
from test_reliability import START_TIMEOUT

pytestmark = pytest.mark.mpi

MLP = EXAMPLES / "theano_mlp" / "train.py"
RESTART = SCRIPTS / "reliability_restart.py"
STEPS = "4000"


def slurm_env(slurm, **extra):  # noqa: F811
    """The environment of a Slurm command here: the venv's tmpi on PATH (the
    job's tasks inherit it: sbatch and srun pass the environment on)."""
    env = rank_env(PATH="%s:%s" % (BIN, os.environ.get("PATH", "")), **extra)
    return slurm.environ(env)


def readme_template():
    """The sbatch script of the README's Slurm section, as a user copies it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### Slurm"):]
    start = section.index("```bash\n") + len("```bash\n")
    return section[start:section.index("\n```", start) + 1]


def job_script(directory, grace=None):
    """The README's template for this cluster: 2 tasks a node, the test's
    checkpoint directory (on a file system both nodes see) and script.  Its
    time limit, ``--signal=USR1@120`` and the rest stay as they are."""
    script = readme_template()
    for old, new in [("--ntasks-per-node=4", "--ntasks-per-node=2"),
                     ('"$HOME/ckpt/$SLURM_JOB_NAME"', '"%s"' % directory),
                     ("--checkpoint-every 10min", "--checkpoint-every 500" +
                      (" --preempt-grace %d" % grace if grace else "")),
                     ("train.py --epochs 90", "%s %s" % (RESTART, STEPS))]:
        assert old in script, "the README's sbatch template changed: %r is gone" % old
        script = script.replace(old, new)
    for kept in ("#SBATCH --requeue", "#SBATCH --signal=USR1@120", "--resume auto",
                 'scontrol requeue "$SLURM_JOB_ID"', "srun --kill-on-bad-exit=1 tmpi wrap"):
        assert kept in script, "the README's sbatch template changed: %r is gone" % kept
    return script


def seconds(text):
    """Slurm's ``[D-]HH:MM:SS`` in seconds."""
    days, _, clock = text.rpartition("-")
    hours, minutes, secs = (int(part) for part in clock.split(":"))
    return (int(days or 0) * 24 + hours) * 3600 + minutes * 60 + secs


@pytest.fixture(scope="module")
def uninterrupted():
    """reliability_restart.py's final parameters on 4 ranks of one machine."""
    return final_numbers(check(tmpi("wrap", "-n", "4", RESTART, STEPS)).stdout, "params")


def test_srun_on_two_nodes_gives_the_numbers_of_tmpi_wrap_n_4(slurm):  # noqa: F811
    command = ["wrap", "--seed", "1", MLP, "--epochs", "2"]
    on_slurm = check(run(["srun", "-N", "2", "--ntasks-per-node", "2", TMPI] + command,
                         env=slurm_env(slurm), timeout=START_TIMEOUT))
    said = on_slurm.stdout + on_slurm.stderr
    # One rank a task, two on each node, each bound on its node.
    assert re.search(r"on 4 rank\(s\).*cores %s: \S+ \| \S+, %s: \S+ \| \S+" % tuple(slurm.nodes),
                     said), said[-3000:]
    here = check(tmpi("wrap", "-n", "4", *command[1:]))
    for key in ("val_loss", "param_norms"):
        print("%s: srun %s\n    tmpi wrap -n 4 %s" % (key, final_numbers(on_slurm.stdout, key),
                                                    final_numbers(here.stdout, key)))
        assert_close(final_numbers(on_slurm.stdout, key), final_numbers(here.stdout, key),
                     1e-10)


def _tasks(words):
    """srun's ``0``, ``2-3`` or ``0,2`` -> the number of tasks named."""
    count = 0
    for part in words.split(","):
        first, _, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count


@pytest.mark.parametrize("how", ["scancel-TERM-node-frozen", "time-limit-USR1"])
def test_the_readmes_sbatch_job_preempted_requeues_and_resumes_exactly(
        slurm, uninterrupted, how):  # noqa: F811
    directory = slurm.shared / ("ck-" + how)
    output = slurm.shared / ("job-%s.out" % how)
    script = slurm.shared / ("job-%s.sh" % how)
    frozen = how.endswith("frozen")
    script.write_text(job_script(directory, grace=5 if frozen else None))
    extra = {}
    if not frozen:
        # The first run's steps take 15 ms more each while this file exists:
        # still training when the warning comes, however fast the machine.
        slow = slurm.shared / "slow"
        slow.touch()
        extra["TMPI_TEST_SLOW"] = str(slow)
    env = slurm_env(slurm, **extra)
    submitted = slurm.command("sbatch", "--parsable", "--job-name", "preempt-" + how,
                              "--output", output, script, env=env)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + START_TIMEOUT
    while "step 1000" not in (output.read_text() if output.exists() else ""):
        if time.monotonic() > deadline:
            slurm.command("scancel", job)
            pytest.fail("job %s did not reach step 1000 within %d s: %s" % (
                job, START_TIMEOUT, output.read_text() if output.exists() else "no output"))
        time.sleep(0.2)
    if frozen:
        # A node frozen mid-step: its ranks hold the step up past the grace.
        stopped = slurm.hosts.kill_host(slurm.nodes[1], signal.SIGSTOP, ranks_only=True)
        assert len(stopped) == 2, stopped
        time.sleep(1)
        scancel = slurm.command("scancel", "--signal=TERM", job, env=env)
        assert scancel.returncode == 0, scancel.stderr
    else:
        # The job script's --signal=USR1@120: Slurm sends SIGUSR1 to the
        # tasks 120 s before the time limit (with a SIGCONT: a stopped node
        # would run again; its check runs every 30 s, and sends it up to 30 s
        # sooner).  The time limit is brought to where that moment is now;
        # the run would end 90 s or more after it.
        elapsed = seconds(slurm.job_fields(job)["RunTime"])
        limit = (elapsed + 150) // 60
        update = slurm.command("scontrol", "update", "JobId=%s" % job, "TimeLimit=%d" % limit)
        assert update.returncode == 0, update.stderr
        slurm.wait_until(job, lambda fields: int(fields.get("Restarts", 0)) >= 1,
                         "the first run's requeue", timeout=120)
        # The requeued run (pending for 16 s, tools/emulated-slurm) has the
        # template's day again, and trains at full speed.
        slow.unlink()
        update = slurm.command("scontrol", "update", "JobId=%s" % job, "TimeLimit=24:00:00")
        assert update.returncode == 0, update.stderr
        sent = re.findall(r"warning signal (\d+) to JobId=%s\b" % job, slurm.log.read_text())
        assert sent == [str(int(signal.SIGUSR1))], sent
    state, restarts, code = slurm.wait_for_job(job)
    text = output.read_text()
    print(text[-4000:])
    assert (state, restarts, code) == ("COMPLETED", 1, "0:0"), text[-4000:]
    cut = text.index("tmpi: resuming from")
    first, second = text[:cut], text[cut:]
    # The first run: every task ended with the preemption's status (so srun's is 75).
    ended = re.findall(r"srun: error: \S+: tasks? ([-0-9,]+): Exited with exit code (\d+)",
                       first)
    assert {status for _, status in ended} == {"75"}, first[-3000:]
    assert sum(_tasks(tasks) for tasks, _ in ended) == 4, first[-3000:]
    assert "killed by" not in text, text[-4000:]
    if frozen:
        line = re.search(r"tmpi: preempted: the step in flight did not end within 5 s of the "
                         r"SIGTERM .*The newest checkpoint on disk is (\S+) \(step (\d+)\)", first)
        assert line, first[-3000:]
        assert re.search(r"tmpi: rank [23] of 4 \(pid \d+ on %s\) was stopped \(SIGSTOP\)" %
                         slurm.nodes[1], first), first[-3000:]
    else:
        line = re.search(r"tmpi: preempted: wrote (\S+) at step \d+", first)
        assert line, first[-3000:]
    assert "tmpi: resuming from %s (step" % line.group(1) in second, second[-3000:]
    print("final params: requeued %s\n    uninterrupted %s" % (
        final_numbers(second, "params"), uninterrupted))
    assert_close(final_numbers(second, "params"), uninterrupted, 1e-10)


def test_a_nodes_tasks_killed_are_named_with_the_node(slurm):  # noqa: F811
    name = "killed-node"
    out, err = slurm.shared / "killed.out", slurm.shared / "killed.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        process = subprocess.Popen(
            ["srun", "--kill-on-bad-exit=1", "--job-name", name, "-N", "2",
             "--ntasks-per-node", "2", TMPI, "wrap", RESTART, "100000000"],
            env=slurm_env(slurm), cwd=ROOT, stdout=stdout, stderr=stderr)
    node = slurm.nodes[1]
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while "step 1000" not in out.read_text():  # training
            assert time.monotonic() < deadline and process.poll() is None, err.read_text()
            time.sleep(0.2)
        killed = slurm.hosts.kill_host(node, signal.SIGKILL, ranks_only=True)
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            slurm.command("scancel", "--name", name)
            process.kill()
            process.wait(timeout=60)
        slurm.resume()
    said = err.read_text()
    assert process.returncode != 0, said[-3000:]
    named = re.findall(r"^tmpi: rank (\d) of 4 \(pid (\d+) on (\S+)\) was killed by signal 9 "
                       r"\(SIGKILL\)", said, re.M)
    assert len(killed) == 2, killed
    assert sorted((int(pid), host) for _, pid, host in named) == \
        sorted((pid, node) for pid in killed), said[-3000:]
    assert sorted(int(rank) for rank, _, _ in named) == [2, 3], said[-3000:]
