"""Evaluation functions whose means a script branches on, called many times.

The tutorials' validation function (``logistic_sgd.py``, ``mlp.py``) returns
``T.mean(T.neq(y_pred, y))`` over a ``givens`` slice of a shared dataset; the
early stopping compares it with ``<``.  ``validate_fixed`` writes the batch
size into its graph (``conv2d(x.reshape((B, 1, 2, 4)), ..., input_shape=(B,
1, 2, 4))``, as ``convolutional_mlp.py`` does).  ``evaluate`` returns, for numpy
batches of 0 to 23 rows (fewer rows than ranks included), the error rate,
the tutorials' negative log-likelihood (a mean of non-integer values), the
accuracy in float32 (Lasagne's ``T.mean(T.eq(...), dtype=floatX)``) and a
mean over both axes of a matrix of integer values.

    python split_outputs_eval.py [--batch-size 7] [--fixed]

Prints ``eval <function> <call> <rows> <repr of each value>``.
"""
import argparse

import numpy as np
import theano
import theano.tensor as T
from theano.tensor.nnet import conv2d

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=7)
parser.add_argument("--fixed", action="store_true",
                    help="also validate_fixed (a convolution: needs Theano's C code)")
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
# The batch size written into the graph, as the tutorials' LeNet writes it:
# one process's optimizer then multiplies the error count by 1 / B.
filters = theano.shared(rng.standard_normal((2, 1, 1, 2)).astype(floatX), name="filters")
maps = conv2d(x.reshape((B, 1, 2, 4)), filters, filter_shape=(2, 1, 1, 2),
              input_shape=(B, 1, 2, 4))
fixed_pred = T.argmax(maps.flatten(2), axis=1) % 3
validate_fixed = theano.function([index], T.mean(T.neq(fixed_pred, y)), name="validate_fixed",
                                 givens={x: valid_x[index * B:(index + 1) * B],
                                         y: valid_y[index * B:(index + 1) * B]})
evaluate = theano.function([x, y], [errors, nll, accuracy, positive, positive32],
                           name="evaluate")
for name, function in (("validate", validate), ("validate_fixed", validate_fixed),
                       ("evaluate", evaluate)):
    print("kind %s %s" % (name, type(function).__name__))

for i in range(n_valid // B + 1):
    rows = min(B, n_valid - i * B)
    print("eval validate %d %d %r" % (i, rows, float(validate(i))))
for i in range(n_valid // B if args.fixed else 0):
    print("eval validate_fixed %d %d %r" % (i, B, float(validate_fixed(i))))
lo = 0
for i in range(120):
    rows = i % 24
    values = evaluate(data[lo:lo + rows], labels[lo:lo + rows])
    print("eval evaluate %d %d %s" % (i, rows, " ".join(repr(np.asarray(v).item())
                                                         for v in values)))
    lo = (lo + rows) % (n_valid - 24)
