"""A script whose ranks fall out of step: a stall for tmpi's watchdog to report.

``reliability_stall.py rank0-validates SECONDS``
    after 5 steps rank 0 alone "validates" for SECONDS (a Python loop, as a
    validation pass over batches would be) while the others go on training.
``reliability_stall.py uneven``
    rank 1 has fewer batches than rank 0 and finishes the loop early.
"""
import os
import sys
import time

import numpy as np
import theano
import theano.tensor as T
from mpi4py import MPI

rank = int(os.environ.get("PMI_RANK", "0"))
mode = sys.argv[1]

x = T.matrix("x")
W = theano.shared(np.zeros((3, 2)), name="W")
loss = T.sqr(T.dot(x, W) - 1).mean()
train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))], name="train")


def validate_on_rank0_only(seconds):
    end = time.time() + seconds
    while time.time() < end:
        time.sleep(0.01)


# Start together: compiling may take one rank much longer than the other on a
# loaded machine, and this test's stall timeout is short.
MPI.COMM_WORLD.Barrier()
batches = 12 if mode == "uneven" and rank == 1 else 20
for step in range(batches):
    train(np.ones((4, 3)))
    if mode == "rank0-validates" and step == 4 and rank == 0:
        validate_on_rank0_only(float(sys.argv[2]))
print("final W %.17g" % np.linalg.norm(W.get_value()))
