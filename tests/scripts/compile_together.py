"""Says whether the ranks compile at once, and how each rank hashes a string.

Every rank compiles a function holding a :class:`Probe`; Theano prepares the
probe's node while it compiles.  There each rank leaves a file in the
directory given as the first argument, and rank 0 waits up to ``--wait``
seconds for rank 1's: it arrives only if rank 1 compiles while rank 0 does.
Prints ``hash <hash of a string>`` on every rank and, on rank 0,
``together True`` or ``together False``.
"""
import argparse
import os
import time

import numpy as np
import theano
import theano.tensor as T
from theano.gof import Apply, Op

parser = argparse.ArgumentParser()
parser.add_argument("marks")
parser.add_argument("--wait", type=float, default=60.0)
args = parser.parse_args()
rank = int(os.environ.get("PMI_RANK", "0"))
seen = []


class Probe(Op):
    """Identity that notes when its node is prepared for running."""

    __props__ = ()

    def make_node(self, x):
        x = T.as_tensor_variable(x)
        return Apply(self, [x], [x.type()])

    def prepare_node(self, node, storage_map, compute_map, impl):
        if seen:
            return
        open(os.path.join(args.marks, "compiling-%d" % rank), "w").close()
        other = os.path.join(args.marks, "compiling-1")
        deadline = time.monotonic() + args.wait
        while rank == 0 and not os.path.exists(other) and time.monotonic() < deadline:
            time.sleep(0.05)
        seen.append(os.path.exists(other))

    def perform(self, node, inputs, outputs):
        outputs[0][0] = inputs[0].copy()


x = T.dvector("x")
probe = theano.function([x], Probe()(x))
W = theano.shared(np.zeros(2), name="W")
loss = T.sqr(T.dot(probe(np.ones(2)), W) - 1.0)
train = theano.function([], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
train()
print("hash %d" % hash("tmpi"), flush=True)
if rank == 0:
    print("together %s" % seen[0], flush=True)
