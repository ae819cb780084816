"""A script that changes one rank's parameters behind tmpi's back.

    python drift.py STEPS [together]

A small softmax regression trained for STEPS calls; after the third call
the rank the MPI launcher numbers 1 scales its ``b`` by 1.01 with
``set_value`` (as a script reading a rank-local value would), unless told
``together``: its model is no
longer the others'.
"""
import os
import sys

import numpy as np
import theano
import theano.tensor as T

rng = np.random.RandomState(0)
x, y = T.matrix("x"), T.ivector("y")
W = theano.shared(0.1 * rng.standard_normal((5, 3)), name="W")
b = theano.shared(np.zeros(3), name="b")
p = T.nnet.softmax(T.dot(x, W) + b)
loss = -T.mean(T.log(p)[T.arange(y.shape[0]), y])
train = theano.function([x, y], loss, updates=[(v, v - 0.5 * g) for v, g in
                                                zip([W, b], T.grad(loss, [W, b]))])
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
for step in range(int(sys.argv[1])):
    train(rng.standard_normal((12, 5)), rng.randint(0, 3, 12).astype("int32"))
    if step == 2 and rank == 1 and len(sys.argv) < 3:
        b.set_value(b.get_value() * 1.01 + 0.01)
print("final b %s" % " ".join("%.17g" % v for v in b.get_value()))
