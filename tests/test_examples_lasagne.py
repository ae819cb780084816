"""The Lasagne examples train under ``tmpi wrap`` in their small configurations:
the WGAN (two training functions) exactly, writing a real sample grid on rank 0
only; VGG-16 (configuration D, shrunk by its knobs) to well above chance."""
import numpy as np
import pytest

from conftest import EXAMPLES, assert_close, check, final_numbers, tmpi
from test_lasagne import rank_outputs

WGAN = EXAMPLES / "wgan" / "train.py"
VGG = EXAMPLES / "lasagne_vgg" / "train.py"

# Two warm-up generator iterations of 10 critic steps, then 3 critic steps per
# generator step: 44 critic and 12 generator steps on a narrow convolutional pair.
WGAN_ARGS = ["--arch", "dcgan", "--iterations", "12", "--warmup-iterations", "2", "--warmup-critic-iterations",
             "10", "--critic-iterations", "3", "--width", "4", "--batch-size", "32",
             "--print-every", "4", "--seed", "3"]
# Four convolutions (stages 1-2) at 1/16 of the paper's width on 16x16 images.
VGG_ARGS = ["--width", "0.0625", "--stages", "2", "--fc-units", "32", "--image-size", "16",
            "--samples", "1024", "--epochs", "6", "--batch-size", "32", "--lr", "0.05",
            "--seed", "2"]


def wgan_numbers(stdout):
    return final_numbers(stdout, "wasserstein") + final_numbers(stdout, "norms")


def read_png(path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.image
    return matplotlib.image.imread(str(path))


@pytest.mark.mpi
def test_wgan_two_ranks_match_one_rank_and_only_rank_0_writes(tmp_path):
    one = check(tmpi("wrap", "-n", "1", WGAN, *WGAN_ARGS, "--out", tmp_path / "one"))
    two = check(tmpi("wrap", "-n", "2", "--all-ranks-output", WGAN, *WGAN_ARGS,
                     "--out", tmp_path / "two"))
    ranks = rank_outputs(two.stdout)
    # Critic and generator functions are both distributed, each exactly.
    assert_close(wgan_numbers(ranks[0]), wgan_numbers(one.stdout), 1e-8)
    assert_close(wgan_numbers(ranks[1]), wgan_numbers(one.stdout), 1e-8)
    assert "wrote samples.png" in ranks[0] and "wrote" not in ranks[1]

    grid = read_png(tmp_path / "two" / "samples.png")
    # 8x8 digits of 8x8 pixels with 1-pixel borders, each pixel drawn 4x4.
    assert grid.shape[:2] == (4 * 73, 4 * 73)
    cells = grid[4:-4, 4:-4, 0]
    assert cells.std() > 0.05, "the sample grid is blank"
    plot = read_png(tmp_path / "two" / "losses.png")
    assert plot.shape[0] > 100 and plot[..., :3].std() > 0.05
    with np.load(tmp_path / "two" / "generator.npz") as saved:
        assert len(saved.files) == 6   # dense and two convolutions, W and b each


@pytest.mark.mpi
def test_vgg16_small_configuration_trains_on_two_ranks():
    result = check(tmpi("wrap", "-n", "2", VGG, *VGG_ARGS))
    assert "VGG-16 (configuration D): 2 stage(s), width 0.0625" in result.stdout
    assert result.stdout.count("epoch   1/6") == 1
    train_loss, val_loss, val_acc = final_numbers(result.stdout, "train_loss")
    assert np.isfinite(train_loss) and val_acc > 0.5, result.stdout   # 10 classes


def test_vgg16_rejects_knobs_that_cannot_fit_the_image():
    result = tmpi("wrap", VGG, "--stages", "5", "--image-size", "16")
    assert result.returncode != 0
    assert "images must be at least 32x32 pixels, not 16x16" in result.stderr


def test_vgg16_missing_cifar_directory_is_one_clear_line(tmp_path):
    result = tmpi("wrap", VGG, "--cifar10", tmp_path / "nowhere")
    assert result.returncode != 0
    assert "CIFAR-10 directory not found" in result.stderr
    assert "Traceback" not in result.stderr
