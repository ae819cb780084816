"""The checkpoint file: its bytes, its name, and listing them.

A checkpoint file is :data:`MAGIC`, one JSON header line (the point of the
run it was taken at, the payload's size and SHA-256), and the state (see
:meth:`~tmpi_adapters.reliability.checkpoint.checkpointer.Checkpointer.capture`)
as arrays and plain values (:mod:`~tmpi_adapters.reliability.checkpoint.payload`).
The header is readable without loading anything, and a file that was cut
short is recognised before it is loaded.  The checksum is no seal (anyone may
recompute it): what makes a crafted file harmless is that loading one builds
data and runs nothing.  Files of format 1, whose state was a pickle, are read
through :mod:`tmpi_adapters.pickles`, which builds arrays and containers only.

Files are named :data:`NAME` after the training step they were taken at; they
are written by :func:`tmpi_adapters.files.write_atomic`, whose partial files
this module also clears away when their writer has died.
"""
import hashlib
import json
import os
import re

from tmpi_adapters import pickles
from tmpi_adapters.errors import CheckpointError
from tmpi_adapters.files import partial_of
from tmpi_adapters.reliability.checkpoint import payload as payload_format

MAGIC = b"TMPI-CHECKPOINT\n"
#: The newest format this tmpi writes and reads: 2, arrays and a JSON tree
#: (format 1 held a pickle, and is still read, as data only).
FORMAT = 2
NAME = "checkpoint-step%08d.tmpi"
PATTERN = re.compile(r"^checkpoint-step(\d+)\.tmpi$")


def encode(state, header):
    """``MAGIC``, one JSON header line (with the payload's size and sha256), the payload."""
    payload = payload_format.encode(state)
    header = dict(header, format=FORMAT, payload=len(payload),
                  sha256=hashlib.sha256(payload).hexdigest())
    return MAGIC + json.dumps(header, sort_keys=True).encode() + b"\n" + payload


class CorruptCheckpointError(CheckpointError):
    """The file is no checkpoint, or one that was cut short or altered.

    Attributes
    ----------
    reason : str
        What is wrong with it, in a few words.
    """

    def __init__(self, path, reason, advice="Resume from an older checkpoint in the same "
                                            "directory."):
        super().__init__("%s %s. %s" % (path, reason, advice))
        self.reason = reason


def verify(data, path):
    """The header of a checkpoint's bytes, once they are whole and unaltered:
    :class:`CorruptCheckpointError` if they are no checkpoint, are cut short
    or do not match their checksum; :class:`CheckpointError` if a newer tmpi
    wrote them."""
    if not data.startswith(MAGIC):
        raise CorruptCheckpointError(path, "is not a tmpi checkpoint (it does not start with "
                                     "%r)" % MAGIC.strip().decode(),
                                     "Pass a checkpoint-step*.tmpi file written by "
                                     "--checkpoint-dir.")
    end = data.find(b"\n", len(MAGIC))
    try:
        header = json.loads(data[len(MAGIC):end].decode())
        size, digest = int(header["payload"]), header["sha256"]
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise CorruptCheckpointError(path, "is corrupt: its header cannot be read")
    if header.get("format", 0) > FORMAT:
        raise CheckpointError("checkpoint %s has format %s, newer than this tmpi reads "
                              "(%d): upgrade tmpi-adapters." % (path, header["format"], FORMAT))
    payload = memoryview(data)[end + 1:]
    if len(payload) != size:
        raise CorruptCheckpointError(path, "is corrupt: truncated (%d of %d bytes)"
                                     % (len(payload), size))
    if hashlib.sha256(payload).hexdigest() != digest:
        raise CorruptCheckpointError(path, "is corrupt: its checksum does not match")
    return header


def decode(data, path):
    """``(header, state)`` from the bytes of a checkpoint (:func:`verify`
    first): :class:`CheckpointError` if they cannot be loaded."""
    header = verify(data, path)
    payload = memoryview(data)[len(data) - header["payload"]:]
    if header.get("format", 0) >= 2:
        return header, payload_format.decode(payload, path)
    try:
        state = pickles.loads(payload)
    except pickles.DisallowedObject as refused:
        raise CheckpointError(
            "checkpoint %s is refused: its state names %s, which is not data. A checkpoint "
            "holds arrays and plain values, never code; nothing in it was run. Resume only "
            "from files that tmpi's --checkpoint-dir wrote." % (path, refused.name))
    except Exception as exc:  # noqa: B902 - any unpickling failure means the same
        raise CheckpointError("checkpoint %s cannot be loaded (%s: %s); it may come from "
                              "another version of tmpi or its libraries."
                              % (path, type(exc).__name__, exc))
    if not isinstance(state, dict):
        raise CheckpointError("checkpoint %s cannot be loaded: its state is a %s, not what "
                              "tmpi writes." % (path, type(state).__name__))
    return header, state


def read_bytes(path):
    """The bytes of the checkpoint file ``path``; :class:`CheckpointError` if unreadable."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except IsADirectoryError:
        raise CheckpointError("--resume %s is a directory: pass a checkpoint file, or "
                              "--checkpoint-dir %s --resume latest." % (path, path))
    except OSError as exc:
        raise CheckpointError("cannot read checkpoint %s: %s." % (path, exc.strerror or exc))


def remove_stale_partials(directory):
    """Delete the partial checkpoint files of writers that died mid-write."""
    from tmpi_adapters.process.jobdir import process_alive
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        partial = partial_of(name)
        if partial and PATTERN.match(partial[0]) and not process_alive(partial[1]):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def read_header(path):
    """The header of checkpoint file ``path`` when the file is as long as it
    says (a cheap look, without reading the payload or checking its sum),
    else ``None``."""
    try:
        with open(path, "rb") as handle:
            start = handle.read(len(MAGIC) + 65536)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return None
    end = start.find(b"\n", len(MAGIC))
    if not start.startswith(MAGIC) or end < 0:
        return None
    try:
        header = json.loads(start[len(MAGIC):end].decode())
        whole = size == end + 1 + int(header["payload"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return header if whole else None


def newest_whole(directory):
    """``(path, step)`` of the newest checkpoint in ``directory`` that is as
    long as its header says (:func:`read_header`), or ``(None, None)``."""
    for path in reversed(list_checkpoints(directory)):
        header = read_header(path)
        if header is not None:
            return path, int(header.get("train_calls", 0))
    return None, None


def list_checkpoints(directory):
    """Checkpoint files in ``directory``, oldest first: by the training step in
    their names (then by time written, for files of different runs)."""
    try:
        names = [n for n in os.listdir(directory) if PATTERN.match(n)]
    except OSError:
        return []

    def order(name):
        path = os.path.join(directory, name)
        try:
            written = os.stat(path).st_mtime_ns
        except OSError:
            written = 0
        return (int(PATTERN.match(name).group(1)), written, name)
    return [os.path.join(directory, n) for n in sorted(names, key=order)]


def newest_that_verifies(directory):
    """``(path, data, header, skipped)`` of the newest checkpoint in
    ``directory`` whose bytes verify (``None`` for each when there is none);
    ``skipped`` holds ``(path, reason)`` of each newer one that did not."""
    skipped = []
    for path in reversed(list_checkpoints(directory)):
        try:
            data = read_bytes(path)
            return path, data, verify(data, path), skipped
        except CorruptCheckpointError as error:
            skipped.append((path, error.reason))
    return None, None, None, skipped
