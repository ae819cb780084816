"""Writes what --all-ranks-output must keep whole and prefixed: long lines
(past mpiexec's 64 KiB pieces), bytes through sys.stdout.buffer, output of
C code (os.write on descriptor 1), and an unfinished last line; trains a few
steps so that the end-of-run summary follows."""
import os
import sys

import numpy as np
import theano
import theano.tensor as T

rank = int(os.environ.get("PMI_RANK", "0"))
x = T.matrix("x")
W = theano.shared(np.zeros((3, 2)), name="W")
loss = T.sqr(T.dot(x, W) - 1).mean()
train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))], name="train")
for step in range(4):
    train(np.ones((4, 3)))
for i in range(6):
    print(str(rank) * 100000)
sys.stdout.buffer.write(b"bytes of rank %d\n" % rank)
sys.stdout.flush()
os.write(1, b"fd 1 of rank %d\n" % rank)
print("unfinished", end="")
