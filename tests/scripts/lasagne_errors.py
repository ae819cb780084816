"""Small Lasagne scripts that go wrong in the ways users' scripts do.

    python lasagne_errors.py MODE

``mismatch``     rank 0 trains with Adam, the other ranks with momentum (MPI rank
                 read from the launcher's environment);
``fixed_batch``  a convolutional net whose InputLayer fixes the batch at 40 rows;
``no_training``  builds Lasagne updates but compiles the function without them.
"""
import os
import sys

import numpy as np
import theano
import theano.tensor as T

import lasagne


def mpi_rank():
    return int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))


def main(mode):
    np.random.seed(0)
    batch = 40 if mode == "fixed_batch" else None
    x = T.tensor4("x")
    y = T.ivector("y")
    net = lasagne.layers.InputLayer((batch, 1, 8, 8), x)
    if mode == "fixed_batch":
        net = lasagne.layers.Conv2DLayer(net, 4, 3)
    net = lasagne.layers.DenseLayer(net, 16)
    net = lasagne.layers.DenseLayer(net, 10, nonlinearity=lasagne.nonlinearities.softmax)
    loss = lasagne.objectives.categorical_crossentropy(lasagne.layers.get_output(net), y).mean()
    params = lasagne.layers.get_all_params(net, trainable=True)
    if mode == "mismatch" and mpi_rank() == 0:
        updates = lasagne.updates.adam(loss, params)
    else:
        updates = lasagne.updates.momentum(loss, params, learning_rate=0.1)
    if mode == "no_training":
        train_fn = theano.function([x, y], loss)
    else:
        train_fn = theano.function([x, y], loss, updates=updates)
    data = np.random.rand(40, 1, 8, 8).astype(theano.config.floatX)
    labels = np.random.randint(0, 10, 40).astype("int32")
    for _ in range(3):
        print("loss %.6f" % train_fn(data, labels))


if __name__ == "__main__":
    main(sys.argv[1])
