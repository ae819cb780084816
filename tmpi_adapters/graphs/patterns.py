"""Small patterns of a graph that the row rules read.

Zeros (``zeros_like``, ``alloc(0)``), a shape's entry, a row count, a draw
kept per rank through the noise window, a reshape's rows from the sizes, an
elementwise node linear in its partial inputs.  Each answers from the marks
the analysis (:mod:`.rows`) has given so far.  Theano is imported when they run.
"""
import numpy as np

from tmpi_adapters.graphs.catalogue import name_of
from tmpi_adapters.graphs.marks import NOISE_WINDOW, PARTIAL, REPL, SAME, SHAPE, SUM, Shard


def like(form, variable):
    """``form`` with ``variable``'s broadcastable pattern and dtype."""
    import theano.tensor as T
    if form.dtype != variable.dtype:
        form = T.cast(form, variable.dtype)
    if hasattr(variable.type, "broadcastable") and \
            form.broadcastable != variable.broadcastable:
        form = T.patternbroadcast(form, variable.broadcastable)
    return form


def constant(variable):
    from theano.gof import Constant
    if isinstance(variable, Constant):
        try:
            return int(np.asarray(variable.data))
        except (TypeError, ValueError):
            return None
    return None


def zero(variable):
    """True for ``zeros_like(x)``, ``alloc(0, ...)``, a constant 0, through
    dimshuffles and casts."""
    from theano.gof import Constant
    from theano import scalar
    from theano.tensor.elemwise import DimShuffle, Elemwise
    for _ in range(20):
        if isinstance(variable, Constant):
            try:
                return not np.any(np.asarray(variable.data))
            except (TypeError, ValueError):
                return False
        node = variable.owner
        if node is None:
            return False
        op = node.op
        name = type(op).__name__
        if isinstance(op, Elemwise) and isinstance(op.scalar_op, scalar.Second):
            variable = node.inputs[1]
        elif isinstance(op, DimShuffle) or name in ("Alloc", "Rebroadcast") or (
                isinstance(op, Elemwise) and isinstance(op.scalar_op,
                                                         (scalar.Cast, scalar.Identity))):
            variable = node.inputs[0]
        else:
            return False
    return False


def linear_kind(rows, node, ins):
    """The partial kind of an elementwise node that is linear in its partial
    inputs (their sum over ranks gives the one-process value), or ``None``."""
    from theano import scalar
    op = node.op.scalar_op
    partial = [m for m in ins if m in PARTIAL]
    kinds = set(partial)
    others = [(m, v) for m, v in zip(ins, node.inputs) if m not in PARTIAL]
    if kinds == {SUM}:
        if isinstance(op, (scalar.Add, scalar.Sub)):
            if all(rows.is_zero(v) for _, v in others):
                return SUM
            return None
        if isinstance(op, (scalar.Neg, scalar.Identity)):
            return SUM
        if isinstance(op, scalar.Cast):
            return SUM if node.outputs[0].dtype.startswith("float") else None
        if isinstance(op, (scalar.Mul, scalar.TrueDiv)) and len(partial) == 1 and \
                (isinstance(op, scalar.Mul) or ins[0] == SUM):
            if not all(m is SAME or m in (REPL, SHAPE) for m, _ in others):
                return None
            # Scaled by a value that waits for a collective the partial sum does not
            # (BatchNorm's backward: g_var * mean(x - mu)): the sum is made whole in
            # the same level instead, not in one more after it.
            mine = max(rows.level(v) for m, v in zip(ins, node.inputs) if m in PARTIAL)
            if any(rows.level(v) > mine for _, v in others):
                return None
            return SUM
        return None
    if len(kinds) == 1 and len(partial) == 1 and not others:
        kind = partial[0]
        if isinstance(op, (scalar.Identity, scalar.Cast)):
            return kind
        if isinstance(op, scalar.Neg):
            return kind.negated()
    return None


def shape_entry(rows, node):
    """For ``shape(x)[j]`` (through casts): ``True`` when entry ``j`` is the
    batch's length, ``False`` when it is another axis', ``None`` unknown."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    from theano.tensor.subtensor import get_idx_list
    index = get_idx_list(node.inputs, node.op.idx_list)
    if len(index) != 1 or isinstance(index[0], slice):
        return None
    j = constant(index[0]) if hasattr(index[0], "owner") else index[0]
    if not isinstance(j, (int, np.integer)):
        return None
    vector = node.inputs[0]
    while vector.owner is not None and isinstance(vector.owner.op, Elemwise) and \
            isinstance(vector.owner.op.scalar_op, (scalar.Cast, scalar.Identity)):
        vector = vector.owner.inputs[0]
    if vector.owner is None or name_of(vector.owner.op) != "Shape":
        return None
    source = vector.owner.inputs[0]
    mark = rows(source)
    if not isinstance(mark, Shard):
        return None
    return int(j) % max(source.ndim, 1) == mark.axis


def window_slice(node):
    """The kept length ``n`` of a Subtensor ``draw[s:s + n]`` whose start
    ``s`` reads the :data:`NOISE_WINDOW` (how tmpi keeps a rank's entries of
    a draw made for the whole batch), else ``None``."""
    from theano.gof.graph import inputs
    from theano.tensor.subtensor import get_idx_list
    index = get_idx_list(node.inputs, node.op.idx_list)
    if not index or not isinstance(index[0], slice) or index[0].step is not None:
        return None
    start, stop = uncast(index[0].start), uncast(index[0].stop)
    owner = getattr(stop, "owner", None)
    if start is None or owner is None or type(owner.op).__name__ != "Elemwise" \
            or type(owner.op.scalar_op).__name__ != "Add" or len(owner.inputs) != 2 \
            or not any(getattr(v, "name", None) == NOISE_WINDOW for v in inputs([start])):
        return None
    first, second = owner.inputs
    return second if first is start else (first if second is start else None)


def keeps_rank_rows(rows, node):
    """``draw[s:s + n]`` (:func:`window_slice`), ``n`` the rank's rows, of a
    value computed without the batch's values: a random draw made for the
    whole batch of which each rank keeps its own rows, so that row ``i`` is
    the one-process row ``i``'s.  (A script's own ``pool[i:i + n]`` would
    give every rank the same rows: not per row.)"""
    length = window_slice(node)
    if length is None:
        return False
    return rows.layout.is_batch_size(rows.layout.resolve(length)) or counts_rows(rows, length)


def counts_rows(rows, length):
    """True for ``v.shape[k]`` (through casts) of a value ``v`` whose rows are on axis ``k``."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    for _ in range(10):
        length = uncast(length)
        node = getattr(length, "owner", None)
        if node is None:
            return False
        name = name_of(node.op)
        if name == "Shape_i":
            return rows(node.inputs[0]) == Shard(node.op.i)
        if name == "Subtensor":
            return shape_entry(rows, node) is True
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op,
                                                        (scalar.Cast, scalar.Identity)):
            length = node.inputs[0]
            continue
        return False
    return False


def uncast(variable):
    """``variable`` without the scalar/tensor conversions Theano puts around indices."""
    while getattr(variable, "owner", None) is not None and type(variable.owner.op).__name__ in (
            "ScalarFromTensor", "TensorFromScalar"):
        variable = variable.owner.inputs[0]
    return variable


def reshaped_axis(rows, node, k):
    """The axis of a reshape's output that holds its input's rows (axis
    ``k``), where the sizes show it; :data:`MIXED` where they show that no
    axis does; ``None`` where they do not tell."""
    layout = rows.layout
    source = node.inputs[0]
    before = list(layout.sizes.get(source, ()))
    after = layout.resolve_vector(node.inputs[1])
    if after is None or k >= len(before):
        return None
    if 1 in before or 1 in after:
        # Axes of length 1 move no entry: read the reshape without them
        # (T.tile's (1, n, d, 1) to (n, d)).
        kept_before = [j for j, size in enumerate(before) if size != 1]
        kept_after = [j for j, size in enumerate(after) if size != 1]
        if k not in kept_before:
            return None
        found = _reshaped_axis([before[j] for j in kept_before],
                               [after[j] for j in kept_after], kept_before.index(k), layout)
        return None if found is None else kept_after[found]
    return _reshaped_axis(before, list(after), k, layout)


def _reshaped_axis(before, after, k, layout):
    """:func:`reshaped_axis` on the sizes ``before`` and ``after``."""
    if k >= len(before):
        return None
    head = before[:k]
    # The rows (axis k, proven) land on an axis as long as the batch, with the
    # same axes before them: each rank's rows are the same block of the
    # flattened value on both sides.
    for j, size in enumerate(after):
        if isinstance(size, tuple) and layout.is_batch_size(size):
            if list(after[:j]) == list(head) and all(s is not None and s != -1 for s in head):
                return j
    # (*head, -1 or unknown, *tail): the rows and the axes after them up to the
    # tail merged in axis k (T.repeat(h, 2, axis=0)'s (n, 2, d) -> (2n, d)); a
    # reshape keeps the size, so the unknown entry is that product.
    if k < len(after) and after[k] in (-1, None) and list(after[:k]) == list(head) and \
            all(s is not None and s != -1 for s in head):
        tail = list(after[k + 1:])
        if not tail or (len(tail) <= len(before) - k - 1 and
                        list(before[len(before) - len(tail):]) == tail and
                        all(s is not None and s != -1 for s in tail)):
            return k
    return None


def index_text(index, k):
    entry = index[k]
    if isinstance(entry, slice):
        return "a slice of the rows"
    return "one row"


def reads_noise_window(variable):
    """True when ``variable`` is computed from the noise window's values (a
    shape read on the way, ``x.shape`` or ``second(x, v)``'s ``x``, is a
    size, not a value: not followed)."""
    seen, stack = set(), [variable]
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        if getattr(value, "name", None) == NOISE_WINDOW:
            return True
        node = value.owner
        if node is None or name_of(node.op) in ("Shape", "Shape_i"):
            continue
        if name_of(node.op) == "Elemwise" and type(node.op.scalar_op).__name__ == "Second":
            stack.append(node.inputs[1])
        else:
            stack.extend(node.inputs)
    return False


def merged_rows_axis(rows, node, k):
    """0 where reshape ``node`` merges its input's rows (axis ``k`` > 0)
    with every axis before them, the rows innermost, and keeps the axes after
    them (``(T, B, d)`` to ``(T*B, d)``): the rows are then the inner factor
    of axis 0.  Else ``None``."""
    layout = rows.layout
    before = list(layout.sizes.get(node.inputs[0], ()))
    after = layout.resolve_vector(node.inputs[1])
    if after is None or k == 0 or k >= len(before) or len(after) != len(before) - k:
        return None
    tail = list(after[1:])
    if before[k + 1:] != tail or any(s is None or s == -1 for s in tail):
        return None
    return 0


def split_rows_axis(rows, node, k):
    """Where reshape ``node`` splits axis ``k`` of its input, whose rows are
    its inner factor, into outer axes and the rows, keeping the axes before
    and after (``(T*B, d)`` to ``(T, B, d)``): the axis of the output that
    holds the rows.  Else ``None``."""
    layout = rows.layout
    before = list(layout.sizes.get(node.inputs[0], ()))
    after = layout.resolve_vector(node.inputs[1])
    if after is None or k >= len(before):
        return None
    head, tail = before[:k], before[k + 1:]
    if list(after[:k]) != head or any(s is None or s == -1 for s in head + tail):
        return None
    for m in range(k + 1, len(after)):
        if isinstance(after[m], tuple) and layout.is_batch_size(after[m]) and \
                list(after[m + 1:]) == tail:
            return m
    return None
