"""The row rules, one at a time, on one process: no MPI, no subprocess.

Small float64 graphs are built here and read as a split function reads
them: :class:`~tmpi_adapters.graphs.layout.Layout` says which inputs carry
the batch and on which axis, :class:`~tmpi_adapters.graphs.rows.Rows` gives
every variable its mark (:mod:`tmpi_adapters.graphs.rows` explains them).

The strict reading (``convert=False``, split evaluations) makes no
conversion: what would need one is MIXED, and it records no request.  The
converting reading (a training step) is checked on the values of its
converted graph: each rank's share of a 10-row batch (4, 3 and 3 rows, the
:data:`ROWS_WINDOW` set as the session sets it) runs the graph compiled in
pure Python, with every pending collective replaced by the one-process value
of what it makes whole (what a perfect collective would hand back); the
ranks' values, combined as their mark says (rows joined, partial sums
added), are the one-process value.

Theano is imported inside the tests (as in tests/test_split_outputs.py), so
collecting this file changes nothing for the files that set Theano's flags.
"""
import numpy as np
import pytest

from tmpi_adapters.graphs.marks import (DRAW, MAX, MIN, MIXED, REPL, ROWS_WINDOW, SAME, SHAPE,
                                        SUM, Shard)

#: A 10-row batch on 3 ranks: rows [lo, hi) of each.
SHARES = [(0, 4), (4, 7), (7, 10)]
ROWS = 10


def case(name, *values, xfail=None):
    """A table's row, named; ``xfail``: why the code gives another answer (strict)."""
    marks = [pytest.mark.xfail(strict=True, reason=xfail)] if xfail else []
    return pytest.param(name, *values, id=name, marks=marks)


# -- reading and running ------------------------------------------------------------------

def read(data, outputs, costs=(), convert=False, **options):
    """``Rows`` of the graph of ``outputs`` and ``costs``, as a split function reads it."""
    import theano
    from tmpi_adapters.graphs.layout import Layout
    from tmpi_adapters.graphs.rows import Rows
    outputs, costs = list(outputs), list(costs)
    layout = Layout(data, outputs + costs, costs=costs, outputs=outputs)
    if convert:
        options["window"] = theano.shared(np.zeros(4, dtype="int64"), name=ROWS_WINDOW)
    return Rows(layout, convert=convert, **options)


def pending_sources(rows, expr):
    """``(kind, axis)`` of the requests the converted ``expr`` waits for."""
    from theano.gof.graph import ancestors
    above = set(ancestors([converted(rows, expr)]))
    return sorted((r.kind, r.axis) for r in rows.requests if r.output in above)


def converted(rows, expr):
    """The converted graph's value of ``expr``: its local form (a size's, rebuilt
    from the global sizes)."""
    return rows.global_value(expr) if rows(expr) == SHAPE else rows.local(expr)


def share(value, axis, lo, hi):
    if axis is None:
        return value
    index = [slice(None)] * value.ndim
    index[axis] = slice(lo, hi)
    return value[tuple(index)]


def combine(mark, parts):
    """The one-process value the ranks' ``parts`` stand for, as ``mark`` says."""
    if isinstance(mark, Shard):
        return np.concatenate([np.atleast_1d(p) for p in parts], axis=mark.axis)
    if mark == SUM:
        return sum(parts)
    if mark == MAX:
        return np.max(parts, axis=0)
    if mark == MIN:
        return np.min(parts, axis=0)
    assert mark is SAME or mark in (REPL, SHAPE), mark
    # Whole on every rank: each rank holds the one-process value itself.
    for part in parts[1:]:
        np.testing.assert_array_equal(part, parts[0])
    return parts[0]


def run_converted(rows, data, values, expr):
    """``(one-process value, the ranks' values combined)`` of ``expr`` (see module doc)."""
    import theano
    whole = {d: d.type((d.name or "input") + "_whole") for d in data}
    made_whole = {r.output: _whole_of(r, theano.clone(r.source, replace=whole))
                  for r in rows.requests}
    local = theano.clone(converted(rows, expr), replace=made_whole)
    # Every rank, and the one process, draw from the same generator state.
    options = dict(mode="FAST_COMPILE", on_unused_input="ignore", no_default_updates=True)
    one = theano.function(list(data), expr, **options)
    ranks = theano.function(list(data) + [whole[d] for d in data], local, **options)
    parts = []
    for lo, hi in SHARES:
        rows.window.set_value(np.array([lo, hi, ROWS, max(hi - lo, 1)], dtype="int64"))
        mine = [share(v, rows.layout.axis(d), lo, hi) for d, v in zip(data, values)]
        parts.append(ranks(*(mine + list(values))))
    return one(*values), combine(rows(expr), parts)


def _whole_of(request, source):
    """What a request's collective hands back, from the one-process value of
    its source: that value, or (rows in windows of an axis, gathered as
    blocks) that value split into its blocks and the rows."""
    if request.output.ndim == source.ndim:
        return source
    axis = request.axis - 1
    shape = [source.shape[j] for j in range(source.ndim)]
    return source.reshape(shape[:axis] + [shape[axis] // ROWS, ROWS] + shape[axis + 1:],
                          ndim=source.ndim + 1)


def assert_converted(rows, data, values, expr):
    one, got = run_converted(rows, data, values, expr)
    assert got.shape == one.shape, (got.shape, one.shape)
    np.testing.assert_allclose(got, one, rtol=1e-12, atol=1e-12)


# -- one input's rows, through the rules ------------------------------------------------------

class Net:
    """``x`` (B, 4) and per-row activations ``h = tanh(x W)`` (B, 3)."""

    def __init__(self):
        import theano
        import theano.tensor as T
        rng = np.random.RandomState(0)
        self.T = T
        self.x = T.dmatrix("x")
        self.W = theano.shared(rng.standard_normal((4, 3)), name="W")
        self.V = theano.shared(rng.standard_normal((2, 3)), name="V")
        self.h = T.tanh(T.dot(self.x, self.W))
        self.cost = T.mean(T.sum(T.sqr(self.h), axis=1))
        self.values = [rng.standard_normal((ROWS, 4))]

    def grad(self, cost):
        import theano
        return theano.grad(cost, self.W)


def _mean_cost(n):
    return n.grad(n.T.mean(n.T.sqr(n.h)))


#: (name, expression of a Net, strict mark, converted mark, collectives the
#: converted value waits for: (kind, axis))
RULES = [
    # Row-wise ops keep each rank's rows.
    case("elementwise", lambda n: 2 * n.T.exp(n.x) + 1, Shard(0), Shard(0), []),
    case("dot with a parameter", lambda n: n.T.dot(n.x, n.W), Shard(0), Shard(0), []),
    case("parameter dot rows.T", lambda n: n.T.dot(n.V, n.h.T), Shard(1), Shard(1), []),
    case("softmax", lambda n: n.T.nnet.softmax(n.h), Shard(0), Shard(0), []),
    case("transpose", lambda n: n.h.T, Shard(1), Shard(1), []),
    case("dimshuffle (0, x, 1)", lambda n: n.h.dimshuffle(0, "x", 1), Shard(0), Shard(0), []),
    case("dimshuffle (1, x, 0)", lambda n: n.h.dimshuffle(1, "x", 0), Shard(2), Shard(2), []),
    case("sum over features", lambda n: n.h.sum(axis=1), Shard(0), Shard(0), []),
    case("mean over features", lambda n: n.h.mean(axis=1), Shard(0), Shard(0), []),
    case("max over features", lambda n: n.h.max(axis=1), Shard(0), Shard(0), []),
    case("argmax over features", lambda n: n.T.argmax(n.h, axis=1), Shard(0), Shard(0), []),
    case("positions of the rows", lambda n: n.T.arange(n.x.shape[0]), Shard(0), Shard(0), []),
    # T.repeat(h, 2, axis=0): alloc (n, 2, d), reshape (2n, d): each row's copies
    # together, so a rank's rows stay one block, two entries a row.
    case("rows repeated", lambda n: n.T.repeat(n.h, 2, axis=0), Shard(0), Shard(0), []),
    case("rows tiled along the features", lambda n: n.T.tile(n.h, (1, 2)), Shard(0), Shard(0),
         []),
    case("features split", lambda n: n.T.split(n.h, [1, 2], 2, axis=1)[1], Shard(0), Shard(0),
         []),
    case("rows split", lambda n: n.T.split(n.h, [4, 6], 2, axis=0)[1], MIXED, REPL,
         [("gather", 0)]),
    case("rows repeated, summed", lambda n: n.T.repeat(n.h, 3, axis=0).sum(axis=0), SUM, SUM,
         []),
    # Reductions over the rows: partial on each rank.
    case("sum over rows", lambda n: n.h.sum(axis=0), SUM, SUM, []),
    case("sum over all", lambda n: n.h.sum(), SUM, SUM, []),
    case("max over rows", lambda n: n.h.max(axis=0), MAX, MAX, []),
    case("min over rows", lambda n: n.h.min(axis=0), MIN, MIN, []),
    case("rows.T dot rows", lambda n: n.T.dot(n.h.T, n.x), SUM, SUM, []),
    case("gradient of a sum", lambda n: n.grad(n.T.sum(n.T.sqr(n.h))), SUM, SUM, []),
    # Sizes: the batch's length is SHAPE, another axis' is known alike everywhere.
    case("rows' count", lambda n: n.x.shape[0], SHAPE, SHAPE, []),
    case("features' count", lambda n: n.x.shape[1], SAME, SAME, []),
    # Strictly, the global sizes are not rebuilt: what divides by them is MIXED.
    case("mean over rows", lambda n: n.h.mean(axis=0), MIXED, SUM, []),
    case("mean over all", lambda n: n.h.mean(), MIXED, SUM, []),
    case("rows divided by their count", lambda n: n.x / n.x.shape[0], MIXED, Shard(0), []),
    case("gradient of a mean", _mean_cost, MIXED, SUM, []),
    # A count of rows (ones summed over the rows) is a partial sum; converted,
    # it is rebuilt from the global sizes, with no collective.
    case("ones summed over rows", lambda n: n.T.ones_like(n.h).sum(axis=0), SUM, SHAPE, []),
    # Rows mixed with rows: MIXED strictly; converted, made whole and run on the
    # whole batch (REPL), or rows minus a whole partial sum.
    case("h hT", lambda n: n.h.dot(n.h.T), MIXED, REPL, [("gather", 0), ("gather", 1)]),
    case("sort over the rows", lambda n: n.T.sort(n.h, axis=0), MIXED, REPL, [("gather", 0)]),
    case("a row picked by index", lambda n: n.h[3], MIXED, REPL, [("gather", 0)]),
    case("rows reversed", lambda n: n.h[::-1], MIXED, REPL, [("gather", 0)]),
    case("cumsum over rows", lambda n: n.T.cumsum(n.h, axis=0), MIXED, REPL, [("gather", 0)]),
    case("product over rows", lambda n: n.h.prod(axis=0), MIXED, REPL, [("gather", 0)]),
    case("rows minus their mean", lambda n: n.h - n.h.mean(axis=0), MIXED, Shard(0), [("sum", None)]),
]


@pytest.mark.parametrize("name,build,strict,_converted,_requests", RULES)
def test_the_strict_reading_marks(name, build, strict, _converted, _requests):
    n = Net()
    expr = build(n)
    rows = read([n.x], [expr], [n.cost])
    assert rows.layout.axis(n.x) == 0
    assert rows(expr) == strict, (name, rows(expr))
    assert rows.requests == [] and rows.couplings == []   # strict: nothing converted


@pytest.mark.parametrize("name,build,_strict,mark,requests", RULES)
def test_the_converted_graph_gives_the_one_process_value(name, build, _strict, mark, requests):
    n = Net()
    expr = build(n)
    rows = read([n.x], [expr], [n.cost], convert=True)
    assert rows(expr) == mark, (name, rows(expr))
    assert rows.refusal is None
    assert pending_sources(rows, expr) == requests
    assert_converted(rows, [n.x], n.values, expr)


def test_a_mean_over_rows_is_a_partial_sum_over_a_size():
    n = Net()
    over_rows = n.h.mean(axis=0)
    over_all = n.h.mean()
    # (Theano divides a mean over all by one axis' length, then by the other's.)
    inner, features = over_all.owner.inputs
    for mean, ratio in ((over_rows, over_rows), (over_all, inner)):
        rows = read([n.x], [mean], [n.cost])
        sum_, count = ratio.owner.inputs
        assert type(ratio.owner.op.scalar_op).__name__ == "TrueDiv"
        assert (rows(sum_), rows(count)) == (SUM, SHAPE)
        assert rows(mean) == MIXED and rows(ratio) == MIXED
        if mean is over_all:
            assert rows(features) is SAME
        # Converted: the local sum over the global count, a partial sum.
        rows = read([n.x], [mean], [n.cost], convert=True)
        assert rows(mean) == SUM and pending_sources(rows, mean) == []


def test_a_variance_is_made_whole_from_moments_beside_its_mean():
    # var = sum((h - mean)**2) / n waits for the mean's sum, then for its own:
    # two levels.  Made whole from each rank's (count, sum, spread about its own
    # mean), its collective no longer waits for the mean's: both are one level,
    # and the ranks' parts combined with the whole mean give the one-process
    # variance, also with a mean far from zero (BatchNorm's variance, T.var's).
    import theano
    n = Net()
    for shift in (0.0, 1e3):
        h = n.h + shift
        mean = h.mean(axis=0)
        variance = ((h - mean) ** 2).mean(axis=0)
        normalised = (h - mean) / n.T.sqrt(variance + 1e-5)
        rows = read([n.x], [normalised], [n.cost], convert=True)
        assert rows(variance) == REPL and rows(normalised) == Shard(0)
        kinds = sorted({r.kind for r in rows.requests})
        assert kinds == ["stack", "sum"], kinds
        assert rows.level(variance) == 1          # one collective before it, not two
        # Each rank's parts, then every pending value as the collectives make it.
        options = dict(mode="FAST_COMPILE", on_unused_input="ignore")
        part = theano.function([n.x], [r.output.owner.inputs[0] for r in rows.requests],
                               **options)
        parts = []
        for lo, hi in SHARES:
            rows.window.set_value(np.array([lo, hi, ROWS, hi - lo], dtype="int64"))
            parts.append(part(n.values[0][lo:hi]))
        made = [np.stack(found) if r.kind == "stack" else sum(found)
                for r, found in zip(rows.requests, zip(*parts))]
        whole = [r.output.type() for r in rows.requests]
        ranks = theano.function([n.x] + whole, theano.clone(rows.local(normalised), replace={
            r.output: w for r, w in zip(rows.requests, whole)}), **options)
        got = []
        for lo, hi in SHARES:
            rows.window.set_value(np.array([lo, hi, ROWS, hi - lo], dtype="int64"))
            got.append(ranks(n.values[0][lo:hi], *made))
        one = theano.function([n.x], normalised, **options)(n.values[0])
        np.testing.assert_allclose(np.concatenate(got), one, rtol=1e-9, atol=1e-9)


def _time_major(T, n):
    """``x`` (B, 2, 4) read time-major as a recurrent layer precomputes its
    input: ``(T, B, 4)`` merged to ``(T*B, 4)``, a dense layer, split back."""
    x = T.dtensor3("x")
    steps = x.dimshuffle(1, 0, 2)
    merged = steps.reshape((steps.shape[0] * steps.shape[1], steps.shape[2]))
    dense = T.tanh(T.dot(merged, n.W))
    back = dense.reshape((steps.shape[0], steps.shape[1], dense.shape[1]))
    values = [np.random.RandomState(3).standard_normal((ROWS, 2, 4))]
    return x, merged, dense, back, values


def test_rows_merged_with_time_are_windows_of_each_step_not_gathered():
    # (T, B, 4) -> (T*B, 4): each rank holds its rows of every step, the rows
    # the inner factor (a window of each block): row-wise ops run on them, the
    # split back has the rows on axis 1 again; nothing is gathered.  What reads
    # them across the rows gathers each rank's blocks and merges them back.
    n = Net()
    x, merged, dense, back, values = _time_major(n.T, n)
    cost = n.T.mean(back ** 2)
    for convert in (False, True):
        rows = read([x], [back, dense], [cost], convert=convert)
        assert rows(merged) == Shard(0, inner=True) == rows(dense)
        assert rows(back) == Shard(1)
        if convert:
            assert pending_sources(rows, back) == []
            assert_converted(rows, [x], values, back)
    across = n.T.sort(dense, axis=0)
    rows = read([x], [across], [cost], convert=True)
    assert rows(across) == REPL and pending_sources(rows, across) == [("gather", 1)]
    assert_converted(rows, [x], values, across)
    # A reshape of the windows that is not their split back mixes them: gathered.
    other = dense.reshape((-1,))
    rows = read([x], [other], [cost], convert=True)
    assert rows(other) == REPL
    assert_converted(rows, [x], values, other)


def test_a_coupling_names_what_meets_and_where():
    n = Net()
    product = n.h.dot(n.h.T)    # this line is named
    line = product.tag.trace[-1][-1][1]
    rows = read([n.x], [product], [n.cost], convert=True)
    # Both factors are gathered (h and hᵀ), each named at the product's line.
    assert [c.kind for c in rows.couplings] == ["gather", "gather"]
    for coupling in rows.couplings:
        assert "a product of rows with rows (h hᵀ)" in coupling.what
        assert coupling.where == "test_row_rules.py:%d" % line


def test_an_op_without_a_rule_is_gathered_and_named():
    import theano.tensor as T
    n = Net()
    products = T.extra_ops.cumprod(n.h + 1.0, axis=1)    # no rule reads CumOp
    line = products.tag.trace[-1][-1][1]
    rows = read([n.x], [products], [n.cost], convert=True)
    assert rows(products) == REPL
    [coupling] = rows.couplings
    assert coupling.kind == "gather"
    assert "CumOp" in coupling.what and "an op tmpi has no rule for" in coupling.what
    assert coupling.where == "test_row_rules.py:%d" % line


def test_a_draw_shaped_like_the_rows_is_drawn_again_for_the_whole_batch():
    # Drawn from the rows' shape, not for the whole batch (no NOISE_WINDOW): a
    # DRAW strictly, and what it meets is MIXED.  Converting, every rank draws
    # the whole batch's numbers and keeps its rows: the one-process draw.
    from theano.sandbox.rng_mrg import MRG_RandomStreams
    n = Net()
    noise = MRG_RandomStreams(3).uniform(n.h.shape)
    [node] = {v.owner for v in _ancestors(noise) if v.owner is not None
              and type(v.owner.op).__name__ == "mrg_uniform"}
    drawn = node.outputs                # (the generator's new state, the draw)
    product = noise * n.h
    rows = read([n.x], [product], [n.cost])
    assert [rows(v) for v in drawn] == [DRAW, DRAW]
    assert rows(product) == MIXED
    rows = read([n.x], [product], [n.cost], convert=True)
    assert rows.refusal is None
    assert (rows(noise), rows(product)) == (REPL, Shard(0))
    assert pending_sources(rows, product) == []
    assert_converted(rows, [n.x], n.values, product)


# -- the marks and the registry -------------------------------------------------------------------

def test_a_mark_is_typed_and_never_an_axis():
    assert Shard(0) == Shard(0) and Shard(0) != Shard(1) and hash(Shard(2)) == hash(Shard(2))
    assert SUM != MAX and SUM.negated() == SUM and MAX.negated() == MIN
    assert SAME != REPL and Shard(0) not in (SAME, SHAPE, REPL)
    # Code written for the marks of old (``mark == 0``) cannot silently read false.
    with pytest.raises(TypeError, match="compared with an axis"):
        Shard(0) == 0
    with pytest.raises(TypeError, match="compared with an axis"):
        SUM in (0, 1)


def test_every_op_of_the_catalogue_has_one_rule():
    from tmpi_adapters.graphs import catalogue, rows  # noqa: F401 - the engine registers the rules
    from tmpi_adapters.graphs.registry import registered
    tables = (catalogue.ROW_OPS, catalogue.IDENTITIES, catalogue.CONV_GRAD_WEIGHTS,
              catalogue.BATCH_NORMS, catalogue.SIZES, catalogue.NAMED)
    missing = set().union(*tables) - registered()
    assert missing == {"ARange"}, missing      # read by the sizes rule, always sized


def test_two_rules_for_one_op_are_refused():
    import theano.tensor as T
    from tmpi_adapters.graphs import rows  # noqa: F401 - the engine registers the rules
    from tmpi_adapters.graphs.registry import rule, rule_for
    assert rule_for(T.dot(T.matrix(), T.matrix()).owner.op).__name__ == "dot"
    with pytest.raises(ValueError, match="two row rules for Dot"):
        rule("Dot")(lambda rows, node, ins: None)


def test_a_signature_is_what_the_engine_converts():
    # dot(h, W) with W a parameter: the rows kept, W as every rank has it; the
    # rule says so, the engine applies it (no request in either reading).
    from tmpi_adapters.graphs.registry import KEEP, rule_for
    n = Net()
    expr = n.T.dot(n.h, n.V.T)
    rows = read([n.x], [expr], [n.cost])
    signature = rule_for(expr.owner.op)(rows, expr.owner, [rows(v) for v in expr.owner.inputs])
    assert signature.outputs == [Shard(0)]
    assert signature.inputs[0] is KEEP and signature.inputs[1] == REPL
    assert rows.requests == []


# -- a subclass meets its base's rule -----------------------------------------------------------

def _subclass(base):
    return type("Users" + base.__name__, (base,), {})


def _view(n):
    from theano.compile.ops import ViewOp
    return _subclass(ViewOp)()(n.h)


def _softmax(n):
    from theano.tensor.nnet import Softmax
    return _subclass(Softmax)()(n.h)


def _dot_rows(n):
    from theano.tensor.basic import Dot
    return _subclass(Dot)()(n.h, n.V.T)


def _dot_partial(n):
    from theano.tensor.basic import Dot
    return _subclass(Dot)()(n.h.T, n.x)


def _max(n):
    from theano.tensor.basic import MaxAndArgmax
    return _subclass(MaxAndArgmax)([0])(n.h)[0]


def _subtensor(n):
    from theano.tensor.subtensor import Subtensor
    column = n.h[:, 1].owner
    return _subclass(Subtensor)(column.op.idx_list)(*column.inputs)


def _shape_i(n):
    from theano.compile.ops import Shape_i
    return _subclass(Shape_i)(0)(n.h)


def _shape(n):
    from theano.compile.ops import Shape
    return _subclass(Shape)()(n.h)


def _arange(n):
    from theano.tensor.basic import ARange
    return _subclass(ARange)("int64")(0, n.h.shape[0], 1)


#: (name, the subclass's node, the mark its base gives)
SUBCLASSES = [
    case("ViewOp (an identity)", _view, Shard(0)),
    case("Softmax (a row op, by catalogue)", _softmax, Shard(0)),
    case("Dot, rows kept", _dot_rows, Shard(0)),
    case("Dot, rows contracted", _dot_partial, SUM),
    case("MaxAndArgmax over rows", _max, MAX),
    case("Subtensor of a feature", _subtensor, Shard(0)),
    case("Shape_i of the rows", _shape_i, SHAPE),
    case("Shape", _shape, SHAPE),
    case("ARange of the rows", _arange, Shard(0)),
]


@pytest.mark.parametrize("name,build,mark", SUBCLASSES)
def test_a_subclass_meets_its_base_rule(name, build, mark):
    n = Net()
    expr = build(n)
    assert type(expr.owner.op).__name__.startswith("Users")
    rows = read([n.x], [expr], [n.cost])
    assert rows(expr) == mark, (name, rows(expr))
    # Converted alike, to the one-process value.
    rows = read([n.x], [expr], [n.cost], convert=True)
    assert rows(expr) == mark and pending_sources(rows, expr) == []
    assert_converted(rows, [n.x], n.values, expr)


def test_the_catalogue_names_a_subclass_by_its_base():
    from theano.compile.ops import ViewOp
    from theano.tensor.nnet import Softmax
    from theano.tensor.nnet.nnet import CrossentropyCategorical1Hot
    from tmpi_adapters.graphs.catalogue import name_of
    assert name_of(_subclass(Softmax)()) == "Softmax"
    assert name_of(_subclass(_subclass(ViewOp))()) == "ViewOp"
    assert name_of(_subclass(CrossentropyCategorical1Hot)()) == "CrossentropyCategorical1Hot"
    assert name_of(_subclass(object)()) == "Usersobject"      # unknown: its own name


def test_a_subclass_of_a_row_op_ties_its_inputs_rows():
    # Layout (sizes.py) reads the catalogue too: a user's cross-entropy ties the
    # labels' rows to the predictions', so the labels carry the batch.
    import theano.tensor as T
    from theano.tensor.nnet.nnet import CrossentropyCategorical1Hot
    n = Net()
    y = T.ivector("y")
    per_row = _subclass(CrossentropyCategorical1Hot)()(T.nnet.softmax(n.h), y)
    cost = T.mean(per_row)
    rows = read([n.x, y], [per_row], [cost])
    assert (rows.layout.axis(n.x), rows.layout.axis(y)) == (0, 0)
    assert rows.layout.whole == []
    assert rows(per_row) == Shard(0)


# -- Layout: which inputs carry the batch -------------------------------------------------------

class Case:
    """A graph for Layout: its data, outputs and costs, the values to run it
    on, and what is expected: ``axes`` of the data by name, ``whole`` (the
    names in Layout.whole), ``marks`` (expression: strict mark)."""

    def __init__(self, data, outputs, costs, values, axes, whole=(), marks=()):
        self.data, self.outputs, self.costs, self.values = data, outputs, costs, values
        self.axes, self.whole, self.marks = axes, set(whole), list(marks)


def _classifier():
    import theano
    import theano.tensor as T
    rng = np.random.RandomState(1)
    x, y = T.dmatrix("x"), T.ivector("y")
    W = theano.shared(rng.standard_normal((4, 3)), name="W")
    return x, y, W, [rng.standard_normal((ROWS, 4)), rng.randint(0, 3, ROWS).astype("int32")]


def _picked():
    import theano.tensor as T
    x, y, W, values = _classifier()
    p = T.nnet.softmax(T.dot(x, W))
    per_row = -T.log(p)[T.arange(y.shape[0]), y]
    return Case([x, y], [per_row], [T.mean(per_row)], values, {"x": 0, "y": 0},
                marks=[(per_row, Shard(0)), (p, Shard(0))])


def _crossentropy():
    import theano.tensor as T
    x, y, W, values = _classifier()
    per_row = T.nnet.categorical_crossentropy(T.nnet.softmax(T.dot(x, W)), y)
    return Case([x, y], [per_row], [T.mean(per_row)], values, {"x": 0, "y": 0},
                marks=[(per_row, Shard(0))])


def _reference(rows):
    def build():
        # A reference batch whose rows are only reduced: whole, whatever its
        # length (``rows``: 7, or the batch's 10), and the converted graph runs it
        # whole on every rank.
        import theano
        import theano.tensor as T
        rng = np.random.RandomState(2)
        x, ref = T.dmatrix("x"), T.dmatrix("ref")
        W = theano.shared(rng.standard_normal((4, 3)), name="W")
        mean = ref.mean(axis=0)
        centred = x - mean
        cost = T.mean(T.sum(T.sqr(T.dot(centred, W)), axis=1))
        values = [rng.standard_normal((ROWS, 4)), rng.standard_normal((rows, 4))]
        return Case([x, ref], [centred], [cost], values, {"x": 0, "ref": None},
                    whole=["ref"], marks=[(centred, Shard(0)), (mean, SAME)])
    return build


def _reference_in_the_cost_only():
    case = _reference(ROWS)()
    case.outputs = []
    return case


def _embeddings():
    # Class embeddings E (C, d): scores h Eᵀ and each row's own class's embedding.
    import theano.tensor as T
    x, y, W, values = _classifier()
    E = T.dmatrix("E")
    h = T.dot(x, W)
    scores = T.nnet.softmax(h.dot(E.T))
    own = E[y]
    pulled = T.sum(T.sqr(h - own), axis=1)
    cost = T.mean(T.nnet.categorical_crossentropy(scores, y)) + T.mean(pulled)
    values.append(np.random.RandomState(3).standard_normal((3, 3)))
    return Case([x, y, E], [scores], [cost], values, {"x": 0, "y": 0, "E": None},
                marks=[(scores, Shard(0)), (pulled, Shard(0)), (own, Shard(0))])


def _embeddings_scored_only():
    import theano.tensor as T
    x, y, W, values = _classifier()
    E = T.dmatrix("E")
    scores = T.nnet.softmax(T.dot(x, W).dot(E.T))
    cost = T.mean(T.nnet.categorical_crossentropy(scores, y))
    values.append(np.random.RandomState(3).standard_normal((3, 3)))
    return Case([x, y, E], [], [cost], values, {"x": 0, "y": 0, "E": None}, whole=["E"])


def _embeddings_scores_returned():
    import theano.tensor as T
    x, y, W, values = _classifier()
    E = T.dmatrix("E")
    scores = T.nnet.softmax(T.dot(x, W).dot(E.T))
    cost = -T.mean(T.log(scores)[T.arange(y.shape[0]), y])
    values.append(np.random.RandomState(3).standard_normal((3, 3)))
    return Case([x, y, E], [scores], [cost], values, {"x": 0, "y": 0, "E": None},
                whole=["E"], marks=[(scores, Shard(0))])


def _image():
    # (B, 64) images reshaped to (10, 1, 8, 8) for a convolution: x keeps its axis.
    import theano
    import theano.tensor as T
    x, y, _, values = _classifier()
    F = theano.shared(np.random.RandomState(4).standard_normal((64, 3)), name="F")
    image = x.reshape((10, 1, 8, 8))
    per_row = T.nnet.categorical_crossentropy(T.nnet.softmax(image.flatten(2).dot(F)), y)
    values[0] = np.random.RandomState(5).standard_normal((ROWS, 64))
    return Case([x, y], [per_row], [T.mean(per_row)], values, {"x": 0, "y": 0})


def _no_proof(cost):
    def build():
        # Nothing says which axis holds rows: every input keeps its axis 0.
        import theano.tensor as T
        x, z = T.dmatrix("x"), T.dmatrix("z")
        rng = np.random.RandomState(6)
        return Case([x, z], [], [cost(T, x, z)], [rng.standard_normal((ROWS, 4))] * 2,
                    {"x": 0, "z": 0})
    return build


LAYOUTS = [
    case("labels picked per row", _picked),
    case("labels in a cross-entropy", _crossentropy),
    case("reference of the batch's length", _reference(ROWS)),
    case("reference of 7 rows", _reference(7)),
    case("reference in the cost only", _reference_in_the_cost_only),
    case("class embeddings scored and indexed", _embeddings),
    case("class embeddings in a cross-entropy", _embeddings_scored_only),
    case("class embeddings' scores returned", _embeddings_scores_returned),
    case("images reshaped to (10, 1, 8, 8)", _image),
    case("a sum over all elements", _no_proof(lambda T, x, z: T.sum(x) + T.sum(z))),
    case("a product of flattened inputs", _no_proof(lambda T, x, z: T.dot(x.flatten(),
                                                                          z.flatten()))),
]
#: What the converted graph is run on: the layouts read right, whose
#: outputs and costs it computes without a reshape to decide.
CONVERTED_LAYOUTS = [p for p in LAYOUTS if not p.marks and p.values[1] is not _image]


@pytest.mark.parametrize("name,build", LAYOUTS)
def test_the_layout_proves_which_inputs_carry_the_batch(name, build):
    case = build()
    rows = read(case.data, case.outputs, case.costs)
    layout = rows.layout
    assert {d.name: layout.axis(d) for d in case.data} == case.axes
    assert {d.name for d in layout.whole} == case.whole
    assert layout.problem is None
    for expr, mark in case.marks:
        assert rows(expr) == mark, (expr, rows(expr), mark)


@pytest.mark.parametrize("name,build", CONVERTED_LAYOUTS)
def test_converted_outputs_of_a_layout_are_the_one_process_values(name, build):
    case = build()
    rows = read(case.data, case.outputs, case.costs, convert=True)
    assert rows.refusal is None
    for expr in case.outputs + case.costs:
        assert rows(expr) not in (MIXED, DRAW), (expr, rows(expr))
        assert_converted(rows, case.data, case.values, expr)


def test_a_reshape_to_a_constant_batch_is_decided_on_a_call():
    # The strict reading cannot run (10, 1, 8, 8) on a share of 4 rows: the
    # reshape is left undecided (MIXED) until fixedbatch decides it on a call,
    # and so is the flatten(2) after it, a reshape to (image.shape[0], -1) whose
    # rows the sizes (10 for the image's axis 0) do not show; decided, they and
    # the per-row loss after them are rows.
    from tmpi_adapters.graphs.fixedbatch import tag
    case = _image()
    [per_row] = case.outputs
    reshapes = {v.ndim: v.owner for v in _ancestors(per_row)
                if v.owner is not None and type(v.owner.op).__name__ == "Reshape"}
    image, flat = reshapes[4].outputs[0], reshapes[2].outputs[0]
    rows = read(case.data, case.outputs, case.costs)
    assert rows.undecided == [reshapes[4]]
    assert (rows(image), rows(flat), rows(per_row)) == (MIXED, MIXED, MIXED)
    decided = {tag(image): 0}
    rows = read(case.data, case.outputs, case.costs, reshapes=decided)
    assert rows.undecided == [reshapes[2]]
    assert (rows(image), rows(flat), rows(per_row)) == (Shard(0), MIXED, MIXED)
    decided[tag(flat)] = 0
    rows = read(case.data, case.outputs, case.costs, reshapes=decided)
    assert rows.undecided == []
    assert (rows(image), rows(flat), rows(per_row)) == (Shard(0), Shard(0), Shard(0))
    # Converted, the constant 10 becomes each rank's share.
    rows = read(case.data, case.outputs, case.costs, convert=True, reshapes=decided)
    assert rows(per_row) == Shard(0) and pending_sources(rows, per_row) == []
    assert_converted(rows, case.data, case.values, per_row)
    assert_converted(rows, case.data, case.values, case.costs[0])


def _ancestors(variable):
    from theano.gof.graph import ancestors
    return ancestors([variable])
