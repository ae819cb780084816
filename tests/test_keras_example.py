"""examples/keras_wresnet trains for real on two ranks and fails clearly without data."""
import pytest

from conftest import EXAMPLES, check, final_numbers, rank_env, tmpi

TRAIN = EXAMPLES / "keras_wresnet" / "train.py"
SMALL = ["--depth", "10", "--width", "1", "--dataset", "synthetic", "--train-size", "384",
         "--val-size", "128", "--image-size", "16", "--epochs", "3", "--batch-size", "64",
         "--no-augment"]


@pytest.mark.mpi
def test_small_wide_resnet_trains_on_two_ranks():
    result = check(tmpi("wrap", "-n", "2", TRAIN, *SMALL,
                        env=rank_env("float32", KERAS_BACKEND="theano")))
    assert "WRN-10-1: 78330 parameters" in result.stdout
    assert result.stdout.count("Epoch 1/3") == 1
    val_loss, val_accuracy = final_numbers(result.stdout, "val_loss")
    assert val_accuracy > 0.5, result.stdout[-3000:]   # ten classes: chance is 0.1


def test_missing_cifar_directory_is_a_clear_error(tmp_path):
    result = tmpi("wrap", "-n", "1", TRAIN, "--data", tmp_path / "nowhere",
                  env=rank_env("float32", KERAS_BACKEND="theano"))
    assert result.returncode == 2
    assert "CIFAR-10 directory not found" in result.stderr
    assert "cifar-10-python.tar.gz" in result.stderr
    assert "Traceback" not in result.stderr
