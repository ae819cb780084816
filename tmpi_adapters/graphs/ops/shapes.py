"""Rules for sizes and shapes: ``x.shape``, ``arange(n)``, values of the sizes
alone, reshapes, joins and allocations.

A value computed from the batch's sizes alone (a count of rows, ``ones_like(x)``,
``zeros((n, d))``, the rows' positions) is never gathered: its one-process
value is rebuilt from the global sizes (:func:`rebuilt`), for free.
"""
from tmpi_adapters.graphs.catalogue import name_of
from tmpi_adapters.graphs.marks import PARTIAL, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.patterns import constant, counts_rows, keeps_rank_rows, \
    merged_rows_axis, reads_noise_window, reshaped_axis, shape_entry, split_rows_axis
from tmpi_adapters.graphs.pending import Strict
from tmpi_adapters.graphs.registry import KEEP, Signature, kept, rule, whole


@rule("Shape", "Shape_i", sizes=False)
def shape(rows, node, ins):
    """A value's shape: a size where the value is rows, else the same on every rank."""
    source = ins[0]
    if isinstance(source, Shard):
        if name_of(node.op) == "Shape_i" and node.op.i != source.axis:
            return [SAME], [rows.local(node.inputs[0]).shape[node.op.i]
                            if node.inputs[0] in rows.forms else None]
        return kept(node, [SHAPE])
    # The shape of a partial, whole or drawn value is the same on every rank.
    return kept(node, [SAME])


def sizes_only(rows, node, ins):
    """A node that reads the batch's sizes only: a size (SHAPE), a value
    uniform along the rows (``ones_like(x)``, ``zeros((n, d))``), the rows'
    positions (``arange(n)``), or anything else rebuilt whole.  Such rows are
    made whole without a collective: rebuilt from the global sizes."""
    name = name_of(node.op)
    if name == "Subtensor" and keeps_rank_rows(rows, node):
        return kept(node, [Shard(0)])
    if name == "ARange":
        return arange(rows, node, ins)
    if name == "Subtensor" and ins[0] == SHAPE and shape_entry(rows, node) is False:
        return kept(node, [SAME])
    if any(isinstance(m, Shard) for m in ins):
        # Rows built from sizes, transformed: the ordinary rules, still sized;
        # reduced over the rows, a value of the sizes alone (a count of rows).
        marks, forms = rows.read(node, ins, sized=False)
        for k, (variable, mark) in enumerate(zip(node.outputs, marks)):
            if isinstance(mark, Shard):
                rows.sized.add(variable)
            elif mark in PARTIAL and rows.convert:
                marks[k] = SHAPE
                forms[k] = rows.global_value(variable)
        return marks, forms
    marks = []
    for variable in node.outputs:
        axes = rows.batch_axes(variable)
        if name in ("Alloc", "AllocEmpty"):
            # zeros((x.shape[0], n)): an axis as long as some value's rows.
            dims = node.inputs[1:] if name == "Alloc" else node.inputs
            axes = sorted(set(axes) | {j for j, d in enumerate(dims) if counts_rows(rows, d)})
        if not axes:
            marks.append(SHAPE)
        elif len(axes) == 1 and name in ("Alloc", "AllocEmpty"):
            marks.append(Shard(axes[0]))
            rows.sized.add(variable)
        else:
            marks.append(REPL)
    forms = rows.apply(node, [rows.local(v) for v in node.inputs])
    for k, variable in enumerate(node.outputs):
        if marks[k] == REPL:
            if not rows.convert:
                raise Strict()
            forms[k] = rows.global_value(variable)
    return marks, forms


def arange(rows, node, ins):
    """``arange(start, stop)`` whose length is the rows': rows of the
    one-process ``arange``; its local positions kept for picking rows."""
    start, stop, step = node.inputs
    out = node.outputs[0]
    positions = rows.apply(node, [rows.local(v) for v in node.inputs])[0]
    if (rows.batch_axes(out) == [0] or counts_rows(rows, stop)) and ins[0] is SAME \
            and constant(start) == 0 and constant(step) == 1:
        rows.sized.add(out)
        rows.positions[out] = positions
        if not rows.convert:
            return [Shard(0)], [positions]
        # This rank's rows of the whole arange: offset by the entries before them.
        T = rows.T
        local_stop = rows.local(stop)
        offset = T.cast(rows.window[0], local_stop.dtype) * local_stop // \
            T.cast(rows.window[3], local_stop.dtype)
        return [Shard(0)], [T.arange(offset, local_stop + offset, dtype=out.dtype)]
    if not rows.batch_axes(out):
        return [SHAPE], [positions]
    if not rows.convert:
        raise Strict()
    return [REPL], [rows.global_value(out)]


def rebuilt(rows, variable):
    """The one-process value of ``variable``, computed from the batch's
    sizes: the same expression of the global sizes."""
    node = variable.owner
    name = name_of(node.op)
    T = rows.T
    if reads_noise_window(variable):
        # A count read from the noise window (how many rows a draw is made for)
        # is the whole batch's already, on every rank.
        return rows.local(variable)
    if name in ("Shape", "Shape_i"):
        source = node.inputs[0]
        mark = rows(source)
        local = rows.local(source)
        if not isinstance(mark, Shard):
            result = rows.apply(node, [local])[0]
        elif name == "Shape_i":
            result = rows.global_length(source, node.op.i) if node.op.i == mark.axis \
                else local.shape[node.op.i]
        else:
            result = T.stack([rows.global_length(source, k) if k == mark.axis else
                              T.cast(local.shape[k], "int64") for k in range(local.ndim)])
        return T.cast(result, variable.dtype)
    if name == "ARange" and variable in rows.positions:
        return rows.apply(node, [rows.global_value(v) for v in node.inputs])[0]
    if name == "Elemwise" and type(node.op.scalar_op).__name__ == "Second" and \
            isinstance(rows(node.inputs[0]), Shard) and node.inputs[0] not in rows.sized:
        # b shaped like rows a: only a's global shape is needed, not its values.
        a, b = node.inputs
        axis, local = rows(a).axis, rows.local(a)
        shape = [rows.global_length(a, k) if k == axis else local.shape[k]
                 for k in range(a.ndim)]
        value = rows.global_value(b) if rows(b) == SHAPE else rows.local(b)
        return T.patternbroadcast(T.alloc(T.cast(value, variable.dtype), *shape),
                                  variable.broadcastable)
    inputs = [rows.global_value(v) if rows(v) == SHAPE or v in rows.sized
              else rows.replicated(v) for v in node.inputs]
    return rows.apply(node, inputs)[node.outputs.index(variable)]


@rule("Reshape")
def reshape(rows, node, ins):
    """A reshape keeps the rows where the sizes (or a call, :mod:`..fixedbatch`)
    prove which axis of the new shape holds them, each rank's rows one block."""
    from tmpi_adapters.graphs.fixedbatch import label_of
    k, target_mark = ins[0], ins[1]
    x = node.inputs[0]
    if k == SUM and (target_mark is SAME or target_mark == SHAPE):
        return Signature([KEEP, REPL], [SUM])
    if not isinstance(k, Shard):
        return whole(node)
    if k.inner and target_mark == SHAPE:
        # Rows in windows of an axis: kept only where the reshape splits that
        # axis back into its blocks and the rows (a recurrent layer's (T*b, h)
        # to (T, b, h)).
        split = split_rows_axis(rows, node, k.axis)
        if split is None:
            return whole(node, "a reshape of rows merged with the axes before them")
        return kept(node, [Shard(split)])
    if k.inner:
        return whole(node, "a reshape of rows merged with the axes before them")
    merged = merged_rows_axis(rows, node, k.axis) if target_mark == SHAPE else None
    if merged is not None:
        # (T, b, d) to (T*b, d): each rank's rows of every block (a window).
        return kept(node, [Shard(merged, inner=True)])
    label = label_of(node.outputs[0])
    if label is not None and label in rows.reshapes:
        decided = rows.reshapes[label]     # proven on a call (fixedbatch)
    else:
        decided = reshaped_axis(rows, node, k.axis)
        if decided is None:
            rows.undecided.append(node)
            decided = 0 if rows.probe and rows.convert else None
    if not isinstance(decided, int):
        return whole(node, "a reshape that moves rows across the ranks' shares")
    rewrite = rows.rewrite.get(label)
    if rewrite is not None and rows.local_rows is not None:
        return [Shard(decided)], rows.apply(node, [rows.local(x),
                                                   rewrite.shape(rows.local_rows)])
    target = rows.local(node.inputs[1])
    if target_mark is SAME and rows.convert:
        # A shape every rank holds alike, its row axis the whole batch's (read
        # from a value made whole, or a constant): that axis's length scaled to
        # the rank's share (a length -1 is left to the reshape).
        T = rows.T
        lo, hi, total, _ = rows.window_values()
        length = target[decided]
        share = T.switch(T.lt(length, 0), length,
                         length * T.cast(hi - lo, length.dtype) // T.cast(total, length.dtype))
        target = T.set_subtensor(target[decided], share)
    return [Shard(decided)], rows.apply(node, [rows.local(x), target])


def _constant_axis(axis, ndim):
    """The axis ``axis`` (a constant, maybe negative) of a value of ``ndim``
    axes, or ``None`` for a symbolic axis."""
    from theano.tensor import get_scalar_constant_value
    try:
        along = int(get_scalar_constant_value(axis))
    except Exception:  # noqa: BLE001 - a symbolic axis
        return None
    return along + ndim if along < 0 else along


@rule("Join")
def join(rows, node, ins):
    """Rows joined along another axis stay rows; partial sums joined stay partial."""
    along = _constant_axis(node.inputs[0], node.outputs[0].ndim)
    if ins[0] is not SAME or along is None:
        return whole(node)
    found = {m for m in ins[1:] if isinstance(m, Shard)}
    if len(found) == 1 and along != next(iter(found)).axis:
        k = found.pop()
        return Signature([KEEP] + [k] * (len(ins) - 1), [k])
    if all(m == SUM or m is SAME and rows.is_zero(v) for m, v in zip(ins[1:], node.inputs[1:])):
        return kept(node, [SUM])
    return whole(node, "rows joined with other rows")


@rule("Alloc")
def alloc(rows, node, ins):
    """A partial sum broadcast to a shape stays partial.  Rows broadcast
    along axes of constant lengths stay rows (``T.repeat(h, 2, axis=0)``
    allocates ``h.dimshuffle(0, 'x', 1)`` to ``(n, 2, d)``), their axis as
    long as the rank's rows."""
    value, dims = node.inputs[0], node.inputs[1:]
    if ins[0] == SUM and all(m is SAME or m == SHAPE for m in ins[1:]):
        return Signature([KEEP] + [REPL] * (len(ins) - 1), [SUM])
    if isinstance(ins[0], Shard):
        k = ins[0].axis + len(dims) - value.ndim      # (alloc prepends axes)
        if not value.broadcastable[ins[0].axis] and counts_rows(rows, dims[k]) and \
                all(m is SAME for j, m in enumerate(ins[1:]) if j != k):
            return kept(node, [ins[0].moved(k)])
    return whole(node)


@rule("RepeatOp")
def repeat(rows, node, ins):
    """``T.repeat(h, k, axis)`` with one count ``k`` for every entry: the
    copies of a row lie next to each other, so each rank's rows stay one
    block (``k`` entries per row on the rows' axis); counts per entry mix
    the rows' places."""
    x, repeats = node.inputs
    mark = ins[0]
    if isinstance(mark, Shard) and repeats.ndim == 0 and ins[1] in (SAME, SHAPE) and \
            node.op.axis is not None:
        return Signature([KEEP, REPL], [mark])
    return whole(node, "rows repeated by counts of their own")


@rule("Split")
def split(rows, node, ins):
    """``split(x, sizes, axis)`` (a join's gradient): pieces along another
    axis than the rows' keep the rows; pieces of a partial sum stay partial."""
    k = ins[0]
    along = _constant_axis(node.inputs[1], node.inputs[0].ndim)
    if along is None or not all(m is SAME or m == SHAPE for m in ins[1:]):
        return whole(node)
    if isinstance(k, Shard) and k.axis != along or k == SUM:
        return Signature([KEEP] + [REPL] * (len(ins) - 1), [k] * len(node.outputs))
    return whole(node, "rows split along the rows' axis")
