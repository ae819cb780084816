"""The tmpi command: plugins listing, clear errors, rank-0 output, the decorator."""
import importlib.util
import io
import json
import re
import subprocess
import sys

import pytest

from conftest import EXAMPLES, SCRIPTS, assert_close, check, final_numbers, mpiexec, rank_env
from conftest import MPIEXEC, RUN_TIMEOUT, TMPI, run, tmpi

MLP = EXAMPLES / "theano_mlp" / "train.py"


def tmpi_here(capsys, *argv):
    """``tmpi ARGV`` in this process: ``(exit status, stdout, stderr)``."""
    from tmpi_adapters.launch import cli
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_plugins_lists_builtins_with_versions_and_hooks(capsys):
    code, out, _ = tmpi_here(capsys, "plugins")
    assert code == 0 and "rule:bsp" in out and "exchanger:mpi" in out
    code, out, _ = tmpi_here(capsys, "plugins", "--json")
    by_name = {row["name"]: row for row in json.loads(out)}
    bsp = by_name["tmpi_adapters.rules.bsp"]
    assert bsp["version"] and bsp["hooks"] == ["tmpi_rules"]
    assert "tmpi_exchangers" in by_name["tmpi_adapters.exchangers.mpi"]["hooks"]


def installed_plugin(site, name, source):
    """A distribution ``tmpi-plugin-<name>`` 1.0 in directory ``site`` (put it on
    ``PYTHONPATH``): its module and its ``tmpi`` entry point, as pip leaves them."""
    site.mkdir(exist_ok=True)
    (site / ("tmpi_plugin_%s.py" % name)).write_text(source)
    info = site / ("tmpi_plugin_%s-1.0.dist-info" % name)
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tmpi-plugin-%s\n"
                                   "Version: 1.0\n" % name)
    (info / "entry_points.txt").write_text("[tmpi]\n%s = tmpi_plugin_%s\n" % (name, name))


@pytest.mark.parametrize("source, problem", [
    ("from tmpi_adapters import hookimpl\n\n@hookimpl\ndef tmpi_sesion_start(session):\n"
     "    pass\n", "PluginValidationError: unknown hook 'tmpi_sesion_start'"),
    ("import a_module_nobody_installed\n",
     "ModuleNotFoundError: No module named 'a_module_nobody_installed'"),
])
def test_a_broken_plugin_is_one_line_and_tmpi_goes_on(tmp_path, source, problem):
    installed_plugin(tmp_path / "site", "broken", source)
    env = rank_env(PYTHONPATH=str(tmp_path / "site"))
    listing = tmpi("plugins", env=env)
    assert listing.returncode == 0 and "rule:bsp" in listing.stdout, listing.stderr
    lines = listing.stderr.strip().splitlines()
    assert len(lines) == 1, listing.stderr
    assert lines[0].startswith("tmpi: warning: the installed plugin 'broken' "
                               "(tmpi-plugin-broken 1.0) was not loaded: " + problem), lines
    assert "TMPI_DISABLE_PLUGIN_AUTOLOAD=1 starts tmpi without" in lines[0]
    result = tmpi("wrap", MLP, "--epochs", "1", env=env)
    assert result.returncode == 0 and "epoch  1/1" in result.stdout, result.stderr
    assert "Traceback" not in result.stderr


def test_tmpi_plugins_lists_each_rules_options_with_defaults(capsys):
    code, out, _ = tmpi_here(capsys, "plugins")
    assert code == 0
    assert "--rule bsp options (--rule-option NAME=VALUE):" in out
    assert re.search(r"\n +period +int, default 1: avg mode", out), out
    assert re.search(r"\n +alpha +float, default f\(N\): elastic force", out), out


def test_rule_knobs_refuse_what_they_would_ignore_or_misread():
    from tmpi_adapters.errors import ConfigError
    from tmpi_adapters.options import Knob, positive, resolve_knobs
    switch = {"on": Knob(bool, False, "a switch")}
    assert resolve_knobs("r", switch, {"on": "false"}, 2) == {"on": False}  # not bool("false")
    assert resolve_knobs("r", switch, {"on": "1"}, 2) == {"on": True}
    with pytest.raises(ConfigError, match="option on='maybe' is not a valid bool"):
        resolve_knobs("r", switch, {"on": "maybe"}, 2)
    with pytest.raises(ConfigError, match="the default t=0 of rule 'r' must be > 0 .* a fault "
                                          "of the plugin that provides the rule"):
        resolve_knobs("r", {"t": Knob(int, 0, "period", positive)}, {}, 2)
    from tmpi_adapters.rules.bsp import BSP
    with pytest.raises(ConfigError, match="option period=3 does nothing unless mode=avg"):
        resolve_knobs("bsp", BSP.knobs, {"period": "3"}, 2)
    assert resolve_knobs("bsp", BSP.knobs, {"period": "3", "mode": "avg"}, 2)["period"] == 3


def test_autoload_can_be_disabled_and_hooks_traced():
    # The environment variables are read when the manager is built: a new process.
    env = rank_env(TMPI_DISABLE_PLUGIN_AUTOLOAD="1", TMPI_TRACE_HOOKS="1")
    result = tmpi("wrap", "--rule", "gosgd", MLP, env=env)
    assert "tmpi_rules" in result.stderr  # the trace of hook calls
    assert result.returncode == 2 and "pip install tmpi-plugin-gosgd" in result.stderr
    rows = json.loads(check(tmpi("plugins", "--json", env=rank_env(
        TMPI_DISABLE_PLUGIN_AUTOLOAD="1"))).stdout)
    assert all("built-in" in row["distribution"] for row in rows)


@pytest.mark.parametrize("args,message", [
    (["wrap", "-n", "2", "missing.py"], "script 'missing.py' not found"),
    (["wrap", "--framework", "caffe", str(MLP)], "unknown framework 'caffe'. Installed frameworks:"),
    (["wrap", "--rule", "hogwild", str(MLP)], "unknown rule 'hogwild'. Installed rules: "),
    (["wrap", "--exchanger", "smoke", str(MLP)], "unknown exchanger 'smoke'"),
    (["wrap", "--rule-option", "tau=3", str(MLP)], "rule 'bsp' has no option 'tau'"),
    (["wrap", "--rule-option", "period=0", str(MLP)], "period=0 must be > 0"),
    (["wrap", "--bogus", str(MLP)], "unknown option --bogus"),
    (["wrap", "--stall-timeout", "-1", str(MLP)], "--stall-timeout must be a positive"),
    (["wrap", "--stall-timeout", "nan", str(MLP)], "--stall-timeout must be a positive, finite"),
    (["wrap", "--stall-timeout", "inf", str(MLP)], "--stall-timeout must be a positive, finite"),
    (["wrap", "-n", "2"], "no script given"),
])
def test_bad_input_is_one_clear_line(capsys, args, message):
    code, _, err = tmpi_here(capsys, *args)
    assert code == 2
    assert message in err, err
    assert "Traceback" not in err


def test_bad_option_value_is_one_line_and_help_keeps_the_usage():
    # The `tmpi` command itself: one line naming the option, the value and
    # what it takes, status 2, and nothing started.  (Every option's bad
    # values: test_reliability_input.py.)
    for args, message in ((["-n", "two"], "-n must be a whole number >= 1, not 'two'"),
                          (["--outputs", "everywhere"],
                           "--outputs must be one of averaged, local, not 'everywhere'")):
        result = tmpi("wrap", *args, MLP, timeout=30)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == ["tmpi: error: " + message], result.stderr
        assert result.stdout == ""
    usage = check(tmpi("wrap", "--help", timeout=30)).stdout
    assert usage.startswith("usage: tmpi wrap [-n N]") and "--checkpoint-every" in usage


def test_decorator_options_are_checked_like_the_command_line():
    # What @tmpi.distributed(outputs=...) goes through before any rank starts.
    from tmpi_adapters.errors import ConfigError
    from tmpi_adapters.options import Options
    with pytest.raises(ConfigError, match="--outputs must be one of averaged, local, "
                                          "not 'everywhere'"):
        Options(outputs="everywhere").validate()
    assert Options(outputs="local").validate().outputs == "local"
    with pytest.raises(ConfigError, match="--stall-timeout must be a positive, finite"):
        Options(stall_timeout=float("nan")).validate()


@pytest.mark.mpi
def test_tmpi_wrap_keeps_what_the_decorator_sets(tmp_path):
    # rule, rule options, seed and record of @distributed(...) under both launchers.
    script = SCRIPTS / "decorated_options.py"
    env = rank_env("float64")
    runs = {}
    for name, command in (("mpiexec", [MPIEXEC, "-n", "2", sys.executable, script]),
                          ("wrap", [TMPI, "wrap", "-n", "2", script])):
        directory = tmp_path / name
        directory.mkdir()
        result = check(run(command, env=env, cwd=directory))
        header = json.loads((directory / "deco.jsonl").read_text().splitlines()[0])
        assert header["rule"] == "easgd" and header["ranks"] == 2, header
        runs[name] = final_numbers(result.stdout, "loss")
    assert runs["wrap"] == runs["mpiexec"]  # the decorator's seed, bit for bit
    # The command line names the seed: it wins, and says so.
    result = check(run([TMPI, "wrap", "-n", "2", "--seed", "3", script], env=env,
                       cwd=tmp_path / "wrap"))
    assert "the command line wins over the decorator for seed (3, not 5)" in result.stderr
    assert final_numbers(result.stdout, "loss") != runs["mpiexec"]


def test_decorator_arguments_are_read_from_the_script_without_running_it():
    from tmpi_adapters.launch.target import apply_declared, declared_options
    from tmpi_adapters.options import Options
    declared, unread = declared_options(
        "import tmpi_adapters as tmpi\nSEED = 3\n"
        "@tmpi.distributed('lasagne', 'easgd', {'tau': 4}, record='r.jsonl', seed=SEED)\n"
        "def main(): pass\n")
    assert declared == {"framework": "lasagne", "rule": "easgd", "rule_options": {"tau": 4},
                        "record": "r.jsonl"}
    assert unread == ["seed"]
    options = Options(rule="bsp", explicit=["rule"])
    overridden = apply_declared(options, declared, set(options.explicit))
    assert overridden == {"rule": ("bsp", "easgd")}
    assert (options.rule, options.framework, options.rule_options, options.extra) == (
        "bsp", "lasagne", {"tau": 4}, {"record": "r.jsonl"})


@pytest.mark.mpi
def test_a_decorator_argument_tmpi_wrap_cannot_read_is_an_error(tmp_path):
    script = tmp_path / "variable_seed.py"
    script.write_text((SCRIPTS / "decorated_options.py").read_text().replace(
        "seed=5", "seed=int('5')"))
    result = run([TMPI, "wrap", "-n", "2", script], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "@distributed(seed=5) cannot take effect under tmpi wrap" in result.stderr
    assert "Pass it on tmpi wrap's command line" in result.stderr


def test_a_framework_other_than_the_scripts_is_named():
    keras = tmpi("wrap", "--framework", "theano", SCRIPTS / "keras_mlp.py", "--help",
                 env=rank_env(KERAS_BACKEND="theano"))
    assert "tmpi: note: '%s' uses keras, but --framework theano was given" \
        % (SCRIPTS / "keras_mlp.py") in keras.stderr, keras.stderr
    assert "Leave --framework out to let tmpi pick keras." in keras.stderr
    theano = tmpi("wrap", "--framework", "keras", SCRIPTS / "sharded_data.py", "args", "same")
    assert "uses theano, but --framework keras was given: it imports none of keras" \
        in theano.stderr, theano.stderr


def while_the_compile_lock_is_held(compiledir, *options):
    """``tmpi wrap -n 2 OPTIONS`` of a small script on a cold compile cache
    whose lock another process holds for its first seconds: every rank
    waits on it, and Theano says so every second."""
    env = rank_env()
    env["THEANO_FLAGS"] += ",base_compiledir=%s,compile.wait=1" % compiledir
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time\nfrom theano.gof import compilelock\n"
         "compilelock.get_lock()\nprint('held', flush=True)\ntime.sleep(6)\n"
         "compilelock.release_lock()\n"], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        return check(tmpi("wrap", "-n", "2", *options, SCRIPTS / "sharded_data.py", "args",
                          "same", env=env))
    finally:
        holder.kill()


@pytest.mark.mpi
def test_theanos_compile_lock_notes_stay_out_of_the_output(tmp_path):
    quiet = while_the_compile_lock_is_held(tmp_path / "quiet")
    assert "compilelock" not in quiet.stderr, quiet.stderr
    # The notes were there to be kept out: --all-ranks-output shows them.
    loud = while_the_compile_lock_is_held(tmp_path / "loud", "--all-ranks-output")
    assert "[rank 0] INFO (theano.gof.compilelock): Waiting for existing lock" in loud.stderr


@pytest.mark.mpi
def test_script_without_training_function_is_warned_once_and_succeeds():
    script = SCRIPTS / "no_training.py"
    result = check(tmpi("wrap", "-n", "2", script))
    assert "tmpi: warning: the script compiled 1 Theano function(s) but no training " \
        "function" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("no training function") == 1


@pytest.mark.mpi
def test_parameter_signature_mismatch_names_the_parameter():
    result = tmpi("wrap", "-n", "2", SCRIPTS / "mismatch.py")
    assert result.returncode != 0
    assert "rank 1's model differs from rank 0's at param #0" in result.stderr
    assert "'W_hidden' shape (3, 5)" in result.stderr and "shape (3, 6)" in result.stderr


@pytest.mark.mpi
def test_all_ranks_output_is_prefixed():
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output", MLP, "--epochs", "1"))
    assert "[rank 0] epoch  1/1" in result.stdout
    assert "[rank 1] epoch  1/1" in result.stdout


@pytest.mark.mpi
def test_all_ranks_output_keeps_every_line_whole_and_prefixed():
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output",
                        SCRIPTS / "output_lines.py"))
    lines = result.stdout.splitlines()
    for rank in (0, 1):
        # Lines of 100,000 characters (past mpiexec's 64 KiB pieces) are not cut.
        assert lines.count("[rank %d] %s" % (rank, str(rank) * 100000)) == 6, \
            [line[:20] + "...%d" % len(line) for line in lines]
        assert "[rank %d] bytes of rank %d" % (rank, rank) in lines  # sys.stdout.buffer
        assert "[rank %d] fd 1 of rank %d" % (rank, rank) in lines   # below Python
        assert "[rank %d] unfinished" % rank in lines                # the last, unended line
    summary = [line for line in lines if "steps on 2 rank(s)" in line]
    assert len(summary) == 1 and summary[0].startswith("[rank 0] tmpi: 4 steps"), summary
    assert all(line.startswith("[rank ") for line in lines), lines


def byte_lines(data):
    """``data`` cut after each ``\\n`` only (``bytes.splitlines`` cuts at ``\\r`` too)."""
    pieces = data.split(b"\n")
    return [piece + b"\n" for piece in pieces[:-1]] + ([pieces[-1]] if pieces[-1] else [])


def relayed_lines(stdout, rank):
    """Rank ``rank``'s lines in ``--all-ranks-output`` bytes, prefix kept, but
    for tmpi's own (its summary, its warnings)."""
    prefix = b"[rank %d] " % rank
    return [line for line in byte_lines(stdout)
            if line.startswith(prefix) and not line.startswith(prefix + b"tmpi: ")]


@pytest.mark.mpi
def test_all_ranks_output_relays_bytes_as_they_were_written():
    script = SCRIPTS / "output_bytes.py"
    spec = importlib.util.spec_from_file_location("output_bytes", script)
    written = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(written)
    # Bytes, not text: a byte decoded on its way (U+FFFD for 0x80-0xFF) must show.
    result = subprocess.run([TMPI, "wrap", "-n", "2", "--all-ranks-output", "--framework",
                             "theano", str(script)], env=rank_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, timeout=RUN_TIMEOUT)
    assert result.returncode == 0, result.stderr.decode("utf-8", "replace")[-3000:]
    assert result.stdout.endswith(b"\n"), result.stdout[-200:]
    assert all(line.startswith(b"[rank ") for line in byte_lines(result.stdout)), \
        result.stdout[:2000]
    for rank in (0, 1):
        # Every whole line after its prefix, the last, unfinished one ended by tmpi.
        prefix = b"[rank %d] " % rank
        expected = [prefix + line for line in byte_lines(written.payload(rank) + b"\n")]
        assert relayed_lines(result.stdout, rank) == expected
        assert prefix + written.stderr_line(rank) in byte_lines(result.stderr)


def test_a_rank_prefixing_its_own_lines_keeps_their_bytes():
    # Where the launcher's relay is not at hand (another machine) the rank
    # prefixes its lines itself, through the same stream.
    from tmpi_adapters.process import output
    raw = io.BytesIO()
    stream = output.rank_prefix_stream(io.TextIOWrapper(raw, encoding="utf-8"), "[rank 1] ")
    try:
        stream.buffer.write(b"\xe9t\xe9 ")
        stream.write("caf\u00e9 ")
        stream.buffer.write(bytearray(b"\r50%\r100%\n\x80\xff\n\x00"))
        # Latin-1 bytes as they are, the text in the stream's encoding (UTF-8).
        assert raw.getvalue() == b"[rank 1] \xe9t\xe9 caf\xc3\xa9 \r50%\r100%\n" \
                                 b"[rank 1] \x80\xff\n"
        stream.end_partial_line()
        assert raw.getvalue().endswith(b"[rank 1] \x80\xff\n[rank 1] \x00\n")
    finally:
        output._prefixed.remove(stream)


@pytest.mark.mpi
def test_everything_after_the_script_is_the_scripts():
    # --epochs is the script's, and so is --seed although tmpi has one too;
    # "--" may end tmpi's options.
    result = check(tmpi("wrap", "-n", "2", "--", MLP, "--epochs", "2", "--seed", "4"))
    assert "epoch  2/2" in result.stdout


@pytest.mark.mpi
def test_decorator_under_mpiexec_matches_plain_python():
    script = SCRIPTS / "decorated_mlp.py"
    one = check(run([sys.executable, script]))
    two = check(mpiexec(2, sys.executable, script))
    assert two.stdout.count("final loss") == 1
    # The ranks share the cores, as under tmpi wrap (this machine: 2 cores).
    assert "; 1 BLAS thread per rank" in two.stdout, two.stdout[-500:]
    for key in ("loss", "norms"):
        assert_close(final_numbers(two.stdout, key), final_numbers(one.stdout, key), 1e-8)
