"""The plain Theano models `tmpi bench` times, and the script that times them.

Nothing here knows about tmpi.  `tmpi bench` runs this file as a user's
script, unwrapped (``python models.py --model convnet``) and wrapped
(``tmpi wrap -n N models.py --model convnet``), and reads the last line it
prints, ``bench-steps {...}``: the seconds of every timed training call and,
with ``--epochs``, of every epoch, and the device Theano computed on.  Under ``tmpi wrap`` with N ranks the
batch is the global one: each rank computes ``batch / N`` rows of it.

``convnet``
    conv 3x3 (32) - relu - max-pool 2 - conv 3x3 (64) - relu - max-pool 2
    - dense 256 - relu - dense 10 - softmax on 3x32x32 images; SGD with
    momentum.  1.07 M parameters (4.3 MB of gradients) against ~20 M
    multiply-adds per sample: compute-bound.
``wide``
    the same conv net with a dense layer of 1536 units: 6.3 M parameters,
    25 MB of gradients, ~26 M multiply-adds per sample.  The network part's
    model (at least 20 MB of gradients).
``deep``
    a deep narrow MLP with BatchNorm-style state: 26 blocks of dense 64 -
    batch normalisation (gamma, beta; running mean and variance updated by
    every step) - relu, then dense 10.  106 parameter arrays of at most 4 K values
    each, 52 state arrays: what costs per array, not per value.
``tiny``
    the Theano tutorials' MLP: 784 - tanh 500 - softmax 10, batch 20, plain
    SGD with an L2 penalty.  A step is about a millisecond:
    latency-bound.

Every model is float32 whatever Theano's ``floatX``; the data are generated
(a fixed random pattern per class plus noise).
"""
import argparse
import json
import sys
import time

import numpy as np

#: ``--model``: (input shape of one sample, default batch, hidden width).
MODELS = {"convnet": ((3, 32, 32), 64, 256), "wide": ((3, 32, 32), 64, 1536),
          "deep": ((64,), 64, 64), "tiny": ((784,), 20, 500)}
#: Blocks of the ``deep`` model.
DEEP_BLOCKS = 26


def generated_data(n, shape, seed=0, classes=10):
    """``(x, y)``: each class a fixed random pattern plus noise, x in [0, 1]."""
    rng = np.random.RandomState(seed)
    patterns = rng.uniform(0, 1, (classes,) + tuple(shape)).astype("float32")
    y = rng.randint(0, classes, n).astype("int32")
    x = 0.7 * patterns[y] + 0.3 * rng.uniform(0, 1, (n,) + tuple(shape)).astype("float32")
    return x.astype("float32"), y


def convnet_shapes(dense=256):
    """Parameter shapes of the conv net (no Theano needed: the exchange part
    reduces gradients of these shapes)."""
    return [(32, 3, 3, 3), (32,), (64, 32, 3, 3), (64,), (64 * 8 * 8, dense), (dense,),
            (dense, 10), (10,)]


class _Parameters:
    """The model's shared variables, initialised from one seeded generator."""

    def __init__(self, seed):
        self.rng = np.random.RandomState(seed)
        self.params = []

    def add(self, shape, fan_in, name, value=None):
        import theano
        if value is None:
            value = (self.rng.normal(0, np.sqrt(2.0 / fan_in), shape) if fan_in
                     else np.zeros(shape))
        variable = theano.shared(np.asarray(value, dtype="float32"), name=name)
        self.params.append(variable)
        return variable


def _convnet(x, p, dense):
    import theano.tensor as T
    from theano.tensor.nnet import conv2d, relu
    from theano.tensor.signal.pool import pool_2d
    shapes = convnet_shapes(dense)
    names = ("conv1_W", "conv1_b", "conv2_W", "conv2_b", "dense1_W", "dense1_b",
             "dense2_W", "dense2_b")
    fan_in = {0: 27, 2: 288, 4: 4096, 6: dense}
    w1, b1, w2, b2, w3, b3, w4, b4 = [p.add(s, fan_in.get(i, 0), n)
                                      for i, (s, n) in enumerate(zip(shapes, names))]
    h = relu(conv2d(x, w1, border_mode="half") + b1.dimshuffle("x", 0, "x", "x"))
    h = pool_2d(h, ws=(2, 2), ignore_border=True)
    h = relu(conv2d(h, w2, border_mode="half") + b2.dimshuffle("x", 0, "x", "x"))
    h = pool_2d(h, ws=(2, 2), ignore_border=True)
    h = relu(T.dot(h.flatten(2), w3) + b3)
    return T.nnet.softmax(T.dot(h, w4) + b4), []


def _deep(x, p, width, blocks=DEEP_BLOCKS):
    """Dense - batch norm - relu blocks; returns the running statistics' updates."""
    import theano
    import theano.tensor as T
    from theano.tensor.nnet import relu
    h, fan_in, state = x, width, []
    for i in range(blocks):
        w = p.add((fan_in, width), fan_in, "block%d_W" % i)
        b = p.add((width,), 0, "block%d_b" % i)
        gamma = p.add((width,), 0, "block%d_gamma" % i, np.ones(width))
        beta = p.add((width,), 0, "block%d_beta" % i)
        z = T.dot(h, w) + b
        mean, var = z.mean(axis=0), z.var(axis=0)
        h = relu(gamma * (z - mean) / T.sqrt(var + np.float32(1e-5)) + beta)
        running_mean = theano.shared(np.zeros(width, "float32"), name="block%d_mean" % i)
        running_var = theano.shared(np.ones(width, "float32"), name="block%d_var" % i)
        alpha, keep = np.float32(0.1), np.float32(0.9)
        state += [(running_mean, keep * running_mean + alpha * mean),
                  (running_var, keep * running_var + alpha * var)]
        fan_in = width
    w = p.add((width, 10), width, "out_W")
    b = p.add((10,), 0, "out_b")
    return T.nnet.softmax(T.dot(h, w) + b), state


def build(model="convnet", seed=0, lr=0.01, momentum=0.9):
    """Compile ``model``'s training function ``train(x, y) -> [loss, accuracy]``
    (``tiny``: ``-> loss``).

    Goes through ``theano.grad`` and ``theano.function`` like any user
    script, so a running tmpi session distributes it.
    """
    import theano
    import theano.tensor as T
    shape, _, width = MODELS[model]
    p = _Parameters(seed)
    x = T.TensorType("float32", (False,) * (1 + len(shape)))("x")
    y = T.ivector("y")
    if model == "tiny":
        # The tutorial's MLP (deeplearning.net mlp.py): tanh hidden layer,
        # uniform initialisation, SGD on NLL + L2, one returned cost.
        bound = np.sqrt(6.0 / (784 + width))
        w1 = p.add((784, width), 0, "hidden_W", p.rng.uniform(-bound, bound, (784, width)))
        b1 = p.add((width,), 0, "hidden_b")
        w2 = p.add((width, 10), 0, "logreg_W", np.zeros((width, 10)))
        b2 = p.add((10,), 0, "logreg_b")
        probs = T.nnet.softmax(T.dot(T.tanh(T.dot(x, w1) + b1), w2) + b2)
        nll = -T.mean(T.log(probs)[T.arange(y.shape[0]), y])
        # The tutorial's L1 weight is 0: only the L2 penalty is in the cost.
        cost = nll + np.float32(1e-4) * ((w1 ** 2).sum() + (w2 ** 2).sum())
        eta = np.float32(lr)
        updates = [(q, q - eta * g) for q, g in zip(p.params, theano.grad(cost, p.params))]
        return theano.function([x, y], cost, updates=updates, name="train_tiny")
    if model == "deep":
        probs, state = _deep(x, p, width)
    else:
        probs, state = _convnet(x, p, width)
    loss = T.nnet.categorical_crossentropy(probs, y).mean()
    loss.name = "loss"
    accuracy = T.mean(T.eq(T.argmax(probs, axis=1), y))
    accuracy.name = "accuracy"
    mu, eta = np.float32(momentum), np.float32(lr)
    updates = list(state)
    for q, g in zip(p.params, theano.grad(loss, p.params)):
        velocity = theano.shared(np.zeros_like(q.get_value()), name=q.name + "_velocity")
        updates.append((velocity, mu * velocity - eta * g))
        updates.append((q, q + mu * velocity - eta * g))
    return theano.function([x, y], [loss, accuracy], updates=updates, name="train_" + model)


def time_steps(train, x, y, batch_size, steps, warmup):
    """Seconds of each of ``steps`` timed calls after ``warmup`` untimed ones."""
    n = len(x)
    times = []
    for i in range(warmup + steps):
        lo = (i * batch_size) % (n - batch_size + 1)
        start = time.perf_counter()
        train(x[lo:lo + batch_size], y[lo:lo + batch_size])
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def time_epochs(train, x, y, batch_size, epochs, warmup):
    """Seconds of each whole epoch over ``x`` (after ``warmup`` untimed
    epochs) and of every step in them, as a training loop runs them."""
    batches = len(x) // batch_size
    epoch_times, step_times = [], []
    for epoch in range(warmup + epochs):
        start = time.perf_counter()
        for i in range(batches):
            begin = time.perf_counter()
            train(x[i * batch_size:(i + 1) * batch_size], y[i * batch_size:(i + 1) * batch_size])
            if epoch >= warmup:
                step_times.append(time.perf_counter() - begin)
        if epoch >= warmup:
            epoch_times.append(time.perf_counter() - start)
    return epoch_times, step_times


def _device():
    """The device Theano computes on: ``theano.config.device``, or ``"cpu"``
    where its GPU backend could not open it."""
    import theano
    gpuarray = sys.modules.get("theano.gpuarray")
    if theano.config.device == "cpu" or not getattr(gpuarray, "pygpu_activated", False):
        return "cpu"
    return str(theano.config.device)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="convnet")
    parser.add_argument("--batch-size", type=int, help="rows per step (default: the model's)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (epochs) first")
    parser.add_argument("--epochs", type=int,
                        help="time this many whole epochs over --rows instead of --steps")
    parser.add_argument("--rows", type=int, default=5000, help="rows of an epoch")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shape, batch, _ = MODELS[args.model]
    batch = args.batch_size or batch
    rows = args.rows if args.epochs else max(4 * batch, 512)
    x, y = generated_data(rows, shape, seed=args.seed)
    train = build(args.model, seed=args.seed)
    record = {"model": args.model, "batch_size": batch, "device": _device()}
    if args.epochs:
        record["epochs"], record["seconds"] = time_epochs(train, x, y, batch, args.epochs,
                                                          args.warmup)
    else:
        record["seconds"] = time_steps(train, x, y, batch, args.steps, args.warmup)
    print("bench-steps %s" % json.dumps(record))


if __name__ == "__main__":
    main()
