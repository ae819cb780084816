"""Rules for reductions: sums, maxima and minima, and their positions.

A reduction over the rows' axis is a partial value (a sum over the rows is
the sum over ranks of each rank's sum); over other axes the rows stay rows.
A partial value reduced again the same way stays partial.
"""
from tmpi_adapters.graphs.marks import MAX, MIN, MIXED, REPL, SHAPE, SUM, Shard
from tmpi_adapters.graphs.pending import Strict
from tmpi_adapters.graphs.registry import kept, rule, whole


def _kept_axis(axis, reduced):
    """Where axis ``axis`` lands once the axes ``reduced`` are gone."""
    return Shard(axis - sum(1 for a in reduced if a < axis))


def _partial_kind(scalar_op):
    from theano import scalar
    for kind, mark in ((scalar.Add, SUM), (scalar.Maximum, MAX), (scalar.Minimum, MIN)):
        if isinstance(scalar_op, kind):
            return mark
    return None


@rule("CAReduce")
def careduce(rows, node, ins):
    k = ins[0]
    op = node.op
    axes = op.axis if op.axis is not None else tuple(range(node.inputs[0].ndim))
    kind = _partial_kind(op.scalar_op)
    if isinstance(k, Shard):
        if k.axis not in axes:
            return kept(node, [_kept_axis(k.axis, axes)])
        if kind is None:
            return whole(node)
        return kept(node, [kind])
    if k in (SUM, MAX, MIN) and kind == k:
        return kept(node, [k])
    if k == SHAPE:
        return kept(node, [SHAPE])
    return whole(node)


@rule("MaxAndArgmax")
def max_and_argmax(rows, node, ins):
    """The maximum over the rows is a maximum over ranks; its position needs
    the whole rows."""
    k = ins[0]
    axes = node.op.axis if node.op.axis is not None else range(node.inputs[0].ndim)
    if isinstance(k, Shard) and k.axis not in axes:
        kept_axis = _kept_axis(k.axis, axes)
        return kept(node, [kept_axis, kept_axis])
    if isinstance(k, Shard):
        local = rows.apply(node, [rows.local(v) for v in node.inputs])
        try:
            whole_values = rows.apply(node, [rows.replicated(v, node) for v in node.inputs])
        except Strict:
            return [MAX, MIXED], [local[0], None]
        return [MAX, REPL], [local[0], whole_values[1]]
    return whole(node)


@rule("Argmax")
def argmax(rows, node, ins):
    k = ins[0]
    axes = node.op.axis if node.op.axis is not None else range(node.inputs[0].ndim)
    if isinstance(k, Shard) and k.axis not in axes:
        return kept(node, [_kept_axis(k.axis, axes)] * len(node.outputs))
    return whole(node)
