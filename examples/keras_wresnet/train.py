"""Train a Wide ResNet (WRN-d-k) on CIFAR-10 with Keras 2 -- an ordinary Keras script.

Nothing here knows about tmpi beyond its dataset loaders: it builds the model,
compiles it with SGD + Nesterov momentum, and calls ``fit`` (or
``fit_generator`` with augmentation) with checkpoint, CSV and learning-rate
schedule callbacks.

    python train.py --data ~/data/cifar-10-batches-py                # one process
    tmpi wrap -n 4 train.py --data ~/data/cifar-10-batches-py        # four ranks, BSP
    tmpi wrap -n 2 train.py --depth 10 --width 1 --dataset synthetic --epochs 3 --no-augment
"""
import argparse
import os

import numpy as np

# tmpi's loaders read local files only; importing tmpi_adapters first also lets
# Keras 2.3.1 import on recent Pythons when this runs without tmpi.
from tmpi_adapters import datasets

from keras import backend as K
from keras.callbacks import CSVLogger, LearningRateScheduler, ModelCheckpoint
from keras.optimizers import SGD
from keras.preprocessing.image import ImageDataGenerator

from wresnet import wide_resnet


def load(args):
    """``(x_train, y_train), (x_val, y_val)`` scaled to [0, 1] in Keras' data format."""
    channels_last = K.image_data_format() == "channels_last"
    if args.dataset == "cifar10":
        return datasets.cifar10(args.data, dtype=K.floatx(), channels_last=channels_last)
    size = args.image_size
    x, y = datasets.synthetic_images(args.train_size + args.val_size, shape=(3, size, size),
                                     dtype=K.floatx(), seed=args.seed)
    if channels_last:
        x = x.transpose(0, 2, 3, 1).copy()
    n = args.train_size
    return (x[:n], y[:n]), (x[n:], y[n:])


def standardize(train, val):
    """Per-channel mean/std of the training images, applied to both sets."""
    axes = (0, 2, 3) if K.image_data_format() == "channels_first" else (0, 1, 2)
    mean = train.mean(axis=axes, keepdims=True)
    std = train.std(axis=axes, keepdims=True) + 1e-7
    return ((train - mean) / std).astype(K.floatx()), ((val - mean) / std).astype(K.floatx())


def step_schedule(base_lr, epochs):
    """The paper's schedule: x0.2 at 30%, 60% and 80% of training (60/120/160 of 200)."""
    milestones = [int(epochs * f) for f in (0.3, 0.6, 0.8)]

    def schedule(epoch):
        return base_lr * 0.2 ** sum(epoch >= m for m in milestones if m > 0)
    return schedule


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--depth", type=int, default=28, help="d of WRN-d-k (6n + 4)")
    parser.add_argument("--width", type=int, default=10, help="k of WRN-d-k")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--dataset", choices=("cifar10", "synthetic"), default="cifar10")
    parser.add_argument("--data", default="cifar-10-batches-py",
                        help="directory with CIFAR-10's python batches (data_batch_1 ...)")
    parser.add_argument("--train-size", type=int, default=1024, help="synthetic images")
    parser.add_argument("--val-size", type=int, default=256, help="synthetic images")
    parser.add_argument("--image-size", type=int, default=32, help="synthetic image side")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--no-augment", dest="augment", action="store_false",
                        help="no random crops and flips")
    parser.add_argument("--checkpoint", help="save the best model (val_accuracy) here (.h5)")
    parser.add_argument("--csv", help="log every epoch's metrics to this CSV file")
    parser.add_argument("--data-format", choices=("channels_first", "channels_last"),
                        default="channels_first",
                        help="channels_first is the fast layout for Theano")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    K.set_image_data_format(args.data_format)
    np.random.seed(args.seed)
    (x_train, y_train), (x_val, y_val) = load(args)
    x_train, x_val = standardize(x_train, x_val)

    model = wide_resnet(args.depth, args.width, input_shape=x_train.shape[1:],
                        classes=int(y_train.max()) + 1, dropout=args.dropout,
                        weight_decay=args.weight_decay)
    model.compile(SGD(lr=args.lr, momentum=args.momentum, nesterov=True),
                  "sparse_categorical_crossentropy", metrics=["accuracy"])
    print("WRN-%d-%d: %d parameters, %d training images"
          % (args.depth, args.width, model.count_params(), len(x_train)))

    callbacks = [LearningRateScheduler(step_schedule(args.lr, args.epochs))]
    if args.checkpoint:
        callbacks.append(ModelCheckpoint(args.checkpoint, monitor="val_accuracy",
                                         save_best_only=True))
    if args.csv:
        callbacks.append(CSVLogger(args.csv))

    if args.augment:
        # Random 4-pixel shifts (reflected borders) and horizontal flips.
        augment = ImageDataGenerator(width_shift_range=4, height_shift_range=4,
                                     horizontal_flip=True, fill_mode="reflect",
                                     data_format=args.data_format)
        batches = augment.flow(x_train, y_train, batch_size=args.batch_size)
        history = model.fit_generator(batches, epochs=args.epochs, callbacks=callbacks,
                                      validation_data=(x_val, y_val), verbose=2)
    else:
        history = model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
                            callbacks=callbacks, validation_data=(x_val, y_val), verbose=2)

    val_loss, val_accuracy = model.evaluate(x_val, y_val, batch_size=args.batch_size,
                                            verbose=0)
    print("final val_loss %.4f val_accuracy %.4f" % (val_loss, val_accuracy))
    print("final best_val_accuracy %.4f" % max(history.history["val_accuracy"]))
    if args.checkpoint:
        print("best model saved to %s" % os.path.abspath(args.checkpoint))


if __name__ == "__main__":
    main()
