"""Files written whole or not at all: the one atomic write of tmpi.

Checkpoints (:mod:`tmpi_adapters.reliability.checkpoint`) and the results the
benchmark's parts hand back (:mod:`tmpi_adapters.bench.command`) are read by
someone who must never see half a file: a resume after a crash, the process
that collects the parts.  Both write through :func:`write_atomic`.

The bytes first go to a *partial* file beside the final one, named
``.NAME.PID.partial`` (hidden, and naming the writer, so that a later run can
tell a partial file whose writer died from one still being written: see
:func:`partial_of`).
"""
import os

#: How a partial file's name ends.
PARTIAL_SUFFIX = ".partial"


def partial_path(path):
    """The partial file this process writes ``path`` through."""
    directory, name = os.path.split(path)
    return os.path.join(directory, ".%s.%d%s" % (name, os.getpid(), PARTIAL_SUFFIX))


def partial_of(name):
    """``(final name, writer pid)`` when ``name`` is a partial file's name, else ``None``."""
    if not (name.startswith(".") and name.endswith(PARTIAL_SUFFIX)):
        return None
    final, _, pid = name[1:-len(PARTIAL_SUFFIX)].rpartition(".")
    if not final or not pid.isdigit():
        return None
    return final, int(pid)


def write_atomic(path, data):
    """Write ``data`` (bytes, or text as UTF-8) to ``path`` so that a crash never
    leaves a partial file there, nor destroys the file that was there.

    The bytes go to a partial file in the same directory (a rename across file
    systems is not atomic), are flushed and fsynced, and the partial file is
    renamed over ``path`` (atomic on POSIX); the directory is fsynced so the
    rename itself survives a power cut.  On failure the partial file is
    removed and the :class:`OSError` raised for the caller to word (which file
    it was, what to check).

    Returns
    -------
    str
        ``path``.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    temporary = partial_path(path)
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        # Also on KeyboardInterrupt: a partial file of a live process is
        # never cleaned up by anyone else.
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    try:
        fd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        pass  # some file systems cannot fsync a directory; the rename is done
    return path
