"""Keras' stateful metrics on N ranks: the accumulators one process would hold.

Keras 2.3 keeps every metric as running sums (``total``, ``count`` of a
``Mean``) and reads the value back as ``total / count`` after each call.  How
a rank's increment of an accumulator combines into the one-process increment
depends on what is accumulated, read from the metric's update graph:

* a per-row value (``mae``, ``accuracy``, ``Mean()(per_row)``): ``total``
  grows by the sum of the rows' values and ``count`` by the rows, so the
  ranks' increments are **added**;
* a value that is one number per batch (a metric function returning
  ``K.sum(...)`` or ``K.mean(...)``, ``add_metric(K.sum(out))``): ``count``
  grows by 1 per batch on every rank, as in one process, so it is kept;
  ``total`` grows by the batch's value, so the ranks' increments are added
  for a sum over the rows and **averaged, weighted by rows**, for a mean.

So each accumulator gets a kind: ``"sum"``, ``"mean"`` or ``"same"``
(identical on every rank already).  Under a gradient rule the training
step's own exchange carries them (``"sum"`` as increments, the others as
new values averaged); otherwise, and in a split evaluation, one allreduce
after the call does (:func:`combine_increments`).
"""
import numpy as np

from tmpi_adapters.core.protocol import write_values

#: The reductions an accumulator's increment combines with across ranks.
REDUCED = ("sum", "mean")


def metric_variables(model):
    """Shared variables of the model's stateful metrics (``total``, ``count``)."""
    found = []
    for metric in _metrics(model):
        for variable in getattr(metric, "weights", []):
            if not any(variable is v for v in found):
                found.append(variable)
    return found


def metric_kinds(model):
    """``{id(variable): kind}`` for the model's metric accumulators (see the
    module docstring); an accumulator whose update tmpi cannot read is summed,
    as a per-row metric's is."""
    kinds = {}
    for metric in _metrics(model):
        for variable, update in _pairs(getattr(metric, "updates", [])):
            if id(variable) not in kinds:
                kinds[id(variable)] = _increment_kind(variable, update)
    return kinds


def _metrics(model):
    getter = getattr(model, "_get_training_eval_metrics", None)
    return getter() if getter else []


def _pairs(updates):
    for update in updates:
        if isinstance(update, (tuple, list)) and len(update) == 2:
            yield update


def _increment_kind(variable, update):
    """The kind of ``update - variable`` when ``update`` is ``variable + increment``."""
    from tmpi_adapters.graphs.outputs import classify
    node = getattr(update, "owner", None)
    inputs = list(getattr(node, "inputs", []))
    if len(inputs) != 2 or not any(i is variable for i in inputs) or \
            type(getattr(node.op, "scalar_op", None)).__name__ != "Add":
        return "sum"
    increment = inputs[1] if inputs[0] is variable else inputs[0]
    kind = classify(increment, _inputs_of(increment), default="mean")
    return kind if kind in REDUCED + ("same",) else "sum"


def _inputs_of(variable):
    """The roots of ``variable``'s graph that carry data: neither shared nor constant."""
    from theano.compile.sharedvalue import SharedVariable
    from theano.gof.graph import Constant, inputs
    return {v for v in inputs([variable]) if not isinstance(v, (SharedVariable, Constant))}


# -- numpy in, numpy out ---------------------------------------------------------------

def read_copies(variables):
    """Copies of the values of shared variables (list of numpy arrays)."""
    return [np.array(v.get_value(borrow=True), copy=True) for v in variables]


def increments(variables, before):
    """Each variable's change since ``before``, as float64."""
    return [np.asarray(v.get_value(borrow=True), dtype=np.float64) - old
            for v, old in zip(variables, before)]


def combine_increments(variables, before, kinds, exchanger, weight, total=None, extra=()):
    """Replace each rank's own increment of metric accumulators by the
    one-process increment: ``kinds[i]`` ``"sum"`` adds the ranks' increments,
    ``"mean"`` averages them weighted by ``weight`` (this rank's rows;
    ``total``: every rank's, when known), ``"same"`` keeps this rank's.

    ``extra`` are ``(array, op)`` pairs reduced in the same collective (a
    split evaluation's loss); their results are returned.
    """
    moved = [i for i, kind in enumerate(kinds) if kind in REDUCED]
    if not moved and not extra:
        return []
    mine = increments([variables[i] for i in moved], [before[i] for i in moved])
    arrays = [np.asarray(a, dtype=np.float64) for a, _ in extra] + mine
    ops = [op for _, op in extra] + [kinds[i] for i in moved]
    reduced = exchanger.allreduce(arrays, ops=ops, weight=weight, total=total)
    new = reduced[len(extra):]
    write_values([variables[i] for i in moved],
                 [np.asarray(before[i] + delta, dtype=before[i].dtype)
                  for i, delta in zip(moved, new)])
    return reduced[:len(extra)]
