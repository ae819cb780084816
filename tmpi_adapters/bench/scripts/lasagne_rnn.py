"""A bidirectional Lasagne 0.1 recurrent net, in the style of Lasagne's recurrent example.

The task: each sequence is pairs ``(value, marker)``; the target is the sum
of the two values whose marker is 1.  A forward and a backward
``RecurrentLayer`` (tanh, gradient clipping, their inputs to hidden
precomputed over every step: ``(T, B, 2)`` merged to ``(T*B, 2)``), their last
steps joined, a dense output; squared error, Adagrad.  Sequences are masked
to random lengths.  Generated data, no downloads.

    python lasagne_rnn.py [--steps N] [--batch-size B] [--length T] [--units H]
"""
import argparse

import numpy as np
import theano
import theano.tensor as T

import lasagne
from lasagne.layers import (ConcatLayer, DenseLayer, InputLayer, RecurrentLayer,
                            SliceLayer)


def sequences(rng, batch, length):
    """A batch of the task: inputs ``(batch, length, 2)``, targets, masks."""
    x = np.zeros((batch, length, 2), dtype=theano.config.floatX)
    x[:, :, 0] = rng.uniform(size=(batch, length))
    mask = np.zeros((batch, length), dtype=theano.config.floatX)
    targets = np.zeros(batch, dtype=theano.config.floatX)
    for row in range(batch):
        used = rng.randint(length // 2, length + 1)
        mask[row, :used] = 1
        first, second = rng.choice(used, 2, replace=False)
        x[row, [first, second], 1] = 1
        targets[row] = x[row, first, 0] + x[row, second, 0]
    return x, targets, mask


def build(units, length):
    inputs = InputLayer((None, length, 2))
    mask = InputLayer((None, length))
    layers = []
    for backwards in (False, True):
        layer = RecurrentLayer(inputs, units, mask_input=mask, grad_clipping=100,
                               W_in_to_hid=lasagne.init.HeUniform(),
                               W_hid_to_hid=lasagne.init.HeUniform(),
                               nonlinearity=lasagne.nonlinearities.tanh, backwards=backwards)
        layers.append(SliceLayer(layer, 0 if backwards else -1, 1))
    output = DenseLayer(ConcatLayer(layers), num_units=1, nonlinearity=None)
    return inputs, mask, output


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=100)
    parser.add_argument("--length", type=int, default=40)
    parser.add_argument("--units", type=int, default=100)
    args = parser.parse_args()
    rng = np.random.RandomState(0)
    lasagne.random.set_rng(np.random.RandomState(1))
    inputs, mask, output = build(args.units, args.length)
    target = T.vector("target")
    prediction = lasagne.layers.get_output(output).flatten()
    loss = T.mean((prediction - target) ** 2)
    params = lasagne.layers.get_all_params(output)
    train = theano.function([inputs.input_var, target, mask.input_var], loss,
                            updates=lasagne.updates.adagrad(loss, params, 0.01))
    batches = [sequences(rng, args.batch_size, args.length) for _ in range(4)]
    for step in range(args.steps):
        x, y, m = batches[step % len(batches)]
        loss_value = train(x, y, m)
    print("final loss %.17g" % float(loss_value))


if __name__ == "__main__":
    main()
