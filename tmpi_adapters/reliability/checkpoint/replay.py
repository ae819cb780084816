"""A resume: finding the checkpoint, replaying the script's first calls, loading the state.

A script cannot be told to start at epoch 7: its loop starts at 0.  So with
``--resume`` the script runs again from its start, with the checkpoint's seed,
and its first ``C`` calls of compiled functions (``C`` is where the checkpoint
was taken) are *replayed*: they do no work and return what they returned in
the original run (the :class:`~tmpi_adapters.reliability.checkpoint.calllog.CallLog`),
so the script's own loop, random draws, accumulators and decisions retrace
the original run exactly.  At the start of call ``C`` (or when the script
ends) :meth:`Replay.finish` loads the saved state into the script's own
shared variables and sets the generators, and training goes on for real.

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

from tmpi_adapters.errors import CheckpointError, ConfigError
from tmpi_adapters.reliability.checkpoint.calllog import CallLog, fingerprint
from tmpi_adapters.reliability.checkpoint.fileformat import (decode, latest_checkpoint,
                                                             read_bytes)


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
        path, data, error = _load_on_rank0(settings) if session.rank == 0 else (None,) * 3
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
        """Refuse a checkpoint of another rule or scaling mode, or of other script
        arguments (unless ``--allow-new-arguments``); warn of another script."""
        options, state, path = session.options, self.state, self.path
        arguments, saved = list(sys.argv[1:]), state.get("arguments")
        if saved is not None and list(saved) != arguments and \
                not getattr(settings, "allow_new_arguments", False):
            raise CheckpointError(
                "checkpoint %s was written by a run with the script arguments %s; this run "
                "has %s. Resume replays the script's first calls, so it needs the same "
                "arguments: run it with %s, or pass --allow-new-arguments to continue "
                "with these (e.g. to train for more epochs)."
                % (path, _quoted(saved), _quoted(arguments), _quoted(saved)))
        if state["rule"] != options.rule:
            raise CheckpointError("checkpoint %s was written by a run with --rule %s; resume "
                                  "it with --rule %s (this run has --rule %s)."
                                  % (path, state["rule"], state["rule"], options.rule))
        if options.scaling == "weak" or state.get("scaling") == "weak":
            raise ConfigError("--resume needs --scaling strong: with weak scaling the global "
                              "batch depends on the rank count and the call grouping.")
        script = os.path.basename(session.script or "")
        if state["script"] and script and state["script"] != script:
            session.print("tmpi: warning: checkpoint %s was written by %s, this run "
                          "is %s." % (path, state["script"], script))

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
        if here == there:
            return
        for i, (a, b) in enumerate(itertools.zip_longest(there, here)):
            if a != b:
                raise CheckpointError(
                    "checkpoint %s does not fit this model: %s #%d of %s is %s in the "
                    "checkpoint and %s here. Resume with the same script, arguments and "
                    "floatX as the run that wrote it."
                    % (self.path, (a or b)[0], i, model.name, _describe(a), _describe(b)))

    # -- the end of the replay ---------------------------------------------------------------
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
            for variable, value in zip(model.state_variables, saved["values"]):
                variable.set_value(value, borrow=False)
            model.step = saved["step"]
        session.rule.load_state_dict(state["rule_state"])
        session.pm.hook.tmpi_restore_state(session=session, state=state["plugins"])
        generators.restore(state["rng"])
        note = ""
        if self.recomputed:
            note = " (%s ran again: outputs not recorded)" % ", ".join(sorted(self.recomputed))
        session.print("tmpi: resumed at step %d after replaying %d calls in %.1f s%s."
                      % (state["point"]["train_calls"], self.calls,
                         time.monotonic() - (self.started or time.monotonic()), note))


def _resume_path(settings):
    wanted, directory = settings.resume, settings.checkpoint_dir
    if wanted in ("latest", "auto"):
        path = latest_checkpoint(directory)
        if path is None and wanted == "latest":
            raise CheckpointError("--resume latest: no checkpoint in %s (files named "
                                  "checkpoint-step*.tmpi). Start without --resume, or "
                                  "use --resume auto to start fresh when there is none."
                                  % directory)
        return path
    if not os.path.exists(wanted):
        raise CheckpointError("--resume %s: no such file." % wanted)
    return wanted


def _load_on_rank0(settings):
    """``(path, data, error text)`` on rank 0; checked before it is shared."""
    try:
        path = _resume_path(settings)
        if path is None:
            return None, None, None
        data = read_bytes(path)
        decode(data, path)
        return path, data, None
    except CheckpointError as error:
        return None, None, str(error)


def _share(comm, rank, path, data, error):
    """Rank 0's ``(path, data, error)`` on every rank: the bytes in one broadcast."""
    from mpi4py import MPI
    path, size, error = comm.bcast((path, len(data) if data else 0, error), root=0)
    if error or path is None:
        return path, None, error
    buffer = data if rank == 0 else bytearray(size)
    comm.Bcast([buffer, MPI.BYTE], root=0)
    return path, bytes(buffer), None


def _quoted(arguments):
    """Script arguments as a shell would take them (``(none)`` when there are none)."""
    return "`%s`" % shlex.join(arguments) if arguments else "(none)"


def _describe(row):
    if row is None:
        return "absent"
    return "%r shape %s dtype %s" % (row[1], tuple(row[2]), row[3])
