"""The random number generators a checkpoint saves and a resume sets again.

numpy's global generator, Python's :mod:`random`, and every Theano random
stream the script creates (``RandomStreams``, ``MRG_RandomStreams``: tmpi
tracks them from the moment their module is imported, since a script keeps
them in its own variables).  A checkpoint is taken at the start of a call, so
what :meth:`Generators.state` saves is what that call would have seen.
"""
import copy
import random

import numpy as np

from tmpi_adapters.errors import CheckpointError


class TheanoStreams:
    """Theano's shared random streams created while the script runs, in order.

    Their generator states are saved with the checkpoint and set again when
    a resume's replay ends.
    """

    CLASSES = (("theano.tensor.shared_randomstreams", "RandomStreams"),
               ("theano.sandbox.rng_mrg", "MRG_RandomStreams"))

    def __init__(self):
        from tmpi_adapters.process.compat import Patcher
        self.streams = []
        self.patcher = Patcher()

    def install(self):
        from tmpi_adapters.process import compat
        for module, name in self.CLASSES:
            compat.when_imported(module, lambda m, name=name: self._track(getattr(m, name)))

    def _track(self, cls):
        original = cls.__init__
        streams = self.streams

        def __init__(stream, *args, **kwargs):
            original(stream, *args, **kwargs)
            streams.append(stream)
        __init__.__wrapped__ = original
        self.patcher.patch(cls, "__init__", __init__)

    def uninstall(self):
        self.patcher.restore()

    def state(self):
        states = []
        for stream in self.streams:
            seeds = stream.gen_seedgen.get_state() if hasattr(stream, "gen_seedgen") else \
                np.array(stream.rstate, copy=True)
            states.append({"class": type(stream).__name__, "seeds": seeds,
                           "states": [copy.deepcopy(update[0].get_value(borrow=True))
                                      for update in stream.state_updates]})
        return states

    def restore(self, states):
        if len(states) != len(self.streams):
            raise CheckpointError(
                "the checkpoint has %d Theano random streams, this run created %d by the "
                "point it was taken: the script does not retrace its run."
                % (len(states), len(self.streams)))
        for stream, saved in zip(self.streams, states):
            if len(saved["states"]) != len(stream.state_updates):
                raise CheckpointError("a Theano random stream has %d random variables in "
                                      "the checkpoint and %d here."
                                      % (len(saved["states"]), len(stream.state_updates)))
            if hasattr(stream, "gen_seedgen"):
                stream.gen_seedgen.set_state(saved["seeds"])
            else:
                stream.rstate = np.array(saved["seeds"], copy=True)
            # (variable, update) pairs; MRG streams add size and stream count.
            for update, value in zip(stream.state_updates, saved["states"]):
                update[0].set_value(copy.deepcopy(value), borrow=True)


class Generators:
    """Every generator of one run: numpy's, Python's and the Theano streams.

    :meth:`install` starts tracking Theano streams (before the script runs),
    :meth:`uninstall` stops it.
    """

    def __init__(self):
        self.theano = TheanoStreams()

    def install(self):
        self.theano.install()

    def uninstall(self):
        self.theano.uninstall()

    def state(self):
        """``{"numpy", "random", "theano"}``: what the checkpoint stores."""
        return {"numpy": np.random.get_state(), "random": random.getstate(),
                "theano": self.theano.state()}

    def restore(self, state, script=True):
        """Set every generator to what :meth:`state` returned; numpy's and
        Python's only with ``script``."""
        if script:
            np.random.set_state(state["numpy"])
            random.setstate(state["random"])
        self.theano.restore(state["theano"])

    @staticmethod
    def seed(seed):
        """Seed numpy's and Python's generators as a session does at its start."""
        random.seed(seed)
        np.random.seed(seed % (2 ** 32))
