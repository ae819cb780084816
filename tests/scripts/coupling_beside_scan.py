"""A batch-normalised layer beside a recurrent branch: the levels' gathers run beside scans.

    python coupling_beside_scan.py

The batch statistics of ``h`` (a mean and a variance: one level, their
gradients' sums another) need nothing of the scan over each row's sequence,
and the scan and its gradient need nothing of them: tmpi gathers each level
while the rank computes a scan.  Prints the last cost and each parameter's
sum after 3 epochs of 4 batches.
"""
import numpy as np
import theano
import theano.tensor as T

floatX = theano.config.floatX
rng = np.random.RandomState(0)
BATCH, FEATURES, STEPS = 12, 5, 4
X = rng.randn(4 * BATCH, STEPS, FEATURES).astype(floatX)
Y = rng.randn(4 * BATCH, 1).astype(floatX)
x, y = T.tensor3("x"), T.matrix("y")
W = theano.shared(rng.randn(FEATURES, FEATURES).astype(floatX), name="W")
U = theano.shared((0.3 * rng.randn(FEATURES, FEATURES)).astype(floatX), name="U")
V = theano.shared(rng.randn(FEATURES, 1).astype(floatX), name="V")
h = T.dot(x[:, 0, :], W)
normed = (h - h.mean(axis=0)) / T.sqrt(h.var(axis=0) + 1e-5)
sequence = x.dimshuffle(1, 0, 2)  # time-major
states, _ = theano.scan(lambda step, previous: T.tanh(T.dot(step, U) + previous),
                        sequences=sequence, outputs_info=T.zeros_like(sequence[0]))
cost = T.mean((T.dot(normed + states[-1], V) - y) ** 2)
params = [W, U, V]
train = theano.function([x, y], cost, updates=[(p, p - 0.05 * g)
                                               for p, g in zip(params, T.grad(cost, params))])
for epoch in range(3):
    for start in range(0, len(X), BATCH):
        last = train(X[start:start + BATCH], Y[start:start + BATCH])
print("final %.17g %s" % (float(last), " ".join("%.17g" % float(p.get_value().sum())
                                                 for p in params)))
