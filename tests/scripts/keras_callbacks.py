"""An ordinary Keras 2 script with BatchNorm, Dropout and the usual callbacks:
checkpoints of the best model, a CSV log, early stopping and a learning rate
that drops on plateaus.  The trained model is then saved, loaded back and
evaluated.

    python keras_callbacks.py --out runs/digits --epochs 4
"""
import argparse
import os

import numpy as np
from sklearn.datasets import load_digits

from keras import backend as K
from keras.callbacks import CSVLogger, EarlyStopping, ModelCheckpoint, ReduceLROnPlateau
from keras.layers import Activation, BatchNormalization, Dense, Dropout
from keras.models import Sequential, load_model
from keras.optimizers import SGD


def load_data(dtype):
    digits = load_digits()
    x = (digits.data / 16.0).astype(dtype)
    y = digits.target.astype("int32")
    order = np.random.RandomState(0).permutation(len(x))
    return (x[order[:1500]], y[order[:1500]]), (x[order[1500:]], y[order[1500:]])


def build(lr):
    model = Sequential([
        Dense(32, input_shape=(64,)),
        BatchNormalization(),
        Activation("relu"),
        Dropout(0.2),
        Dense(10, activation="softmax"),
    ])
    model.compile(SGD(lr=lr, momentum=0.9), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def numbers(values):
    return " ".join("%.17e" % v for v in values)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="directory for checkpoints and logs")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--patience", type=int, default=10)
    parser.add_argument("--min-delta", type=float, default=0.0,
                        help="improvement that counts for early stopping and the schedule")
    parser.add_argument("--floatx", default="float32")
    args = parser.parse_args()

    K.set_floatx(args.floatx)
    np.random.seed(3)
    (x, y), (x_val, y_val) = load_data(args.floatx)
    if not os.path.isdir(args.out):
        os.makedirs(args.out)
    model = build(args.lr)
    callbacks = [
        ModelCheckpoint(os.path.join(args.out, "best.h5"), monitor="val_loss",
                        save_best_only=True, verbose=1),
        CSVLogger(os.path.join(args.out, "log.csv")),
        EarlyStopping(monitor="val_loss", min_delta=args.min_delta, patience=args.patience,
                      verbose=1),
        ReduceLROnPlateau(monitor="val_loss", factor=0.5, patience=0,
                          min_delta=args.min_delta, verbose=1),
    ]
    history = model.fit(x, y, batch_size=50, epochs=args.epochs, callbacks=callbacks,
                        validation_data=(x_val, y_val), verbose=2)
    model.save(os.path.join(args.out, "final.h5"))
    model.save_weights(os.path.join(args.out, "weights.h5"))

    restored = load_model(os.path.join(args.out, "final.h5"))
    copy = build(args.lr)
    copy.load_weights(os.path.join(args.out, "weights.h5"))
    batch_norm = model.layers[1]
    print("final epochs %d" % len(history.history["loss"]))
    print("final val_loss %s" % numbers(history.history["val_loss"]))
    print("final lr %.17e" % K.get_value(model.optimizer.lr))
    print("final moving_stats %s" % numbers(
        [np.linalg.norm(K.get_value(batch_norm.moving_mean)),
         np.linalg.norm(K.get_value(batch_norm.moving_variance))]))
    print("final weights %s" % numbers([np.linalg.norm(w) for w in model.get_weights()]))
    print("final evaluate %s" % numbers(model.evaluate(x_val, y_val, verbose=0)))
    print("final restored %s" % numbers(restored.evaluate(x_val, y_val, verbose=0)))
    print("final reloaded %s" % numbers(copy.evaluate(x_val, y_val, verbose=0)))


if __name__ == "__main__":
    main()
