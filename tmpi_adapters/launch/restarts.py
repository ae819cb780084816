"""Restarting a job whose rank failed: ``--max-restarts K``, ``--min-ranks M``.

When a rank of the job is killed, crashes or vanishes (what
:attr:`~tmpi_adapters.launch.watch.JobWatch.failure` names), the launcher
starts the job again, at most K times, as a fresh ``mpiexec`` job (no MPI
communicator outlives a failure), resumed from the newest checkpoint that
verifies in ``--checkpoint-dir``: the replay of an exact resume, so the
result is the uninterrupted run's.  What the script chose (``sys.exit``),
tmpi's own errors (bad input, a mismatch, non-finite values, a stall, a bad
checkpoint), Ctrl-C and a preemption end the job as they do without
restarts.

A restarted job that fails again before it completes a training step past
its checkpoint *failed at once*: retrying it as it is would only fail again.
With ``--min-ranks M`` the next attempt runs on one rank fewer, down to M
(under BSP the global batch is split over whatever ranks there are, so the
result stays the one-process result); without it the job ends there.
"""
import os
import sys

from tmpi_adapters.reliability.checkpoint.fileformat import (list_checkpoints,
                                                             newest_that_verifies)
from tmpi_adapters.reliability.plugin import Settings


class Restarts:
    """The restarts of one ``tmpi wrap`` job.

    Parameters
    ----------
    settings : tmpi_adapters.reliability.plugin.Settings
        ``max_restarts`` (K > 0), ``min_ranks``, ``checkpoint_dir``.
    """

    def __init__(self, settings):
        self.most = settings.max_restarts
        self.fewest = settings.min_ranks
        self.directory = settings.checkpoint_dir
        #: Started with --resume latest or auto: any checkpoint there is this run's.
        self.resumed = settings.resume in ("latest", "auto")
        # Checkpoints there before the job: otherwise a restart resumes only
        # from one this job wrote (or as the job began, --resume FILE included).
        self.before = {path: _mtime(path) for path in list_checkpoints(self.directory)}
        self.done = 0
        self.recomputed = 0

    @classmethod
    def from_options(cls, options, ranks):
        """The restarts ``options`` ask for, or ``None`` (no ``--max-restarts``)."""
        settings = Settings.from_extra(options.extra, ranks)
        return cls(settings) if settings.max_restarts else None

    def run(self, run_job, options, n, stop=None, hosts=None):
        """Run the job (``run_job(options, n)`` returns its
        :class:`~tmpi_adapters.launch.watch.JobWatch`) until it ends without a
        failure a restart may mend, or cannot be restarted; returns its
        status.  ``stop`` (:class:`~tmpi_adapters.launch.signals.Preemption`):
        no restart once the launcher was asked to stop.  ``hosts``
        (:class:`~tmpi_adapters.launch.hosts.HostSet`, which ``run_job``
        places the ranks on): before a restart every host is asked whether
        it is there; one that is not is left out, down to ``--min-ranks``."""
        start = 0  # the step the running attempt resumed from
        while True:
            watch = run_job(options, n)
            if watch.failure is None or (stop is not None and stop.signal):
                break
            again = self.done > 0 and watch.progress <= start
            if again and not (self.fewest and n - 1 >= self.fewest):
                self._say("not restarting: %s again before the restarted job completed a "
                          "step past its checkpoint (step %d): a restart would fail the same "
                          "way. Fix the cause, then continue with --resume auto%s."
                          % (watch.failure, start, "" if self.fewest else
                             " (--min-ranks M lets a restart continue on fewer ranks when "
                             "one cannot come back)"))
                break
            if self.done == self.most:
                self._say("not restarting: %s, and the job has had its %d restart(s) "
                          "(--max-restarts). Fix the cause, then continue with --resume "
                          "auto." % (watch.failure, self.most))
                break
            path, step, finished = self._checkpoint(watch)
            if finished:
                self._say("not restarting: %s after the run had finished (%s was written "
                          "when its script ended): there is nothing left to run."
                          % (watch.failure, path))
                break
            if hosts is not None:
                first = hosts.hosts[0] if hosts.hosts else None
                gone = hosts.drop_unreachable()
                if gone:
                    reason = "; ".join("host %s is gone (%s)" % (h.name, why) for h, why in gone)
                    if not (self.fewest and hosts.slots >= self.fewest):
                        self._say("not restarting: %s after %s; %s" % (
                            reason, watch.failure,
                            "the other hosts have %d rank(s), fewer than --min-ranks %d."
                            % (hosts.slots, self.fewest) if self.fewest else
                            "--min-ranks M lets a restart continue on the other hosts."))
                        break
                    n = min(n, hosts.slots)
                    self._say("%s: the restart runs on %s (--min-ranks %d)."
                              % (reason, hosts.describe(), self.fewest))
                    if path is not None and first in hosts.dropped and \
                            not os.path.exists(path):
                        self._say("the checkpoints were on %s, rank 0's host: the restart "
                                  "begins where the job began." % first.name)
                        path = None
            if path is None:
                step = 0  # from the beginning, or from what the job first resumed
            else:
                options = options.replace(extra=dict(options.extra, resume=path))
            self.done += 1
            self.recomputed += max(0, watch.progress - step)
            if again:
                n -= 1
            self._say("restart %d of %d (%s %s): continuing from %s on %d rank(s)%s."
                      % (self.done, self.most, watch.failure, _when(watch.progress, start),
                         "%s (step %d)" % (path, step) if path else
                         "where the job began (it had written no checkpoint)", n,
                         ", one fewer: it failed again at once (--min-ranks %d)"
                         % self.fewest if again else ""))
            start = step
        if self.done:
            self._say("the job was restarted %d time(s); %d step(s) were computed again "
                      "(done after the checkpoint a restart resumed from, before its "
                      "failure)." % (self.done, self.recomputed))
        return watch.status

    def _checkpoint(self, watch):
        """``(path, step, finished)`` of the checkpoint the next attempt
        resumes from: the newest that verifies and that this job wrote (any,
        when it was started with ``--resume latest`` or ``auto``), or
        ``(None, None, False)``.  Where rank 0 wrote it on another machine
        (``--hosts``), the one it said it wrote: rank 0 reads it there."""
        reported = getattr(watch, "checkpoint", None)
        if reported is not None and not os.path.exists(reported[0]):
            return reported
        path, _, header, skipped = newest_that_verifies(self.directory)
        for corrupt, reason in skipped:
            self._say("warning: %s %s; passed over." % (corrupt, reason))
        if path is None or not self.resumed and self.before.get(path) == _mtime(path):
            return None, None, False
        return path, int(header.get("train_calls", 0)), bool(header.get("finished"))

    @staticmethod
    def _say(text):
        sys.stdout.flush()
        sys.stderr.write("tmpi: %s\n" % text)
        sys.stderr.flush()


def _when(progress, start):
    """When a job that resumed from step ``start`` failed, having reached ``progress``."""
    if progress > start:
        return "at step %d" % progress
    return "before it completed a step" + (" past step %d" % start if start else "")


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None
