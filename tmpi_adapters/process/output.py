"""Where a rank's output goes: rank 0's to the terminal, the others' away
(their stderr kept for failure reports), or every rank's as whole lines
prefixed ``[rank N]`` (``--all-ranks-output``); standard input is rank 0's.
"""
import atexit
import io
import os
import sys

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.process import channel
from tmpi_adapters.process.jobdir import job_dir, rank_file, remote


#: The stderr that failures are reported on, even when a rank's own stderr
#: has been sent to a log file.
_report_fd = 2


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
    if directory and remote():
        fd = channel.stream_descriptor(rank, "stderr")
        if fd is not None:
            os.dup2(fd, 2)
            os.close(fd)
            return
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
    written to its ``buffer`` (``sys.stdout.buffer``) are lines too, and go
    out as they were written, whatever their encoding: Latin-1 text, a
    progress bar's ``\\r``, a binary dump.
    """
    prefixed = _Prefixed(stream, prefix.encode("utf-8"))
    _prefixed.append(prefixed)
    return prefixed


class _Prefixed:
    """The stream :func:`rank_prefix_stream` makes.

    Lines are kept as bytes: text is encoded as the wrapped stream would
    (its encoding and error handler), and bytes written to :attr:`buffer`
    are never decoded, so that nothing but the prefix is added to them.
    """

    def __init__(self, stream, prefix):
        self._stream, self._prefix = stream, prefix
        self._raw = getattr(stream, "buffer", None)
        self._partial = bytearray()
        self.buffer = _LinesOfBytes(self, self._raw)
        stream.flush()  # what the stream holds goes out before our lines

    def write(self, text):
        if not isinstance(text, str):
            raise TypeError("write() argument must be str, not %s" % type(text).__name__)
        # Read each time: a script may reconfigure() the stream's encoding.
        errors = getattr(self._stream, "errors", None) or "strict"
        self.add(text.encode(self._encoding(), errors))
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def add(self, data):
        """Take bytes; write out the whole lines they end."""
        cut = data.rfind(b"\n") + 1
        if not cut:
            self._partial += data  # in place: a long unended line stays linear
            return
        lines = bytes(self._partial) + data[:cut]
        self._partial = bytearray(data[cut:])
        self._emit(lines)

    def end_partial_line(self):
        if self._partial:
            partial, self._partial = bytes(self._partial), bytearray()
            self._emit(partial + b"\n")

    def _emit(self, lines):
        """Write ``lines`` (whole, each ending in ``\\n``), each after the prefix."""
        if self._prefix:
            lines = b"".join(self._prefix + line + b"\n" for line in lines[:-1].split(b"\n"))
        if self._raw is None:  # a stream without bytes below it (a StringIO)
            self._stream.write(lines.decode(self._encoding(), "replace"))
            self._stream.flush()
            return
        self._stream.flush()  # text written to the stream itself keeps its place
        self._raw.write(lines)
        self._raw.flush()

    def _encoding(self):
        return getattr(self._stream, "encoding", None) or "utf-8"

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _LinesOfBytes:
    """The ``buffer`` of a :func:`rank_prefix_stream`: bytes into its lines, as they are."""

    def __init__(self, lines, raw):
        self._lines, self._raw = lines, raw

    def write(self, data):
        data = bytes(data)
        self._lines.add(data)
        return len(data)

    def writelines(self, pieces):
        for piece in pieces:
            self.write(piece)

    def flush(self):
        self._lines.flush()

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
