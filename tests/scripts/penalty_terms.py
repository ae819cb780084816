"""An MLP whose cost adds L2 and L1 weight penalties to the data's loss, and a
parameter that only a penalty uses.

``--reduction mean`` (default): the loss is a mean over the batch;
``--reduction sum``: a sum, as a script run with ``--loss-reduction sum``
writes it.  Trains 8 SGD steps of 12 rows on fixed data and prints
``final params`` (the sum of every parameter's magnitudes and of its squares) and ``final cost``.
"""
import argparse

import numpy as np
import theano
import theano.tensor as T

parser = argparse.ArgumentParser()
parser.add_argument("--reduction", choices=("mean", "sum"), default="mean")
args = parser.parse_args()

rng = np.random.RandomState(3)
x_data = rng.normal(size=(96, 7))
y_data = rng.randint(0, 3, size=96).astype("int32")
W1 = theano.shared(rng.normal(scale=0.3, size=(7, 5)), name="W1")
b1 = theano.shared(np.zeros(5), name="b1")
W2 = theano.shared(rng.normal(scale=0.3, size=(5, 3)), name="W2")
b2 = theano.shared(np.zeros(3), name="b2")
scale = theano.shared(np.ones(5), name="scale")
anchor = theano.shared(np.zeros(4), name="anchor")  # in the penalty only
x, y = T.dmatrix("x"), T.ivector("y")
hidden = T.tanh(T.dot(x, W1) + b1) * scale
probs = T.nnet.softmax(T.dot(hidden, W2) + b2)
losses = -T.log(probs)[T.arange(y.shape[0]), y]
loss = losses.sum() if args.reduction == "sum" else losses.mean()
penalty = 1e-2 * ((W1 ** 2).sum() + (W2 ** 2).sum() + ((scale - 1) ** 2).sum()) \
    + 1e-3 * abs(W1).sum() + ((anchor - 1) ** 2).sum()
cost = loss + penalty
params = [W1, b1, W2, b2, scale, anchor]
lr = 0.01 if args.reduction == "sum" else 0.1
train = theano.function([x, y], cost, updates=[(p, p - lr * g)
                                               for p, g in zip(params, T.grad(cost, params))])
for step in range(8):
    rows = slice(12 * step, 12 * (step + 1))
    value = train(x_data[rows], y_data[rows])
print("final cost %.15e" % value)
print("final params " + " ".join("%.15e %.15e" % (abs(p.get_value()).sum(),
                                                  (p.get_value() ** 2).sum()) for p in params))
