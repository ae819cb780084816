"""The front door behaves like python: the script's own arguments and exit
status, ``sys.path`` and ``-m``, output, interruptions, threads, plain
``python`` in the venv, plugins by name, and clear small errors.

Option parsing is checked in this process; every behaviour that needs ranks
runs one real command on tiny models in pure-Python Theano.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import zipfile

import pytest

from conftest import MPIEXEC, ROOT, SCRIPTS, TMPI, check, mpiexec, rank_env, run, tmpi

PROBE = SCRIPTS / "frontdoor_probe.py"
PLAIN = SCRIPTS / "frontdoor_plain.py"
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def pure_env(**extra):
    """float64 Theano in pure Python (the models are tiny), and none of the
    caller's BLAS thread settings."""
    env = rank_env("float64", **extra)
    env["THEANO_FLAGS"] += ",cxx="
    for name in THREAD_VARIABLES:
        env.pop(name, None)
    return env


def probe(stdout):
    """What :data:`PROBE` printed of how it was started."""
    lines = [line for line in stdout.splitlines() if line.startswith("probe ")]
    assert len(lines) == 1, stdout[-3000:]
    return json.loads(lines[0][len("probe "):])


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def tmpi_here(capsys, *argv):
    """``tmpi ARGV`` in this process: ``(exit status, stdout, stderr)``."""
    from tmpi_adapters.launch import cli
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- tmpi's options come first; the rest is the script's -------------------------------

@pytest.mark.parametrize("argv,ours,target,rest", [
    (["-n", "2", "s.py", "-n", "5", "--seed", "3"], ["-n", "2"], ("script", "s.py"),
     ["-n", "5", "--seed", "3"]),
    (["--rule", "bsp", "--", "s.py", "--help"], ["--rule", "bsp"], ("script", "s.py"),
     ["--help"]),
    (["-n2", "--seed=4", "s.py", "--", "--x"], ["-n2", "--seed=4"], ("script", "s.py"),
     ["--", "--x"]),
    (["-n", "2", "-m", "pkg.train", "-n", "5"], ["-n", "2"], ("module", "pkg.train"),
     ["-n", "5"]),
    (["-mpytest", "-q", "--rule"], [], ("module", "pytest"), ["-q", "--rule"]),
])
def test_options_before_the_script_are_tmpis_and_after_it_the_scripts(argv, ours, target,
                                                                      rest):
    from tmpi_adapters.launch.arguments import split_wrap_argv, wrap_parser
    assert split_wrap_argv(argv, wrap_parser()) == (ours, target, rest)


@pytest.mark.parametrize("args,message", [
    (["--bogus", PROBE], "unknown option --bogus for tmpi wrap"),
    (["--bogus", PROBE], "tmpi's options go before the script"),
    (["-m"], "-m needs a module name"),
    (["-m", "no_such_module_of_tmpi"], "no module named no_such_module_of_tmpi"),
    (["-m", "json.tool"], "could not tell which framework module 'json.tool' uses"),
    (["--rule-option", "tau", PROBE], "(e.g. --rule-option tau=4)"),
])
def test_wrap_refuses_bad_input_in_one_line(capsys, args, message):
    code, _, err = tmpi_here(capsys, "wrap", *args)
    assert code == 2 and message in err and "Traceback" not in err, err
    assert " -o " not in err


def test_wrap_help_is_tmpis_only_before_the_script(capsys):
    with pytest.raises(SystemExit) as exit_:
        tmpi_here(capsys, "wrap", "--help")
    assert exit_.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "-m MODULE" in out and "everything after the script is its own" in out
    result = tmpi("wrap", PROBE, "--help", env=pure_env())
    assert result.returncode == 0, result.stderr
    assert "usage: frontdoor_probe.py" in result.stdout and "--forever" in result.stdout
    assert "tmpi wrap" not in result.stdout


def test_tmpi_options_after_the_script_reach_the_script_with_a_hint():
    result = tmpi("wrap", PROBE, "--rule", "bsp", env=pure_env())
    assert result.returncode == 2, result.stderr
    assert "unrecognized arguments: --rule bsp" in result.stderr
    assert "tmpi: note: the script's arguments include --rule" in result.stderr


# -- running as python runs it -------------------------------------------------------------

@pytest.mark.mpi
def test_arguments_exit_status_sys_path_and_threads_are_as_under_python():
    args = ["-n", "5", "--seed", "3"]
    plain = probe(check(run([sys.executable, PROBE] + args, env=pure_env())).stdout)
    assert plain["argv"] == args

    # 2 ranks: the script's own -n and --seed, its sys.exit(3) as tmpi's status
    # without a failure report, the cores shared out among the ranks.
    two = tmpi("wrap", "-n", "2", PROBE, *args, "--exit", "3", env=pure_env())
    assert two.returncode == 3, two.stderr[-3000:]
    assert "failed" not in two.stderr and "Traceback" not in two.stderr, two.stderr
    seen = probe(two.stdout)
    assert seen["argv"] == args + ["--exit", "3"]
    assert seen["path"] == plain["path"]
    share = str(max(1, cores() // 2))
    assert seen["threads"] == {"OMP_NUM_THREADS": share, "OPENBLAS_NUM_THREADS": share}
    assert seen["W"] == pytest.approx(plain["W"], rel=1e-12)  # BSP is exact

    # 1 rank: in the tmpi process itself, with the same sys.path, and the BLAS
    # threads plain python has; the summary says how many.
    one = check(tmpi("wrap", "-n", "1", PROBE, *args, env=pure_env()))
    seen = probe(one.stdout)
    assert seen["argv"] == args and seen["path"] == plain["path"]
    assert seen["threads"] == {"OMP_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": None}
    assert re.search(r"; \d+ BLAS threads? per rank$", one.stdout, re.M), one.stdout


ARGV0 = """\
import json, sys
import theano
print("argv0 " + json.dumps({"argv0": sys.argv[0], "file": __file__, "name": __name__}))
"""


@pytest.mark.mpi
@pytest.mark.parametrize("typed", ["argv0.py", "./argv0.py", "here/argv0.py"])
def test_sys_argv0_is_the_script_as_typed_as_under_python(tmp_path, typed):
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "argv0.py").write_text(ARGV0)
    cwd = tmp_path if typed.startswith("here/") else tmp_path / "here"

    def seen(result):
        [line] = [line for line in check(result).stdout.splitlines() if line.startswith("argv0 ")]
        return json.loads(line[len("argv0 "):])
    plain = seen(run([sys.executable, typed], env=pure_env(), cwd=cwd))
    assert plain["argv0"] == typed and plain["name"] == "__main__"
    assert os.path.isabs(plain["file"]) and \
        os.path.samefile(plain["file"], tmp_path / "here" / "argv0.py")
    for ranks in ("1", "2"):
        assert seen(run([TMPI, "wrap", "-n", ranks, typed], env=pure_env(), cwd=cwd)) == plain


PACKAGE = {
    "__init__.py": "",
    "model.py": '''
import numpy as np
import theano
import theano.tensor as T


def train(steps):
    W = theano.shared(np.zeros(2), name="W")
    x, y = T.dmatrix("x"), T.dvector("y")
    loss = T.sqr(T.dot(x, W) - y).mean()
    step = theano.function([x, y], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
    data = np.arange(8.0).reshape(4, 2) / 8
    for _ in range(steps):
        step(data, data.sum(axis=1))
    return W.get_value().tolist()
''',
    "__main__.py": '''
import json
import sys

from .model import train

print("module " + json.dumps({"W": train(int(sys.argv[1])), "argv": sys.argv[1:],
                              "path0": sys.path[0], "package": __package__}))
''',
}


@pytest.mark.mpi
def test_a_package_runs_with_minus_m_as_python_runs_it(tmp_path):
    # The blocks-examples way: python -m sqrt, relative imports inside.
    for name, text in PACKAGE.items():
        (tmp_path / "trainer").mkdir(exist_ok=True)
        (tmp_path / "trainer" / name).write_text(text)

    def printed(result):
        lines = [line for line in check(result).stdout.splitlines()
                 if line.startswith("module ")]
        assert len(lines) == 1, result.stdout
        return json.loads(lines[0][len("module "):])
    plain = printed(run([sys.executable, "-m", "trainer", "3", "-n", "9"], env=pure_env(),
                        cwd=tmp_path))
    two = printed(run([TMPI, "wrap", "-n", "2", "-m", "trainer", "3", "-n", "9"],
                      env=pure_env(), cwd=tmp_path))
    assert plain["path0"] == str(tmp_path) and plain["package"] == "trainer"
    assert two["argv"] == plain["argv"] == ["3", "-n", "9"]
    assert two["path0"] == plain["path0"] and two["package"] == plain["package"]
    assert two["W"] == pytest.approx(plain["W"], rel=1e-12)


def test_pytests_exit_status_comes_through(tmp_path):
    tests = tmp_path / "test_evaluation.py"
    tests.write_text("def test_evaluates():\n    import theano\n")
    result = tmpi("wrap", "--framework", "theano", "-m", "pytest", "-q", "-p",
                  "no:cacheprovider", tests, "-k", "nothing_selected", env=pure_env())
    assert result.returncode == 5, result.stdout + result.stderr  # no tests ran
    assert "1 deselected" in result.stdout
    assert "failed" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.mpi
def test_a_gradient_monitor_that_trains_nothing_succeeds_warned_once_in_whole_lines():
    # The function returns gradients and has no updates; every rank prints
    # 300 lines, each print writing its arguments one by one.
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output",
                        SCRIPTS / "frontdoor_monitor.py", env=pure_env()))
    lines = result.stdout.splitlines()
    whole = re.compile(r"^\[rank ([01])\] rank \1 line \d+ gradient \S+ end$")
    assert [line for line in lines if not whole.match(line)] == []
    assert len(lines) == 600
    assert result.stderr.count("tmpi: warning: the script compiled 1 Theano function(s) "
                               "but no training function") == 1, result.stderr


@pytest.mark.mpi
def test_a_failure_on_every_rank_is_reported_once_under_a_bare_mpiexec():
    result = mpiexec(2, sys.executable, SCRIPTS / "frontdoor_raise.py", env=pure_env())
    assert result.returncode != 0
    assert result.stderr.count("failed: ValueError: the same failure on every rank") == 1, \
        result.stderr


@pytest.mark.mpi
@pytest.mark.parametrize("signum, group", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                           (signal.SIGINT, True)],
                         ids=["SIGINT", "SIGTERM", "SIGINT-to-the-process-group"])
def test_stopping_tmpi_stops_every_rank_and_leaves_no_job_directory(tmp_path, signum, group):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    # A directory a launcher killed with SIGKILL left (its pid is gone), and
    # one whose launcher runs (this test): the first goes, the second stays.
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = os.uname().nodename
    for name, pid in (("tmpi-job-killed", gone.pid), ("tmpi-job-running", os.getpid())):
        (temporary / name).mkdir()
        from tmpi_adapters.process.jobdir import process_start_time
        (temporary / name / "launcher").write_text(
            "%d %s %s" % (pid, process_start_time(pid) or "-", host))
    process = subprocess.Popen(
        [TMPI, "wrap", "-n", "2", PROBE, "--forever"], env=pure_env(TMPDIR=temporary),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell may start background jobs with SIGINT ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        # Ctrl-C at a terminal: the whole foreground process group, mpiexec too.
        start_new_session=group)
    try:
        assert process.stdout.readline().strip() == "started", process.stderr.read()
        if group:
            os.killpg(process.pid, signum)
        else:
            process.send_signal(signum)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    name = signal.Signals(signum).name
    assert process.returncode == 128 + signum, stderr
    said = [line for line in stderr.splitlines() if line.startswith("tmpi: ")]
    # The launcher's line, or rank 0's where the signal reached the ranks too.
    assert said == ["tmpi: interrupted (%s): the job's 2 rank(s) were stopped." % name] or \
        group and said == ["tmpi: interrupted (rank 0)"], stderr
    assert stderr.splitlines()[-1] == said[0], stderr  # hydra's "Ctrl-C" lines held back
    assert "[mpiexec@" not in stdout + stderr, stdout + stderr
    assert "killed by" not in stderr and "Traceback" not in stderr, stderr
    assert sorted(os.listdir(temporary)) == ["tmpi-job-running"]
    left = subprocess.run(["pgrep", "-f", "%s --forever" % PROBE], capture_output=True)
    assert left.stdout == b""


@pytest.mark.mpi
def test_a_job_started_with_sigint_ignored_ignores_it_everywhere():
    """As a shell script, a batch system or CI starts background jobs: SIGINT
    to the caller's process group, while the ranks import and compile, is
    ignored by the whole job (hydra's mpiexec would act on it, and the ranks
    it starts would not inherit the ignoring)."""
    import time
    process = subprocess.Popen(
        [TMPI, "wrap", "-n", "2", SCRIPTS / "reliability_restart.py", "3000"], env=pure_env(),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        for delay in (1.5, 1.5, 1.5):  # starting, importing Theano, compiling
            time.sleep(delay)
            os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=300)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert process.returncode == 0, stderr[-3000:]
    assert "final params" in stdout and "interrupted" not in stderr, stderr[-3000:]
    assert "Ctrl-C" not in stderr, stderr[-3000:]  # mpiexec never saw it


def test_nan_is_left_to_the_scripts_own_safety_net_by_default():
    # Keras's TerminateOnNaN stops the fit; tmpi does not check unless asked.
    result = check(tmpi("wrap", SCRIPTS / "frontdoor_terminate_on_nan.py",
                        env=pure_env(KERAS_BACKEND="theano")))
    assert "Batch 2: Invalid loss, terminating training" in result.stdout
    assert "stopped by the script after 1 epoch(s)" in result.stdout
    assert "non-finite" not in result.stderr


# -- the venv: plain python, pip install by name, the wheel's start-up hook ----------------

def plain_env():
    """No help from the caller: the start-up hook must set Theano's BLAS flag
    and Keras's backend itself."""
    env = pure_env()
    env["THEANO_FLAGS"] = ",".join(f for f in env["THEANO_FLAGS"].split(",")
                                   if not f.startswith("blas.ldflags"))
    env.pop("KERAS_BACKEND", None)
    return env


def test_plain_python_pytest_and_mpiexec_python_run_2017_era_scripts():
    purelib = sysconfig.get_paths()["purelib"]
    if not os.path.exists(os.path.join(purelib, "tmpi_adapters_shims.pth")):
        pytest.skip("the start-up hook is not installed here (make install writes it)")
    result = check(run([sys.executable, PLAIN, "lasagne", "keras", "scan"], env=plain_env()))
    assert "lasagne 0.1 trained" in result.stdout and "keras 2.3.1 trained" in result.stdout
    assert "scan trained" in result.stdout
    result = check(run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        PLAIN, "-k", "scan"], env=plain_env()))
    assert "1 passed" in result.stdout
    result = check(run([MPIEXEC, "-n", "2", sys.executable, PLAIN, "lasagne"], env=plain_env()))
    assert result.stdout.count("lasagne 0.1 trained") == 2


def test_the_start_up_hook_imports_nothing_heavy():
    # Every python of the venv runs the hook: it may load tmpi's small compat
    # module, and the shims wait for the libraries they are for.
    purelib = sysconfig.get_paths()["purelib"]
    if not os.path.exists(os.path.join(purelib, "tmpi_adapters_shims.pth")):
        pytest.skip("the start-up hook is not installed here (make install writes it)")
    result = check(run([sys.executable, "-c", "import sys; print(' '.join(sorted(sys.modules)))"],
                       env=plain_env()))
    loaded = set(result.stdout.split())
    assert "tmpi_adapters.process.compat" in loaded
    assert {m for m in loaded if m.startswith("tmpi_adapters")} <= {
        "tmpi_adapters", "tmpi_adapters.process", "tmpi_adapters.process.compat",
        "tmpi_adapters.version"}, loaded
    heavy = {"numpy", "theano", "mpi4py", "pluggy", "keras", "lasagne", "json", "logging",
             "subprocess", "threading"} & loaded
    assert not heavy, heavy


def test_the_venvs_pip_installs_a_plugin_by_name():
    if not os.path.exists(os.path.join(sys.prefix, "pip.conf")):
        pytest.skip("this venv has no pip.conf naming dist/ (make install writes it)")
    pip = os.path.join(os.path.dirname(sys.executable), "pip")
    # A dry run: the same lookup by name as the real install, the venv untouched.
    result = check(run([pip, "install", "--dry-run", "--ignore-installed", "--no-deps",
                        "tmpi-plugin-gosgd"], env=dict(pure_env(), PIP_RETRIES="0",
                                                       PIP_DEFAULT_TIMEOUT="15")))
    assert "Would install tmpi-plugin-gosgd-" in result.stdout, result.stdout


def test_a_wheel_of_tmpi_installs_the_startup_hook(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(ROOT / "tmpi_adapters", source / "tmpi_adapters",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    check(run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
               "--no-build-isolation", "-w", tmp_path / "wheels", source], env=pure_env()))
    wheel, = (tmp_path / "wheels").glob("tmpi_adapters-*.whl")
    from tmpi_adapters.process.compat import STARTUP_HOOK, STARTUP_LINE
    with zipfile.ZipFile(wheel) as archive:
        assert archive.read(STARTUP_HOOK).decode() == STARTUP_LINE  # site-packages' top
        record = archive.read(next(n for n in archive.namelist() if n.endswith("/RECORD")))
        # Type checkers read an installed tmpi's annotations (PEP 561).
        assert "tmpi_adapters/py.typed" in archive.namelist()
    assert STARTUP_HOOK.encode() in record  # so that pip uninstall removes it


# -- small errors ---------------------------------------------------------------------------

@pytest.mark.parametrize("text,message", [
    (b'RULE=BSP\nMODELFILE="models.mlp\nMODELCLASS=MLP\n',
     ':2: MODELFILE cannot be read as a shell value (no closing quotation)'),
    (b"RULE=BSP\nMODELFILE=mod\xe8les.mlp\n", ":2: not UTF-8 text (byte 0xe8)"),
    (b"RULE=BSP\nMODELFILE=models.mlp\nMODELCLASS=MLP\nDEVICES=\n",
     "DEVICES is empty: list one device per rank"),
])
def test_a_bad_launch_session_cfg_is_one_clear_line(capsys, tmp_path, text, message):
    config = tmp_path / "launch_session.cfg"
    config.write_bytes(text)
    code, _, err = tmpi_here(capsys, "run", "--config", config)
    assert code == 2 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize("options,status,message", [
    (["--checkpoint-every", "5"], 2, "--checkpoint-every needs --checkpoint-dir"),
    (["--checkpoint-dir", "/sys"], 6, "cannot write to --checkpoint-dir /sys"),
])
def test_checkpoint_options_that_cannot_work_stop_the_run_before_the_script(options, status,
                                                                            message):
    if "/sys" in options and (not os.path.isdir("/sys") or os.access("/sys", os.W_OK)
                              and os.geteuid() != 0):
        pytest.skip("no /sys that refuses new files here")
    result = tmpi("wrap", *options, PROBE, env=pure_env())
    assert result.returncode == status, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "probe " not in result.stdout  # refused before the script ran


def test_resume_latest_takes_the_highest_step_and_needs_the_same_arguments(tmp_path):
    directory = tmp_path / "checkpoints"
    check(tmpi("wrap", "--checkpoint-dir", directory, "--checkpoint-every", "1", PROBE,
               "-n", "5", env=pure_env()))
    names = sorted(os.listdir(directory))
    assert names == ["checkpoint-step%08d.tmpi" % step for step in (3, 4, 5)]
    os.utime(directory / names[0])  # the oldest step, written last
    result = tmpi("wrap", "--checkpoint-dir", directory, "--resume", "latest", PROBE,
                  "-n", "6", env=pure_env())
    assert result.returncode == 6, result.stderr
    assert ("checkpoint %s was written by a run with the script arguments `-n 5`; this run "
            "has `-n 6`" % (directory / names[-1])) in result.stderr, result.stderr
    assert "--allow-new-arguments" in result.stderr and "Traceback" not in result.stderr
    longer = check(tmpi("wrap", "--checkpoint-dir", directory, "--resume", "latest",
                        "--allow-new-arguments", PROBE, "-n", "6", env=pure_env()))
    assert "resumed at step 5" in longer.stdout
    assert probe(longer.stdout)["W"] == pytest.approx(probe(check(run(
        [sys.executable, PROBE, "-n", "6"], env=pure_env())).stdout)["W"], rel=1e-12)


def test_compiled_ops_without_props_are_cached_across_processes():
    # Theano 1.0.5 reads an empty __props__ as "no cache version", so the C
    # module of softmax_with_bias (and Alloc, Shape, ...) was compiled again in
    # every process; the start-up hook's shim keys it by its real version.
    purelib = sysconfig.get_paths()["purelib"]
    if not os.path.exists(os.path.join(purelib, "tmpi_adapters_shims.pth")):
        pytest.skip("the start-up hook is not installed here (make install writes it)")
    import theano.tensor as T
    from theano.gof import FunctionGraph
    from theano.gof.cc import CLinker
    x, b = T.dmatrix("x"), T.dvector("b")
    graph = FunctionGraph([x, b], [T.nnet.softmax_with_bias(x, b)], clone=False)
    version, _ = CLinker().accept(graph).cmodule_key()
    assert version and all(version), version
    assert ("props",) in version


def test_ranks_compile_at_once_and_hash_strings_alike(tmp_path):
    """Every rank compiles while the others do (then they meet), and the
    ranks tmpi starts share one hash seed unless the user set one."""
    script = SCRIPTS / "compile_together.py"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    env = pure_env()
    env.pop("PYTHONHASHSEED", None)
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output", script, first, env=env))
    assert "together True" in result.stdout, result.stdout
    hashes = re.findall(r"hash (-?\d+)", result.stdout)
    expected = check(run([sys.executable, "-c", "print(hash('tmpi'))"],
                         env=dict(env, PYTHONHASHSEED="0"))).stdout.strip()
    assert hashes == [expected] * 2, (hashes, expected)
    env["PYTHONHASHSEED"] = "5"
    mine = check(run([sys.executable, "-c", "print(hash('tmpi'))"], env=env)).stdout.strip()
    assert mine != expected
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output", script, second, "--wait",
                        "0", env=env))
    assert re.findall(r"hash (-?\d+)", result.stdout) == [mine] * 2, result.stdout


def test_ranks_retry_the_compile_lock_every_second_unless_the_user_says_otherwise(tmp_path):
    from tmpi_adapters.process import compat
    assert "compile.wait=1" in compat.theano_flags(env={"THEANO_FLAGS": "floatX=float32"})
    mine = compat.theano_flags(env={"THEANO_FLAGS": "compile.wait=3"}).split(",")
    assert "compile.wait=3" in mine and "compile.wait=1" not in mine
    script = tmp_path / "wait.py"
    script.write_text("import theano\nprint('wait', theano.config.compile.wait)\n")
    result = check(tmpi("wrap", "-n", "2", "--all-ranks-output", script, env=pure_env()))
    assert result.stdout.count("wait 1") == 2, result.stdout


def test_the_framework_of_a_script_is_read_from_the_modules_beside_it_that_it_imports(tmp_path):
    # A two-line runner of a tutorial's module: `import mlp; mlp.test_mlp(n_epochs=3)`.
    from tmpi_adapters.launch.target import detect_framework
    (tmp_path / "model.py").write_text("import lasagne\n")
    (tmp_path / "other.py").write_text("import keras\n")  # not imported by the runner
    (tmp_path / "run.py").write_text("import os\nimport model\nmodel.main()\n")
    assert detect_framework(str(tmp_path / "run.py")) == "lasagne"
    (tmp_path / "alone.py").write_text("import os\n")
    assert detect_framework(str(tmp_path / "alone.py")) is None
