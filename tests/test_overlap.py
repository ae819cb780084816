"""``--overlap``: the step's exchange in parts, each started during backpropagation.

Real ranks under real ``mpiexec`` run real Theano, Lasagne and Keras 2.3.1
scripts.  The parts must change *when* gradients travel, never what a step
computes: every run is compared with the same job without ``--overlap``
(on 2 ranks every sum has two terms: equal to the last bit) and with one rank.
"""
import re

import pytest

from conftest import SCRIPTS, assert_close, check, final_numbers, rank_env, tmpi

ORDER = SCRIPTS / "overlap_order.py"
#: Every parameter of overlap_order.py in a part of its own.
ONE_EACH = ["--overlap", "--bucket-bytes", "8"]


def events(result):
    """The last step's events (rank 0): Mark ops, starts and the finish."""
    return re.findall(r"^order (.*)$", result.stdout, re.MULTILINE)[-1].split()


def numbers(result):
    return final_numbers(result.stdout, "cost") + final_numbers(result.stdout, "params")


@pytest.fixture(scope="module")
def fused_two_ranks():
    return check(tmpi("wrap", "-n", "2", ORDER))


@pytest.mark.mpi
def test_each_part_starts_as_soon_as_backpropagation_has_computed_it(fused_two_ranks):
    result = check(tmpi("wrap", "-n", "2", *ONE_EACH, ORDER))
    order = events(result)
    # 8 parameters, one part each, filled from the last layer back.
    starts = [e for e in order if e.startswith("start")]
    assert starts == ["start%d" % k for k in range(8)], order
    # The last layer's parts travel while the first layers still backpropagate...
    assert order.index("start0") < order.index("backward3") < order.index("backward2") \
        < order.index("backward1") < order.index("start7"), order
    # ...and they are waited for once, after every part has started.
    assert order[-1] == "finish" and order.count("finish") == 1, order
    # The exchange in 8 parts, and one gather: Mark is an op tmpi does not read,
    # so the rows it is given are gathered first (the one-process result).
    assert "9 collectives per step (train_fn#0: the exchange + 1 where the batch's rows " \
        "meet" in result.stdout, result.stdout
    # The same step as one fused exchange, to the last bit.
    assert numbers(result) == numbers(fused_two_ranks)
    # Without --overlap the exchange is one collective after backpropagation.
    assert not any(e.startswith("start") for e in events(fused_two_ranks))
    assert "2 collectives per step (train_fn#0: the exchange + 1 where" in \
        fused_two_ranks.stdout, fused_two_ranks.stdout


@pytest.mark.mpi
def test_overlapped_parts_reproduce_one_process_on_three_ranks():
    one = numbers(check(tmpi("wrap", "-n", "1", ORDER)))
    # 16 rows per step split 6/5/5: uneven weights in every part; the
    # default 4 MiB makes one part, three parameters' worth of bytes three.
    for options in (["--overlap"], ["--overlap", "--bucket-bytes", "10000"]):
        assert_close(numbers(check(tmpi("wrap", "-n", "3", *options, ORDER))), one, 1e-12)


@pytest.mark.mpi
def test_fp16_transfer_in_parts_sums_as_the_fused_exchange():
    # fp16 codes are reduced by tmpi itself (reduce-scatter, then allgather):
    # in parts, each part's second half starts when its first has ended.
    fused = check(tmpi("wrap", "-n", "2", "--precision", "fp16", ORDER))
    parts = check(tmpi("wrap", "-n", "2", "--precision", "fp16", *ONE_EACH, ORDER))
    assert numbers(parts) == numbers(fused)


@pytest.mark.mpi
def test_lasagne_and_keras_scripts_train_alike_with_and_without_overlap():
    lasagne = SCRIPTS / "lasagne_mnist.py"
    plain = check(tmpi("wrap", "-n", "2", lasagne, "mlp", "1"))
    parts = check(tmpi("wrap", "-n", "2", "--overlap", "--bucket-bytes", "1000", lasagne,
                       "mlp", "1"))
    for key in ("train", "norms"):
        assert final_numbers(parts.stdout, key) == final_numbers(plain.stdout, key)
    assert "1 collective per step" not in parts.stdout
    keras = [SCRIPTS / "keras_mlp.py", "--floatx", "float64", "--batch-size", "61",
             "--cases", "sgd-fit,train-on-batch", "--epochs", "2"]
    env = rank_env("float64", KERAS_BACKEND="theano")
    plain = check(tmpi("wrap", "-n", "2", *keras, env=env))
    parts = check(tmpi("wrap", "-n", "2", "--overlap", "--bucket-bytes", "1000", *keras,
                       env=env))
    for case in ("sgd-fit", "train-on-batch"):
        for part in ("history", "evaluate", "weights"):
            key = "%s %s" % (case, part)
            assert final_numbers(parts.stdout, key) == final_numbers(plain.stdout, key), key


@pytest.mark.mpi
def test_overlap_with_a_rule_that_has_nothing_to_overlap_is_a_clear_error():
    result = tmpi("wrap", "-n", "2", "--overlap", "--rule-option", "mode=avg", ORDER)
    assert result.returncode != 0
    assert "--overlap splits the exchange of gradients" in result.stderr, result.stderr
    assert "exchanges parameters between steps, not gradients" in result.stderr
    assert "drop --overlap" in result.stderr and "Traceback" not in result.stderr
