"""What runs inside each rank: output routing, the user's script, failures.

``python -m tmpi_adapters.launch.runtime SCRIPT [ARGS...]`` (or ``-m MODULE
[ARGS...]``) is what ``tmpi wrap`` starts on every rank (options arrive in
``TMPI_OPTIONS``).  The script runs as ``python SCRIPT`` would run it: same
``sys.argv``, same ``sys.path``, and its exit status is the rank's.
"""
import atexit
import codecs
import contextlib
import functools
import io
import os
import runpy
import socket
import sys
import sysconfig
import time
import traceback

from tmpi_adapters.launch import compat
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.options import Options

JOB_DIR_ENV = "TMPI_JOB_DIR"

#: The stderr that failures are reported on, even when a rank's own stderr
#: has been sent to a log file.
_report_fd = 2

#: Under a bare ``mpiexec`` (no ``tmpi wrap`` gathering reports) a failing
#: rank other than 0 waits this long before it reports: when rank 0 fails
#: too (the same error everywhere, the usual case) its abort ends the job
#: first and the error is printed once.
REPORT_GRACE = 2.0


def mpi_rank_size():
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def job_dir():
    return os.environ.get(JOB_DIR_ENV)


def rank_file(directory, rank, kind):
    """``<directory>/rank<N>.<kind>``: the files a rank leaves for the launcher.

    ``pid`` (``"<pid> <host>"``, written at start), ``stderr`` (non-zero
    ranks' stderr), ``done`` (the script finished), ``exit`` (the script
    ended with a non-zero ``sys.exit``; holds the status), ``failed`` (a
    failure was reported and the job is being aborted).
    """
    return os.path.join(directory, "rank%d.%s" % (rank, kind))


def mark(rank, kind, text=""):
    """Leave ``rank<N>.<kind>`` in the job directory (no-op outside ``tmpi wrap``)."""
    directory = job_dir()
    if not directory:
        return
    try:
        os.makedirs(directory, exist_ok=True)
        with open(rank_file(directory, rank, kind), "w") as handle:
            handle.write(text)
    except OSError:
        pass  # the launcher only loses a detail of its final message


def route_output(options, rank, size):
    """Only rank 0's output reaches the terminal unless ``all_ranks_output``.

    Other ranks' stdout goes to /dev/null and their stderr to
    ``$TMPI_JOB_DIR/rank<N>.stderr`` (kept for failure reports); with
    ``all_ranks_output`` every rank prints, each line prefixed ``[rank N]``.
    """
    global _report_fd
    if size == 1:
        return
    if rank != 0:
        refuse_stdin(rank)
    if options.all_ranks_output:
        # Through the launcher's relay where there is one (it prefixes whole
        # lines: mpiexec forwards output in 64 KiB pieces that interleave
        # ranks mid-line); else through mpiexec, prefixed here.
        relayed = _to_relay(rank)
        prefix = "" if relayed else "[rank %d] " % rank
        sys.stdout = rank_prefix_stream(sys.stdout, prefix)
        sys.stderr = rank_prefix_stream(sys.stderr, prefix)
        return
    if rank == 0:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    _report_fd = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    directory = job_dir()
    target = rank_file(directory, rank, "stderr") if directory else os.devnull
    if directory:
        # On other machines of a multi-node job the launcher's directory does
        # not exist; the file then stays local to that machine.
        os.makedirs(directory, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def refuse_stdin(rank):
    """Reading standard input on a rank other than 0 is an error, not a hang.

    ``mpiexec`` forwards the terminal's input to rank 0 only; the other
    ranks' standard input is a pipe nothing ever writes to, so ``input()``
    there would wait for ever.  Their ``sys.stdin`` raises instead, and
    descriptor 0 reads as empty (``/dev/null``) for code below Python.
    """
    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
    except OSError:
        return
    sys.stdin = _RefusedStdin(rank)


class _RefusedStdin(io.TextIOWrapper):
    """``sys.stdin`` of a rank other than 0: empty, and reading it says why."""

    def __init__(self, rank):
        super().__init__(io.FileIO(0, "r", closefd=False))
        self._rank = rank

    def _refuse(self, *args, **kwargs):
        raise TmpiError(
            "rank %d read standard input, which mpiexec gives to rank 0 only (the other "
            "ranks would wait for ever). Read the input on rank 0 and share it (e.g. "
            "mpi4py's comm.bcast), or pass it as a file or an argument; each rank may "
            "read a file." % self._rank)

    read = readline = readlines = __next__ = _refuse

    def __iter__(self):
        return self


#: The relay's pipes in the job directory, one per rank and stream.
RELAY_FILE = "%s.relay"


def _to_relay(rank):
    """Send this rank's stdout and stderr (descriptors 1 and 2, so that
    C code's output goes too) to the launcher's relay pipes, when it made
    them on this machine; ``False`` when there are none."""
    directory = job_dir()
    if not directory:
        return False
    paths = [rank_file(directory, rank, RELAY_FILE % name) for name in ("stdout", "stderr")]
    try:
        fds = [os.open(path, os.O_WRONLY | os.O_NONBLOCK) for path in paths]
    except OSError:
        return False  # another machine, or no relay
    sys.stdout.flush()
    sys.stderr.flush()
    for target, fd in zip((1, 2), fds):
        os.set_blocking(fd, True)  # a full pipe waits for the launcher, as a terminal does
        os.dup2(fd, target)
        os.close(fd)
    return True


def rank_prefix_stream(stream, prefix):
    """Wrap a text stream so that it writes whole lines, each starting with
    ``prefix`` (``"[rank N] "``, or nothing when the launcher adds it).

    Whole lines only: ``print(a, b)`` writes its pieces one by one, and other
    ranks' lines would land between them.  A partial line waits for its end
    (or :func:`flush_partial_lines`, or the end of the process).  Bytes
    written to its ``buffer`` (``sys.stdout.buffer``) are lines too.
    """

    class Prefixed:
        def __init__(self):
            self._partial = ""
            self.buffer = _LinesOfBytes(self, getattr(stream, "buffer", None))

        def write(self, text):
            pending = self._partial + text
            cut = pending.rfind("\n") + 1
            self._partial = pending[cut:]
            if cut:
                lines = pending[:cut - 1].split("\n")
                stream.write("".join("%s%s\n" % (prefix, line) for line in lines))
                stream.flush()
            return len(text)

        def end_partial_line(self):
            if self._partial:
                partial, self._partial = self._partial, ""
                stream.write("%s%s\n" % (prefix, partial))
                stream.flush()

        def __getattr__(self, name):
            return getattr(stream, name)

    prefixed = Prefixed()
    _prefixed.append(prefixed)
    return prefixed


class _LinesOfBytes:
    """The ``buffer`` of a :func:`rank_prefix_stream`: bytes decoded into it."""

    def __init__(self, text, raw):
        self._text, self._raw = text, raw
        self._decoder = codecs.getincrementaldecoder(
            getattr(text, "encoding", None) or "utf-8")("replace")

    def write(self, data):
        self._text.write(self._decoder.decode(bytes(data)))
        return len(data)

    def flush(self):
        self._text.flush()

    def __getattr__(self, name):
        return getattr(self._raw, name)


#: Streams made by :func:`rank_prefix_stream` (their partial lines are
#: written out when the process ends).
_prefixed = []


@atexit.register
def flush_partial_lines():
    """Write out what the ``[rank N]`` streams hold of an unfinished line."""
    for stream in _prefixed:
        try:
            stream.end_partial_line()
        except (OSError, ValueError):
            pass


def report(text):
    """Write a failure report where the user sees it."""
    data = (text if text.endswith("\n") else text + "\n").encode("utf-8", "replace")
    try:
        os.write(_report_fd, data)
    except OSError:
        pass


#: tmpi's own package (installed, or an editable checkout's).
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

#: Where installed libraries, tmpi and the standard library live: their
#: frames are summarised in failure reports, so the traceback shows the
#: user's code.
_LIBRARY_DIRS = tuple(sorted({os.path.realpath(p) + os.sep for p in (
    sysconfig.get_paths().get("purelib"), sysconfig.get_paths().get("platlib"),
    sysconfig.get_paths().get("stdlib"), _PACKAGE_DIR) if p}))


@functools.lru_cache(maxsize=4096)
def is_library_frame(filename):
    """True for a file of tmpi, the standard library or an installed package."""
    return os.path.realpath(filename).startswith(_LIBRARY_DIRS) or filename.startswith("<")


def user_traceback(error):
    """The traceback of ``error`` with library frames folded into one line each run.

    tmpi's own frames, the standard library's and installed packages' (Theano,
    numpy, mpi4py) say nothing the user can act on; the user's frames stay.
    """
    frames = traceback.extract_tb(error.__traceback__)
    lines, hidden = ["Traceback (most recent call last):\n"], []
    for frame in frames:
        if is_library_frame(frame.filename):
            hidden.append(frame)
            continue
        if hidden and len(lines) > 1:  # frames before the user's (runpy, tmpi) say nothing
            lines.append("  ... %d frame(s) inside libraries\n" % len(hidden))
        hidden = []
        lines.extend(traceback.format_list([frame]))
    if hidden and len(lines) > 1:
        lines.append("  ... %d frame(s) inside libraries, from %s\n"
                     % (len(hidden), _library_name(hidden[-1].filename)))
    if len(lines) == 1:
        return ""
    return "".join(lines)


def _library_name(filename):
    real = os.path.realpath(filename)
    if real.startswith(_PACKAGE_DIR + os.sep):
        return "tmpi"
    for prefix in _LIBRARY_DIRS:
        if real.startswith(prefix):
            rest = real[len(prefix):].split(os.sep)
            return rest[0] if rest[0] not in ("site-packages", "dist-packages") else rest[1]
    return os.path.basename(filename)


def _first_line(error, limit=2000):
    """The exception's message, cut where libraries append pages of debugging hints."""
    text = str(error)
    for marker in ("\nApply node that caused the error", "\nHINT:", "\nBacktrace when"):
        text = text.split(marker, 1)[0]
    return text if len(text) <= limit else text[:limit] + " ..."


def describe_failure(error, rank, size):
    """The paragraph a user sees for an exception that ended a rank."""
    where = "" if size == 1 else " (rank %d)" % rank
    if isinstance(error, KeyboardInterrupt):
        return "tmpi: interrupted%s" % where
    if isinstance(error, TmpiError):
        # Raised inside a compiled function, it carries Theano's notes on the node.
        return "tmpi: error%s: %s" % (where, _first_line(error))
    if isinstance(error, OSError) and error.filename is not None:
        return ("%stmpi: rank %d of %d failed: the script could not use %r: %s. Paths are "
                "relative to the working directory %s." % (
                    user_traceback(error), rank, size, error.filename,
                    error.strerror or error, os.getcwd()))
    return "%stmpi: rank %d of %d failed: %s: %s" % (
        user_traceback(error), rank, size, type(error).__name__, _first_line(error))


def fail(error, rank, size):
    """Report ``error`` and end the whole job with a non-zero status.

    Under ``tmpi wrap`` only rank 0 speaks for itself: the same error usually
    happens on every rank, and the launcher repeats the first failed rank's
    report (from its ``failed`` file) when no report reached the terminal.
    """
    code = 130 if isinstance(error, KeyboardInterrupt) else getattr(error, "exit_code", 1)
    text = describe_failure(error, rank, size)
    # mpiexec may end the job on MPI_Abort before it has forwarded a report.
    mark(rank, "failed", text)
    flush_partial_lines()
    if size > 1 and rank != 0 and not job_dir():
        time.sleep(REPORT_GRACE)  # rank 0's abort, if it fails too, comes first
    if rank == 0 or size == 1 or not job_dir():
        report(text)
    if size > 1:
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(code)
    sys.exit(code)


def finish_after_failure(session, error):
    """Finish ``session``, if it started, telling the plugins of ``error``.

    A failure while finishing is dropped: ``error`` is the one to report.
    """
    if session is not None and session.started:
        try:
            session.finish(error=error)
        except BaseException:  # noqa: B902 - the first error is the one reported
            pass


def end_after_failure(session, error, rank, size):
    """What every front door does when the user's code fails on a rank:
    :func:`finish_after_failure`, then :func:`fail` (report, end the job)."""
    finish_after_failure(session, error)
    fail(error, rank, size)


def quiet_compile_lock(options, size):
    """Theano's notes that a process waits for the compile cache's lock
    (``INFO (theano.gof.compilelock)``) are about tmpi's own ranks waiting
    for each other: kept out of the output unless every rank's is shown."""
    if size > 1 and not options.all_ranks_output:
        import logging
        # A filter, not a level: Theano sets the logger's level when it loads.
        logging.getLogger("theano.gof.compilelock").addFilter(
            lambda record: record.levelno > logging.INFO)


def import_theano_in_rank_order(options, rank, size):
    """Import Theano on rank 0 first so a cold compile cache is built once."""
    quiet_compile_lock(options, size)
    if options.compile_dirs == "per-rank":
        base = os.environ.get("TMPI_COMPILE_BASE") or os.path.join(
            os.path.expanduser("~"), ".theano")
        os.environ["THEANO_FLAGS"] = compat.theano_flags(
            base_compiledir=os.path.join(base, "tmpi-rank%d" % rank))
    if size == 1 or options.compile_dirs == "per-rank":
        import theano  # noqa: F401
        return
    if rank == 0:
        import theano  # noqa: F401,F811
        wait_for_every_rank(options, size)
    else:
        wait_for_every_rank(options, size)
        import theano  # noqa: F401,F811


def wait_for_every_rank(options, size):
    """The start-up meeting of all ranks, with the stall timeout as deadline."""
    from mpi4py import MPI

    from tmpi_adapters.errors import StallError
    from tmpi_adapters.exchangers.waiting import oversubscribed, wait_for

    def too_long(what, waited, frame):
        cores = os.cpu_count() or 1
        raise StallError(
            "not every one of the %d ranks started within %.0f s (--start-timeout). "
            "%sCheck the launcher's options (--mpiexec, --mpiexec-arg), or give the "
            "ranks more time with --start-timeout." % (
                size, waited, "%d ranks share %d cores here, so each starts slowly: use "
                "fewer ranks (-n). " % (size, cores) if size > 2 * cores else ""))

    wait_for(MPI.COMM_WORLD.Ibarrier().Test, "the start of every rank", options.start_timeout,
             too_long, crowded=oversubscribed(size))


def take_decorator_options(options, target, rank):
    """Start with the options the script's ``@distributed(...)`` sets, for
    every option the command line did not name (those win, said once)."""
    try:
        with open(target_file(target), encoding="utf-8", errors="replace") as handle:
            source = handle.read()
    except (OSError, TmpiError):
        return
    if "distributed" not in source:
        return
    declared, _ = declared_options(source)
    overridden = apply_declared(options, declared, set(options.explicit))
    if overridden and rank == 0:
        print("tmpi: note: the command line wins over the decorator for %s."
              % ", ".join("%s (%r, not %r)" % (key, ours, theirs)
                          for key, (ours, theirs) in sorted(overridden.items())),
              file=sys.stderr, flush=True)


#: The decorator's parameters before ``**options``, in order.
_POSITIONAL = ("framework", "rule", "rule_options")


def declared_options(source):
    """The options a script's ``@distributed(...)`` sets, read from its text
    without running it: ``(options, unread)``.

    ``tmpi wrap`` starts its session before the script runs, so it reads the
    decorator's literal arguments here (``rule="easgd"``, ``seed=1``,
    ``rule_options={"tau": 4}``) and starts with them; ``unread`` names the
    arguments that are not literals (a variable), which it cannot know.
    """
    import ast
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}, []
    found, unread = {}, set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name != "distributed":
            continue
        named = list(zip(_POSITIONAL, call.args)) + [
            (k.arg, k.value) for k in call.keywords if k.arg]
        for key, value in named:
            try:
                value = ast.literal_eval(value)
            except ValueError:
                unread.add(key)
                continue
            if key in found and found[key] != value:
                unread.add(key)  # two calls that disagree: which one runs is not known
            found.setdefault(key, value)
    return {k: v for k, v in found.items() if k not in unread}, sorted(unread)


def apply_declared(options, declared, explicit):
    """``options`` with the decorator's ``declared`` values for every option
    the command line did not set (``explicit``: the fields and plugin
    options it named); returns the options the command line overrode."""
    import dataclasses
    known = {f.name for f in dataclasses.fields(Options)}
    overridden = {}
    for key, value in declared.items():
        if key in explicit:
            current = getattr(options, key, None) if key in known else options.extra.get(key)
            if current != value:
                overridden[key] = (current, value)
            continue
        if key == "rule_options":
            options.rule_options = dict(value or {}, **options.rule_options)
        elif key in known:
            setattr(options, key, value)
        else:
            options.extra[key] = value
    options.validate()
    return overridden


def detect_framework(target, pm=None):
    """The framework a script (a path) or module (``("module", name)``) uses,
    from the ``tmpi_detect_framework`` hook; a module inside a package is read
    with its package's other modules (its ``__main__`` often only imports them)."""
    from tmpi_adapters.pluginmanager import get_plugin_manager
    pm = pm or get_plugin_manager()
    kind, name = as_target(target)
    if kind == "module":
        try:
            path, in_package = find_module(name)
        except TmpiError:
            return None
        files = _package_files(path) if in_package else [path]
    else:
        path, files = name, [name]
    sources = []
    for file in files:
        try:
            with open(file, encoding="utf-8", errors="replace") as handle:
                sources.append(handle.read())
        except OSError:
            continue
    if not sources:
        return None
    return pm.hook.tmpi_detect_framework(source="\n".join(sources), path=path)


def _package_files(path, most=100):
    directory = os.path.dirname(path)
    names = sorted(n for n in os.listdir(directory) if n.endswith(".py"))[:most]
    return [path] + [os.path.join(directory, n) for n in names
                     if os.path.join(directory, n) != path]


# -------------------------------------------------------- running it as python does

def as_target(target):
    """``("script", path)`` or ``("module", name)``; a bare path is a script."""
    if isinstance(target, (tuple, list)):
        return tuple(target)
    return ("script", os.fspath(target))


def target_argv(target):
    """The words naming ``target`` on a command line: ``[SCRIPT]`` or ``["-m", MODULE]``."""
    kind, name = as_target(target)
    return ["-m", name] if kind == "module" else [name]


def module_path0():
    """What ``python -m`` puts first on ``sys.path``: the working directory."""
    return os.getcwd()


def script_path0(script):
    """What ``python SCRIPT`` puts first on ``sys.path``: the script's directory
    (symbolic links resolved)."""
    return os.path.dirname(os.path.realpath(script))


def find_module(name):
    """``(file, in_package)`` of what ``python -m NAME`` would run, found the
    way Python finds it (the working directory first on the path) without
    importing anything: the user's packages run only on the ranks, after tmpi
    has hooked the framework.  :class:`TmpiError` when there is none."""
    import importlib.machinery
    import importlib.util
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise TmpiError("-m %s: not a module name (use a dotted name such as package.train, "
                        "without .py)." % name)
    saved = list(sys.path)
    sys.path[:] = [module_path0()] + [p for p in sys.path[1:]]
    try:
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else \
            getattr(sys.modules[parts[0]], "__spec__", None)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[:i + 1]), list(locations)) if locations else None
    if spec is None:
        raise TmpiError("no module named %s (looked in the working directory %s and the "
                        "installed packages, as python -m does)." % (name, os.getcwd()))
    if spec.submodule_search_locations is not None:
        main = importlib.machinery.PathFinder.find_spec(
            name + ".__main__", list(spec.submodule_search_locations))
        if main is None or not main.origin:
            raise TmpiError("no module named %s.__main__: %r is a package and cannot be run "
                            "directly (python -m needs %s/__main__.py)." % (name, name, name))
        return main.origin, True
    if not spec.origin or not os.path.isfile(spec.origin):
        raise TmpiError("module %s has no source file to run (%s)." % (name, spec.origin))
    return spec.origin, len(parts) > 1


def target_file(target):
    """The file that runs: the script, or the module's source."""
    kind, name = as_target(target)
    return find_module(name)[0] if kind == "module" else os.path.abspath(name)


@contextlib.contextmanager
def as_python_runs(target, args):
    """``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT ARGS`` (or ``python
    -m MODULE ARGS``) would set them, instead of this process's own, until
    the block ends."""
    kind, name = as_target(target)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [target_file(target) if kind == "module" else name] + list(args)
    if not getattr(sys.flags, "safe_path", False):  # python -P adds no first entry
        first = module_path0() if kind == "module" else script_path0(name)
        if sys.path:
            sys.path[0] = first
        else:
            sys.path.append(first)
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def exit_status(code):
    """The process status ``sys.exit(code)`` gives (a message is status 1)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def run_target(target):
    """Run ``target`` as ``__main__`` (inside :func:`as_python_runs`); returns
    ``None`` when it returned, the ``SystemExit`` that ended it otherwise."""
    kind, name = as_target(target)
    try:
        if kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(name), run_name="__main__")
    except SystemExit as exit_:
        return exit_
    return None


def parse_argv(argv):
    """``(target, args)`` from ``SCRIPT ARGS...`` or ``-m MODULE ARGS...``."""
    if argv[0] == "-m" and len(argv) > 1:
        return ("module", argv[1]), argv[2:]
    return ("script", argv[0]), argv[1:]


def main(argv=None):
    """Entry point of one rank: run the script, then end with its exit status."""
    compat.apply()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        sys.exit("usage: python -m tmpi_adapters.launch.runtime (SCRIPT | -m MODULE) [ARGS...]")
    target, args = parse_argv(argv)
    options = Options.from_env()
    rank, size = mpi_rank_size()
    route_output(options, rank, size)
    session = None
    try:
        mark(rank, "pid", "%d %s" % (os.getpid(), socket.gethostname()))
        take_decorator_options(options, target, rank)
        if not options.framework:
            options.framework = detect_framework(target) or "theano"
        import_theano_in_rank_order(options, rank, size)
        from tmpi_adapters.core.session import Session
        with as_python_runs(target, args):  # until the final checkpoint is written
            session = Session(options, script=target_file(target)).start()
            ended = run_target(target)
            code = 0 if ended is None else exit_status(ended.code)
            if ended is not None and not isinstance(ended.code, (int, type(None))):
                print(ended.code, file=sys.stderr, flush=True)  # as python does
            if code == 0:
                session.finish()
            else:
                # A deliberate exit (pytest's status, argparse's 2): the
                # script's status, no failure report, no end-of-run exchanges.
                finish_after_failure(session, ended)
    except BaseException as error:  # noqa: B902 - every failure must end the job
        end_after_failure(session, error, rank, size)
    mark(rank, "done" if code == 0 else "exit", str(code))
    flush_partial_lines()
    sys.exit(code)


if __name__ == "__main__":
    # Run the importable module, not this ``__main__`` copy of it, so state set
    # here (the report descriptor) is the state other modules see.
    from tmpi_adapters.launch.runtime import main as _main
    _main()
