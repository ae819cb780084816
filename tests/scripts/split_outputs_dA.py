"""A denoising autoencoder whose training function returns per-row values.

The tutorials' dA corrupts its input with a random stream; this one also
returns what a script might print or keep per example: the corrupted
input's row sums and means (``T.sum(tilde_x, axis=1)``), the per-row
reconstruction costs and errors, the column sums (a sum over rows) and,
from a second training function, the corrupted input sorted along each row
(``T.sort``, an op tmpi does not read: its rows come back with a warning).

    python split_outputs_dA.py --streams mrg|shared --style givens|args

Prints ``step <function> <call> <label> <shape> <values>`` (``repr`` of each
value) for every returned value of every call.
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
args = parser.parse_args()

floatX = theano.config.floatX
data = np.random.RandomState(0).rand(55, 12).astype(floatX)  # batches of 10, the last of 5
numpy_rng = np.random.RandomState(123)
streams = (MRG_RandomStreams if args.streams == "mrg" else RandomStreams)(
    numpy_rng.randint(2 ** 30))

W = theano.shared(numpy_rng.uniform(-0.5, 0.5, (12, 6)).astype(floatX), name="W")
b = theano.shared(np.zeros(6, dtype=floatX), name="b")
b_prime = theano.shared(np.zeros(12, dtype=floatX), name="b_prime")
params = [W, b, b_prime]

x = T.matrix("x")
tilde_x = streams.binomial(size=x.shape, n=1, p=0.7, dtype=floatX) * x
hidden = T.nnet.sigmoid(T.dot(tilde_x, W) + b)
z = T.nnet.sigmoid(T.dot(hidden, W.T) + b_prime)
L = -T.sum(x * T.log(z) + (1 - x) * T.log(1 - z), axis=1)
cost = T.mean(L)
outputs = [("cost", cost), ("row_sums", T.sum(tilde_x, axis=1)),
           ("row_means", T.mean(tilde_x, axis=1)), ("row_costs", L),
           ("row_errors", T.mean(T.sqr(x - z), axis=1)), ("row_max", T.max(hidden, axis=1)),
           ("column_sums", T.sum(tilde_x, axis=0))]
sorted_rows = T.sort(tilde_x, axis=1)   # one value per row, through an op tmpi does not read


def sgd(loss):
    return [(p, p - 0.1 * g) for p, g in zip(params, T.grad(loss, params))]


B = 10
batches = [(lo, min(lo + B, len(data))) for lo in range(0, len(data), B)]
if args.style == "givens":
    shared_x = theano.shared(data, borrow=True)
    index = T.lscalar()

    def compile_step(returned, loss, name):
        f = theano.function([index], returned, updates=sgd(loss), name=name,
                            givens={x: shared_x[index * B:(index + 1) * B]})
        return lambda k: f(k)
else:
    def compile_step(returned, loss, name):
        f = theano.function([x], returned, updates=sgd(loss), name=name)
        return lambda k: f(data[batches[k][0]:batches[k][1]])

train = compile_step([v for _, v in outputs], cost, "dA_train")
train_sorted = compile_step([cost, sorted_rows], cost, "dA_sorted")


def show(function, call, label, value):
    value = np.asarray(value)
    print("step %s %d %s %s %s" % (function, call, label, value.shape,
                                   " ".join(repr(float(v)) for v in value.reshape(-1))))


for epoch in range(2):
    for k in range(len(batches)):
        for (label, _), value in zip(outputs, train(k)):
            show("dA_train", k, label, value)
for k in range(len(batches)):
    _, value = train_sorted(k)
    show("dA_sorted", k, "sorted_rows", value)
