"""Graphs whose sizes coincide with the batch size, or with a rank's share of it.

    python batch_coincidence.py BATCH [CASE ...]

Each case builds a small model whose feature sizes, reshape targets, constant
tensors (``zeros``, ``ones``, ``arange``, ``tile``), sequence lengths and scan
states are ``BATCH``, a share of it (``BATCH // 2``, ``BATCH // 3``) or a
multiple of it, trains it for three steps of SGD on float64 batches of
``BATCH`` rows, and prints ``final <case> <losses> <norm>``, or
``error <case> <message>`` where the step raised.  Some cases write the batch
size in for real (``zeros((BATCH, n))``): one process trains them, N ranks
must stop with a clear error; every other case must give the one-process
numbers on any number of ranks.
"""
import sys

import numpy as np
import theano
import theano.tensor as T

B = int(sys.argv[1])
HALF, THIRD = B // 2, max(1, B // 3)
floatX = theano.config.floatX


def weights(rng, *shape):
    return theano.shared((0.3 * rng.standard_normal(shape)).astype(floatX), name="W")


def dense(features, width, seed):
    """``x`` (B, features), ``W`` (features, width) and ``h = tanh(x W)``."""
    rng = np.random.RandomState(seed)
    x = T.matrix("x")
    W = weights(rng, features, width)
    return rng, x, W, T.tanh(T.dot(x, W))


def peak(h):
    return T.mean(T.max(h, axis=1) ** 2)


# Each case: (inputs, loss, params, batches) where batches makes the arrays of step k.
def case_reshape_minus_one(seed):
    rng, x, W, h = dense(5, 2 * B, seed)                  # the script, in small
    return [x], peak(h.reshape((-1, B))), [W], rows(rng, 5)


def case_reshape_constant_features(seed):
    rng, x, W, h = dense(5, 2 * B, seed)                  # (B, 2B) as (2B, B): rows halved
    return [x], peak(h.reshape((2 * B, B))), [W], rows(rng, 5)


def case_reshape_share_width(seed):
    rng, x, W, h = dense(4, 2 * HALF, seed)               # a width equal to a share
    return [x], peak(h.reshape((-1, HALF))), [W], rows(rng, 4)


def case_reshape_batch_first(seed):
    rng, x, W, h = dense(3, B, seed)                      # the batch written in, for real
    return [x], peak(T.sum(h.reshape((B, HALF, B // HALF)), axis=2)), [W], rows(rng, 3)


def case_reshape_rows_merged(seed):
    rng, x, W, h = dense(3, B, seed)                      # two rows per entry
    return [x], peak(h.reshape((HALF, -1))) if B % 2 == 0 else peak(h), [W], rows(rng, 3)


def case_reshape_transposed(seed):
    rng, x, W, h = dense(4, THIRD, seed)                  # (features, batch) flattened
    flat = h.T.reshape((THIRD * B,))
    return [x], T.mean(flat ** 2) + T.mean(T.max(flat.reshape((THIRD, -1)), axis=0)), [W], \
        rows(rng, 4)


def case_reshape_chain(seed):
    rng, x, W, h = dense(4, 2 * B, seed)
    again = h.reshape((B, 2, B)).reshape((B, 2 * B)).reshape((4 * B, HALF if B % 2 == 0 else B))
    return [x], peak(again), [W], rows(rng, 4)


def case_reshape_of_x_shape(seed):
    rng, x, W, h = dense(3, 2 * B, seed)
    return [x], peak(h.reshape((x.shape[0] * 2, B))), [W], rows(rng, 3)


def case_ones_on_features(seed):
    rng, x, W, h = dense(3, B, seed)
    return [x], T.mean((h + 0.5 * T.ones((B,))) ** 2), [W], rows(rng, 3)


def case_zeros_of_the_batch(seed):
    rng, x, W, h = dense(3, 4, seed)                      # writes the batch size in
    return [x], T.mean((h + T.zeros((B, 4))) ** 2), [W], rows(rng, 3)


def case_arange_on_features(seed):
    rng, x, W, h = dense(3, B, seed)
    return [x], T.mean(h * T.arange(B) / B), [W], rows(rng, 3)


def case_arange_of_the_batch(seed):
    rng, x, W, h = dense(3, B, seed)                      # writes the batch size in
    y = T.ivector("y")
    probs = T.nnet.softmax(h)
    loss = -T.mean(T.log(probs)[T.arange(B), y])
    return [x, y], loss, [W], lambda k: [data(rng, 3)(k), labels(rng, B)(k)]


def case_arange_of_x_shape(seed):
    rng, x, W, h = dense(3, B, seed)
    y = T.ivector("y")
    probs = T.nnet.softmax(h)
    loss = -T.mean(T.log(probs)[T.arange(x.shape[0]), y])
    return [x, y], loss, [W], lambda k: [data(rng, 3)(k), labels(rng, B)(k)]


def case_repeat_rows(seed):
    rng, x, W, h = dense(3, B, seed)
    return [x], peak(T.repeat(h, 2, axis=0)), [W], rows(rng, 3)


def case_tile_on_features(seed):
    rng, x, W, h = dense(3, B, seed)
    v = weights(rng, 1)
    return [x], T.mean((h + T.tile(v, (B,))) ** 2), [W, v], rows(rng, 3)


def case_tile_of_the_batch(seed):
    rng, x, W, h = dense(3, THIRD, seed)                  # writes the batch size in
    v = weights(rng, THIRD)
    return [x], T.mean((h + T.tile(v.dimshuffle("x", 0), (B, 1))) ** 2), [W, v], rows(rng, 3)


def recurrent(seed, state):
    """A scan over a sequence of ``B`` steps with a state of width ``B``."""
    rng = np.random.RandomState(seed)
    x = T.tensor3("x")                                    # (batch, time, features)
    W, U = weights(rng, 3, B), weights(rng, B, B)
    steps = x.dimshuffle(1, 0, 2)
    out, _ = theano.scan(lambda s, h: T.tanh(T.dot(s, W) + T.dot(h, U)),
                         sequences=steps, outputs_info=state(x))
    return [x], T.mean(out[-1] ** 2) + T.mean(out ** 2), [W, U], \
        lambda k: [rng.standard_normal((B, B, 3)).astype(floatX)]


def case_scan_state_of_x_shape(seed):
    return recurrent(seed, lambda x: T.zeros((x.shape[0], B)))


def case_scan_state_of_the_batch(seed):
    return recurrent(seed, lambda x: T.zeros((B, B)))     # writes the batch size in


def case_shape_arithmetic(seed):
    rng, x, W, h = dense(3, B, seed)
    count = T.cast(x.shape[0] * h.shape[1], floatX)
    return [x], T.sum(h ** 2) / count + T.sum(T.max(h, axis=1)) / x.shape[0], [W], rows(rng, 3)


def data(rng, features):
    draws = [rng.standard_normal((B, features)).astype(floatX) for _ in range(3)]
    return lambda k: draws[k]


def labels(rng, classes):
    draws = [rng.randint(0, classes, B).astype("int32") for _ in range(3)]
    return lambda k: draws[k]


def rows(rng, features):
    make = data(rng, features)
    return lambda k: [make(k)]


CASES = {name[len("case_"):]: f for name, f in sorted(globals().items())
         if name.startswith("case_")}


def run(name, seed):
    inputs, loss, params, batches = CASES[name](seed)
    train = theano.function(inputs, loss, updates=[(p, p - 0.3 * g) for p, g in
                                                   zip(params, T.grad(loss, params))])
    losses = []
    try:
        for k in range(3):
            losses.append(float(train(*batches(k))))
    except Exception as error:  # noqa: BLE001 - the error is the case's result
        print("error %s %s" % (name, str(error).splitlines()[0]))
        return
    norm = sum(float(np.abs(p.get_value()).sum()) for p in params)
    print("final %s %s %.17g" % (name, " ".join("%.17g" % v for v in losses), norm))


if __name__ == "__main__":
    for seed, name in enumerate(sys.argv[2:] or CASES):
        run(name, seed)
    sys.stdout.flush()
