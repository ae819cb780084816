"""The per-rank session: exchanger, rule, framework adapter and models of one run.

A session is made where a run starts (``tmpi wrap``'s rank, the decorator,
the Blocks extension) and handed to everything that needs it: the framework
adapter, the rule, the compiled training functions (their exchange Op is
given :meth:`Session.exchange_gradients` when they are compiled) and every
hook.  :func:`active_session` only lets a front door find out whether it
runs inside ``tmpi wrap``.
"""
import random
import sys
import time

import numpy as np

from tmpi_adapters.core.function import Call
from tmpi_adapters.core.levels import Couplings
from tmpi_adapters.core.batches import fingerprinted
from tmpi_adapters.core.protocol import (check_signatures, read_values, state_digest,
                                         write_values)
from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.exchangers.envelope import Envelope
from tmpi_adapters.process import compat
from tmpi_adapters.options import Options
from tmpi_adapters.pluginmanager import get_plugin_manager, lookup
from tmpi_adapters.core.timing import Recorder

_current = None


def current_session():
    """The running :class:`Session`; a clear error outside ``tmpi wrap``/``distributed``."""
    if _current is None:
        raise TmpiError("no tmpi session is running in this process. Start the script with "
                        "`tmpi wrap` or decorate its entry point with "
                        "@tmpi_adapters.distributed(...).")
    return _current


def active_session():
    """The running session or ``None``."""
    return _current


def _comm_world():
    from mpi4py import MPI
    return MPI.COMM_WORLD


class Session:
    """Everything one rank needs during a distributed run.

    Parameters
    ----------
    options : tmpi_adapters.options.Options
    comm : mpi4py communicator, optional
        ``MPI.COMM_WORLD`` by default.
    script : str, optional
        The script being run, for messages and checkpoints.

    Attributes
    ----------
    rank, size : int
    options : tmpi_adapters.options.Options
    pm : pluggy.PluginManager
        ``session.pm.hook.<name>(...)`` calls a hook; plugins that keep state
        for one run may ``session.pm.register`` an object at
        ``tmpi_session_start`` (and unregister it at ``tmpi_session_end``).
    exchanger, rule, adapter
        The run's :class:`~tmpi_adapters.exchangers.base.Exchanger`,
        :class:`~tmpi_adapters.rules.base.Rule` and framework adapter.
    models : list of ModelProtocol
        Every training function's model, in the order they were compiled.
    recorder : tmpi_adapters.core.timing.Recorder
        Per-step timings.
    stepping : ModelProtocol or None
        The model whose training step is running (read by the watchdog).
    seed : int
        The seed numpy and ``random`` were given on every rank.
    """

    def __init__(self, options=None, comm=None, script=None):
        compat.apply()
        self.options = (options or Options()).validate()
        self.pm = get_plugin_manager()
        self.comm = comm if comm is not None else _comm_world()
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.script = script
        self.models = []
        #: each coupling's prepared (Layout, moved axes), by its signature in the running call
        #: the step's couplings at run time (what the coupling nodes call)
        self.couplings = Couplings(self)
        self.recorder = Recorder(self)
        self.started = False
        self.stepping = None
        #: True once the script has returned (read by the watchdog)
        self.finishing = False
        self.functions_compiled = 0
        #: True when some plugin answers or watches calls (``tmpi_call``):
        #: then every compiled function is routed through the hook.
        self.observes_calls = False
        self._after_exchange = False
        self._weight = None
        self._total = None
        self._warned_progress = False
        exchanger_name = self.options.exchanger or self.pm.hook.tmpi_select_exchanger(
            session=self)
        exchanger_cls = lookup("exchangers", exchanger_name, self.pm)
        self.exchanger = exchanger_cls(self.comm, precision=self.options.precision,
                                       bucket_bytes=self.options.bucket_bytes,
                                       timeout=self.options.stall_timeout,
                                       on_stall=self._stalled)
        rule_cls = lookup("rules", self.options.rule, self.pm)
        self.rule = rule_cls(self, **self.options.rule_options)
        if self.options.overlap:
            self._check_overlap()
        framework = self.options.framework or "theano"
        self.adapter = lookup("frameworks", framework, self.pm)(self)

    def _check_overlap(self):
        if not self.rule.overlaps:
            raise ConfigError(
                "--overlap splits the exchange of gradients into parts that start during "
                "backpropagation; the rule %r %s, so there is nothing to overlap: drop "
                "--overlap or use --rule bsp" % (
                    self.options.rule,
                    "reduces gradients its own way" if self.rule.exchanges == "gradients"
                    else "exchanges parameters between steps, not gradients"))
        if not self.exchanger.overlaps:
            raise ConfigError(
                "--overlap needs an exchanger that can leave a collective running while the "
                "step goes on; %r reduces at once: drop --overlap or use --exchanger mpi"
                % self.exchanger.name)

    @property
    def keeps_models_identical(self):
        """True when every rank's model is the same after every step (a
        gradient rule on more than one rank): their digests are compared."""
        return self.size > 1 and self.rule.exchanges == "gradients"

    @property
    def overlapping(self):
        """True when training steps exchange their gradients in overlapped
        parts (``--overlap`` on more than one rank)."""
        return self.options.overlap and self.size > 1

    # -- lifecycle --------------------------------------------------------------
    def start(self):
        """Seed every rank alike, hook the framework, announce the session."""
        global _current
        if _current is not None and _current is not self:
            raise TmpiError("a tmpi session is already running in this process")
        _current = self
        self._seed()
        self.adapter.install()
        self.started = True
        self.pm.hook.tmpi_session_start(session=self)
        # Plugins register their per-run objects in tmpi_session_start.
        # Calls go through tmpi_call only when a plugin besides the built-in
        # runner (core/function.py, which just runs them) implements it.
        self.observes_calls = any(impl.plugin_name != Call.__module__
                                  for impl in self.pm.hook.tmpi_call.get_hookimpls())
        self._after_exchange = bool(self.pm.hook.tmpi_after_exchange.get_hookimpls())
        return self

    def finish(self, error=None):
        """Let rules finish, report the time split, unhook the framework.

        ``tmpi_session_end`` is called in every case, with the error that
        ended the run (or that finishing raised).
        """
        global _current
        try:
            if error is None:
                try:
                    for model in self.models:
                        if model.train_fn is not None:
                            model.train_fn.flush()
                    self.finish_together()
                    self.pm.hook.tmpi_before_finish(session=self)
                    for model in self.models:
                        if model.step > 0:
                            self.rule.finish(model)
                    self.adapter.check_finished()
                    self.report()
                except BaseException as exc:  # noqa: B902 - re-raised; plugins hear of it
                    error = exc
                    raise
        finally:
            try:
                self.pm.hook.tmpi_session_end(session=self, error=error)
            finally:
                self.adapter.uninstall()
                self.exchanger.close()
                self.started = False
                if _current is self:
                    _current = None

    def finish_together(self):
        """Under a lockstep rule, every rank reaches the end of the script
        before the end-of-run exchanges.

        The meeting is a collective with the envelope "the end of the
        script": a rank that ran out of batches early meets the others'
        next training step and the job ends at once, naming who was where.
        (Parameter rules, asynchronous ones above all, drain their messages
        in ``finish``: a meeting before it could starve them.)
        """
        self.finishing = True
        if self.size > 1 and self.rule.exchanges == "gradients":
            done = ", ".join("%d call(s) of %s" % (model.step, model.name)
                             for model in self.models if model.step)
            # The models as they end: the same on every rank.
            params = state_digest([v for model in self.models for v in model.state_variables]) \
                if self.keeps_models_identical else None
            self.meet(Envelope("end", "finished the script" + (
                " after " + done if done else ""), params=params))

    def meet(self, envelope, timeout=None):
        """Every rank reaches this point doing the same thing (``envelope``),
        within ``timeout`` seconds (the stall timeout by default)."""
        if self.size > 1:
            with self.exchanger.enveloped(envelope):
                self.exchanger.barrier(timeout=timeout)

    def report(self):
        summary = self.recorder.summary()
        if summary and self.options.summary:
            self.print(self.recorder.format_summary(summary))
        for core, ranks in (summary or {}).get("shared_cores") or ():
            self.print("tmpi: warning: ranks %s kept running on core %d while a core of "
                       "theirs was free, so each waited for the other's time slice: let tmpi "
                       "bind each rank to cores of its own (leave out --bind none), or give "
                       "the job's ranks cores of their own (srun --cpu-bind=cores)."
                       % (" and ".join(map(str, ranks)), core), file=sys.stderr)
        return summary

    def _seed(self):
        seed = self.options.seed
        if seed is None:
            seed = random.SystemRandom().randrange(2 ** 31) if self.rank == 0 else None
            seed = self.comm.bcast(seed, root=0) if self.size > 1 else seed
        self.seed = seed
        random.seed(seed)
        np.random.seed(seed % (2 ** 32))

    def _stalled(self, what, waited, frame):
        """The exchanger's ``on_stall``: the ``tmpi_stall`` hook decides."""
        return bool(self.pm.hook.tmpi_stall(session=self, what=what, waited=waited,
                                            frame=frame))

    # -- output -------------------------------------------------------------------
    def print(self, *args, **kwargs):
        """``print`` on rank 0 only (to the real stdout), on a line of its own."""
        if self.rank == 0:
            # A line the script left unfinished ends first (--all-ranks-output
            # holds it until then).
            getattr(sys.stdout, "end_partial_line", lambda: None)()
            kwargs.setdefault("flush", True)
            print(*args, **kwargs)

    # -- calls ------------------------------------------------------------------------
    def call(self, function, kind, run, args, kwargs):
        """Run one call of a function tmpi handed the script, through the
        ``tmpi_call`` hook when a plugin watches calls."""
        if not self.observes_calls:
            return run(*args, **kwargs)
        return self.pm.hook.tmpi_call(session=self, call=Call(function, kind, run, args,
                                                              kwargs))

    # -- models ---------------------------------------------------------------------
    def register_model(self, model):
        self.models.append(model)
        return model

    def identical_start(self, variables, signature):
        """Check that every rank has the same ``variables`` (``signature``:
        their names, shapes, dtypes, order) and give them rank 0's values.

        Raises :class:`~tmpi_adapters.errors.MismatchError` naming the first
        difference.
        """
        check_signatures(self.exchanger.allgather_object(signature))
        if variables and self.size > 1:
            arrays = [np.array(a, copy=True, order="C") for a in read_values(variables)]
            self.exchanger.broadcast(arrays, root=0)
            write_values(variables, arrays)

    def synchronize(self, model):
        """Identical start of a model (its parameters, optimizer and model
        state), then the rule starts it."""
        with self.exchanger.enveloped(Envelope("start", model.name)):
            self.identical_start(model.state_variables, model.signature())
        model.synchronized = True
        self.rule.start(model)
        self.pm.hook.tmpi_model_ready(session=self, model=model)

    # -- steps ----------------------------------------------------------------------
    def begin_step(self, model, weight, call=None, rows=None, data=None):
        """Called just before a training step runs ``weight`` rows on this rank.

        ``call`` (the training function's call count), ``rows`` (the global
        batch's rows, when every rank shares one batch) and ``data`` (its
        fingerprint, on some calls) form the envelope of the step's
        collectives.
        """
        self.stepping = model
        if not model.synchronized:
            self.synchronize(model)
        # On some calls the model's digest rides in the step's envelope: ranks
        # whose models drifted apart are stopped, the first variable named.
        params = state_digest(model.state_variables) if self.keeps_models_identical and \
            call is not None and fingerprinted(call) else None
        self.exchanger.set_envelope(Envelope("step", model.name, call=call, rows=rows,
                                             data=data, params=params))
        self._weight = weight
        self._total = rows
        self.recorder.begin_step()

    def end_step(self, model, samples, outputs=None, counted=True):
        """Called after a training step; ``outputs`` are its returned values
        (combined across ranks), recorded when they are scalars.  ``counted``:
        ``samples`` are the step's rows (not a stand-in weight: a batch
        tmpi did not find, such as ``givens`` slices on one rank)."""
        model.step += 1
        start = time.perf_counter()
        self.rule.end_step(model, samples)
        self.recorder.add_exchange(time.perf_counter() - start)
        self.recorder.end_step(samples if counted else None, outputs=outputs, model=model)
        self.exchanger.set_envelope(None)
        self._weight = self._total = None
        self.stepping = None
        self.pm.hook.tmpi_after_step(session=self, model=model, step=model.step,
                                     samples=samples)

    def learning_rate_scale(self, model=None):
        """Weak scaling's linear learning-rate factor for ``model``'s next step:
        1 unless ``--scaling weak --lr-scaling``, then N, reached linearly over
        ``--warmup-steps`` steps."""
        if self.options.scaling != "weak" or not self.options.lr_scaling or self.size == 1:
            return 1.0
        warmup = self.options.warmup_steps
        step = (model.step if model is not None else 0) + 1
        progress = 1.0 if warmup <= 0 else min(1.0, step / float(warmup))
        return 1.0 + (self.size - 1) * progress

    def gradient_scale(self, model=None):
        """:meth:`learning_rate_scale` applied as a gradient multiplier (what
        linear scaling means for SGD and momentum), unless the model's adapter
        scales its learning rate itself (``model.scales_learning_rate``), as
        adaptive optimizers like Adam need."""
        if model is not None and model.scales_learning_rate:
            return 1.0
        return self.learning_rate_scale(model)

    # -- rows that meet inside a step (graphs/rows.py, core/coupling.py) ---------------
    @property
    def rows_window(self):
        """The shared int64 vector ``[lo, hi, max(N, 1), max(hi - lo, 1)]``
        the converted graphs read: this rank's rows of the global batch of
        ``N`` rows of the call running (made when first asked, once Theano is
        imported)."""
        window = getattr(self, "_rows_window", None)
        if window is None:
            import theano
            from tmpi_adapters.graphs.marks import ROWS_WINDOW
            window = self._rows_window = theano.shared(
                np.array([0, 1, 1, 1], dtype="int64"), name=ROWS_WINDOW)
        return window

    def set_rows(self, lo, hi, total, whole=False):
        """Say which rows ``[lo, hi)`` of ``total`` the next call of a
        converted function runs; ``whole``: every rank runs the whole call
        (the window is then ``(0, 1, 1)``: its rows are all "one row")."""
        self._rows_share = (int(lo), int(hi), int(total), bool(whole))
        window = getattr(self, "_rows_window", None)
        if window is not None:
            window.set_value(np.array([lo, hi, max(total, 1), max(hi - lo, 1)],
                                      dtype="int64"), borrow=True)

    def rows_set(self):
        """True when :meth:`set_rows` said which rows the coming call runs."""
        return getattr(self, "_rows_share", None) is not None

    def forget_rows(self):
        """The call is over: the next one must say its rows again."""
        self._rows_share = None

    def exchange_gradients(self, arrays, key=None, ops=None, gradients=None):
        """What the in-graph :class:`~tmpi_adapters.core.ops.FusedAllreduce`
        of training function ``key`` calls: the step's one exchange.

        ``arrays`` are the step's gradients (the first ``gradients`` of them)
        and its riders, reduced as ``ops`` says.  The results may be views of
        the exchanger's buffers (valid for this step only): the Op hands them
        straight to Theano's update.
        """
        start = time.perf_counter()
        gradients = len(arrays) if gradients is None else gradients
        with self.exchanger.borrowing():
            results = self.rule.reduce_gradients(arrays, self._weight, ops=ops,
                                                 total=self._total)
        model = self._current_model(key)
        scale = self.gradient_scale(model)
        if scale != 1.0:
            results = [r * r.dtype.type(scale) if i < gradients else r
                       for i, r in enumerate(results)]
        if self._after_exchange:
            self.pm.hook.tmpi_after_exchange(session=self, model=model,
                                             gradients=arrays[:gradients],
                                             reduced=results[:gradients], weight=self._weight)
        self.recorder.add_exchange(time.perf_counter() - start)
        return results

    def start_exchange(self, arrays, key=None, ops=None, part=0, positions=(), started=()):
        """What the in-graph :class:`~tmpi_adapters.core.ops.StartExchange`
        calls (``--overlap``): start part ``part`` of the step's exchange of
        training function ``key`` and move on the parts ``started`` before
        it.  ``arrays`` are the part's gradients (the step's gradients number
        ``positions``), then its riders.  Returns the
        handle :meth:`finish_exchange` takes."""
        begin = time.perf_counter()
        with self.exchanger.borrowing():
            pending = self.rule.start_reduce_gradients(arrays, self._weight, ops=ops,
                                                       total=self._total, slot=(key, part))
        for handle in started:
            handle.pending.progress()
        if not started:
            self._say_how_parts_move()
        # The hook sees them once every part is in: the graph may reuse their memory.
        seen = [np.array(a, copy=True) for a in arrays[:len(positions)]] \
            if self._after_exchange else None
        handle = _Part(key, positions, pending, seen)
        self.recorder.add_exchange(time.perf_counter() - begin)
        return handle

    def _say_how_parts_move(self):
        """Once: warn when no thread moves started parts while Theano computes."""
        why = getattr(self.exchanger, "progress_unavailable", None)
        if why and not self._warned_progress:
            self._warned_progress = True
            self.print("tmpi: warning: --overlap: no thread moves the exchange on while "
                       "Theano computes (%s); each part moves only when a later part starts "
                       "or at the end of backpropagation." % why, file=sys.stderr)

    def finish_exchange(self, handles):
        """What the in-graph :class:`~tmpi_adapters.core.ops.FinishExchange`
        calls: wait for every part :meth:`start_exchange` started (``handles``,
        in order); their results, part after part (views of the exchanger's
        buffers, valid for this step).  ``tmpi_after_exchange`` sees the
        step's gradients as the fused exchange shows them."""
        begin = time.perf_counter()
        model = self._current_model(handles[0].key) if handles else None
        scale = self.gradient_scale(model)
        results, gradients, reduced = [], {}, {}
        for handle in handles:
            part = handle.pending.finish()
            count = len(handle.positions)
            if scale != 1.0:
                part = [r * r.dtype.type(scale) if i < count else r
                        for i, r in enumerate(part)]
            results += part
            if self._after_exchange:
                gradients.update(zip(handle.positions, handle.arrays))
                reduced.update(zip(handle.positions, part[:count]))
        if self._after_exchange:
            order = sorted(gradients)
            self.pm.hook.tmpi_after_exchange(session=self, model=model,
                                             gradients=[gradients[i] for i in order],
                                             reduced=[reduced[i] for i in order],
                                             weight=self._weight)
        self.recorder.add_exchange(time.perf_counter() - begin)
        return results

    def watches_exchanges(self):
        """True when some plugin looks at every exchange (``tmpi_after_exchange``):
        then even one rank's training steps keep their exchange."""
        return self._after_exchange

    def _current_model(self, key):
        for model in self.models:
            if model.name == key:
                return model
        return None


class _Part:
    """One started part of an overlapped step's exchange."""

    __slots__ = ("key", "positions", "pending", "arrays")

    def __init__(self, key, positions, pending, arrays):
        self.key, self.positions, self.pending, self.arrays = key, positions, pending, arrays
