"""Real graph patterns on N ranks: the one-process numbers, or one clear error.

Time-major sequence batches (``theano.scan`` and Blocks' recurrent bricks),
graphs that write the batch size in (the Theano tutorials' LeNet), functions
that evaluate without training, short and empty batches.  The multi-rank
tests run real ``tmpi wrap`` jobs in float64, mostly with pure-Python Theano
(``cxx=``: these tiny graphs compile in seconds that way); the others read
graphs in this process without compiling them in C.
"""
import importlib.util

import numpy as np
import pytest

from conftest import SCRIPTS, assert_close, check, final_numbers, rank_env, tmpi

THEANO = SCRIPTS / "transparency_theano.py"
FIXED = SCRIPTS / "transparency_fixed.py"
BLOCKS = SCRIPTS / "transparency_blocks.py"
PENALTIES = SCRIPTS / "penalty_terms.py"
HAVE_BLOCKS = all(importlib.util.find_spec(m) is not None for m in ("blocks", "fuel"))
needs_blocks = pytest.mark.skipif(not HAVE_BLOCKS, reason=(
    "Blocks is not installable from PyPI; install it from its repository to run these tests"))


def python_env():
    """float64, pure-Python Theano: no C compilation for these small graphs."""
    env = rank_env()
    env["THEANO_FLAGS"] += ",cxx="
    return env


def wrap(n, script, *args, env=None):
    return check(tmpi("wrap", "-n", str(n), "--framework", "theano", script, *args,
                      env=env or python_env()))


def lines(stdout, prefix):
    return [line for line in stdout.splitlines() if line.startswith(prefix)]


def assert_same_numbers(result, reference, keys):
    for key in keys:
        assert_close(final_numbers(result.stdout, key), final_numbers(reference.stdout, key),
                     1e-8)


# ------------------------------------------------------------- plain Theano, real ranks

THEANO_KEYS = ("scan_cost", "scan_norms", "values", "two_rows", "mixed", "short_cost",
               "empty_batches", "short_norms")


@pytest.fixture(scope="module")
def theano_one_rank():
    return wrap(1, THEANO)


@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_scan_eval_and_short_batches_match_one_rank(theano_one_rank, n):
    result = wrap(n, THEANO)
    assert_same_numbers(result, theano_one_rank, THEANO_KEYS)
    # Per-row predictions gathered in order, an integer count kept an integer.
    assert lines(result.stdout, "final predictions") == \
        lines(theano_one_rank.stdout, "final predictions")
    # The evaluation is split; a value that mixes rows runs whole on every rank.
    assert "kind evaluate SplitFunction" in result.stdout
    assert "kind mixed Function" in result.stdout
    assert "kind evaluate Function" in theano_one_rank.stdout  # one rank: the script's own


@pytest.mark.mpi
def test_lenet_style_fixed_batch_graph_is_rebuilt_for_each_rank():
    # conv2d has no pure-Python implementation with this SciPy: compiled in C.
    one, two = wrap(1, FIXED, "conv", env=rank_env()), wrap(2, FIXED, "conv", env=rank_env())
    assert_same_numbers(two, one, ("conv_cost", "conv_errors", "conv_norms"))
    assert "kind validate SplitFunction" in two.stdout


@pytest.mark.mpi
def test_batch_size_of_a_reshape_is_read_on_the_first_call():
    one, three = wrap(1, FIXED, "reshape"), wrap(3, FIXED, "reshape")
    assert_same_numbers(three, one, ("reshape_cost", "reshape_norms"))


@pytest.mark.mpi
def test_reshape_that_merges_rows_follows_shares_it_divides_and_gathers_on_others():
    one, two = wrap(1, FIXED, "merged"), wrap(2, FIXED, "merged")
    assert_same_numbers(two, one, ("merged_cost", "merged_norms"))
    assert "where the batch's rows meet" not in two.stdout
    # On 3 ranks a share of 1 row cannot hold the 2 rows each entry holds:
    # the rows are gathered at the reshape, and the step is the one-process step.
    three = wrap(3, FIXED, "merged")
    assert_same_numbers(three, one, ("merged_cost", "merged_norms"))
    assert "2 collectives per step (train_fn#0: the exchange + 1 where the batch's rows meet" \
        in three.stdout
    assert "a reshape that moves rows across the ranks' shares" in three.stdout
    assert "transparency_fixed.py:" in three.stdout


COINCIDENCE = SCRIPTS / "batch_coincidence.py"


def coincidences(stdout):
    found = {}
    for line in stdout.splitlines():
        head, _, rest = line.partition(" ")
        if head in ("final", "error"):
            case, _, value = rest.partition(" ")
            found[case] = (head, value)
    return found


@pytest.mark.mpi
@pytest.mark.parametrize("batch", [12, 10])
def test_sizes_equal_to_the_batch_or_a_share_give_the_one_process_numbers(batch):
    """Generated graphs whose widths, reshape targets, constant tensors, scan
    states and sequence lengths coincide with the batch size or a rank's
    share: N ranks give the one-process numbers.  A constant tensor as long
    as the batch (``T.zeros((12, n))``, ``T.arange(12)``, a scan state of 12
    rows) is a value that meets the rows without being split: each rank
    takes its rows of it; a reshape no share can follow gathers the rows."""
    one = coincidences(wrap(1, COINCIDENCE, str(batch)).stdout)
    assert len(one) == 19 and all(head == "final" for head, _ in one.values()), one
    for n in (2, 3):
        many = coincidences(wrap(n, COINCIDENCE, str(batch)).stdout)
        assert set(many) == set(one)
        for case, (head, value) in many.items():
            assert head == "final", (n, case, value)
            assert_close([float(v) for v in value.split()],
                         [float(v) for v in one[case][1].split()], 1e-10)


@pytest.mark.mpi
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_weight_penalties_count_once_whatever_the_ranks(reduction):
    """L2 and L1 penalties stay out of the exchange and are added once: a
    loss that sums over the batch gets the one-process step and cost (an
    exchanged penalty was counted once per rank)."""
    one, three = (check(tmpi("wrap", "-n", str(n), "--framework", "theano", "--loss-reduction",
                             reduction, PENALTIES, "--reduction", reduction, env=python_env()))
                  for n in (1, 3))
    assert_same_numbers(three, one, ("cost", "params"))


@needs_blocks
@pytest.mark.mpi
def test_blocks_time_major_sequence_model_matches_one_rank():
    keys = ("train_sequence_log_likelihood", "train_batch_rows", "train_time_steps",
            "train_max_step_cost", "valid_sequence_log_likelihood", "valid_batch_rows",
            "param_norms")
    one = check(tmpi("wrap", "-n", "1", BLOCKS, env=python_env()))
    for n in (2, 3):
        result = check(tmpi("wrap", "-n", str(n), BLOCKS, env=python_env()))
        assert_same_numbers(result, one, keys)
        # A vector per time step: each rank's own, and said so.
        assert "channel(s) per_step_cost are rank 0's own values" in result.stderr


# ------------------------------------------------------------- graphs read in this process

def _recurrent(time_major_cost=True):
    import theano
    import theano.tensor as T
    x, mask = T.tensor3("x"), T.matrix("mask")
    W = theano.shared(np.ones((3, 3)), name="W")
    states, _ = theano.scan(lambda x_t, h: T.tanh(T.dot(x_t, W) + h), sequences=x,
                            outputs_info=T.zeros((x.shape[1], 3)))
    per_step = states.sum(axis=2) * mask
    cost = per_step.sum() / x.shape[1] if time_major_cost else per_step.mean()
    return x, mask, cost


def test_time_major_inputs_have_their_batch_on_axis_one():
    from tmpi_adapters.graphs.layout import Layout
    for explicit in (True, False):
        x, mask, cost = _recurrent(explicit)
        layout = Layout([x, mask], [cost], costs=[cost])
        # x: scanned over (time on axis 0); mask: multiplied with x's steps.
        assert (layout.axis(x), layout.axis(mask), layout.problem) == (1, 1, None)


def test_an_input_with_two_candidate_batch_axes_is_a_problem():
    import theano.tensor as T
    from tmpi_adapters.graphs.layout import Layout
    x = T.matrix("x")
    costs = [x.sum() / x.shape[0], x.sum() / x.shape[1]]
    layout = Layout([x], costs, costs=costs)
    assert "axes [0, 1] of input 'x'" in layout.problem


def test_returned_values_are_classified_from_the_graph():
    import theano
    import theano.tensor as T
    from tmpi_adapters.graphs.layout import Layout
    from tmpi_adapters.graphs.outputs import UNDECIDED, classify
    from tmpi_adapters.graphs.rows import Rows
    x, y = T.matrix("x"), T.ivector("y")
    W = theano.shared(np.zeros((4, 3)), name="W")
    probs = T.nnet.softmax(T.dot(x, W))
    outputs = {
        "mean": T.nnet.categorical_crossentropy(probs, y).mean(),
        "sum": T.sum(T.neq(T.argmax(probs, axis=1), y)),
        "max": probs.max(),
        "min": -probs.max(),
        "rows": T.argmax(probs, axis=1),
        "same": W.sum(),
        "count": x.shape[0],
        "picked": -T.mean(T.log(probs)[T.arange(y.shape[0]), y]),
        "mixed": (x - x.mean(axis=0)).max(),
    }
    rows = Rows(Layout([x, y], list(outputs.values())))
    kinds = {name: classify(v, {x, y}, None, rows=rows) for name, v in outputs.items()}
    assert kinds == {"mean": "mean", "sum": "sum", "max": "max", "min": "min", "rows": "rows",
                     "same": "same", "count": "sum", "picked": "mean", "mixed": None}
    assert classify(x - x.mean(axis=0), {x, y}, None, rows=rows) == UNDECIDED


def test_reshape_to_the_batch_size_follows_each_call():
    import theano
    import theano.tensor as T
    from tmpi_adapters.graphs.fixedbatch import find, rebuild
    from tmpi_adapters.graphs.reshapes import decide
    x = T.matrix("x")
    out = (x.reshape((6, 2, 2)) ** 2).sum(axis=(1, 2))
    found = find([out], [x])
    [(label, (node, shape))] = found.reshapes.items()
    assert shape == (6, 2, 2) and not found.convs
    axis, rewrite = decide("the reshape", shape, [6, 3, 2], [(6, 4), (3, 4), (2, 4)])
    assert axis == 0 and (rewrite.axis, rewrite.num, rewrite.den) == (0, 1, 1)
    [rebuilt] = rebuild([out], {label: rewrite}, x.shape[0], [x])
    f = theano.function([x], rebuilt, mode=theano.compile.Mode(linker="py"))
    data = np.arange(24.0).reshape(6, 4)
    for lo, hi in ((0, 6), (0, 3), (3, 5), (0, 1)):
        assert np.allclose(f(data[lo:hi]), (data[lo:hi] ** 2).sum(axis=1))


@pytest.mark.parametrize("target, shapes, axis, expected", [
    # A width equal to the batch size, the rows on the -1: nothing to rebuild.
    ((-1, 4), [(4, 8), (2, 8)], 0, None),
    # The same written as constants: the rows are axis 0's, two entries each.
    ((8, 4), [(4, 8), (2, 8)], 0, (0, 2, 1)),
    # Time-major (time, batch, features) merged into rows: time entries each.
    ((12, 5), [(3, 4, 5), (3, 2, 5)], 0, (0, 3, 1)),
    # Rows kept whole on an inner axis.
    ((1, 4, 8), [(4, 8), (2, 8)], 1, (1, 1, 1)),
    # Input not following the batch (a parameter's reshape): left alone.
    ((4, 4), [(16,), (16,)], None, None),
])
def test_reshape_rewrites_are_read_from_the_sizes(target, shapes, axis, expected):
    from tmpi_adapters.graphs.reshapes import decide
    found, rewrite = decide("r", target, [4, 2], shapes)
    assert found == axis
    assert (None if rewrite is None else (rewrite.axis, rewrite.num, rewrite.den)) == expected


@pytest.mark.parametrize("target, sizes, shapes, why", [
    ((4, 18), [4, 2], [(4, 9, 2), (2, 7, 2)], "axes [0, 1] of it all change"),
    ((5, 9), [4, 3], [(5, 9), (4, 9)], "not proportional to the rows"),
    ((2, 18), [4, 3], [(4, 9), (3, 9)], "holds 2 rows, which a rank's share of 3 rows"),
    ((3, 12), [4, 2], [(4, 9), (2, 9)], "part of one row and part of another"),
    ((9, 4), [4, 2], [(4, 9), (2, 9)], "part of one row and part of another"),
    # A (features, batch) tensor flattened: rows may be inner or outer entries.
    ((2, -1), [4, 2], [(8,), (4,)], "in an order tmpi cannot tell"),
])
def test_reshapes_no_share_can_follow_are_refused(target, sizes, shapes, why):
    from tmpi_adapters.errors import ConfigError
    from tmpi_adapters.graphs.reshapes import decide
    with pytest.raises(ConfigError) as error:
        decide("the reshape", target, sizes, shapes)
    assert why in str(error.value) and "--scaling weak" in str(error.value)


def test_batches_split_along_their_batch_axis_and_empty_batches_count_once():
    from tmpi_adapters.core.batches import batch_rows, cut_rows, local_share
    seq, labels = np.zeros((5, 7, 3)), np.zeros(7)
    assert batch_rows([seq, labels], [1, 0]) == 7
    cut = cut_rows([seq, labels], 7, 2, 5, [1, 0])
    assert cut[0].shape == (5, 3, 3) and cut[1].shape == (3,)
    assert batch_rows({"x": seq}, {"x": 1}) == 7
    assert [local_share(2, r, 3) for r in range(3)] == [(0, 1, 0, 2), (0, 1, 1, 2),
                                                        (1, 2, 1, 2)]
    assert [local_share(0, r, 3) for r in range(3)] == [(0, 0, 1, 1), (0, 0, 0, 1),
                                                        (0, 0, 0, 1)]


class _Gathering:
    """Stands in for one rank's exchanger: gathers packed rows with given others'."""

    def __init__(self, rank, others):
        self.rank, self.others = rank, others
        self.sent = None

    def allgather_rows(self, array):
        self.sent = array
        parts = list(self.others)
        parts.insert(self.rank, array)
        return np.concatenate(parts)


class _Session:
    size = 2

    def __init__(self, exchanger):
        self.exchanger = exchanger
        self.options = type("Options", (), {"outputs": "averaged"})()


def test_combined_values_are_those_of_the_whole_batch():
    from tmpi_adapters.core.combine import Combiner
    kinds = ["mean", "sum", "max", "min", "rows", "same", "rows"]
    axes = [0, 0, 0, 0, 0, 0, 1]
    data = np.random.RandomState(0).rand(7, 3)
    parts = [data[:3], data[3:]]
    active = [0, 1, 2, 3, 4, 6]   # "same" is left alone

    def values(part):
        return [part.mean(), np.int64((part > 0.5).sum()), part.max(), part.min(),
                part.argmax(axis=1), np.float64(2.5), part.T.copy()]
    # Rank 1 (rows 3..6) packs first; rank 0 then gathers both.
    second = _Gathering(1, [])
    Combiner(_Session(second), kinds, axes)._gathered(values(parts[1]), active, 4)
    first = _Gathering(0, [second.sent])
    combined = Combiner(_Session(first), kinds, axes)._gathered(values(parts[0]), active, 3)
    whole = values(data)
    for got, want in zip(combined, whole):
        assert np.asarray(got).dtype == np.asarray(want).dtype
        assert np.allclose(got, want)


def test_gradient_terms_every_rank_computes_alike_are_told_from_the_batchs():
    import theano
    import theano.tensor as T
    from theano.sandbox.rng_mrg import MRG_RandomStreams

    from tmpi_adapters.graphs.terms import Differs, alike_terms, split_terms
    x, y = T.dmatrix("x"), T.dvector("y")
    W = theano.shared(np.ones((3, 2)), name="W")
    decay = theano.shared(0.01, name="decay")
    noisy = W + MRG_RandomStreams(1).normal(W.shape, dtype="float64")
    cost = T.sqr(T.dot(x, W).sum(axis=1) - y).mean() + decay * T.sqr(W).sum()
    differs = Differs(alike=[W])
    varying, alike = split_terms(T.grad(cost, W), differs)
    assert len(varying) == 1 and not differs(alike[0])
    assert varying[0].owner.op.__class__.__name__ == "Dot"
    exchanged, added = alike_terms(T.grad(cost, W), differs)
    values = theano.function([x, y], [exchanged, added, T.grad(cost, W)])(
        np.arange(6.0).reshape(2, 3), np.ones(2))
    np.testing.assert_allclose(values[0] + values[1], values[2], rtol=1e-12)
    # A random draw differs between ranks, like the batch; a penalty alone is all alike.
    assert alike_terms(T.grad(cost + T.sqr(noisy).sum(), W), differs) is not None
    assert split_terms(T.grad(T.sqr(noisy).sum(), W), differs)[1] == []
    assert alike_terms(T.grad(decay * T.sqr(W).sum(), W), differs) is None
    assert not differs(decay * W) and differs(T.dot(x, W)) and differs(noisy)
    # A shared array that is not the model's might hold this rank's own data.
    rows = theano.shared(np.ones((4, 3)), name="rows")
    assert differs(T.dot(rows, W)) and not Differs(alike=[W, rows])(T.dot(rows, W))
