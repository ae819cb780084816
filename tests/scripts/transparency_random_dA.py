"""A denoising autoencoder in the style of the deeplearning.net tutorials
(dA.py): the input is corrupted by a random stream seeded from a fixed
RandomState, the dataset lives in a shared variable sliced through ``givens``
(or, with ``--style args``, batches are passed as arrays).

    python transparency_random_dA.py --streams mrg|shared --style givens|args
"""
import argparse

import numpy as np
import theano
import theano.tensor as T
from theano.sandbox.rng_mrg import MRG_RandomStreams
from theano.tensor.shared_randomstreams import RandomStreams

parser = argparse.ArgumentParser()
parser.add_argument("--streams", choices=("mrg", "shared"), default="mrg")
parser.add_argument("--style", choices=("givens", "args"), default="givens")
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=10)
args = parser.parse_args()

data = np.random.RandomState(0).rand(55, 12).astype(theano.config.floatX)  # last batch: 5 rows
numpy_rng = np.random.RandomState(123)
streams = (MRG_RandomStreams if args.streams == "mrg" else RandomStreams)(
    numpy_rng.randint(2 ** 30))

n_visible, n_hidden = 12, 6
W = theano.shared(np.asarray(numpy_rng.uniform(-0.5, 0.5, (n_visible, n_hidden)),
                             dtype=theano.config.floatX), name="W")
b = theano.shared(np.zeros(n_hidden, dtype=theano.config.floatX), name="b")
b_prime = theano.shared(np.zeros(n_visible, dtype=theano.config.floatX), name="b_prime")
params = [W, b, b_prime]

x = T.matrix("x")
# The tutorial's corruption: keep each entry with probability 1 - level.
tilde_x = streams.binomial(size=x.shape, n=1, p=0.7, dtype=theano.config.floatX) * x
# ...and a little Gaussian noise on the hidden units, shaped (rows, 1).
noise = streams.normal(size=(x.shape[0], 1), std=0.1, dtype=theano.config.floatX)
y = T.nnet.sigmoid(T.dot(tilde_x, W) + b) + noise
z = T.nnet.sigmoid(T.dot(y, W.T) + b_prime)
L = -T.sum(x * T.log(z) + (1 - x) * T.log(1 - z), axis=1)
cost = T.mean(L)
updates = [(p, p - 0.1 * g) for p, g in zip(params, T.grad(cost, params))]

B = args.batch_size
batches = [(i, i + B) for i in range(0, len(data), B)]
if args.style == "givens":
    train_set_x = theano.shared(data, borrow=True)
    index = T.lscalar()
    train = theano.function([index], cost, updates=updates,
                            givens={x: train_set_x[index * B:(index + 1) * B]})

    def step(k):
        return train(k)
else:
    train = theano.function([x], cost, updates=updates)

    def step(k):
        lo, hi = batches[k]
        return train(data[lo:hi])

for epoch in range(args.epochs):
    costs = [float(step(k)) for k in range(len(batches))]
    print("epoch %d cost %.10f" % (epoch, np.mean(costs)))
print("final cost %.17g" % np.mean(costs))
print("final params %s" % " ".join("%.17g" % float(np.abs(p.get_value()).sum())
                                   for p in params))
