"""Ordinary Keras 2 models whose numbers N ranks must reproduce exactly:

``metrics``
    metrics that are batch sums (``add_metric(K.sum(out))``, a metric
    function returning ``K.sum``) and batch means, on batches of 12, 12 and 1
    rows, through ``fit`` with validation, ``evaluate`` and ``train_on_batch``.
``noise``
    ``GaussianNoise``, ``Dropout`` and ``GaussianDropout`` layers.
``targets``
    targets given as a ``K.variable`` (``compile(target_tensors=...)``).
``recurrent``
    a sequence-to-sequence model as Keras' ``addition_rnn.py`` builds it
    (``LSTM`` encoder, ``RepeatVector``, ``GRU`` and ``SimpleRNN`` decoders,
    ``TimeDistributed(Dense)``), whose widths are the batch size: 12.
``residual``
    a residual block with BatchNormalization on both of its paths (the main
    path's after a hidden layer, the shortcut's after its projection), whose
    batch statistics do not read each other.
``files``
    a model saved and loaded back at a fixed path (``ModelCheckpoint``,
    ``CSVLogger``, ``save``/``load_model``), and weights saved to a
    temporary directory of the process's own and loaded back.

    python transparency_keras_models.py CASE[,CASE...] [--out DIR]
"""
import argparse
import os
import shutil
import tempfile

import numpy as np

import keras
from keras import backend as K
from keras import metrics
from keras.layers import (GRU, LSTM, Activation, Add, BatchNormalization, Dense, Dropout,
                          GaussianDropout, GaussianNoise, Input, RepeatVector, SimpleRNN,
                          TimeDistributed)
from keras.models import Model, Sequential, load_model

parser = argparse.ArgumentParser()
parser.add_argument("cases")
parser.add_argument("--out", default=".")
args = parser.parse_args()
K.set_floatx("float64")
rng = np.random.RandomState(0)
x = rng.rand(25, 5)            # batches of 12: 12, 12 and 1 rows
y = rng.rand(25, 2)


def init(seed):
    return keras.initializers.glorot_uniform(seed=seed)


def show(case, name, values):
    print("final %s %s %s" % (case, name, " ".join("%.17g" % v for v in np.ravel(values))))


def sum_pred(y_true, y_pred):
    return K.sum(y_pred)


def mean_pred(y_true, y_pred):
    return K.mean(y_pred)


def weights_of(model):
    return [float(np.abs(w).sum()) for w in model.get_weights()]


def metrics_case():
    inputs = Input(shape=(5,))
    hidden = Dense(8, activation="tanh", kernel_initializer=init(1))(inputs)
    outputs = Dense(2, kernel_initializer=init(2))(hidden)
    model = Model(inputs, outputs)
    model.add_metric(K.sum(outputs), name="batch_sum")
    model.add_metric(metrics.Mean(name="row_mean")(outputs))
    model.compile(keras.optimizers.SGD(0.05, momentum=0.9), "mse",
                  metrics=["mae", sum_pred, mean_pred])
    history = model.fit(x, y, batch_size=12, epochs=2, verbose=0, shuffle=False,
                        validation_data=(x[:13], y[:13]))
    for key in sorted(history.history):
        show("metrics", key, history.history[key])
    show("metrics", "evaluate", model.evaluate(x, y, batch_size=12, verbose=0))
    show("metrics", "train_on_batch", model.train_on_batch(x[:12], y[:12]))
    show("metrics", "weights", weights_of(model))


def noise_case():
    model = Sequential([
        Dense(8, activation="tanh", input_shape=(5,), kernel_initializer=init(3)),
        GaussianNoise(0.3), Dropout(0.5), GaussianDropout(0.2),
        Dense(2, kernel_initializer=init(4)),
    ])
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"])
    history = model.fit(x, y, batch_size=12, epochs=2, verbose=0, shuffle=False,
                        validation_data=(x[:13], y[:13]))
    for key in sorted(history.history):
        show("noise", key, history.history[key])
    show("noise", "evaluate", model.evaluate(x, y, batch_size=12, verbose=0))
    show("noise", "weights", weights_of(model))


def targets_case():
    model = Sequential([Dense(2, input_shape=(5,), kernel_initializer=init(5))])
    model.compile(keras.optimizers.SGD(0.1), "mse", target_tensors=[K.variable(y[:10])])
    show("targets", "losses", [model.train_on_batch(x[:10], None) for _ in range(3)])
    show("targets", "weights", weights_of(model))


def recurrent_case():
    sequences = rng.rand(25, 4, 3)
    answers = np.eye(5)[rng.randint(0, 5, (25, 3))]
    model = Sequential([
        LSTM(12, input_shape=(4, 3), kernel_initializer=init(7)), RepeatVector(3),
        GRU(12, return_sequences=True, kernel_initializer=init(8)),
        SimpleRNN(12, return_sequences=True, kernel_initializer=init(9)),
        TimeDistributed(Dense(5, activation="softmax", kernel_initializer=init(10))),
    ])
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    history = model.fit(sequences, answers, batch_size=12, epochs=2, verbose=0, shuffle=False,
                        validation_data=(sequences[:13], answers[:13]))
    for key in sorted(history.history):
        show("recurrent", key, history.history[key])
    show("recurrent", "predict", model.predict(sequences[:5]))
    show("recurrent", "weights", weights_of(model))


def residual_case():
    inputs = Input((5,))
    # (No bias before a BatchNormalization, as residual nets are written: its
    # gradient is zero but for rounding.)
    main = Dense(8, use_bias=False, kernel_initializer=init(11))(inputs)
    main = Activation("relu")(BatchNormalization()(main))
    main = Dense(8, kernel_initializer=init(12))(main)
    shortcut = Dense(8, use_bias=False, kernel_initializer=init(13))(inputs)
    shortcut = BatchNormalization()(shortcut)
    outputs = Dense(2, kernel_initializer=init(14))(Activation("relu")(Add()([main, shortcut])))
    model = Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(0.1), "mse")
    history = model.fit(x, y, batch_size=12, epochs=2, verbose=0, shuffle=False)
    show("residual", "loss", history.history["loss"])
    show("residual", "predict", model.predict(x[:5]))
    show("residual", "weights", weights_of(model))


def files_case():
    model = Sequential([Dense(2, input_shape=(5,), kernel_initializer=init(6))])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    best = os.path.join(args.out, "best.h5")
    callbacks = [keras.callbacks.ModelCheckpoint(best),
                 keras.callbacks.CSVLogger(os.path.join(args.out, "log.csv"))]
    model.fit(x, y, batch_size=12, epochs=2, verbose=0, shuffle=False, callbacks=callbacks)
    expected = model.predict(x)
    model.save(os.path.join(args.out, "model.h5"))
    same = np.array_equal(load_model(os.path.join(args.out, "model.h5")).predict(x), expected)
    same &= np.array_equal(load_model(best).predict(x), expected)
    own = tempfile.mkdtemp()           # another directory on every rank
    model.save_weights(os.path.join(own, "weights.h5"))
    copy = Sequential([Dense(2, input_shape=(5,))])
    copy.load_weights(os.path.join(own, "weights.h5"))
    same &= np.array_equal(copy.predict(x), expected)
    shutil.rmtree(own)
    show("files", "weights", weights_of(model))
    print("final files read back %s" % same)


for case in args.cases.split(","):
    {"metrics": metrics_case, "noise": noise_case, "targets": targets_case,
     "files": files_case, "recurrent": recurrent_case, "residual": residual_case}[case]()
