"""Synchronisation rules: how ranks combine their work.

A rule is a class registered through the ``tmpi_rules`` hook.  It sees only
the :class:`~tmpi_adapters.exchanger.Exchanger` (never MPI) and the
:class:`~tmpi_adapters.protocol.ModelProtocol` of each training function.
"""
import os
import sys
import time

import numpy as np

from ..options import resolve_knobs
from ..protocol import read_values, write_values


class Rule:
    """Base class of every rule.

    Subclasses set :attr:`name`, :attr:`exchanges` and :attr:`knobs`, and
    override the methods that apply to them.

    Parameters
    ----------
    session : tmpi_adapters.session.Session
        Gives ``exchanger``, ``rank``, ``size`` and ``options``.
    **options
        Raw knob values (``{"alpha": "0.5"}``), typed and checked against
        :attr:`knobs`; the results are attributes of the rule.
    """

    #: the name users pass to ``--rule``
    name = None
    #: ``"gradients"``: gradients are combined inside the compiled graph
    #: (:meth:`reduce_gradients`); ``"parameters"``: each rank steps on its own
    #: gradients and :meth:`after_step` combines parameters between steps.
    exchanges = "parameters"
    #: ``{name: tmpi_adapters.options.Knob}``
    knobs = {}

    def __init__(self, session, **options):
        self.session = session
        self.exchanger = session.exchanger
        self.rank = session.rank
        self.size = session.size
        self.config = resolve_knobs(self.name, self.knobs, options, session.size)
        for key, value in self.config.items():
            setattr(self, key, value)

    def start(self, model):
        """Called once per model after the identical start, before its first step."""

    def reduce_gradients(self, grads, weight):
        """Combine this step's gradients (numpy arrays) across ranks.

        Only called when :attr:`exchanges` is ``"gradients"``, from inside the
        compiled training function, once per step on every rank.  ``weight`` is
        this rank's sample count for the step.  Returns the arrays to use.
        """
        raise NotImplementedError

    def after_step(self, model, samples):
        """Called on every rank after each step of ``model`` (``samples`` rows here)."""

    def finish(self, model):
        """Called when training ends: drain messages, leave final parameters in place."""

    def state_dict(self):
        """Rule state for checkpoints (centre variable, gossip weights, ...)."""
        return {}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned."""

    # helpers for parameter rules -------------------------------------------
    def average(self, variables, weight=None):
        """Replace shared variables by their (weighted) mean over ranks."""
        if not variables:
            return
        arrays = read_values(variables)
        write_values(variables, self.exchanger.allreduce(arrays, op="mean", weight=weight))

    # helpers for asynchronous rules ----------------------------------------
    def wait_until(self, condition, what, timeout=None):
        """Poll ``condition()`` until it returns true, leaving the core to others.

        Asynchronous rules wait on several messages at once this way (for
        instance in a termination protocol): ``condition`` tests their
        requests, handles what has arrived and says whether the wait is over.

        Parameters
        ----------
        condition : callable
            ``condition() -> bool``; called until it returns true.
        what : str or callable
            Names what is awaited in the stall report (a callable is asked only
            when a stall is reported, so it can name the ranks still missing).
        timeout : float, optional
            Seconds before a stall is reported; the exchanger's stall timeout
            by default (``None`` there: wait forever).

        Raises
        ------
        tmpi_adapters.errors.StallError
            When ``timeout`` passes and no stall handler of the exchanger
            chooses to keep waiting.
        """
        timeout = self.exchanger.timeout if timeout is None else timeout
        start = time.perf_counter()
        spins = 0
        while not condition():
            spins += 1
            if spins < 200:
                os.sched_yield()
            else:
                # Ranks may share cores (oversubscribed runs): a sleeping
                # waiter lets the rank it waits for run.
                time.sleep(min(1e-3, 1e-5 * (spins - 199)))
            waited = time.perf_counter() - start
            if timeout is not None and waited > timeout:
                self.exchanger.stalled(what() if callable(what) else what, waited,
                                       sys._getframe())
                start, spins = time.perf_counter(), 0


def flat_size(arrays):
    """Total number of elements of ``arrays``."""
    return sum(int(np.size(a)) for a in arrays)


def pack(arrays, out, offset=0):
    """Copy ``arrays`` one after another into the flat buffer ``out`` from ``offset``.

    Asynchronous rules send a whole model as one contiguous message; this is
    the one copy in.  Returns ``out``.
    """
    pos = offset
    for a in arrays:
        n = int(np.size(a))
        out[pos:pos + n] = np.reshape(a, -1)
        pos += n
    return out


def unpack(flat, like, offset=0):
    """New arrays shaped and typed like ``like``, read from ``flat`` from ``offset``.

    The one copy out of a received message; the arrays can be handed to
    :func:`~tmpi_adapters.protocol.write_values`.
    """
    arrays, pos = [], offset
    for a in like:
        n = int(np.size(a))
        arrays.append(np.array(flat[pos:pos + n], dtype=np.asarray(a).dtype)
                      .reshape(np.shape(a)))
        pos += n
    return arrays
