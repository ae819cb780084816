"""Graphs that write the batch size in, as the Theano tutorials' LeNet does.

    python transparency_fixed.py conv|reshape|merged

``conv``       the LeNet pattern in small: datasets in shared variables sliced
               through ``givens``, ``x.reshape((batch_size, 1, 8, 8))``, a
               ``conv2d`` told ``input_shape=(batch_size, 1, 8, 8)``, max
               pooling, a softmax layer; a validation function on the same graph;
``reshape``    numpy minibatches and ``x.reshape((batch_size, 4, 4))`` only (no
               declared input shape: the batch size is the first call's);
``merged``     a reshape to ``(2, 4, 4, 4)`` with batch size 4: each entry of axis 0
               holds two rows (2 ranks run one entry each; on 3 ranks a share of
               one row cannot follow it: a clear error).

Prints ``final <mode>_<what> ...`` lines with 17 significant digits.
"""
import sys

import numpy as np
import theano
import theano.tensor as T
from theano.tensor.nnet import conv2d
from theano.tensor.signal import pool

floatX = theano.config.floatX
rng = np.random.RandomState(5)


def shared(*shape, name=None):
    return theano.shared((0.3 * rng.standard_normal(shape)).astype(floatX), name=name)


def norms(params):
    return " ".join("%.17g" % np.linalg.norm(p.get_value()) for p in params)


def sgd(cost, params, lr=0.2):
    return [(p, p - lr * g) for p, g in zip(params, T.grad(cost, params))]


def conv(batch_size=10):
    data_x = theano.shared(rng.standard_normal((40, 64)).astype(floatX))
    data_y = theano.shared(rng.randint(0, 3, 40).astype("int32"))
    index = T.lscalar()
    x, y = T.matrix("x"), T.ivector("y")
    W_conv, W_out = shared(2, 1, 3, 3, name="W_conv"), shared(2 * 3 * 3, 3, name="W_out")
    image = x.reshape((batch_size, 1, 8, 8))
    maps = T.tanh(conv2d(image, W_conv, filter_shape=(2, 1, 3, 3),
                         input_shape=(batch_size, 1, 8, 8)))
    pooled = pool.pool_2d(maps, ws=(2, 2), ignore_border=True)
    probs = T.nnet.softmax(T.dot(pooled.flatten(2), W_out))
    cost = -T.mean(T.log(probs)[T.arange(y.shape[0]), y])
    errors = T.mean(T.neq(T.argmax(probs, axis=1), y))
    params = [W_conv, W_out]
    givens = {x: data_x[index * batch_size:(index + 1) * batch_size],
              y: data_y[index * batch_size:(index + 1) * batch_size]}
    train = theano.function([index], cost, updates=sgd(cost, params), givens=givens)
    validate = theano.function([index], errors, givens=givens)
    print("kind validate %s" % type(validate).__name__)
    for epoch in range(2):
        costs = [train(i) for i in range(4)]
    print("final conv_cost %.17g %.17g" % (costs[0], costs[-1]))
    print("final conv_errors %.17g" % np.mean([validate(i) for i in range(4)]))
    print("final conv_norms %s" % norms(params))


def reshape(batch_size=8):
    data = rng.standard_normal((32, 16)).astype(floatX)
    labels = rng.randint(0, 3, 32).astype("int32")
    x, y = T.matrix("x"), T.ivector("y")
    W, V = shared(4, 5, name="W"), shared(20, 3, name="V")
    hidden = T.tanh(T.dot(x.reshape((batch_size, 4, 4)), W))   # (batch, 4, 5)
    probs = T.nnet.softmax(T.dot(hidden.reshape((batch_size, 20)), V))
    cost = T.nnet.categorical_crossentropy(probs, y).mean()
    train = theano.function([x, y], cost, updates=sgd(cost, [W, V]))
    costs = [train(data[i:i + batch_size], labels[i:i + batch_size])
             for i in range(0, 32, batch_size)]
    print("final reshape_cost %.17g %.17g" % (costs[0], costs[-1]))
    print("final reshape_norms %s" % norms([W, V]))


def merged():
    data = rng.standard_normal((4, 32)).astype(floatX)
    x = T.matrix("x")
    W = shared(4, 3, name="W")
    cost = T.sqr(T.dot(x.reshape((2, 4, 4, 4)), W)).mean()
    train = theano.function([x], cost, updates=sgd(cost, [W]))
    print("final merged_cost %.17g" % train(data))
    print("final merged_norms %s" % norms([W]))


if __name__ == "__main__":
    {"conv": conv, "reshape": reshape, "merged": merged}[sys.argv[1]]()
