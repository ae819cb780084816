"""Which values of a graph hold one entry per example, and along which axis.

A value is *row-wise* along axis ``k`` when each of its slices along ``k``
is computed from the same example's slice of the inputs only: predictions,
per-example losses, a network's activations.  Row-wise values split across
ranks like their inputs and are gathered back in rank order; reductions of
them over the batch (sums, means, maxima) combine as
:mod:`tmpi_adapters.graphs.outputs` says.  Everything else that depends on the
batch (a value normalised by the batch's own statistics, a slice across
examples, a scan's states) is *mixed*: it cannot be computed from parts.

:class:`RowWise` marks every variable of a :class:`~tmpi_adapters.graphs.layout.Layout`'s
graph once, when a function is compiled:

``int``
    row-wise along that axis;
:data:`SAME`
    computed without the batch (parameters, constants);
:data:`SHAPE`
    computed from the batch's sizes only (``x.shape[0]``, ``ones_like(x)``'s
    shape), not from its values;
:data:`MIXED`
    anything else computed from the batch.

Ops it does not know are mixed: a wrong "row-wise" would be silent, a wrong
"mixed" only means a function is not split.
"""
SAME = None
SHAPE = "shape"
MIXED = "mixed"

#: Ops (by class name) that work on each row of their inputs' axis 0 alone.
_ROW_OPS = {"Softmax", "SoftmaxWithBias", "LogSoftmax", "CrossentropyCategorical1Hot",
            "CrossentropySoftmaxArgmax1HotWithBias", "Prepend_scalar_constant_to_each_row",
            "Prepend_scalar_to_each_row", "AbstractConv2d", "AbstractConv3d", "ConvOp",
            "Pool", "DownsampleFactorMax", "CorrMM", "Corr3dMM"}


class RowWise:
    """Row-wise marks of every variable of ``layout``'s graph (see module doc).

    Calling it with a variable returns the variable's mark.
    """

    def __init__(self, layout):
        self.layout = layout
        self.marks = {}
        for variable in layout.data:
            axis = layout.axis(variable)
            self.marks[variable] = SAME if axis is None else axis
        for node in layout.nodes:
            ins = [self.marks.get(v, SAME) for v in node.inputs]
            try:
                outs = _node_marks(self, node, ins)
            except Exception:  # noqa: BLE001 - an op we cannot read is mixed
                outs = [MIXED] * len(node.outputs)
            for variable, mark in zip(node.outputs, outs):
                self.marks.setdefault(variable, mark)

    def __call__(self, variable):
        return self.marks.get(variable, SAME if variable.owner is None else MIXED)

    def batch_axes(self, variable):
        """The axes of ``variable`` whose length is the batch's."""
        sizes = self.layout.sizes.get(variable, ())
        return [k for k, s in enumerate(sizes) if self.layout.is_batch_size(s)]


def _sizes_only(rows, node):
    """Marks of a node whose inputs carry no values of the batch, only its sizes."""
    marks = []
    for variable in node.outputs:
        axes = rows.batch_axes(variable)
        marks.append(axes[0] if len(axes) == 1 else (SHAPE if not axes else MIXED))
    return marks


def _node_marks(rows, node, ins):
    from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise
    op = node.op
    n = len(node.outputs)
    if all(m is SAME for m in ins):
        return [SAME] * n
    name = type(op).__name__
    if all(m is SAME or m == SHAPE for m in ins):
        if name == "Subtensor" and _keeps_rank_rows(rows, node):
            return [0]
        return _sizes_only(rows, node)
    if name in ("Shape", "Shape_i"):
        return [SHAPE] * n
    if name == "AdvancedSubtensor":
        return [_picked_rows(rows, node, ins)]
    if name in ("Reshape",):
        if ins[0] == 0 and rows.layout.is_batch_size(rows.layout.size_of(node.outputs[0], 0)):
            return [0]
        return [MIXED]
    # A length of axes that are not split (``x.shape[1]`` in ``T.mean(v,
    # axis=1)``) is the same on every rank and in the one process.
    ins = [SAME if m == SHAPE and _unsplit_size(rows, v) else m for m, v in zip(ins, node.inputs)]
    if any(m == MIXED or m == SHAPE for m in ins):
        return [MIXED] * n
    axes = {m for m in ins if m is not SAME}
    if isinstance(op, Elemwise):
        if len(axes) != 1:
            return [MIXED] * n
        k = axes.pop()
        if any(m is not SAME and v.broadcastable[k] for m, v in zip(ins, node.inputs)):
            return [MIXED] * n
        return [k] * n
    if isinstance(op, DimShuffle):
        k = ins[0]
        return [op.new_order.index(k) if k in op.new_order else MIXED]
    if isinstance(op, CAReduce) or name in ("MaxAndArgmax", "Argmax"):
        k = ins[0]
        reduced = getattr(op, "axis", None)
        if reduced is None or k in reduced:
            return [MIXED] * n
        return [k - sum(1 for a in reduced if a < k)] * n
    if name == "Subtensor":
        return [_sliced_rows(node, ins)]
    if name == "AdvancedSubtensor1":
        return [0 if ins[0] is SAME and ins[1] == 0 else MIXED]
    if name == "Dot":
        x, y = node.inputs
        if ins[1] is SAME and ins[0] == 0 and x.ndim == 2:
            return [0]
        if ins[0] is SAME and ins[1] == 1 and y.ndim == 2:
            return [x.ndim - 1]
        return [MIXED]
    if name in ("Rebroadcast", "SpecifyShape", "ViewOp", "DeepCopyOp", "OutputGuard"):
        return [ins[0]]
    if name == "Join":
        return [_joined_rows(node, ins)]
    if name in _ROW_OPS:
        if axes != {0}:
            return [MIXED] * n
        return [0 if v.ndim else MIXED for v in node.outputs]
    return [MIXED] * n


def _unsplit_size(rows, variable):
    """True when ``variable`` is a product of known lengths, none the batch's."""
    factors = rows.layout.factors(variable)
    return factors is not None and all(
        f is not None and not rows.layout.is_batch_size(f) for f in factors)


#: The shared variable whose values say which rows of a draw made for the
#: whole batch a rank keeps (:mod:`tmpi_adapters.frameworks.random_streams`).
NOISE_WINDOW = "tmpi_noise_window"


def _keeps_rank_rows(rows, node):
    """``draw[s:s + n]``, ``n`` the rank's rows and ``s`` read from the
    :data:`NOISE_WINDOW`, of a value computed without the batch's values: a
    random draw made for the whole batch of which each rank keeps its own
    rows, so that row ``i`` is the one-process row ``i``'s.  (A script's own
    ``pool[i:i + n]`` would give every rank the same rows: not per row.)"""
    from theano.gof.graph import inputs
    from theano.tensor.subtensor import get_idx_list
    index = get_idx_list(node.inputs, node.op.idx_list)
    if not index or not isinstance(index[0], slice) or index[0].step is not None:
        return False
    start, stop = _uncast(index[0].start), _uncast(index[0].stop)
    owner = getattr(stop, "owner", None)
    if start is None or owner is None or type(owner.op).__name__ != "Elemwise" \
            or type(owner.op.scalar_op).__name__ != "Add" or len(owner.inputs) != 2 \
            or not any(getattr(v, "name", None) == NOISE_WINDOW for v in inputs([start])):
        return False
    first, second = owner.inputs
    length = second if first is start else (first if second is start else None)
    return length is not None and rows.layout.is_batch_size(rows.layout.resolve(length))


def _uncast(variable):
    """``variable`` without the scalar/tensor conversions Theano puts around indices."""
    while getattr(variable, "owner", None) is not None and type(variable.owner.op).__name__ in (
            "ScalarFromTensor", "TensorFromScalar"):
        variable = variable.owner.inputs[0]
    return variable


def _sliced_rows(node, ins):
    """``x[...]``: row-wise when the batch axis is kept whole by non-batch indices."""
    from theano.tensor.subtensor import get_idx_list
    if any(m is not SAME for m in ins[1:]):
        return MIXED
    k = ins[0]
    index = get_idx_list(node.inputs, node.op.idx_list)
    if k < len(index):
        entry = index[k]
        if not isinstance(entry, slice) or (entry.start, entry.stop, entry.step) != \
                (None, None, None):
            return MIXED
    dropped = sum(1 for entry in index[:k] if not isinstance(entry, slice))
    return k - dropped


def _joined_rows(node, ins):
    from theano.tensor import get_scalar_constant_value
    axes = {m for m in ins[1:] if m is not SAME}
    if ins[0] is not SAME or len(axes) != 1 or any(m is SAME for m in ins[1:]):
        return MIXED
    k = axes.pop()
    try:
        along = int(get_scalar_constant_value(node.inputs[0]))
    except Exception:  # noqa: BLE001 - a symbolic axis
        return MIXED
    if along < 0:
        along += node.outputs[0].ndim
    return MIXED if along == k else k


def _picked_rows(rows, node, ins):
    """``x[arange(n), y]`` (one entry per row, the DLT's log-likelihood idiom)."""
    from theano.gof import Constant
    from theano.tensor.basic import ARange
    if len(node.inputs) != 3 or ins[0] != 0 or node.inputs[0].ndim != 2:
        return MIXED
    first, second = node.inputs[1], node.inputs[2]
    owner = first.owner
    if owner is None or not isinstance(owner.op, ARange):
        return MIXED
    start, stop, step = owner.inputs
    constant = [isinstance(v, Constant) and int(v.data) == want
                for v, want in ((start, 0), (step, 1))]
    if not all(constant) or not rows.layout.is_batch_size(rows.layout.resolve(stop)):
        return MIXED
    if ins[2] != 0 or second.ndim != 1:
        return MIXED
    return 0
