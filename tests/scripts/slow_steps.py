"""150 steps of 20 ms each (a sleep before every step), with a named loss."""
import time

import numpy as np
import theano
import theano.tensor as T

x = T.matrix("x")
W = theano.shared(np.zeros((30, 20)), name="W")
loss = T.sqr(T.dot(x, W) - 1).mean()
loss.name = "loss"
train = theano.function([x], loss, updates=[(W, W - 0.01 * T.grad(loss, W))], name="train")
for step in range(150):
    time.sleep(0.02)
    train(np.ones((8, 30)))
