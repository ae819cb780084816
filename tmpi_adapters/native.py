"""C code tmpi compiles on first use with the system C compiler (the one
Theano already needs), cached by the hash of its source and the machine.

The fp16/bf16 conversion kernels (:mod:`tmpi_adapters.exchangers.codecs`),
the progress thread of overlapped exchanges
(:mod:`tmpi_adapters.exchangers.progress`) and the benchmark's delay line
are built here.  ``$TMPI_CACHE_DIR`` (default ``~/.cache/tmpi``) keeps them.
"""
import hashlib
import os
import platform
import subprocess
import sys
import sysconfig
import tempfile

CACHE_ENV = "TMPI_CACHE_DIR"


def cache_dir():
    """Where compiled code is kept (made when missing)."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "tmpi")
    os.makedirs(base, exist_ok=True)
    return base


def compiler():
    """The C compiler: ``$CC``, Python's own, else ``cc``."""
    return (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()[0]


def build(source, name, flags=("-O2",), library=True):
    """The path of ``source`` compiled as a shared library (``library``) or an
    executable named ``name-<hash>``, built once and then reused.  Building is
    atomic, since ranks may race.  Raises :class:`OSError` or
    :class:`subprocess.CalledProcessError` (its ``stderr`` says why) when no
    compiler can build it."""
    key = hashlib.sha1((source + " ".join(flags) + platform.machine() + sys.version)
                       .encode()).hexdigest()[:16]
    path = os.path.join(cache_dir(), "%s-%s%s" % (name, key, ".so" if library else ""))
    if os.path.exists(path):
        return path
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as tmp:
        source_path, target = os.path.join(tmp, name + ".c"), os.path.join(tmp, name)
        with open(source_path, "w") as handle:
            handle.write(source)
        shared = ["-shared", "-fPIC"] if library else []
        subprocess.run([compiler()] + list(flags) + shared + ["-o", target, source_path],
                       check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.replace(target, path)
    return path
