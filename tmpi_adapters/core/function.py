"""A training step in call order: the functions tmpi hands a script.

:class:`DistributedFunction` is what a training function becomes: each call
passes through the ``tmpi_call`` hook (:class:`Call`), its batch is split
across ranks (:mod:`tmpi_adapters.core.batches`), the session begins the
step (identical start on the first), the compiled Theano function runs (its
:class:`~tmpi_adapters.core.ops.FusedAllreduce` exchanges the gradients
through the session and the rule), the returned values are combined across
ranks, and the session ends the step (the rule's duties after a step, the
``tmpi_after_step`` hook).

:class:`ObservedFunction` is any other compiled function, seen by the
``tmpi_call`` hook (a resume replays it) and otherwise untouched.
"""
import itertools

import numpy as np

from tmpi_adapters.core.batches import batch_rows, check_ranks_vs_rows, cut_rows, local_rows
from tmpi_adapters.errors import TmpiError
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

    Strong scaling (default): every array argument whose first dimension is the
    batch's is cut to this rank's contiguous share (or, in the ``givens``
    style, the dataset slice is); the step's gradients are averaged weighted
    by rows, so the result is the one-process result.  Returned scalars are
    averaged the same way; returned arrays with one row per sample are
    concatenated.

    Weak scaling (``--scaling weak``): the first call is split as above; after
    it, each group of N consecutive calls is one step in which rank r trains on
    the r-th call's whole batch (a global batch of N*B).  Calls that only hand
    a rank its batch return the latest step's results.
    """

    def __init__(self, adapter, compiled, model, sliced, bounds_fn, single_output,
                 combiner=None):
        self.adapter = adapter
        self.session = adapter.session
        self.fn = compiled
        self.model = model
        self.sliced = sliced
        self.bounds_fn = bounds_fn
        self.single_output = single_output
        self.calls = 0
        #: combines, after each step, what the step's exchange did not carry
        self.combiner = combiner
        self._stash = None
        self._latest = None
        self._last_outputs = None
        #: this rank's weight (rows) in the latest step; 0 for a padding row
        self.last_weight = None

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __repr__(self):
        return "<tmpi DistributedFunction %s of %r>" % (self.model.name, self.fn)

    # -- batches --------------------------------------------------------------------
    def rows_of(self, args, kwargs):
        """``(rows, bounds)``: a call's global batch rows (``None`` when no batch is
        found) and, in the ``givens`` style, the slice bounds of each dataset."""
        if self.sliced:
            raw = [int(b) for b in self.bounds_fn(*args, **kwargs)]
            # Python slice semantics: negative and past-the-end bounds clip.
            bounds = []
            for start, stop, length in zip(raw[::3], raw[1::3], raw[2::3]):
                start, stop, _ = slice(start, stop).indices(length)
                bounds += [start, max(start, stop)]
            lengths = {stop - start for start, stop in zip(bounds[::2], bounds[1::2])}
            if len(lengths) != 1:
                raise TmpiError(
                    "%s slices its givens to different lengths %s in one call; tmpi cannot "
                    "split such a batch across ranks." % (self.model.name, sorted(lengths)))
            return lengths.pop(), bounds
        return batch_rows(itertools.chain(args, kwargs.values())), None

    def _local_call(self, args, kwargs, rows, bounds, lo, hi):
        """Arguments that make the compiled function see rows ``[lo, hi)``."""
        if self.sliced:
            for s, start in zip(self.sliced, bounds[::2]):
                s.lo.set_value(np.int64(start + lo))
                s.hi.set_value(np.int64(start + hi))
            return args, kwargs
        return cut_rows(args, rows, lo, hi), cut_rows(kwargs, rows, lo, hi)

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
            return self._step(args, kwargs, weight=rows or 1, rows=rows, batch=rows)
        if self.calls == 1:
            check_ranks_vs_rows(rows, session.size, self.model.name)
        lo, hi, weight = local_rows(rows, session.rank, session.size)
        local_args, local_kwargs = self._local_call(args, kwargs, rows, bounds, lo, hi)
        return self._step(local_args, local_kwargs, weight=weight, rows=hi - lo, batch=rows)

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

    def _step(self, args, kwargs, weight, rows, batch=None):
        """One step on this rank's ``rows`` rows (``weight``: what they count
        for); ``batch`` is the global batch's rows when every rank was handed
        the same batch (the envelope checks that they agree)."""
        session = self.session
        self.last_weight = weight
        session.begin_step(self.model, weight, call=self.calls, rows=batch)
        outputs = self.fn(*args, **kwargs)
        values = [outputs] if self.single_output else list(outputs or [])
        if values and self.combiner is not None:
            values = self.combiner(values, weight, rows, total=batch)
        session.end_step(self.model, weight, outputs=values)
        if self.single_output:
            result = values[0]
        elif isinstance(outputs, tuple):
            result = tuple(values)
        else:
            result = values if outputs is not None else outputs
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


def _hold(args, kwargs):
    """Copy array arguments a script might overwrite before the step runs."""
    def keep(a):
        return a.copy() if isinstance(a, np.ndarray) else a
    return [keep(a) for a in args], {k: keep(v) for k, v in kwargs.items()}


@hookimpl(trylast=True)
def tmpi_call(session, call):
    """Without another plugin's answer, a call runs."""
    return call.run()
