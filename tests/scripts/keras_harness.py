"""Run a Keras script unmodified, as ``python SCRIPT ARGS`` would, with what a test needs around it.

    keras_harness.py [--floatx F] [--record FILE | --replay FILE] [--small-cifar] SCRIPT [ARGS...]

``--record FILE``
    save every batch ``train_on_batch`` is handed, in order;
``--replay FILE``
    hand ``train_on_batch`` those batches, in order, in place of the script's own
    (the script's generator still draws; what it draws is not used);
``--small-cifar``
    ``keras.datasets.cifar10.load_data`` returns the images of the Keras data
    directory's batch files as they are (a data set of a few images) instead of
    spreading them over 5 x 10000 rows;
``--floatx F``
    Keras' float type before the script runs.

When the script has run: ``final history ...`` (every ``History`` its fit calls
returned) and ``final weights ...`` (the last trained model's), to 17 digits.
"""
import argparse
import os
import pickle
import runpy
import sys

import numpy as np


def small_cifar():
    """``cifar10.load_data`` reading the batch files' images as they are."""
    from keras import backend as K
    from keras.datasets import cifar10
    from keras.datasets.cifar import load_batch

    def load_data():
        keras_home = os.environ.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"),
                                                                  ".keras")
        path = os.path.join(keras_home, "datasets", "cifar-10-batches-py")
        parts = [load_batch(os.path.join(path, "data_batch_%d" % i)) for i in range(1, 6)]
        x_train = np.concatenate([x for x, _ in parts])
        y_train = np.concatenate([np.asarray(y) for _, y in parts]).reshape(-1, 1)
        x_test, y_test = load_batch(os.path.join(path, "test_batch"))
        y_test = np.asarray(y_test).reshape(-1, 1)
        if K.image_data_format() == "channels_last":
            x_train, x_test = x_train.transpose(0, 2, 3, 1), x_test.transpose(0, 2, 3, 1)
        return (x_train, y_train), (x_test, y_test)
    cifar10.load_data = load_data


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--floatx")
    parser.add_argument("--record")
    parser.add_argument("--replay")
    parser.add_argument("--small-cifar", action="store_true")
    parser.add_argument("script")
    parser.add_argument("arguments", nargs=argparse.REMAINDER)
    args = parser.parse_args()

    from keras import backend as K
    from keras.engine.training import Model
    if args.floatx:
        K.set_floatx(args.floatx)
    if args.small_cifar:
        small_cifar()
    batches, histories, trained = [], [], []
    replayed = None
    if args.replay:
        with open(args.replay, "rb") as handle:
            replayed = iter(pickle.load(handle))
    train_on_batch = Model.train_on_batch

    def recorded_train_on_batch(self, x, y=None, sample_weight=None, *rest, **kwargs):
        if replayed is not None:
            live = (x, y)
            x, y, sample_weight = next(replayed)
            assert np.shape(x) == np.shape(live[0]) and np.shape(y) == np.shape(live[1])
        else:
            batches.append(tuple(None if a is None else np.array(a, copy=True)
                                 for a in (x, y, sample_weight)))
        trained[:] = [self]
        return train_on_batch(self, x, y, sample_weight, *rest, **kwargs)
    Model.train_on_batch = recorded_train_on_batch

    def keeping(fit):
        def kept(self, *a, **kw):
            history = fit(self, *a, **kw)
            histories.append(history)
            return history
        return kept
    Model.fit = keeping(Model.fit)
    Model.fit_generator = keeping(Model.fit_generator)

    sys.argv = [args.script] + args.arguments
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name="__main__")

    values = [v for h in histories for key in sorted(h.history) for v in h.history[key]]
    print("final history %s" % " ".join("%.17e" % v for v in values))
    stats = []
    for w in trained[0].get_weights() if trained else []:
        stats += [np.linalg.norm(w), np.abs(w).sum()]
    print("final weights %s" % " ".join("%.17e" % v for v in stats))
    if args.record:
        with open(args.record, "wb") as handle:
            pickle.dump(batches, handle)


if __name__ == "__main__":
    main()
