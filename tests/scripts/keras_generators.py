"""An ordinary Keras 2 script fed by generators that race: augmentation drawn
from numpy's global generator in 4 worker threads, or in 4 worker processes.

    python keras_generators.py --record batches.pkl      # train, saving every batch Keras took
    python keras_generators.py --replay batches.pkl      # one process, fed those batches

Each case builds a small conv net (BatchNormalization, Dropout, float64),
trains it with ``fit_generator`` or ``fit`` on a generator, validates,
evaluates and predicts from generators, and prints its numbers.  With
``--record`` every batch that ``train_on_batch``, ``test_on_batch`` and
``predict_on_batch`` received is saved, in order; ``--replay`` trains the same
model in the same calls on exactly those batches, from plain generators
(``workers=0``).  When recording it also prints how many batches this process's
``augmented`` generators made and the most worker threads and processes it had
while a batch was taken.  The ``raising`` case (not replayed) trains from a
generator that takes 8 s and then fails on its fourth batch, and catches the error.
"""
import argparse
import multiprocessing
import pickle
import threading
import time

import numpy as np

from keras import backend as K
from keras.engine.training import Model
from keras.layers import (Activation, BatchNormalization, Conv2D, Dense, Dropout, Flatten,
                          Input)
from keras.optimizers import SGD
from keras.preprocessing.image import ImageDataGenerator

CASES = ("threads", "processes", "inline", "raising")
DRAWN = [0]            # batches made by augmented() in this process
WORKERS = [0, 0]       # the most threads and child processes besides the start's
ROWS, VAL_ROWS, BATCH, VAL_BATCH, EPOCHS = 46, 20, 10, 8, 2
SLOW = 8  # seconds the raising case's generator takes before it fails


def data(seed, rows):
    generator = np.random.RandomState(seed)
    x = generator.rand(rows, 8, 8, 3)
    y = np.eye(3)[generator.randint(0, 3, rows)]
    return x, y


def build(case):
    np.random.seed(CASES.index(case) + 1)  # the same model in the replay, whatever came before
    inputs = Input(shape=(8, 8, 3))
    hidden = Conv2D(4, (3, 3), padding="same", use_bias=False)(inputs)
    hidden = Activation("relu")(BatchNormalization()(hidden))
    hidden = Dropout(0.25)(Flatten()(hidden))
    model = Model(inputs, Dense(3, activation="softmax")(hidden))
    model.compile(SGD(lr=0.05, momentum=0.9), "categorical_crossentropy", metrics=["accuracy"])
    return model


def augmented(x, y, batch_size):
    """Endless batches, each flipped and shifted at random (numpy's global generator)."""
    while True:
        for start in range(0, len(x), batch_size):
            DRAWN[0] += 1
            batch = x[start:start + batch_size].copy()
            flip = np.random.rand(len(batch)) < 0.5
            batch[flip] = batch[flip, :, ::-1]
            batch = np.roll(batch, np.random.randint(-2, 3), axis=1)
            yield (batch, y[start:start + batch_size]) if y is not None else batch


class Locked:
    """A generator that worker threads may share."""

    def __init__(self, generator):
        self.generator, self.lock = generator, threading.Lock()

    def __iter__(self):
        return self

    def __next__(self):
        with self.lock:
            return next(self.generator)


def run(case, model, train, val):
    """The case's calls, fed by generators (``None``: the live ones)."""
    (x, y), (xv, yv) = train, val
    images = ImageDataGenerator(width_shift_range=0.2, horizontal_flip=True,
                                rotation_range=10)
    steps, val_steps = -(-ROWS // BATCH), -(-VAL_ROWS // VAL_BATCH)
    if case == "threads":
        fit = model.fit_generator(images.flow(x, y, batch_size=BATCH), epochs=EPOCHS,
                                  validation_data=images.flow(xv, yv, batch_size=VAL_BATCH),
                                  workers=4, verbose=2)
        evaluation = model.evaluate_generator(Locked(augmented(xv, yv, VAL_BATCH)), val_steps,
                                              workers=4)
        predictions = model.predict_generator(images.flow(xv, batch_size=VAL_BATCH,
                                                          shuffle=False), workers=4)
    elif case == "processes":
        fit = model.fit(augmented(x, y, BATCH), steps_per_epoch=steps, epochs=EPOCHS,
                        validation_data=augmented(xv, yv, VAL_BATCH),
                        validation_steps=val_steps, workers=4, use_multiprocessing=True,
                        verbose=2)
        evaluation = model.evaluate(images.flow(xv, yv, batch_size=VAL_BATCH), workers=4,
                                    use_multiprocessing=True)
        predictions = model.predict(augmented(xv, None, VAL_BATCH), steps=val_steps,
                                    workers=2, use_multiprocessing=True)
    elif case == "raising":
        def failing():
            for number, batch in enumerate(augmented(x, y, BATCH)):
                if number == 3:
                    time.sleep(SLOW)  # the other ranks wait for it: a stall
                    raise ValueError("no fourth batch")
                yield batch
        try:
            model.fit_generator(failing(), steps_per_epoch=steps, epochs=EPOCHS, workers=0,
                                verbose=0)
        except ValueError as error:
            print("final raising caught %s: %s" % (type(error).__name__, error))
        # Shuffled on every rank: alike only if every rank took rank 0's generator
        # (whose failing generator drew in the main thread) after the error.
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=True, verbose=0)
        fit = model.fit_generator(augmented(x, y, BATCH), steps_per_epoch=steps, epochs=1,
                                  workers=0, verbose=0)
        return fit, model.evaluate(xv, yv, verbose=0), model.predict(xv)
    else:
        fit = model.fit_generator(images.flow(x, y, batch_size=BATCH), epochs=EPOCHS,
                                  validation_data=augmented(xv, yv, VAL_BATCH),
                                  validation_steps=val_steps, workers=0, verbose=2)
        evaluation = model.evaluate_generator(images.flow(xv, yv, batch_size=VAL_BATCH),
                                              workers=0)
        predictions = model.predict_generator(augmented(xv, None, VAL_BATCH), val_steps,
                                              workers=0)
    return fit, evaluation, predictions


def replay(model, batches):
    """The same calls on the recorded ``batches``, one process, ``workers=0``."""
    train = [b[1:] for b in batches if b[0] == "train"]
    tests = iter([b[1:] for b in batches if b[0] == "test"])
    predicted = [b[1] for b in batches if b[0] == "predict"]
    steps, val_steps = -(-ROWS // BATCH), -(-VAL_ROWS // VAL_BATCH)
    assert len(train) == steps * EPOCHS, len(train)
    fit = model.fit_generator(iter(train), steps_per_epoch=steps, epochs=EPOCHS,
                              validation_data=tests, validation_steps=val_steps, workers=0,
                              verbose=2)
    evaluation = model.evaluate_generator(tests, val_steps, workers=0)
    predictions = model.predict_generator(iter(predicted), len(predicted), workers=0)
    return fit, evaluation, predictions


def recording(log):
    """Save what Model's batch calls are handed, in order, into ``log``."""
    threads = threading.active_count()

    def wrap(kind, method):
        def call(self, x, y=None, *args, **kwargs):
            WORKERS[0] = max(WORKERS[0], threading.active_count() - threads)
            WORKERS[1] = max(WORKERS[1], len(multiprocessing.active_children()))
            copy = (lambda a: None if a is None else np.array(a, copy=True))
            log.append((kind, copy(x), copy(y), copy(kwargs.get("sample_weight"))))
            if kind == "predict":
                return method(self, x)
            return method(self, x, y, *args, **kwargs)
        return call
    Model.train_on_batch = wrap("train", Model.train_on_batch)
    Model.test_on_batch = wrap("test", Model.test_on_batch)
    Model.predict_on_batch = wrap("predict", Model.predict_on_batch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--record")
    parser.add_argument("--replay")
    parser.add_argument("--cases", default=",".join(CASES[:3]))
    args = parser.parse_args()
    K.set_floatx("float64")
    train, val = data(0, ROWS), data(1, VAL_ROWS)
    log, recorded = [], None
    if args.record:
        recording(log)
    if args.replay:
        with open(args.replay, "rb") as handle:
            recorded = pickle.load(handle)
    for case in args.cases.split(","):
        model = build(case)
        start = len(log)
        if recorded is None:
            fit, evaluation, predictions = run(case, model, train, val)
        else:
            fit, evaluation, predictions = replay(model, recorded[case])
        history = [v for key in sorted(fit.history) for v in fit.history[key]]
        print("final %s history %s" % (case, " ".join("%.17e" % v for v in history)))
        print("final %s evaluate %s" % (case, " ".join("%.17e" % v for v in evaluation)))
        print("final %s predict %.17e %.17e" % (case, predictions.sum(),
                                                 np.abs(predictions).max()))
        stats = []
        for w in model.get_weights():
            stats += [np.linalg.norm(w), np.abs(w).sum()]
        print("final %s weights %s" % (case, " ".join("%.17e" % v for v in stats)))
        if args.record:
            log[start:] = [log[start:]]
    if args.record:
        print("final drawn %d" % DRAWN[0])
        print("final workers %d threads %d processes" % tuple(WORKERS))
        with open(args.record, "wb") as handle:
            pickle.dump(dict(zip(args.cases.split(","), log)), handle)


if __name__ == "__main__":
    main()
