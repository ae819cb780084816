"""What a Keras model's compiled functions become on every rank.

:class:`KerasStep` stands in for the Theano function of a model's
``train_function``: one distributed training step, with Keras' stateful
metrics kept global.  :class:`KerasEvaluation` stands in for the one of its
``test_function``: each batch split across ranks, results those of one
process.  Metric accumulators (``total``/``count`` of Keras' ``Mean``
metrics) get the one-process increment (:mod:`.metrics`), and epoch logs are
made identical on every rank (:func:`agree_logs`).
"""
import numbers

import numpy as np

from tmpi_adapters.core.batches import batch_rows, cut_rows, local_rows
from tmpi_adapters.core.protocol import write_values
from tmpi_adapters.frameworks.keras.metrics import combine_increments, read_copies


class KerasStep:
    """What a Keras ``train_function`` calls in place of its Theano function.

    One distributed training step (the
    :class:`~tmpi_adapters.core.function.DistributedFunction`), plus:
    Keras' metric accumulators (``total``/``count`` of ``Mean`` metrics) get
    the one-process increment (:mod:`.metrics`), so the metric values Keras
    reads back after the call are those of the whole batch (the step's own
    exchange carries them under a gradient rule; otherwise they are combined
    here after the call); and, with ``--lr-scaling``, the learning-rate
    factor for the coming step is set first.

    Parameters
    ----------
    adapter : tmpi_adapters.frameworks.keras.adapter.KerasAdapter
        Says whether a weak-scaling ``fit`` runs on this rank's shard
        (``adapter.stepping_locally``).
    distributed : DistributedFunction
    accumulators : list of SharedVariable
        Metric state updated by the step (scalars, Keras' floatx).
    kinds : list of str
        Per accumulator, how its increments combine (:func:`.metrics.metric_kinds`).
    lr_scale : SharedVariable or None
        The in-graph factor of the optimizer's learning rate.
    carried : list of SharedVariable
        The accumulators the step's exchange already combines.
    """

    def __init__(self, adapter, distributed, accumulators, kinds, lr_scale=None, carried=()):
        self.adapter = adapter
        self.session = adapter.session
        self.distributed = distributed
        self.accumulators = list(accumulators)
        self.lr_scale = lr_scale
        in_step = {id(v) for v in carried}
        #: per accumulator, its combination after the call (None: done in the step)
        self._kinds = [None if id(v) in in_step else kind
                       for v, kind in zip(self.accumulators, kinds)]
        self._after_call = any(kind is not None for kind in self._kinds)
        self._after_step = None   # accumulator values after the latest step

    def __getattr__(self, name):
        return getattr(self.distributed, name)

    def __repr__(self):
        return "<tmpi KerasStep %s>" % self.distributed.model.name

    def __call__(self, *args, **kwargs):
        session, distributed = self.session, self.distributed
        model = distributed.model
        if self.lr_scale is not None:
            factor = session.learning_rate_scale(model)
            self.lr_scale.set_value(np.asarray(factor, dtype=self.lr_scale.dtype))
        before = read_copies(self.accumulators) if session.size > 1 else None
        steps = model.step
        if self.adapter.stepping_locally:
            outputs = distributed.step_local(*args, **kwargs)
        else:
            outputs = distributed(*args, **kwargs)
        if before is None:
            return outputs
        if model.step != steps:
            if self._after_call:
                combine_increments(self.accumulators, before, self._kinds, session.exchanger,
                                   weight=distributed.last_weight)
            self._after_step = read_copies(self.accumulators)
        elif self._after_step is not None and not any(np.any(b) for b in before):
            # A weak-scaling call that only handed this rank its batch returns
            # the latest step's outputs; after train_on_batch's metric reset
            # Keras would read 0/0 from the accumulators, so give it the
            # latest step's values too.
            write_values(self.accumulators, [a.copy() for a in self._after_step])
        return outputs


class KerasEvaluation:
    """A Keras ``test_function`` split across ranks like a training step.

    Each call's batch is cut into contiguous per-rank parts (random draws,
    if the function makes any, are made for the whole batch); the loss (and
    every other output that is not a stateful metric) is averaged weighted by
    rows, and metric accumulators get the one-process increment, all in one
    collective.  Keras then reads the metrics from the accumulators, so
    results equal the one-process evaluation.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    function : theano compiled function
    accumulators : list of SharedVariable
    kinds : list of str
        Per accumulator, how its increments combine (:func:`.metrics.metric_kinds`).
    combine : list of bool
        Per output: True to average it over ranks (Keras reads the others
        back from the accumulators).
    window : tmpi_adapters.frameworks.random_streams.NoiseWindow or None
        Set to the whole batch while the function runs, when it draws.
    """

    def __init__(self, session, function, accumulators, kinds, combine, window=None):
        self.session = session
        self.fn = function
        self.accumulators = list(accumulators)
        self.kinds = list(kinds)
        self.combine = list(combine)
        self.window = window
        #: the arguments that are Keras' sample weights: a loss weighted by them is
        #: normalised by the share of nonzero weights, a value of the whole batch
        inputs = getattr(getattr(function, "maker", None), "inputs", None) or []
        self._weights = [k for k, i in enumerate(inputs)
                         if (getattr(i.variable, "name", None) or "").endswith("_sample_weights")]

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __call__(self, *args):
        session = self.session
        rows = batch_rows(args)
        if rows is None or any(k < len(args) and not np.all(np.asarray(args[k]))
                               for k in self._weights):
            # Zero sample weights: Keras divides the loss by the share of nonzero
            # weights in the whole batch, which no rank's share has: every rank
            # evaluates the whole batch (the same on every rank, nothing combined).
            return self.fn(*args)
        lo, hi, weight = local_rows(rows, session.rank, session.size)
        local = cut_rows(args, rows, lo, hi)
        before = read_copies(self.accumulators)
        if self.window is not None:
            self.window.whole_batch(rows, lo, hi)
        try:
            outputs = self.fn(*local)
        finally:
            if self.window is not None:
                self.window.local()
        losses = [(o, "mean") for o, c in zip(outputs, self.combine) if c]
        combined = iter(combine_increments(self.accumulators, before, self.kinds,
                                           session.exchanger, weight, total=rows,
                                           extra=losses))
        return [np.asarray(next(combined), dtype=np.asarray(o).dtype) if c else o
                for o, c in zip(outputs, self.combine)]


# -- logs ---------------------------------------------------------------------------

def agree_logs(logs, exchanger):
    """Make a Keras ``logs`` dict identical on every rank (in place).

    Scalars that already agree are left untouched (so exact runs stay exact);
    otherwise each is replaced by its mean over ranks.
    """
    keys = sorted(k for k, v in logs.items() if _is_scalar(v))
    values = [float(logs[k]) for k in keys]
    gathered = exchanger.allgather_object((keys, values))
    if all(g == gathered[0] for g in gathered):
        return
    common = set(keys)
    for other_keys, _ in gathered:
        common &= set(other_keys)
    for key in sorted(common):
        mean = np.mean([vals[ks.index(key)] for ks, vals in gathered])
        old = logs[key]
        logs[key] = np.asarray(mean, dtype=old.dtype) if isinstance(old, np.ndarray) \
            else type(old)(mean)


def _is_scalar(value):
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, numbers.Real):
        return True
    return isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "fiu"
