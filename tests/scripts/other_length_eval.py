"""An evaluation with an input that is not the batch: a reference batch of its own length.

``f(x, ref)`` returns ``(x - mean(ref)) W`` per row of ``x``, ``g`` its mean
and a sum over ``ref``'s rows, for references of 8, 10 (as long as the batch),
7 (with a batch of 7) and 3 rows.  Prints ``final f <rows> <ref rows> <shape>
<sums>``; N ranks must print one process's lines.
"""
import numpy as np
import theano
import theano.tensor as T

x, ref = T.matrix("x"), T.matrix("ref")
W = theano.shared(np.ones((3, 2)), name="W")
f = theano.function([x, ref], T.dot(x - ref.mean(0), W))
g = theano.function([x, ref], [T.dot(x - ref.mean(0), W).mean(), (ref ** 2).sum()])
rng = np.random.RandomState(0)
for n, r in ((10, 8), (10, 10), (7, 7), (9, 3)):
    a, b = rng.standard_normal((n, 3)), rng.standard_normal((r, 3))
    out = f(a, b)
    print("final f", n, r, out.shape, "%.15g" % out.sum(), "%.15g %.15g" % tuple(g(a, b)))
