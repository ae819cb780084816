"""Blocks' monitoring under tmpi: each rank holds its share of an accumulator.

A rank runs only its rows of each batch, so the accumulators of Blocks'
``AggregationBuffer`` (``TrainingDataMonitoring`` on training batches,
``DataStreamMonitoring`` on its own stream) hold this rank's *share* of the
one-process value: scaled so that the sum over ranks is exactly what one
process would hold.  A read-out lends the buffer that sum
(:meth:`MonitoringShares.summed`), so logged values equal one process's.
"""
import contextlib
from collections import namedtuple

import numpy as np

from tmpi_adapters.core.graph import ancestors


#: One monitoring accumulator that holds this rank's share.  ``additive``:
#: ``acc <- acc + increment`` (Blocks' Mean); otherwise ``acc <- value``
#: (TakeLast).  ``extensive``: the increment is a sum over rows (a Mean whose
#: denominator depends on the data), otherwise a mean over rows.
Accumulator = namedtuple("Accumulator", "variable additive extensive")


def share_fraction(rows, weight):
    """What one rank's increment counts for: its share of a batch's rows."""
    return float(weight) / rows if rows else 0.0


def scale_share(old, new, fraction, counted, additive, extensive):
    """This rank's share of an accumulator after one batch.

    Parameters
    ----------
    old, new : numpy arrays
        The accumulator before and after this rank ran its rows.
    fraction : float
        This rank's rows over the batch's rows (0 for a padding row).
    counted : bool
        False when this rank ran only a padding row.
    additive, extensive : bool
        See :data:`Accumulator`.

    Returns
    -------
    numpy array
        The value whose sum over ranks equals what one process would hold.
    """
    factor = (1.0 if counted else 0.0) if extensive else fraction
    if additive:
        return old + (new - old) * factor
    return new * factor


def _has_data(expression, inputs):
    from theano.gof import Variable
    if not isinstance(expression, Variable):
        return False
    return bool(set(ancestors([expression])) & inputs)


def buffer_accumulators(buffer, loss_reduction="mean"):
    """The accumulators of a Blocks ``AggregationBuffer`` that depend on data.

    Returns ``(shares, local)``: scalar ``Mean``/``TakeLast`` accumulators whose
    values can be summed over ranks, and the data-dependent rest (minimum,
    maximum, concatenation, non-scalars) that stays per rank.  Accumulators
    that do not depend on data (batch counters, parameter norms) are in
    neither: they are identical on every rank.
    """
    from blocks.monitoring.aggregation import Mean, TakeLast
    from theano.compile.sharedvalue import SharedVariable
    inputs = set(buffer.inputs)
    updated = {id(var): expr for var, expr in buffer.accumulation_updates}
    owner = {}
    for variable in buffer.variables:
        scheme = variable.tag.aggregation_scheme
        readout = buffer.readout_variables[variable.name]
        for acc in ancestors([readout]):
            if isinstance(acc, SharedVariable) and id(acc) in updated:
                owner.setdefault(id(acc), scheme)
    shares, local = [], []
    for var, expr in buffer.accumulation_updates:
        if not _has_data(expr, inputs):
            continue
        scheme = owner.get(id(var))
        if isinstance(scheme, (Mean, TakeLast)) and var.ndim == 0:
            extensive = loss_reduction == "sum" or (
                isinstance(scheme, Mean) and _has_data(scheme.denominator, inputs))
            shares.append(Accumulator(var, isinstance(scheme, Mean), extensive))
        else:
            local.append(var)
    return shares, local


class MonitoringShares:
    """The accumulators of one buffer that hold per-rank shares.

    Each rank keeps its share between read-outs; :meth:`summed` lends the
    read-out the sum over ranks and gives every rank its share back.
    """

    def __init__(self, session, accumulators):
        self.session = session
        self.accumulators = list(accumulators)

    def __bool__(self):
        return bool(self.accumulators)

    def values(self):
        return [np.array(a.variable.get_value(), copy=True) for a in self.accumulators]

    def keep_share(self, old, fraction, counted):
        """Turn what the compiled function just wrote into this rank's share."""
        for acc, before in zip(self.accumulators, old):
            new = acc.variable.get_value(borrow=True)
            value = scale_share(before, new, fraction, counted, acc.additive, acc.extensive)
            acc.variable.set_value(np.asarray(value, dtype=before.dtype))

    @contextlib.contextmanager
    def summed(self):
        shares = self.values()
        totals = self.session.exchanger.allreduce(
            [np.asarray(s, dtype=np.float64) for s in shares], op="sum", precision="native")
        for acc, share, total in zip(self.accumulators, shares, totals):
            acc.variable.set_value(np.asarray(total, dtype=share.dtype))
        try:
            yield
        finally:
            for acc, share in zip(self.accumulators, shares):
                acc.variable.set_value(share)
