"""Rank 1 sleeps ``S`` seconds before each of its 40 steps (``straggler.py S``):
a straggler the others wait for at every exchange."""
import os
import sys
import time

import numpy as np
import theano
import theano.tensor as T

rank = int(os.environ.get("PMI_RANK", "0"))
x = T.matrix("x")
W = theano.shared(np.zeros((30, 20)), name="W")
loss = T.sqr(T.dot(x, W) - 1).mean()
train = theano.function([x], loss, updates=[(W, W - 0.01 * T.grad(loss, W))], name="train")
for step in range(40):
    if rank == 1:
        time.sleep(float(sys.argv[1]))
    train(np.ones((8, 30)))
