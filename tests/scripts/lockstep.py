"""A plain Theano script whose ranks leave lockstep, in the ways real scripts do.

``python lockstep.py MODE`` under ``tmpi wrap -n 2``; MODE is one of

swapped   two training functions of the same size, called A then B on rank 0
          and B then A on rank 1
uneven    each rank trains on its own shard, one batch longer on rank 0
break     rank 1 leaves the loop early (a per-rank condition)
exit      rank 1 calls sys.exit(0) in the middle of training
caught    rank 1's fifth call fails (a bad batch) and the script goes on
rows      rank 0 passes 32 rows per call, rank 1 16
eval      rank 0 alone calls a validation function (split across ranks by tmpi)
same      every rank does the same (the control: it must succeed)
"""
import sys

import numpy as np

import theano
import theano.tensor as T
from mpi4py import MPI

mode = sys.argv[1]
rank = MPI.COMM_WORLD.Get_rank()
rng = np.random.RandomState(0)
x, y = T.matrix("x"), T.vector("y")


def training_function(name):
    w = theano.shared(np.zeros(3), name="w_" + name)
    loss = T.sqr(T.dot(x, w) - y).mean()
    return theano.function([x, y], loss, updates=[(w, w - 0.1 * T.grad(loss, w))],
                           name=name)


A, B = training_function("A"), training_function("B")
data = rng.normal(size=(320, 3))
target = data.dot([1.0, -2.0, 0.5])


def batch(i, rows=32):
    lo = (i * rows) % 288
    return data[lo:lo + rows], target[lo:lo + rows]


if mode == "swapped":
    for i in range(6):
        first, second = (A, B) if rank == 0 else (B, A)
        first(*batch(i))
        second(*batch(i))
elif mode == "uneven":
    shard = range(rank, 10 + (rank == 0), 1)  # rank 0: 11 batches, rank 1: 9
    for i in shard:
        A(*batch(i))
elif mode == "break":
    for i in range(10):
        if rank == 1 and i == 4:
            break
        A(*batch(i))
elif mode == "exit":
    for i in range(10):
        if rank == 1 and i == 4:
            sys.exit(0)
        A(*batch(i))
elif mode == "caught":
    for i in range(10):
        xs, ys = batch(i)
        if rank == 1 and i == 4:
            xs = xs[:, :2]  # a bad batch: the wrong number of features
        try:
            A(xs, ys)
        except ValueError:
            print("rank %d: skipped a bad batch" % rank, file=sys.stderr)
elif mode == "rows":
    for i in range(4):
        A(*batch(i, rows=32 if rank == 0 else 16))
elif mode == "eval":
    w = theano.shared(np.zeros(3), name="w_eval")
    validate = theano.function([x, y], T.sqr(T.dot(x, w) - y).mean(), name="validate")
    for i in range(6):
        A(*batch(i))
        if rank == 0 and i == 2:
            print("validation", validate(*batch(9)))
elif mode == "same":
    for i in range(6):
        A(*batch(i))
        B(*batch(i))
    print("done")
else:
    sys.exit("unknown mode %r" % mode)
