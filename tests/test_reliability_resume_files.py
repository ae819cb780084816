"""A resume never leaves the script's files worse than before, and survives a
corrupt newest checkpoint.

The script (``tests/scripts/reliability_files.py``) writes the weights after
every epoch, the best ones by validation loss and the final ones.  A job of
it is stopped after epoch 3 (checkpoints every epoch) and resumed with
``--resume latest``: its files then equal the uninterrupted run's, and
while it replays the epochs before the checkpoint they hold the
checkpoint's weights, never the initial ones.  Resumed again once it has
finished, it is refused and its files stay as they are.
With the newest checkpoint cut short or altered, ``latest`` and ``auto``
resume from the newest one that verifies.
"""
import os
import shutil

import numpy as np
import pytest

from conftest import SCRIPTS, TMPI, assert_close, check, rank_env, run
from test_reliability import own_lines

SCRIPT = SCRIPTS / "reliability_files.py"
FILES = ("every.npy", "best.npy", "final.npy")


def tmpi_in(directory, *args, **env):
    """``tmpi ARGS...`` run in ``directory`` (the script's paths are relative)."""
    return run([TMPI] + [str(a) for a in args], env=rank_env(**env), cwd=directory)


def job(directory, *args, script_args=(), **env):
    """The script on 2 ranks in ``directory``, its files in ``directory/out``."""
    os.makedirs(directory / "out", exist_ok=True)
    return tmpi_in(directory, "wrap", "-n", "2", "--seed", "5", "--checkpoint-dir", "ck",
                   *args, SCRIPT, "out", *script_args, **env)


def weights(directory):
    return {name: np.load(directory / "out" / name) for name in FILES
            if (directory / "out" / name).exists()}


def assert_same_files(directory, expected):
    found = weights(directory)
    assert sorted(found) == sorted(expected)
    for name in FILES:
        assert_close(found[name], expected[name], 1e-8)


def copy(source, destination):
    shutil.copytree(source, destination)
    return destination


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    directory = tmp_path_factory.mktemp("uninterrupted")
    check(job(directory))
    return weights(directory)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """A job stopped after epoch 3, with checkpoints after steps 12, 18 and 24."""
    directory = tmp_path_factory.mktemp("stopped")
    result = job(directory, "--checkpoint-every", "1epochs", STOP_AFTER_EPOCH=3)
    assert result.returncode == 3, result.stderr
    assert sorted(os.listdir(directory / "ck")) == [
        "checkpoint-step%08d.tmpi" % step for step in (12, 18, 24)]
    return directory


@pytest.fixture(scope="module")
def finished(stopped, tmp_path_factory):
    """The stopped job resumed to its end."""
    directory = copy(stopped, tmp_path_factory.mktemp("finished") / "job")
    resumed = check(job(directory, "--resume", "latest"))
    assert "resuming from %s" % (directory / "ck" / "checkpoint-step00000024.tmpi") \
        in resumed.stdout
    return directory


@pytest.mark.mpi
def test_a_resumed_job_leaves_the_files_of_the_uninterrupted_run(finished, uninterrupted):
    assert_same_files(finished, uninterrupted)


@pytest.mark.mpi
def test_a_resume_stopped_in_its_replay_leaves_the_files_as_they_were(stopped, tmp_path):
    # Stopped again after epoch 2, which it replayed: what the script wrote
    # of its weights meanwhile are the checkpoint's (the weights after epoch
    # 3, as the files already hold), never the initial ones.
    directory = copy(stopped, tmp_path / "job")
    before = {name: (directory / "out" / name).read_bytes() for name in FILES[:2]}
    result = job(directory, "--resume", "latest", STOP_AFTER_EPOCH=2)
    assert result.returncode == 3, result.stderr
    assert "epoch 2 val" in result.stdout
    assert {name: (directory / "out" / name).read_bytes() for name in FILES[:2]} == before


@pytest.mark.mpi
def test_a_finished_run_is_not_run_again(finished, tmp_path):
    directory = copy(finished, tmp_path / "job")
    before = {name: (directory / "out" / name).read_bytes() for name in FILES}
    checkpoints = sorted(os.listdir(directory / "ck"))
    # latest asked for a run to continue: an error; auto is what a scheduler's
    # requeue passes: a job that had finished ends with 0, as it did.
    for resume, status in (("latest", 6), ("auto", 0)):
        result = job(directory, "--resume", resume)
        stderr = own_lines(result.stderr)
        assert result.returncode == status, stderr
        assert stderr.count("was written when its run finished") == 1, stderr
        assert "checkpoint %s was written when its run finished (step 36): there is nothing " \
               "to resume, so the script is not run again" \
               % (directory / "ck" / "checkpoint-step00000036.tmpi") in stderr
        assert "epoch 0" not in result.stdout
    assert {name: (directory / "out" / name).read_bytes() for name in FILES} == before
    assert sorted(os.listdir(directory / "ck")) == checkpoints


@pytest.mark.mpi
def test_a_finished_run_trains_on_with_new_arguments(finished, tmp_path):
    longer = tmp_path / "longer"
    check(job(longer, script_args=["--epochs", "8"]))
    directory = copy(finished, tmp_path / "job")
    resumed = check(job(directory, "--resume", "latest", "--allow-new-arguments",
                        script_args=["--epochs", "8"]))
    assert "resumed at step 36" in resumed.stdout
    assert_same_files(directory, weights(longer))


def damage(path, how):
    data = bytearray(path.read_bytes())
    if how == "truncated":
        del data[len(data) // 2:]
    else:
        data[-100] ^= 0x01
    path.write_bytes(bytes(data))


@pytest.mark.mpi
@pytest.mark.parametrize("how,resume,reason", [
    ("truncated", "latest", "it is corrupt: truncated ("),
    ("flipped", "auto", "it is corrupt: its checksum does not match")])
def test_a_corrupt_newest_checkpoint_is_passed_over(stopped, uninterrupted, tmp_path, how,
                                                    resume, reason):
    directory = copy(stopped, tmp_path / "job")
    newest, older = (directory / "ck" / ("checkpoint-step%08d.tmpi" % step) for step in (24, 18))
    damage(newest, how)
    resumed = check(job(directory, "--resume", resume))
    output = resumed.stdout + resumed.stderr
    assert "tmpi: warning: --resume %s: skipped %s: %s" % (resume, newest, reason) in output
    assert "resuming from %s" % older in resumed.stdout
    assert_same_files(directory, uninterrupted)
    # Named on the command line, a corrupt file is an error.
    result = job(directory, "--resume", newest)
    assert result.returncode == 6 and "%s is corrupt" % newest in result.stderr


def test_no_checkpoint_that_verifies_is_an_error(stopped, tmp_path):
    directory = copy(stopped, tmp_path / "job")
    for name in os.listdir(directory / "ck"):
        damage(directory / "ck" / name, "truncated")
    result = tmpi_in(directory, "wrap", "--checkpoint-dir", "ck", "--resume", "latest",
                     SCRIPT, "out")
    stderr = own_lines(result.stderr)
    assert result.returncode == 6, stderr
    assert "--resume latest: no checkpoint in %s verifies: %s is corrupt: truncated" % (
        directory / "ck", directory / "ck" / "checkpoint-step00000024.tmpi") in stderr
    assert "Traceback" not in stderr
