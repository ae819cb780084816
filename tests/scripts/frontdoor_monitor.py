"""A gradient monitor: a function that returns gradients and updates nothing.

Every rank prints its gradients, each line in pieces (``print`` writes its
arguments one by one), and the script trains nothing: under tmpi a warning,
not an error.
"""
import numpy as np
import theano
import theano.tensor as T
from mpi4py import MPI

rank = MPI.COMM_WORLD.Get_rank()
W = theano.shared(np.array([0.5, -1.0, 2.0]), name="W")
b = theano.shared(np.float64(0.1), name="b")
x = T.dmatrix("x")
loss = T.sqr(T.dot(x, W) + b).mean()
monitor = theano.function([x], T.grad(loss, [W, b]))
data = np.arange(12.0).reshape(4, 3) / 10
gW, gb = monitor(data)
expected = 2 * (data.dot(W.get_value()) + 0.1)
assert np.allclose(gW, data.T.dot(expected) / 4) and np.allclose(gb, expected.mean()), (gW, gb)
for i in range(300):
    print("rank", rank, "line", i, "gradient", "%.6f" % gb, "end")
