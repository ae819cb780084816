"""Rank 1 is held before the first compile; the others compile and train.

``reliability_before_compile.py stdin``   rank 1 reads standard input (input())
``reliability_before_compile.py sleep S`` rank 1 sleeps S seconds
``reliability_before_compile.py chdir DIR`` every rank moves to DIR first, then trains 6 steps
"""
import os
import sys
import time

import numpy as np
import theano
import theano.tensor as T

rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
if sys.argv[1] == "chdir":
    os.chdir(sys.argv[2])
elif rank == 1 and sys.argv[1] == "stdin":
    answer = input("learning rate? ")
elif rank == 1 and sys.argv[1] == "sleep":
    time.sleep(float(sys.argv[2]))

x = T.matrix("x")
W = theano.shared(np.zeros((3, 2)), name="W")
loss = T.sqr(T.dot(x, W) - 1).mean()
train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))], name="train")
for step in range(6):
    train(np.ones((4, 3)))
print("trained in", os.getcwd())
