"""A model whose parameter names depend on the rank, shapes and dtypes alike:
``counter`` names them ``W_1`` and ``W_2`` (a counter that ran ahead on one
rank, as Keras' and Theano's do), ``other`` names them ``W_hidden`` and
``W_output`` (two different models).

    python signature_names.py counter|other
"""
import os
import sys

import numpy as np
import theano
import theano.tensor as T

rank = int(os.environ.get("PMI_RANK", "0"))
names = {"counter": ("W_1", "W_2"), "other": ("W_hidden", "W_output")}[sys.argv[1]]
rng = np.random.RandomState(0)
xs = rng.uniform(-1, 1, (40, 3))
x = T.matrix("x")
W = theano.shared(np.full((3, 4), 0.5), name=names[rank % 2])
loss = T.sqr(T.dot(x, W) - 1).mean()
train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
for i in range(0, 40, 10):
    train(xs[i:i + 10])
print("final W %s" % " ".join("%.17g" % v for v in W.get_value().ravel()))
