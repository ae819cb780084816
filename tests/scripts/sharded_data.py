"""A script that shards its data itself: each rank loads its own rows, of
the same shapes.  ``sharded_data.py args|givens [same]``: batches passed as
arguments or sliced from a shared dataset by ``givens``; ``same`` loads the
same data on every rank."""
import os
import sys

import numpy as np
import theano
import theano.tensor as T

style = sys.argv[1]
rank = 0 if "same" in sys.argv[2:] else int(os.environ.get("PMI_RANK", "0"))
data = np.random.RandomState(100 + rank)
X = data.rand(64, 3)
Y = data.rand(64, 2)

W = theano.shared(np.zeros((3, 2)), name="W")
x, y = T.matrix("x"), T.matrix("y")
loss = T.sqr(T.dot(x, W) - y).mean()
updates = [(W, W - 0.1 * T.grad(loss, W))]
if style == "args":
    train = theano.function([x, y], loss, updates=updates, name="train")
    for epoch in range(2):
        for i in range(0, 64, 16):
            train(X[i:i + 16], Y[i:i + 16])
else:
    i = T.lscalar("i")
    sx, sy = theano.shared(X, name="sx"), theano.shared(Y, name="sy")
    train = theano.function([i], loss, updates=updates, name="train",
                            givens={x: sx[i * 16:(i + 1) * 16], y: sy[i * 16:(i + 1) * 16]})
    for epoch in range(2):
        for b in range(4):
            train(b)
print("final W", W.get_value().ravel().tolist())
