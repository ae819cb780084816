"""A linear regression whose sixth batch holds a NaN in its last row (rank 1's
share on 2 ranks), so that step's gradient is not finite.

Prints tmpi's result and the same SGD done in numpy with that batch skipped.
"""
import numpy as np
import theano
import theano.tensor as T

LR = 0.1
x = T.matrix("x")
y = T.vector("y")
W = theano.shared(np.zeros(3), name="W")
b = theano.shared(0.0, name="b")
loss = T.sqr(T.dot(x, W) + b - y).mean()
gW, gb = T.grad(loss, [W, b])
train = theano.function([x, y], loss, updates=[(W, W - LR * gW), (b, b - LR * gb)],
                        name="train")

rng = np.random.RandomState(0)
w_ref, b_ref = np.zeros(3), 0.0
for step in range(10):
    xs = rng.uniform(-1, 1, (4, 3))
    ys = xs.dot([1.0, -2.0, 0.5]) + 0.3
    if step == 5:
        xs[3, 1] = np.nan
    train(xs, ys)
    if np.isfinite(xs).all():
        error = xs.dot(w_ref) + b_ref - ys
        w_ref, b_ref = w_ref - LR * 2 * xs.T.dot(error) / 4, b_ref - LR * 2 * error.mean()

print("final W %s %.17g" % (" ".join("%.17g" % w for w in W.get_value()), b.get_value()))
print("final expected %s %.17g" % (" ".join("%.17g" % w for w in w_ref), b_ref))
