"""Rules for reductions: sums, maxima and minima, and their positions.

A reduction over the rows' axis is a partial value (a sum over the rows is
the sum over ranks of each rank's sum); over other axes the rows stay rows.
A partial value reduced again the same way stays partial.

A sum of squares about a centre made whole in the step (``sum((h - mean)**2)``,
a variance, BatchNorm's) would wait for that centre's collective, then take
one more of its own.  Converting, it is made whole from each rank's moments
instead (:func:`moments`): its count, sum and sum of squares about its own
mean, one collective beside the centre's, combined after it with the centre
as Chan et al.'s parallel variance does: exact, and one level fewer.

Likewise a sum over the rows of a product whose factors include a value made
whole later than the others, the same along the rows (``sum(g_var * (h -
mean))``, BatchNorm's backward), is the sum of the other factors, scaled
after: its collective no longer waits for that value's
(:func:`_defer_whole_factors`, :meth:`~..rows.Rows.replicated`).
"""
import functools
import operator

from tmpi_adapters.graphs.marks import MAX, MIN, MIXED, PARTIAL, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.patterns import like
from tmpi_adapters.graphs.pending import Strict
from tmpi_adapters.graphs.registry import kept, rule, whole


def _kept_axis(mark, reduced):
    """Rows ``mark`` once the axes ``reduced`` (not theirs) are gone."""
    return mark.moved(mark.axis - sum(1 for a in reduced if a < mark.axis))


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
            return kept(node, [_kept_axis(k, axes)])
        if kind is None:
            return whole(node)
        centred = _centred_squares(rows, node, axes) if kind == SUM and rows.convert else None
        if centred is not None:
            return [REPL], [moments(rows, node, *centred, axes)]
        if kind == SUM and rows.convert:
            _defer_whole_factors(rows, node, axes)
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
        kept_axis = _kept_axis(k, axes)
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
        return kept(node, [_kept_axis(k, axes)] * len(node.outputs))
    return whole(node)


def _centred_squares(rows, node, axes):
    """``(h, c)`` where ``node`` sums ``(h - c)**2`` over ``axes``, ``h``
    rows on one of them and ``c`` a value made whole in the step that is the
    same along all of them (a batch mean); else ``None``."""
    from theano import scalar
    from theano.tensor import NotScalarConstantError, get_scalar_constant_value
    square = node.inputs[0].owner
    if square is None or _scalar_name(square) not in ("Sqr", "Pow"):
        return None
    if _scalar_name(square) == "Pow":
        try:
            if float(get_scalar_constant_value(square.inputs[1])) != 2.0:
                return None
        except NotScalarConstantError:
            return None
    difference = square.inputs[0].owner
    if difference is None or not isinstance(getattr(difference.op, "scalar_op", None),
                                            scalar.Sub):
        return None
    a, b = difference.inputs
    for h, c in ((a, b), (b, a)):
        mark = rows(h)
        if isinstance(mark, Shard) and mark.axis in axes and (rows(c) == REPL or
                                                             rows(c) in PARTIAL) and \
                c.ndim == h.ndim and all(c.broadcastable[j] for j in axes):
            return h, c
    return None


def _scalar_name(node):
    """The scalar op's class name of an elementwise ``node``, else ``None``."""
    scalar_op = getattr(node.op, "scalar_op", None)
    return type(scalar_op).__name__ if scalar_op is not None else None


def moments(rows, node, h, c, axes):
    """The one-process ``sum((h - c)**2)`` over ``axes`` (``node``), from
    every rank's count ``n``, sum ``s`` and sum of squares about its own
    mean ``m2``, stacked in one collective that does not wait for ``c``:
    ``sum(m2) + sum((s - n*c)**2 / n)`` over the ranks (a rank's
    ``sum((h - c)**2)`` is its ``m2 + (s - n*c)**2 / n``)."""
    T = rows.T
    local = rows.local(h)
    dtype = node.outputs[0].dtype
    others = [j for j in range(h.ndim) if j not in axes]
    count = T.cast(functools.reduce(operator.mul, [local.shape[j] for j in axes]), dtype)
    total = T.cast(local.sum(axis=list(axes), keepdims=True), dtype)
    # (n + (n == 0) is max(n, 1) for a count: the OpenCL device's kernels crash on a
    # float maximum.)
    spread = T.sqr(local - total / (count + T.eq(count, 0))).sum(axis=list(axes))
    total = total.dimshuffle(others)
    part = T.stack([T.cast(T.ones_like(total) * count, dtype), total, T.cast(spread, dtype)])
    stacked = rows.request("stack", part, h, node, "a sum of squares about a batch mean")
    counts, totals, spreads = stacked[:, 0], stacked[:, 1], stacked[:, 2]
    centre = rows.replicated(c, node).dimshuffle(others)
    apart = T.switch(T.gt(counts, 0),
                     T.sqr(totals - counts * centre) / (counts + T.eq(counts, 0)), 0)
    return like(spreads.sum(axis=0) + apart.sum(axis=0), node.outputs[0])


def _factors(rows, variable, axes, depth=0):
    """``(sign, row factors, whole factors)`` of a product (through ``*``,
    unary ``-`` and ``second(a, b)``, ``b`` shaped like ``a``): whole factors
    are values made whole in the step and the same along ``axes``; ``None``
    where ``variable`` is no such product."""
    from theano import scalar
    node = variable.owner
    op = getattr(node.op, "scalar_op", None) if node is not None else None
    if depth < 8 and isinstance(op, scalar.Mul):
        sign, found, whole = 1, [], []
        for v in node.inputs:
            inner = _factors(rows, v, axes, depth + 1)
            if inner is None:
                return None
            sign *= inner[0]
            found += inner[1]
            whole += inner[2]
        return sign, found, whole
    if depth < 8 and isinstance(op, scalar.Neg):
        inner = _factors(rows, node.inputs[0], axes, depth + 1)
        return None if inner is None else (-inner[0], inner[1], inner[2])
    if depth < 8 and isinstance(op, scalar.Second):
        a, b = node.inputs
        if b.ndim == a.ndim and _whole_along(rows, b, axes):
            return 1, [("ones", a)], [b]
    if _whole_along(rows, variable, axes):
        return 1, [], [variable]
    return 1, [("value", variable)], []


def _whole_along(rows, variable, axes):
    """True for a value made whole in the step (or partial: made whole when
    read), the same along ``axes``."""
    mark = rows(variable)
    return (mark == REPL or mark in PARTIAL) and all(variable.broadcastable[j] for j in axes)


def _terms(rows, variable, axes, depth=0):
    """The terms ``[(sign, row factors, whole factors)]`` of a sum of
    products (through ``+``, ``-`` and :func:`_factors`), or ``None``."""
    from theano import scalar
    node = variable.owner
    op = getattr(node.op, "scalar_op", None) if node is not None else None
    if depth < 8 and isinstance(op, (scalar.Add, scalar.Sub)):
        found = []
        for j, v in enumerate(node.inputs):
            inner = _terms(rows, v, axes, depth + 1)
            if inner is None:
                return None
            negate = isinstance(op, scalar.Sub) and j == 1
            found += [(-sign if negate else sign, f, w) for sign, f, w in inner]
        return found
    product = _factors(rows, variable, axes)
    return None if product is None else [product]


def _defer_whole_factors(rows, node, axes):
    """Where ``node`` sums over the rows products with whole factors made
    whole after the other factors' values (``sum(dy*r - d*(k*r**3))``, ``k``
    whole late), note how to make it whole without waiting for them: each
    product's other factors summed and made whole, then scaled and added
    (:attr:`~..rows.Rows.deferred`)."""
    terms = _terms(rows, node.inputs[0], axes)
    if terms is None or len(terms) > 8 or any(not f for _, f, _ in terms):
        return
    late = max([rows.level(v) + (rows(v) in PARTIAL) for _, _, w in terms for v in w] + [0])
    early = max([rows.level(v) for _, f, _ in terms for _, v in f] + [0])
    if late <= early:
        return
    row_axis = rows(node.inputs[0])
    for _, factors, _ in terms:
        for kind, v in factors:
            mark = rows(v)
            # (Only factors whose local value is what the product reads: the rows
            # on the summed axis, values without the batch, sizes made global.)
            if not (mark == row_axis or mark is SAME or mark == SHAPE):
                return
    T = rows.T
    out = node.outputs[0]
    others = [j for j in range(node.inputs[0].ndim) if j not in axes]
    parts = []
    for _, factors, _ in terms:
        product = None
        for kind, v in factors:
            value = rows.global_value(v) if rows(v) == SHAPE else rows.local(v)
            value = T.ones_like(value) if kind == "ones" else value
            product = value if product is None else product * value
        parts.append(like(product.sum(axis=list(axes)), out))

    def combine(made_whole):
        total = None
        for (sign, _, scales), value in zip(terms, made_whole):
            for v in scales:
                value = value * rows.replicated(v, node).dimshuffle(others)
            value = value if sign > 0 else -value
            total = value if total is None else total + value
        return like(total, out)
    rows.deferred[out] = (parts, combine)
