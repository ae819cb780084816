"""What a split function returns is what one process returns.

Per-row values of a training step on a graph with random draws (the
tutorials' dA corrupts its input) come back as the one process's rows, in
their order, or with a warning where tmpi cannot tell; the means an
evaluation returns (the tutorials' validation error, which their early
stopping compares with ``<``) are the one-process floats, bit for bit, where
the ranks' sums add up exactly.  The multi-rank tests run real ``tmpi wrap``
jobs against plain ``python``; the others read graphs in this process.
"""
import sys

import numpy as np
import pytest

from conftest import SCRIPTS, assert_close, check, rank_env, run, tmpi

DA = SCRIPTS / "split_outputs_dA.py"
EVAL = SCRIPTS / "split_outputs_eval.py"


def env(floatx="float64", c_code=False):
    """float64 pure-Python Theano for these small graphs, or Theano's C code."""
    result = rank_env(floatx)
    if not c_code:
        result["THEANO_FLAGS"] += ",cxx="
    return result


def printed(stdout, prefix):
    """``{(function, call, label): rest of the line}`` of the lines starting with ``prefix``."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith(prefix + " "):
            words = line.split(" ", 4)
            found[tuple(words[1:4])] = words[4]
    assert found, stdout[-3000:]
    return found


def numbers(text):
    return [float(v) for v in text.split()]


# -- per-row values on graphs with random draws -----------------------------------------

@pytest.mark.mpi
@pytest.mark.parametrize("streams,style,ranks", [("mrg", "givens", 3), ("shared", "args", 2)])
def test_per_row_values_of_a_corrupted_batch_are_the_one_process_rows(streams, style, ranks):
    arguments = [DA, "--streams", streams, "--style", style]
    one = check(run([sys.executable] + arguments, env=env()))
    many = check(tmpi("wrap", "-n", str(ranks), *arguments, env=env()))
    expected, got = printed(one.stdout, "step"), printed(many.stdout, "step")
    assert sorted(got) == sorted(expected)
    for key, line in expected.items():
        shape, values = line.split(") ", 1)
        got_shape, got_values = got[key].split(") ", 1)
        assert got_shape == shape, (key, got[key], line)   # (10,) rows, not (10 / ranks,)
        if key[2] in ("row_sums", "row_means", "sorted_rows"):
            # Drawn and summed within each row: the same floats.
            assert got_values == values, (key, got[key], line)
        else:
            # Through a BLAS product of another number of rows, or a sum over rows.
            assert_close(numbers(got_values), numbers(values), 1e-12)
    # T.sort is an op the row analysis does not read as per row: the training
    # step sorts the gathered rows, as one process does, and returns them whole.
    assert "tmpi: warning: dA_" not in many.stderr, many.stderr[-3000:]


def _graph():
    import theano
    import theano.tensor as T
    from theano.sandbox.rng_mrg import MRG_RandomStreams
    from tmpi_adapters.frameworks.random_streams import RandomRows
    x = T.matrix("x")
    W = theano.shared(np.ones((4, 3)), name="W")
    # Drawn as tmpi draws on several ranks: for the whole batch, this rank's rows kept.
    mask = RandomRows().split(MRG_RandomStreams(1), "binomial",
                              (), {"size": x.shape, "p": 0.7, "dtype": "float64"}, False)
    tilde = mask * x
    hidden = T.nnet.sigmoid(T.dot(tilde, W))
    return x, W, tilde, hidden, T.sort(hidden, axis=1)


def _read(data, graph):
    """The row-wise marks of ``graph``, read as on more than one rank."""
    from tmpi_adapters.graphs.layout import Layout
    from tmpi_adapters.graphs.rows import Rows
    return Rows(Layout(data, graph, costs=[g for g in graph if g.ndim == 0]))


def test_a_draw_each_rank_keeps_its_rows_of_is_per_row():
    import theano.tensor as T
    from theano.sandbox.rng_mrg import MRG_RandomStreams
    from tmpi_adapters.graphs.outputs import UNDECIDED, classify
    x, W, tilde, hidden, _ = _graph()
    # A script's own pool of noise, sliced by the batch's length: every rank
    # would take the same rows of it, so its values are not read as per row.
    start = T.lscalar("start")
    pool = MRG_RandomStreams(2).uniform((100, 4))[start:start + x.shape[0]]
    outputs = {"rows": T.sum(tilde, axis=1), "row_max": hidden.max(axis=1),
               "row_mean": T.mean(T.sqr(x - tilde), axis=1), "sum": T.sum(tilde, axis=0),
               "mean": T.mean(hidden), "max": hidden.max(), "scaled": tilde / x.shape[0],
               "pool": T.sum(pool * x, axis=1)}
    rows = _read([x], list(outputs.values()))
    assert {name: classify(v, {x}, None, rows=rows) for name, v in outputs.items()} == \
        {"rows": "rows", "row_max": "rows", "row_mean": "rows", "sum": "sum",
         "mean": "mean", "max": "max", "scaled": UNDECIDED, "pool": UNDECIDED}


def test_a_value_the_graph_does_not_explain_is_not_called_a_sum_over_rows():
    import theano
    import theano.tensor as T
    from tmpi_adapters.graphs.outputs import UNDECIDED, classify
    from tmpi_adapters.frameworks.theano_split import row_axes
    x, W, tilde, hidden, unread = _graph()   # T.sort: its values are not read as rows
    cost = T.mean(T.sum(unread, axis=1))
    outputs = {"per_row": T.sum(unread, axis=1), "per_column": T.sum(unread, axis=0),
               "total": T.sum(unread), "transposed": unread.T, "gradient": theano.grad(cost, W)}
    rows = _read([x], list(outputs.values()) + [cost])
    kinds = {name: classify(v, {x}, "mean", rows=rows, strict=False)
             for name, v in outputs.items()}
    # Reduced over axis 1, a (batch, features) value keeps one value per row; the
    # fallback used to call any Sum a sum over the batch.
    assert kinds == {"per_row": UNDECIDED, "per_column": "sum", "total": "sum",
                     "transposed": UNDECIDED, "gradient": "mean"}
    assert row_axes(rows, list(outputs.values())) == [0, 0, 0, 1, 0]


# -- means of evaluations --------------------------------------------------------------

def test_the_means_of_a_split_batch_are_the_one_process_floats():
    import theano
    import theano.tensor as T
    from tmpi_adapters.graphs.outputs import classify, ratio_of
    x, y = T.matrix("x"), T.ivector("y")
    W = theano.shared(np.random.RandomState(0).standard_normal((5, 3)), name="W")
    p = T.nnet.softmax(T.dot(x, W))
    predicted = T.argmax(p, axis=1)
    outputs = [T.mean(T.neq(predicted, y)), T.mean(T.eq(predicted, y), dtype="float32"),
               T.mean(T.gt(x, 0.2), dtype="float32"), T.mean(T.gt(x, 0.2)),
               T.sum(T.neq(predicted, y) * y) / T.sum(y),       # weighted by the labels
               -T.mean(T.log(p)[T.arange(y.shape[0]), y])]     # not integer-valued
    rows = _read([x, y], outputs)
    ratios = [ratio_of(o, {x, y}, rows) for o in outputs]
    assert all(classify(o, {x, y}, None, rows=rows) == "mean" for o in outputs)
    assert all(r is not None for r in ratios)
    assert ratio_of(1 - outputs[0], {x, y}, rows) is None      # combined as a weighted mean
    whole = theano.function([x, y], outputs)
    parts = theano.function([x, y], [r.parts(o) for r, o in zip(ratios, outputs)])
    for r, o in zip(ratios, outputs):
        r.compile(o, theano.function, [None] * len(r.divisors(o)))
    rng = np.random.RandomState(1)
    for _ in range(300):
        n = rng.randint(1, 40)
        data, labels = rng.standard_normal((n, 5)), rng.randint(0, 3, n).astype("int32")
        cuts = np.sort(rng.randint(0, n + 1, rng.randint(1, 4)))
        shares = [(lo, hi) for lo, hi in zip([0] + list(cuts), list(cuts) + [n]) if hi > lo]
        pieces = [parts(data[lo:hi], labels[lo:hi]) for lo, hi in shares]
        expected = whole(data, labels)
        for k, (r, want) in enumerate(zip(ratios, expected)):
            got = r.combine([p[k] for p in pieces])
            assert got.dtype == want.dtype
            if k < 5:   # integer-valued terms: the same float (0 / 0 too)
                assert got == want or (np.isnan(got) and np.isnan(want)), (k, got, want)
            else:       # the ranks' sums rounded in another order
                assert abs(got - want) <= 1e-14 * abs(want), (k, got, want)


@pytest.mark.mpi
@pytest.mark.parametrize("ranks,floatx,c_code", [(2, "float32", True), (3, "float64", False)])
def test_validation_errors_are_the_one_process_floats(ranks, floatx, c_code):
    # 201 validation batches of 7 rows (4+3 on 2 ranks, 3+2+2 on 3), the last of 3;
    # with C code, 200 of a graph that writes the batch size in (one process
    # multiplies by 1/7);
    # then batches of 0 to 23 rows: padding rows, an empty batch's NaN.
    arguments = [EVAL] + (["--fixed"] if c_code else [])   # a convolution needs C
    one = check(run([sys.executable] + arguments, env=env(floatx, c_code)))
    many = check(tmpi("wrap", "-n", str(ranks), *arguments, env=env(floatx, c_code)))
    for name in ("validate", "validate_fixed", "evaluate"):
        assert "kind %s SplitFunction" % name in many.stdout
    expected, got = printed(one.stdout, "eval"), printed(many.stdout, "eval")
    assert sorted(got) == sorted(expected) and len(expected) == (521 if c_code else 321)
    for key, line in expected.items():
        if key[0].startswith("validate"):
            assert got[key] == line, (key, got[key], line)
            continue
        errors, nll, *exact = line.split()
        got_errors, got_nll, *got_exact = got[key].split()
        assert [got_errors] + got_exact == [errors] + exact, (key, got[key], line)
        # A mean of non-integer terms: the sum of the ranks' sums, not the one
        # process's sum in row order (an empty batch's is NaN).
        if nll == "nan":
            assert got_nll == "nan", (key, got[key], line)
        else:
            assert_close([float(got_nll)], [float(nll)], 32 * np.finfo(floatx).eps)


@pytest.mark.mpi
def test_an_input_that_is_not_the_batch_is_whole_whatever_its_length():
    script = SCRIPTS / "other_length_eval.py"
    one = check(run([sys.executable, script], env=env())).stdout.splitlines()
    assert len(one) == 4 and all(line.startswith("final f") for line in one)
    three = check(tmpi("wrap", "-n", "3", "--framework", "theano", script, env=env()))
    assert [line for line in three.stdout.splitlines() if line.startswith("final")] == one
