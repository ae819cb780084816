"""NaN/Inf in exchanged gradients: found at the exchange, named, then a stop or a skip."""
import os

import pytest

from conftest import SCRIPTS, assert_close, check, final_numbers, tmpi
from test_reliability import START_TIMEOUT, own_lines

NAN_SCRIPT = SCRIPTS / "reliability_nonfinite.py"


#: W and b in parts of their own: the check sees both once the step's last part is in.
OVERLAP = ["--overlap", "--bucket-bytes", "8"]


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [[], OVERLAP], ids=["fused", "overlap"])
def test_nonfinite_gradient_stops_the_job_and_keeps_the_last_good_checkpoint(tmp_path,
                                                                             overlap):
    result = tmpi("wrap", "-n", "2", "--nonfinite", "stop", "--checkpoint-dir", tmp_path,
                  "--checkpoint-every", "2", *overlap, NAN_SCRIPT, timeout=START_TIMEOUT)
    stderr = own_lines(result.stderr)
    assert result.returncode == 5, stderr
    assert "non-finite gradient in step 6 of train#0" in stderr
    assert "'W' has 3 NaN and 0 Inf of 3 values" in stderr and "'b' has 1 NaN" in stderr
    # Rank 1's rows held the NaN: every rank names it, whichever reports first.
    assert "(the gradient of rank 1's own rows was already non-finite)" in stderr, stderr
    last = os.path.join(tmp_path, "checkpoint-step00000004.tmpi")
    assert "The last good checkpoint is %s" % last in stderr
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-step00000002.tmpi",
                                            "checkpoint-step00000004.tmpi"]
    assert "Traceback" not in stderr and stderr.count("non-finite gradient") == 1


@pytest.mark.mpi
@pytest.mark.parametrize("overlap", [[], OVERLAP], ids=["fused", "overlap"])
def test_skip_undoes_the_step_as_if_its_batch_was_not_there(overlap):
    result = check(tmpi("wrap", "-n", "2", "--nonfinite", "skip", *overlap, NAN_SCRIPT,
                        timeout=START_TIMEOUT))
    assert "tmpi: skipped step 6 of train#0: non-finite gradient" in result.stderr
    # numpy's SGD over the nine finite batches, computed by the script itself.
    assert_close(final_numbers(result.stdout, "W"), final_numbers(result.stdout, "expected"),
                 1e-12)


def test_nothing_is_checked_by_default():
    # What the script does on NaN is the script's business unless asked.
    result = check(tmpi("wrap", "-n", "1", NAN_SCRIPT, timeout=START_TIMEOUT))
    final_w = [line for line in result.stdout.splitlines() if line.startswith("final W")]
    assert final_w and "nan" in final_w[0], result.stdout  # trained on into NaN, unchecked
    assert "non-finite" not in result.stderr
