"""Checkpoints written atomically on rank 0, and a resume that equals an uninterrupted run.

What a checkpoint holds
-----------------------
The state of every training function's model (parameters, optimizer state,
model state, in the script's own order), the rule's ``state_dict()``, what
plugins return from ``tmpi_checkpoint_state``, the random number generators
(numpy's global one, Python's ``random``, Theano's shared random streams), the
session seed, step and epoch counters, and the *call log*: every call the
script made to its compiled Theano functions, with what each returned (the
metrics history) and a fingerprint of its arguments.

How an unmodified script resumes
--------------------------------
A script cannot be told to start at epoch 7: its loop starts at 0.  So with
``--resume`` the script runs again from its start, with the checkpoint's seed,
and tmpi *replays* it: the first ``C`` calls of compiled functions (``C`` is
where the checkpoint was taken) do no work and return what they returned in the
original run, so the script's own loop, random draws, accumulators and
decisions (learning-rate schedules, early stopping) retrace the original run
exactly.  At the start of call ``C`` the saved state is loaded into the
script's own shared variables, the generators are set, and training continues
for real.  Parameters then follow the uninterrupted run bit for bit on the same
number of ranks, and to rounding on another (BSP is exact in the rank count).

A checkpoint is taken at the start of the call after the one that made it due
(or when the script ends), so what it saves of the generators is what the
next call will see.  Each replayed call is checked against the log (the same
function, arguments with the same fingerprint): a script that does not retrace
its run (other arguments, other data, unseeded randomness) is stopped with a
clear error instead of silently continuing somewhere else.

Replay cannot answer for: functions with updates that are not training
functions (they really run), outputs larger than :data:`MAX_RECORDED_BYTES`
(the function really runs on the not yet restored parameters), and values the
script reads from shared variables itself during the replayed part.
"""
import array
import copy
import hashlib
import itertools
import json
import os
import random
import re
import sys
import time
import zlib

import numpy as np

from tmpi_adapters.errors import CheckpointError, ConfigError
from tmpi_adapters.pluginmanager import hookimpl

MAGIC = b"TMPI-CHECKPOINT\n"
FORMAT = 1
NAME = "checkpoint-step%08d.tmpi"
PATTERN = re.compile(r"^checkpoint-step(\d+)\.tmpi$")

#: Outputs of one call larger than this are not kept in the call log.
MAX_RECORDED_BYTES = 64 * 1024

#: Bytes of each array argument that go into a call's fingerprint.
FINGERPRINT_BYTES = 2048


# ------------------------------------------------------------------ the file

def encode(state, header):
    """``MAGIC``, one JSON header line (with the payload's size and sha256), the payload."""
    import pickle
    payload = pickle.dumps(state, protocol=4)
    header = dict(header, format=FORMAT, payload=len(payload),
                  sha256=hashlib.sha256(payload).hexdigest())
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


def decode(data, path):
    """``(header, state)`` from the bytes of a checkpoint; :class:`CheckpointError` if
    they are not one, are cut short, or do not match their checksum."""
    import pickle
    if not data.startswith(MAGIC):
        raise CheckpointError("%s is not a tmpi checkpoint (it does not start with %r). "
                              "Pass a checkpoint-step*.tmpi file written by "
                              "--checkpoint-dir." % (path, MAGIC.strip().decode()))
    end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC):end].decode())
        size, digest = int(header["payload"]), header["sha256"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CheckpointError("checkpoint %s is corrupt: its header cannot be read. Resume "
                              "from an older checkpoint in the same directory." % path)
    if header.get("format", 0) > FORMAT:
        raise CheckpointError("checkpoint %s has format %s, newer than this tmpi reads "
                              "(%d): upgrade tmpi-adapters." % (path, header["format"], FORMAT))
    payload = data[end + 1:]
    if len(payload) != size:
        raise CheckpointError("checkpoint %s is corrupt: truncated (%d of %d bytes). Resume "
                              "from an older checkpoint in the same directory."
                              % (path, len(payload), size))
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CheckpointError("checkpoint %s is corrupt: its checksum does not match. Resume "
                              "from an older checkpoint in the same directory." % path)
    try:
        state = pickle.loads(payload)
    except Exception as exc:  # noqa: B902 - any unpickling failure means the same
        raise CheckpointError("checkpoint %s cannot be loaded (%s: %s); it may come from "
                              "another version of tmpi or its libraries."
                              % (path, type(exc).__name__, exc))
    return header, state


def read_bytes(path):
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except IsADirectoryError:
        raise CheckpointError("--resume %s is a directory: pass a checkpoint file, or "
                              "--checkpoint-dir %s --resume latest." % (path, path))
    except OSError as exc:
        raise CheckpointError("cannot read checkpoint %s: %s." % (path, exc.strerror or exc))


def write_atomic(directory, name, data):
    """Write ``data`` to ``directory/name`` so a crash never leaves a partial file there.

    The bytes go to a temporary file in the same directory, are flushed and
    fsynced, and the file is renamed over ``name`` (atomic on POSIX); the
    directory is fsynced so the rename itself survives a power cut.
    """
    final = os.path.join(directory, name)
    temporary = os.path.join(directory, ".%s.%d.partial" % (name, os.getpid()))
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, final)
    except OSError as exc:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise CheckpointError("cannot write checkpoint %s: %s. Check --checkpoint-dir "
                              "and the free space there." % (final, exc.strerror or exc))
    try:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is done
    return final


def remove_stale_partials(directory):
    """Delete ``.partial`` files left by writers that died mid-write."""
    from tmpi_adapters.launch.launcher import process_alive
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        match = re.match(r"^\.checkpoint-step\d+\.tmpi\.(\d+)\.partial$", name)
        if match and not process_alive(int(match.group(1))):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def list_checkpoints(directory):
    """Checkpoint files in ``directory``, oldest first (by time written, then name)."""
    try:
        names = [n for n in os.listdir(directory) if PATTERN.match(n)]
    except OSError:
        return []
    paths = [os.path.join(directory, n) for n in names]

    def written(path):
        try:
            return (os.stat(path).st_mtime_ns, path)
        except OSError:
            return (0, path)
    return sorted(paths, key=written)


def latest_checkpoint(directory):
    found = list_checkpoints(directory)
    return found[-1] if found else None


# ---------------------------------------------------------------- the call log

def fingerprint(args, kwargs):
    """A cheap checksum of a call's arguments: shapes, dtypes, and the first and
    last :data:`FINGERPRINT_BYTES` bytes of every array (a reshuffled batch shows
    there), plus the text of other values."""
    crc = 0
    items = list(args) + [v for _, v in sorted(kwargs.items())]
    for value in items:
        if isinstance(value, np.ndarray):
            crc = zlib.crc32(("%s%s" % (value.shape, value.dtype.str)).encode(), crc)
            if value.size and not value.dtype.hasobject:  # pointers differ run to run
                flat = value.reshape(-1) if value.flags.c_contiguous else \
                    np.ascontiguousarray(value[:2]).reshape(-1)
                count = max(1, FINGERPRINT_BYTES // max(flat.itemsize, 1))
                crc = zlib.crc32(np.ascontiguousarray(flat[:count]).tobytes(), crc)
                crc = zlib.crc32(np.ascontiguousarray(flat[-count:]).tobytes(), crc)
        elif isinstance(value, (int, float, str, bytes, bool, np.generic)) or value is None:
            crc = zlib.crc32(repr(value).encode(), crc)
        else:
            crc = zlib.crc32(type(value).__name__.encode(), crc)
    return crc


def _element_kind(value):
    """How one returned element is stored in a column, or ``None`` (kept whole)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        shape = "0d"
    elif isinstance(value, np.generic):
        shape = "scalar"
    elif isinstance(value, bool):
        return ("bool", "b")
    elif isinstance(value, int):
        return ("int", "q")
    elif isinstance(value, float):
        return ("float", "d")
    else:
        return None
    dtype = value.dtype
    if dtype.kind == "f" and dtype.itemsize <= 8:
        return (shape, dtype.str, "d")
    if dtype.kind in "iub" and dtype.itemsize <= 8 and dtype.str not in ("<u8", ">u8"):
        return (shape, dtype.str, "q")
    return None


def template_of(value):
    """``(container, element kinds)`` of a returned value, or ``None``."""
    if isinstance(value, (list, tuple)):
        container, elements = type(value).__name__, value
    else:
        container, elements = "single", [value]
    kinds = tuple(_element_kind(e) for e in elements)
    if any(k is None for k in kinds):
        return None
    return container, kinds


def _column_value(kind, number):
    if kind[0] == "bool":
        return bool(number)
    if kind[0] == "int":
        return int(number)
    if kind[0] == "float":
        return float(number)
    dtype = np.dtype(kind[1])
    return np.array(number, dtype=dtype) if kind[0] == "0d" else dtype.type(number)


def _recorded_bytes(value):
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_recorded_bytes(v) for v in value)
    return 64


class CallLog:
    """Every call of the script's compiled functions, in order, and what it returned.

    Returned values of the usual shape (scalars, or lists of scalars, the same
    every call) are kept in one typed column per element, 8 bytes a value;
    other values whole, up to :data:`MAX_RECORDED_BYTES` a call.
    """

    NOT_RECORDED, WHOLE = -1, -2

    def __init__(self):
        self.keys = []
        self._key_ids = {}
        self.sequence = array.array("i")      # key id of each call
        self.rows = array.array("q")          # row in the key's columns, or a marker
        self.fingerprints = array.array("I")
        self.templates = {}                   # key id -> template
        self.columns = {}                     # key id -> [array per element]
        self.whole = {}                       # call index -> value

    def __len__(self):
        return len(self.sequence)

    def append(self, key, print_, value, record=True):
        key_id = self._key_ids.get(key)
        if key_id is None:
            key_id = self._key_ids[key] = len(self.keys)
            self.keys.append(key)
        row = self.NOT_RECORDED
        if record:
            row = self._store(key_id, value)
        self.sequence.append(key_id)
        self.rows.append(row)
        self.fingerprints.append(print_ & 0xFFFFFFFF)

    def _store(self, key_id, value):
        template = self.templates.get(key_id)
        if template is None and key_id not in self.columns:
            template = template_of(value)
            if template is not None:
                self.templates[key_id] = template
                self.columns[key_id] = [array.array(kind[-1]) for kind in template[1]]
        if template is not None and template_of(value) == template:
            elements = value if template[0] != "single" else [value]
            columns = self.columns[key_id]
            for column, element in zip(columns, elements):
                column.append(element.item() if hasattr(element, "item") else element)
            return len(columns[0]) - 1 if columns else 0
        if _recorded_bytes(value) > MAX_RECORDED_BYTES:
            return self.NOT_RECORDED
        self.whole[len(self.sequence)] = copy.deepcopy(value)
        return self.WHOLE

    def key(self, index):
        return self.keys[self.sequence[index]]

    def value(self, index):
        """``(True, value)`` for a recorded call, ``(False, None)`` otherwise."""
        row = self.rows[index]
        if row == self.NOT_RECORDED:
            return False, None
        if row == self.WHOLE:
            return True, copy.deepcopy(self.whole[index])
        key_id = self.sequence[index]
        container, kinds = self.templates[key_id]
        elements = [_column_value(kind, column[row])
                    for kind, column in zip(kinds, self.columns[key_id])]
        if container == "single":
            return True, elements[0]
        return True, (tuple(elements) if container == "tuple" else list(elements))

    def state(self):
        return {
            "keys": list(self.keys),
            "sequence": np.frombuffer(self.sequence, dtype=np.int32).copy(),
            "rows": np.frombuffer(self.rows, dtype=np.int64).copy(),
            "fingerprints": np.frombuffer(self.fingerprints, dtype=np.uint32).copy(),
            "templates": dict(self.templates),
            "columns": {k: [(c.typecode, c.tobytes()) for c in cols]
                        for k, cols in self.columns.items()},
            "whole": dict(self.whole),
        }

    @classmethod
    def from_state(cls, state):
        log = cls()
        log.keys = list(state["keys"])
        log._key_ids = {k: i for i, k in enumerate(log.keys)}
        log.sequence.frombytes(state["sequence"].astype(np.int32).tobytes())
        log.rows.frombytes(state["rows"].astype(np.int64).tobytes())
        log.fingerprints.frombytes(state["fingerprints"].astype(np.uint32).tobytes())
        log.templates = dict(state["templates"])
        for key_id, columns in state["columns"].items():
            restored = []
            for typecode, data in columns:
                column = array.array(typecode)
                column.frombytes(data)
                restored.append(column)
            log.columns[key_id] = restored
        log.whole = dict(state["whole"])
        return log


# ------------------------------------------------------- Theano's random streams

class RandomStreams:
    """Theano's shared random streams created while the script runs, in order.

    Their generator states are saved with the checkpoint and set again when
    a resume's replay ends.
    """

    CLASSES = (("theano.tensor.shared_randomstreams", "RandomStreams"),
               ("theano.sandbox.rng_mrg", "MRG_RandomStreams"))

    def __init__(self):
        from tmpi_adapters.frameworks.base import Patcher
        self.streams = []
        self.patcher = Patcher()

    def install(self):
        from tmpi_adapters.launch import compat
        for module, name in self.CLASSES:
            compat.when_imported(module, lambda m, name=name: self._track(getattr(m, name)))

    def _track(self, cls):
        original = cls.__init__
        streams = self.streams

        def __init__(stream, *args, **kwargs):
            original(stream, *args, **kwargs)
            streams.append(stream)
        __init__.__wrapped__ = original
        self.patcher.patch(cls, "__init__", __init__)

    def uninstall(self):
        self.patcher.restore()

    def state(self):
        states = []
        for stream in self.streams:
            seeds = stream.gen_seedgen.get_state() if hasattr(stream, "gen_seedgen") else \
                np.array(stream.rstate, copy=True)
            states.append({"class": type(stream).__name__, "seeds": seeds,
                           "states": [copy.deepcopy(update[0].get_value(borrow=True))
                                      for update in stream.state_updates]})
        return states

    def restore(self, states):
        if len(states) != len(self.streams):
            raise CheckpointError(
                "the checkpoint has %d Theano random streams, this run created %d by the "
                "point it was taken: the script does not retrace its run."
                % (len(states), len(self.streams)))
        for stream, saved in zip(self.streams, states):
            if len(saved["states"]) != len(stream.state_updates):
                raise CheckpointError("a Theano random stream has %d random variables in "
                                      "the checkpoint and %d here."
                                      % (len(saved["states"]), len(stream.state_updates)))
            if hasattr(stream, "gen_seedgen"):
                stream.gen_seedgen.set_state(saved["seeds"])
            else:
                stream.rstate = np.array(saved["seeds"], copy=True)
            # (variable, update) pairs; MRG streams add size and stream count.
            for update, value in zip(stream.state_updates, saved["states"]):
                update[0].set_value(copy.deepcopy(value), borrow=True)


# ------------------------------------------------------------- the checkpointer

class Replay:
    """A resume in progress: the checkpoint's state and its call log."""

    def __init__(self, path, header, state):
        self.path = path
        self.header = header
        self.state = state
        self.log = CallLog.from_state(state["log"])
        self.calls = int(state["point"]["calls"])
        self.models = {m["name"]: m for m in state["models"]}
        self.checked = set()
        self.recomputed = set()
        self.started = None  # the first replayed call


class Checkpointer:
    """Writes checkpoints on rank 0 and resumes runs on every rank.

    Installed as the session's call interceptor: it sees every call of the
    script's compiled functions, counts steps and epochs, records the call
    log, writes checkpoints when due, and during a resume replays calls.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    settings : tmpi_adapters.reliability.plugin.Settings
    control : mpi4py communicator or None
        A communicator of tmpi's own for sharing the checkpoint on resume.
    """

    def __init__(self, session, settings, control=None):
        self.session = session
        self.settings = settings
        self.rank, self.size = session.rank, session.size
        self.control = control
        self.directory = settings.checkpoint_dir
        self.writer = self.rank == 0 and bool(self.directory)
        if settings.checkpoint_every is None:
            from tmpi_adapters.reliability.plugin.plugin import DEFAULT_MAX_GAP, DEFAULT_MIN_GAP
            self.every, self.unit = 1, "epochs"
            self.min_gap, self.max_gap = DEFAULT_MIN_GAP, DEFAULT_MAX_GAP
        else:
            self.every, self.unit = settings.checkpoint_every
            self.min_gap, self.max_gap = 0.0, None
        self.log = CallLog() if self.writer else None
        self.streams = RandomStreams()
        self.replay = None
        self.calls = 0
        self.train_calls = 0
        self.epochs = 0
        self.due = False
        self.written = []
        self.last_written = None
        self.resumed_from = None
        self._last_kind = None
        self._last_time = time.monotonic()
        self._seen_models = set()
        self._answer = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self):
        if self.writer:
            try:
                os.makedirs(self.directory, exist_ok=True)
            except OSError as exc:
                raise CheckpointError("cannot create --checkpoint-dir %s: %s."
                                      % (self.directory, exc.strerror or exc))
            remove_stale_partials(self.directory)
        self.streams.install()
        if self.settings.resume:
            self._begin_resume()
        return self

    @hookimpl
    def tmpi_before_finish(self, session):
        """Every rank, when the script returns: finish a replay that is still going."""
        if session is self.session and self.replay is not None:
            if self.calls < self.replay.calls:
                raise CheckpointError(
                    "the script ended after %d calls of its compiled functions, but %s was "
                    "written after %d. Resume runs the script again from its start, so it "
                    "needs the same script, arguments and data."
                    % (self.calls, self.replay.path, self.replay.calls))
            self._finish_replay()

    def end(self, error):
        """Session end: write the final checkpoint (when the script succeeded)."""
        try:
            if error is None and self.writer:
                self.write("end")
        finally:
            self.streams.uninstall()

    # -- every call -------------------------------------------------------------------
    @hookimpl(wrapper=True)
    def tmpi_call(self, session, call):
        """Around every call: count it, write a checkpoint that fell due before
        it, log it; during a resume, check it against the log (the answer
        comes from :meth:`replayed_call`)."""
        if session is not self.session:
            return (yield)
        replay = self.replay
        if replay is not None:
            if self.calls < replay.calls:
                self._answer = self._replayed(call)
                try:
                    value = yield
                finally:
                    self._answer = None
                self.calls += 1
                self._count_after(call.kind)
                self.due = False
                return value
            self._finish_replay()
        self._count_before(call.kind)
        if self.due and self.writer:
            self.write("every")
        print_ = fingerprint(call.args, call.kwargs) if self.log is not None else 0
        value = yield
        if self.log is not None:
            self.log.append(call.function.key, print_, value,
                            record=not getattr(call.function, "has_updates", False))
        self.calls += 1
        self._count_after(call.kind)
        return value

    @hookimpl(specname="tmpi_call", tryfirst=True)
    def replayed_call(self, session, call):
        """A replayed call whose result the log holds: answered without running."""
        answer = self._answer if session is self.session else None
        if answer is not None and answer[0]:
            return answer[1]
        return None

    def _count_before(self, kind):
        if kind != "train" and self._last_kind == "train":
            # The script left its training loop (to validate): an epoch ended.
            self.epochs += 1
            if self.unit == "epochs" and self.epochs % self.every == 0:
                self._make_due()
        self._last_kind = kind

    def _count_after(self, kind):
        if kind == "train":
            self.train_calls += 1
            if self.unit == "steps" and self.train_calls % self.every == 0:
                self._make_due()
        since = time.monotonic() - self._last_time
        if self.unit == "seconds" and since >= self.every or \
                self.max_gap is not None and since >= self.max_gap:
            self.due = True

    def _make_due(self):
        # The default policy writes at most every min_gap seconds after the first.
        if not self.written or time.monotonic() - self._last_time >= self.min_gap:
            self.due = True

    @hookimpl
    def tmpi_after_step(self, session, model, step, samples):
        """Epochs of adapters that know their batches per epoch."""
        if session is not self.session:
            return
        per_epoch = model.n_batch_train
        if per_epoch and self.unit == "epochs" and model.step % per_epoch == 0 and \
                (model.step // per_epoch) % self.every == 0:
            self._make_due()

    # -- writing ----------------------------------------------------------------------------
    def capture(self):
        """Everything a resume needs, as of the start of the next call (rank 0)."""
        session = self.session
        from tmpi_adapters.version import __version__
        plugins = {}
        for part in session.pm.hook.tmpi_checkpoint_state(session=session):
            plugins.update(part or {})
        return {
            "tmpi": __version__,
            "created": time.time(),
            "script": os.path.basename(session.script or ""),
            "arguments": list(sys.argv[1:]),
            "ranks": self.size,
            "rule": session.options.rule,
            "rule_options": dict(session.options.rule_options),
            "scaling": session.options.scaling,
            "seed": session.seed,
            "point": {"calls": self.calls, "train_calls": self.train_calls,
                      "epochs": self.epochs},
            "models": [{
                "name": model.name,
                "step": model.step,
                "signature": model.signature(),
                "values": [v.get_value(borrow=True, return_internal_type=True)
                           for v in model.state_variables],
            } for model in session.models],
            "rule_state": session.rule.state_dict(),
            "plugins": plugins,
            "rng": {"numpy": np.random.get_state(), "random": random.getstate(),
                    "theano": self.streams.state()},
            "log": self.log.state(),
        }

    def write(self, reason):
        state = self.capture()
        header = {key: state[key] for key in ("tmpi", "created", "script", "ranks", "rule")}
        header.update(state["point"])
        path = write_atomic(self.directory, NAME % self.train_calls, encode(state, header))
        if path in self.written:
            self.written.remove(path)
        self.written.append(path)
        self.last_written = path
        self.due = False
        self._last_time = time.monotonic()
        self._prune()
        return path

    def _prune(self):
        """Keep the newest ``--checkpoint-keep`` files this run wrote."""
        while len(self.written) > self.settings.checkpoint_keep:
            try:
                os.unlink(self.written.pop(0))
            except OSError:
                pass

    # -- resuming ------------------------------------------------------------------------------
    def _resume_path(self):
        wanted = self.settings.resume
        if wanted in ("latest", "auto"):
            path = latest_checkpoint(self.directory)
            if path is None and wanted == "latest":
                raise CheckpointError("--resume latest: no checkpoint in %s (files named "
                                      "checkpoint-step*.tmpi). Start without --resume, or "
                                      "use --resume auto to start fresh when there is none."
                                      % self.directory)
            return path
        if not os.path.exists(wanted):
            raise CheckpointError("--resume %s: no such file." % wanted)
        return wanted

    def _load_on_rank0(self):
        """``(path, data, error text)`` on rank 0; checked before it is shared."""
        try:
            path = self._resume_path()
            if path is None:
                return None, None, None
            data = read_bytes(path)
            decode(data, path)
            return path, data, None
        except CheckpointError as error:
            return None, None, str(error)

    def _share(self, path, data, error):
        comm = self.control if self.control is not None else self.session.comm
        if self.size == 1:
            return path, data, error
        from mpi4py import MPI
        path, size, error = comm.bcast((path, len(data) if data else 0, error), root=0)
        if error or path is None:
            return path, None, error
        buffer = data if self.rank == 0 else bytearray(size)
        comm.Bcast([buffer, MPI.BYTE], root=0)
        return path, bytes(buffer), None

    def _begin_resume(self):
        path, data, error = self._load_on_rank0() if self.rank == 0 else (None, None, None)
        path, data, error = self._share(path, data, error)
        if error:
            raise CheckpointError(error)
        if path is None:
            self.session.print("tmpi: --resume auto: no checkpoint in %s yet; starting "
                               "from the beginning." % self.directory)
            return
        header, state = decode(data, path)
        self._check_run(path, state)
        self.replay = Replay(path, header, state)
        self.resumed_from = path
        # The script's own random draws retrace the original run from here.
        seed = state["seed"]
        if self.session.options.seed not in (None, seed):
            self.session.print("tmpi: warning: --seed %s ignored: a resumed run keeps the "
                               "seed of the run it continues (%s)."
                               % (self.session.options.seed, seed))
        if seed is not None:
            self.session.seed = seed
            random.seed(seed)
            np.random.seed(seed % (2 ** 32))
        if self.writer:
            self.log = CallLog.from_state(state["log"])
        self.session.print("tmpi: resuming from %s (step %d, %d rank(s), written %s): "
                           "replaying the first %d calls." % (
                               path, state["point"]["train_calls"], state["ranks"],
                               time.strftime("%Y-%m-%d %H:%M:%S",
                                             time.localtime(state["created"])),
                               self.replay.calls))

    def _check_run(self, path, state):
        options = self.session.options
        if state["rule"] != options.rule:
            raise CheckpointError("checkpoint %s was written by a run with --rule %s; resume "
                                  "it with --rule %s (this run has --rule %s)."
                                  % (path, state["rule"], state["rule"], options.rule))
        if options.scaling == "weak" or state.get("scaling") == "weak":
            raise ConfigError("--resume needs --scaling strong: with weak scaling the global "
                              "batch depends on the rank count and the call grouping.")
        script = os.path.basename(self.session.script or "")
        if state["script"] and script and state["script"] != script:
            self.session.print("tmpi: warning: checkpoint %s was written by %s, this run "
                               "is %s." % (path, state["script"], script))

    def _replayed(self, call):
        """One call inside the replayed part: check it against the log;
        returns ``(recorded, value)`` of the log."""
        function, kind, args, kwargs = call.function, call.kind, call.args, call.kwargs
        replay, index = self.replay, self.calls
        if replay.started is None:
            replay.started = time.monotonic()
        expected = replay.log.key(index)
        if function.key != expected:
            raise CheckpointError(
                "resume diverged at call #%d: the checkpointed run called %s there, this "
                "run calls %s. Resume needs the same script, arguments and data as the "
                "run that wrote %s." % (index + 1, expected, function.key, replay.path))
        if kind == "train" and function.key not in replay.checked:
            self._check_model(function.model)
            replay.checked.add(function.key)
        if fingerprint(args, kwargs) & 0xFFFFFFFF != replay.log.fingerprints[index]:
            raise CheckpointError(
                "resume diverged at call #%d (%s): its arguments differ from the "
                "checkpointed run's. Resume needs the same script, arguments, data and "
                "seed (--seed, or the script's own) as the run that wrote %s."
                % (index + 1, function.key, replay.path))
        self._count_before(kind)
        recorded, value = replay.log.value(index)
        if not recorded:
            replay.recomputed.add(function.key)
        return recorded, value

    def _check_model(self, model):
        saved = self.replay.models.get(model.name)
        if saved is None:
            return  # compiled before the checkpoint but never trained by then
        here = [tuple(row) for row in model.signature()]
        there = [tuple(row) for row in saved["signature"]]
        if here == there:
            return
        for i, (a, b) in enumerate(itertools.zip_longest(there, here)):
            if a != b:
                raise CheckpointError(
                    "checkpoint %s does not fit this model: %s #%d of %s is %s in the "
                    "checkpoint and %s here. Resume with the same script, arguments and "
                    "floatX as the run that wrote it."
                    % (self.replay.path, (a or b)[0], i, model.name, _describe(a),
                       _describe(b)))

    def _finish_replay(self):
        """At the first call past the checkpoint: load the saved state everywhere."""
        replay, session = self.replay, self.session
        state = replay.state
        present = {model.name: model for model in session.models}
        missing = sorted(set(replay.models) - set(present))
        if missing:
            raise CheckpointError("checkpoint %s has training function(s) %s that this run "
                                  "had not compiled by call #%d: the script does not retrace "
                                  "its run." % (replay.path, ", ".join(missing), self.calls))
        for model in session.models:
            saved = replay.models.get(model.name)
            if saved is None:
                continue
            if model.name not in replay.checked:
                self._check_model(model)
            if not model.synchronized:
                session.synchronize(model)  # identical start: signatures, rule.start
            for variable, value in zip(model.state_variables, saved["values"]):
                variable.set_value(value, borrow=False)
            model.step = saved["step"]
        session.rule.load_state_dict(state["rule_state"])
        session.pm.hook.tmpi_restore_state(session=session, state=state["plugins"])
        rng = state["rng"]
        np.random.set_state(rng["numpy"])
        random.setstate(rng["random"])
        self.streams.restore(rng["theano"])
        self.replay = None
        self._last_time = time.monotonic()
        note = ""
        if replay.recomputed:
            note = " (%s ran again: outputs not recorded)" % ", ".join(sorted(replay.recomputed))
        session.print("tmpi: resumed at step %d after replaying %d calls in %.1f s%s."
                      % (state["point"]["train_calls"], replay.calls,
                         time.monotonic() - (replay.started or time.monotonic()), note))


def _describe(row):
    if row is None:
        return "absent"
    return "%r shape %s dtype %s" % (row[1], tuple(row[2]), row[3])
