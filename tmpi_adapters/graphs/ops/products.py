"""Rules for products, row-wise ops and convolutions.

A product over the rows (``dot(h.T, delta)``, a convolution's gradient for
its filters) is a partial sum; a product with a whole value keeps the rows.
Row-wise ops (softmax, convolutions, pooling, the catalogue's ``ROW_OPS``)
work on each row of axis 0 alone: their row inputs are cut to the rank's
rows, their other inputs made whole.
"""
import copy

from tmpi_adapters.graphs.catalogue import CONV_GRAD_WEIGHTS, CONVS, ROW_OPS, name_of
from tmpi_adapters.graphs.marks import MIXED, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.registry import KEEP, Signature, kept, rule, whole

_WHOLE = (SAME, REPL, SHAPE)


@rule("Dot")
def dot(rows, node, ins):
    x, y = node.inputs
    mx, my = ins
    cx = x.ndim - 1
    if mx == SUM and my in _WHOLE:
        return Signature([KEEP, REPL], [SUM])
    if my == SUM and mx in _WHOLE:
        return Signature([REPL, KEEP], [SUM])
    rx, ry = isinstance(mx, Shard), isinstance(my, Shard)
    if rx and ry and mx == my.moved(cx) and my.axis == 0:
        return kept(node, [SUM])
    if rx and not ry and mx.axis == cx:
        return Signature([KEEP, mx.moved(0)], [SUM])
    if ry and not rx and my.axis == 0:
        return Signature([my.moved(cx), KEEP], [SUM])
    if rx and not ry:
        return Signature([KEEP, REPL], [mx])
    if ry and not rx:
        return Signature([REPL, KEEP], [my.moved(cx + my.axis - 1)])
    return whole(node, "a product of rows with rows (h hᵀ)")


@rule(*sorted(ROW_OPS))
def row_wise(rows, node, ins):
    """Ops that work on each row of axis 0 alone (softmax, convolutions, pooling)."""
    name = name_of(node.op)
    carry = ROW_OPS[name]
    if name in CONVS and ins[0] == Shard(1) and len(ins) > 1 and ins[1] == Shard(1):
        return conv_weights(rows, node, ins)  # ConvOp on dimshuffled rows: a product
    found = {m for m in ins if isinstance(m, Shard)}
    if len(found) != 1 or found.copy().pop().axis != 0 or \
            any(isinstance(ins[i], Shard) for i in range(len(ins)) if i not in carry):
        return whole(node)
    rows_mark = found.pop()     # (inner or not: each row of axis 0 alone)
    placements = [rows_mark if i in carry else REPL for i in range(len(ins))]
    marks = [rows_mark if getattr(v, "ndim", 0) else MIXED for v in node.outputs]
    return Signature(placements, marks, op=without_batch_size(rows, node))


def without_batch_size(rows, node):
    """The node's op, without the batch size a convolution declares."""
    op = node.op
    imshp = getattr(op, "imshp", None)
    if rows.convs and imshp and imshp[0] is not None and not rows.layout.problem:
        op = copy.copy(op)
        op.imshp = (None,) + tuple(imshp[1:])
    return op


@rule(*sorted(CONV_GRAD_WEIGHTS))
def conv_weights(rows, node, ins):
    """A convolution's gradient for its filters: a product over the rows."""
    name = name_of(node.op)
    if name in CONV_GRAD_WEIGHTS and ins[0] == Shard(0) and ins[1] == Shard(0):
        return Signature([KEEP, KEEP] + [REPL] * (len(ins) - 2), [SUM],
                         op=without_batch_size(rows, node))
    if name in CONVS and ins[0] == Shard(1) and ins[1] == Shard(1) and \
            getattr(node.op, "bsize", None) is None:
        return kept(node, [SUM])
    return whole(node)
