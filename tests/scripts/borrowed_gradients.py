"""Gradients must never leave their step inside the exchanger's buffer.

Two training functions with identically shaped gradients (so they share the
exchanger's fused buffers) alternate.  The first returns a gradient, stores
it in shared variables through a bare update and an element-wise one, and
updates a parameter with an element-wise expression that Theano would like to
compute in the gradient's own memory.  A value that wrongly stayed in the
buffer would be overwritten by the other function's step and change the
printed numbers.  Run plainly and under ``tmpi wrap``: the ``final`` lines
must agree.
"""
import numpy as np
import theano
import theano.tensor as T

rng = np.random.RandomState(0)
x_data = rng.randn(60, 3)
y_data = rng.randn(60)
x, y = T.matrix("x"), T.vector("y")


def model(name):
    w = theano.shared(np.zeros(3), name=name + "w")
    b = theano.shared(np.float64(0.0), name=name + "b")
    c = theano.shared(np.zeros(2), name=name + "c")
    loss = T.mean((T.dot(x, w) + b + c.sum() - y) ** 2)
    return [w, b, c], loss


(w, b, c), loss = model("first_")
(w2, b2, c2), loss2 = model("second_")
last = theano.shared(np.zeros(3), name="last_gradient")
doubled = theano.shared(np.zeros(3), name="doubled_gradient")
grad_w, grad_b, grad_c = theano.grad(loss, [w, b, c])
train = theano.function([x, y], [loss, grad_w],
                        updates=[(w, w - 0.1 * grad_w), (b, b - 0.1 * grad_b),
                                 (last, grad_w), (doubled, 2.0 * grad_w),
                                 # c's only use of its gradient.
                                 (c, -0.1 * grad_c)])
train2 = theano.function([x, y], loss2, updates=[
    (p, p - 0.05 * g) for p, g in zip([w2, b2, c2], theano.grad(loss2, [w2, b2, c2]))])
returned, stored = [], []
for i in range(6):
    batch = slice(10 * i, 10 * i + 10)
    _, g = train(x_data[batch], y_data[batch])
    train2(x_data[batch][::-1] * 2, y_data[batch])
    returned.append(g)
    stored += [last.get_value(borrow=True), doubled.get_value(borrow=True)]
params = [v for p in (w, b, c, w2, b2, c2) for v in np.ravel(p.get_value())]
print("final returned %s" % " ".join("%.17g" % v for g in returned for v in g))
print("final stored %s" % " ".join("%.17g" % v for g in stored for v in g))
print("final params %s" % " ".join("%.17g" % v for v in params))
