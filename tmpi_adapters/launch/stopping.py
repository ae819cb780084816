"""Stopping a watched job (:class:`Stopping`, a part of
:class:`~tmpi_adapters.launch.watch.JobWatch`): ``mpiexec`` terminated and
the ranks it left killed; Ctrl-C and SIGTERM to the launcher; a preemption
(SIGTERM or SIGUSR1 with ``--checkpoint-dir``), bounded by its grace.
"""
import os
import select
import signal
import subprocess
import sys
import time

from tmpi_adapters.launch.signals import signals_ignored
from tmpi_adapters.process.jobdir import (belongs_to_job, process_alive, process_state,
                                         rank_file, read_ranks)
from tmpi_adapters.reliability.preemption import PREEMPTED, overdue_report
from tmpi_adapters.reliability.watchdog import format_ranks


class Stopping:
    """How the watch stops its job and says how a stopped job ended.  The
    class using it sets ``process``, ``directory``, ``n``, ``host``,
    ``preemption``, ``interrupted``, ``overdue``, ``progress``,
    ``checkpoint`` and ``reports_seen``.
    """

    def _wait_bounded(self):
        """``mpiexec``'s status; once a preemption's grace has passed (a rank
        stopped or stuck holds the step up), the job is stopped first."""
        if self.preemption is None:
            return self.process.wait()
        try:
            ended = os.pidfd_open(self.process.pid)
        except (AttributeError, OSError):
            ended = None
        try:
            while self.process.poll() is None:
                if self.preemption.overdue():
                    self._stop_overdue()
                    break
                left = self.preemption.left()
                timeout = 1.0 if left is None else min(1.0, left + 0.01)
                if ended is not None:
                    select.select([ended], [], [], timeout)
                else:
                    time.sleep(min(timeout, 0.1))
        finally:
            if ended is not None:
                os.close(ended)
        return self.process.wait()

    def _stop_overdue(self):
        """Stop the job now, ranks first: a stopped rank (SIGSTOP) takes
        nothing but SIGKILL."""
        self.overdue = sorted(
            info.rank for info in read_ranks(self.directory).values()
            if info.host in (None, self.host) and process_state(info.pid) == "T" and
            belongs_to_job(info.pid, self.directory))
        self.stop_at_once()

    def stop_at_once(self):
        """Kill this machine's ranks, then stop ``mpiexec`` (whose proxies end
        the ranks of other hosts): a rank stopped with SIGSTOP takes nothing
        but SIGKILL, and ``mpiexec`` would wait for it."""
        with signals_ignored():
            self.kill_leftovers()
            self.stop_job(grace=2.0)

    def stop_job(self, grace=5.0):
        """Terminate ``mpiexec`` (it ends its ranks), then kill what is left."""
        try:
            self.process.terminate()
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.process.kill()
        except OSError:
            pass
        self.kill_leftovers()

    def kill_leftovers(self):
        """SIGKILL ranks of this job that outlived ``mpiexec`` on this machine."""
        killed = []
        for info in read_ranks(self.directory).values():
            if info.host in (None, self.host) and process_alive(info.pid) and \
                    belongs_to_job(info.pid, self.directory):
                try:
                    os.kill(info.pid, signal.SIGKILL)
                    killed.append(info.rank)
                except OSError:
                    pass
        return killed

    def _preempted_status(self, code):
        """:data:`PREEMPTED` when rank 0 wrote the checkpoint a SIGTERM or
        SIGUSR1 asked for (its report said so), or when this launcher passed
        one on and the job did not finish; else ``None``."""
        try:
            with open(rank_file(self.directory, 0, "preempted"), "rb") as handle:
                report = handle.read().strip()
        except OSError:
            report = None
        asked = self.preemption is not None and self.preemption.signal
        if report is None and not (asked and code != 0):
            return None
        if report is None:
            report = (b"tmpi: the job ended on %s before rank 0 wrote a checkpoint (its "
                      b"ranks were still starting, or one failed first: see above); "
                      b"--resume auto continues from the newest checkpoint, if any."
                      % asked.encode())
        if report not in self.reports_seen:
            sys.stdout.flush()
            sys.stderr.write(report.decode("utf-8", "replace") + "\n")
            sys.stderr.flush()
        return PREEMPTED

    def _overdue_status(self):
        """The job stopped because its step in flight outlasted the
        preemption's grace: :data:`PREEMPTED`, naming the newest checkpoint
        on disk and the steps lost."""
        ranks = read_ranks(self.directory)
        stuck = None
        if self.overdue:
            stuck = "%s (pid %s) %s stopped (SIGSTOP)" % (
                format_ranks(self.overdue), ", ".join(str(ranks[r].pid) for r in self.overdue),
                "is" if len(self.overdue) == 1 else "are")
        zero = ranks.get(0)
        here = zero is None or zero.host in (None, self.host)
        written = self.checkpoint[:2] if self.checkpoint is not None else None
        report = overdue_report(self.preemption.signal, self.preemption.grace,
                                self.preemption.directory, self.progress if zero else None,
                                written, here, stuck)
        if not here and written is None:
            report = report.replace("rank 0's host", zero.host)
        sys.stdout.flush()
        sys.stderr.write(report + "\n")
        sys.stderr.flush()
        return PREEMPTED

    def _interrupted_status(self):
        """Ctrl-C or SIGTERM reached tmpi: one line (unless a rank, interrupted
        too, said it), and the shell's status for the signal."""
        name = signal.Signals(self.interrupted).name
        if not any(line.startswith(b"tmpi: interrupted") for line in self.reports_seen):
            sys.stdout.flush()
            sys.stderr.write("tmpi: interrupted (%s): the job's %d rank(s) were stopped.\n"
                             % (name, self.n))
            sys.stderr.flush()
        return 128 + int(self.interrupted)
