"""The checkpoint file: its bytes, its name, and finding the newest one.

A checkpoint file is :data:`MAGIC`, one JSON header line (the point of the
run it was taken at, the payload's size and SHA-256), and the pickled state
(see :meth:`~tmpi_adapters.reliability.checkpoint.checkpointer.Checkpointer.capture`).
The header is readable without unpickling anything, and a file that was cut
short or altered is recognised before it is loaded.

Files are named :data:`NAME` after the training step they were taken at; they
are written by :func:`tmpi_adapters.files.write_atomic`, whose partial files
this module also clears away when their writer has died.
"""
import hashlib
import json
import os
import re

from tmpi_adapters.errors import CheckpointError
from tmpi_adapters.files import partial_of

MAGIC = b"TMPI-CHECKPOINT\n"
#: The newest format this tmpi writes and reads.
FORMAT = 1
NAME = "checkpoint-step%08d.tmpi"
PATTERN = re.compile(r"^checkpoint-step(\d+)\.tmpi$")


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
    from tmpi_adapters.launch.launcher import process_alive
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


def latest_checkpoint(directory):
    """The newest checkpoint file in ``directory``, or ``None``."""
    found = list_checkpoints(directory)
    return found[-1] if found else None
