#!/usr/bin/env python
"""Wasserstein GAN (Arjovsky, Chintala & Bottou, 2017) in Lasagne, on scikit-learn's digits.

Algorithm 1 of the paper: for every generator update the critic takes
``n_critic`` RMSProp steps (100 during the first 25 generator updates and every
500th one, so the critic stays near its optimum), each followed by clipping
the critic's weights to ``[-c, c]``, with the paper's c=0.01, m=64 and
n_critic=5.  Generator and critic are ReLU multilayer perceptrons, like the
paper's MLP experiments (``--arch dcgan`` gives DCGAN-style convolutional nets
sized for 8x8 digits).  The learning rate is
5e-4 rather than the paper's 5e-5 (``--lr 5e-5``), which was chosen for 64x64
images and hundreds of thousands of updates: on 8x8 digits, 2000 generator
updates then give recognisable digits.

A plain Lasagne script; distribute it without changing it:

    python train.py                                   # one process
    tmpi wrap -n 2 train.py                           # two ranks, BSP

Only rank 0 writes: ``samples.png`` (a grid of generated digits), ``losses.png``
(the critic's Wasserstein estimate and the generator loss) and
``generator.npz`` (the generator's parameters), in ``--out``.
"""
import argparse
import os
import time

from tmpi_adapters.datasets import digits   # first: its import also makes Lasagne 0.1 load

import numpy as np
import theano
import theano.tensor as T

import lasagne
from lasagne.layers import (Conv2DLayer, DenseLayer, InputLayer, ReshapeLayer,
                            get_all_params, get_output)
from lasagne.nonlinearities import LeakyRectify, linear, rectify, sigmoid

#: MPI launchers tell each process its rank in one of these.
RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


def is_rank_zero():
    """True in the one process that writes files (rank 0, or the only process)."""
    for name in RANK_VARIABLES:
        if name in os.environ:
            return os.environ[name] == "0"
    return True


# ----------------------------------------------------------------- networks

class Upscale2D(lasagne.layers.Layer):
    """Nearest-neighbour upscaling by an integer factor (for Lasagne 0.1, which
    has no ``Upscale2DLayer``)."""

    def __init__(self, incoming, factor, **kwargs):
        super(Upscale2D, self).__init__(incoming, **kwargs)
        self.factor = factor

    def get_output_shape_for(self, input_shape):
        return input_shape[:2] + tuple(None if s is None else s * self.factor
                                       for s in input_shape[2:])

    def get_output_for(self, input, **kwargs):
        return input.repeat(self.factor, axis=2).repeat(self.factor, axis=3)


def upscale(incoming, factor):
    layer = getattr(lasagne.layers, "Upscale2DLayer", None)
    return layer(incoming, factor) if layer is not None else Upscale2D(incoming, factor)


def build_generator(noise_var, noise_dim, width, arch):
    """Noise (N, noise_dim) -> images (N, 1, 8, 8) in [0, 1]."""
    net = InputLayer((None, noise_dim), noise_var)
    if arch == "mlp":
        for _ in range(3):
            net = DenseLayer(net, 8 * width, nonlinearity=rectify)
        net = DenseLayer(net, 64, nonlinearity=sigmoid)
        return ReshapeLayer(net, ([0], 1, 8, 8))
    net = DenseLayer(net, 4 * width * 2 * 2, nonlinearity=rectify)
    net = ReshapeLayer(net, ([0], 4 * width, 2, 2))
    net = Conv2DLayer(upscale(net, 2), 2 * width, 3, pad=1, nonlinearity=rectify)
    return Conv2DLayer(upscale(net, 2), 1, 3, pad=1, nonlinearity=sigmoid)


def build_critic(input_var, width, arch):
    """Images (N, 1, 8, 8) -> one unbounded score per image (no sigmoid: a critic)."""
    lrelu = LeakyRectify(0.2)
    net = InputLayer((None, 1, 8, 8), input_var)
    if arch == "mlp":
        for _ in range(3):
            net = DenseLayer(net, 8 * width, nonlinearity=rectify)
        return DenseLayer(net, 1, nonlinearity=linear)
    net = Conv2DLayer(net, width, 3, stride=2, pad=1, nonlinearity=lrelu)
    net = Conv2DLayer(net, 2 * width, 3, stride=2, pad=1, nonlinearity=lrelu)
    return DenseLayer(net, 1, nonlinearity=linear)


# ----------------------------------------------------------------- data

def load_images():
    """All 1797 digits as (N, 1, 8, 8) images in [0, 1]."""
    (x_train, _), (x_val, _) = digits(image_shape=True, validation=0)
    return x_train


def endless_minibatches(images, batch_size):
    """Shuffled minibatches forever; a new order every pass."""
    while True:
        order = np.random.permutation(len(images))
        for start in range(0, len(images) - batch_size + 1, batch_size):
            yield images[order[start:start + batch_size]]


def sample_noise(rows, noise_dim):
    return lasagne.utils.floatX(np.random.normal(size=(rows, noise_dim)))


# ----------------------------------------------------------------- outputs

def save_sample_grid(images, path, columns=8):
    """Write images (N, 1, H, W) in [0, 1] as one grayscale PNG grid."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    n, _, h, w = images.shape
    rows = int(np.ceil(n / float(columns)))
    grid = np.ones((rows * (h + 1) + 1, columns * (w + 1) + 1))
    for i, image in enumerate(images):
        r, c = divmod(i, columns)
        grid[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = image[0]
    # Each digit pixel becomes a 4x4 block so the grid is viewable.
    plt.imsave(path, np.kron(grid, np.ones((4, 4))), cmap="gray", vmin=0.0, vmax=1.0)


def save_loss_plot(history, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    steps = np.arange(1, len(history["wasserstein"]) + 1)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    top.plot(steps, history["wasserstein"], color="tab:blue")
    top.set_ylabel("critic's Wasserstein estimate")
    bottom.plot(steps, history["generator"], color="tab:orange")
    bottom.set_ylabel("generator loss")
    bottom.set_xlabel("generator iteration")
    fig.suptitle("WGAN on digits")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ----------------------------------------------------------------- training

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iterations", type=int, default=2000,
                        help="generator updates")
    parser.add_argument("--critic-iterations", type=int, default=5, help="n_critic")
    parser.add_argument("--warmup-critic-iterations", type=int, default=100,
                        help="n_critic during the first --warmup-iterations and every 500th")
    parser.add_argument("--warmup-iterations", type=int, default=25)
    parser.add_argument("--clip", type=float, default=0.01,
                        help="c: critic weights stay in [-c, c]")
    parser.add_argument("--lr", type=float, default=5e-4, help="alpha: RMSProp learning rate")
    parser.add_argument("--batch-size", type=int, default=64, help="m")
    parser.add_argument("--noise-dim", type=int, default=100)
    parser.add_argument("--width", type=int, default=32,
                        help="mlp: 8*width hidden units; dcgan: filters of the first convolution")
    parser.add_argument("--arch", choices=("mlp", "dcgan"), default="mlp")
    parser.add_argument("--print-every", type=int, default=50)
    parser.add_argument("--out", default="wgan_out", help="directory for rank 0's files")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()

    if args.seed is not None:
        np.random.seed(args.seed)
    images = load_images()
    print("%d digits, %s WGAN, width %d" % (len(images), args.arch, args.width))

    noise_var = T.matrix("noise")
    input_var = T.tensor4("inputs")
    generator = build_generator(noise_var, args.noise_dim, args.width, args.arch)
    critic = build_critic(input_var, args.width, args.arch)

    real_out = get_output(critic)
    fake_out = get_output(critic, get_output(generator))
    # The critic maximises E[f(x)] - E[f(g(z))], the Wasserstein estimate.
    wasserstein = real_out.mean() - fake_out.mean()
    generator_loss = -fake_out.mean()

    critic_params = get_all_params(critic, trainable=True)
    critic_updates = lasagne.updates.rmsprop(-wasserstein, critic_params,
                                             learning_rate=args.lr)
    for param in critic_params:
        critic_updates[param] = T.clip(critic_updates[param], -args.clip, args.clip)
    generator_params = get_all_params(generator, trainable=True)
    generator_updates = lasagne.updates.rmsprop(generator_loss, generator_params,
                                                learning_rate=args.lr)

    print("Compiling functions...")
    critic_train_fn = theano.function([input_var, noise_var], wasserstein,
                                      updates=critic_updates, name="critic_train_fn")
    generator_train_fn = theano.function([noise_var], generator_loss,
                                         updates=generator_updates, name="generator_train_fn")
    generate_fn = theano.function([noise_var],
                                  get_output(generator, deterministic=True))

    batches = endless_minibatches(images, args.batch_size)
    history = {"wasserstein": [], "generator": []}
    start = time.time()
    for iteration in range(args.iterations):
        warm = iteration < args.warmup_iterations or iteration % 500 == 0
        n_critic = args.warmup_critic_iterations if warm else args.critic_iterations
        estimates = [critic_train_fn(real, sample_noise(len(real), args.noise_dim))
                     for real in (next(batches) for _ in range(n_critic))]
        history["wasserstein"].append(float(np.mean(estimates)))
        history["generator"].append(float(generator_train_fn(
            sample_noise(args.batch_size, args.noise_dim))))
        if (iteration + 1) % args.print_every == 0 or iteration + 1 == args.iterations:
            print("iteration %5d/%d  Wasserstein estimate %.5f  generator loss %.5f  (%.1f s)"
                  % (iteration + 1, args.iterations, history["wasserstein"][-1],
                     history["generator"][-1], time.time() - start))

    fixed_noise = sample_noise(64, args.noise_dim)
    samples = generate_fn(fixed_noise)
    if is_rank_zero():
        os.makedirs(args.out, exist_ok=True)
        save_sample_grid(samples, os.path.join(args.out, "samples.png"))
        save_loss_plot(history, os.path.join(args.out, "losses.png"))
        np.savez(os.path.join(args.out, "generator.npz"),
                 *lasagne.layers.get_all_param_values(generator))
        print("wrote samples.png, losses.png and generator.npz in %s" % args.out)

    norms = [np.linalg.norm(v) for v in lasagne.layers.get_all_param_values([critic, generator])]
    print("final wasserstein %.17g generator %.17g samples %.17g"
          % (history["wasserstein"][-1], history["generator"][-1], samples.mean()))
    print("final norms %s" % " ".join("%.17g" % n for n in norms))


if __name__ == "__main__":
    main()
