"""Which Pythons tmpi runs on, and the way in from any other.

``tools/python.sh`` (what ``make`` runs before anything else) is run for real
with a PATH of small scripts that answer as interpreters of given versions
would; ``make install`` itself is run the same way, to show that it stops in
seconds.  The compatibility shims that Python 3.12 needs are checked on the
interpreter running the suite, where each must leave what exists alone.
"""
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from conftest import ROOT, check, run

CHOOSER = ROOT / "tools" / "python.sh"
SUPPORTED = ("3.11", "3.12")
MAKE = shutil.which("make")


def fake_python(directory, name, version, runs=True):
    """An executable ``directory/name`` that answers the chooser's probe as
    Python ``version`` would and makes a venv with ``-m venv DIR``; with
    ``runs=False``, a pyenv shim of a version not selected (exit 127)."""
    path = directory / name
    if runs:
        minor = ".".join(version.split(".")[:2])
        path.write_text(textwrap.dedent("""\
            #!/bin/sh
            case "$1" in
                -c) echo "{minor} {version} $0" ;;
                -m) PATH=/usr/bin:/bin; mkdir -p "$3/bin" && cp "$0" "$3/bin/python" ;;
            esac
            """).format(minor=minor, version=version))
    else:
        path.write_text("#!/bin/sh\necho \"pyenv: $0: command not found\" >&2\nexit 127\n")
    path.chmod(0o755)
    return path


def chooser(bin_dir, *args):
    """``sh tools/python.sh ARGS`` with ``bin_dir`` alone on PATH."""
    return subprocess.run(["/bin/sh", str(CHOOSER)] + [str(a) for a in args],
                          env={"PATH": str(bin_dir), "HOME": str(bin_dir)},
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)


@pytest.fixture
def bin_dir(tmp_path):
    path = tmp_path / "bin"
    path.mkdir()
    return path


def test_a_supported_python3_is_taken_as_it_is(bin_dir):
    fake_python(bin_dir, "python3", "3.11.7")
    fake_python(bin_dir, "python3.12", "3.12.1")
    result = chooser(bin_dir, "choose", "python3", "file")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(bin_dir / "python3")
    assert "using python3 (Python 3.11.7" in result.stderr


@pytest.mark.parametrize("python3", ["3.13.0", "3.10.13", None])
def test_otherwise_the_newest_supported_python_found_is_taken_and_named(bin_dir, python3):
    if python3:
        fake_python(bin_dir, "python3", python3)
    fake_python(bin_dir, "python3.11", "3.11.9")
    fake_python(bin_dir, "python3.12", "3.12.4")
    result = chooser(bin_dir, "choose", "python3", "file")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(bin_dir / "python3.12")
    said = ("python3 is Python %s, which tmpi does not run on" % python3 if python3
            else "there is no python3 here")
    assert said + "; using python3.12 instead (Python 3.12.4" in result.stderr


def test_a_version_installed_by_pyenv_but_not_selected_is_found(bin_dir, tmp_path):
    # pyenv's shim of a version that `pyenv global` does not name fails;
    # `pyenv whence` and `pyenv prefix` say where that version lives.
    fake_python(bin_dir, "python3", "3.13.0")
    fake_python(bin_dir, "python3.12", "", runs=False)
    prefix = tmp_path / "versions" / "3.12.1"
    (prefix / "bin").mkdir(parents=True)
    real = fake_python(prefix / "bin", "python3.12", "3.12.1")
    pyenv = bin_dir / "pyenv"
    pyenv.write_text(textwrap.dedent("""\
        #!/bin/sh
        case "$1 $2" in
            "whence python3.12") echo 3.12.0; echo 3.12.1 ;;
            "prefix 3.12.1") echo {prefix} ;;
            *) exit 1 ;;
        esac
        """).format(prefix=prefix))
    pyenv.chmod(0o755)
    result = chooser(bin_dir, "choose", "python3", "file")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(real)
    assert chooser(bin_dir, "find", "3.12").stdout.strip() == str(real)
    assert chooser(bin_dir, "find", "3.11").returncode == 1


def test_with_no_supported_python_make_stops_at_once_with_what_to_install(bin_dir, tmp_path):
    if MAKE is None:
        pytest.skip("make is not installed here")
    fake_python(bin_dir, "python3", "3.13.0")
    venv = tmp_path / "venv"
    started = time.monotonic()
    result = subprocess.run([MAKE, "-C", str(ROOT), "demo", "VENV=%s" % venv],
                            env={"PATH": str(bin_dir), "HOME": str(tmp_path)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=60)
    assert result.returncode != 0
    assert time.monotonic() - started < 30
    assert not venv.exists()
    message = result.stderr
    assert "python3 is Python 3.13.0, which tmpi does not run on, and no python3.12 or " \
           "python3.11 was found" in message, message
    assert "compiles its C code against numpy 1.x" in message  # why not 3.13
    for way in ("apt install", "pyenv install 3.12", "conda create", "uv python install 3.12"):
        assert way in message, message
    assert "Traceback" not in message


def test_a_python_named_with_python_is_used_or_refused_naming_the_ones_found(bin_dir):
    fake_python(bin_dir, "python3", "3.11.7")
    fake_python(bin_dir, "python3.12", "3.12.1")
    fake_python(bin_dir, "python3.13", "3.13.0")
    result = chooser(bin_dir, "choose", "python3.12", "command line")
    assert result.returncode == 0 and result.stdout.strip() == str(bin_dir / "python3.12")
    result = chooser(bin_dir, "choose", "python3.13", "command line")
    assert result.returncode == 2 and not result.stdout
    assert "PYTHON=python3.13 is Python 3.13.0; tmpi runs on Python 3.11 and 3.12." in result.stderr
    assert "Found here: python3.12 (Python 3.12.1" in result.stderr
    result = chooser(bin_dir, "choose", "python9", "command line")
    assert result.returncode == 2 and "PYTHON=python9 does not run here" in result.stderr


def test_an_existing_venv_of_another_python_than_the_one_named_is_refused(bin_dir, tmp_path):
    fake_python(bin_dir, "python3.11", "3.11.7")
    fake_python(bin_dir, "python3.12", "3.12.1")
    venv = tmp_path / "venv"
    made = chooser(bin_dir, "venv", venv, "python3.11", "command line")
    assert made.returncode == 0 and (venv / "bin" / "python").is_file(), made.stderr
    assert chooser(bin_dir, "venv", venv, "python3", "file").returncode == 0
    assert chooser(bin_dir, "venv", venv, "python3.11", "command line").returncode == 0
    result = chooser(bin_dir, "venv", venv, "python3.12", "command line")
    assert result.returncode == 2
    assert "was made with Python 3.11.7, and PYTHON=python3.12 is Python 3.12.1" in result.stderr
    assert "VENV=.venv312" in result.stderr


def test_make_setup_py_and_the_readme_name_the_same_pythons():
    text = CHOOSER.read_text()
    assert re.search(r'^SUPPORTED="([^"]+)"', text, re.M).group(1).split() == \
        sorted(SUPPORTED, reverse=True)
    setup = (ROOT / "setup.py").read_text()
    assert 'python_requires=">=%s,<3.13"' % SUPPORTED[0] in setup
    assert SUPPORTED[-1] == "3.12"
    assert "Python 3.11 and 3.12" in (ROOT / "README.md").read_text()


def test_pip_on_an_unsupported_python_names_the_supported_ones(tmp_path):
    """A real interpreter outside the range (pyenv's 3.13 or 3.10, where there
    is one): pip refuses tmpi's wheel by python_requires, and none of the
    requirements that would have pip build an sdist first (Theano, numpy,
    scipy, scikit-learn) applies there."""
    found = {}
    for version in ("3.13", "3.10"):
        result = run(["/bin/sh", CHOOSER, "find", version])
        if result.returncode == 0:
            found[version] = result.stdout.strip()
    if not found:
        pytest.skip("no Python 3.13 or 3.10 here to try pip with")
    check(run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
               "--no-build-isolation", "-w", tmp_path, ROOT]))
    wheel, = tmp_path.glob("tmpi_adapters-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist()
                                     if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(": ", 1)[1] for line in metadata.splitlines()
                if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    for version, python in found.items():
        result = run([python, "-m", "pip", "install", "--dry-run", "--no-deps", "--no-index",
                      wheel])
        assert result.returncode != 0
        assert re.search(r"requires a different Python: \S+ not in '<3.13,>=3.11'",
                         result.stderr), result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        applies = check(run([python, "-c", textwrap.dedent("""\
            import sys
            from pip._vendor.packaging.requirements import Requirement
            for line in sys.argv[1:]:
                r = Requirement(line)
                if r.marker is None or r.marker.evaluate():
                    print(r.name.lower())
            """)] + requires)).stdout.split()
        if version == "3.13":
            assert not {"theano", "numpy", "scipy", "scikit-learn"} & set(applies), applies


# -- the shims: what Python 3.12 and numpy 1.24 removed, on this interpreter ----------

SHIMS_PROBE = textwrap.dedent("""\
    import sys, warnings
    import tmpi_adapters.process.compat as compat
    getattr(compat, sys.argv[1])()
    import numpy as np
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (np.bool, np.int, np.float, np.complex, np.object, np.str) == (
            bool, int, float, complex, object, str)
        assert np.long is int and np.unicode is str and np.typeDict is np.sctypeDict
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        np.int
    assert [w.category for w in caught] == [DeprecationWarning], caught
    try:
        np.no_such_name
    except AttributeError:
        pass
    else:
        raise AssertionError("np.no_such_name")
    import numpy.distutils, numpy.distutils.__config__, numpy.distutils.system_info
    assert np.get_include() in numpy.distutils.misc_util.get_numpy_include_dirs()
    import distutils.sysconfig, distutils.spawn
    assert distutils.sysconfig.get_python_inc()
    assert distutils.spawn.find_executable("sh")
    import configparser, io
    parser = configparser.SafeConfigParser()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parser.readfp(io.StringIO("[a]\\nb = 1\\n"))
    assert parser.get("a", "b") == "1"
    import imp
    module = imp.load_source("shim_probe_source", sys.argv[2])
    assert module.VALUE == 42 and sys.modules["shim_probe_source"] is module
    found = imp.find_module("shim_probe_source_found", [sys.argv[3]])
    loaded = imp.load_module("shim_probe_source_found", *found)
    assert loaded.VALUE == 42 and found[0].closed
    import json
    assert imp.reload(json) is json and imp.new_module("m").__name__ == "m"
    assert (".py", "r", imp.PY_SOURCE) in imp.get_suffixes()
    import unittest
    class Old(unittest.TestCase):
        def test_old_names(self):
            self.assertEquals(1, 1)
            self.assertNotEquals(1, 2)
            self.failUnless(True)
            self.failIf(False)
            self.assert_(True)
            self.assertRegexpMatches("abc", "b")
            with self.assertRaisesRegexp(ValueError, "x"):
                raise ValueError("x")
            self.assertDictContainsSubset({"a": 1}, {"a": 1, "b": 2})
            with self.assertRaises(AssertionError):
                self.assertDictContainsSubset({"a": 2}, {"a": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = unittest.TextTestRunner(stream=io.StringIO()).run(
            unittest.defaultTestLoader.loadTestsFromTestCase(Old))
    assert result.wasSuccessful(), result.errors + result.failures
    print("shims ok")
    """)


@pytest.mark.parametrize("how", ["apply", "install"])
def test_the_shims_restore_what_old_scripts_use_and_leave_the_rest(tmp_path, how):
    source = tmp_path / "probe_source.py"
    source.write_text("VALUE = 42\n")
    shutil.copy(source, tmp_path / "shim_probe_source_found.py")
    env = dict(os.environ, THEANO_FLAGS="blas.ldflags=")
    result = check(run([sys.executable, "-c", SHIMS_PROBE, how, source, tmp_path], env=env))
    assert "shims ok" in result.stdout


def test_old_docstrings_run_as_quietly_as_on_3_11(tmp_path):
    # "\\s" in a docstring: a DeprecationWarning on 3.11 (hidden), a SyntaxWarning
    # on 3.12 at every run; the user's own -W still shows it.
    script = tmp_path / "old.py"
    script.write_text('"""A docstring with \\\\sigma in it."""\nprint("ran")\n'
                      .replace("\\\\", "\\"))
    assert "\\sigma" in script.read_text()
    code = ("import runpy, sys, tmpi_adapters.process.compat as c; c.apply(); "
            "runpy.run_path(sys.argv[1])")
    result = check(run([sys.executable, "-c", code, script], env=dict(os.environ)))
    assert result.stdout == "ran\n" and "invalid escape" not in result.stderr, result.stderr
    result = check(run([sys.executable, "-W", "default", "-c", code, script],
                       env=dict(os.environ)))
    assert "invalid escape sequence" in result.stderr
