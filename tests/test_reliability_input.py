"""Bad input: each case one clear paragraph and a non-zero exit, never a deep traceback.

(Corrupt and incompatible checkpoints are in ``test_reliability_checkpoint.py``.)
"""
import pytest

from tmpi_adapters.errors import TmpiError

from conftest import EXAMPLES, SCRIPTS, rank_env, tmpi
from test_reliability import START_TIMEOUT, own_lines

MLP = EXAMPLES / "theano_mlp" / "train.py"


def fails_with(result, *texts):
    """Assert a clear failure: non-zero, every text in stderr, no traceback."""
    stderr = own_lines(result.stderr)
    assert result.returncode != 0, stderr
    for text in texts:
        assert text in stderr, stderr
    assert "Traceback" not in stderr, stderr
    return stderr


def refused_here(capsys, *argv, texts):
    """``tmpi ARGV`` in this process (checked before any rank starts): exit
    status 2, every text in stderr, no traceback."""
    from tmpi_adapters.launch import cli
    try:
        code = cli.main([str(a) for a in argv])
    except SystemExit as exit_:  # argparse's own errors
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    for text in texts:
        assert text in err, err
    assert "Traceback" not in err, err
    return err


@pytest.mark.parametrize("args,texts", [
    (["--framework", "caffe"], ["unknown framework 'caffe'. Installed frameworks:", "theano"]),
    (["--rule", "hogwild"], ["unknown rule 'hogwild'. Installed rules: ", "bsp",
                             "tmpi plugins"]),
    (["--exchanger", "smoke"], ["unknown exchanger 'smoke'. Installed exchangers:", "mpi"]),
])
def test_unknown_framework_rule_or_exchanger_lists_the_installed_ones(capsys, args, texts):
    refused_here(capsys, "wrap", *args, MLP, texts=texts)


def test_rule_of_a_plugin_not_installed_names_the_distribution():
    # Not installed: no entry point provides it, tmpi's table names the wheel.
    from tmpi_adapters.pluginmanager import lookup, make_plugin_manager
    with pytest.raises(TmpiError, match="unknown rule 'easgd'. Installed rules: bsp. 'easgd' "
                                        "is provided by a separate distribution: pip install "
                                        "tmpi-plugin-easgd"):
        lookup("rules", "easgd", make_plugin_manager(autoload=False))


def test_rule_of_a_plugin_installed_but_not_loaded_says_why():
    result = tmpi("wrap", "--rule", "easgd", MLP,
                  env=rank_env(TMPI_DISABLE_PLUGIN_AUTOLOAD="1"))
    fails_with(result, "unknown rule 'easgd'", "'easgd' is provided by tmpi-plugin-easgd",
               "which is installed but was not loaded: TMPI_DISABLE_PLUGIN_AUTOLOAD is set")


def test_missing_script(tmp_path):
    fails_with(tmpi("wrap", "-n", "2", tmp_path / "train.py"),
               "script %r not found" % str(tmp_path / "train.py"))


def test_directory_given_as_script(tmp_path):
    fails_with(tmpi("wrap", tmp_path), "is a directory; pass the training script")


def test_script_that_is_not_python(tmp_path):
    binary = tmp_path / "model.py"
    binary.write_bytes(b"import theano\n\x00\x01\x02 weights")
    fails_with(tmpi("wrap", "--framework", "theano", binary), "is not valid Python")
    broken = tmp_path / "broken.py"
    broken.write_text("import theano\nfor epoch in range(3)\n    pass\n")
    fails_with(tmpi("wrap", broken), "is not valid Python at line 2")


def warns(result, *texts):
    """Assert a warned success: exit 0, every text in one ``tmpi: warning:`` line."""
    stderr = own_lines(result.stderr)
    assert result.returncode == 0, stderr
    warnings = [line for line in stderr.splitlines() if line.startswith("tmpi: warning:")]
    assert len(warnings) == 1, stderr
    for text in texts:
        assert text in warnings[0], stderr
    assert "Traceback" not in stderr, stderr
    return stderr


def test_script_without_trainable_parameters_is_warned_of():
    # An evaluation, not an error: the script's own status stands.
    result = tmpi("wrap", SCRIPTS / "reliability_no_params.py", timeout=START_TIMEOUT)
    warns(result, "compiled 1 Theano function(s) but no training function",
          "with respect to shared variables (the trainable parameters)")


def test_script_without_training_function_is_warned_of():
    warns(tmpi("wrap", SCRIPTS / "no_training.py", timeout=START_TIMEOUT),
          "but no training function")


@pytest.mark.mpi
def test_parameter_signature_mismatch_across_ranks():
    result = tmpi("wrap", "-n", "2", SCRIPTS / "mismatch.py", timeout=START_TIMEOUT)
    stderr = fails_with(result, "rank 1's model differs from rank 0's at param #0",
                        "'W_hidden' shape (3, 5)", "shape (3, 6)")
    assert stderr.count("differs from rank 0's") == 1


@pytest.mark.parametrize("args,text", [
    (["--rule-option", "period=0"], "rule 'bsp' option period=0 must be > 0"),
    (["--rule-option", "period=-2"], "rule 'bsp' option period=-2 must be > 0"),
    (["--rule-option", "period=two"], "rule 'bsp' option period='two' is not a valid int"),
    (["--rule-option", "mode=sync"], "option mode='sync' must be one of grad, avg"),
    (["--rule-option", "tau"], "must look like name=value (e.g. --rule-option tau=4)"),
    (["--stall-timeout", "-1"], "--stall-timeout must be a positive, finite number of seconds"),
    (["--stall-timeout", "soon"],
     "--stall-timeout must be a positive, finite number of seconds, not 'soon'"),
    (["-n", "0"], "-n must be a whole number >= 1, not '0'"),
    (["-n", "-1"], "-n must be a whole number >= 1, not '-1'"),
    (["-n", "two"], "-n must be a whole number >= 1, not 'two'"),
    (["--seed", "x"], "--seed must be a whole number, not 'x'"),
    (["--bucket-bytes", "4MiB"], "--bucket-bytes must be a whole number of bytes or none"),
    (["--threads-per-rank", "0"], "--threads-per-rank must be a whole number >= 1, not '0'"),
    (["--threads-per-rank", "-2"], "--threads-per-rank must be a whole number >= 1"),
    (["--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint-dir"),
    (["--checkpoint-keep", "2"], "--checkpoint-keep needs --checkpoint-dir"),
    (["--resume", "latest"], "--resume latest needs --checkpoint-dir"),
    (["--warmup-steps", "-5"], "--warmup-steps must be >= 0"),
    (["--bucket-bytes", "0"], "--bucket-bytes must be positive"),
    (["--precision", "fp8"], "--precision must be one of native, fp32, fp16, bf16, not 'fp8'"),
    (["--checkpoint-every", "0"], "--checkpoint-every must be positive"),
    (["--checkpoint-every", "garbage"], "--checkpoint-every must be a number of steps, epochs"),
    (["--checkpoint-every", "5weeks"], "--checkpoint-every must be a number of steps, epochs"),
    (["--checkpoint-every", "0.5"], "--checkpoint-every 0.5: a number of steps must be whole"),
    (["--checkpoint-every", "2.5epochs"], "a number of epochs must be whole"),
    (["--checkpoint-keep", "0"], "--checkpoint-keep must be a whole number >= 1, not '0'"),
    (["--on-stall", "ignore"], "--on-stall must be one of report, abort, not 'ignore'"),
    (["--nonfinite", "ignore"], "--nonfinite must be one of off, stop, skip, not 'ignore'"),
])
def test_invalid_option_values_are_refused_before_launching(capsys, args, text):
    # One line, tmpi's own, for every bad value: argparse's usage lines are
    # for --help only.
    err = refused_here(capsys, "wrap", "-n", "2", *args, MLP, texts=[text])
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tmpi: error: "), err


def test_more_ranks_than_the_machine_holds_are_refused_before_starting(capsys):
    # 500 ranks need ~75 GB before any model: refused at once, naming the way out.
    refused_here(capsys, "wrap", "-n", "500", MLP,
                 texts=["-n 500 needs at least", "GB of memory here", "--oversubscribe"])


def test_oversubscription_is_checked_against_cores_and_memory():
    from tmpi_adapters.errors import TmpiError
    from tmpi_adapters.launch.launcher import check_capacity
    with pytest.raises(TmpiError, match="more than 16 ranks a core"):
        check_capacity(40, cores=2, memory=10 ** 12)
    with pytest.raises(TmpiError, match="needs at least 1.6 GB"):
        check_capacity(10, cores=64, memory=10 ** 9)
    check_capacity(40, oversubscribe=True, cores=2, memory=10 ** 9)  # forced: starts
    check_capacity(4, cores=4, memory=10 ** 12)


def test_missing_data_directory(tmp_path):
    result = tmpi("wrap", SCRIPTS / "reliability_data.py", "mnist", tmp_path / "mnist",
                  timeout=START_TIMEOUT)
    fails_with(result, "MNIST not found at %r" % str(tmp_path / "mnist"),
               "tmpi never downloads data")
    assert result.returncode == 2  # tmpi's own loader: bad input


def test_missing_data_file_read_by_the_script(tmp_path):
    result = tmpi("wrap", SCRIPTS / "reliability_data.py", "npz", tmp_path / "digits.npz",
                  timeout=START_TIMEOUT)
    stderr = own_lines(result.stderr)
    # The script's own exception: status 1, as under python.
    assert result.returncode == 1
    assert "the script could not use %r: No such file or directory" \
        % str(tmp_path / "digits.npz") in stderr, stderr
    # The user's own line is shown; numpy's insides are folded away.
    assert 'reliability_data.py", line 13' in stderr and "frame(s) inside libraries" in stderr
    assert "numpy/lib" not in stderr


def test_mpiexec_that_does_not_exist(tmp_path):
    fails_with(tmpi("wrap", "-n", "2", "--mpiexec", tmp_path / "mpiexec", MLP),
               "--mpiexec %r is not an executable file" % str(tmp_path / "mpiexec"))


def test_mpiexec_that_cannot_start_ranks():
    result = tmpi("wrap", "-n", "2", "--mpiexec", "false", MLP)
    fails_with(result, "false ended with status 1 before any rank started",
               "Check --mpiexec and --mpiexec-arg")
    assert result.returncode == 2  # bad input: the launcher's own status is none of tmpi's


#: Batches of 1, 2 and 3 rows for 2 and 3 ranks: fewer rows than ranks.
SHORT_BATCHES = """\
import numpy as np
import theano
import theano.tensor as T
rng = np.random.RandomState(3)
x, y = T.dmatrix("x"), T.dvector("y")
W = theano.shared(rng.randn(4), name="W")
loss = T.sqr(T.dot(x, W) - y).mean()
train = theano.function([x, y], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
for rows in [1, 2, 3, 1, 2, 3, 1]:
    data = rng.randn(rows, 4)
    print("loss %.17g" % train(data, data.sum(axis=1)))
print("final W %s" % " ".join("%.17g" % w for w in W.get_value()))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("ranks", ["2", "3"])
def test_more_ranks_than_rows_in_a_batch_trains_as_one_process(tmp_path, ranks):
    script = tmp_path / "short_batches.py"
    script.write_text(SHORT_BATCHES)
    one = run_ok(tmpi("wrap", script, timeout=START_TIMEOUT))
    many = run_ok(tmpi("wrap", "-n", ranks, script, timeout=START_TIMEOUT))
    assert many.count("loss ") == one.count("loss ") == 7
    got = [float(w) for line in many.splitlines() if line.startswith(("final W", "loss"))
           for w in line.split()[-4 if line.startswith("final") else -1:]]
    expected = [float(w) for line in one.splitlines() if line.startswith(("final W", "loss"))
                for w in line.split()[-4 if line.startswith("final") else -1:]]
    assert got == pytest.approx(expected, rel=1e-12)


def run_ok(result):
    assert result.returncode == 0, result.stderr[-3000:]
    # (A loaded machine may have the ranks wait for each other's time slices,
    # which tmpi warns of: not about the input.)
    lines = [line for line in result.stderr.splitlines()
             if "warning" in line and "time slice" not in line or "error" in line]
    assert not lines, result.stderr
    return result.stdout
