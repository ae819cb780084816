"""As a test runner does: a step on batches the ranks drew from generators
that went apart fails, the script catches the error and goes on, drawing its
next batches from numpy's global generator."""
import os

import numpy as np
import theano
import theano.tensor as T

from tmpi_adapters import LockstepError

np.random.seed(int(os.environ.get("PMI_RANK", "0")))  # apart, as threads leave them
W = theano.shared(np.zeros((3, 2)), name="W")
x, y = T.matrix("x"), T.matrix("y")
loss = T.sqr(T.dot(x, W) - y).mean()
train = theano.function([x, y], loss, updates=[(W, W - 0.1 * T.grad(loss, W))], name="train")
try:
    train(np.random.rand(16, 3), np.random.rand(16, 2))
except LockstepError as error:
    print("caught:", str(error)[:60])
for step in range(4):
    last = train(np.random.rand(16, 3), np.random.rand(16, 2))
print("final loss %.17g" % last)
