"""Rules for indexing: slices, picks by index, and their updates.

A slice that keeps the rows' axis whole keeps the rows; particular rows
(``h[0]``, ``h[idx]``) mix them.  Rows picked by a per-row index from a
whole table (an embedding) are rows; one entry picked per row
(``p[arange(n), y]``) is rows at the rank's own positions.  A scatter-add of
each rank's rows (an embedding's gradient) is a partial sum.
"""
from tmpi_adapters.graphs.marks import DRAW, PARTIAL, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.patterns import index_text, keeps_rank_rows, shape_entry, \
    window_slice
from tmpi_adapters.graphs.pending import Refusal, Strict
from tmpi_adapters.graphs.registry import KEEP, Signature, kept, rule, whole

_WHOLE = (SAME, REPL, SHAPE)


def _whole_axis(index, k):
    """True when ``index`` takes every entry of axis ``k``."""
    return k >= len(index) or (isinstance(index[k], slice) and
                               (index[k].start, index[k].stop, index[k].step)
                               == (None, None, None))


def _dropped_before(index, k):
    """How many axes before ``k`` the index drops (an integer entry)."""
    return sum(1 for entry in index[:k] if not isinstance(entry, slice))


@rule("Subtensor")
def subtensor(rows, node, ins):
    from theano.tensor.subtensor import get_idx_list
    k = ins[0]
    indices = [REPL] * (len(ins) - 1)
    if keeps_rank_rows(rows, node):
        # A draw made for the whole batch: this rank keeps its own rows.
        return kept(node, [Shard(0)])
    if window_slice(node) is not None:
        # A draw tmpi made for the whole batch, shaped like a value whose length
        # is not this rank's rows (rows gathered, T.tile's): not the one-process draw.
        if not rows.convert:
            raise Strict()
        raise Refusal(node, "a random draw is shaped like a value whose rows are gathered "
                            "across the ranks")
    if k == DRAW:
        raise Refusal(node, "a random draw shaped like the batch's rows, sliced")
    index = get_idx_list(node.inputs, node.op.idx_list)
    if k == SHAPE:
        return kept(node, [SAME if shape_entry(rows, node) is False else SHAPE])
    if k == SUM and all(m in _WHOLE for m in ins[1:]):
        return Signature([KEEP] + indices, [SUM])
    if isinstance(k, Shard):
        if _whole_axis(index, k.axis):
            return Signature([KEEP] + indices, [k.moved(k.axis - _dropped_before(index, k.axis))])
        return whole(node, "particular rows of the batch (%s)" % index_text(index, k.axis))
    return whole(node)


@rule("IncSubtensor")
def inc_subtensor(rows, node, ins):
    from theano.tensor.subtensor import get_idx_list
    x, y = node.inputs[:2]
    mx, my = ins[:2]
    indices = [REPL] * (len(ins) - 2)
    if all(m in _WHOLE for m in ins[2:]):
        if isinstance(mx, Shard):
            index = get_idx_list(node.inputs, node.op.idx_list)
            if _whole_axis(index, mx.axis):
                sub = mx.axis - _dropped_before(index, mx.axis)
                if my == Shard(sub):
                    return Signature([KEEP, KEEP] + indices, [mx])
                if not isinstance(my, Shard) and my not in PARTIAL and \
                        (y.ndim <= sub or y.broadcastable[sub]):
                    return Signature([KEEP, REPL] + indices, [mx])
        if SUM in (mx, my):
            parts = [rows.partial_or_zero(x), rows.partial_or_zero(y)]
            if None not in parts:
                return [SUM], rows.apply(node, parts + [rows.replicated(v, node)
                                                        for v in node.inputs[2:]])
    return whole(node)


@rule("AdvancedSubtensor1")
def advanced_subtensor1(rows, node, ins):
    mx, mi = ins
    if mi == Shard(0) and not isinstance(mx, Shard) and mx not in PARTIAL:
        return Signature([REPL, KEEP], [Shard(0)])
    if isinstance(mx, Shard) and mx.axis > 0 and not isinstance(mi, Shard) and \
            mi not in PARTIAL:
        return Signature([KEEP, REPL], [mx])
    if mx == SUM and mi in _WHOLE:
        return Signature([KEEP, REPL], [SUM])
    return whole(node, "rows picked by index")


@rule("AdvancedIncSubtensor1")
def advanced_inc_subtensor1(rows, node, ins):
    x = node.inputs[0]
    mx, my, mi = ins
    if not node.op.set_instead_of_inc and (mx == SUM or mx is SAME and rows.is_zero(x)):
        if my == Shard(0) and mi == Shard(0):
            # A scatter-add of each rank's rows (an embedding's gradient): partial sums.
            return kept(node, [SUM])
        if my == SUM and mi in _WHOLE:
            return Signature([KEEP, KEEP, REPL], [SUM])
    return whole(node, "rows updated by index")


def _picked(rows, node, ins, first):
    """``x[arange(n), y]`` and its gradient: one entry picked per row, at
    the rank's own positions (the inputs to give the op), else ``None``."""
    arange = node.inputs[first]
    if arange not in rows.positions or ins[0] != Shard(0):
        return None
    others = ins[first + 1:]
    if len(others) != 1 or others[0] != Shard(0) or node.inputs[0].ndim != 2:
        return None
    return [rows.local(v) for v in node.inputs[:first]] + [rows.positions[arange],
                                                           rows.local(node.inputs[-1])]


@rule("AdvancedSubtensor")
def advanced_subtensor(rows, node, ins):
    picked = _picked(rows, node, ins, 1)
    if picked is not None:
        return [Shard(0)], rows.apply(node, picked)
    marks = ins[1:]
    if not isinstance(ins[0], Shard) and ins[0] not in PARTIAL and \
            all(m == Shard(0) or m in _WHOLE for m in marks) and Shard(0) in marks \
            and all(v.ndim <= 1 for v in node.inputs[1:]):
        return Signature([REPL] + [KEEP if m == Shard(0) else REPL for m in marks], [Shard(0)])
    return whole(node, "rows picked by index")


@rule("AdvancedIncSubtensor")
def advanced_inc_subtensor(rows, node, ins):
    picked = _picked(rows, node, ins, 2)
    value = node.inputs[1]
    if picked is not None and (ins[1] == Shard(0) or ins[1] in _WHOLE and value.ndim == 0):
        # One entry per row set or added (to_one_hot, a picked cost's gradient).
        if ins[1] != Shard(0):
            picked[1] = rows.replicated(value, node)
        return [Shard(0)], rows.apply(node, picked)
    return whole(node, "rows updated by index")
