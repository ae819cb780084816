"""Rules for elementwise ops, dimshuffles and identities.

An elementwise op keeps the rows of its inputs on their axis (a whole input
as long as the batch is cut to the rank's rows, a broadcast one made whole);
on partial sums it stays partial where it is linear in them
(:func:`~..patterns.linear_kind`).
"""
from tmpi_adapters.graphs.catalogue import IDENTITIES, name_of
from tmpi_adapters.graphs.marks import PARTIAL, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.patterns import like, linear_kind
from tmpi_adapters.graphs.registry import KEEP, Signature, kept, rule, whole


@rule(*sorted(IDENTITIES | {"ViewOp"}))
def identity(rows, node, ins):
    """The value passes through.  (A ViewOp is an identity by Theano's
    contract: its subclasses too, a gradient reversal's or a user's marker.)
    A shape declared for the whole batch, or a check of local sizes, is not a
    rank's share's: it is dropped."""
    name = name_of(node.op)
    if name == "SpecifyShape" and isinstance(ins[0], Shard) or name == "Assert":
        return [ins[0]], [rows.local(node.inputs[0])]
    return kept(node, [ins[0]])


@rule("Elemwise")
def elemwise(rows, node, ins):
    from theano import scalar
    op = node.op.scalar_op
    out = node.outputs[0]
    if isinstance(op, scalar.Second):
        return fill(rows, node, ins)
    found = {m for m in ins if isinstance(m, Shard)}
    if len(found) > 1:
        return whole(node, "values with rows on different axes")
    if found:
        k = found.pop()
        placements = []
        for m, v in zip(ins, node.inputs):
            if m == k:
                placements.append(KEEP)
            elif v.ndim == out.ndim and not v.broadcastable[k.axis]:
                placements.append(k)        # as long as the batch, whole: cut
            else:
                placements.append(REPL)
        return Signature(placements, [k] * len(node.outputs))
    if any(m in PARTIAL for m in ins):
        kind = linear_kind(rows, node, ins)
        if kind is not None:
            return Signature([KEEP if m in PARTIAL or rows.is_zero(v) else REPL
                              for m, v in zip(ins, node.inputs)], [kind] * len(node.outputs))
    if all(m is SAME or m == SHAPE for m in ins):
        return kept(node, [SHAPE] * len(node.outputs))
    return whole(node)


def fill(rows, node, ins):
    """``second(a, b)``: ``b`` shaped like ``a``; only ``a``'s shape counts."""
    shape, value = ins
    a, b = node.inputs
    if isinstance(shape, Shard):
        k = shape.axis
        if (value is SAME or value == SHAPE) and (b.ndim < a.ndim or b.broadcastable[k]):
            # Ones (zeros, a size) shaped like the rows: read from sizes only, so its
            # whole value is rebuilt from the global sizes (sum(ones_like(x)) counts rows).
            rows.sized.add(node.outputs[0])
            return Signature([KEEP, REPL], [shape])
        if isinstance(value, Shard) and value != shape:
            return whole(node)
        if value == shape:
            return kept(node, [shape])
        if b.ndim == a.ndim and not b.broadcastable[k] and value is not SAME:
            return Signature([KEEP, shape], [shape])
        return Signature([KEEP, REPL], [shape])
    # The shape of a partial, whole or size value is the same on every rank.
    if value is SAME and a.ndim == 0:
        # (fill(cost, 1), the seed of every gradient: nothing waits for the cost.)
        return [SAME], [like(rows.T.as_tensor_variable(rows.local(b)), node.outputs[0])]
    if value is SAME or value == SUM or value == SHAPE:
        return kept(node, [value])
    if isinstance(value, Shard):
        return whole(node)
    return Signature([KEEP, REPL], [REPL])


@rule("DimShuffle")
def dimshuffle(rows, node, ins):
    """Rows follow their axis to its new place; an axis dropped is not the rows'."""
    k = ins[0]
    if isinstance(k, Shard):
        if k.axis not in node.op.new_order:
            return whole(node)
        return kept(node, [k.moved(node.op.new_order.index(k.axis))])
    return kept(node, [k])
