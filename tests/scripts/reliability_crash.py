"""Trains a small model for many steps; rank 1 fails at a given step.

``reliability_crash.py raise STEP``   rank 1 raises an exception
``reliability_crash.py exit STEP``    rank 1 leaves with os._exit(0), skipping MPI's finalize
``reliability_crash.py sysexit STEP`` rank 1 ends its script with sys.exit(3)
``reliability_crash.py abort STEP``   rank 1 calls abort() (SIGABRT)
``reliability_crash.py shape STEP``   every rank passes a batch of the wrong width
"""
import os
import sys

import numpy as np
import theano
import theano.tensor as T

mode, fail_at = sys.argv[1], int(sys.argv[2])
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))

x = T.matrix("x")
W = theano.shared(np.zeros((3, 2)), name="W")
loss = T.sqr(T.dot(x, W) - 1).mean()
train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))], name="train")


def load_batch(step):
    if mode == "shape" and step == fail_at:
        return np.ones((4, 4))
    if rank == 1 and step == fail_at:
        if mode == "raise":
            raise ValueError("batch %d of rank 1 is unreadable" % step)
        if mode == "exit":
            os._exit(0)
        if mode == "sysexit":
            sys.exit(3)
        if mode == "abort":
            os.abort()
    return np.ones((4, 3))


for step in range(100000):
    train(load_batch(step))
