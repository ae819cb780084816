"""An MNIST-style Blocks script on scikit-learn's digits, written the Blocks way.

Nothing here knows about tmpi: bricks, a ComputationGraph, GradientDescent
with a step rule, Fuel streams and a MainLoop with monitoring, printing and
checkpointing (``blocks_mnist_extension.py`` adds tmpi's Blocks extension).

    tmpi wrap -n 1 blocks_mnist.py                         # one process
    tmpi wrap -n 2 blocks_mnist.py --rule bsp              # two ranks

Prints ``final <key> ...`` lines that the tests compare.
"""
import argparse
import os
from collections import OrderedDict

import numpy as np
from sklearn.datasets import load_digits
from theano import config, tensor

from blocks.algorithms import GradientDescent, Momentum, Scale
from blocks.bricks import MLP, Rectifier, Softmax
from blocks.bricks.cost import CategoricalCrossEntropy, MisclassificationRate
from blocks.extensions import FinishAfter, Printing, SimpleExtension
from blocks.extensions.monitoring import DataStreamMonitoring, TrainingDataMonitoring
from blocks.extensions.saveload import Checkpoint
from blocks.graph import ComputationGraph
from blocks.initialization import Constant, IsotropicGaussian
from blocks.main_loop import MainLoop
from blocks.monitoring.aggregation import mean
from blocks.model import Model
from fuel.datasets import IndexableDataset
from fuel.schemes import SequentialScheme, ShuffledScheme
from fuel.streams import DataStream


def digits_streams(batch_size, shuffle_seed):
    digits = load_digits()
    x = (digits.data / 16.0).astype(config.floatX)
    y = digits.target.astype("int64").reshape(-1, 1)
    train = IndexableDataset(OrderedDict([("features", x[:1500]), ("targets", y[:1500])]))
    valid = IndexableDataset(OrderedDict([("features", x[1500:]), ("targets", y[1500:])]))
    train_stream = DataStream.default_stream(train, iteration_scheme=ShuffledScheme(
        train.num_examples, batch_size, rng=np.random.RandomState(shuffle_seed)))
    valid_stream = DataStream.default_stream(valid, iteration_scheme=SequentialScheme(
        valid.num_examples, 100))
    return train_stream, valid_stream


class FinishOnOneRank(SimpleExtension):
    """Requests the end of training on one MPI rank only (as a signal would)."""

    def __init__(self, rank, iteration, **kwargs):
        kwargs.setdefault("after_batch", True)
        super().__init__(**kwargs)
        self.rank, self.iteration = rank, iteration

    def do(self, which_callback, *args):
        here = int(os.environ.get("PMI_RANK", "0"))
        if here == self.rank and self.main_loop.status["iterations_done"] == self.iteration:
            self.main_loop.log.current_row["training_finish_requested"] = True


def main(more_extensions=()):
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--step-rule", choices=("scale", "momentum"), default="momentum")
    parser.add_argument("--checkpoint", default=None)
    parser.add_argument("--finish-on-rank", type=int, nargs=2, metavar=("RANK", "ITER"))
    parser.add_argument("--rank-dependent-shuffle", action="store_true",
                        help="a broken script: every rank shuffles differently")
    args = parser.parse_args()

    seed = 7
    if args.rank_dependent_shuffle:
        seed += int(os.environ.get("PMI_RANK", "0"))
    train_stream, valid_stream = digits_streams(args.batch_size, seed)

    x = tensor.matrix("features")
    y = tensor.lmatrix("targets")
    mlp = MLP([Rectifier(), Softmax()], [64, 32, 10], weights_init=IsotropicGaussian(0.1),
              biases_init=Constant(0.01))
    mlp.initialize()
    probs = mlp.apply(x)
    cost = CategoricalCrossEntropy().apply(y.flatten(), probs).copy(name="cost")
    error = MisclassificationRate().apply(y.flatten(), probs).copy(name="error_rate")
    # Weighted by examples, not batches: a sum over rows over a row count.
    rows = tensor.cast(x.shape[0], config.floatX)
    per_example = mean((cost * rows).copy(name="example_cost"), rows)
    cg = ComputationGraph([cost])

    step_rule = Scale(0.1) if args.step_rule == "scale" else Momentum(0.1, 0.9)
    algorithm = GradientDescent(cost=cost, parameters=cg.parameters, step_rule=step_rule)
    extensions = [
        FinishAfter(after_n_epochs=args.epochs),
        TrainingDataMonitoring([cost, error, per_example, algorithm.total_gradient_norm],
                               prefix="train", after_epoch=True),
        DataStreamMonitoring([cost, error, per_example], valid_stream, prefix="valid"),
        Printing(),
    ]
    if args.finish_on_rank:
        extensions.insert(0, FinishOnOneRank(*args.finish_on_rank))
    if args.checkpoint:
        extensions.append(Checkpoint(args.checkpoint, after_training=True))
    extensions.extend(more_extensions)
    main_loop = MainLoop(algorithm, train_stream, model=Model(cost), extensions=extensions)
    main_loop.run()

    log = main_loop.log
    epochs = sorted(t for t, row in log.items() if "valid_cost" in row)
    keys = ("train_cost", "train_error_rate", "train_example_cost",
            "train_total_gradient_norm", "valid_cost", "valid_error_rate",
            "valid_example_cost")
    for key in keys:
        values = [float(log[t][key]) for t in epochs if key in log[t]]
        print("final %s %s" % (key, " ".join("%.17g" % v for v in values)))
    norms = [float(np.linalg.norm(p.get_value())) for p in algorithm.parameters]
    print("final param_norms %s" % " ".join("%.17g" % v for v in norms))
    print("final iterations %d" % log.status["iterations_done"])


if __name__ == "__main__":
    main()
