"""A plain Theano script that writes its results as scripts do: the weights
after every epoch (``every.npy``), the best weights by validation loss
(``best.npy``) and, when it ends, the final weights (``final.npy``), all in
OUT_DIR, and prints the final bias.  With ``STOP_AFTER_EPOCH=K`` in its
environment it stops after epoch K's files (``sys.exit(3)``), as a job that
was ended there.

    python reliability_files.py OUT_DIR [--epochs N]
"""
import argparse
import os
import sys

import numpy as np
import theano
import theano.tensor as T

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=6)
args = parser.parse_args()
stop = int(os.environ.get("STOP_AFTER_EPOCH", "-1"))

rng = np.random.RandomState(0)
xs = rng.uniform(-1, 1, (200, 8))
ys = (xs[:, :4].sum(axis=1) > 0).astype("int32")
W = theano.shared(rng.normal(0, 0.3, (8, 2)), name="W")
b = theano.shared(np.zeros(2), name="b")
x, y = T.matrix("x"), T.ivector("y")
probs = T.nnet.softmax(T.dot(x, W) + b)
loss = T.nnet.categorical_crossentropy(probs, y).mean()
train = theano.function([x, y], loss, updates=[
    (p, p - 0.5 * g) for p, g in zip([W, b], T.grad(loss, [W, b]))], name="train")
validate = theano.function([x, y], loss, name="validate")


def save(name):
    np.save(os.path.join(args.out, name), np.concatenate([W.get_value().ravel(),
                                                          b.get_value()]))


best = np.inf
for epoch in range(args.epochs):
    order = np.random.permutation(150)
    for i in range(0, 150, 25):
        train(xs[order[i:i + 25]], ys[order[i:i + 25]])
    val = float(validate(xs[150:], ys[150:]))
    save("every.npy")
    if val < best:
        best = val
        save("best.npy")
    print("epoch %d val %.17g" % (epoch, val))
    if epoch == stop:
        sys.exit(3)
save("final.npy")
print("final b %.17g %.17g" % tuple(b.get_value()))
