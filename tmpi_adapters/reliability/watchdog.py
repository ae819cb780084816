"""The watchdog: a heartbeat thread on every rank that names the ranks a stall waits for.

When ranks wait on a collective that others never reach (a script that
validates on rank 0 only, data that gives one rank fewer batches), the waiting
ranks cannot ask the missing ones anything through the stuck communicator.
So every rank runs a small thread that, once per interval, sends its status
to every other rank on a communicator of its own (``MPI_THREAD_MULTIPLE``,
which mpi4py initialises): what it is doing (a training step, the script
between steps, finishing), which step of which training function, whether it
is stalled and in what, and the line of the user's script it is at.  That works
across machines, and while the main thread of every rank is stuck.

A stall is declared by the exchanger's own deadline (``--stall-timeout``): it
calls :meth:`Watchdog.on_stall`, which notes it and returns so the wait goes
on.  The lowest stalled rank then reports, from its thread, which ranks have
not reached the collective and what every rank is doing; the report repeats
every ``--stall-timeout`` while the stall lasts.  With ``--on-stall abort`` the
job ends after the report.

The thread also ends the job when the launching ``tmpi`` process is gone.
"""
import os
import socket
import sys
import threading
import time

from tmpi_adapters.errors import StallError
from tmpi_adapters.exchangers.waiting import current_wait, oversubscribed, wait_for
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.reliability import preemption

#: The tag of heartbeat messages on the watchdog's own communicator.
HEARTBEAT_TAG = 7301


def format_ranks(ranks):
    """``[0, 1, 2, 5]`` -> ``"ranks 0-2, 5"``; ``[3]`` -> ``"rank 3"``."""
    ranks = sorted(ranks)
    if not ranks:
        return "no rank"
    parts, start = [], ranks[0]
    for previous, current in zip(ranks, ranks[1:] + [None]):
        if current != previous + 1:
            parts.append(str(start) if start == previous else "%d-%d" % (start, previous))
            start = current
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)


def where_in_script(frame, limit=64):
    """``"train.py:57 in main: loss = train_fn(x, y)"`` for the innermost user frame."""
    from tmpi_adapters.process.failure import is_library_frame
    depth = 0
    while frame is not None and depth < limit:
        code = frame.f_code
        if not is_library_frame(code.co_filename):
            import linecache
            line = linecache.getline(code.co_filename, frame.f_lineno).strip()
            return "%s:%d in %s%s" % (os.path.basename(code.co_filename), frame.f_lineno,
                                      code.co_name, (": " + line) if line else "")
        frame, depth = frame.f_back, depth + 1
    return None  # not inside the user's code (starting, or the script has returned)


def frame_on_stack(frame, top, limit=256):
    """True while ``frame`` is still executing below ``top`` (the thread's innermost)."""
    depth = 0
    while top is not None and depth < limit:
        if top is frame:
            return True
        top, depth = top.f_back, depth + 1
    return False


def describe_status(status, now, interval):
    """One line of a stall report for one rank's latest status."""
    if status is None:
        return "no heartbeat received (it may not have started, or be gone)"
    model, step = status.get("model"), status.get("step")
    after = "after step %d of %s" % (step, model) if model else "before its first training step"
    stall = status.get("stall")
    if stall:
        text = "waiting %.0f s in %s" % (stall["waited"] + now - status["time"], stall["what"])
        if status["phase"] == "step":
            text += ", in step %d of %s" % (step + 1, model)
        elif status["phase"] == "finishing":
            text += ", having finished the script %s" % after
    elif status["phase"] == "step":
        text = "in step %d of %s" % (step + 1, model)
    elif status["phase"] == "finishing":
        text = "finished the script %s, waiting for the others to finish" % after
    elif status["phase"] == "finished":
        text = "finished"
    elif status["phase"] == "exited":
        text = "ended the script with status %s %s" % (status["code"], after)
    else:
        text = "running the script %s" % after
    if status.get("where"):
        text += ", at %s" % status["where"]
    age = now - status["time"]
    if age > 3 * interval + 1 and status["phase"] != "exited":
        text += " (last heard %.0f s ago: busy inside compiled code, or gone)" % age
    return text


def missing_ranks(statuses, reporter):
    """Ranks that have not reached the collective ``reporter`` is stalled in.

    In a training step: ranks not in the same step of the same training
    function.  Elsewhere (finishing, a meeting while compiling): ranks in
    another phase, or in the same one but not waiting for the others.
    Ranks never heard from are missing too.
    """
    mine = statuses[reporter]
    missing = []
    for rank, status in sorted(statuses.items()):
        if status is None:
            missing.append(rank)
        elif mine["phase"] == "step":
            if not (status["phase"] == "step" and status.get("model") == mine.get("model")
                    and status.get("step") == mine.get("step")):
                missing.append(rank)
        elif status["phase"] != mine["phase"] or (
                rank != reporter and not status.get("stall")
                and status.get("waiting") is None):
            missing.append(rank)
    return missing


def stall_report(statuses, reporter, now, interval, on_stall):
    """The paragraph a user sees for a stall, from every rank's latest status."""
    mine = statuses[reporter]
    stall = mine["stall"]
    missing = missing_ranks(statuses, reporter)
    waiting = sorted(r for r, s in statuses.items() if r not in missing and s and
                     s.get("stall") and s["stall"]["what"] == stall["what"]) or [reporter]
    head = "tmpi: stall: %s waited %.0f s in %s; " % (
        format_ranks(waiting), stall["waited"] + now - mine["time"], stall["what"])
    if missing:
        head += "%s %s not reached it." % (format_ranks(missing),
                                           "has" if len(missing) == 1 else "have")
    else:
        head += "the ranks wait on each other in different places."
    hosts = {r: s.get("host") for r, s in statuses.items() if s}
    several = len(set(hosts.values())) > 1  # then each line says where its ranks run
    if missing and several:
        where = sorted({hosts[r] for r in missing if hosts.get(r)})
        if where:
            head += " %s on %s." % ("It is" if len(missing) == 1 else "They are",
                                    " and ".join(where))
    groups = {}
    for rank, status in sorted(statuses.items()):
        key = (describe_status(status, now, interval), hosts.get(rank) if several else None)
        groups.setdefault(key, []).append(rank)
    lines = [head] + ["  %s: %s%s" % (format_ranks(ranks), "on %s, " % host if host else "", text)
                      for (text, host), ranks in sorted(groups.items(),
                                                        key=lambda kv: kv[1][0])]
    lines.append(
        "  Every rank must make the same collective calls in the same order: call the "
        "training function the same number of times on every rank (same number of "
        "batches), and run code that trains or exchanges on every rank, not on rank 0 "
        "only.")
    if on_stall == "abort":
        lines.append("  Ending the job (--on-stall abort).")
    else:
        lines.append("  The job keeps waiting; --on-stall abort ends such a job, "
                     "--stall-timeout sets when a wait counts as a stall.")
    return "\n".join(lines)


def _give_up(what, waited, frame):
    """The end of a wait that may simply end (see :meth:`Watchdog.stop`)."""
    raise TimeoutError("gave up waiting %.1f s for %s" % (waited, what))


class Watchdog:
    """Heartbeats, stall reports and the launcher check of one rank.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    on_stall : str
        ``"report"`` (default) or ``"abort"``.
    interval : float, optional
        Seconds between heartbeats (default: a quarter of the stall timeout,
        at most 1 s).
    """

    def __init__(self, session, on_stall="report", interval=None, heartbeats=True):
        self.session = session
        self.rank, self.size = session.rank, session.size
        self.on_stall_action = on_stall
        self.timeout = session.options.stall_timeout or 300.0
        self.interval = interval or min(1.0, max(0.05, self.timeout / 4.0))
        self.heartbeats = heartbeats and self.size > 1
        self.host = socket.gethostname()
        self.phase = "script"
        self.last_step = (None, 0)
        self.stall = None              # {"what", "since", "frame"} while stalled
        self.leaving = None            # (status, where) once the script chose to exit
        self.leave_at = None           # when the ranks leave together (a preemption)
        self.statuses = {}             # rank -> latest status received
        self.comm = None
        self._main = threading.main_thread().ident
        self._sends = []
        self._last_report = None
        self._stop = threading.Event()
        self._thread = None
        self.launcher = self._launcher_to_watch()

    # -- lifecycle ----------------------------------------------------------------
    @staticmethod
    def threads_supported():
        from mpi4py import MPI
        return MPI.Query_thread() == MPI.THREAD_MULTIPLE

    def start(self):
        """Duplicate the communicator (collective) and start the thread.

        Stalls reach the watchdog through ``tmpi_stall`` once it is
        registered with the session's plugin manager (see
        :class:`~tmpi_adapters.reliability.plugin.Reliability`).
        """
        if self.heartbeats:
            self.comm = self.session.comm.Dup()
        if self.heartbeats or self.launcher:
            self._thread = threading.Thread(target=self._run, name="tmpi-watchdog",
                                            daemon=True)
            self._thread.start()
        return self

    def stop(self, together=False, leaving=None):
        """Stop the thread.

        With ``together`` (every rank is ending normally) the ranks then wait
        for each other and take in the last heartbeats, so none is left in
        flight when MPI finalizes; after a failure nothing waits for anyone.
        ``leaving``, ``(status, where)``: the script ended this rank with a
        non-zero ``sys.exit`` while the others may go on; a last heartbeat
        tells them, so a rank that waits for this one ends the job at once
        (see :meth:`_check_departed`) instead of waiting for ever.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval + 1)
        if self.comm is not None and leaving is not None:
            self.leaving = leaving
            self.leave_at = time.time() + preemption.DEPARTURE
            self.phase = "exited"
            self._send(self.status())
        self.phase = "finished"
        if self.comm is None:
            return
        self._wait_at_most(self._sent, "the last heartbeats to be sent", 2.0)
        if together:
            self._wait_at_most(self.comm.Ibarrier().Test, "the other ranks' watchdogs",
                               self.timeout)
            self._receive()

    def _wait_at_most(self, test, what, seconds):
        """Wait until ``test()`` or for ``seconds``, whichever comes first:
        at the end of a run a late rank is no stall to report."""
        try:
            wait_for(test, what, seconds, _give_up, crowded=oversubscribed(self.size))
        except TimeoutError:
            pass

    # -- what the main thread tells it ------------------------------------------------
    @hookimpl
    def tmpi_stall(self, session, what, waited, frame):
        """A wait of this rank passed the stall timeout: note it (the thread
        reports it) and keep waiting (registered only while heartbeats run)."""
        if session is not self.session:
            return None
        self.on_stall(what, waited, frame)
        return True

    @hookimpl
    def tmpi_after_step(self, session, model, step, samples):
        if session is self.session:
            self.after_step(model)

    def on_stall(self, what, waited, frame):
        """Note a stall and keep waiting (raise without heartbeats).

        Called on the main thread from inside the wait; the wait's ``frame``
        (see :class:`tmpi_adapters.exchangers.waiting.Deadline`) tells the
        thread when the wait is over.
        """
        self.stall = {"what": what, "since": time.time() - waited, "frame": frame}
        if not self.heartbeats:
            raise StallError("rank %d waited %.0f s in %s; other ranks never reached it."
                             % (self.rank, waited, what))

    def wait(self, request, what):
        """Wait on an MPI request of the main thread, declaring a stall at the timeout."""
        wait_for(request.Test, what, self.timeout, self.on_stall,
                 crowded=oversubscribed(self.size))

    def after_step(self, model):
        self.last_step = (model.name, model.step)

    # -- the thread ---------------------------------------------------------------------
    def status(self):
        """This rank's status, as sent to the others."""
        session = self.session
        stepping = session.stepping
        top = sys._current_frames().get(self._main)
        stall = self.stall
        if stall is not None and not frame_on_stack(stall["frame"], top):
            stall = self.stall = None
        if self.phase == "exited":
            phase, (model, step) = self.phase, self.last_step
        elif stepping is not None:
            phase, model, step = "step", stepping.name, stepping.step
        else:
            phase, (model, step) = self.phase, self.last_step
            if phase == "script" and session.finishing:
                phase = "finishing"
        now = time.time()
        lockstep = session.exchanger.lockstep
        collective = dict(lockstep.current) if lockstep and lockstep.current else None
        wait = current_wait(self._main)
        status = {
            "rank": self.rank, "host": self.host, "pid": os.getpid(), "time": now,
            "phase": phase, "model": model, "step": step, "collective": collective,
            "stall": None if stall is None else {"what": stall["what"],
                                                 "waited": now - stall["since"]},
            "reported": self._last_report is not None and stall is not None,
            "where": where_in_script(top) if top is not None else None,
            # Seconds the main thread has been waiting for other ranks.
            "waiting": None if wait is None else time.perf_counter() - wait.start,
            # A signal asked for a checkpoint and a stop: rank 0 acts on it.
            "stop": preemption.requested,
        }
        if self.leaving is not None:
            status["code"], status["where"] = self.leaving
            # Rank 0 preempted among srun's tasks: the others leave too, all
            # at the same moment.
            if self.leaving[0] == preemption.PREEMPTED and preemption.requested is not None:
                status["preempted"] = self.leave_at
        return status

    def _run(self):
        try:
            while not self._stop.wait(self.interval):
                self.tick()
        except Exception as error:  # noqa: B902 - the watchdog must never kill a rank
            from tmpi_adapters.process.output import report
            report("tmpi: watchdog of rank %d stopped: %s: %s"
                   % (self.rank, type(error).__name__, error))

    def tick(self):
        """One heartbeat: send, receive, check the launcher, report a stall."""
        mine = self.status()
        self.statuses[self.rank] = mine
        if self.comm is not None:
            self._send(mine)
            self._receive()
        if self.launcher and not self._launcher_alive():
            self._launcher_gone()
        self._check_departed(mine)
        self._check_lockstep(mine)
        if mine["stall"] is None:
            self._last_report = None
            return
        self._maybe_report(mine)

    def _send(self, status):
        # Pickled sends keep their buffer alive in the request until done.
        self._sent()
        for rank in range(self.size):
            if rank != self.rank:
                self._sends.append(self.comm.isend(status, dest=rank, tag=HEARTBEAT_TAG))

    def _sent(self):
        """Forget the heartbeats that have left; True when none is in flight."""
        self._sends = [r for r in self._sends if not r.Test()]
        return not self._sends

    def _receive(self):
        from mpi4py import MPI
        probe = MPI.Status()
        while self.comm.iprobe(source=MPI.ANY_SOURCE, tag=HEARTBEAT_TAG, status=probe):
            try:
                received = self.comm.recv(source=probe.Get_source(), tag=HEARTBEAT_TAG)
            except Exception:  # noqa: B902 - a garbled heartbeat is only skipped
                continue
            self.statuses[received["rank"]] = received
            if received.get("stop") and self.rank == 0:
                preemption.request(received["stop"])

    def _maybe_report(self, mine):
        now = time.time()
        stalled = mine["stall"]["waited"]
        fresh = {r: s for r, s in self.statuses.items()
                 if s is not None and now - s["time"] <= 3 * self.interval + 1}
        others_stalled = [r for r, s in fresh.items() if r != self.rank and s.get("stall")]
        reported_elsewhere = any(fresh[r].get("reported") for r in others_stalled)
        lowest = min(others_stalled + [self.rank])
        overdue = stalled > 2 * self.timeout + 10 * self.interval
        if self._last_report is None:
            if stalled < self.timeout + 2 * self.interval:
                return  # let ranks that stalled at the same moment say so first
            if lowest != self.rank or reported_elsewhere:
                # Another rank speaks; in abort mode speak anyway once it is
                # long overdue (that rank may be unable to).
                if not (overdue and self.on_stall_action == "abort"):
                    return
        elif now - self._last_report < self.timeout:
            return
        self._last_report = now
        statuses = {r: self.statuses.get(r) for r in range(self.size)}
        statuses[self.rank] = mine
        text = stall_report(statuses, self.rank, now, self.interval, self.on_stall_action)
        from tmpi_adapters.process.jobdir import mark
        from tmpi_adapters.process.output import report
        report(text)
        if self.on_stall_action == "abort":
            # The report in full: the launcher shows it if the abort ends
            # the job before mpiexec has passed the lines on.
            mark(self.rank, "failed", text)
            self._abort(StallError.exit_code)

    def _check_lockstep(self, mine):
        """End the job when this rank and another wait in collectives that
        cannot match: the same collective number, different envelopes, both
        for longer than a heartbeat (a size mismatch that MPI never completes).

        The lowest such rank reports; the check needs no stall timeout.
        """
        now = time.time()
        ours = mine.get("collective")
        if not ours or ours.get("token") is None or now - ours["since"] < self.interval:
            return
        apart = {}
        for rank, status in self.statuses.items():
            theirs = status.get("collective") if status else None
            if (rank == self.rank or not theirs or theirs.get("token") is None
                    or theirs["sequence"] != ours["sequence"]
                    or theirs["token"] == ours["token"]
                    or status["time"] - theirs["since"] < self.interval):
                continue
            apart[rank] = theirs["description"]
        if not apart or min(apart) < self.rank:
            return
        apart[self.rank] = ours["description"]
        from tmpi_adapters.errors import LockstepError
        from tmpi_adapters.exchangers.envelope import mismatch_message
        from tmpi_adapters.process.jobdir import mark
        from tmpi_adapters.process.output import report
        text = "tmpi: error: %s" % mismatch_message(apart, self.rank)
        report(text)
        mark(self.rank, "failed", text)
        self._abort(LockstepError.exit_code)

    def _check_departed(self, mine):
        """End the job when this rank waits for others and one of them has
        left: its script ended with a non-zero ``sys.exit`` (its last
        heartbeat says so) and it will never reach another collective.

        Ranks still at work are left alone (all ranks may be exiting the
        same way); they end the job once they wait.  The lowest rank still
        running reports; the job ends with the departed rank's status.
        """
        departed = {r: s for r, s in self.statuses.items()
                    if r != self.rank and s and s["phase"] == "exited"}
        if not departed:
            return
        first = min(departed)
        left = departed[first]
        if left.get("preempted"):
            # Rank 0 has its checkpoint and leaves at a named moment: this rank
            # leaves with it whatever it is doing (the run resumes from there).
            self._leave_preempted(left["preempted"])
        if mine.get("waiting") is None or mine["waiting"] < self.interval:
            return
        wait = current_wait(self._main)
        what = wait.what if wait is not None and isinstance(wait.what, str) else "a collective"
        status = dict(mine, stall={"what": what, "waited": mine["waiting"]})
        lines = ["tmpi: rank %d ended its script with status %s (sys.exit) while %s "
                 "went on; no rank can take part in a collective with it, so the job "
                 "was ended with that status." % (
                     first, left["code"], format_ranks(
                         [r for r in range(self.size) if r not in departed]))]
        statuses = {r: self.statuses.get(r) for r in range(self.size)}
        statuses[self.rank] = status
        for rank in sorted(statuses):
            lines.append("  rank %d: %s" % (rank, describe_status(
                statuses[rank], time.time(), self.interval)))
        text = "\n".join(lines)
        from tmpi_adapters.process.jobdir import mark
        from tmpi_adapters.process.output import report
        running = [r for r in range(self.size) if r not in departed]
        if self.rank == min(running):
            report(text)
        mark(self.rank, "failed", text)
        code = left["code"] if isinstance(left["code"], int) and 0 < left["code"] < 256 else 1
        self._abort(code)

    # -- the launching process ------------------------------------------------------------
    def _launcher_to_watch(self):
        from tmpi_adapters.process.jobdir import LAUNCHER_HOST_ENV, LAUNCHER_PID_ENV
        pid, host = os.environ.get(LAUNCHER_PID_ENV), os.environ.get(LAUNCHER_HOST_ENV)
        if not pid or host != socket.gethostname():
            return None  # another machine's process cannot be checked from here
        try:
            return int(pid)
        except ValueError:
            return None

    def _launcher_alive(self):
        from tmpi_adapters.process.jobdir import process_alive
        return process_alive(self.launcher)

    def _launcher_gone(self):
        from tmpi_adapters.process.jobdir import mark
        from tmpi_adapters.process.output import report
        if self.rank == 0 or self.size == 1:
            report("tmpi: the tmpi process that launched this job (pid %d) is gone; "
                   "ending the job." % self.launcher)
        mark(self.rank, "failed", "launcher gone")
        self._abort(1)

    def _leave_preempted(self, at):
        """Rank 0 wrote the checkpoint a preemption asked for and left (an
        task of srun, :func:`~tmpi_adapters.process.failure.leaves_together`):
        this rank leaves too with the same status, on its
        own, so that srun sees every task end
        with it instead of tearing the job down with SIGKILL.  Its ``tmpi
        wrap`` is told first, then all ranks leave at the moment ``at`` rank
        0 named: a rank that crashes when MPI loses its peers has said
        already how it ended."""
        from tmpi_adapters.process.jobdir import mark
        from tmpi_adapters.process.output import flush_partial_lines
        mark(self.rank, "preempted")
        flush_partial_lines()
        sys.stdout.flush()
        sys.stderr.flush()
        time.sleep(max(0.0, min(at - time.time(), preemption.DEPARTURE)))
        os._exit(preemption.PREEMPTED)

    def _abort(self, code):
        from mpi4py import MPI
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(code)
