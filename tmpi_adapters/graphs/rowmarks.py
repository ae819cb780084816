"""The marks of the row analysis (:mod:`.rows`) and what its rules share.

A mark says what a rank's local computation of a value is (see
:mod:`tmpi_adapters.graphs.rows`); the helpers here read small patterns of a
graph (zeros, a shape's entry, a row count, a draw's window, a reshape's rows
from the sizes).  Theano is imported when they run.
"""
import itertools

import numpy as np

SAME = None
SHAPE = "shape"
MIXED = "mixed"
REPL = "repl"
DRAW = "draw"
SUM, MAX, MIN = "+sum", "+max", "+min"
PARTIAL = (SUM, MAX, MIN)

# The op catalogue, read here by the rules (one table for every part of graphs/).
from tmpi_adapters.graphs.catalogue import (  # noqa: E402,F401 - re-exported for the rules
    BATCH_NORMS, CONV_GRAD_INPUTS, CONV_GRAD_WEIGHTS, CONVS, IDENTITIES, ROW_OPS, name_of)

#: The shared variable whose values say which rows of a draw made for the
#: whole batch a rank keeps (:mod:`tmpi_adapters.frameworks.random_streams`).
NOISE_WINDOW = "tmpi_noise_window"
#: The shared int64 vector ``[lo, hi, max(N, 1), max(hi - lo, 1)]``: this rank's
#: rows of a global batch of ``N`` rows (set before every split call).
ROWS_WINDOW = "tmpi_rows_window"

_pending_ids = itertools.count()


class Request:
    """A value made whole by a collective (a :class:`Pending` node's output).

    ``kind``: ``"sum"``, ``"max"``, ``"min"`` or ``"gather"`` (``axis``: the
    rows' axis); ``source``: the original variable; ``gradient``: the index
    of the gradient whose exchanged part this is, else ``None``.
    """

    def __init__(self, kind, axis, source, output, gradient=None):
        self.kind, self.axis, self.source, self.output = kind, axis, source, output
        self.gradient = gradient
        #: the :class:`Coupling` it makes whole (``None`` for a gradient)
        self.coupling = None


def pending_op():
    """The :class:`Pending` Op class (made when Theano is imported)."""
    global Pending
    if Pending is not None:
        return Pending
    from theano.gof import Apply, Op

    class _Pending(Op):
        """A value to be made whole across ranks: replaced by a collective
        (:mod:`tmpi_adapters.core.coupling`) before the function is compiled."""

        __props__ = ("kind", "axis", "ident")

        def __init__(self, kind, axis=None):
            self.kind, self.axis, self.ident = kind, axis, next(_pending_ids)

        def make_node(self, value):
            return Apply(self, [value], [value.type()])

        def perform(self, node, inputs, output_storage):
            raise AssertionError("a pending collective was compiled unreplaced")

        def do_constant_folding(self, node):
            return False
    Pending = _Pending
    return Pending


Pending = None


def is_pending(variable):
    return variable.owner is not None and Pending is not None and \
        isinstance(variable.owner.op, Pending)


class Coupling:
    """One place where rows meet and what the converted graph does there.

    Attributes
    ----------
    kind : str
        ``"sum"``, ``"max"``, ``"min"`` (a cross-rank reduction) or
        ``"gather"`` (the rows made whole).
    what : str
        The expression, as the script wrote it ("a sum over the rows (Sum)").
    where : str
        ``file:line`` of the script's line that made it, or ``""``.
    """

    def __init__(self, kind, what, where):
        self.kind, self.what, self.where = kind, what, where

    def describe(self):
        return "%s%s" % (self.what, " (%s)" % self.where if self.where else "")


class Refusal(Exception):
    """Rows meet where no conversion makes the one-process value (a random
    draw shaped like the batch that is not made for the whole batch)."""

    def __init__(self, node, why):
        super().__init__(why)
        self.node, self.why = node, why


class _Strict(Exception):
    """A conversion the strict reading does not make."""


def _like(form, variable):
    """``form`` with ``variable``'s broadcastable pattern and dtype."""
    import theano.tensor as T
    if form.dtype != variable.dtype:
        form = T.cast(form, variable.dtype)
    if hasattr(variable.type, "broadcastable") and \
            form.broadcastable != variable.broadcastable:
        form = T.patternbroadcast(form, variable.broadcastable)
    return form


def _constant(variable):
    from theano.gof import Constant
    if isinstance(variable, Constant):
        try:
            return int(np.asarray(variable.data))
        except (TypeError, ValueError):
            return None
    return None


def _zero(variable):
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


def _linear(rows, node, ins):
    """The partial kind of an elementwise node that is linear in its partial
    inputs (their sum over ranks gives the one-process value), or ``None``."""
    from theano import scalar
    op = node.op.scalar_op
    partial = [m for m in ins if m in PARTIAL]
    kinds = set(partial)
    others = [(m, v) for m, v in zip(ins, node.inputs) if m not in PARTIAL]
    if kinds == {SUM}:
        if isinstance(op, (scalar.Add, scalar.Sub)):
            if all(rows._is_zero(v) for _, v in others):
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
            return MIN if kind == MAX else MAX
    return None


def _shape_entry(rows, node):
    """For ``shape(x)[j]`` (through casts): ``True`` when entry ``j`` is the
    batch's length, ``False`` when it is another axis', ``None`` unknown."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    from theano.tensor.subtensor import get_idx_list
    index = get_idx_list(node.inputs, node.op.idx_list)
    if len(index) != 1 or isinstance(index[0], slice):
        return None
    j = _constant(index[0]) if hasattr(index[0], "owner") else index[0]
    if not isinstance(j, (int, np.integer)):
        return None
    vector = node.inputs[0]
    while vector.owner is not None and isinstance(vector.owner.op, Elemwise) and \
            isinstance(vector.owner.op.scalar_op, (scalar.Cast, scalar.Identity)):
        vector = vector.owner.inputs[0]
    if vector.owner is None or name_of(vector.owner.op) != "Shape":
        return None
    source = vector.owner.inputs[0]
    axis = rows(source)
    if not isinstance(axis, int):
        return None
    return int(j) % max(source.ndim, 1) == axis


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
    if length is None:
        return False
    return rows.layout.is_batch_size(rows.layout.resolve(length)) or _counts_rows(rows, length)


def _counts_rows(rows, length):
    """True for ``v.shape[k]`` (through casts) of a value ``v`` whose rows are on axis ``k``."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    for _ in range(10):
        length = _uncast(length)
        node = getattr(length, "owner", None)
        if node is None:
            return False
        name = name_of(node.op)
        if name == "Shape_i":
            return rows(node.inputs[0]) == node.op.i
        if name == "Subtensor":
            return _shape_entry(rows, node) is True
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op,
                                                        (scalar.Cast, scalar.Identity)):
            length = node.inputs[0]
            continue
        return False
    return False


def _uncast(variable):
    """``variable`` without the scalar/tensor conversions Theano puts around indices."""
    while getattr(variable, "owner", None) is not None and type(variable.owner.op).__name__ in (
            "ScalarFromTensor", "TensorFromScalar"):
        variable = variable.owner.inputs[0]
    return variable


def _is_random(node):
    name = type(node.op).__name__.lower()
    return "rand" in name or "mrg" in name


def _reshaped_axis(rows, node, k):
    """The axis of a reshape's output that holds its input's rows (axis
    ``k``), where the sizes show it; :data:`MIXED` where they show that no
    axis does; ``None`` where they do not tell."""
    layout = rows.layout
    source = node.inputs[0]
    before = layout.sizes.get(source, ())
    after = layout.resolve_vector(node.inputs[1])
    if after is None or k >= len(before):
        return None
    head = before[:k]
    # The rows (axis k, proven) land on an axis as long as the batch, with the
    # same axes before them: each rank's rows are the same block of the
    # flattened value on both sides.
    for j, size in enumerate(after):
        if isinstance(size, tuple) and layout.is_batch_size(size):
            if list(after[:j]) == list(head) and all(s is not None and s != -1 for s in head):
                return j
    # (-1, *tail): the rows (and the axes after them up to the tail) merged in axis 0.
    if k == 0 and after and after[0] == -1 and len(after) >= 1:
        tail = list(after[1:])
        if not tail or (len(tail) <= len(before) - 1 and list(before[len(before) - len(tail):])
                        == tail and all(s is not None for s in tail)):
            return 0
    return None


def _made_at(node):
    from tmpi_adapters.graphs.fixedbatch import made_at
    if node is None:
        return ""
    for variable in node.outputs:
        at = made_at(variable)
        if at:
            return at
    return ""


_KIND_WORDS = {"sum": "a sum over the batch's rows", "max": "a maximum over the batch's rows",
               "min": "a minimum over the batch's rows", "gather": "the batch's rows gathered",
               "same": "a whole value"}


def _what(kind, node, what, variable):
    """The words for a coupling: what is made whole and, where known, why."""
    text = _KIND_WORDS[kind]
    return text + " for %s" % what if what else text


def _index_text(index, k):
    entry = index[k]
    if isinstance(entry, slice):
        return "a slice of the rows"
    return "one row"
