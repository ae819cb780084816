"""A small plain Theano model trained for many steps: restarts and preemption.

    reliability_restart.py STEPS

A two-layer network with momentum, float64, on batches drawn from numpy's
global generator (seeded here); no validation, so tmpi sees no epochs and
writes no checkpoint unless told to.  Prints ``step N`` every 500 steps and,
at the end, ``final params`` (each parameter's norm and sum).

While the file named by ``$TMPI_TEST_STAYS_DOWN`` exists, the last rank of a
job of more than one rank kills itself (SIGKILL) as it starts: a rank that
cannot come back.  While the file named by ``$TMPI_TEST_SLOW`` exists, each
step sleeps 15 ms after its call: a job that lasts, whatever the machine's
speed, for a signal to find it training (the numbers are the same).
"""
import os
import signal
import sys
import time

import numpy as np
import theano
import theano.tensor as T

stays_down = os.environ.get("TMPI_TEST_STAYS_DOWN")
rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
size = int(os.environ.get("PMI_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
if stays_down and os.path.exists(stays_down) and size > 1 and rank == size - 1:
    os.kill(os.getpid(), signal.SIGKILL)

steps = int(sys.argv[1])
slow = os.environ.get("TMPI_TEST_SLOW")
np.random.seed(5)
inputs = np.random.randn(512, 8)
targets = np.tanh(inputs.dot(np.random.randn(8, 1)))

x, y = T.matrix("x"), T.matrix("y")
W1 = theano.shared(0.3 * np.random.randn(8, 16), name="W1")
b1 = theano.shared(np.zeros(16), name="b1")
W2 = theano.shared(0.3 * np.random.randn(16, 1), name="W2")
params = [W1, b1, W2]
loss = T.sqr(T.dot(T.tanh(T.dot(x, W1) + b1), W2) - y).mean()
updates = []
for p, g in zip(params, T.grad(loss, params)):
    velocity = theano.shared(np.zeros_like(p.get_value()), name=p.name + "_velocity")
    updates += [(velocity, 0.9 * velocity - 0.05 * g), (p, p + 0.9 * velocity - 0.05 * g)]
train = theano.function([x, y], loss, updates=updates, name="train")

for step in range(1, steps + 1):
    rows = np.random.randint(0, len(inputs), 32)
    train(inputs[rows], targets[rows])
    if slow and os.path.exists(slow):
        time.sleep(0.015)
    if step % 500 == 0:
        print("step %d" % step, flush=True)
print("final params %s" % " ".join("%.17g %.17g" % (np.linalg.norm(p.get_value()),
                                                    p.get_value().sum()) for p in params))
