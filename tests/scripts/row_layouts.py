"""Steps whose batch is laid out or grouped other than one row per entry of axis 0.

    python row_layouts.py BATCH CASE ...

``pairs_minus_one``   ``h.reshape((-1, 2, d))``: consecutive rows paired, whatever a
                      rank's share (odd shares on 3 ranks of 128 rows);
``scan_rows_target``  a ``theano.scan`` over the batch's rows whose states meet a
                      per-row target;
``boolean_mask``      ``h[T.nonzero(w > 0)]``: the rows a mask keeps;
``features_first``    ``x`` of shape (features, batch), targets (classes, batch);
``repeat_draw``       ``T.repeat(h, 2, axis=0)`` and a draw shaped like it.
``tile_draw``         ``T.tile(h, (2, 1))`` (rows of every rank's share meet) and
                      a draw shaped like it.

Each prints ``final <case> <losses> <checksum of the parameters>``; N ranks
must print the one-process numbers.
"""
import sys

import numpy as np
import theano
import theano.tensor as T
from theano.sandbox.rng_mrg import MRG_RandomStreams

floatX = theano.config.floatX
B = int(sys.argv[1])
F, D, C = 5, 6, 3
CASES = ("pairs_minus_one", "scan_rows_target", "boolean_mask", "features_first",
         "repeat_draw", "tile_draw")


def shared(rng, *shape, name):
    return theano.shared((0.3 * rng.standard_normal(shape)).astype(floatX), name=name)


def features_first(W1, W2, xs, ys):
    xt, yt = T.matrix("xt"), T.matrix("yt")          # (F, batch), (C, batch)
    h = T.tanh(T.dot(W1.T, xt))                      # (D, batch)
    s = T.dot(W2.T, h)                               # (C, batch)
    p = T.exp(s) / T.exp(s).sum(axis=0)
    loss = -T.mean(T.sum(yt * T.log(p), axis=0))
    return [xt, yt], [xs.T.copy(), np.eye(C)[ys].T.astype(floatX).copy()], loss


def rows_first(name, W1, W2, x, y, inputs, args):
    h = T.tanh(T.dot(x, W1))
    p = T.nnet.softmax(T.dot(h, W2))
    nll = -T.log(p)[T.arange(y.shape[0]), y]
    if name == "pairs_minus_one":
        paired = h.reshape((-1, 2, D))
        return nll.mean() + T.mean((paired[:, 0] - paired[:, 1]) ** 2)
    if name == "scan_rows_target":
        out, _ = theano.scan(lambda row, acc: 0.5 * acc + row, sequences=h,
                             outputs_info=T.zeros((D,), dtype=floatX))
        return nll.mean() + T.mean((T.dot(out, W2) - T.eye(C)[y]) ** 2)
    if name == "boolean_mask":
        w = T.vector("w")
        inputs.append(w)
        args.append(np.where(np.arange(B) % 3 == 0, 0.0, 1.0).astype(floatX))
        return nll.mean() + T.mean(h[T.nonzero(w > 0)] ** 2)
    if name == "tile_draw":
        tiled = T.tile(h, (2, 1))
        noise = MRG_RandomStreams(7).normal(tiled.shape, dtype=floatX)
        return nll.mean() + T.mean((tiled + 0.1 * noise) ** 2)
    noise = MRG_RandomStreams(7).normal(T.repeat(h, 2, axis=0).shape, dtype=floatX)
    return nll.mean() + T.mean((T.repeat(h, 2, axis=0) + 0.1 * noise) ** 2)


def run(name):
    rng = np.random.RandomState(len(name))
    W1, W2 = shared(rng, F, D, name="W1"), shared(rng, D, C, name="W2")
    params = [W1, W2]
    xs = rng.standard_normal((B, F)).astype(floatX)
    ys = rng.randint(0, C, B).astype("int32")
    if name == "features_first":
        inputs, args, loss = features_first(W1, W2, xs, ys)
    else:
        x, y = T.matrix("x"), T.ivector("y")
        inputs, args = [x, y], [xs, ys]
        loss = rows_first(name, W1, W2, x, y, inputs, args)
    grads = T.grad(loss, params)
    train = theano.function(inputs, loss, on_unused_input="ignore",
                            updates=[(q, q - 0.2 * g) for q, g in zip(params, grads)])
    losses = [float(train(*args)) for _ in range(3)]
    print("final %s %s %.17g" % (name, " ".join("%.17g" % v for v in losses),
                                 sum(float(np.abs(q.get_value()).sum()) for q in params)))
    sys.stdout.flush()


if __name__ == "__main__":
    for case in sys.argv[2:] or CASES:
        run(case)
