"""``--all-ranks-output``: every rank's lines, whole and prefixed, through
pipes of its own (:class:`OutputRelay`)."""
import os
import select
import sys
import time

from tmpi_adapters.launch.mpiexec_output import mpi_abort
from tmpi_adapters.process.jobdir import rank_file
from tmpi_adapters.process.output import RELAY_FILE


class OutputRelay:
    """With ``--all-ranks-output``: every rank of this machine writes its
    stdout and stderr to pipes of its own in the job directory, and the
    launcher writes them out as whole lines, each prefixed ``[rank N]``.

    Through ``mpiexec`` ranks' lines interleave mid-line once they pass its
    64 KiB pieces, and output below Python (C code, ``sys.stdout.buffer``)
    could not be prefixed.  Ranks on other machines find no pipe and
    prefix their own lines (:func:`~tmpi_adapters.process.output.route_output`).
    """

    #: Seconds the relay waits, once the job has ended, for the last bytes.
    DRAIN_SECONDS = 2.0

    def __init__(self, directory, n):
        self.reports_seen = set()  # "tmpi: ..." lines relayed (see JobWatch)
        self.aborts = []  # (rank, code) of MPICH's MPI_Abort lines, held back (see JobWatch)
        self.streams = {}  # read end -> [rank, sink, partial line]
        self._held = []    # write ends of our own: no end of file before a rank opens its own
        for rank in range(n):
            for name, sink in (("stdout", sys.stdout.buffer), ("stderr", sys.stderr.buffer)):
                path = rank_file(directory, rank, RELAY_FILE % name)
                os.mkfifo(path, 0o600)
                self.streams[os.open(path, os.O_RDONLY | os.O_NONBLOCK)] = [rank, sink, b""]
                self._held.append(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    def run(self, stop):
        """Relay until ``stop`` is set, then what the ranks left in the pipes."""
        while not stop.is_set():
            self._relay(0.1)
        for fd in self._held:
            os.close(fd)
        deadline = time.monotonic() + self.DRAIN_SECONDS
        while self.streams and time.monotonic() < deadline:
            self._relay(0.05)
        for fd in list(self.streams):
            self._close(fd)

    def _relay(self, timeout):
        ready, _, _ = select.select(list(self.streams), [], [], timeout)
        for fd in ready:
            try:
                data = os.read(fd, 1 << 16)
            except BlockingIOError:
                continue
            if not data:
                self._close(fd)
                continue
            stream = self.streams[fd]
            pending = stream[2] + data
            cut = pending.rfind(b"\n") + 1
            stream[2] = pending[cut:]
            if cut:
                self._write(stream, pending[:cut - 1].split(b"\n"))

    def _write(self, stream, lines):
        rank, sink, _ = stream
        prefix = b"[rank %d] " % rank
        shown = []
        for line in lines:
            if line.startswith(b"tmpi: "):
                self.reports_seen.add(line.strip())
            abort = mpi_abort(line)
            if abort:
                self.aborts.append(abort)  # MPICH's words for what tmpi said
            else:
                shown.append(line)
        if shown:
            sink.write(b"".join(prefix + line + b"\n" for line in shown))
            sink.flush()

    def _close(self, fd):
        stream = self.streams.pop(fd)
        if stream[2]:  # a last line without its end
            self._write(stream, [stream[2]])
        os.close(fd)
