"""Files a script writes, on N ranks: the one rule, for every framework.

Every rank runs the whole script, so every rank may reach each of its
writes.  The rule:

* the *k*-th write of the **same path** on one host happens **once**: the
  first rank to reach it writes, the ranks that reach it later write into
  ``os.devnull``, and each of those continues only after the write is
  **complete**, so a file the script reads back right after writing it is
  whole on every rank, and the writer's outcome (an error included) is every
  rank's outcome;
* a path **only one rank writes** (a ``tempfile`` name, a path made from the
  rank or the process id, a write under ``if rank == 0:``) is simply written by
  that rank: nobody waits for it, and it waits for nobody (but for the one
  bounded pause below).

No rank ever waits for another rank to *reach* a write, so a write reached by
some ranks only (rank 0 saving a model, or raising a flag, while the others
train) never blocks or fails.

How: each rank counts its own writes of each absolute path (*k* = 1, 2, ...).
The ranks of one host share a directory of small state files, one per path
(``writes/`` in the job directory of ``tmpi wrap``; otherwise a directory in
:func:`tempfile.gettempdir` named from a token rank 0 hands out when the rule
is installed, removed by the last rank of the host to end its session).  A
rank reaching its *k*-th write of a path takes an exclusive ``flock`` on the
path's state file: if no rank has claimed generation *k* yet, it claims it and
writes (for ``open``, the real file is opened while the lock is held, so an
error opening it is recorded for the others); otherwise it has arrived later.
The writer records the generation complete when the file is closed (``open``)
or the writer returns (the other writers).  A later rank's ``open`` returns at
once with a file whose bytes go nowhere, and its ``close`` waits until the
generation is complete (a log opened at the start and closed at the end does
not hold up training); a later rank's other writers wait before returning.
Those waits are for a write already under way, never for another rank to
reach one; one that passes ``--stall-timeout`` is a stall naming the path and
the writer.  The one pause besides: under a lockstep rule, where the ranks
reach a shared write together and which is first is chance, a rank other than
0 that is first leaves rank 0 at most :data:`PRECEDENCE_SECONDS` to claim it,
so that such files are usually written by rank 0, and then writes itself (a
path whose earlier writes rank 0 never reached is not deferred again).

Paths are compared as absolute paths on the same host (a node-local ``/tmp``
on another machine is another file).  The counts are per rank, so a script
whose ranks write one path different numbers of times (a path written by
rank 0 alone, later by every rank) has its later writes matched by count, not
by line.

What is seen: what the script itself calls (never Theano's compile cache or
what a library writes for itself), from the main thread of the rank's own
process:

``open``/``io.open``/``Path.open`` in a write mode (``w``, ``a``, ``x``; text or binary)
    the file is complete when the script closes it.
``os.mkdir``, ``os.makedirs``, ``os.rename``, ``os.replace``, ``os.remove``, ``os.unlink``, ``os.rmdir``
    a user's atomic write (write a temporary file, rename it) stays whole;
    a call naming two paths counts as a write of that pair.
``numpy.save``/``savez``/``savez_compressed``/``savetxt``, PIL's ``Image.save``, ``Path.write_text``/``write_bytes``/``mkdir``
    libraries that open the file for the script.
framework writers
    Keras' ``save_model``/``save_weights`` call :meth:`FileWrites.call` with
    the paths they write, and ``CSVLogger`` opens its file under
    :meth:`FileWrites.seeing`.

Read-write modes (``r+``, ``w+``) and file descriptors are left alone: the
ranks that do not write could not read such a file.  Nothing is installed on
one rank, and nothing runs per training step.
"""
import builtins
import contextlib
import fcntl
import functools
import hashlib
import inspect
import io
import os
import pickle
import secrets
import shutil
import socket
import sys
import tempfile
import threading

from tmpi_adapters.frameworks.closing import layered
from tmpi_adapters.process.failure import is_library_frame
from tmpi_adapters.process.channel import CHANNEL_ENV
from tmpi_adapters.process.jobdir import job_dir

#: tmpi's own files (its checkpoints, its records) are written by tmpi's rules.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep

#: Writers a script calls with paths: ``(module, attribute, path parameters)``.
_CALLS = (
    ("os", "mkdir", ("path",)), ("os", "makedirs", ("name",)), ("os", "rmdir", ("path",)),
    ("os", "remove", ("path",)), ("os", "unlink", ("path",)),
    ("os", "rename", ("src", "dst")), ("os", "replace", ("src", "dst")),
    ("numpy", "save", ("file",)), ("numpy", "savez", ("file",)),
    ("numpy", "savez_compressed", ("file",)), ("numpy", "savetxt", ("fname",)),
    ("pathlib", "Path.write_text", ("self",)), ("pathlib", "Path.write_bytes", ("self",)),
    ("pathlib", "Path.mkdir", ("self",)),
    ("PIL.Image", "Image.save", ("fp",)),
)

#: Generations of a path whose outcome its state file keeps: a rank further
#: behind than this finds the write long complete.
_KEPT = 64
#: The state directory in the job directory, and the prefix of tmpi's own one.
_JOB_SUBDIR = "writes"
_OWN_PREFIX = "tmpi-writes-"
#: The outcome of a write that completed without error.
_OK = ("ok", None)
#: Seconds a rank other than 0, first at a write under a lockstep rule, leaves
#: rank 0 to claim it (see :meth:`FileWrites._defer`).
PRECEDENCE_SECONDS = 0.1


@functools.lru_cache(maxsize=4096)
def _is_user_file(filename):
    return not (is_library_frame(filename) or os.path.realpath(filename).startswith(_PACKAGE))


def is_path(value):
    """True for what ``open`` takes as a path (not a file descriptor or object)."""
    return isinstance(value, (str, bytes, os.PathLike))


def _write_mode(mode):
    """True for ``open`` modes that only write: ``w``, ``a``, ``x``, with ``b`` or ``t``."""
    if not isinstance(mode, str) or len(mode) > 2:
        return False
    rest = mode.replace("b", "", 1) if "t" not in mode else mode.replace("t", "", 1)
    return rest in ("w", "a", "x")


class _State:
    """One path's generations on this host (kept in its state file).

    Attributes
    ----------
    claimed : int
        The last generation some rank has claimed (writes or wrote).
    writers : dict
        ``{generation: rank}`` of the last :data:`_KEPT` generations.
    done : dict
        ``{generation: ("ok", result) or ("error", exception)}``: the
        generations complete, of the last :data:`_KEPT`.
    ranks : set
        The ranks that have reached a write of the path.
    """

    __slots__ = ("claimed", "writers", "done", "ranks")

    def __init__(self):
        self.claimed, self.writers, self.done, self.ranks = 0, {}, {}, set()

    def outcome(self, generation):
        """Generation ``generation``'s outcome, or ``None`` while it is written."""
        if generation <= self.claimed - _KEPT:
            return _OK   # long complete
        return self.done.get(generation)

    def trim(self):
        oldest = self.claimed - _KEPT
        for table in (self.writers, self.done):
            for generation in [g for g in table if g <= oldest]:
                del table[generation]


class _StateFile:
    """A path's state file, locked (``flock``) while it is read and changed."""

    def __init__(self, path):
        self.path = path

    @contextlib.contextmanager
    def locked(self, exclusive=True, fd=None):
        """The :class:`_State`, under the lock; changes are saved when
        ``exclusive``.  ``fd``: the file, already open (a wait polls it)."""
        own = fd is None
        if own:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                state = self._read(fd)
                try:
                    yield state
                finally:
                    if exclusive:
                        state.trim()
                        data = pickle.dumps((state.claimed, state.writers, state.done,
                                             state.ranks), protocol=4)
                        os.ftruncate(fd, 0)
                        os.pwrite(fd, data, 0)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            if own:
                os.close(fd)

    @staticmethod
    def _read(fd):
        state = _State()
        chunks, offset = [], 0
        while True:
            chunk = os.pread(fd, 1 << 16, offset)
            if not chunk:
                break
            chunks.append(chunk)
            offset += len(chunk)
        if chunks:
            state.claimed, state.writers, state.done, state.ranks = pickle.loads(
                b"".join(chunks))
        return state


class FileWrites:
    """The rule for one session's file writes (see the module docstring).

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    """

    def __init__(self, session):
        self.session = session
        self.host = socket.gethostname()
        self._pid = os.getpid()
        self._thread = threading.main_thread()
        self._depth = 0     # > 0 while a writer runs: what it calls itself is its own business
        self._seeing = 0    # > 0 while a framework's writer opens its files as the script would
        self._open = None
        self._counts = {}   # state file -> this rank's writes of its path so far
        self._directory = None   # where the host's ranks keep the state files
        self._own_directory = False   # tmpi's own (removed at the end), not the job's
        self._local_ranks = 1
        self._installed = False
        self._writing = {}  # (state file, generation) -> its _StateFile: files this rank writes

    # -- installing -------------------------------------------------------------
    def install(self, patcher):
        """Hook ``open`` and the writers of :data:`_CALLS` (undone by ``patcher.restore()``,
        which also ends the rule: see :attr:`installed`); modules not imported
        yet are hooked when they are.  Called by every rank at the same point
        (the session's start): without a job directory, rank 0 hands out the
        name of the state directory."""
        from tmpi_adapters.process import compat
        self._directory, self._own_directory, self._local_ranks = self._state_directory()
        patcher.patch(self, "installed", True)
        self._open = builtins.open
        opening = self._opening(self._open)
        patcher.patch(builtins, "open", opening)
        patcher.patch(io, "open", opening)
        for module, attribute, parameters in _CALLS:
            compat.when_imported(module, functools.partial(
                self._hook_call, patcher, attribute, parameters))
        compat.when_imported("pathlib", functools.partial(self._hook_path_open, patcher))
        return self

    @property
    def installed(self):
        """True while the rule is in force; set back to False (by the
        patcher's ``restore``), the rank leaves the host's state directory."""
        return self._installed

    @installed.setter
    def installed(self, value):
        was, self._installed = self._installed, bool(value)
        if was and not value:
            self._leave()

    def _state_directory(self):
        """``(directory, tmpi's own, ranks on this host)``."""
        directory = job_dir()
        # Across machines (--hosts) the launcher's job directory is on one of
        # them only: every rank then takes the way without one (collective).
        if directory and not os.environ.get(CHANNEL_ENV):
            return os.path.join(directory, _JOB_SUBDIR), False, None
        session = self.session
        token = secrets.token_hex(8) if session.rank == 0 else None
        gathered = session.comm.allgather((token, self.host))
        local = sum(1 for _, host in gathered if host == self.host)
        return (os.path.join(tempfile.gettempdir(), _OWN_PREFIX + gathered[0][0]), True,
                local)

    def _leave(self):
        """This rank's session ended: files it still writes count as complete
        (nobody waits past the end of a session for one the script never
        closed), and the last rank of the host to leave removes tmpi's own
        state directory (the job directory is the launcher's)."""
        for (_, generation), state in list(self._writing.items()):
            self._complete(state, generation, _OK, leaving=True)
        if not self._own_directory:
            return
        try:
            os.makedirs(self._directory, mode=0o700, exist_ok=True)
            os.close(os.open(os.path.join(self._directory, "left.%d" % self.session.rank),
                             os.O_WRONLY | os.O_CREAT, 0o600))
            left = [n for n in os.listdir(self._directory) if n.startswith("left.")]
        except OSError:
            return
        if len(left) >= self._local_ranks:
            shutil.rmtree(self._directory, ignore_errors=True)   # hooks undone by now

    def _hook_call(self, patcher, attribute, parameters, module):
        if not self._active():
            return  # the session ended before the module was imported
        owner_name, _, name = attribute.rpartition(".")
        owner = getattr(module, owner_name) if owner_name else module
        original = getattr(owner, name)
        signature = inspect.signature(original)
        writes = self

        @functools.wraps(original)
        def writer(*args, **kwargs):
            if not writes._sees(2):
                return original(*args, **kwargs)
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError:
                return original(*args, **kwargs)
            paths = [bound.arguments.get(p) for p in parameters]
            if not all(is_path(p) for p in paths) or any(
                    bound.arguments.get(k) is not None for k in ("dir_fd", "src_dir_fd",
                                                                 "dst_dir_fd")):
                return original(*args, **kwargs)
            return writes.call("%s.%s" % (module.__name__, attribute), paths,
                               lambda: original(*args, **kwargs), site=_site(2))
        patcher.patch(owner, name, writer)

    def _hook_path_open(self, patcher, pathlib):
        if not self._active():
            return
        original = pathlib.Path.open
        writes = self

        @functools.wraps(original)
        def path_open(path, mode="r", buffering=-1, encoding=None, errors=None, newline=None):
            if not (_write_mode(mode) and writes._sees(2)):
                return original(path, mode, buffering, encoding, errors, newline)
            return writes.open(path, mode, buffering, encoding, errors, newline, site=_site(2))
        patcher.patch(pathlib.Path, "open", path_open)

    def _opening(self, original):
        writes = self

        @functools.wraps(original)
        def open(file, mode="r", buffering=-1, encoding=None, errors=None, newline=None,
                 closefd=True, opener=None):
            if not (_write_mode(mode) and is_path(file) and writes._sees(2)):
                return original(file, mode, buffering, encoding, errors, newline, closefd,
                                opener)
            return writes.open(file, mode, buffering, encoding, errors, newline, opener=opener,
                               site=_site(2))
        return open

    # -- who is seen ----------------------------------------------------------------
    def _active(self):
        from tmpi_adapters.core.session import active_session
        return self._installed and active_session() is self.session

    def _here(self):
        return threading.current_thread() is self._thread and os.getpid() == self._pid

    def _sees(self, depth):
        """True when the call ``depth`` frames up is the script's own, on the
        main thread of this rank's process, outside another writer."""
        return (self._depth == 0 and self._installed and self._here()
                and (self._seeing > 0
                     or _is_user_file(sys._getframe(depth).f_code.co_filename)))

    @contextlib.contextmanager
    def seeing(self):
        """While active, files opened for writing follow the rule whoever
        opens them (a framework's writer, such as Keras' ``CSVLogger``)."""
        self._seeing += 1
        try:
            yield
        finally:
            self._seeing -= 1

    # -- the rule -------------------------------------------------------------------
    def _generation(self, paths):
        """``(state file, generation)`` of this rank's next write of ``paths``."""
        names = [os.path.abspath(os.fsdecode(os.fspath(p))) for p in paths]
        digest = hashlib.sha1("\0".join([self.host] + names).encode(
            "utf-8", "surrogateescape")).hexdigest()
        # As a writer runs: unseen even while a framework's writer is seen.
        self._run(functools.partial(os.makedirs, self._directory, mode=0o700, exist_ok=True))
        state = _StateFile(os.path.join(self._directory, digest))
        generation = self._counts.get(state.path, 0) + 1
        self._counts[state.path] = generation
        return state, generation

    def call(self, what, paths, run, site=None):
        """``run()`` (which writes ``paths``) under the rule: on this rank if it
        is the first to reach this write, else not; returns once the write is
        complete, with its result (``None`` on the ranks that did not write,
        unless it is a number or a string), or raises the writer's error."""
        if not self._active():
            return run()
        site = site or _site(1)
        state, generation = self._generation(paths)
        self._defer(state, generation)
        with state.locked() as shared:
            shared.ranks.add(self.session.rank)
            writes = shared.claimed < generation
            if writes:
                shared.claimed = generation
                shared.writers[generation] = self.session.rank
            else:
                outcome = shared.outcome(generation)
        if writes:
            try:
                result = self._run(run)
            except BaseException as exc:  # noqa: B902 - the ranks that wait raise it too
                self._complete(state, generation, ("error", _picklable(exc)))
                raise
            simple = result if isinstance(result, (int, float, str)) else None
            self._complete(state, generation, ("ok", simple))
            return result
        if outcome is None:
            outcome = self._await(state, generation, "%s of %s at %s" % (
                what, ", ".join(repr(os.fspath(p)) for p in paths), site))
        return _result(outcome)

    def open(self, file, mode="w", buffering=-1, encoding=None, errors=None, newline=None,
             opener=None, site=None):
        """``open(file, mode, ...)`` for writing, under the rule: the first rank
        to reach this write opens the file; the ranks that reach it later get
        a file whose bytes go nowhere, whose ``close`` waits until the
        writer's file is closed."""
        site = site or _site(1)
        state, generation = self._generation([file])
        self._defer(state, generation)
        with state.locked() as shared:
            shared.ranks.add(self.session.rank)
            if shared.claimed < generation:
                shared.claimed = generation
                shared.writers[generation] = self.session.rank
                try:
                    written = layered(file, mode, buffering, encoding, errors, newline, opener,
                                       functools.partial(self._complete, state, generation,
                                                         _OK))
                except BaseException as exc:  # noqa: B902 - the ranks that come later raise it too
                    shared.done[generation] = ("error", _picklable(exc))
                    raise
                self._writing[state.path, generation] = state
                return written
            outcome = shared.outcome(generation)
        if outcome is not None:
            _result(outcome)    # the writer could not open it: neither can this rank
        what = "open(%r, %r) at %s" % (os.fspath(file), mode, site)
        return layered(os.devnull, mode.replace("x", "w"), buffering, encoding, errors,
                        newline, None, functools.partial(self._closed, state, generation, what),
                        name=file)

    def _defer(self, state, generation):
        """Rank 0's precedence: under a lockstep rule the ranks reach a shared
        write together, and which is first is chance; a rank other than 0
        that finds generation ``generation`` unclaimed leaves rank 0
        :data:`PRECEDENCE_SECONDS` to claim it, so that files are usually
        written by rank 0.  Never for a path whose earlier writes rank 0 did
        not reach (a path of this rank's own pays it once), never under an
        asynchronous rule, and never longer: then this rank writes."""
        rank = self.session.rank
        if rank == 0 or getattr(self.session.rule, "exchanges", None) != "gradients":
            return
        with state.locked() as shared:
            shared.ranks.add(rank)
            if shared.claimed >= generation or (generation > 1 and 0 not in shared.ranks):
                return
        from tmpi_adapters.exchangers.waiting import wait_for
        fd = os.open(state.path, os.O_RDWR | os.O_CREAT, 0o600)

        def claimed():
            with state.locked(exclusive=False, fd=fd) as shared:
                return shared.claimed >= generation

        def over(what, waited, frame):
            raise _PrecedenceOver()
        try:
            wait_for(claimed, "rank 0's precedence", PRECEDENCE_SECONDS, over)
        except _PrecedenceOver:
            pass
        finally:
            os.close(fd)

    def _run(self, run):
        self._depth += 1
        try:
            return run()
        finally:
            self._depth -= 1

    def _complete(self, state, generation, outcome, leaving=False):
        """The writer's generation ``generation`` is complete, with ``outcome``."""
        self._writing.pop((state.path, generation), None)
        if not (self._installed or leaving):
            return   # the rank has left the state directory
        try:
            with state.locked() as shared:
                shared.done[generation] = outcome
        except OSError:
            pass    # the directory is gone: nobody is left to wait

    def _closed(self, state, generation, what):
        """A rank that did not write closed its file: it continues once the
        writer's file is closed (unless tmpi's own code dropped the file, as
        the garbage collector may while tmpi waits on the writer itself)."""
        if not (self._active() and self._here()):
            return
        try:
            caller = sys._getframe(2).f_code.co_filename
        except ValueError:
            return   # closed from no Python code at all
        if os.path.realpath(caller).startswith(_PACKAGE):
            return
        outcome = self._await(state, generation, what)
        _result(outcome)

    def _await(self, state, generation, what):
        """Wait until another rank's write of generation ``generation`` is
        complete; returns its outcome."""
        from tmpi_adapters.exchangers.waiting import oversubscribed, wait_for
        seen = {"outcome": None, "writer": None}
        fd = os.open(state.path, os.O_RDWR | os.O_CREAT, 0o600)

        def complete():
            with state.locked(exclusive=False, fd=fd) as shared:
                seen["outcome"] = shared.outcome(generation)
                seen["writer"] = shared.writers.get(generation)
            return seen["outcome"] is not None

        def describe():
            writer = seen["writer"]
            return "rank %s to finish %s" % ("?" if writer is None else writer, what)

        try:
            wait_for(complete, describe, self.session.options.stall_timeout, self._stalled,
                     crowded=oversubscribed(self.session.size))
        finally:
            os.close(fd)
        return seen["outcome"]

    def _stalled(self, what, waited, frame):
        if self.session._stalled(what, waited, frame):
            return
        from tmpi_adapters.errors import StallError
        raise StallError("rank %d waited %.0f s for %s; the writer never completed it."
                         % (self.session.rank, waited, what))


class _PrecedenceOver(Exception):
    """Rank 0 did not claim a write in :data:`PRECEDENCE_SECONDS`."""


def _result(outcome):
    """The writer's result, or its error raised."""
    status, value = outcome
    if status == "error":
        raise value
    return value


def _site(depth):
    """``script.py:LINE``: the script's own frame nearest the one ``depth``
    frames up (a framework's writer is named by the script's line calling it)."""
    frame = first = sys._getframe(depth)
    while frame is not None and not _is_user_file(frame.f_code.co_filename):
        frame = frame.f_back
    frame = frame or first
    return "%s:%d" % (os.path.basename(frame.f_code.co_filename), frame.f_lineno)


def _picklable(error):
    """``error`` itself when it survives pickling, else a RuntimeError saying it."""
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: B902 - any pickling failure
        return RuntimeError("%s: %s" % (type(error).__name__, error))

