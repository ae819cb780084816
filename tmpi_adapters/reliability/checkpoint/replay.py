"""A resume: finding the checkpoint, replaying the script's first calls, loading the state.

A script cannot be told to start at epoch 7: its loop starts at 0.  So with
``--resume`` the script runs again from its start, with the checkpoint's seed,
and its first ``C`` calls of compiled functions (``C`` is where the checkpoint
was taken) are *replayed*: they do no work and return what they returned in
the original run (the :class:`~tmpi_adapters.reliability.checkpoint.calllog.CallLog`),
so the script's own loop, random draws, accumulators and decisions retrace
the original run exactly.  The first replayed call of each training function
loads its saved variables, so what the script reads of them meanwhile (the
weights it writes to its files) is the checkpoint's, never the initial ones.
At the start of call ``C`` (or when the script ends) :meth:`Replay.finish`
loads the saved state into the script's own shared variables and sets the
generators, and training goes on for real.

``latest`` and ``auto`` take the newest checkpoint that verifies, naming the
corrupt ones passed over; a checkpoint of a finished run, resumed with the
same arguments, is refused (:class:`FinishedRunError`): the script would only
rewrite its files.

Each replayed call is checked against the log (:meth:`Replay.check_call`: the
same function, arguments with the same fingerprint) and each model against
the checkpoint's signature (:meth:`Replay.check_model`): a script that does
not retrace its run is stopped with a clear error instead of silently
continuing somewhere else.
"""
import itertools
import os
import shlex
import sys
import time

from tmpi_adapters.core.protocol import comparable
from tmpi_adapters.errors import CheckpointError, ConfigError
from tmpi_adapters.reliability.checkpoint.calllog import CallLog, fingerprint
from tmpi_adapters.reliability.checkpoint.fileformat import (decode, newest_that_verifies,
                                                             read_bytes, verify)


class FinishedRunError(CheckpointError):
    """The checkpoint was written when its run finished: there is nothing to
    resume, and running the script again could only overwrite its files."""


class Replay:
    """A resume in progress: the checkpoint's state and its call log.

    Parameters
    ----------
    path : str
        The checkpoint file.
    header, state
        What :func:`~tmpi_adapters.reliability.checkpoint.fileformat.decode`
        read from it.
    """

    def __init__(self, path, header, state):
        self.path = path
        self.header = header
        self.state = state
        self.log = CallLog.from_state(state["log"])
        self.calls = int(state["point"]["calls"])
        self.models = {m["name"]: m for m in state["models"]}
        self.checked = set()
        self.recomputed = set()
        self.started = None  # the first replayed call

    # -- finding and sharing the checkpoint ------------------------------------------------
    @classmethod
    def load(cls, session, settings, comm=None):
        """The replay of ``settings.resume`` on every rank (rank 0 reads the
        file and shares it on ``comm``); ``None`` for ``--resume auto``
        without a checkpoint."""
        path, data, error = (None,) * 3
        if session.rank == 0:
            path, data, error, skipped = _load_on_rank0(settings)
            for note in skipped:
                session.print("tmpi: warning: --resume %s: skipped %s" % (settings.resume, note))
            if path is not None:
                loose = writable_by_others(path)
                if loose:
                    session.print("tmpi: warning: --resume %s: %s writable by other users, "
                                  "who could have replaced what this run loads: chmod go-w "
                                  "them." % (path, loose))
        if session.size > 1:
            path, data, error = _share(comm if comm is not None else session.comm,
                                       session.rank, path, data, error)
        if error:
            raise CheckpointError(error)
        if path is None:
            return None
        header, state = decode(data, path)
        replay = cls(path, header, state)
        replay.check_run(session, settings)
        return replay

    def check_run(self, session, settings=None):
        """Refuse a checkpoint of another script or other script arguments
        (unless ``--allow-new-arguments``: then another script is warned of),
        of another rule or scaling mode, or of a run that finished with these
        (:class:`FinishedRunError`)."""
        options, state, path = session.options, self.state, self.path
        arguments, saved = list(sys.argv[1:]), state.get("arguments")
        allow = getattr(settings, "allow_new_arguments", False)
        script = os.path.basename(session.script or "")
        if state["script"] and script and state["script"] != script:
            if not allow:
                # Another script's checkpoint: its arguments say nothing here.
                raise CheckpointError(
                    "checkpoint %s was written by a run of %s, and this run is %s: resume "
                    "continues a run of the same script. Give each script a --checkpoint-dir "
                    "of its own (or, if %s is %s renamed, pass --allow-new-arguments)."
                    % (path, state["script"], script, script, state["script"]))
            session.print("tmpi: warning: checkpoint %s was written by %s, this run "
                          "is %s." % (path, state["script"], script))
        if saved is not None and list(saved) != arguments and not allow:
            raise CheckpointError(
                "checkpoint %s was written by a run with the script arguments %s; this run "
                "has %s. Resume replays the script's first calls, so it needs the same "
                "arguments: run it with %s, or pass --allow-new-arguments to continue "
                "with these (e.g. to train for more epochs)."
                % (path, _quoted(saved), _quoted(arguments), _quoted(saved)))
        if state["point"].get("finished") and saved is not None and \
                list(saved) == arguments:
            resume = getattr(settings, "resume", None)
            error = FinishedRunError(
                "%scheckpoint %s was written when its run finished (step %d): there is "
                "nothing to resume, so the script is not run again and its files stay as "
                "that run left them. To train further, resume with the new arguments and "
                "--allow-new-arguments (e.g. more --epochs); to train again from the "
                "start, run without --resume."
                % ("--resume %s: " % resume if resume in ("latest", "auto") else "", path,
                   state["point"]["train_calls"]))
            if resume == "auto":
                # A scheduler requeued a job that had finished: nothing failed.
                error.exit_code = 0
            raise error
        if state["rule"] != options.rule:
            raise CheckpointError("checkpoint %s was written by a run with --rule %s; resume "
                                  "it with --rule %s (this run has --rule %s)."
                                  % (path, state["rule"], state["rule"], options.rule))
        if options.scaling == "weak" or state.get("scaling") == "weak":
            raise ConfigError("--resume needs --scaling strong: with weak scaling the global "
                              "batch depends on the rank count and the call grouping.")

    # -- the replayed calls ------------------------------------------------------------------
    def check_call(self, call, index):
        """Call number ``index`` (0-based) inside the replayed part: check it
        against the log; returns ``(recorded, value)`` of the log."""
        function = call.function
        if self.started is None:
            self.started = time.monotonic()
        expected = self.log.key(index)
        if function.key != expected:
            raise CheckpointError(
                "resume diverged at call #%d: the checkpointed run called %s there, this "
                "run calls %s. Resume needs the same script, arguments and data as the "
                "run that wrote %s." % (index + 1, expected, function.key, self.path))
        if call.kind == "train" and function.key not in self.checked:
            self.check_model(function.model)
            self.checked.add(function.key)
            # What the script reads of its parameters while the replay goes
            # on (a file of weights it writes, a print) is the checkpoint's,
            # never the initial values it would otherwise overwrite them with.
            self._load_values(function.model)
        if fingerprint(call.args, call.kwargs) & 0xFFFFFFFF != self.log.fingerprints[index]:
            raise CheckpointError(
                "resume diverged at call #%d (%s): its arguments differ from the "
                "checkpointed run's. Resume needs the same script, arguments, data and "
                "seed (--seed, or the script's own) as the run that wrote %s."
                % (index + 1, function.key, self.path))
        recorded, value = self.log.value(index)
        if not recorded:
            self.recomputed.add(function.key)
        return recorded, value

    def check_model(self, model):
        """:class:`CheckpointError` naming the first variable of ``model`` that
        differs from the checkpoint's (name, shape, dtype, order)."""
        saved = self.models.get(model.name)
        if saved is None:
            return  # compiled before the checkpoint but never trained by then
        here = [tuple(row) for row in model.signature()]
        there = [tuple(row) for row in saved["signature"]]
        if [comparable(row) for row in here] == [comparable(row) for row in there]:
            return
        for i, (a, b) in enumerate(itertools.zip_longest(there, here)):
            if a is None or b is None or comparable(a) != comparable(b):
                raise CheckpointError(
                    "checkpoint %s does not fit this model: %s #%d of %s is %s in the "
                    "checkpoint and %s here. Resume with the same script, arguments and "
                    "floatX as the run that wrote it."
                    % (self.path, (a or b)[0], i, model.name, _describe(a), _describe(b)))

    # -- the end of the replay ---------------------------------------------------------------
    def _load_values(self, model):
        """The checkpoint's values of ``model``'s variables (none when it has
        no such model)."""
        saved = self.models.get(model.name)
        for variable, value in zip(model.state_variables, saved["values"] if saved else ()):
            variable.set_value(value, borrow=False)

    def finish(self, session, generators, calls):
        """At the first call past the checkpoint (``calls`` made so far): load
        the saved state everywhere, on every rank."""
        state = self.state
        present = {model.name: model for model in session.models}
        missing = sorted(set(self.models) - set(present))
        if missing:
            raise CheckpointError("checkpoint %s has training function(s) %s that this run "
                                  "had not compiled by call #%d: the script does not retrace "
                                  "its run." % (self.path, ", ".join(missing), calls))
        for model in session.models:
            saved = self.models.get(model.name)
            if saved is None:
                continue
            if model.name not in self.checked:
                self.check_model(model)
            if not model.synchronized:
                session.synchronize(model)  # identical start: signatures, rule.start
            self._load_values(model)
            model.step = saved["step"]
        session.rule.load_state_dict(state["rule_state"])
        session.pm.hook.tmpi_restore_state(session=session, state=state["plugins"])
        # A finished run's checkpoint holds numpy's and Python's generators as
        # the script left them, past the draws this run (with new arguments)
        # made before this call; the replay has retraced those draws.
        generators.restore(state["rng"], script=not state["point"].get("finished"))
        note = ""
        if self.recomputed:
            note = " (%s ran again: outputs not recorded)" % ", ".join(sorted(self.recomputed))
        session.print("tmpi: resumed at step %d after replaying %d calls in %.1f s%s."
                      % (state["point"]["train_calls"], self.calls,
                         time.monotonic() - self.started if self.started else 0.0, note))


def _newest_that_verifies(settings):
    """``(path, data, skipped)``: the newest checkpoint in ``--checkpoint-dir``
    whose bytes verify, and a note on each newer one that did not."""
    wanted, directory = settings.resume, settings.checkpoint_dir
    path, data, _, skipped = newest_that_verifies(directory)
    if path is not None:
        return path, data, ["%s: it %s; resuming from an older one." % skip
                            for skip in skipped]
    if skipped:
        raise CheckpointError(
            "--resume %s: no checkpoint in %s verifies: %s. Start without --resume to "
            "train from the beginning." % (wanted, directory, "; ".join(
                "%s %s" % (path, note) for path, note in skipped)))
    if wanted == "latest":
        raise CheckpointError("--resume latest: no checkpoint in %s (files named "
                              "checkpoint-step*.tmpi). Start without --resume, or "
                              "use --resume auto to start fresh when there is none."
                              % directory)
    return None, None, []


def _load_on_rank0(settings):
    """``(path, data, error text, skipped)`` on rank 0, verified before it is
    shared: ``latest`` and ``auto`` pass over corrupt files (``skipped`` says
    which and why), a file named on the command line must be whole."""
    try:
        if settings.resume in ("latest", "auto"):
            path, data, skipped = _newest_that_verifies(settings)
            return path, data, None, skipped
        path = settings.resume
        if not os.path.exists(path):
            raise CheckpointError("--resume %s: no such file." % path)
        data = read_bytes(path)
        verify(data, path)
        return path, data, None, []
    except CheckpointError as error:
        return None, None, str(error), []


def _share(comm, rank, path, data, error):
    """Rank 0's ``(path, data, error)`` on every rank: the bytes in one broadcast."""
    from mpi4py import MPI
    path, size, error = comm.bcast((path, len(data) if data else 0, error), root=0)
    if error or path is None:
        return path, None, error
    buffer = data if rank == 0 else bytearray(size)
    comm.Bcast([buffer, MPI.BYTE], root=0)
    return path, bytes(buffer), None


def writable_by_others(path):
    """``"the file is"``, ``"its directory is"`` or ``"the file and its directory
    are"`` when users other than the owner may write checkpoint ``path`` or
    its directory, else ``""``."""
    import stat
    loose = []
    for what, where in (("the file", path), ("its directory", os.path.dirname(path) or ".")):
        try:
            if os.stat(where).st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                loose.append(what)
        except OSError:
            pass
    return " and ".join(loose) + (" are" if len(loose) > 1 else " is") if loose else ""


def _quoted(arguments):
    """Script arguments as a shell would take them (``(none)`` when there are none)."""
    return "`%s`" % shlex.join(arguments) if arguments else "(none)"


def _describe(row):
    if row is None:
        return "absent"
    return "%r shape %s dtype %s" % (row[1], tuple(row[2]), row[3])
