"""What a function's returned values are, so that N ranks return what one process would.

A rank computes its values from its share of the batch.  How they combine
into the one-process value depends on what they are, read from the graph:

``"mean"``
    a mean over the batch's rows (``T.mean(loss)``, a Keras loss): the
    ranks' values averaged, weighted by their rows.
``"sum"``
    a sum over the batch's rows (``T.sum(loss)``, ``add_metric(K.sum(...))``):
    the ranks' values added.
``"same"``
    computed from no batch at all (a learning rate, a parameter's norm):
    every rank already has the one-process value.
``"rows"``
    one value per row (predictions, per-sample losses): gathered in rank order.

A scalar is classified by walking its graph down to the reduction that
makes it: a ``Sum`` over batch rows is a sum; a sum divided by a count taken
from the batch's shape is a mean; scaling by values that do not come from the
batch keeps the kind.  What the walk cannot classify keeps tmpi's long-standing
default, the weighted mean; a script says otherwise by naming the output
``<name>:sum`` or ``<name>:mean`` (the suffix is what tmpi reads; Theano
ignores it).  Non-scalar values are classified on the first call, the same
way on every rank (:meth:`~tmpi_adapters.core.session.Session.output_kinds`).
"""
import numpy as np

from tmpi_adapters.core.graph import ancestors

KINDS = ("mean", "sum", "same", "rows")
#: The suffixes of a variable's name that say how it combines.
_NAMED = {":sum": "sum", ":mean": "mean"}


def named_kind(variable):
    """The kind a script gave a variable by its name's suffix, or ``None``."""
    name = getattr(variable, "name", None) or ""
    for suffix, kind in _NAMED.items():
        if name.endswith(suffix):
            return kind
    return None


#: A non-scalar value that depends on the batch: rows or a mean, decided on
#: the first call.
UNDECIDED = "?"


def classify(variable, data, default="mean"):
    """The kind of a returned ``variable`` whose batch comes from ``data``
    (the function's inputs and ``givens`` targets that carry it).

    Returns one of :data:`KINDS`, ``default`` for a scalar the graph does not
    explain, or :data:`UNDECIDED` for a non-scalar value computed from the
    batch.
    """
    named = named_kind(variable)
    if named is not None:
        return named
    if not _depends(variable, data):
        return "same"
    if getattr(variable, "ndim", 0) != 0:
        return UNDECIDED
    return _scalar_kind(variable, data) or default


def _depends(variable, data):
    return bool(set(ancestors([variable])) & data)


def _scalar_kind(variable, data, depth=0):
    """``"mean"``, ``"sum"``, ``"same"`` or ``None`` (unknown) for a scalar."""
    from theano import scalar
    from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise
    if depth > 50:
        return None
    if not _depends(variable, data):
        return "same"
    node = variable.owner
    if node is None:
        return None
    op = node.op
    if isinstance(op, DimShuffle):
        return _scalar_kind(node.inputs[0], data, depth + 1)
    if isinstance(op, CAReduce) and isinstance(op.scalar_op, scalar.Add):
        if node.inputs[0].ndim == 0:  # a sum of one number is that number
            return _scalar_kind(node.inputs[0], data, depth + 1)
        return "sum"
    if not isinstance(op, Elemwise):
        return None
    scalar_op = op.scalar_op
    batch = [i for i in node.inputs if _depends(i, data)]
    if isinstance(scalar_op, (scalar.Neg, scalar.Cast, scalar.Identity)):
        return _scalar_kind(node.inputs[0], data, depth + 1)
    if isinstance(scalar_op, scalar.Mul) and len(batch) == 1:
        return _scalar_kind(batch[0], data, depth + 1)
    if isinstance(scalar_op, (scalar.TrueDiv, scalar.IntDiv)):
        numerator, denominator = node.inputs
        kind = _scalar_kind(numerator, data, depth + 1)
        if not _depends(denominator, data):
            return kind
        if kind == "sum" and counts_rows(denominator, data):
            return "mean"
        return None
    if isinstance(scalar_op, (scalar.Add, scalar.Sub)):
        kinds = {_scalar_kind(i, data, depth + 1) for i in batch}
        constant = len(batch) < len(node.inputs)
        if kinds == {"mean"}:
            return "mean"  # a weighted mean of (m + c) is (mean + c)
        if kinds == {"sum"} and not constant:
            return "sum"
        return None
    return None


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


class Combiner:
    """Combines, after a call, the values the call's own exchange did not carry.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    kinds : list
        Per returned value: a kind of :data:`KINDS`, :data:`UNDECIDED`, or
        ``None`` (nothing to do: the step's exchange carried it).
    """

    def __init__(self, session, kinds):
        self.session = session
        self.kinds = list(kinds)

    @property
    def needed(self):
        """True when some value must still be combined."""
        return any(kind not in (None, "same") for kind in self.kinds)

    def __call__(self, values, weight, rows, total=None):
        """The combined ``values`` of this rank's ``rows`` rows, which count
        for ``weight`` (``total``: every rank's weight, when known)."""
        session = self.session
        if session.size == 1 or session.options.outputs == "local" or not self.needed:
            return values
        if UNDECIDED in self.kinds:
            self._decide(values, rows)
        result = list(values)
        reduced = [i for i, kind in enumerate(self.kinds) if kind in ("mean", "sum")]
        if reduced:
            arrays = [np.asarray(values[i], dtype=np.float64) for i in reduced]
            ops = [self.kinds[i] for i in reduced]
            for i, value in zip(reduced, session.exchanger.allreduce(
                    arrays, ops=ops, weight=weight, total=total)):
                like = np.asarray(values[i])
                result[i] = value.astype(like.dtype)[()] if like.dtype.kind in "fc" \
                    else value[()]
        for i, kind in enumerate(self.kinds):
            if kind == "rows":
                result[i] = session.exchanger.allgather_rows(np.asarray(values[i])[:int(weight)])
        return result

    def _decide(self, values, rows):
        """Per-row or not, the same on every rank: a value is gathered as rows
        when on every rank its first dimension is that rank's rows."""
        undecided = [i for i, kind in enumerate(self.kinds) if kind == UNDECIDED]
        local = [np.ndim(values[i]) >= 1 and np.shape(values[i])[0] == rows for i in undecided]
        votes = self.session.exchanger.allgather_object(local)
        for k, i in enumerate(undecided):
            self.kinds[i] = "rows" if all(v[k] for v in votes) else "mean"
