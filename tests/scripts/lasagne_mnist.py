#!/usr/bin/env python
"""Digit classification in the style of Lasagne's MNIST example, on scikit-learn's
8x8 digits (nothing is downloaded).

An ordinary Lasagne script: it knows nothing of tmpi.

    python lasagne_mnist.py [MODEL [EPOCHS]]

MODEL is ``mlp`` (two dropout-regularised dense layers), ``custom_mlp:DEPTH,WIDTH,
DROP_IN,DROP_HID`` or ``cnn`` (a small convolution, max-pooling and dropout net).
Training uses Nesterov momentum; the last lines print the results so that runs
can be compared.
"""
import sys
import time

import numpy as np
import theano
import theano.tensor as T

import lasagne


def load_dataset():
    """Digits as (N, 1, 8, 8) images in [0, 1]: 1197 to train, 300 to validate, 300 to test."""
    from sklearn.datasets import load_digits
    digits = load_digits()
    X = (digits.data / 16.0).astype(theano.config.floatX).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.uint8)
    order = np.random.RandomState(1234).permutation(len(X))
    X, y = X[order], y[order]
    return X[:-600], y[:-600], X[-600:-300], y[-600:-300], X[-300:], y[-300:]


def build_mlp(input_var=None):
    l_in = lasagne.layers.InputLayer(shape=(None, 1, 8, 8), input_var=input_var)
    l_in_drop = lasagne.layers.DropoutLayer(l_in, p=0.2)
    l_hid1 = lasagne.layers.DenseLayer(
        l_in_drop, num_units=64, nonlinearity=lasagne.nonlinearities.rectify,
        W=lasagne.init.GlorotUniform())
    l_hid1_drop = lasagne.layers.DropoutLayer(l_hid1, p=0.5)
    l_hid2 = lasagne.layers.DenseLayer(
        l_hid1_drop, num_units=64, nonlinearity=lasagne.nonlinearities.rectify)
    l_hid2_drop = lasagne.layers.DropoutLayer(l_hid2, p=0.5)
    return lasagne.layers.DenseLayer(
        l_hid2_drop, num_units=10, nonlinearity=lasagne.nonlinearities.softmax)


def build_custom_mlp(input_var=None, depth=2, width=64, drop_input=.2, drop_hidden=.5):
    network = lasagne.layers.InputLayer(shape=(None, 1, 8, 8), input_var=input_var)
    if drop_input:
        network = lasagne.layers.dropout(network, p=drop_input)
    nonlin = lasagne.nonlinearities.rectify
    for _ in range(depth):
        network = lasagne.layers.DenseLayer(network, width, nonlinearity=nonlin)
        if drop_hidden:
            network = lasagne.layers.dropout(network, p=drop_hidden)
    softmax = lasagne.nonlinearities.softmax
    return lasagne.layers.DenseLayer(network, 10, nonlinearity=softmax)


def build_cnn(input_var=None):
    network = lasagne.layers.InputLayer(shape=(None, 1, 8, 8), input_var=input_var)
    network = lasagne.layers.Conv2DLayer(
        network, num_filters=8, filter_size=(3, 3),
        nonlinearity=lasagne.nonlinearities.rectify, W=lasagne.init.GlorotUniform())
    network = lasagne.layers.MaxPool2DLayer(network, pool_size=(2, 2))
    network = lasagne.layers.DenseLayer(
        lasagne.layers.dropout(network, p=.5), num_units=32,
        nonlinearity=lasagne.nonlinearities.rectify)
    return lasagne.layers.DenseLayer(
        lasagne.layers.dropout(network, p=.5), num_units=10,
        nonlinearity=lasagne.nonlinearities.softmax)


def iterate_minibatches(inputs, targets, batchsize, shuffle=False):
    assert len(inputs) == len(targets)
    if shuffle:
        indices = np.arange(len(inputs))
        np.random.shuffle(indices)
    for start_idx in range(0, len(inputs) - batchsize + 1, batchsize):
        if shuffle:
            excerpt = indices[start_idx:start_idx + batchsize]
        else:
            excerpt = slice(start_idx, start_idx + batchsize)
        yield inputs[excerpt], targets[excerpt]


def main(model='mlp', num_epochs=3):
    np.random.seed(42)
    print("Loading data...")
    X_train, y_train, X_val, y_val, X_test, y_test = load_dataset()

    input_var = T.tensor4('inputs')
    target_var = T.ivector('targets')

    print("Building model and compiling functions...")
    if model == 'mlp':
        network = build_mlp(input_var)
    elif model.startswith('custom_mlp:'):
        depth, width, drop_in, drop_hid = model.split(':', 1)[1].split(',')
        network = build_custom_mlp(input_var, int(depth), int(width),
                                   float(drop_in), float(drop_hid))
    elif model == 'cnn':
        network = build_cnn(input_var)
    else:
        print("Unrecognized model type %r." % model)
        return

    prediction = lasagne.layers.get_output(network)
    loss = lasagne.objectives.categorical_crossentropy(prediction, target_var)
    loss = loss.mean()

    params = lasagne.layers.get_all_params(network, trainable=True)
    updates = lasagne.updates.nesterov_momentum(
        loss, params, learning_rate=0.05, momentum=0.9)

    test_prediction = lasagne.layers.get_output(network, deterministic=True)
    test_loss = lasagne.objectives.categorical_crossentropy(test_prediction, target_var)
    test_loss = test_loss.mean()
    test_acc = T.mean(T.eq(T.argmax(test_prediction, axis=1), target_var),
                      dtype=theano.config.floatX)

    train_fn = theano.function([input_var, target_var], loss, updates=updates)
    val_fn = theano.function([input_var, target_var], [test_loss, test_acc])

    print("Starting training...")
    for epoch in range(num_epochs):
        train_err = 0
        train_batches = 0
        start_time = time.time()
        for batch in iterate_minibatches(X_train, y_train, 100, shuffle=True):
            inputs, targets = batch
            train_err += train_fn(inputs, targets)
            train_batches += 1

        val_err = 0
        val_acc = 0
        val_batches = 0
        for batch in iterate_minibatches(X_val, y_val, 100, shuffle=False):
            inputs, targets = batch
            err, acc = val_fn(inputs, targets)
            val_err += err
            val_acc += acc
            val_batches += 1

        print("Epoch {} of {} took {:.3f}s".format(
            epoch + 1, num_epochs, time.time() - start_time))
        print("  training loss:\t\t{:.6f}".format(train_err / train_batches))
        print("  validation loss:\t\t{:.6f}".format(val_err / val_batches))
        print("  validation accuracy:\t\t{:.2f} %".format(val_acc / val_batches * 100))

    test_err = 0
    test_acc = 0
    test_batches = 0
    for batch in iterate_minibatches(X_test, y_test, 100, shuffle=False):
        inputs, targets = batch
        err, acc = val_fn(inputs, targets)
        test_err += err
        test_acc += acc
        test_batches += 1
    print("Final results:")
    print("  test loss:\t\t\t{:.6f}".format(test_err / test_batches))
    print("  test accuracy:\t\t{:.2f} %".format(test_acc / test_batches * 100))

    values = lasagne.layers.get_all_param_values(network)
    print("final train %.17g val %.17g %.17g test %.17g %.17g" % (
        train_err / train_batches, val_err / val_batches, val_acc / val_batches,
        test_err / test_batches, test_acc / test_batches))
    print("final norms %s" % " ".join("%.17g" % np.linalg.norm(v) for v in values))


if __name__ == '__main__':
    kwargs = {}
    if len(sys.argv) > 1:
        kwargs['model'] = sys.argv[1]
    if len(sys.argv) > 2:
        kwargs['num_epochs'] = int(sys.argv[2])
    main(**kwargs)
