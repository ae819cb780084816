"""Blocks' monitoring under tmpi: each rank holds its share of an accumulator.

A rank runs only its rows of each batch, so the accumulators of Blocks'
``AggregationBuffer`` (``TrainingDataMonitoring`` on training batches,
``DataStreamMonitoring`` on its own stream) hold this rank's *share* of the
one-process value: scaled so that the sum over ranks is exactly what one
process would hold.  A read-out lends the buffer that sum
(:meth:`MonitoringShares.summed`), so logged values equal one process's.

How a monitored value combines is read from its graph
(:func:`tmpi_adapters.graphs.outputs.classify`, with the batch axes of the
buffer's inputs from :mod:`tmpi_adapters.graphs.layout`): a mean over rows is
scaled by the rank's share of the rows, a sum over rows (a count such as
``x.shape[0]``, a ``mean(total, count)``'s parts) is kept whole and added,
a maximum or minimum over rows is the extremum over ranks, and a value
computed only from axes that are not split (a sequence's length) is the same
on every rank.  Integer accumulators keep their exact share beside the
variable (a share of a count is not an integer).
"""
import contextlib
from collections import namedtuple

import numpy as np

from tmpi_adapters.graphs import ancestors


#: One monitoring accumulator that holds this rank's share.  ``additive``:
#: ``acc <- acc + increment`` (Blocks' Mean); otherwise ``acc <- value``
#: (TakeLast).  ``extensive``: the increment is a sum over rows (a Mean whose
#: denominator depends on the data, a count), otherwise a mean over rows.
#: ``extremum``: ``"max"``/``"min"`` for an accumulator that holds an extremum
#: over rows (kept as it is; the read-out takes the extremum over ranks).
Accumulator = namedtuple("Accumulator", "variable additive extensive extremum")
Accumulator.__new__.__defaults__ = (None,)


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


def buffer_layout(buffer):
    """The :class:`~tmpi_adapters.graphs.layout.Layout` of a Blocks
    ``AggregationBuffer``'s inputs (their batch axes: axis 1 for the
    ``(time, batch)`` inputs of recurrent bricks) and its row-wise marks."""
    from blocks.monitoring.aggregation import Mean
    from tmpi_adapters.graphs.layout import Layout
    from tmpi_adapters.graphs.rows import Rows
    inputs = set(buffer.inputs)
    schemes = [getattr(v.tag, "aggregation_scheme", None) for v in buffer.variables]
    counts = [s.denominator for s in schemes if isinstance(s, Mean)
              and _has_data(s.denominator, inputs)]
    values = [getattr(s, name, None) for s in schemes for name in ("variable", "numerator")]
    graph = [expr for _, expr in buffer.accumulation_updates] + \
        [v for v in values if hasattr(v, "owner")]
    layout = Layout(list(buffer.inputs), graph,
                    costs=[v for v in buffer.variables if getattr(v, "ndim", 1) == 0],
                    counts=counts)
    return layout, Rows(layout)


def buffer_accumulators(buffer, loss_reduction="mean", layout=None):
    """The accumulators of a Blocks ``AggregationBuffer`` that depend on data.

    ``layout`` is :func:`buffer_layout`'s answer when the caller has it.
    Returns ``(shares, local)``: scalar accumulators whose values combine over
    ranks (:data:`Accumulator`), and the data-dependent rest (concatenations,
    non-scalars, extrema of values that are not extrema over rows) that stays
    per rank.  Accumulators that do not depend on data (batch counters,
    parameter norms), or only on axes that are not split, are in neither:
    they are identical on every rank.
    """
    from blocks.monitoring.aggregation import Maximum, Mean, Minimum, TakeLast
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
    kind = _classifier(inputs, layout or buffer_layout(buffer))
    shares, local = [], []
    for var, expr in buffer.accumulation_updates:
        if not _has_data(expr, inputs):
            continue
        scheme = owner.get(id(var))
        if var.ndim != 0 or not isinstance(scheme, (Mean, TakeLast, Minimum, Maximum)):
            local.append(var)
            continue
        if isinstance(scheme, (Minimum, Maximum)):
            wanted = "min" if type(scheme) is Minimum else "max"
            if kind(scheme.variable) == wanted:
                shares.append(Accumulator(var, False, False, wanted))
            else:
                local.append(var)
            continue
        value = _increment(scheme, expr) if isinstance(scheme, Mean) else scheme.variable
        found = kind(value)
        if found == "same":
            continue
        if found in ("max", "min") and (isinstance(scheme, TakeLast) or (
                value is scheme.numerator and not _has_data(scheme.denominator, inputs))):
            # Extremum over ranks: exact for the value of one batch (a Mean
            # read after every batch); per rank when batches accumulate.
            shares.append(Accumulator(var, isinstance(scheme, Mean), False, found))
            continue
        if found not in ("mean", "sum"):
            local.append(var)
            continue
        extensive = loss_reduction == "sum" or found == "sum" or (
            isinstance(scheme, Mean) and _has_data(scheme.denominator, inputs))
        shares.append(Accumulator(var, isinstance(scheme, Mean), extensive))
    return shares, local


def channels_of(buffer, accumulators):
    """The names of ``buffer``'s channels read out from ``accumulators``."""
    wanted = {id(v) for v in accumulators}
    return [name for name, readout in buffer.readout_variables.items()
            if any(id(v) in wanted for v in ancestors([readout]))]


def _increment(scheme, expr):
    """What a Blocks ``Mean``'s accumulator adds per batch: its numerator or
    its denominator (``acc <- increment + previous``)."""
    node = getattr(expr, "owner", None)
    if node is not None:
        for candidate in (scheme.numerator, scheme.denominator):
            if any(candidate is i for i in node.inputs):
                return candidate
    return scheme.numerator


def _classifier(inputs, layout):
    """``kind(variable)``: how a monitored value combines over ranks (see the
    module doc), read with ``layout``'s ``(Layout, Rows)``."""
    from tmpi_adapters.graphs.outputs import classify
    rows = layout[1]

    def kind(variable):
        if not hasattr(variable, "owner"):
            return "same"  # a Python number (Blocks' default denominator 1.)
        return classify(variable, inputs, "mean", rows=rows, strict=False)
    return kind


class MonitoringShares:
    """The accumulators of one buffer that hold per-rank shares.

    Each rank keeps its share between read-outs; :meth:`summed` lends the
    read-out the sum over ranks (the extremum, for extrema) and gives every
    rank its share back.  An integer accumulator's share is kept exactly
    beside it, the variable holding its rounding.
    """

    def __init__(self, session, accumulators):
        self.session = session
        self.accumulators = list(accumulators)
        self._exact = {}   # index -> (exact share, the value written to the variable)
        self._raw = []     # the variables' values when values() was last read
        self._batches = {}  # index -> (batches an additive extremum holds, its value)

    def __bool__(self):
        return bool(self.accumulators)

    def values(self):
        """Each accumulator's share, exactly (float64 for integer ones)."""
        found, self._raw = [], []
        for i, acc in enumerate(self.accumulators):
            value = np.array(acc.variable.get_value(), copy=True)
            self._raw.append(value)
            exact = self._exact.get(i)
            if exact is not None and np.array_equal(exact[1], value):
                value = exact[0]
            found.append(value)
        return found

    def _write(self, i, value):
        variable = self.accumulators[i].variable
        dtype = np.dtype(variable.dtype)
        if dtype.kind in "iub":
            written = np.asarray(np.rint(value), dtype=dtype)
            self._exact[i] = (np.asarray(value, dtype=np.float64), written)
            variable.set_value(written)
        else:
            self._exact.pop(i, None)
            variable.set_value(np.asarray(value, dtype=dtype))

    def keep_share(self, old, fraction, counted):
        """Turn what the compiled function just wrote into this rank's share."""
        raw = getattr(self, "_raw", None) or old
        for i, (acc, before, written) in enumerate(zip(self.accumulators, old, raw)):
            if acc.extremum is not None:
                # an extremum over this rank's rows: combined at read-out;
                # a sum of extrema only while it holds one batch
                if acc.additive:
                    count, last = self._batches.get(i, (0, None))
                    count = count + 1 if last is not None and np.array_equal(last, written) \
                        else 1
                    self._batches[i] = (count, np.array(acc.variable.get_value(), copy=True))
                continue
            new = acc.variable.get_value(borrow=True)
            if np.dtype(acc.variable.dtype).kind in "iub":
                new = np.asarray(new, dtype=np.float64)
                if acc.additive:
                    # the increment is exact; the variable held a rounded share
                    new = before + (new - written)
            value = scale_share(before, new, fraction, counted, acc.additive, acc.extensive)
            self._write(i, value)

    @contextlib.contextmanager
    def summed(self):
        shares = self.values()
        n = len(shares)
        batches = [self._batches.get(i, (1, None))[0] if acc.additive else 1
                   for i, acc in enumerate(self.accumulators)]
        row = np.asarray([float(s) for s in shares] + batches, dtype=np.float64).reshape(1, -1)
        # One gather: every rank combines the same numbers in the same order.
        gathered = self.session.exchanger.allgather_rows(row)
        for i, acc in enumerate(self.accumulators):
            column = gathered[:, i]
            if acc.extremum is not None and np.any(gathered[:, n + i] != 1):
                continue  # a sum of several batches' extrema: this rank's own
            total = (column.max() if acc.extremum == "max" else
                     column.min() if acc.extremum == "min" else column.sum())
            dtype = np.dtype(acc.variable.dtype)
            acc.variable.set_value(np.asarray(np.rint(total) if dtype.kind in "iub" else total,
                                              dtype=dtype))
        try:
            yield
        finally:
            for i, share in enumerate(shares):
                self._write(i, share)
