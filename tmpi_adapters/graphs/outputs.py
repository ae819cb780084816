"""What a function's returned values are, so that N ranks return what one process would.

A rank computes its values from its share of the batch.  How they combine
into the one-process value depends on what they are, read from the graph:

``"mean"``
    a mean over the batch's rows (``T.mean(loss)``, a Keras loss): the
    ranks' values averaged, weighted by their rows.  A split evaluation's
    mean that is a sum divided by a count (``T.mean(T.neq(y_pred, y))``)
    travels as its sum and count instead (:class:`Ratio`), so that it is
    the one-process float wherever the ranks' sums add up exactly.
``"sum"``
    a sum over the batch's rows (``T.sum(loss)``, ``x.shape[0]``): the
    ranks' values added.
``"max"``, ``"min"``
    the largest or smallest value over the batch (``probs.max()``): the
    extremum over ranks.
``"same"``
    computed from no batch at all (a learning rate, a parameter's norm), or
    only from axes that are not split (a sequence's length): every rank
    already has the one-process value.
``"rows"``
    one value per row (predictions, per-sample losses): gathered in rank
    order along the value's batch axis.

A value is classified by walking its graph down to the reduction that
makes it: a ``Sum`` over batch rows is a sum; a sum divided by a count taken
from the batch's shape is a mean; scaling by values that do not come from the
batch keeps the kind.  With a :class:`~tmpi_adapters.graphs.rows.Rows` (strict reading)
the walk also checks that what is reduced is row-wise and reduced over the
batch axis, and recognises per-row values and counts of rows; where those
checks fail (a scan's states), a training step's value is walked again
with only the reduced axes checked against the batch's (a sum over axis 1
keeps one value per row).  A value the walk cannot classify keeps tmpi's
long-standing default, the weighted mean, when it has no axis as long as
the batch (a scalar, a gradient); otherwise it is decided on the first
call: gathered along its batch axis when on every rank that axis holds the
rank's rows (with a warning that tmpi cannot tell whether they are the
one-process rows), averaged otherwise.  A script says otherwise by naming
the output ``<name>:sum`` or ``<name>:mean`` (the suffix is what tmpi
reads; Theano ignores it).
"""
import math

import numpy as np

from tmpi_adapters.graphs import ancestors
from tmpi_adapters.graphs.marks import SAME, SHAPE, Shard

KINDS = ("mean", "sum", "max", "min", "same", "rows")
#: The suffixes of a variable's name that say how it combines.
_NAMED = {":sum": "sum", ":mean": "mean"}
#: A non-scalar value that depends on the batch: rows or a mean, decided on
#: the first call.
UNDECIDED = "?"


def named_kind(variable):
    """The kind a script gave a variable by its name's suffix, or ``None``."""
    name = getattr(variable, "name", None) or ""
    for suffix, kind in _NAMED.items():
        if name.endswith(suffix):
            return kind
    return None


def classify(variable, data, default="mean", rows=None, strict=True):
    """The kind of a returned ``variable`` whose batch comes from ``data``
    (the function's inputs and ``givens`` targets that carry it).

    Returns one of :data:`KINDS`; for a value the graph does not explain,
    ``default`` for a scalar and :data:`UNDECIDED` for a non-scalar.
    ``rows`` (a :class:`~tmpi_adapters.graphs.rows.Rows` (strict reading)) makes the walk
    check what it reduces (see the module doc); with ``strict=False`` what
    that walk cannot explain is walked again without the checks (a training
    step's ``T.sum`` of a scan's states is still a sum).
    """
    named = named_kind(variable)
    if named is not None:
        return named
    if not _depends(variable, data):
        return "same"
    if rows is not None:
        mark = rows(variable)
        if isinstance(mark, Shard) and not mark.inner and getattr(variable, "ndim", 0):
            return "rows"
    kind = _reduced_kind(variable, data, rows)
    if kind is None and rows is not None and not strict:
        kind = _reduced_kind(variable, data, None, batch_axes=rows.batch_axes)
        if kind is None:
            # The extremum of every element (a scan's steps and rows alike) is
            # the extremum over ranks, whatever axis the rows are on; never a mean.
            kind = _extremum_of_everything(variable)
        if kind is None and _sizes_without_batch(variable, rows):
            kind = default  # shaped like a parameter (a gradient): not one value per row
    if kind is not None:
        return kind
    return default if getattr(variable, "ndim", 0) == 0 else UNDECIDED


def _extremum_of_everything(variable):
    """``"max"``/``"min"`` for a maximum/minimum over every axis of a value
    (through copies, casts and dimshuffles), else ``None``."""
    from theano import scalar
    from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise
    while variable.owner is not None and (isinstance(variable.owner.op, DimShuffle) or (
            isinstance(variable.owner.op, Elemwise)
            and isinstance(variable.owner.op.scalar_op, (scalar.Identity, scalar.Cast)))):
        variable = variable.owner.inputs[0]
    node = variable.owner
    if node is None:
        return None
    source, axes = node.inputs[0], getattr(node.op, "axis", None)
    if axes is not None and set(axes) != set(range(source.ndim)):
        return None
    if type(node.op).__name__ == "MaxAndArgmax":
        return "max" if node.outputs.index(variable) == 0 else None
    if isinstance(node.op, CAReduce):
        if isinstance(node.op.scalar_op, scalar.Maximum):
            return "max"
        if isinstance(node.op.scalar_op, scalar.Minimum):
            return "min"
    return None


def _depends(variable, data):
    return bool(set(ancestors([variable])) & data)


def _sizes_without_batch(variable, rows):
    """True when the graph knows every axis of ``variable`` and none is the batch's."""
    sizes = rows.layout.sizes.get(variable)
    return sizes is not None and None not in sizes and not rows.batch_axes(variable)


_SWAP = {"max": "min", "min": "max", "mean": "mean", "sum": "sum"}


def _reduced_kind(variable, data, rows, depth=0, batch_axes=None):
    """``"mean"``, ``"sum"``, ``"max"``, ``"min"``, ``"same"`` or ``None`` (unknown).

    Without ``rows``, ``batch_axes(v)`` (the axes of ``v`` whose length is
    the batch's) still makes a reduction that keeps every batch axis, or
    whose batch axes are unknown, unknown: ``T.sum(x, axis=1)`` of a
    ``(batch, features)`` value is one value per row, not a sum over rows.
    """
    from theano import scalar
    from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise
    if depth > 50:
        return None
    if not _depends(variable, data):
        return "same"
    if rows is not None:
        mark = rows(variable)
        if mark == SHAPE:
            return _count_kind(variable, rows.layout)
        if mark is SAME:
            return "same"
    node = variable.owner
    if node is None:
        return None
    op = node.op
    if isinstance(op, DimShuffle):
        return _reduced_kind(node.inputs[0], data, rows, depth + 1, batch_axes)
    if isinstance(op, CAReduce) or type(op).__name__ == "MaxAndArgmax":
        source = node.inputs[0]
        if source.ndim == 0:  # a sum of one number is that number
            return _reduced_kind(source, data, rows, depth + 1, batch_axes)
        axes = getattr(op, "axis", None)
        if rows is not None:
            mark = rows(source)
            if not isinstance(mark, Shard) or (axes is not None and mark.axis not in axes):
                return None
        elif batch_axes is not None and axes is not None and \
                not set(batch_axes(source)) & set(axes):
            return None
        if type(op).__name__ == "MaxAndArgmax":
            return "max" if node.outputs.index(variable) == 0 else None
        scalar_op = op.scalar_op
        if isinstance(scalar_op, scalar.Add):
            return "sum"
        if isinstance(scalar_op, scalar.Maximum):
            return "max"
        if isinstance(scalar_op, scalar.Minimum):
            return "min"
        return None
    if not isinstance(op, Elemwise):
        return None
    scalar_op = op.scalar_op
    batch = [i for i in node.inputs if _depends(i, data)]
    if isinstance(scalar_op, (scalar.Cast, scalar.Identity)):
        return _reduced_kind(node.inputs[0], data, rows, depth + 1, batch_axes)
    if isinstance(scalar_op, scalar.Neg):
        return _SWAP.get(_reduced_kind(node.inputs[0], data, rows, depth + 1, batch_axes))
    if isinstance(scalar_op, scalar.Mul) and len(batch) == 1:
        kind = _reduced_kind(batch[0], data, rows, depth + 1, batch_axes)
        return kind if kind in ("mean", "sum") else None
    if isinstance(scalar_op, (scalar.TrueDiv, scalar.IntDiv)):
        numerator, denominator = node.inputs
        kind = _reduced_kind(numerator, data, rows, depth + 1, batch_axes)
        if kind not in ("mean", "sum"):
            return None
        if not _depends(denominator, data):
            return kind
        if rows is None:
            return "mean" if kind == "sum" and counts_rows(denominator, data) else None
        count = _reduced_kind(denominator, data, rows, depth + 1, batch_axes)
        if count == "same":
            return kind  # divided by a length that is not split
        if count == "sum" and kind == "sum":
            return "mean"
        return None
    if isinstance(scalar_op, (scalar.Add, scalar.Sub)):
        kinds = {_reduced_kind(i, data, rows, depth + 1, batch_axes) for i in batch}
        constant = len(batch) < len(node.inputs)
        if kinds == {"mean"}:
            return "mean"  # a weighted mean of (m + c) is (mean + c)
        if kinds == {"sum"} and not constant:
            return "sum"
        return None
    return None


def _count_kind(variable, layout):
    """A value computed from the batch's sizes alone: a count of rows sums
    over ranks; lengths of axes that are not split are the same everywhere."""
    factors = layout.factors(variable)
    if factors is None:
        return None
    batch = [f for f in factors if layout.is_batch_size(f)]
    if not batch:
        return "same" if all(f is not None for f in factors) else None
    return "sum" if len(batch) == 1 else None


def counts_rows(variable, data):
    """True when ``variable`` is computed from the batch's shape only (a row
    or element count), not from its values."""
    from theano import scalar
    from theano.compile.ops import Shape, Shape_i
    from theano.tensor.elemwise import Elemwise
    stack, seen = [variable], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if current in data:
            return False  # reached the batch's values
        node = current.owner
        if node is None:
            continue
        if isinstance(node.op, (Shape, Shape_i)):
            continue  # a shape of the batch: a count, whatever it was taken of
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, scalar.Second):
            stack.append(node.inputs[1])  # ones_like(x): x gives the shape, not the values
            continue
        stack.extend(node.inputs)
    return True


def ratio_of(variable, data, rows):
    """The :class:`Ratio` that ``variable`` (a scalar mean, as :func:`classify`
    reads it with ``rows``) is, or ``None``."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    steps, current = [], variable
    while current.owner is not None and isinstance(current.owner.op, Elemwise):
        op, inputs = current.owner.op.scalar_op, current.owner.inputs
        if isinstance(op, scalar.Neg):
            steps.append(None)
        elif isinstance(op, scalar.TrueDiv):
            kind = _reduced_kind(inputs[1], data, rows)
            if inputs[1].ndim or kind not in ("sum", "same"):
                return None
            steps.append(kind == "sum")
        else:
            break
        current = inputs[0]
    if variable.ndim or current.ndim or True not in steps \
            or _reduced_kind(current, data, rows) != "sum":
        return None
    return Ratio(steps)


class Ratio:
    """A mean written as a sum over the batch divided by sums over the batch
    and by other values, perhaps negated (``T.mean(v)``: ``sum(v) / n``; over
    two axes ``sum(v) / n / m``; ``sum(w * v) / sum(w)``; the tutorials'
    ``-T.mean(log_p[T.arange(n), y])``), combined as one process computes it.

    The ranks return the parts instead of the value (:meth:`parts`); the
    ranks' sums of each part are added exactly (integers, or ``math.fsum``)
    and rounded once into its dtype, and a function compiled from the top of
    the value's own graph (:meth:`compile`) divides them, so that Theano does
    the same arithmetic as in the one process.  The value is then the
    one-process value whenever the ranks' sums add up to the one-process
    sum: error rates and accuracies (``T.mean(T.neq(y_pred, y))``), any mean
    of integer values.  A mean of other values differs from it by the
    rounding of a sum taken in another order (and of each row's terms,
    which BLAS may round differently for another number of rows).
    """

    def __init__(self, steps):
        #: from the top: ``None`` for a negation, ``True``/``False`` for a
        #: division by a sum over the batch / by a value every rank has
        self.steps = steps
        self._finish = None
        #: per input of the compiled division: its place in the parts,
        #: whether the ranks' values add up, its dtype
        self._fed = []

    def _pieces(self, variable):
        """The sum and the divisors (from the top) under ``variable``, whose
        top is this ratio's."""
        divisors = []
        for step in self.steps:
            inputs = variable.owner.inputs
            if step is not None:
                divisors.append(inputs[1])
            variable = inputs[0]
        return variable, divisors

    def divisors(self, variable):
        """The divisors under ``variable``, from the top."""
        return self._pieces(variable)[1]

    def parts(self, variable):
        """What to compile in place of ``variable`` (this ratio's value, or a
        clone of its graph): a float64 vector of its sum and divisors."""
        import theano.tensor as T
        total, divisors = self._pieces(variable)
        return T.stack([T.cast(v, "float64") for v in [total] + divisors])

    def compile(self, variable, function, folded):
        """Compile, with ``function`` (``theano.function``), what divides the
        combined parts as ``variable``'s graph does.  ``folded``: per divisor,
        the constant the one process's optimizer made of it (a batch size the
        graph declares: ``s / 10`` becomes ``s * 0.1``) or ``None``; such
        divisors stay constants, so that the division is folded alike."""
        import theano
        import theano.tensor as T
        total, divisors = self._pieces(variable)
        summed = [True] + [step for step in self.steps if step is not None]
        constants = [None] + list(folded)
        replace, inputs = {}, []
        for k, v in enumerate([total] + divisors):
            if isinstance(v, theano.gof.Constant):
                continue
            if constants[k] is not None:
                replace[v] = T.constant(np.asarray(constants[k], dtype=v.dtype))
                continue
            replace[v] = v.type()
            inputs.append(replace[v])
            self._fed.append((k, summed[k], v.dtype))
        self._finish = function(inputs, theano.clone(variable, replace=replace))

    def combine(self, pieces):
        """The value, from the :meth:`parts` of every rank that counts."""
        values = []
        for k, summed, dtype in self._fed:
            column = [p[k] for p in pieces]
            if not summed:
                value = column[0]
            elif np.dtype(dtype).kind == "f":
                value = math.fsum(column)
            else:
                value = sum(int(v) for v in column)
            values.append(np.asarray(value, dtype=dtype))
        return np.asarray(self._finish(*values))[()]
