"""Synchronisation rules: how ranks combine their work.

A rule is a class registered through the ``tmpi_rules`` hook.  It sees only
the :class:`~tmpi_adapters.exchanger.Exchanger` (never MPI) and the
:class:`~tmpi_adapters.protocol.ModelProtocol` of each training function.
"""
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
