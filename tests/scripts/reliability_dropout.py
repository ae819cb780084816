"""A small MLP with dropout from Theano's MRG random streams, plus a noise term
drawn from a plain RandomStreams in a non-training function, so a resume has
random-stream state to restore.  ``reliability_dropout.py EPOCHS``"""
import sys

import numpy as np
import theano
import theano.tensor as T
from theano.sandbox.rng_mrg import MRG_RandomStreams
from theano.tensor.shared_randomstreams import RandomStreams

epochs = int(sys.argv[1])
rng = np.random.RandomState(1)
xs = rng.uniform(-1, 1, (120, 5))
ys = (xs.sum(axis=1) > 0).astype("int32")

x, y = T.matrix("x"), T.ivector("y")
W1 = theano.shared(rng.normal(0, 0.3, (5, 16)), name="W1")
W2 = theano.shared(rng.normal(0, 0.3, (16, 2)), name="W2")
mrg = MRG_RandomStreams(seed=5)
hidden = T.tanh(T.dot(x, W1)) * mrg.binomial((x.shape[0], 16), p=0.8, dtype="float64") / 0.8
probs = T.nnet.softmax(T.dot(hidden, W2))
loss = T.nnet.categorical_crossentropy(probs, y).mean()
updates = [(p, p - 0.2 * g) for p, g in zip([W1, W2], T.grad(loss, [W1, W2]))]
train = theano.function([x, y], loss, updates=updates, name="train")
noise = theano.function([], RandomStreams(seed=3).normal((2,)), name="noise")

for epoch in range(epochs):
    order = np.random.permutation(len(xs))
    for i in range(0, len(xs), 20):
        train(xs[order[i:i + 20]], ys[order[i:i + 20]])
    print("epoch %d noise %s" % (epoch, noise()))
print("final norms %.17g %.17g" % (np.linalg.norm(W1.get_value()),
                                     np.linalg.norm(W2.get_value())))
