"""How the sizes of an op's outputs follow from its inputs', for :mod:`.layout`.

Each size is a *symbol* (``(id(input), axis)``: an axis of a data input), an
int, or ``None`` (unknown).  Elementwise ops, dimshuffles, slices, lookups,
reshapes to shapes read from other variables and scans are read here (and
say which symbols are the same axis, through the layout's union-find); any
other op answers through its own ``infer_shape``, given placeholders for its
inputs' sizes.  Theano is imported when these run.
"""
import numpy as np

from tmpi_adapters.graphs.catalogue import ROW_OPS, name_of


def node_sizes(layout, node):
    """The sizes of ``node``'s outputs (a list of tuples), from its inputs'."""
    from theano.scan_module.scan_op import Scan
    from theano.tensor.basic import Reshape
    from theano.tensor.elemwise import DimShuffle, Elemwise
    from theano.tensor.subtensor import (AdvancedSubtensor1, IncSubtensor, Subtensor,
                                         get_idx_list)
    op, sizes = node.op, layout.sizes
    ins = [sizes.get(v, (None,) * (getattr(v, "ndim", 0) or 0)) for v in node.inputs]
    if isinstance(op, Elemwise):
        out = []
        ndim = node.outputs[0].ndim
        for axis in range(ndim):
            found = [shape[axis] for shape, v in zip(ins, node.inputs)
                     if v.ndim == ndim and not v.broadcastable[axis]]
            syms = [s for s in found if isinstance(s, tuple)]
            for other in syms[1:]:
                layout.union(syms[0], other)
            known = syms or [s for s in found if s is not None]
            out.append(known[0] if known else (1 if not found else None))
        return [tuple(out)] * len(node.outputs)
    if isinstance(op, DimShuffle):
        return [tuple(1 if d == "x" else ins[0][d] for d in op.new_order)]
    if isinstance(op, Subtensor):
        index = get_idx_list(node.inputs, op.idx_list)
        # A slice keeps its axis (a slice of the time axis is still time).
        kept = [s for s, i in zip(ins[0], index) if isinstance(i, slice)]
        return [tuple(kept) + tuple(ins[0][len(index):])]
    if isinstance(op, IncSubtensor):
        return [ins[0]]
    if isinstance(op, AdvancedSubtensor1):
        # ``table[idx]``: the table's axis 0 is looked up, not the rows of a batch.
        layout.tables.add(ins[0][0] if ins[0] else None)
        return [(ins[1][0],) + tuple(ins[0][1:])]
    rows = ROW_OPS.get(name_of(op))
    if rows:
        # Row by row: the inputs that hold rows hold the same rows.
        first = [ins[k][0] for k in rows if k < len(ins) and ins[k]
                 and isinstance(ins[k][0], tuple)]
        for other in first[1:]:
            layout.union(first[0], other)
    if type(op).__name__ == "AdvancedSubtensor":
        return _advanced_sizes(layout, node, ins)
    if isinstance(op, Reshape):
        vector = layout.resolve_vector(node.inputs[1])
        if vector is None:
            return None
        out = [_inferred_entry(ins[0], vector) if v == -1 else v for v in vector]
        if out and ins[0] and isinstance(ins[0][0], tuple) and \
                _same_tail(ins[0][1:], out[1:]):
            # (B, 64) to (10, 1, 8, 8): what follows the rows holds as many
            # entries before as after, so axis 0 keeps them, whatever 10 says.
            out[0] = ins[0][0]
        return [tuple(out)]
    if isinstance(op, Scan):
        return _scan_sizes(layout, node, ins)
    if type(op).__name__ == "IfElse":
        # Either branch: of the same sizes (the ones a graph can run with).
        n = op.n_outs
        out = []
        for a, b in zip(ins[1:1 + n], ins[1 + n:1 + 2 * n]):
            for x, y in zip(a, b):
                layout.union(x, y)
            out.append(tuple(a))
        return out
    if name_of(op) == "ARange":
        start, stop, step = node.inputs
        if _constant(start) == 0 and _constant(step) == 1:
            return [(layout.resolve(stop),)]
    return _inferred_sizes(layout, node, ins)


#: Ops that take axes in and give some of them out under no name by reading
#: them: sums and extrema over axes, products that contract an axis, entries
#: looked up by index (a row's label picks its class's score), sizes read.
_REDUCING = {"CAReduce", "Sum", "Prod", "Max", "Min", "MaxAndArgmax", "Argmax", "Dot",
             "AdvancedSubtensor", "AdvancedSubtensor1",
             "Dot22", "Dot22Scalar", "Gemm", "Gemv", "Ger", "BatchedDot", "Shape", "Shape_i",
             "AbstractConv2d_gradWeights", "AbstractConv3d_gradWeights",
             "AbstractConv_gradWeights", "CorrMM_gradWeights",
             # a row's label picks its class's entry: the classes' axis is read
             "CrossentropyCategorical1Hot", "CrossentropySoftmaxArgmax1HotWithBias"}


def reduces_axes(layout, node):
    """True for an op that gives out no axis it reduces (:data:`_REDUCING`),
    and for a reshape to a constant shape that regroups the entries of an
    axis (``support.reshape((3, 3, 6))``): where such an axis goes is read."""
    if any(kind.__name__ in _REDUCING for kind in type(node.op).__mro__):
        return True
    return type(node.op).__name__ == "Reshape" and all(
        isinstance(v, (int, np.integer)) for v in layout.sizes.get(node.outputs[0], (None,)))


def _advanced_sizes(layout, node, ins):
    """``value[i, j]`` with index vectors (``p[arange(n), y]``, a row's own
    label picked): the vectors run together, so their lengths are one axis;
    an index ``arange(n)`` along an axis takes that axis' entries one for one
    (the rows of ``p`` are those of ``y``).  Slices keep their axes."""
    from theano.tensor.type_other import NoneTypeT, SliceType
    value, indices = ins[0], node.inputs[1:]
    vectors, kept, joined = [], [], None
    for axis, (index, size) in enumerate(zip(indices, ins[1:])):
        if isinstance(index.type, SliceType):
            kept.append(value[axis] if axis < len(value) else None)
        elif isinstance(index.type, NoneTypeT) or getattr(index, "ndim", None) != 1:
            return _inferred_sizes(layout, node, ins)
        else:
            vectors.append(size[0])
            owner = index.owner
            if owner is not None and name_of(owner.op) == "ARange" and \
                    _constant(owner.inputs[0]) == 0 and _constant(owner.inputs[2]) == 1 \
                    and axis < len(value):
                vectors.append(value[axis])
            if joined is None:
                joined = len(kept)
    if not vectors:
        return _inferred_sizes(layout, node, ins)
    symbols = [v for v in vectors if isinstance(v, tuple)]
    for other in symbols[1:]:
        layout.union(symbols[0], other)
    known = symbols or [v for v in vectors if v is not None]
    rest = tuple(value[len(indices):])
    out = kept[:joined] + [known[0] if known else None] + kept[joined:]
    return [tuple(out) + rest]


def _same_tail(before, after):
    """True when two runs of sizes, all known integers, hold as many entries."""
    if not all(isinstance(v, (int, np.integer)) and v >= 0 for v in list(before) + list(after)):
        return False
    return int(np.prod(before, dtype=np.int64)) == int(np.prod(after, dtype=np.int64))


def _inferred_entry(before, after):
    """The size Theano gives a reshape's ``-1`` where the sizes show it: the
    one axis of unknown length left once the known lengths cancel
    (``(B, 1)`` to ``(-1,)``: ``B``)."""
    if after.count(-1) != 1 or any(v is None for v in after) or None in before:
        return None
    symbols = [v for v in before if isinstance(v, tuple)]
    known_in = int(np.prod([v for v in before if not isinstance(v, tuple)], dtype=np.int64))
    known_out = int(np.prod([v for v in after if isinstance(v, (int, np.integer)) and v != -1],
                            dtype=np.int64))
    others = [v for v in after if isinstance(v, tuple)]
    left = [v for v in symbols if v not in others]
    if len(left) == 1 and len(symbols) - len(others) == 1 and known_in == known_out:
        return left[0]
    return None


def _scan_sizes(layout, node, ins):
    """A scan's sequences share its time axis; its outputs start with it."""
    info = node.op.info
    n_seqs = info["n_seqs"]
    steps = layout.resolve(node.inputs[0])
    syms = [shape[0] for shape in ins[1:1 + n_seqs] if shape and isinstance(shape[0], tuple)]
    if isinstance(steps, tuple):
        syms.append(steps)
    for other in syms[1:]:
        layout.union(syms[0], other)
    if syms:
        layout.time.add(syms[0])
    time = syms[0] if syms else steps
    n_recurrent = info["n_mit_mot"] + info["n_mit_sot"] + info["n_sit_sot"]
    recurrent = ins[1 + n_seqs:1 + n_seqs + n_recurrent]
    out = []
    for k, variable in enumerate(node.outputs):
        tail = tuple(recurrent[k][1:]) if k < len(recurrent) else (None,) * (variable.ndim - 1)
        out.append(((time,) + tail)[:variable.ndim] if variable.ndim else ())
    return out


def _inferred_sizes(layout, node, ins):
    """Any other op: its ``infer_shape`` on placeholders for its inputs' sizes."""
    import theano.tensor as T
    infer = getattr(node.op, "infer_shape", None)
    if infer is None:
        return None
    placeholders, shapes = {}, []
    for shape in ins:
        entries = []
        for size in shape:
            holder = T.lscalar()
            placeholders[holder] = size
            entries.append(holder)
        shapes.append(tuple(entries))
    result = infer(node, shapes)
    out = []
    for shape in result:
        entries = []
        for expr in shape:
            if expr in placeholders:
                entries.append(placeholders[expr])
            elif hasattr(expr, "owner"):
                size = layout.resolve(expr)
                entries.append(size if size is not None else _constant(expr))
            else:
                entries.append(_constant(expr))
        out.append(tuple(entries))
    return out


def _constant(expr):
    import theano.tensor as T
    if isinstance(expr, (int, np.integer)):
        return int(expr)
    try:
        return int(T.get_scalar_constant_value(expr))
    except Exception:  # noqa: BLE001 - not a constant
        return None
