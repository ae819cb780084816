"""2017-era scripts run with plain ``python`` (no tmpi) in the project's venv.

Each ``test_*`` function is one: a Lasagne 0.1 network (its layers import the
``theano.tensor.signal.downsample`` that Theano 1.0 removed), a Keras 2.3.1
model (``collections.Iterable``, the Theano backend), a ``theano.scan``
recurrence (the Cython scan that Python 3.11 cannot build).  Run it as
``python frontdoor_plain.py [NAME...]``, under ``pytest``, or under
``mpiexec python``; the venv's start-up hook must make all of them work.
"""
import sys

import numpy as np


def test_lasagne():
    import lasagne
    import theano
    import theano.tensor as T
    from lasagne.layers import DenseLayer, InputLayer
    network = DenseLayer(InputLayer((None, 4)), 3, nonlinearity=lasagne.nonlinearities.softmax)
    x, y = T.dmatrix("x"), T.ivector("y")
    loss = lasagne.objectives.categorical_crossentropy(
        lasagne.layers.get_output(network, x), y).mean()
    params = lasagne.layers.get_all_params(network, trainable=True)
    train = theano.function([x, y], loss, updates=lasagne.updates.momentum(loss, params, 0.1))
    losses = [float(train(np.ones((5, 4)), np.zeros(5, "int32"))) for _ in range(3)]
    assert losses[-1] < losses[0], losses
    print("lasagne %s trained: %s" % (lasagne.__version__, losses))


def test_keras():
    import keras
    from keras.layers import Dense
    from keras.models import Sequential
    assert keras.backend.backend() == "theano"
    model = Sequential([Dense(4, input_shape=(3,), activation="tanh"), Dense(1)])
    model.compile("sgd", "mse")
    history = model.fit(np.ones((8, 3)), np.ones(8), epochs=2, verbose=0)
    print("keras %s trained: %s" % (keras.__version__, history.history["loss"]))


def test_scan():
    import theano
    import theano.tensor as T
    assert theano.config.blas.ldflags == ""
    W = theano.shared(np.eye(3) * 0.5, name="W")
    x = T.dmatrix("x")
    states, _ = theano.scan(lambda xt, previous: T.tanh(T.dot(previous, W) + xt),
                            sequences=x, outputs_info=T.zeros(3, dtype="float64"))
    loss = states[-1].sum()
    train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
    print("scan trained: %s" % [float(train(np.ones((5, 3)))) for _ in range(2)])


if __name__ == "__main__":
    for name in sys.argv[1:]:
        globals()["test_" + name]()
