"""A Blocks sequence model over time-major batches, written the Blocks way.

The markov_chain example of blocks-examples in small: a ``SequenceGenerator``
with a ``GatedRecurrent`` transition reads ``(time, batch)`` integer batches
(Blocks' and Fuel's layout for sequences: ``scan`` iterates over axis 0), its
cost ``mean(cost_matrix.sum(), x.shape[1])``.  Monitored on every batch: the
cost, the batch's rows (``x.shape[1]``), the sequence length (``x.shape[0]``),
the largest per-step cost, and the cost of each time step (a vector, which
stays each rank's own, with a warning); a ``DataStreamMonitoring`` evaluates
a time-major validation stream.

    tmpi wrap -n 2 transparency_blocks.py

Prints ``final <channel> <value>`` lines (17 significant digits) and the
parameter norms.
"""
from collections import OrderedDict

import numpy as np
from theano import tensor

from blocks.algorithms import GradientDescent, Scale
from blocks.bricks import Tanh
from blocks.bricks.recurrent import GatedRecurrent
from blocks.bricks.sequence_generators import (LookupFeedback, Readout, SequenceGenerator,
                                               SoftmaxEmitter)
from blocks.extensions import FinishAfter
from blocks.extensions.monitoring import DataStreamMonitoring, TrainingDataMonitoring
from blocks.graph import ComputationGraph
from blocks.initialization import Constant, IsotropicGaussian, Orthogonal
from blocks.main_loop import MainLoop
from blocks.model import Model
from blocks.monitoring import aggregation
from blocks.select import Selector
from fuel.datasets import IndexableDataset
from fuel.schemes import SequentialScheme
from fuel.streams import DataStream
from fuel.transformers import Mapping

STATES, STEPS = 3, 6


def sequences(rng, count):
    """Markov chains over STATES states, as (count, STEPS) integers."""
    chains = np.zeros((count, STEPS), dtype="int64")
    chains[:, 0] = rng.randint(0, STATES, count)
    for t in range(1, STEPS):
        chains[:, t] = (chains[:, t - 1] + rng.randint(0, 2, count)) % STATES
    return chains


def time_major(batch):
    return (batch[0].T,)


def stream(chains, batch_size):
    dataset = IndexableDataset(OrderedDict([("data", chains)]))
    plain = DataStream(dataset, iteration_scheme=SequentialScheme(len(chains), batch_size))
    return Mapping(plain, time_major)


def main():
    rng = np.random.RandomState(1)
    train, valid = sequences(rng, 26), sequences(rng, 13)
    transition = GatedRecurrent(name="transition", dim=4, activation=Tanh())
    generator = SequenceGenerator(
        Readout(readout_dim=STATES, source_names=["states"],
                emitter=SoftmaxEmitter(name="emitter"),
                feedback_brick=LookupFeedback(STATES, 3, name="feedback"), name="readout"),
        transition, weights_init=IsotropicGaussian(0.3), biases_init=Constant(0),
        name="generator")
    generator.push_initialization_config()
    transition.weights_init = Orthogonal()
    generator.initialize()

    x = tensor.lmatrix("data")
    cost_matrix = generator.cost_matrix(x[:, :])
    cost = aggregation.mean(cost_matrix.sum(), x.shape[1])
    cost.name = "sequence_log_likelihood"
    rows = x.shape[1].copy(name="batch_rows")
    steps = x.shape[0].copy(name="time_steps")
    top = cost_matrix.max().copy(name="max_step_cost")
    per_step = cost_matrix.sum(axis=1).copy(name="per_step_cost")  # one value per time step
    parameters = list(Selector(generator).get_parameters().values())
    algorithm = GradientDescent(cost=cost, parameters=parameters, step_rule=Scale(0.05))
    main_loop = MainLoop(
        algorithm=algorithm, data_stream=stream(train, 10), model=Model(cost),
        extensions=[FinishAfter(after_n_batches=6),
                    TrainingDataMonitoring([cost, rows, steps, top, per_step], prefix="train",
                                           after_batch=True),
                    DataStreamMonitoring([cost, rows], stream(valid, 5), prefix="valid",
                                         after_epoch=True)])
    main_loop.run()
    log = main_loop.log
    for name in ("train_sequence_log_likelihood", "train_batch_rows", "train_time_steps",
                 "train_max_step_cost", "valid_sequence_log_likelihood", "valid_batch_rows"):
        values = [row[name] for _, row in sorted(log.items()) if name in row]
        print("final %s %s" % (name, " ".join("%.17g" % float(v) for v in values)))
    norms = [np.linalg.norm(p.get_value()) for p in ComputationGraph(cost).parameters]
    print("final param_norms %s" % " ".join("%.17g" % n for n in sorted(norms)))


if __name__ == "__main__":
    main()
