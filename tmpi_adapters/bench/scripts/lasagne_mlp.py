"""A Lasagne MLP in the style of Lasagne's MNIST example, on generated data.

Dropout on the input and hidden layers (random streams in the step), Nesterov
momentum; the training function returns the loss, the validation function
the loss and the accuracy.  Lasagne 0.1's layers only (no batch_norm).

    python lasagne_mlp.py [EPOCHS]
"""
import sys

import numpy as np
import theano
import theano.tensor as T

import lasagne
from lasagne.layers import DenseLayer, DropoutLayer, InputLayer

# Generated data: a fixed random pattern per class plus noise (no downloads).
from tmpi_adapters.bench.models import generated_data



def build_mlp(input_var):
    network = InputLayer(shape=(None, 64), input_var=input_var)
    network = DropoutLayer(network, p=0.2)
    network = DenseLayer(network, num_units=128, nonlinearity=lasagne.nonlinearities.rectify)
    network = DropoutLayer(network, p=0.5)
    network = DenseLayer(network, num_units=128, nonlinearity=lasagne.nonlinearities.rectify)
    return DenseLayer(network, num_units=10, nonlinearity=lasagne.nonlinearities.softmax)


def iterate_minibatches(inputs, targets, batchsize, shuffle=False):
    indices = np.arange(len(inputs))
    if shuffle:
        np.random.shuffle(indices)
    for start in range(0, len(inputs) - batchsize + 1, batchsize):
        excerpt = indices[start:start + batchsize]
        yield inputs[excerpt], targets[excerpt]


def main(num_epochs=2):
    np.random.seed(1)
    x_train, y_train = generated_data(640, (64,))
    x_val, y_val = generated_data(128, (64,), seed=1)
    input_var, target_var = T.matrix("inputs"), T.ivector("targets")
    network = build_mlp(input_var)
    prediction = lasagne.layers.get_output(network)
    loss = lasagne.objectives.categorical_crossentropy(prediction, target_var).mean()
    params = lasagne.layers.get_all_params(network, trainable=True)
    updates = lasagne.updates.nesterov_momentum(loss, params, learning_rate=0.01,
                                                momentum=0.9)
    test_prediction = lasagne.layers.get_output(network, deterministic=True)
    test_loss = lasagne.objectives.categorical_crossentropy(test_prediction,
                                                            target_var).mean()
    test_acc = T.mean(T.eq(T.argmax(test_prediction, axis=1), target_var),
                      dtype=theano.config.floatX)
    train_fn = theano.function([input_var, target_var], loss, updates=updates)
    val_fn = theano.function([input_var, target_var], [test_loss, test_acc])
    for epoch in range(num_epochs):
        train_err = train_batches = 0
        for inputs, targets in iterate_minibatches(x_train, y_train, 32, shuffle=True):
            train_err += train_fn(inputs, targets)
            train_batches += 1
        val_err, val_acc = val_fn(x_val, y_val)
        print("epoch %d: training loss %.4f, validation loss %.4f, accuracy %.2f %%"
              % (epoch + 1, train_err / train_batches, val_err, 100 * val_acc))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
