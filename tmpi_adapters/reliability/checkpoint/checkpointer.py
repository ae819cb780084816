"""The checkpointer: sees every call, writes checkpoints on rank 0, drives a resume.

What a checkpoint holds
-----------------------
The state of every training function's model (parameters, optimizer state,
model state, in the script's own order), the rule's ``state_dict()``, what
plugins return from ``tmpi_checkpoint_state``, the random number generators
(:mod:`~tmpi_adapters.reliability.checkpoint.rng`), the session seed, step and
epoch counters, and the call log
(:mod:`~tmpi_adapters.reliability.checkpoint.calllog`): every call the script
made to its compiled Theano functions, with what each returned (the metrics
history) and a fingerprint of its arguments.

When it is taken
----------------
When :mod:`~tmpi_adapters.reliability.checkpoint.policy` says one is due, at
the start of the call after the one that made it due (so what it saves of the
generators is what the next call will see), and when the script ends.  The
file (:mod:`~tmpi_adapters.reliability.checkpoint.fileformat`) is written
atomically; this run keeps its newest ``--checkpoint-keep``.

With ``--resume`` the same object replays the script's first calls and then
loads the saved state (:mod:`~tmpi_adapters.reliability.checkpoint.replay`).

A SIGTERM or SIGUSR1 (:mod:`~tmpi_adapters.reliability.preemption`) makes
rank 0 write a checkpoint at the start of its next call and stop the run.
"""
import os
import sys
import tempfile
import time

from tmpi_adapters.core.protocol import read_values
from tmpi_adapters.errors import CheckpointError
from tmpi_adapters.files import write_atomic
from tmpi_adapters.process.jobdir import (PROGRESS_FILE_ENV, Progress, job_dir, mark,
                                         mark_checkpoint)
from tmpi_adapters.process.output import report
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.reliability import preemption
from tmpi_adapters.reliability.checkpoint import lock
from tmpi_adapters.reliability.checkpoint.calllog import CallLog, fingerprint
from tmpi_adapters.reliability.checkpoint.fileformat import NAME, encode, remove_stale_partials
from tmpi_adapters.reliability.checkpoint.payload import ALLOWED_WORDS, StateError, check
from tmpi_adapters.reliability.checkpoint.policy import Policy
from tmpi_adapters.reliability.checkpoint.replay import Replay
from tmpi_adapters.reliability.checkpoint.rng import Generators

#: Carries a logged ``None`` through the ``tmpi_call`` hook, where ``None``
#: means "no answer, run the call" (a training function without outputs
#: returns ``None``, and a replay must not run it).
_NONE = object()


class Checkpointer:
    """Writes checkpoints on rank 0 and resumes runs on every rank.

    Registered with the session's plugin manager while the run lasts: it sees
    every call of the script's compiled functions (``tmpi_call``), counts
    steps and epochs, records the call log, writes checkpoints when due, and
    during a resume replays calls.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    settings : tmpi_adapters.reliability.plugin.Settings
    control : mpi4py communicator or None
        A communicator of tmpi's own for sharing the checkpoint on resume.

    Attributes
    ----------
    last_written : str or None
        The newest checkpoint this run wrote.
    resumed_from : str or None
        The checkpoint this run resumed from.
    """

    def __init__(self, session, settings, control=None):
        self.session = session
        self.settings = settings
        self.control = control
        self.directory = settings.checkpoint_dir
        self.writer = session.rank == 0 and bool(self.directory)
        self.policy = Policy(settings.checkpoint_every)
        self.log = CallLog() if self.writer else None
        self.generators = Generators()
        self.replay = None
        self.written = []
        self.last_written = None
        self.resumed_from = None
        #: Rank 0's training step for ``tmpi wrap`` (restarts count from it).
        self.progress = None
        self.stopped = None  # the report of a preemption, once written
        self.lock = None  # the directory's lock, held by rank 0 while it runs
        self._answer = None

    # -- lifecycle -----------------------------------------------------------------
    def start(self):
        """Create the directory (rank 0), track Theano's random streams, and
        with ``--resume`` load the checkpoint (collective)."""
        if self.writer:
            try:
                # Private: a checkpoint holds the model, and what a resume trusts.
                os.makedirs(self.directory, mode=0o700, exist_ok=True)
            except OSError as exc:
                raise CheckpointError("cannot create --checkpoint-dir %s: %s."
                                      % (self.directory, exc.strerror or exc))
            try:
                # Found now, not at the first checkpoint an epoch later.
                with tempfile.TemporaryFile(dir=self.directory):
                    pass
            except OSError as exc:
                raise CheckpointError("cannot write to --checkpoint-dir %s: %s. Pass a "
                                      "directory this user may write to."
                                      % (self.directory, exc.strerror or exc))
            # One job at a time writes here; held until this process ends.
            self.lock = lock.hold(self.directory, self.session.script)
            remove_stale_partials(self.directory)
            if job_dir():
                self.progress = Progress(job_dir())
            elif os.environ.get(PROGRESS_FILE_ENV):  # a tmpi wrap above the rank
                self.progress = Progress(path=os.environ[PROGRESS_FILE_ENV])
        self.generators.install()
        if self.settings.resume:
            self._begin_resume()
        return self

    @hookimpl
    def tmpi_before_finish(self, session):
        """Every rank, when the script returns: finish a replay that is still going."""
        if session is self.session and self.replay is not None:
            if self.policy.calls < self.replay.calls:
                raise CheckpointError(
                    "the script ended after %d calls of its compiled functions, but %s was "
                    "written after %d. Resume runs the script again from its start, so it "
                    "needs the same script, arguments and data."
                    % (self.policy.calls, self.replay.path, self.replay.calls))
            self._finish_replay()

    def end(self, error):
        """Session end: write the final checkpoint (when the script succeeded)."""
        try:
            if error is None and self.writer:
                self.write("end")
        finally:
            self.generators.uninstall()
            lock.release(self.lock)
            self.lock = None

    # -- every call -------------------------------------------------------------------
    @hookimpl(wrapper=True)
    def tmpi_call(self, session, call):
        """Around every call: count it, write a checkpoint that fell due before
        it, log it; during a resume, check it against the log (the answer
        comes from :meth:`replayed_call`)."""
        if session is not self.session:
            return (yield)
        if preemption.requested is not None and self.writer:
            self.preempt(call.kind)
        policy, replay = self.policy, self.replay
        if replay is not None:
            if policy.calls < replay.calls:
                logged = replay.check_call(call, policy.calls)
                # A function with updates (a Keras test function's metric
                # accumulators) runs again for its updates; what it returns
                # is what it returned then, on the parameters of then.
                updates = call.kind != "train" and call.function.has_updates
                self._answer = None if updates else logged
                policy.before_call(call.kind)
                try:
                    value = yield
                finally:
                    self._answer = None
                policy.after_call(call.kind)
                policy.due = False
                if updates and logged[0]:
                    return logged[1]
                return None if value is _NONE else value
            self._finish_replay()
        policy.before_call(call.kind)
        if policy.due:
            if self.writer:
                self.write("every")
            elif self.directory:
                # Rank 0 writes it now: every rank can name the last checkpoint.
                self.last_written = self.due_path()
                policy.written()
        print_ = fingerprint(call.args, call.kwargs) if self.log is not None else 0
        value = yield
        if self.log is not None:
            self.log.append(call.function.key, print_, value)
        policy.after_call(call.kind)
        if self.progress is not None:
            self.progress.write(policy.train_calls)
        return value

    @hookimpl(specname="tmpi_call", tryfirst=True)
    def replayed_call(self, session, call):
        """A replayed call whose result the log holds: answered without running."""
        answer = self._answer if session is self.session else None
        if answer is not None and answer[0]:
            return _NONE if answer[1] is None else answer[1]
        return None

    @hookimpl
    def tmpi_after_step(self, session, model, step, samples):
        """Epochs of adapters that know their batches per epoch."""
        if session is self.session:
            self.policy.after_step(model.step, model.n_batch_train)

    # -- writing ----------------------------------------------------------------------------
    def capture(self, finished=False):
        """Everything a resume needs, as of the start of the next call (rank 0);
        ``finished`` when the script has ended."""
        session, policy = self.session, self.policy
        from tmpi_adapters.version import __version__
        plugins = {}
        for part in session.pm.hook.tmpi_checkpoint_state(session=session):
            plugins.update(part or {})
        _check_state(plugins, "a plugin's tmpi_checkpoint_state", self._plugin_states)
        rule_state = session.rule.state_dict()
        _check_state(rule_state, "rule %s's state_dict()" % session.options.rule)
        return {
            "tmpi": __version__,
            "created": time.time(),
            "script": os.path.basename(session.script or ""),
            "arguments": list(sys.argv[1:]),
            "ranks": session.size,
            "rule": session.options.rule,
            "rule_options": dict(session.options.rule_options),
            "scaling": session.options.scaling,
            "seed": session.seed,
            "point": {"calls": policy.calls, "train_calls": policy.train_calls,
                      "epochs": policy.epochs, "finished": finished},
            "models": [{
                "name": model.name,
                "step": model.step,
                "signature": model.signature(),
                # Host arrays: a device run resumes on the CPU, and back.
                "values": read_values(model.state_variables),
            } for model in session.models],
            "rule_state": rule_state,
            "plugins": plugins,
            "rng": self.generators.state(),
            "log": self.log.state(),
        }

    def _plugin_states(self):
        """``(naming, state)`` of each plugin's ``tmpi_checkpoint_state``, one
        at a time (to name the one whose state is not data)."""
        session = self.session
        for impl in session.pm.hook.tmpi_checkpoint_state.get_hookimpls():
            arguments = {"session": session}
            yield ("plugin %s's tmpi_checkpoint_state" % impl.plugin_name,
                   impl.function(*[arguments[name] for name in impl.argnames]))

    def due_path(self):
        """The file of the checkpoint due now (named by its training call)."""
        return os.path.join(self.directory, NAME % self.policy.train_calls)

    def write(self, reason):
        """Write a checkpoint now (rank 0); ``reason`` is ``"every"``,
        ``"preempted"`` or ``"end"``."""
        state = self.capture(finished=reason == "end")
        header = {key: state[key] for key in ("tmpi", "created", "script", "ranks", "rule")}
        header.update(state["point"])
        path = self.due_path()
        try:
            write_atomic(path, encode(state, header))
        except OSError as exc:
            raise CheckpointError("cannot write checkpoint %s: %s. Check --checkpoint-dir "
                                  "and the free space there." % (path, exc.strerror or exc))
        if path in self.written:
            self.written.remove(path)
        self.written.append(path)
        self.last_written = path
        mark_checkpoint(path, int(header.get("train_calls", 0)), reason == "end")
        self.policy.written()
        self._prune()
        return path

    def preempt(self, kind):
        """Rank 0, at the start of a call once a signal asked for a stop:
        write a checkpoint of the run as it is (none while a replay retraces
        the checkpoint it resumed from: that one stays the newest), say so,
        and raise :class:`~tmpi_adapters.reliability.preemption.Preempted`."""
        if self.stopped is None:
            if self.replay is None:
                self.policy.before_call(kind)
                saved = "wrote %s at step %d" % (self.write("preempted"),
                                                  self.policy.train_calls)
            else:
                saved = ("it was still replaying the calls before %s, which stays the "
                         "newest checkpoint" % self.replay.path)
            self.stopped = (
                "tmpi: preempted: %s; the job ends with status %d. Run the same command "
                "with --resume auto to continue exactly where it stopped."
                % (saved, preemption.PREEMPTED))
            mark(self.session.rank, "preempted", self.stopped)
            report(self.stopped)
        raise preemption.Preempted(self.stopped)

    def _prune(self):
        """Keep the newest ``--checkpoint-keep`` files this run wrote."""
        while len(self.written) > self.settings.checkpoint_keep:
            try:
                os.unlink(self.written.pop(0))
            except OSError:
                pass

    # -- resuming ------------------------------------------------------------------------------
    def _begin_resume(self):
        session = self.session
        replay = Replay.load(session, self.settings, self.control)
        if replay is None:
            session.print("tmpi: --resume auto: no checkpoint in %s yet; starting "
                          "from the beginning." % self.directory)
            return
        self.replay, self.resumed_from = replay, replay.path
        state = replay.state
        # The script's own random draws retrace the original run from here.
        seed = state["seed"]
        if session.options.seed not in (None, seed):
            session.print("tmpi: warning: --seed %s ignored: a resumed run keeps the "
                          "seed of the run it continues (%s)." % (session.options.seed, seed))
        if seed is not None:
            session.seed = seed
            Generators.seed(seed)
        if self.writer:
            # The log goes on from the checkpoint's; the replay only reads the
            # calls before the checkpoint, this run appends after them.
            self.log = replay.log
        session.print("tmpi: resuming from %s (step %d, %d rank(s), written %s): "
                      "replaying the first %d calls." % (
                          replay.path, state["point"]["train_calls"], state["ranks"],
                          time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(state["created"])),
                          replay.calls))

    def _finish_replay(self):
        """At the first call past the checkpoint: load the saved state everywhere."""
        self.replay.finish(self.session, self.generators, self.policy.calls)
        self.replay = None
        self.policy.restart()



def _check_state(state, source, parts=None):
    """:class:`CheckpointError` naming ``source`` when ``state`` holds
    anything but data (:mod:`~tmpi_adapters.reliability.checkpoint.payload`);
    ``parts()``, where given, yields ``(source, state)`` of each contributor,
    to name the one at fault."""
    try:
        check(state)
    except StateError as error:
        for part_source, part in (parts() if parts else ()):
            try:
                check(part)
            except StateError as part_error:
                source, error = part_source, part_error
                break
        raise CheckpointError(
            "%s returned %s; a checkpoint holds only %s, never objects or code. Return the "
            "object's data and build it again in tmpi_restore_state / load_state_dict."
            % (source, error.found, ALLOWED_WORDS)) from None
