"""A script with options of its own that tmpi has too, saying how it was started.

Trains a one-layer least-squares model with plain SGD for ``-n`` steps, prints
``probe {json}`` (its arguments, ``sys.path``, the BLAS thread variables it
sees) and exits with ``--exit``.  ``--forever`` trains on until it is stopped,
after printing ``started``.
"""
import argparse
import json
import os
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("-n", "--num-epochs", type=int, default=2)
parser.add_argument("--seed", type=int, default=0)
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--forever", action="store_true")
args = parser.parse_args()

import numpy as np  # noqa: E402 - after the arguments: --help needs no Theano
import theano  # noqa: E402
import theano.tensor as T  # noqa: E402

rng = np.random.RandomState(args.seed)
x_data = rng.normal(size=(8, 3))
y_data = x_data.dot([1.0, -2.0, 0.5])
W = theano.shared(np.zeros(3), name="W")
x, y = T.dmatrix("x"), T.dvector("y")
loss = T.sqr(T.dot(x, W) - y).mean()
train = theano.function([x, y], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
for epoch in range(args.num_epochs):
    train(x_data, y_data)
if args.forever:
    print("started", flush=True)
    while True:
        train(x_data, y_data)
        time.sleep(0.01)
print("probe " + json.dumps({
    "argv": sys.argv[1:], "path": sys.path,
    "threads": {name: os.environ.get(name) for name in ("OMP_NUM_THREADS",
                                                         "OPENBLAS_NUM_THREADS")},
    "W": W.get_value().tolist()}), flush=True)
sys.exit(args.exit)
