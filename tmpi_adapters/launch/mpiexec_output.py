"""What ``mpiexec`` writes, forwarded as it comes (:class:`MpiexecOutput`,
a part of :class:`~tmpi_adapters.launch.watch.JobWatch`): a progress bar's
redraws at once, MPICH's termination banner, Open MPI's notices and the
``MPI_Abort`` chatter of both read and held back (tmpi says the same in one
sentence naming the rank), hydra's traces and what the program that enters
the hosts (``ssh``) says held back unless tmpi has nothing better to say.
"""
import os
import re
import sys

# Launcher chatter that repeats what tmpi reports itself (prefixed by a rank
# on another host under --all-ranks-output).
_NOISE = re.compile(rb"^(?:\[rank \d+\] )?Abort\((\d+)\) on node \d+ \(rank (\d+) in comm "
                    rb"\d+\): application called MPI_Abort")
_BANNER_RULE = re.compile(rb"^={20,}\s*$")
_BANNER_PID = re.compile(rb"PID (\d+) RUNNING AT (\S+)")
_BANNER_CODE = re.compile(rb"EXIT CODE: (-?\d+)")
_BANNER_TRAILER = (b"YOUR APPLICATION TERMINATED WITH THE EXIT STRING",
                   b"This typically refers to a problem with your application",
                   b"Please see the FAQ page for debugging suggestions")
_EXIT_STRING = re.compile(rb"EXIT STRING: (.*?)\s*$")
# Hydra's own trace of a job torn down, held back unless tmpi can say nothing
# better (a proxy on another host that lost its rank or its connection).
_HYDRA_TRACE = re.compile(rb"^\[(proxy:[\d:]+@\S+|mpiexec@\S+)\] ")
# Open MPI's own trace of a job torn down (its error handler's lines, its
# launcher's warnings), held back as hydra's is.
_OPEN_MPI_TRACE = re.compile(rb"^(\[[^\]\n]+\] \*\*\* |\[\S+:\d+\] plm:\S+: Warning: )")
# Open MPI's notices come as blocks between rules of dashes (its show-help).
_OPEN_MPI_RULE = re.compile(rb"^-{40,}\s*$")
#: The longest notice held back while it is read.
_OPEN_MPI_LINES = 80
_OPEN_MPI_ABORT = re.compile(rb"MPI_ABORT was invoked on rank (\d+) in communicator .*?"
                             rb"Errorcode: (-?\d+)", re.S)
_OPEN_MPI_CALLED_ABORT = re.compile(rb"has exited due to process rank \d+ with PID \d+ on\s+"
                                    rb"node \S+ calling\s+\"abort\"")
_OPEN_MPI_IMPROPER = re.compile(rb"has exited due to process rank (\d+) with PID (\d+) on\s+"
                                rb"node (\S+) exiting\s+improperly")
_OPEN_MPI_LOST_PEER = re.compile(rb"An MPI communication peer process has unexpectedly\s+"
                                 rb"disconnected")
_OPEN_MPI_SIGNAL = re.compile(rb"noticed that process rank (\d+) with PID (\d+) on node "
                              rb"(\S+) exited on\s+signal (\d+)")


def mpi_abort(line):
    """``(rank, code)`` of MPICH's line on a rank's ``MPI_Abort`` (tmpi's ranks
    call it after saying why), else ``None``."""
    noise = _NOISE.match(line)
    return (int(noise.group(2)), int(noise.group(1))) if noise else None


def _lines_and_redraws(stream):
    """The output of ``stream`` (a pipe) in whole lines, and, as soon as it
    comes, what ends in a carriage return: a progress bar (tqdm, Keras')
    redraws its line without ending it, and would show only at its end."""
    fd, pending = stream.fileno(), b""
    while True:
        data = os.read(fd, 1 << 16)
        if not data:
            break
        pending += data
        while pending:
            cut = pending.find(b"\n") + 1
            if not cut:
                if b"\r" in pending:  # redraws: each was flushed whole, pass them on
                    cut = len(pending)
                else:
                    break
            yield pending[:cut]
            pending = pending[cut:]
    if pending:
        yield pending


class MpiexecOutput:
    """The threads that read ``mpiexec``'s stdout and stderr for the watch.

    What they find, for the watch's final word: ``terminations`` (``(pid,
    host, exit code, exit string)`` of each banner: hydra's, or Open MPI's
    notice of a rank a signal killed), ``aborts`` (``(rank, code)`` of
    ``MPI_Abort`` calls), ``improper`` (``(rank, pid, host)`` of ranks Open
    MPI saw leave without finalizing), ``reports_seen`` (``tmpi: ...``
    lines passed on) and ``hydra_trace`` (hydra's and Open MPI's traces of
    a job torn down, held back).  The
    class using it sets those and ``process`` (the ``mpiexec``).
    """

    def _pump_stdout(self):
        sink = sys.stdout.buffer
        held = []      # blank lines and a rule line, until the next line tells
        banner = None  # the lines of a termination banner being read
        for line in _lines_and_redraws(self.process.stdout):
            if not line.endswith(b"\n") and banner is None:
                self._write(sink, held + [line])  # a progress bar redrawn in place
                held = []
                continue
            if banner is not None:
                banner.append(line)
                if _BANNER_RULE.match(line):
                    self._end_banner(banner, sink)
                    banner = None
                continue
            if held and _BANNER_RULE.match(held[-1]):
                if b"BAD TERMINATION" in line:
                    banner, held = held + [line], []
                    continue
                self._write(sink, held)
                held = []
            if _BANNER_RULE.match(line) or not line.strip():
                held.append(line)
                continue
            if self.terminations and line.startswith(_BANNER_TRAILER):
                match = _EXIT_STRING.search(line)
                if match:
                    pid, host, code, _ = self.terminations[-1]
                    self.terminations[-1] = (pid, host, code,
                                             match.group(1).decode("utf-8", "replace"))
                continue
            if _HYDRA_TRACE.match(line):
                # hydra writes some of its trace here ("Sending Ctrl-C to
                # processes as requested" as a SIGINT reaches it)
                self.hydra_trace.append(line)
                continue
            self._write(sink, held + [line])
            held = []
        self._write(sink, held + (banner or []))
        self.process.stdout.close()

    def _end_banner(self, lines, sink):
        text = b"".join(lines)
        pid, code = _BANNER_PID.search(text), _BANNER_CODE.search(text)
        if b"BAD TERMINATION" not in text or pid is None:
            self._write(sink, lines)
            return
        self.terminations.append((int(pid.group(1)), pid.group(2).decode(),
                                  int(code.group(1)) if code else None, ""))

    def _pump_stderr(self):
        sink = sys.stderr.buffer
        notice = None  # the lines of an Open MPI notice being read
        # With --hosts, the program that enters the hosts (ssh) says why it
        # cannot on this stream; tmpi asks it again and names the host.
        entering = None if self.hosts is None else \
            ("%s: " % self.hosts.command_name()).encode()
        for line in _lines_and_redraws(self.process.stderr):
            if notice is not None:
                notice.append(line)
                if _OPEN_MPI_RULE.match(line) or len(notice) > _OPEN_MPI_LINES:
                    self._end_notice(notice, sink)
                    notice = None
                continue
            if _OPEN_MPI_RULE.match(line):
                notice = [line]
                continue
            if not line.strip(b"\0"):
                continue  # what Open MPI's forwarding of a rank's stream leaves at its end
            abort = mpi_abort(line)
            if abort:
                self.aborts.append(abort)
                continue
            if line.startswith(b"tmpi: "):
                self.reports_seen.add(line.strip())
            if _HYDRA_TRACE.match(line) or _OPEN_MPI_TRACE.match(line) or \
                    entering is not None and line.startswith(entering):
                self.hydra_trace.append(line)
                continue
            self._write(sink, [line])
        self._write(sink, notice or [])
        self.process.stderr.close()

    def _end_notice(self, lines, sink):
        """An Open MPI notice: what tmpi says better is noted and held back
        (an abort tmpi's rank called, a rank a signal killed, a rank that
        left without finalizing), anything else passed on."""
        text = b"".join(lines)
        abort, signalled = _OPEN_MPI_ABORT.search(text), _OPEN_MPI_SIGNAL.search(text)
        improper = _OPEN_MPI_IMPROPER.search(text)
        if abort:
            self.aborts.append((int(abort.group(1)), int(abort.group(2))))
        elif signalled:
            self.terminations.append((int(signalled.group(2)), signalled.group(3).decode(),
                                      None, "signal %s" % signalled.group(4).decode()))
        elif improper:
            self.improper.append((int(improper.group(1)), int(improper.group(2)),
                                  improper.group(3).decode()))
        elif _OPEN_MPI_LOST_PEER.search(text):
            self.hydra_trace.extend(lines)  # a rank whose peer died: the peer is named
        elif not _OPEN_MPI_CALLED_ABORT.search(text):
            self._write(sink, lines)

    @staticmethod
    def _write(sink, lines):
        if lines:
            sink.write(b"".join(lines))
            sink.flush()
