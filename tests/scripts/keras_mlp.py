"""An ordinary Keras 2 script: a small MLP on scikit-learn's digits, trained with
``fit`` (SGD with momentum, and Adam), ``fit_generator`` on a ``Sequence`` and a
``train_on_batch`` loop, each followed by ``evaluate``.

    python keras_mlp.py --floatx float64 --cases sgd-fit,adam-fit
"""
import argparse

import numpy as np
from sklearn.datasets import load_digits

from keras import backend as K
from keras.layers import Dense, Input
from keras.models import Model, Sequential
from keras.optimizers import SGD, Adam
from keras.regularizers import l2
from keras.utils import Sequence

CASES = ("sgd-fit", "adam-fit", "generator", "train-on-batch")


def load_data(dtype, train_rows):
    digits = load_digits()
    x = (digits.data / 16.0).astype(dtype)
    y = digits.target.astype("int32")
    order = np.random.RandomState(0).permutation(len(x))
    train, val = order[:train_rows], order[1500:]
    return (x[train], y[train]), (x[val], y[val])


def sequential_mlp(optimizer):
    model = Sequential([
        Dense(32, activation="relu", input_shape=(64,), kernel_regularizer=l2(1e-4)),
        Dense(10, activation="softmax"),
    ])
    model.compile(optimizer, "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def functional_mlp(optimizer):
    inputs = Input(shape=(64,))
    hidden = Dense(32, activation="tanh")(inputs)
    outputs = Dense(10, activation="softmax")(hidden)
    model = Model(inputs, outputs)
    model.compile(optimizer, "sparse_categorical_crossentropy",
                  metrics=["accuracy", "sparse_top_k_categorical_accuracy"])
    return model


class Batches(Sequence):
    """Minibatches of a dataset, reshuffled after every epoch."""

    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size
        self.order = np.arange(len(x))

    def __len__(self):
        return int(np.ceil(len(self.x) / float(self.batch_size)))

    def __getitem__(self, index):
        rows = self.order[index * self.batch_size:(index + 1) * self.batch_size]
        return self.x[rows], self.y[rows]

    def on_epoch_end(self):
        np.random.shuffle(self.order)


def train_loop(model, x, y, batch_size, epochs):
    """The classic hand-written loop around train_on_batch."""
    history = []
    for epoch in range(epochs):
        order = np.random.permutation(len(x))
        losses, accuracies = [], []
        for start in range(0, len(x), batch_size):
            rows = order[start:start + batch_size]
            loss, accuracy = model.train_on_batch(x[rows], y[rows])
            losses.append(loss * len(rows))
            accuracies.append(accuracy * len(rows))
        history += [sum(losses) / len(x), sum(accuracies) / len(x)]
        print("epoch %d loss %.4f accuracy %.4f" % (epoch + 1, history[-2], history[-1]))
    return history


def report(case, model, history, evaluation):
    print("final %s history %s" % (case, " ".join("%.17e" % v for v in history)))
    print("final %s evaluate %s" % (case, " ".join("%.17e" % v for v in evaluation)))
    stats = []
    for w in model.get_weights():
        stats += [np.linalg.norm(w), np.abs(w).sum()]
    print("final %s weights %s" % (case, " ".join("%.17e" % v for v in stats)))
    print("final %s iterations %d" % (case, K.get_value(model.optimizer.iterations)))


def run_case(case, args, train, val):
    (x, y), (x_val, y_val) = train, val
    if case == "sgd-fit":
        model = sequential_mlp(SGD(lr=args.lr, momentum=0.9))
        fit = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_val, y_val), shuffle=args.shuffle, verbose=2)
        history = [v for key in sorted(fit.history) for v in fit.history[key]]
    elif case == "adam-fit":
        model = functional_mlp(Adam(lr=args.lr / 10))
        fit = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
                        validation_data=(x_val, y_val), shuffle=args.shuffle, verbose=2)
        history = [v for key in sorted(fit.history) for v in fit.history[key]]
    elif case == "generator":
        model = sequential_mlp(SGD(lr=args.lr, momentum=0.9, nesterov=True))
        fit = model.fit_generator(Batches(x, y, args.batch_size), epochs=args.epochs,
                                  validation_data=(x_val, y_val), verbose=2, workers=0)
        history = [v for key in sorted(fit.history) for v in fit.history[key]]
    else:
        model = sequential_mlp(Adam(lr=args.lr / 10))
        history = train_loop(model, x, y, args.batch_size, args.epochs)
        history += list(model.test_on_batch(x_val, y_val))
    evaluation = model.evaluate(x_val, y_val, batch_size=40, verbose=0)
    report(case, model, history, evaluation)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--train-rows", type=int, default=1500, help="at most 1500")
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    parser.add_argument("--floatx", default="float32")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()

    K.set_floatx(args.floatx)
    train, val = load_data(args.floatx, min(args.train_rows, 1500))
    for case in args.cases.split(","):
        if case not in CASES:
            parser.error("unknown case %r; choose from %s" % (case, ", ".join(CASES)))
        np.random.seed(args.seed)
        run_case(case, args, train, val)


if __name__ == "__main__":
    main()
