"""A batch-normalised MLP on the digits (Lasagne 0.2's BatchNormLayer).

    python lasagne_batchnorm.py [EPOCHS]

Prints each parameter's norm at the end, the BatchNorm statistics included.
"""
import sys

import numpy as np
import theano
import theano.tensor as T

import lasagne
from lasagne.layers import DenseLayer, InputLayer, batch_norm, get_output


def main(epochs=2):
    np.random.seed(7)
    from sklearn.datasets import load_digits
    digits = load_digits()
    X = (digits.data / 16.0).astype(theano.config.floatX)
    y = digits.target.astype("int32")

    x_var, y_var = T.matrix("x"), T.ivector("y")
    net = InputLayer((None, 64), x_var)
    net = batch_norm(DenseLayer(net, 32))
    net = DenseLayer(net, 10, nonlinearity=lasagne.nonlinearities.softmax)
    loss = lasagne.objectives.categorical_crossentropy(get_output(net), y_var).mean()
    params = lasagne.layers.get_all_params(net, trainable=True)
    updates = lasagne.updates.adam(loss, params, learning_rate=0.01)
    train_fn = theano.function([x_var, y_var], loss, updates=updates)

    for epoch in range(epochs):
        order = np.random.permutation(len(X))
        losses = [train_fn(X[order[i:i + 100]], y[order[i:i + 100]])
                  for i in range(0, len(X) - 99, 100)]
        print("epoch %d loss %.6f" % (epoch + 1, np.mean(losses)))
    values = lasagne.layers.get_all_param_values(net)
    print("final norms %s" % " ".join("%.17g" % np.linalg.norm(v) for v in values))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
