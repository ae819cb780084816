"""Watching a job from the process that launched it (:class:`JobWatch`).

It turns ``mpiexec``'s termination banner into one sentence naming the rank
that died, ends the job when a rank vanishes without a word or ``mpiexec``
itself is killed, makes sure no rank outlives it, passes the script's own
exit status through, and forwards the ranks' output as it comes (a progress
bar's redraws included; with ``--all-ranks-output`` through pipes of each
rank's own, :class:`~tmpi_adapters.launch.relay.OutputRelay`).
"""
import os
import re
import select
import signal
import socket
import sys
import threading
import time

from tmpi_adapters.process.jobdir import (has_mark, process_alive, rank_file,
                                         read_checkpoint_mark, read_progress, read_ranks)
from tmpi_adapters.launch.mpiexec_output import MpiexecOutput
from tmpi_adapters.launch.signals import signals_ignored
from tmpi_adapters.launch.stopping import Stopping
from tmpi_adapters.reliability.watchdog import format_ranks

#: Seconds a rank may be gone without a word before the launcher ends the job
#: itself (hydra usually does so at once).
VANISHED_GRACE = 2.0


def stderr_tail(directory, rank, lines=6):
    """The last lines a non-zero rank wrote to its stderr, or ``""``."""
    try:
        with open(rank_file(directory, rank, "stderr"), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 8192))
            text = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join("    " + line for line in kept)


def name_signal(number):
    """``"signal 9 (SIGKILL)"``."""
    try:
        return "signal %d (%s)" % (number, signal.Signals(number).name)
    except ValueError:
        return "signal %d" % number


def describe_signal(number):
    """:func:`name_signal`, and what usually sends it."""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return "signal %d" % number
    reasons = {
        "SIGKILL": ": killed from outside (`kill -9`, a batch scheduler) or by the "
                   "kernel's out-of-memory killer (see `dmesg`)",
        "SIGSEGV": ": a crash inside compiled code (Theano's C code, BLAS, MPI)",
        "SIGBUS": ": a crash inside compiled code, or a full /dev/shm",
        "SIGABRT": ": a compiled library called abort()",
        "SIGTERM": ": asked to terminate from outside",
    }
    return "signal %d (%s)%s" % (number, name, reasons.get(name, ""))



# ------------------------------------------------------------------ the watch

class JobWatch(MpiexecOutput, Stopping):
    """Watches one ``mpiexec`` job from the process that launched it.

    Parameters
    ----------
    process : subprocess.Popen
        The ``mpiexec`` process, started with piped stdout and stderr.
    directory : str
        The job directory (``$TMPI_JOB_DIR``) the ranks write their files to.
    n : int
        The number of ranks.
    """

    def __init__(self, process, directory, n, poll=0.25, relay=None, preemption=None,
                 channel=None, hosts=None):
        self.process = process
        #: The :class:`~tmpi_adapters.launch.hosts.HostSet` of ``--hosts``, or ``None``.
        self.hosts = hosts
        #: The :class:`~tmpi_adapters.process.channel.ChannelServer` of ranks
        #: on other machines (``--hosts``), or ``None``.
        self.channel = channel
        self.preemption = preemption
        self.directory = directory
        self.n = n
        self.poll = poll
        self.host = socket.gethostname()
        self.terminations = []   # (pid, host, exit code, exit string) from the banner
        # (rank, code) of the MPI_Abort calls MPICH named (its lines held back;
        # with --all-ranks-output the relay reads them)
        self.aborts = relay.aborts if relay is not None else []
        self.improper = []       # (rank, pid, host) Open MPI saw leave without finalizing
        self.vanished = None     # (RankInfo, seconds) of a rank gone without a word
        self.interrupted = None  # the signal that stopped the launcher
        #: A preemption whose step did not end within its grace stopped the
        #: job: the local ranks that were stopped (SIGSTOP) then; else ``None``.
        self.overdue = None
        #: Why the job failed in a way a restart may mend (a rank killed,
        #: crashed or vanished), in words; ``None`` for any other end.
        self.failure = None
        #: Rank 0's training step when the job ended
        #: (:class:`~tmpi_adapters.process.jobdir.Progress`).
        self.progress = 0
        #: ``(path, step, finished)`` of the last checkpoint rank 0 wrote
        #: (on its own machine), or ``None``.
        self.checkpoint = None
        #: The job's exit status, once it ended.
        self.status = None
        self._gone_since = {}
        self._opened = set()       # ranks whose end is watched (a pidfd was opened)
        #: The ranks of this machine as they ended, in groups seen at once.
        self.ended = []
        # "tmpi: ..." lines the ranks' stderr carried
        self.reports_seen = relay.reports_seen if relay is not None else set()
        self.hydra_trace = []  # hydra's trace lines, held back
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._pump_stdout, daemon=True),
            threading.Thread(target=self._pump_stderr, daemon=True),
            threading.Thread(target=self._watch, daemon=True),
        ]
        if relay is not None:
            self._threads.append(threading.Thread(target=relay.run, args=(self._stop,),
                                                  daemon=True))

    def start(self):
        for thread in self._threads:
            thread.start()
        if self.preemption is not None:
            self.preemption.process = self.process
            if self.preemption.signal is not None:  # it came while the job started
                self.preemption.pass_on()
        return self

    def wait(self):
        """Wait for the job; return its exit status after the final report."""
        try:
            code = self._wait_bounded()
        except KeyboardInterrupt as stop:
            self.interrupted = getattr(stop, "signum", signal.SIGINT)
            if self.preemption is not None and self.preemption.signal is not None:
                # A second signal during a preemption's grace stops the job at
                # once, though a frozen rank (why a grace runs) holds it up.
                self.stop_at_once()
            with signals_ignored():
                self.stop_job()
                code = self.process.wait()
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        if self.channel is not None:
            self.channel.close()  # what the ranks of other machines sent is in
        self.kill_leftovers()
        self.progress = read_progress(self.directory)
        self.checkpoint = read_checkpoint_mark(self.directory)
        self.status = self.final_status(code)
        return self.status

    # -- watching the ranks ---------------------------------------------------------
    def _watch(self):
        """End the job when a rank on this machine is gone without a word.

        A rank that fails reports and aborts the job, and ``mpiexec`` ends a
        job whose rank dies of a signal; a rank that simply vanishes (exit
        without finalizing MPI, a launcher that waits) is caught here.  The
        order in which this machine's ranks end is noted as it happens
        (:attr:`ended`): when ``mpiexec`` stops the others after one rank
        left, the first is the one to name.
        """
        watched = {}  # pidfd -> rank, while the rank lives
        try:
            while not self._stop.is_set():
                self._note_ends(watched)
                if self.process.poll() is not None:
                    return
                self._check_vanished()
        finally:
            for fd in watched:
                os.close(fd)

    def _note_ends(self, watched):
        """Wait up to :attr:`poll` seconds for ranks to end, noting which did."""
        for info in read_ranks(self.directory).values():
            if info.rank in self._opened or info.host not in (None, self.host):
                continue
            self._opened.add(info.rank)
            try:
                watched[os.pidfd_open(info.pid)] = info.rank
            except (AttributeError, OSError):
                pass  # no pidfds (old kernel), or already gone: the order stays unknown
        if not watched:
            self._stop.wait(self.poll)
            return
        ready, _, _ = select.select(list(watched), [], [], self.poll)
        if ready:
            self.ended.append(sorted(watched[fd] for fd in ready))
        for fd in ready:
            del watched[fd]
            os.close(fd)

    def _check_vanished(self):
        """Stop the job when a rank here has been gone :data:`VANISHED_GRACE`
        seconds without reporting (``mpiexec`` usually ends it at once)."""
        now = time.monotonic()
        for info in read_ranks(self.directory).values():
            if self._finished(info.rank):
                continue
            if info.host not in (None, self.host):
                alive = self.channel is None or not self.channel.gone(info.rank)
            else:
                alive = process_alive(info.pid)
            if alive:
                self._gone_since.pop(info.rank, None)
                continue
            since = self._gone_since.setdefault(info.rank, now)
            if now - since >= VANISHED_GRACE and self.vanished is None:
                self.vanished = (info, now - since)
                self.stop_job()
                self._stop.set()
                return

    def _finished(self, rank):
        return any(has_mark(self.directory, rank, kind)
                   for kind in ("done", "exit", "failed", "preempted"))

    def exit_statuses(self, ranks):
        """``{rank: status}`` of the ranks whose script ended with ``sys.exit(status)``."""
        statuses = {}
        for rank in ranks:
            try:
                with open(rank_file(self.directory, rank, "exit")) as handle:
                    statuses[rank] = int(handle.read())
            except (OSError, ValueError):
                continue
        return statuses

    # -- the final word -------------------------------------------------------------
    def final_status(self, code):
        """Report what ended the job, once, naming the rank; return the exit
        status.  :attr:`failure` says why when a restart may mend it."""
        if self.interrupted is not None:
            return self._interrupted_status()
        if self.overdue is not None and not has_mark(self.directory, 0, "preempted"):
            return self._overdue_status()
        preempted = self._preempted_status(code)
        if preempted is not None:
            return preempted
        ranks = read_ranks(self.directory)
        by_pid = {info.pid: info for info in ranks.values()}
        by_pid.update({info.supervisor: info for info in ranks.values() if info.supervisor})
        failed = [r for r in ranks if has_mark(self.directory, r, "failed")]
        exits = self.exit_statuses(ranks)
        killed = {} if self.vanished is not None else self.killed_marks()
        messages, signalled = [], None
        if killed:
            line, signalled = self._describe_killed(killed, ranks)
            messages.append(line)
            code = signalled
        # Terminations tmpi caused itself while stopping a job say nothing
        # new, nor does the end of a rank whose script chose its exit status.
        # When supervisors named the ranks a signal killed, hydra's banner can
        # only add a process its own tear-down killed.
        terminations = [] if self.vanished is not None or killed else [
            t for t in self.terminations if not (t[0] in by_pid and by_pid[t[0]].rank in exits)]
        for pid, host, exit_code, exit_string in terminations:
            info, number = by_pid.get(pid), _signal_number(exit_string)
            messages.append(self._describe_termination(info, pid, host, exit_code,
                                                       exit_string))
            self.failure = self.failure or "%s%s %s" % (
                "rank %d" % info.rank if info else "a process of the job",
                " on %s" % host if self.channel is not None else "",
                "was killed by %s" % name_signal(number) if number else
                "exited with status %s without finishing" % exit_code)
            if not number and self._elsewhere(info) and exit_code and 0 < exit_code < 65:
                number = exit_code  # hydra's status of a rank of another host: its signal
            if number and not signalled:
                # As a shell reports a process a signal ended: 128 + its
                # number (mpiexec gives the bare number, which would read as
                # one of tmpi's own statuses: 6 for SIGABRT).
                signalled = code = 128 + number
        if self.vanished is not None:
            info, _ = self.vanished
            self.failure = "rank %d%s is gone without reporting an error" % (
                info.rank, "" if info.host in (None, self.host) else " on %s" % info.host)
            if info.host in (None, self.host):
                how = "it exited without finalizing MPI, e.g. os._exit"
            else:
                how = ("on %s: its connection to tmpi closed or stopped answering; the "
                       "process ended, or its host went away" % info.host)
            messages.append("tmpi: rank %d (pid %d) is gone without reporting an error "
                            "(%s); the job was stopped.%s" % (info.rank, info.pid, how,
                                                              self._tail(info.rank)))
            code = 1 if code is None or code <= 0 else code  # mpiexec stopped by tmpi
        if code < 0:
            self.failure = self.failure or "%s was killed by %s" % (
                os.path.basename(self.process.args[0]), name_signal(-code))
            messages.append("tmpi: %s (pid %d) was killed by %s; the job's ranks were "
                            "stopped." % (os.path.basename(self.process.args[0]),
                                          self.process.pid, describe_signal(-code)))
            code = 128 - code
        lost = self._lost_report(failed)
        if lost:
            messages.append(lost)
        for rank, abort_code in self.aborts:
            if rank not in failed:
                messages.append("tmpi: rank %d called MPI_Abort(%d); the job was ended."
                                % (rank, abort_code))
        if failed and code == 1 and not exits:
            # An exception in the script (tmpi's own errors have statuses of
            # their own): a data file that could not be read, memory.
            self.failure = self.failure or self._failed_line(failed)
        if not messages and not failed and not self.aborts and code != 0 and \
                self.channel is not None:
            ended = self._ended_elsewhere(ranks)
            if ended:
                where = ranks[ended[0]].host
                self.failure = "%s on %s ended without reporting an error" % (
                    format_ranks(ended), where)
                messages.append("tmpi: %s (pid %s) on %s ended without reporting an error: "
                                "killed (a signal, the out-of-memory killer) or cut off "
                                "with its host; the other ranks were stopped.%s" % (
                                    format_ranks(ended),
                                    ", ".join(str(ranks[r].pid) for r in ended), where,
                                    self._tail(ended[0])))
                code = 1
        unreachable = self._unreachable() if not messages and not failed and not exits \
            and code > 0 else []
        if unreachable:
            self.failure = "; ".join("host %s cannot be reached (%s)" % (host.name, why)
                                     for host, why in unreachable)
            messages.append("tmpi: the ranks could not be started: %s. Check the host names "
                            "(--hosts, --hostfile) and that `%s HOST true` works from here "
                            "without a password." % (self.failure, self.hosts.command_name()))
            code = 2
        elif self.hydra_trace and (not messages or not ranks) and code != 0:
            sys.stderr.buffer.write(b"".join(self.hydra_trace))
            sys.stderr.flush()
        if not messages and not ranks and code != 0:
            self.failure = "%s ended with status %d before any rank started" % (
                os.path.basename(self.process.args[0]), code)
            messages.append("tmpi: %s; see its output above. Check --mpiexec and "
                            "--mpiexec-arg, or run the script with -n 1 to see it "
                            "start." % self.failure)
            code = 2  # the launcher's own status (hydra's 255) is none of tmpi's
        if not messages and not failed and any(exits.values()):
            # The script's own status (mpiexec would OR those of the ranks).
            code = [exits[r] for r in sorted(exits) if exits[r]][0]
        left = [(rank, pid) for rank, pid, _ in self.improper if not self._finished(rank)]
        if left and not messages and not failed:
            # Open MPI names the rank that left without finalizing MPI.
            rank, pid = left[0]
            self.failure = "rank %d left without finishing the script" % rank
            messages.append("tmpi: rank %d (pid %d) left without finishing the script or "
                            "finalizing MPI (os._exit, or a library that ended the process); "
                            "mpiexec stopped the other ranks.%s" % (rank, pid, self._tail(rank)))
            code = 1
        if not messages and code == 0 and not failed:
            unfinished = sorted(r for r in ranks if not self._finished(r)
                                and (ranks[r].host in (None, self.host) or
                                     self.channel is not None and self.channel.gone(r)))
            first = [r for r in (self.ended[0] if self.ended else []) if r in unfinished]
            if len(first) == 1:
                self.failure = "rank %d left without finishing the script" % first[0]
                messages.append("tmpi: rank %d (pid %d) left without finishing the script "
                                "or finalizing MPI (os._exit, or a library that ended the "
                                "process); mpiexec stopped the other ranks.%s"
                                % (first[0], ranks[first[0]].pid, self._tail(first[0])))
                code = 1
            elif unfinished:
                self.failure = "rank(s) %s did not finish the script" % ", ".join(
                    map(str, unfinished))
                messages.append("tmpi: the job ended with status 0, but rank(s) %s did not "
                                "finish the script: one of them exited without finalizing "
                                "MPI (e.g. os._exit) and mpiexec stopped the others."
                                % ", ".join(map(str, unfinished)))
                code = 1
        if messages:
            sys.stdout.flush()
            sys.stderr.write("\n".join(messages) + "\n")
            sys.stderr.flush()
        return code

    def _unreachable(self):
        """``[(host, why)]`` of the job's hosts (``--hosts``) that do not
        answer the launcher's command, when the job failed without a word
        from its ranks: hydra ends a job whose proxy could not start."""
        if self.hosts is None:
            return []
        return self.hosts.unreachable()

    def _ended_elsewhere(self, ranks):
        """The ranks of another host that ended first without a word (the
        channel saw them go), all of that host's that ended with them."""
        ended = sorted((self.channel.ended[r], r) for r in ranks
                       if self.channel.gone(r) and not self._finished(r))
        if not ended:
            return []
        first, host = ended[0][0], ranks[ended[0][1]].host
        return sorted(r for when, r in ended if ranks[r].host == host and when - first < 1.0)

    def _lost_report(self, failed):
        """The failure report of the first failed rank, if its stderr never got here."""
        for rank in sorted(failed):
            try:
                with open(rank_file(self.directory, rank, "failed"), "rb") as handle:
                    text = handle.read()
            except OSError:
                continue
            lines = [line.strip() for line in text.splitlines() if line.startswith(b"tmpi: ")]
            if not lines:
                continue
            if lines[-1] in self.reports_seen:
                return None
            return text.decode("utf-8", "replace").rstrip("\n")
        return None

    def _failed_line(self, failed):
        """``rank 1 of 2 failed: ValueError: ...`` from the first failed rank's report."""
        for rank in sorted(failed):
            try:
                with open(rank_file(self.directory, rank, "failed"), "rb") as handle:
                    lines = handle.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
            said = [line[len("tmpi: "):] for line in lines if line.startswith("tmpi: ")]
            if said:
                return said[-1]
        return "rank %d failed" % min(failed)

    def _describe_termination(self, info, pid, host, exit_code, exit_string):
        who = "rank %d (pid %d on %s)" % (info.rank, pid, host) if info else \
              "a process of the job (pid %d on %s)" % (pid, host)
        number = _signal_number(exit_string)
        if number:
            how = "was killed by %s" % describe_signal(number)
        elif self._elsewhere(info) and exit_code and 0 < exit_code < 65:
            # A rank on another host: hydra gives a signal's number as its status.
            how = "ended with status %d without finishing (%s, if a signal ended it)" % (
                exit_code, name_signal(exit_code))
        else:
            how = "exited with status %s without finishing" % exit_code
        tail = self._tail(info.rank) if info else ""
        return "tmpi: %s %s. The other ranks were stopped.%s" % (who, how, tail)

    def killed_marks(self):
        """``{rank: (signal number, when)}`` of the ranks whose supervisors saw
        a signal kill them (``tmpi wrap --hosts``), ``when`` the time the
        mark reached this machine."""
        killed = {}
        for rank in range(self.n):
            path = rank_file(self.directory, rank, "killed")
            try:
                with open(path) as handle:
                    killed[rank] = (int(handle.read()), os.stat(path).st_mtime_ns)
            except (OSError, ValueError):
                continue
        return killed

    def _describe_killed(self, killed, ranks):
        """One line naming every rank a signal killed (``every rank of b``
        where that is what it was), and :attr:`failure`.  SIGKILL comes from
        outside (a user, the out-of-memory killer, a scheduler; hydra's own
        tear-down kills the supervisors first, so it leaves no mark): the
        ranks it killed are the cause, and the ranks that crashed meanwhile
        (MPI libraries crash when a peer's connections break) are named
        after them.  Without a SIGKILL the first signal to arrive is the
        cause.  Returns ``(line, status)``."""
        first = min(killed.values(), key=lambda value: value[1])[0]
        cause = signal.SIGKILL if any(number == signal.SIGKILL
                                      for number, _ in killed.values()) else first
        dead = sorted(r for r, (number, _) in killed.items() if number == cause)
        after = {}
        for rank, (number, _) in sorted(killed.items()):
            if number != cause:
                after.setdefault(number, []).append(rank)
        pids = ", ".join(str(ranks[r].pid) for r in dead if r in ranks) or "unknown"
        hosts = ", ".join(sorted({ranks[r].host for r in dead if r in ranks and ranks[r].host}))
        who = self._whose(dead, ranks)
        whole = who.startswith("every")
        verb = "were" if len(dead) > 1 and not whole else "was"
        self.failure = "%s%s %s killed by %s" % (
            who, " on %s" % hosts if hosts and not whole else "", verb, name_signal(cause))
        if whole:
            named = "%s, pid%s %s)" % (who[:-1], "s" if len(dead) > 1 else "", pids)
        else:
            named = "%s (pid%s %s%s)" % (who, "s" if len(dead) > 1 else "", pids,
                                         " on %s" % hosts if hosts else "")
        line = "tmpi: %s %s killed by %s%s. The other ranks were stopped.%s" % (
            named, verb, describe_signal(cause),
            "".join("; %s crashed meanwhile with %s, most likely inside MPI on losing %s" % (
                format_ranks(others), name_signal(number), "it" if len(dead) == 1 else "them")
                for number, others in after.items()), self._tail(dead[0]))
        return line, 128 + int(cause)

    def _elsewhere(self, info):
        """True for a rank of another host than this launcher's."""
        return info is not None and info.host not in (None, self.host)

    @staticmethod
    def _whose(dead, ranks):
        """``"every rank of b (ranks 2-3)"`` when ``dead`` are all the ranks of
        one host (of more than one rank), else ``"ranks 2, 5"``."""
        hosts = {ranks[r].host for r in dead if r in ranks}
        if len(dead) > 1 and len(hosts) == 1 and None not in hosts:
            host = hosts.pop()
            if sorted(dead) == sorted(r for r, info in ranks.items() if info.host == host):
                return "every rank of %s (%s)" % (host, format_ranks(dead))
        return format_ranks(dead)

    def _tail(self, rank):
        tail = stderr_tail(self.directory, rank)
        return ("\n  last lines of rank %d's stderr:\n%s" % (rank, tail)) if tail else ""


def _signal_number(exit_string):
    """The signal that ended a process, from ``mpiexec``'s exit string, or ``None``."""
    number = re.search(r"signal (\d+)", exit_string or "")
    return int(number.group(1)) if number else None
