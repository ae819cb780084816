"""Generator-fed Keras on N ranks: rank 0 alone draws each batch, and the run is one that
one process could have made.

The generators race (augmentation drawn from numpy's global generator in 4 worker
threads, or in 4 worker processes), so no two runs draw the same batches: each N-rank
run records every batch Keras handed ``train_on_batch``, ``test_on_batch`` and
``predict_on_batch``, and one process fed exactly those batches must end with the same
numbers, to 1e-10 in float64.  Every run is real: MPICH ranks, Keras 2.3.1 on Theano.
"""
import os
import pickle
import re
import sys

import numpy as np
import pytest

from conftest import (EXAMPLES, SCRIPTS, TMPI, assert_close, check, final_numbers, rank_env,
                      run, tmpi)

GENERATORS = SCRIPTS / "keras_generators.py"
HARNESS = SCRIPTS / "keras_harness.py"
REPLAYED = ("threads", "processes", "inline")
WRESNET = ["--depth", "10", "--width", "1", "--dataset", "synthetic", "--train-size", "96",
           "--val-size", "32", "--image-size", "16", "--epochs", "2", "--batch-size", "32"]
#: Where Keras 2.3.1's own examples are (a directory holding cifar10_cnn.py and
#: cifar10_resnet.py from its source tree); they are not part of the Keras package.
KERAS_EXAMPLES = os.environ.get("TMPI_KERAS_EXAMPLES")


def keras_env(**extra):
    return rank_env("float64", KERAS_BACKEND="theano", **extra)


def rank_numbers(stdout, rank, key):
    """The numbers of rank ``rank``'s last ``final KEY`` line (``--all-ranks-output``)."""
    found = re.findall(r"\[rank %d\] final %s ([^\[\n]*)" % (rank, re.escape(key)), stdout)
    assert found, "rank %d printed no 'final %s':\n%s" % (rank, key, stdout[-3000:])
    return [float(v) for v in found[-1].split() if re.match(r"[-+]?\d", v)]


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", [2, 3])
def test_racy_generators_give_one_process_run(tmp_path, ranks):
    record = tmp_path / "batches.pkl"
    fed = check(tmpi("wrap", "-n", str(ranks), "--all-ranks-output", "--stall-timeout", "2",
                     GENERATORS,
                     "--record", record, "--cases", ",".join(REPLAYED + ("raising",)),
                     env=keras_env()))
    one = check(run([sys.executable, GENERATORS, "--replay", record], env=keras_env()))
    for case in REPLAYED:
        for part in ("history", "evaluate", "predict", "weights"):
            assert_close(rank_numbers(fed.stdout, 0, "%s %s" % (case, part)),
                         final_numbers(one.stdout, "%s %s" % (case, part)), 1e-10)
    batches = pickle.load(open(record, "rb"))
    kinds = [b[0] for b in batches["threads"]]
    assert kinds.count("train") == 2 * 5 and kinds.count("test") == 2 * 3 + 3
    assert kinds.count("predict") == 3
    # Rank 0 alone ran the generators, its enqueuers' worker threads and processes.
    assert rank_numbers(fed.stdout, 0, "drawn")[0] > 0
    threads, processes = rank_numbers(fed.stdout, 0, "workers")
    assert threads >= 4 and processes >= 4
    for rank in range(1, ranks):
        assert rank_numbers(fed.stdout, rank, "drawn") == [0]
        assert rank_numbers(fed.stdout, rank, "workers") == [0, 0]
    # Ranks waiting for a batch rank 0's generator is slow to draw are reported, rank 0
    # named at its generator's line; the failure then raises on every rank, and all go on
    # alike.
    waiting = "rank 1" if ranks == 2 else "ranks 1-2"
    assert re.search(r"tmpi: stall: %s waited \d+ s in batch 4 of fit_generator's batches "
                     r"\(rank 0 draws it and hands it to every rank\); rank 0 has not reached "
                     r"it\.\n(?:\[rank \d\] )?  rank 0: .* at keras_generators\.py:\d+ in failing: "
                     r"time\.sleep\(SLOW\)" % waiting, fed.stderr), fed.stderr[-3000:]
    for rank in range(ranks):
        assert "[rank %d] final raising caught ValueError: no fourth batch" % rank in fed.stdout
        assert rank_numbers(fed.stdout, rank, "raising weights") == \
            rank_numbers(fed.stdout, 0, "raising weights")
    # With 4 workers the next batch is mostly ready: its broadcast runs during the step.
    handed = re.search(r"batches drawn on rank 0 and handed to every rank: (\d+) \(.*; (\d+) "
                       r"sent during the step before\)", fed.stdout)
    assert handed and 0 < int(handed.group(2)) < int(handed.group(1)), fed.stdout[-2000:]


@pytest.mark.mpi
def test_wide_resnet_with_augmentation_is_one_process_run(tmp_path):
    record = tmp_path / "batches.pkl"
    train = EXAMPLES / "keras_wresnet" / "train.py"
    fed = check(tmpi("wrap", "-n", "3", "--framework", "keras", HARNESS, "--floatx", "float64",
                     "--record", record, train, *WRESNET, env=keras_env()))
    one = check(run([sys.executable, HARNESS, "--floatx", "float64", "--replay", record, train,
                     *WRESNET], env=keras_env()))
    assert len(pickle.load(open(record, "rb"))) == 2 * 3
    for part in ("history", "weights"):
        assert_close(final_numbers(fed.stdout, part), final_numbers(one.stdout, part), 1e-10)
    assert "batches drawn on rank 0 and handed to every rank: 6 (" in fed.stdout


def cifar_directory(keras_home, train_per_file=4, test_images=8):
    """A Keras data directory (``KERAS_HOME``) of CIFAR-10's shape: five training
    files of ``train_per_file`` images and a test file, as Keras' loader reads them."""
    folder = keras_home / "datasets" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    generator = np.random.RandomState(0)
    names = ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]
    for name in names:
        rows = test_images if name == "test_batch" else train_per_file
        images = generator.randint(0, 256, size=(rows, 3 * 32 * 32)).astype(np.uint8)
        labels = [int(v) for v in generator.randint(0, 10, size=rows)]
        with open(folder / name, "wb") as handle:
            pickle.dump({b"data": images, b"labels": labels}, handle, protocol=2)
    return folder


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.skipif(not KERAS_EXAMPLES, reason="Keras 2.3.1's examples/ are not installed with "
                    "Keras: set TMPI_KERAS_EXAMPLES to a directory holding its cifar10_cnn.py "
                    "and cifar10_resnet.py")
@pytest.mark.parametrize("example", ["cifar10_cnn.py", "cifar10_resnet.py"])
def test_keras_cifar10_examples_run_to_the_end(tmp_path, example):
    # Unmodified (augmentation on, workers=4), on a data directory of 20 training and 8
    # test images (the harness's load_data takes the files' images as they are).
    script = os.path.join(KERAS_EXAMPLES, example)
    cifar_directory(tmp_path / "keras")
    env = rank_env("float32", KERAS_BACKEND="theano", KERAS_HOME=tmp_path / "keras")
    for ranks in (1, 2, 3):
        result = run([TMPI, "wrap", "-n", str(ranks), "--framework", "keras", HARNESS,
                      "--small-cifar", script], env=env, cwd=tmp_path, timeout=3600)
        check(result)
        assert "Test accuracy:" in result.stdout
        if ranks > 1:
            assert "batches drawn on rank 0 and handed to every rank" in result.stdout
