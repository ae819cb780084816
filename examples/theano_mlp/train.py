"""A plain Theano MLP on scikit-learn's digits, written the classic way.

Nothing here knows about tmpi: shared variables, theano.grad, momentum updates
and a theano.function with updates, called on numpy minibatches.

    python train.py --epochs 10                       # one process
    tmpi wrap -n 2 train.py --epochs 10               # two ranks, BSP
"""
import argparse
import time

import numpy as np
import theano
import theano.tensor as T
from sklearn.datasets import load_digits


def load_data(dtype):
    digits = load_digits()
    x = (digits.data / 16.0).astype(dtype)
    y = digits.target.astype("int32")
    order = np.random.RandomState(0).permutation(len(x))
    x, y = x[order], y[order]
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def init_weights(rng, n_in, n_out, dtype):
    bound = np.sqrt(6.0 / (n_in + n_out))
    w = theano.shared(rng.uniform(-bound, bound, (n_in, n_out)).astype(dtype), name="W")
    b = theano.shared(np.zeros(n_out, dtype=dtype), name="b")
    return w, b


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--seed", type=int, default=None,
                        help="seed numpy's global generator (initialisation and shuffling)")
    args = parser.parse_args()

    dtype = theano.config.floatX
    (x_train, y_train), (x_val, y_val) = load_data(dtype)
    if args.seed is not None:
        np.random.seed(args.seed)
    rng = np.random

    x = T.matrix("x")
    y = T.ivector("y")
    w1, b1 = init_weights(rng, 64, args.hidden, dtype)
    w2, b2 = init_weights(rng, args.hidden, 10, dtype)
    params = [w1, b1, w2, b2]

    hidden = T.tanh(T.dot(x, w1) + b1)
    probs = T.nnet.softmax(T.dot(hidden, w2) + b2)
    loss = T.nnet.categorical_crossentropy(probs, y).mean()
    accuracy = T.mean(T.eq(T.argmax(probs, axis=1), y))

    grads = T.grad(loss, params)
    updates = []
    for p, g in zip(params, grads):
        velocity = theano.shared(np.zeros_like(p.get_value()), name=p.name + "_velocity")
        updates.append((velocity, args.momentum * velocity - args.lr * g))
        updates.append((p, p + args.momentum * velocity - args.lr * g))

    train_fn = theano.function([x, y], [loss, accuracy], updates=updates, name="train_fn")
    val_fn = theano.function([x, y], [loss, accuracy], name="val_fn")

    n_batches = int(np.ceil(len(x_train) / float(args.batch_size)))
    for epoch in range(1, args.epochs + 1):
        start = time.time()
        order = np.random.permutation(len(x_train))
        total_loss = total_acc = 0.0
        for i in range(n_batches):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            batch_loss, batch_acc = train_fn(x_train[idx], y_train[idx])
            total_loss += batch_loss * len(idx)
            total_acc += batch_acc * len(idx)
        val_loss, val_acc = val_fn(x_val, y_val)
        print("epoch %2d/%d  train loss %.4f  train acc %.4f  val loss %.4f  val acc %.4f  "
              "(%.2f s)" % (epoch, args.epochs, total_loss / len(x_train),
                            total_acc / len(x_train), val_loss, val_acc, time.time() - start))

    norms = " ".join("%.17g" % np.linalg.norm(p.get_value()) for p in params)
    print("final val_loss %.17g val_acc %.17g" % (val_loss, val_acc))
    print("final param_norms %s" % norms)


if __name__ == "__main__":
    main()
