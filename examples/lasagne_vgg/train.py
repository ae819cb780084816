#!/usr/bin/env python
"""Train VGG-16 (configuration D) with Lasagne, as Simonyan & Zisserman did:
SGD with momentum 0.9, weight decay 5e-4, dropout 0.5 on fc6/fc7, and the
learning rate divided by 10 when validation accuracy stops improving.

A plain Lasagne script; distribute it without changing it:

    # full size on CIFAR-10 (the python batches, already on disk)
    tmpi wrap -n 4 train.py --cifar10 ~/data/cifar-10-batches-py --epochs 74
    # full size on an image folder (<dir>/<class>/<image>), 224x224 like ImageNet
    tmpi wrap -n 4 train.py --image-folder ~/data/images --image-size 224
    # a tiny VGG on generated images, in a few minutes on a laptop
    tmpi wrap -n 2 train.py --width 0.0625 --stages 2 --fc-units 32 --image-size 16

Nothing is downloaded: without --cifar10 or --image-folder the data are
generated images (each class a fixed random pattern plus noise).
"""
import argparse
import sys
import time

from tmpi_adapters import datasets   # first: its import also makes Lasagne 0.1 load

import numpy as np
import theano
import theano.tensor as T

import lasagne

import vgg16


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    data = parser.add_mutually_exclusive_group()
    data.add_argument("--cifar10", metavar="DIR", help="cifar-10-batches-py directory")
    data.add_argument("--image-folder", metavar="DIR", help="images as DIR/<class>/<file>")
    parser.add_argument("--samples", type=int, default=2048,
                        help="generated images when no data set is given")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--val-fraction", type=float, default=0.1,
                        help="held-out share of generated or image-folder data")
    parser.add_argument("--width", type=float, default=1.0,
                        help="multiplier of every convolution's filters (1 = the paper's)")
    parser.add_argument("--stages", type=int, default=5, help="convolution stages kept (1-5)")
    parser.add_argument("--fc-units", type=int, default=4096, help="units of fc6 and fc7")
    parser.add_argument("--epochs", type=int, default=74)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=5e-4)
    parser.add_argument("--patience", type=int, default=3,
                        help="epochs without better validation accuracy before lr /= 10")
    parser.add_argument("--flip", action="store_true",
                        help="random horizontal flips of training images (natural images)")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        vgg16.check_config(args.image_size, args.stages, args.width)
    except ValueError as error:
        parser.error(str(error))
    if not 0 < args.val_fraction < 1:
        parser.error("--val-fraction must be between 0 and 1")
    return args


# ----------------------------------------------------------------- data

def load_data(args):
    """``(x_train, y_train, x_val, y_val, class_count)`` with images (N, C, S, S)."""
    if args.cifar10:
        (x_train, y_train), (x_val, y_val) = datasets.cifar10(args.cifar10)
        if args.image_size != 32:
            sys.exit("CIFAR-10 images are 32x32: use --image-size 32")
        return x_train, y_train, x_val, y_val, 10
    if args.image_folder:
        size = (args.image_size, args.image_size)
        x, y, classes = datasets.image_folder(args.image_folder, size=size)
        count = len(classes)
    else:
        x, y = datasets.synthetic_images(args.samples, (3, args.image_size, args.image_size))
        count = 10
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    split = len(x) - max(1, int(len(x) * args.val_fraction))
    return x[:split], y[:split], x[split:], y[split:], count


def iterate_minibatches(inputs, targets, batchsize, shuffle=False, flip=False):
    if shuffle:
        indices = np.random.permutation(len(inputs))
    for start in range(0, len(inputs) - batchsize + 1, batchsize):
        excerpt = indices[start:start + batchsize] if shuffle else slice(start, start + batchsize)
        batch = inputs[excerpt]
        if flip:
            mirrored = np.random.rand(len(batch)) < 0.5
            batch = batch.copy()
            batch[mirrored] = batch[mirrored, :, :, ::-1]
        yield batch, targets[excerpt]


# ----------------------------------------------------------------- training

def compile_functions(net, input_var, target_var, learning_rate, args):
    prediction = lasagne.layers.get_output(net['prob'])
    loss = lasagne.objectives.categorical_crossentropy(prediction, target_var).mean()
    loss += args.weight_decay * lasagne.regularization.regularize_network_params(
        net['prob'], lasagne.regularization.l2)
    accuracy = T.mean(T.eq(T.argmax(prediction, axis=1), target_var),
                      dtype=theano.config.floatX)
    params = lasagne.layers.get_all_params(net['prob'], trainable=True)
    updates = lasagne.updates.momentum(loss, params, learning_rate=learning_rate,
                                       momentum=args.momentum)
    train_fn = theano.function([input_var, target_var], [loss, accuracy], updates=updates,
                               name="train_fn")

    test_prediction = lasagne.layers.get_output(net['prob'], deterministic=True)
    test_loss = lasagne.objectives.categorical_crossentropy(test_prediction,
                                                            target_var).mean()
    test_acc = T.mean(T.eq(T.argmax(test_prediction, axis=1), target_var),
                      dtype=theano.config.floatX)
    val_fn = theano.function([input_var, target_var], [test_loss, test_acc], name="val_fn")
    return train_fn, val_fn


def evaluate(val_fn, x, y, batch_size):
    """Loss and accuracy over every row of ``(x, y)``."""
    totals = np.zeros(2)
    for start in range(0, len(x), batch_size):
        inputs, targets = x[start:start + batch_size], y[start:start + batch_size]
        totals += np.array(val_fn(inputs, targets)) * len(inputs)
    return totals / len(x)


def main(argv=None):
    args = parse_args(argv)
    if args.seed is not None:
        np.random.seed(args.seed)
    x_train, y_train, x_val, y_val, classes = load_data(args)
    batch_size = min(args.batch_size, len(x_train))

    input_var = T.tensor4('inputs')
    target_var = T.ivector('targets')
    net = vgg16.build_model((None,) + x_train.shape[1:], classes, width=args.width,
                            stages=args.stages, fc_units=args.fc_units, input_var=input_var)
    print("VGG-16 (configuration D): %d stage(s), width %g, fc %d, %d parameters; "
          "%d training and %d validation images of %s"
          % (args.stages, args.width, args.fc_units, vgg16.count_params(net),
             len(x_train), len(x_val), "x".join(map(str, x_train.shape[1:]))))
    learning_rate = theano.shared(lasagne.utils.floatX(args.lr), name="learning_rate")
    print("Compiling functions...")
    train_fn, val_fn = compile_functions(net, input_var, target_var, learning_rate, args)

    best_acc, waited = -1.0, 0
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        train_loss = train_acc = 0.0
        batches = 0
        for inputs, targets in iterate_minibatches(x_train, y_train, batch_size,
                                                   shuffle=True, flip=args.flip):
            loss, acc = train_fn(inputs, targets)
            train_loss += loss
            train_acc += acc
            batches += 1
        val_loss, val_acc = evaluate(val_fn, x_val, y_val, batch_size)
        print("epoch %3d/%d  train loss %.4f acc %.4f  val loss %.4f acc %.4f  lr %g  (%.1f s)"
              % (epoch, args.epochs, train_loss / batches, train_acc / batches, val_loss,
                 val_acc, learning_rate.get_value(), time.time() - start))
        # The paper's schedule: lr / 10 when validation accuracy stops improving.
        if val_acc > best_acc:
            best_acc, waited = val_acc, 0
        else:
            waited += 1
            if waited >= args.patience:
                learning_rate.set_value(lasagne.utils.floatX(learning_rate.get_value() / 10))
                waited = 0

    values = lasagne.layers.get_all_param_values(net['prob'])
    print("final train_loss %.17g val_loss %.17g val_acc %.17g"
          % (train_loss / batches, val_loss, val_acc))
    print("final norms %s" % " ".join("%.17g" % np.linalg.norm(v) for v in values))


if __name__ == "__main__":
    main()
