"""Keras models whose evaluation ties the rows of a batch together, generated.

    python keras_coupled_eval.py [CASE ...]

Each case trains a small float64 model with ``fit`` (validation data, so
the test function runs every epoch), then ``evaluate`` and ``predict``: a
layer that centres the batch (``t - mean(t, axis=0)``), a Pearson
correlation as the loss or as a metric, a learning rate driven by the
validation loss (``ReduceLROnPlateau``), and a plain model (a control whose
evaluation splits).  Each prints ``final <case> <numbers>``; N ranks must
print the one-process numbers.
"""
import sys

import numpy as np

import keras
from keras import backend as K
from keras.callbacks import ReduceLROnPlateau
from keras.layers import Dense, Input, Lambda
from keras.models import Model

K.set_floatx("float64")


def pearson(a, b):
    a, b = a - K.mean(a, axis=0), b - K.mean(b, axis=0)
    return K.sum(a * b) / K.sqrt(K.sum(a * a) * K.sum(b * b) + 1e-9)


def pearson_loss(a, b):
    return 1.0 - pearson(a, b)


CASES = {
    # name: (centre the hidden layer, loss, metrics, plateau)
    "centred_layer": (True, "mse", [], False),
    "pearson_metric": (False, "mse", [pearson], False),
    "pearson_loss": (False, pearson_loss, ["mae"], False),
    "centred_plateau": (True, "mse", ["mae"], True),
    "plain": (False, "mse", ["mae"], False),
}


def run(name):
    centre, loss, metrics, plateau = CASES[name]
    rng = np.random.RandomState(sorted(CASES).index(name))
    x, y = rng.standard_normal((61, 5)), rng.standard_normal((61, 1))
    xv, yv = rng.standard_normal((23, 5)), rng.standard_normal((23, 1))
    inputs = Input((5,))
    hidden = Dense(8, activation="tanh", kernel_initializer=keras.initializers.RandomNormal(
        stddev=0.5, seed=1))(inputs)
    if centre:
        hidden = Lambda(lambda t: t - K.mean(t, axis=0))(hidden)
    model = Model(inputs, Dense(1, kernel_initializer=keras.initializers.RandomNormal(
        stddev=0.5, seed=2))(hidden))
    model.compile(keras.optimizers.SGD(0.05), loss, metrics=metrics)
    callbacks = [ReduceLROnPlateau("val_loss", factor=0.1, patience=0, min_delta=1.0)] \
        if plateau else []
    history = model.fit(x, y, batch_size=10, epochs=3, validation_data=(xv, yv),
                        shuffle=False, verbose=0, callbacks=callbacks)
    numbers = [v for key in sorted(history.history) for v in history.history[key]]
    numbers += list(np.ravel(model.evaluate(xv, yv, batch_size=7, verbose=0)))
    numbers.append(float(model.predict(xv, batch_size=7).sum()))
    numbers.append(float(sum(np.abs(w).sum() for w in model.get_weights())))
    numbers.append(float(K.get_value(model.optimizer.lr)))
    print("final %s %s" % (name, " ".join("%.17g" % v for v in numbers)))


if __name__ == "__main__":
    for case in sys.argv[1:] or sorted(CASES):
        run(case)
