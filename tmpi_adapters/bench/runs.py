"""Running the benchmark's processes: their environment, their results, the machine.

Every part of `tmpi bench` runs as processes of its own (a plain script, a
``tmpi wrap`` job, an ``mpiexec`` job of one of the rank-side modules), so
that each is measured the way a user would run it.  This module starts them
with one environment (the BLAS threads asked for, float32 Theano, the
benchmark's own compile cache), reads what they hand back (the ``bench-steps``
line of :mod:`tmpi_adapters.bench.models`, a ``--record`` file, a JSON result
written by :func:`write_result`), and says what machine it all ran on.
"""
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys

from tmpi_adapters.errors import TmpiError

COMPILEDIR_ENV = "TMPI_BENCH_COMPILEDIR"
#: BLAS/OpenMP thread settings a run's threads are given by (and pocl's, the
#: OpenCL device on the CPU, which starts a thread per core otherwise).
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
              "POCL_MAX_PTHREAD_COUNT")
#: Seconds any one process of the benchmark may take.
TIMEOUT = 1800


def bench_compiledir():
    """Theano's compile cache for the benchmark's runs.

    A cache of its own: a timed run must never wait on the compile lock of
    some other Theano process working in the shared one.
    """
    return os.environ.get(COMPILEDIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "tmpi", "theano-bench")


def bench_environment(threads=1, extra=None, device=False):
    """The environment of a benchmark process: ``threads`` BLAS threads
    (``None``: the libraries' own default, as users run a script), float32
    Theano, the benchmark's compile cache, no inherited tmpi options; on the
    CPU unless ``device`` (then on the device ``THEANO_FLAGS`` names)."""
    env = dict(os.environ)
    for name in THREAD_ENV:
        if threads is None:
            env.pop(name, None)
        else:
            env[name] = str(threads)
    drop = ("floatX=", "base_compiledir=", "compiledir=") + (() if device else ("device=",))
    flags = [f for f in env.get("THEANO_FLAGS", "").split(",")
             if f and not f.strip().startswith(drop)]
    env["THEANO_FLAGS"] = ",".join(flags + ["floatX=float32",
                                            "base_compiledir=" + bench_compiledir()])
    env.pop("TMPI_OPTIONS", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


def run(command, what, threads=1, env=None, device=False):
    """Run ``command``; its stdout, or a :class:`TmpiError` naming ``what``
    failed.  Interrupted (Ctrl-C, SIGTERM, :data:`TIMEOUT`), it stops the
    process first (:func:`stop`)."""
    process = start(command, env or bench_environment(threads, device=device))
    stdout, stderr = communicate(process, command, what)
    if process.returncode != 0:
        raise TmpiError("the %s benchmark failed (exit %d): %s\n%s" % (
            what, process.returncode, " ".join(shlex.quote(str(c)) for c in command),
            (stderr or stdout)[-3000:]))
    return stdout


#: Seconds a process of the benchmark has to end after SIGTERM (``tmpi wrap``
#: stops its ranks then) before it is killed.
STOP_GRACE = 10


def start(command, env):
    """Start one process of the benchmark, its output in pipes."""
    return subprocess.Popen([str(c) for c in command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def communicate(process, command, what, timeout=TIMEOUT):
    """``(stdout, stderr)`` of ``process`` once it ends; stops it on the way
    out when the benchmark is interrupted or it runs past ``timeout``."""
    try:
        return process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(process)
        raise TmpiError("the %s benchmark did not finish within %d s: %s" % (
            what, timeout, " ".join(shlex.quote(str(c)) for c in command))) from None
    except BaseException:
        stop(process)
        raise


def stop(process):
    """End ``process``: SIGTERM (a ``tmpi wrap`` then stops its ranks), and
    SIGKILL after :data:`STOP_GRACE` seconds."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def python():
    return sys.executable


def tool(name):
    """A console script installed beside this Python (``tmpi``, ``mpiexec``)."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.access(candidate, os.X_OK) else name


def mpiexec():
    from tmpi_adapters.launch.launcher import find_mpiexec
    return find_mpiexec()


def models_script():
    """The path of :mod:`tmpi_adapters.bench.models`, run as a user's script."""
    from tmpi_adapters.bench import models
    return models.__file__


def read_json(path):
    with open(path) as handle:
        return json.load(handle)


def write_result(path, result):
    """Write a part's ``result`` to ``path`` as JSON, whole or not at all.

    The rank-side parts (:mod:`tmpi_adapters.bench.exchange`,
    :mod:`tmpi_adapters.bench.scaling`) run as processes of their own and
    hand their results back this way; a part that dies half-way leaves no
    file that reads as a result.
    """
    from tmpi_adapters.files import write_atomic
    write_atomic(path, json.dumps(result, indent=1))


def parse_steps(stdout):
    """The ``bench-steps`` record a models run printed last."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("bench-steps "):
            return json.loads(line[len("bench-steps "):])
    raise TmpiError("the model printed no bench-steps line:\n%s" % stdout[-2000:])


def read_record(path, last=None):
    """The step records of a ``--record`` file (the ``last`` ones only)."""
    with open(path) as handle:
        steps = [r for r in map(json.loads, handle) if r.get("type") == "step"]
    return steps[-last:] if last else steps


def split_of(steps):
    """Medians of the time split of ``steps`` (records of :func:`read_record`)."""
    return {key: statistics.median(s[key] for s in steps)
            for key in ("compute_s", "comm_s", "wait_s", "data_s")}


def paired_ratio(numerators, denominators, factor=1.0):
    """Median over pairs of ``factor * numerator / denominator``, and its range.

    The two values of a pair were measured next to each other, under the
    same load: their ratio cancels the machine's slow swings.
    """
    ratios = sorted(factor * a / b for a, b in zip(numerators, denominators))
    return statistics.median(ratios), [ratios[0], ratios[-1]]


def interleaved(rounds, variants):
    """``(round, name)`` in the order the variants run: each round in turn
    forwards and backwards (ABBA), so that a drift of the machine's speed
    favours none of them."""
    names = list(variants)
    for r in range(rounds):
        for name in (names if r % 2 == 0 else names[::-1]):
            yield r, name


def machine():
    """What the numbers were measured on."""
    info = {"system": platform.system(), "kernel": platform.release(),
            "machine": platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import numpy
        info["numpy"] = numpy.__version__
        from mpi4py import MPI
        info["mpi"] = MPI.Get_library_version().splitlines()[0].strip()
    except ImportError:
        pass
    try:  # Theano's version without importing it here (it configures itself on import)
        from importlib.metadata import version
        info["theano"] = version("Theano")
    except Exception:
        pass
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = [round(v, 2) for v in os.getloadavg()]
    return info
