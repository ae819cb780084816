"""Transparency on real scripts' patterns: N ranks give the one-process numbers.

Each script in ``tests/scripts/transparency_{random,keras,files}_*.py`` is an
ordinary script that knows nothing of tmpi; it runs under ``tmpi wrap`` on 1
and on 2 (or 3) ranks in float64, and every number it prints at the end must
agree to 1e-8 relative:

* random streams seeded alike on every rank (the deeplearning.net dA's input
  corruption, Keras' noise layers) draw for the whole batch, each rank keeping
  its rows (:mod:`tmpi_adapters.frameworks.random_streams`);
* Keras metrics that are sums over the batch are summed, means averaged, in
  ``fit``, validation, ``evaluate`` and ``train_on_batch``;
* targets held in a ``K.variable`` are split like the inputs;
* files every rank writes to one path are written once and are whole when
  any rank reads them back; files of a rank's own are written by that rank
  (:mod:`tmpi_adapters.frameworks.writes`).

Theano runs without a C compiler (``cxx=``): the data are tiny and compiling
would dominate.
"""
import re

import pytest

from conftest import SCRIPTS, assert_close, check, rank_env, tmpi

DA = SCRIPTS / "transparency_random_dA.py"
KERAS = SCRIPTS / "transparency_keras_models.py"
FILES = SCRIPTS / "transparency_files_checkpoint.py"
RTOL = 1e-8


def env(**extra):
    result = rank_env("float64", KERAS_BACKEND="theano", **extra)
    result["THEANO_FLAGS"] += ",cxx="
    return result


def finals(stdout):
    """``{label: [numbers]}`` of every ``final <label> <numbers>`` line."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("final "):
            words = line.split()[1:]
            numbers = [w for w in words if re.fullmatch(r"[-+]?\d+(\.\d*)?(e[-+]?\d+)?", w)]
            label = " ".join(w for w in words if w not in numbers)
            found[label] = [float(n) for n in numbers]
    assert found, stdout[-3000:]
    return found


def assert_same(got, expected):
    assert sorted(got) == sorted(expected)
    for label in expected:
        assert_close(got[label], expected[label], RTOL)


def wrap(ranks, *args):
    return check(tmpi("wrap", "-n", str(ranks), *[str(a) for a in args], env=env()))


# -- random streams -------------------------------------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("streams,style,ranks", [("mrg", "givens", 3), ("shared", "args", 2)])
def test_corruption_noise_is_the_one_process_noise(streams, style, ranks):
    # 55 rows in batches of 10 (3/3/4 on 3 ranks); the last batch, 5 rows,
    # splits 2/3 and 1/2/2.
    options = ["--streams", streams, "--style", style]
    one = finals(wrap(1, DA, *options).stdout)
    assert_same(finals(wrap(ranks, DA, *options).stdout), one)


def test_draws_shaped_like_the_batch_are_recognised():
    import numpy as np
    import theano
    import theano.tensor as T
    from tmpi_adapters.frameworks.random_streams import _dims, _is_batch_rows
    x = T.matrix("x")
    W = theano.shared(np.ones((3, 4)))
    h = T.tanh(T.dot(x, W))
    assert _is_batch_rows(_dims(x.shape)[0])
    assert _is_batch_rows(_dims(h.shape)[0])                 # a layer's output
    assert _is_batch_rows(_dims((x.shape[0], 1))[0])
    assert _is_batch_rows(_dims(T.stack([x.shape[0], x.shape[1]]))[0])
    assert not _is_batch_rows(_dims(x.shape)[1])            # not axis 0
    assert not _is_batch_rows(_dims(W.shape)[0])            # a parameter's shape
    assert not _is_batch_rows(_dims((20, 4))[0])            # a constant


# -- Keras --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def keras_runs(tmp_path_factory):
    runs = {}
    for n in (1, 2):
        out = tmp_path_factory.mktemp("keras%d" % n)
        result = wrap(n, "--seed", 0, KERAS, "metrics,noise,files", "--out", out)
        runs[n] = (finals(result.stdout), out)
    return runs


def part(numbers, case):
    return {k: v for k, v in numbers.items() if k.startswith(case + " ")}


@pytest.mark.mpi
def test_keras_sum_and_mean_metrics_match_one_process(keras_runs):
    one, two = keras_runs[1][0], keras_runs[2][0]
    assert_same(part(two, "metrics"), part(one, "metrics"))
    # A batch sum is the whole batch's sum, not the mean of the ranks' sums.
    assert one["metrics val_batch_sum"][0] > 5 * one["metrics val_row_mean"][0]


@pytest.mark.mpi
def test_keras_recurrent_model_with_widths_equal_to_the_batch_matches_one_process():
    """LSTM, GRU, SimpleRNN, RepeatVector and TimeDistributed, every width the
    batch size: TimeDistributed's reshape to (-1, 12) is not the batch's.
    Distributed, not gathered: one collective per step."""
    one = finals(wrap(1, "--seed", 0, KERAS, "recurrent").stdout)
    for ranks in (2, 3):
        result = wrap(ranks, "--seed", 0, KERAS, "recurrent")
        assert_same(finals(result.stdout), one)
        # The layers' scans run each rank's rows (nothing gathered): the exchange alone.
        assert "1 collective per step" in result.stdout + result.stderr, result.stderr[-1500:]


@pytest.mark.mpi
def test_keras_residual_block_batch_norms_share_their_collectives():
    """BatchNormalization on a residual block's main path and on its shortcut:
    neither reads the other's statistics, so their moments travel together,
    and so do their backward's sums: 1 + 2 collectives a step, not 1 + 4."""
    one = finals(wrap(1, "--seed", 0, KERAS, "residual").stdout)
    for ranks in (2, 3):
        result = wrap(ranks, "--seed", 0, KERAS, "residual")
        assert_same(finals(result.stdout), one)
        assert "3 collectives per step" in result.stdout + result.stderr, result.stderr[-1500:]


@pytest.mark.mpi
def test_keras_noise_layers_match_one_process(keras_runs):
    assert_same(part(keras_runs[2][0], "noise"), part(keras_runs[1][0], "noise"))


@pytest.mark.mpi
def test_keras_checkpoints_at_one_path_and_in_a_directory_of_each_rank(keras_runs):
    (one, _), (two, out) = keras_runs[1], keras_runs[2]
    assert_same(part(two, "files"), part(one, "files"))
    assert "files read back True" in two    # load_model, load_weights saw whole files
    rows = (out / "log.csv").read_text().splitlines()
    assert rows[0] == "epoch,loss" and len(rows) == 3    # written once, not once per rank
    assert sorted(p.name for p in out.iterdir()) == ["best.h5", "log.csv", "model.h5"]


@pytest.mark.mpi
def test_keras_target_tensors_are_split_like_the_inputs():
    one = finals(wrap(1, KERAS, "targets").stdout)
    assert_same(finals(wrap(2, KERAS, "targets").stdout), one)


# -- files ----------------------------------------------------------------------------------

@pytest.mark.mpi
def test_files_are_written_once_and_read_back_whole(tmp_path):
    # Shared paths written once and read back whole, paths of a rank's own
    # written by that rank, and writes only rank 0 reaches (while the other
    # trains) neither waiting nor failing.
    one = finals(wrap(1, FILES, tmp_path / "one").stdout)
    assert one["files read back True, log lines"] == [3]
    out = tmp_path / "two"
    assert_same(finals(wrap(2, FILES, out).stdout), one)
    assert len((out / "log.txt").read_text().splitlines()) == 3    # appended once per epoch
    assert sorted(p.name for p in out.iterdir()) == [
        "W.npy", "best_model.pkl", "checkpoint.pkl", "log.txt", "master.npz", "master.txt"]


class _Rank:
    """What :class:`~tmpi_adapters.frameworks.writes.FileWrites` needs of a
    session, for two "ranks" in this process."""

    def __init__(self, rank, token="t0k3n", exchanges="parameters"):
        import types
        self.rank, self.size = rank, 2
        self.rule = types.SimpleNamespace(exchanges=exchanges)
        self.options = types.SimpleNamespace(stall_timeout=0.5)
        self.comm = types.SimpleNamespace(
            allgather=lambda item: [(token, item[1]), (None, item[1])])

    def _stalled(self, what, waited, frame):
        return False


def _ranks(monkeypatch, job=None, exchanges="parameters"):
    from tmpi_adapters.frameworks.writes import FileWrites
    from tmpi_adapters.process.jobdir import JOB_DIR_ENV
    if job is None:
        monkeypatch.delenv(JOB_DIR_ENV, raising=False)
    else:
        monkeypatch.setenv(JOB_DIR_ENV, str(job))
    ranks = []
    for rank in (0, 1):
        files = FileWrites(_Rank(rank, exchanges=exchanges))
        files._directory, files._own_directory, files._local_ranks = files._state_directory()
        files.installed = True
        files._active = lambda: True
        ranks.append(files)
    return ranks


def test_the_kth_write_of_a_path_happens_once_without_waiting_for_ranks(tmp_path, monkeypatch):
    zero, one = _ranks(monkeypatch, job=tmp_path / "job")
    shared = tmp_path / "model.pkl"
    # Rank 1 is first: it writes; rank 0 comes later and its bytes go nowhere.
    first = one.open(shared, "w")
    later = zero.open(shared, "w")
    first.write("rank 1")
    later.write("rank 0")
    first.close()
    later.close()      # the write is complete: returns at once
    assert shared.read_text() == "rank 1"
    # The second write of the path is another write: rank 0 is first now.
    with zero.open(shared, "w") as handle:
        handle.write("again")
    with one.open(shared, "w") as handle:
        handle.write("not written")
    assert shared.read_text() == "again"
    # Writers other than open: run once; the writer's outcome is everybody's.
    runs = []
    assert zero.call("save", [tmp_path / "w.npy"], lambda: runs.append(0) or 7) == 7
    assert one.call("save", [tmp_path / "w.npy"], lambda: runs.append(1) or 7) == 7
    assert runs == [0]

    def fails():
        runs.append("x")
        raise FileExistsError("made already")
    for files in (one, zero):
        with pytest.raises(FileExistsError, match="made already"):
            files.call("os.mkdir", [tmp_path / "d"], fails)
    assert runs == [0, "x"]
    with pytest.raises(FileNotFoundError):
        zero.open(tmp_path / "no-such-folder" / "notes.txt", "w")
    with pytest.raises(FileNotFoundError):   # the writer's error, without opening
        one.open(tmp_path / "no-such-folder" / "notes.txt", "w")
    # A path only rank 0 writes (or one of a rank's own) is written each time,
    # by its rank, with nobody to wait for.
    for epoch in range(3):
        with zero.open(tmp_path / "master.txt", "a") as handle:
            handle.write("epoch %d\n" % epoch)
        with one.open(tmp_path / "rank1.txt", "w") as handle:
            handle.write("epoch %d\n" % epoch)
    assert (tmp_path / "master.txt").read_text().splitlines() == ["epoch 0", "epoch 1",
                                                                  "epoch 2"]
    assert (tmp_path / "rank1.txt").read_text() == "epoch 2\n"


def test_a_rank_that_did_not_write_waits_for_the_writer_with_a_deadline(tmp_path, monkeypatch):
    from tmpi_adapters.errors import StallError
    zero, one = _ranks(monkeypatch, job=tmp_path / "job")
    path = tmp_path / "log.txt"
    held = zero.open(path, "w")          # a log open all along on the writer
    later = one.open(path, "w")          # returns at once: training goes on
    later.write("epoch 0\n")
    with pytest.raises(StallError, match=r"rank 0 to finish open\('%s', 'w'\)" % path):
        later.close()                    # the writer never closes it
    held.close()


def test_under_a_lockstep_rule_rank_0_has_a_moments_precedence(tmp_path, monkeypatch):
    import threading
    import time
    from tmpi_adapters.frameworks import writes
    zero, one = _ranks(monkeypatch, job=tmp_path / "job", exchanges="gradients")
    runs = []
    # Rank 1 is first, rank 0 comes a little later: rank 0 writes.
    later = threading.Timer(0.02, lambda: zero.call("save", [tmp_path / "a"],
                                                     lambda: runs.append(0) or "zero"))
    later.start()
    assert one.call("save", [tmp_path / "a"], lambda: runs.append(1) or "one") == "zero"
    later.join()
    assert runs == [0]
    # Rank 0 never comes: rank 1 writes after the moment, and at once from
    # then on (a path of its own).
    start = time.perf_counter()
    one.call("save", [tmp_path / "b"], lambda: runs.append(1))
    assert time.perf_counter() - start >= writes.PRECEDENCE_SECONDS
    start = time.perf_counter()
    for _ in range(3):
        one.call("save", [tmp_path / "b"], lambda: runs.append(1))
    assert time.perf_counter() - start < writes.PRECEDENCE_SECONDS
    assert runs == [0, 1, 1, 1, 1]


def test_tmpis_own_state_directory_goes_with_the_last_rank(tmp_path, monkeypatch):
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    zero, one = _ranks(monkeypatch)
    assert zero._directory == one._directory == str(tmp_path / "tmpi-writes-t0k3n")
    with zero.open(tmp_path / "out.txt", "w") as handle:
        handle.write("x")
    zero.installed = False
    assert (tmp_path / "tmpi-writes-t0k3n").is_dir()     # rank 1 is still running
    one.installed = False
    assert not (tmp_path / "tmpi-writes-t0k3n").exists()
    job = tmp_path / "job"
    zero, one = _ranks(monkeypatch, job=job)
    with zero.open(tmp_path / "out.txt", "w") as handle:
        handle.write("x")
    zero.installed = one.installed = False
    assert (job / "writes").is_dir()     # the launcher removes the job directory


def test_only_write_modes_of_paths_are_seen():
    from tmpi_adapters.frameworks.writes import _write_mode, is_path
    assert all(_write_mode(m) for m in ("w", "wb", "a", "ab", "x", "xb", "wt", "bw"))
    assert not any(_write_mode(m) for m in ("r", "rb", "r+", "w+", "a+", "wa", "rw", 3))
    assert is_path("a.txt") and is_path(b"a") and not is_path(3)
