"""A small compute-bound conv net in plain Theano: the model `tmpi bench` scales.

Nothing here knows about tmpi.  `tmpi bench` runs this file unwrapped
(``python bench_convnet.py``) and wrapped (``tmpi wrap -n N bench_convnet.py``)
and reads the last line it prints, ``bench-steps {...}``: the seconds of each
timed training call.  Under ``tmpi wrap`` with N ranks pass an N times larger
``--batch-size`` so that every rank keeps the same work per step.

    conv 3x3 (32) - relu - max-pool 2 - conv 3x3 (64) - relu - max-pool 2
    - dense 256 - relu - dense 10 - softmax;  SGD with momentum, float32

About 1.07 M parameters (4.3 MB of gradients per step) against ~20 M
multiply-adds per sample: at batch 64 a step computes for a few hundred ms
and exchanges a few ms.  The data are generated: a fixed random pattern per
class plus noise.
"""
import argparse
import json
import time

import numpy as np


def generated_images(n, seed=0, shape=(3, 32, 32), classes=10):
    """``(x, y)``: each class a fixed random pattern plus noise, x in [0, 1]."""
    rng = np.random.RandomState(seed)
    patterns = rng.uniform(0, 1, (classes,) + shape).astype("float32")
    y = rng.randint(0, classes, n).astype("int32")
    x = 0.7 * patterns[y] + 0.3 * rng.uniform(0, 1, (n,) + shape).astype("float32")
    return x.astype("float32"), y


def build(seed=0, lr=0.01, momentum=0.9):
    """Compile the training function ``train(x, y) -> [loss, accuracy]``.

    Goes through ``theano.grad`` and ``theano.function`` like any user
    script, so a running tmpi session distributes it.
    """
    import theano
    import theano.tensor as T
    from theano.tensor.nnet import conv2d, relu
    from theano.tensor.signal.pool import pool_2d

    rng = np.random.RandomState(seed)

    def shared(shape, fan_in, name):
        value = rng.normal(0, np.sqrt(2.0 / fan_in), shape) if fan_in else np.zeros(shape)
        return theano.shared(value.astype("float32"), name=name)

    w1, b1 = shared((32, 3, 3, 3), 27, "conv1_W"), shared((32,), 0, "conv1_b")
    w2, b2 = shared((64, 32, 3, 3), 288, "conv2_W"), shared((64,), 0, "conv2_b")
    w3, b3 = shared((64 * 8 * 8, 256), 4096, "dense1_W"), shared((256,), 0, "dense1_b")
    w4, b4 = shared((256, 10), 256, "dense2_W"), shared((10,), 0, "dense2_b")
    params = [w1, b1, w2, b2, w3, b3, w4, b4]

    x, y = T.tensor4("x", dtype="float32"), T.ivector("y")
    h = relu(conv2d(x, w1, border_mode="half") + b1.dimshuffle("x", 0, "x", "x"))
    h = pool_2d(h, ws=(2, 2), ignore_border=True)
    h = relu(conv2d(h, w2, border_mode="half") + b2.dimshuffle("x", 0, "x", "x"))
    h = pool_2d(h, ws=(2, 2), ignore_border=True)
    h = relu(T.dot(h.flatten(2), w3) + b3)
    probs = T.nnet.softmax(T.dot(h, w4) + b4)
    loss = T.nnet.categorical_crossentropy(probs, y).mean()
    loss.name = "loss"
    accuracy = T.mean(T.eq(T.argmax(probs, axis=1), y))
    accuracy.name = "accuracy"

    # float32 constants: the model stays float32 whatever Theano's floatX.
    mu, eta = np.float32(momentum), np.float32(lr)
    updates = []
    for p, g in zip(params, theano.grad(loss, params)):
        velocity = theano.shared(np.zeros_like(p.get_value()), name=p.name + "_velocity")
        updates.append((velocity, mu * velocity - eta * g))
        updates.append((p, p + mu * velocity - eta * g))
    return theano.function([x, y], [loss, accuracy], updates=updates, name="train_convnet")


def time_steps(train, x, y, batch_size, steps, warmup):
    """Seconds of each of ``steps`` timed calls after ``warmup`` untimed ones,
    and the last loss."""
    n = len(x)
    times, loss = [], float("nan")
    for i in range(warmup + steps):
        lo = (i * batch_size) % (n - batch_size + 1)
        xb, yb = x[lo:lo + batch_size], y[lo:lo + batch_size]
        start = time.perf_counter()
        loss, _ = train(xb, yb)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times, float(loss)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    x, y = generated_images(max(4 * args.batch_size, 512), seed=args.seed)
    train = build(seed=args.seed)
    times, loss = time_steps(train, x, y, args.batch_size, args.steps, args.warmup)
    print("bench-steps %s" % json.dumps({"batch_size": args.batch_size, "seconds": times,
                                         "loss": loss}))


if __name__ == "__main__":
    main()
