"""Checkpoints and exact resume of an unmodified script, and clear errors for bad ones."""
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from conftest import EXAMPLES, ROOT, assert_close, check, final_numbers, tmpi
from test_reliability import Job, checkpoints, own_lines

MLP = EXAMPLES / "theano_mlp" / "train.py"
# Long enough (1200 steps) that the run is still going when it is killed after
# its first checkpoint; stable enough that 1 and 2 ranks agree to rounding.
LONG = ["--epochs", "40", "--batch-size", "50", "--seed", "7"]
SHORT = ["--batch-size", "50", "--seed", "3"]


def finals(stdout):
    return final_numbers(stdout, "val_loss") + final_numbers(stdout, "param_norms")


def epoch_lines(stdout):
    """What the script printed per epoch, without the timing."""
    return [line.rsplit("(", 1)[0] for line in stdout.splitlines() if line.startswith("epoch")]


@pytest.mark.mpi
def test_killed_run_resumes_to_the_uninterrupted_result_on_2_and_on_1_rank(tmp_path):
    directory = tmp_path / "checkpoints"
    job = Job("wrap", "-n", "2", "--checkpoint-dir", directory, "--checkpoint-every", "1epochs",
              MLP, *LONG)
    try:
        job.wait_for_checkpoint(directory)
        os.kill(job.rank_pid(1), signal.SIGKILL)
        code, interrupted, stderr = job.finish()
    finally:
        job.kill()
    assert code != 0 and "epoch 40/40" not in interrupted, "the run was not interrupted"
    assert "rank 1" in stderr and "SIGKILL" in stderr
    first = os.path.join(directory, checkpoints(directory)[0])

    uninterrupted = check(tmpi("wrap", "-n", "2", MLP, *LONG))
    resumed = check(tmpi("wrap", "-n", "2", "--checkpoint-dir", directory, "--resume", "latest",
                         MLP, *LONG))
    assert "tmpi: resuming from %s" % directory in resumed.stdout
    print("2 ranks: uninterrupted %s\n         resumed       %s"
          % (finals(uninterrupted.stdout), finals(resumed.stdout)))
    assert_close(finals(resumed.stdout), finals(uninterrupted.stdout), 1e-8)
    # The replayed epochs print what the original run printed.
    assert epoch_lines(resumed.stdout) == epoch_lines(uninterrupted.stdout)

    # The same checkpoint of a 2-rank run, resumed on 1 rank (a file named).
    single = check(tmpi("wrap", "-n", "1", "--resume", first, MLP, *LONG))
    print("1 rank:  resumed       %s" % finals(single.stdout))
    assert "2 rank(s)" in single.stdout
    assert_close(finals(single.stdout), finals(uninterrupted.stdout), 1e-8)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """A 1-epoch run with a checkpoint every 10 steps and one at the end."""
    directory = tmp_path_factory.mktemp("short")
    check(tmpi("wrap", "-n", "1", "--checkpoint-dir", directory, "--checkpoint-every", "10",
               "--checkpoint-keep", "2", MLP, "--epochs", "1", *SHORT))
    return directory


def test_checkpoints_are_kept_and_the_final_one_extends_to_a_longer_run(short_run):
    # 30 steps: checkpoints after 10, 20 and at the end (30); the newest 2 kept.
    assert checkpoints(short_run) == ["checkpoint-step00000020.tmpi",
                                      "checkpoint-step00000030.tmpi"]
    assert not [n for n in os.listdir(short_run) if n.startswith(".")]  # no partial files
    # Other script arguments than the checkpointed run's: allowed explicitly.
    longer = check(tmpi("wrap", "-n", "1", "--checkpoint-dir", short_run, "--resume", "latest",
                        "--allow-new-arguments", MLP, "--epochs", "2", *SHORT))
    plain = check(tmpi("wrap", "-n", "1", MLP, "--epochs", "2", *SHORT))
    assert_close(finals(longer.stdout), finals(plain.stdout), 1e-12)


def resume_error(path, *args, script_args=SHORT + ["--epochs", "1"]):
    result = tmpi("wrap", "-n", "1", "--resume", path, *args, MLP, *script_args)
    stderr = own_lines(result.stderr)
    assert result.returncode == 6, stderr
    assert "Traceback" not in stderr
    return stderr


def test_truncated_checkpoint_is_a_clear_error(short_run, tmp_path):
    broken = tmp_path / "truncated.tmpi"
    data = (short_run / "checkpoint-step00000020.tmpi").read_bytes()
    broken.write_bytes(data[:len(data) // 2])
    assert "is corrupt: truncated" in resume_error(broken)


def test_corrupt_checkpoint_is_a_clear_error(short_run, tmp_path):
    broken = tmp_path / "flipped.tmpi"
    data = bytearray((short_run / "checkpoint-step00000020.tmpi").read_bytes())
    data[-100] ^= 0xFF
    broken.write_bytes(bytes(data))
    assert "is corrupt: its checksum does not match" in resume_error(broken)


def test_file_that_is_no_checkpoint_is_a_clear_error():
    assert "is not a tmpi checkpoint" in resume_error(MLP)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    assert "--resume %s: no such file" % (tmp_path / "nope.tmpi") in resume_error(
        tmp_path / "nope.tmpi")
    assert "no checkpoint in %s" % tmp_path in resume_error(
        "latest", "--checkpoint-dir", tmp_path)


def test_checkpoint_of_another_model_is_a_clear_error(short_run):
    stderr = resume_error(short_run / "checkpoint-step00000020.tmpi", "--allow-new-arguments",
                          script_args=SHORT + ["--epochs", "1", "--hidden", "32"])
    assert "does not fit this model" in stderr
    assert "'W' shape (64, 64)" in stderr and "'W' shape (64, 32)" in stderr


def test_run_that_does_not_retrace_its_checkpoint_is_stopped(short_run):
    # Other batches: the replay sees other arguments than the log has.
    stderr = resume_error(short_run / "checkpoint-step00000020.tmpi", "--allow-new-arguments",
                          script_args=["--batch-size", "40", "--seed", "3", "--epochs", "1"])
    assert "resume diverged at call #1 (train_fn#0): its arguments differ" in stderr


WRITER = """
import os, sys
from tmpi_adapters.files import write_atomic
from tmpi_adapters.reliability.checkpoint.fileformat import encode
write_atomic(os.path.join(sys.argv[1], "checkpoint-step00000001.tmpi"),
             encode({"blob": bytes(200 * 1024 * 1024)}, {}))
"""


def test_a_crash_while_writing_never_destroys_the_previous_checkpoint(tmp_path):
    from tmpi_adapters.files import write_atomic
    from tmpi_adapters.reliability.checkpoint.fileformat import decode, encode
    previous = write_atomic(str(tmp_path / "checkpoint-step00000001.tmpi"),
                            encode({"good": True}, {}))
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], cwd=ROOT)

    def partial():
        return [n for n in os.listdir(tmp_path) if n.endswith(".partial")]
    while not partial() and writer.poll() is None:
        time.sleep(0.001)
    writer.send_signal(signal.SIGKILL)  # in the middle of writing the new checkpoint
    writer.wait()
    assert partial(), "the writer finished before it could be killed"
    header, state = decode(open(previous, "rb").read(), previous)
    assert state == {"good": True}
    shutil.rmtree(tmp_path)


def test_theano_random_streams_resume_exactly(tmp_path):
    # Dropout from MRG streams inside the training function, noise from a
    # RandomStreams function between epochs: the run that wrote the
    # checkpoints is the uninterrupted one, and the resume must print the same.
    script = ROOT / "tests" / "scripts" / "reliability_dropout.py"
    original = check(tmpi("wrap", "-n", "1", "--seed", "2", "--checkpoint-dir", tmp_path,
                          "--checkpoint-every", "1epochs", script, "4"))
    resumed = check(tmpi("wrap", "-n", "1", "--resume",
                         tmp_path / "checkpoint-step00000012.tmpi", script, "4"))
    assert "resumed at step 12" in resumed.stdout

    def printed(stdout):
        return [line for line in stdout.splitlines() if line.startswith(("epoch", "final"))]
    assert printed(resumed.stdout) == printed(original.stdout)
