"""Differentiates with respect to an input, not a shared variable: nothing to train."""
import numpy as np
import theano
import theano.tensor as T

x = T.vector("x")
cost = T.sqr(x).sum()
slope = theano.function([x], T.grad(cost, x))
print(slope(np.arange(3.0)))
