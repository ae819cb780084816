"""Evaluation functions whose means a script branches on, called many times.

The tutorials' validation function (``logistic_sgd.py``, ``mlp.py``) returns
``T.mean(T.neq(y_pred, y))`` over a ``givens`` slice of a shared dataset; the
early stopping compares it with ``<``.  ``evaluate`` returns, for numpy
batches of 0 to 23 rows (fewer rows than ranks included), the error rate,
the tutorials' negative log-likelihood (a mean of non-integer values), the
accuracy in float32 (Lasagne's ``T.mean(T.eq(...), dtype=floatX)``) and a
mean over both axes of a matrix of integer values.

    python split_outputs_eval.py [--batch-size 7]

Prints ``eval <function> <call> <rows> <repr of each value>``.
"""
import argparse

import numpy as np
import theano
import theano.tensor as T

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=7)
args = parser.parse_args()

floatX = theano.config.floatX
rng = np.random.RandomState(7)
n_valid = 200 * args.batch_size + 3   # the last batch is short
data = rng.standard_normal((n_valid, 8)).astype(floatX)
labels = rng.randint(0, 3, n_valid).astype("int32")
W = theano.shared(rng.standard_normal((8, 3)).astype(floatX), name="W")
b = theano.shared(np.zeros(3, dtype=floatX), name="b")

x, y, index = T.matrix("x"), T.ivector("y"), T.lscalar("index")
p_y_given_x = T.nnet.softmax(T.dot(x, W) + b)
y_pred = T.argmax(p_y_given_x, axis=1)
errors = T.mean(T.neq(y_pred, y))
nll = -T.mean(T.log(p_y_given_x)[T.arange(y.shape[0]), y])
accuracy = T.mean(T.eq(y_pred, y), dtype="float32")
positive = T.mean(T.gt(x, 0.3))                          # a sum divided by rows, then columns
positive32 = T.mean(T.gt(x, 0.3), dtype="float32")

B = args.batch_size
valid_x, valid_y = theano.shared(data, borrow=True), theano.shared(labels, borrow=True)
validate = theano.function([index], errors, name="validate",
                           givens={x: valid_x[index * B:(index + 1) * B],
                                   y: valid_y[index * B:(index + 1) * B]})
evaluate = theano.function([x, y], [errors, nll, accuracy, positive, positive32],
                           name="evaluate")
print("kind validate %s" % type(validate).__name__)
print("kind evaluate %s" % type(evaluate).__name__)

for i in range(n_valid // B + 1):
    rows = min(B, n_valid - i * B)
    print("eval validate %d %d %r" % (i, rows, float(validate(i))))
lo = 0
for i in range(120):
    rows = i % 24
    values = evaluate(data[lo:lo + rows], labels[lo:lo + rows])
    print("eval evaluate %d %d %s" % (i, rows, " ".join(repr(np.asarray(v).item())
                                                         for v in values)))
    lo = (lo + rows) % (n_valid - 24)
