"""Exact resume of a Keras script that validates as it trains, 2 -> 2 and 2 -> 1 ranks.

Every rank must compare the whole batch's fingerprint of a replayed call
(the split happens inside), and evaluation functions with metric updates run
again for their updates but answer what they returned originally.
"""
import pytest

from conftest import SCRIPTS, check, final_numbers, rank_env, tmpi

SCRIPT = SCRIPTS / "keras_resume.py"


def run(*args):
    env = rank_env("float64")
    env["THEANO_FLAGS"] += ",cxx="  # a tiny model: no C compilation
    return check(tmpi("wrap", *[str(a) for a in args], SCRIPT, env=env))


@pytest.mark.mpi
def test_validating_keras_script_resumes_exactly(tmp_path):
    directory = tmp_path / "ck"
    uninterrupted = run("-n", "2", "--checkpoint-dir", directory, "--checkpoint-every", "4")
    # Step 24 is in the third epoch, after two validations.
    checkpoint = directory / "checkpoint-step00000024.tmpi"
    assert checkpoint.exists(), sorted(p.name for p in directory.iterdir())
    for ranks in ("2", "1"):
        resumed = run("-n", ranks, "--resume", checkpoint)
        assert "tmpi: resumed at step 24" in resumed.stdout, resumed.stdout
        for key in ("norms", "val_loss", "test"):
            assert final_numbers(resumed.stdout, key) == pytest.approx(
                final_numbers(uninterrupted.stdout, key), rel=1e-8), (ranks, key)
