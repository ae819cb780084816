"""A training step in call order: the functions tmpi hands a script.

:class:`DistributedFunction` is what a training function becomes: each call
passes through the ``tmpi_call`` hook (:class:`Call`), its batch is split
across ranks (:mod:`tmpi_adapters.core.batches`), the session begins the
step (identical start on the first), the compiled Theano function runs (its
:class:`~tmpi_adapters.core.ops.FusedAllreduce` exchanges the gradients
through the session and the rule), the returned values are combined across
ranks, and the session ends the step (the rule's duties after a step, the
``tmpi_after_step`` hook).

:class:`SplitFunction` is a function that does not train but whose inputs
carry a batch (validation, prediction): its calls are split across ranks
too, and what it returns is combined in one collective.

:class:`ObservedFunction` is any other compiled function, seen by the
``tmpi_call`` hook (a resume replays it) and otherwise untouched.
"""
import itertools

import numpy as np

from tmpi_adapters.core.batches import batch_rows, fingerprint, fingerprinted, local_share
from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.exchangers.envelope import Envelope
from tmpi_adapters.pluginmanager import hookimpl


class Call:
    """One call of a compiled function, as the ``tmpi_call`` hook sees it.

    Attributes
    ----------
    function : DistributedFunction or ObservedFunction
        What was called; ``function.key`` names it in logs and checkpoints,
        and ``function.has_updates`` says whether the call changes state
        (training steps and functions with updates must really run).
    kind : {"train", "other"}
        A training step, or any other function.
    args, kwargs
        The call's arguments, as the script passed them.
    """

    __slots__ = ("function", "kind", "args", "kwargs", "_run")

    def __init__(self, function, kind, run, args, kwargs):
        self.function, self.kind, self._run = function, kind, run
        self.args, self.kwargs = args, kwargs

    def run(self):
        """Run the call for real and return its result."""
        return self._run(*self.args, **self.kwargs)


class DistributedFunction:
    """A training function compiled for one rank: splits batches, exchanges, steps.

    Calls look exactly like calls of the Theano function it wraps; other
    attributes are forwarded to it.

    Strong scaling (default): every array argument whose batch axis (axis 0,
    or as the graph says: :mod:`tmpi_adapters.graphs.layout`) has the batch's
    length is cut to this rank's contiguous share (or, in the ``givens``
    style, the dataset slice is; shared variables that carry the batch are
    sliced alike: :mod:`tmpi_adapters.core.split`); the step's gradients are
    averaged weighted by rows, so the result is the one-process result.
    Returned values combine as :mod:`tmpi_adapters.graphs.outputs` says.  A
    batch with fewer rows than ranks leaves some ranks a padding row of
    weight 0; an empty batch is run whole by every rank, rank 0's results
    counting, as one process would run it.

    Weak scaling (``--scaling weak``): the first call is split as above; after
    it, each group of N consecutive calls is one step in which rank r trains on
    the r-th call's whole batch (a global batch of N*B).  Calls that only hand
    a rank its batch return the latest step's results.

    Parameters
    ----------
    adapter, compiled, model
        The framework adapter, the compiled Theano function, its ModelProtocol.
    plan : tmpi_adapters.core.split.SplitPlan or None
        Where each call's batch is (``None`` on one rank: arrays' axis 0).
    single_output : bool
        The function returns one value, not a list.
    combiner : tmpi_adapters.core.combine.Combiner, optional
        Combines, after each step, what the step's exchange did not carry.
    coupled : tmpi_adapters.frameworks.theano_split.CoupledCombiner, optional
        The converted step (its levels of collectives), where the row analysis
        converted the graph: every call then says which rows this rank runs.
    first_split : tmpi_adapters.frameworks.theano_split.FirstSplit, optional
        ``first_split(sizes, cut)``, called before the first call whose ranks
        run different row counts, returns the function compiled again (a graph
        whose reshapes to constant shapes follow the rows, rebuilt for each
        rank's rows) or ``None``; ``first_split.explain`` words the error of a
        first split call that failed.
    """

    def __init__(self, adapter, compiled, model, plan=None, single_output=False,
                 combiner=None, first_split=None, coupled=None):
        self.adapter = adapter
        #: the step converted by the row analysis (its collectives read which
        #: rows this rank runs, set before every call), or ``None``
        self.coupled_step = coupled
        self.session = adapter.session
        self.fn = compiled
        self.model = model
        self.plan = plan
        self.single_output = single_output
        self.calls = 0
        #: combines, after each step, what the step's exchange did not carry
        self.combiner = combiner
        self._first_split = first_split
        self._split_once = False
        self._stash = None
        self._latest = None
        self._last_outputs = None
        #: this rank's weight (rows) in the latest step; 0 for a padding row
        self.last_weight = None

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __repr__(self):
        return "<tmpi DistributedFunction %s of %r>" % (self.model.name, self.fn)

    @property
    def coupled(self):
        """True when the step's graph was converted by the row analysis (its
        collectives read which rows this rank runs)."""
        return self.coupled_step is not None

    # -- batches --------------------------------------------------------------------
    @property
    def sliced(self):
        """True in the ``givens`` style: the datasets' slices are the batch."""
        return bool(self.plan is not None and self.plan.sliced)

    def rows_of(self, args, kwargs):
        """``(rows, bounds)``: a call's global batch rows (``None`` when no batch is
        found) and, in the ``givens`` style, the slice bounds of each dataset."""
        if self.plan is None:
            return batch_rows(list(itertools.chain(args, kwargs.values()))), None
        return self.plan.rows_of(self.model.name, args, kwargs)

    def _local_call(self, args, kwargs, rows, bounds, lo, hi):
        """Arguments that make the compiled function see rows ``[lo, hi)``."""
        if self.plan is None:
            return args, kwargs
        return self.plan.local_call(self.model.name, args, kwargs, rows, bounds, lo, hi)

    @property
    def key(self):
        """Names this function in checkpoints and messages."""
        return self.model.name

    #: A training step changes the model: it always really runs.
    has_updates = True

    # -- calling ------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        return self.session.call(self, "train", self._call, args, kwargs)

    def _call(self, *args, **kwargs):
        session = self.session
        self.calls += 1
        mode = self.adapter.batch_mode()
        if mode == "round-robin" and self.calls > 1:
            return self._weak_call(args, kwargs)
        rows, bounds = self.rows_of(args, kwargs)
        if mode == "local":
            return self._step(args, kwargs, weight=rows or 1, rows=rows)
        if rows is None or session.size == 1:
            if self.sliced:
                self._local_call(args, kwargs, rows, bounds, 0, rows)
            weight = rows or 1
            if self.coupled and session.size > 1:
                # Every rank runs the whole call: rank 0's parts stand for all.
                session.set_rows(0, 1, 1, whole=True)
                weight = weight if session.rank == 0 else 0
            return self._step(args, kwargs, weight=weight, rows=rows, batch=rows)
        first = not self._split_once
        if first:
            self._split_once = True
            if self.plan is not None and self.plan.problem:
                raise ConfigError(axis_problem(self.model.name, self.plan.problem))
        if self._first_split is not None and not self._first_split.done:
            self.fn = self._resolve_split(args, kwargs, rows, bounds) or self.fn
        lo, hi, weight, total = local_share(rows, session.rank, session.size)
        # Weak scaling's ranks may hold data of their own (their first call is split too).
        data = self._fingerprint(args, kwargs, bounds) \
            if mode == "rows" and fingerprinted(self.calls) else None
        local_args, local_kwargs = self._local_call(args, kwargs, rows, bounds, lo, hi)
        if self.coupled:
            session.set_rows(lo, hi, rows)
        try:
            # An empty batch is one row's worth of weight for rank 0 (the
            # envelope's rows and the exchange's total).
            return self._step(local_args, local_kwargs, weight=weight, rows=hi - lo,
                              batch=total, data=data)
        except (TmpiError, KeyboardInterrupt):
            raise
        except Exception as error:
            if first and self._first_split is not None:
                explained = self._first_split.explain(rows, session.size, error)
                if explained is not None:
                    raise explained from error
            # Shapes in the error are this rank's share, not the script's batch.
            error.add_note("(rank %d of %d ran rows %d-%d of the call's %d: shapes above are "
                           "that share's)" % (session.rank, session.size, lo, hi - 1, rows))
            raise

    def _resolve_split(self, args, kwargs, rows, bounds):
        """The function compiled again for the reshapes that follow the rows
        (``first_split``), or ``None``; decided once, on the first split call
        whose ranks run two different row counts."""
        sizes = split_sizes(rows, self.session.size)
        if len(sizes) < 2:
            return None
        return self._first_split(sizes,
                                 lambda r: self._local_call(args, kwargs, rows, bounds, 0, r))

    def step_local(self, *args, **kwargs):
        """One step on this rank's whole batch, whatever the scaling mode.

        For adapters that give each rank its own data at the framework's level
        (a weak-scaling ``fit`` on this rank's shard): nothing is split, the
        gradients of all ranks are averaged weighted by their rows and returned
        scalars are averaged the same way.
        """
        rows, bounds = self.rows_of(args, kwargs)
        if self.sliced:
            self._local_call(args, kwargs, rows, bounds, 0, rows)
        return self._step(args, kwargs, weight=rows or 1, rows=rows)

    def _fingerprint(self, args, kwargs, bounds):
        """The fingerprint of a call's global batch (every rank must have the same)."""
        if self.plan is None:
            return fingerprint(list(args) + list(kwargs.values()))
        return fingerprint(self.plan.batch_values(args, kwargs, bounds))

    def _step(self, args, kwargs, weight, rows, batch=None, data=None):
        """One step on this rank's ``rows`` rows (``weight``: what they count
        for); ``batch`` is the global batch's rows when every rank was handed
        the same batch, and ``data`` its fingerprint (the envelope checks
        that they agree)."""
        session = self.session
        self.last_weight = weight
        if self.coupled and session.size > 1 and not session.rows_set():
            # Never a converted step on a stale window: its sums and gathers
            # would silently take other rows than this call's.
            raise TmpiError("%s: a converted training step was called without saying which "
                            "rows this rank runs (an adapter bypassed the split); this is a "
                            "bug in tmpi: please report it." % self.model.name)
        session.begin_step(self.model, weight, call=self.calls, rows=batch, data=data)
        try:
            outputs = self.fn(*args, **kwargs)
        finally:
            session.forget_rows()
        values = [outputs] if self.single_output else list(outputs or [])
        if values and self.combiner is not None:
            values = self.combiner(values, weight, rows, total=batch)
        session.end_step(self.model, weight, outputs=values, counted=rows is not None)
        result = restore_outputs(values, outputs, self.single_output)
        self._last_outputs = result
        return result

    def _weak_call(self, args, kwargs):
        size, rank = self.session.size, self.session.rank
        position = (self.calls - 2) % size
        self._latest = (args, kwargs)
        if position == rank:
            self._stash = _hold(args, kwargs)
        if position < size - 1:
            return self._last_outputs
        return self._run_stash()

    def _run_stash(self):
        if self._stash is not None:
            args, kwargs = self._stash
            weight = None
        else:
            args, kwargs = self._latest
            weight = 0
        rows, bounds = self.rows_of(args, kwargs)
        rows = rows or 1
        if self.sliced:
            self._local_call(args, kwargs, rows, bounds, 0, rows)
        self._stash = None
        return self._step(args, kwargs, weight=rows if weight is None else 0, rows=rows)

    def flush(self):
        """Run a weak-scaling group that the script's loop left incomplete."""
        if self.adapter.batch_mode() != "round-robin" or self.calls <= 1:
            return
        if (self.calls - 2) % self.session.size != self.session.size - 1:
            self._run_stash()


def restore_outputs(values, outputs, single_output):
    """Combined ``values`` in the form the compiled function returned ``outputs``."""
    if single_output:
        return values[0]
    if isinstance(outputs, tuple):
        return tuple(values)
    return values if outputs is not None else outputs


def axis_problem(name, problem):
    """The paragraph of the error for a batch whose axis the graph does not tell."""
    return ("%s: tmpi cannot tell which axis of its inputs holds the examples (%s), so it "
            "cannot split its batches across ranks. Make the cost a mean over one axis of "
            "examples (cost.sum() / x.shape[1] for (time, batch) inputs), or run with "
            "--scaling weak so that each rank takes whole batches." % (name, problem))


def split_sizes(rows, size):
    """The row counts a split call runs: the whole batch's, then each
    different share's (a padding row counts one)."""
    shares = {max(1, hi - lo) for lo, hi, _, _ in (local_share(rows, r, size)
                                                   for r in range(size))}
    return [rows] + sorted(shares - {rows}, reverse=True)


class ObservedFunction:
    """A compiled function tmpi does not distribute (validation, prediction).

    Calls go through the ``tmpi_call`` hook, so a checkpoint resume can
    replay what the function returned; every other attribute is the
    function's own (Theano itself calls ``f.fn()`` and ``f.input_storage`` on
    some functions, so this wrapper's own names stay out of their way).
    """

    def __init__(self, session, fn, key, has_updates):
        self._tmpi_session = session
        self._tmpi_fn = fn
        self.key = key
        #: functions with updates change state and always really run
        self.has_updates = has_updates

    def __getattr__(self, name):
        return getattr(self._tmpi_fn, name)

    def __repr__(self):
        return "<tmpi ObservedFunction %s of %r>" % (self.key, self._tmpi_fn)

    def __call__(self, *args, **kwargs):
        return self._tmpi_session.call(self, "other", self._tmpi_fn, args, kwargs)


class SplitFunction(ObservedFunction):
    """A function that does not train (validation, prediction, a metric) whose
    calls are split across ranks like training steps.

    Each call runs this rank's share of the batch and combines the returned
    values in one collective (:class:`~tmpi_adapters.core.combine.Combiner`:
    means weighted by rows, sums added, per-row values gathered in order,
    values not from the batch left alone) under the envelope
    ``eval <key> call <n> (<rows> rows)``, so N ranks return the one-process
    values and evaluation gets faster with ranks.  When the first split call
    fails on some rank (a graph that does not run on part of a batch), every
    rank runs the function whole from then on, as it did before tmpi split it.

    Parameters
    ----------
    session, fn, key
        As :class:`ObservedFunction`'s.
    plan : tmpi_adapters.core.split.SplitPlan
    combiner : tmpi_adapters.core.combine.Combiner
    single_output : bool
    first_split : callable, optional
        As :class:`DistributedFunction`'s.
    """

    def __init__(self, session, fn, key, plan, combiner, single_output, first_split=None):
        super().__init__(session, fn, key, has_updates=False)
        self._tmpi_plan = plan
        self._tmpi_combiner = combiner
        self._tmpi_single = single_output
        self._tmpi_first_split = first_split
        self._tmpi_calls = 0
        self._tmpi_whole = False

    def __repr__(self):
        return "<tmpi SplitFunction %s of %r>" % (self.key, self._tmpi_fn)

    def __call__(self, *args, **kwargs):
        return self._tmpi_session.call(self, "other", self._tmpi_split_call, args, kwargs)

    def _tmpi_split_call(self, *args, **kwargs):
        session, plan = self._tmpi_session, self._tmpi_plan
        rows, bounds = plan.rows_of(self.key, args, kwargs)
        if rows is None or self._tmpi_whole:
            return self._tmpi_whole_call(args, kwargs, rows, bounds)
        self._tmpi_calls += 1
        first = self._tmpi_calls == 1
        lo, hi, weight, total = local_share(rows, session.rank, session.size)
        data = fingerprint(plan.batch_values(args, kwargs, bounds)) \
            if fingerprinted(self._tmpi_calls) else None
        failed = None
        first_split = self._tmpi_first_split
        if first_split is not None and not first_split.done:
            sizes = split_sizes(rows, session.size)
            if len(sizes) > 1:
                try:
                    self._tmpi_fn = first_split(sizes, lambda r: plan.local_call(
                        self.key, args, kwargs, rows, bounds, 0, r)) or self._tmpi_fn
                except ConfigError:
                    self._tmpi_whole = True
                # Reshapes no share can follow, or rebuilt otherwise than its
                # values were read: every rank runs it whole (decided alike on
                # every rank, from the same batch).
                if self._tmpi_whole or not first_split.confirmed:
                    self._tmpi_whole = True
                    return self._tmpi_whole_call(args, kwargs, rows, bounds)
        try:
            local_args, local_kwargs = plan.local_call(self.key, args, kwargs, rows, bounds,
                                                       lo, hi)
            outputs = self._tmpi_fn(*local_args, **local_kwargs)
        except Exception as error:  # noqa: BLE001 - agreed on below, then re-raised whole
            if not first or isinstance(error, TmpiError):
                raise
            failed = error
        exchanger = session.exchanger
        with exchanger.enveloped(Envelope("eval", self.key, call=self._tmpi_calls, rows=total,
                                          data=data)):
            if first and any(exchanger.allgather_object(failed is not None)):
                self._tmpi_whole = True
            else:
                values = [outputs] if self._tmpi_single else list(outputs or [])
                values = self._tmpi_combiner(values, weight, hi - lo, total=total)
                return restore_outputs(values, outputs, self._tmpi_single)
        return self._tmpi_whole_call(args, kwargs, rows, bounds)

    def _tmpi_whole_call(self, args, kwargs, rows, bounds):
        if self._tmpi_plan.sliced or self._tmpi_plan.shared:
            args, kwargs = self._tmpi_plan.local_call(self.key, args, kwargs, rows, bounds,
                                                      0, rows)
        outputs = self._tmpi_fn(*args, **kwargs)
        values = [outputs] if self._tmpi_single else list(outputs or [])
        return restore_outputs(self._tmpi_combiner.finish(values), outputs, self._tmpi_single)


def _hold(args, kwargs):
    """Copy array arguments a script might overwrite before the step runs."""
    def keep(a):
        return a.copy() if isinstance(a, np.ndarray) else a
    return [keep(a) for a in args], {k: keep(v) for k, v in kwargs.items()}


@hookimpl(trylast=True)
def tmpi_call(session, call):
    """Without another plugin's answer, a call runs."""
    return call.run()
