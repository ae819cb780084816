"""Builds a model whose hidden width depends on the rank: a signature mismatch."""
import os

import numpy as np
import theano
import theano.tensor as T

width = 5 + int(os.environ.get("PMI_RANK", "0"))
x = T.matrix("x")
W = theano.shared(np.zeros((3, width)), name="W_hidden")
loss = T.sqr(T.dot(x, W)).mean()
train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
train(np.ones((4, 3)))
