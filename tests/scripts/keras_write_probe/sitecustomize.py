"""Test instrumentation (not a user script): records the files each MPI rank
opens for writing inside one directory.

Put this directory on ``PYTHONPATH`` and set ``TMPI_PROBE_WATCH`` (the directory
to watch) and ``TMPI_PROBE_LOG`` (a path prefix): every rank started by
``mpiexec`` appends ``<mode> <path>`` lines to ``<prefix>.rank<N>`` for each
file under the watched directory that it opens to write, through Python's
``open`` (audit events) or ``h5py.File``.
"""
import os
import sys

_RANK = os.environ.get("PMI_RANK")
_WATCH = os.environ.get("TMPI_PROBE_WATCH")
_LOG = os.environ.get("TMPI_PROBE_LOG")


def _record(path, mode):
    path = os.path.abspath(os.fsdecode(path))
    if not path.startswith(os.path.abspath(_WATCH) + os.sep):
        return
    # os.open, not open: the probe's own log is not a write of the script's
    # (tmpi's rule for files sees what the script opens).
    log = os.open("%s.rank%s" % (_LOG, _RANK), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(log, ("%s %s\n" % (mode, path)).encode("utf-8", "surrogateescape"))
    finally:
        os.close(log)


def _on_audit(event, args):
    if event != "open" or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path, mode, flags = args
    writes = (mode is not None and any(c in mode for c in "wax+")) or (
        mode is None and flags & (os.O_WRONLY | os.O_RDWR))
    if writes:
        _record(path, mode or "flags=%d" % flags)


def _watch_h5py():
    import h5py
    original = h5py.File.__init__

    def __init__(self, name, mode=None, *args, **kwargs):
        if isinstance(name, (str, bytes, os.PathLike)) and mode not in (None, "r"):
            _record(name, "h5py:%s" % mode)
        original(self, name, mode, *args, **kwargs)

    h5py.File.__init__ = __init__


if _RANK is not None and _WATCH and _LOG:
    sys.addaudithook(_on_audit)
    _watch_h5py()
