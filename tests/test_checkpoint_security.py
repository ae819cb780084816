"""A checkpoint is data, never code: crafted files are refused unrun.

Every crafted file here is a real checkpoint's header over a pickle whose
``__reduce__`` would run something, exactly as an attacker would write one
in the first format (whose state was a pickle); none of them may run.
"""
import json
import os
import pickle
import stat
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import EXAMPLES, assert_close, check, final_numbers, tmpi
from test_reliability import checkpoints, own_lines

from tmpi_adapters import datasets, pickles
from tmpi_adapters.reliability.checkpoint import fileformat

MLP = EXAMPLES / "theano_mlp" / "train.py"
ARGS = ["--batch-size", "50", "--seed", "5", "--epochs", "1"]


class Crafted:
    """Pickles as a call of ``function(*arguments)``."""

    def __init__(self, function, *arguments):
        self.call = (function, arguments)

    def __reduce__(self):
        return self.call


def first_format(state, header):
    """A checkpoint file's bytes in the first format: the header over a pickle."""
    payload = pickle.dumps(state, protocol=4)
    header = dict(header, format=1, payload=len(payload))
    import hashlib
    header["sha256"] = hashlib.sha256(payload).hexdigest()
    return fileformat.MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A 1-epoch run (30 steps) with a checkpoint every 10 steps, in a
    directory tmpi creates, and the run's final numbers."""
    base = tmp_path_factory.mktemp("secure")
    directory = base / "made" / "by" / "tmpi"
    result = check(tmpi("wrap", "-n", "1", "--checkpoint-dir", directory,
                        "--checkpoint-every", "10", MLP, *ARGS))
    return directory, final_numbers(result.stdout, "val_loss")


def test_the_directory_tmpi_creates_is_private_and_holds_no_pickle(written):
    directory, _ = written
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    data = (directory / "checkpoint-step00000010.tmpi").read_bytes()
    header = fileformat.verify(data, "x")
    assert header["format"] == 2
    payload = data[len(data) - header["payload"]:]
    assert payload.startswith(b"PK")  # an .npz archive
    with np.load(__import__("io").BytesIO(payload), allow_pickle=False) as archive:
        assert "tree" in archive.files


CRAFTED = {
    "os.system": lambda marker: Crafted(os.system, "touch %s" % marker),
    "subprocess.Popen": lambda marker: Crafted(subprocess.Popen, ["touch", str(marker)]),
    "builtins.eval": lambda marker: Crafted(eval, "open(%r, 'w')" % str(marker)),
}


@pytest.mark.parametrize("how", sorted(CRAFTED))
def test_a_crafted_first_format_file_is_refused_unrun(written, tmp_path, how):
    directory, _ = written
    genuine = (directory / "checkpoint-step00000010.tmpi").read_bytes()
    header = fileformat.verify(genuine, "x")
    marker = tmp_path / "ran"
    state = {"tmpi": "1", "models": [], "point": {"calls": 1}, "x": CRAFTED[how](marker)}
    crafted = tmp_path / "ck" / "checkpoint-step00000099.tmpi"
    crafted.parent.mkdir()
    crafted.write_bytes(first_format(state, header))
    named = tmpi("wrap", "-n", "1", "--resume", crafted, MLP, *ARGS)
    found = tmpi("wrap", "-n", "1", "--checkpoint-dir", crafted.parent, "--resume", "auto",
                 MLP, *ARGS)
    for result in (named, found):
        stderr = own_lines(result.stderr)
        assert result.returncode == 6, stderr
        assert not marker.exists(), "the crafted checkpoint ran its command"
        last = stderr.strip().splitlines()[-1]
        assert last.startswith("tmpi: error: checkpoint %s is refused" % crafted), stderr
        assert "which is not data" in last and "Traceback" not in stderr
    spelt = {"os.system": "posix.system", "subprocess.Popen": "subprocess.Popen",
             "builtins.eval": "builtins.eval"}[how]
    assert "names %s" % spelt in stderr


def test_a_class_of_the_scripts_own_module_is_refused(tmp_path):
    # The pickle names a class of the module it was written from; under
    # --resume that module is the script, and building it would run its code.
    script = tmp_path / "own.py"
    script.write_text(textwrap.dedent("""
        import pickle, sys
        class Model:
            def __setstate__(self, state):
                open(sys.argv[1], "w").close()
        sys.stdout.buffer.write(pickle.dumps({"x": Model()}, protocol=4))
    """))
    data = subprocess.run([sys.executable, str(script), os.devnull], check=True,
                          capture_output=True).stdout
    with pytest.raises(pickles.DisallowedObject) as refused:
        pickles.loads(data)
    assert refused.value.name == "__main__.Model"


def test_a_first_format_checkpoint_still_resumes_exactly(written, tmp_path):
    # What earlier versions wrote (the same state, pickled) loads through the
    # allowlist and resumes to the uninterrupted numbers.
    directory, finals = written
    data = (directory / "checkpoint-step00000010.tmpi").read_bytes()
    header, state = fileformat.decode(data, "x")
    old = tmp_path / "old" / "checkpoint-step00000010.tmpi"
    old.parent.mkdir()
    old.write_bytes(first_format(state, header))
    os.chmod(old, 0o666)   # writable by others: warned of, once
    resumed = check(tmpi("wrap", "-n", "1", "--resume", old, MLP, *ARGS))
    assert "tmpi: resuming from %s" % old in resumed.stdout
    warned = [line for line in (resumed.stdout + resumed.stderr).splitlines()
              if "writable by other users" in line]
    assert len(warned) == 1 and "the file is writable" in warned[0], warned
    assert_close(final_numbers(resumed.stdout, "val_loss"), finals, 1e-12)


PLUGIN_SCRIPT = """
import collections, sys
import numpy as np, theano, theano.tensor as T
from tmpi_adapters import hookimpl
from tmpi_adapters.core.session import current_session

class Tracker:
    @hookimpl
    def tmpi_checkpoint_state(self, session):
        return {"tracker.window": collections.deque([1, 2])}

current_session().pm.register(Tracker(), name="tracker")
w = theano.shared(np.zeros(3), name="w")
x = T.matrix("x")
loss = ((x.dot(w) - 1) ** 2).mean()
train = theano.function([x], loss, updates=[(w, w - 0.1 * T.grad(loss, w))])
for step in range(6):
    train(np.ones((4, 3)))
print("trained")
"""


def test_a_plugin_state_that_is_not_data_stops_the_first_checkpoint(tmp_path):
    script = tmp_path / "plugin_state.py"
    script.write_text(PLUGIN_SCRIPT)
    result = tmpi("wrap", "-n", "1", "--checkpoint-dir", tmp_path / "ck",
                  "--checkpoint-every", "2", script)
    stderr = own_lines(result.stderr)
    assert result.returncode == 6, stderr
    assert "trained" not in result.stdout
    last = stderr.strip().splitlines()[-1]
    assert "plugin tracker's tmpi_checkpoint_state returned a collections.deque at " \
           "['tracker.window']" in last, stderr
    assert checkpoints(tmp_path / "ck") == []


def test_the_cifar_loader_reads_data_and_refuses_code(tmp_path):
    rows = np.arange(2 * 3072, dtype=np.uint8).reshape(2, 3072)
    batch = {b"data": rows, b"labels": [3, 7], b"batch_label": b"x"}
    for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch"]:
        (tmp_path / name).write_bytes(pickle.dumps(batch, protocol=2))
    (x_train, y_train), _ = datasets.cifar10(str(tmp_path), dtype="float64")
    assert x_train.shape == (10, 3, 32, 32) and list(y_train[:2]) == [3, 7]
    marker = tmp_path / "ran"
    (tmp_path / "test_batch").write_bytes(
        pickle.dumps({b"data": Crafted(os.system, "touch %s" % marker)}, protocol=2))
    with pytest.raises(datasets.DataError, match="posix.system"):
        datasets.cifar10(str(tmp_path))
    assert not marker.exists()
