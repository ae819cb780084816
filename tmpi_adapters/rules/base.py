"""The base class of every synchronisation rule, and what rules share.

A rule is a class registered through the ``tmpi_rules`` hook.  It sees only
the :class:`~tmpi_adapters.exchangers.base.Exchanger` (never MPI) and the
:class:`~tmpi_adapters.core.protocol.ModelProtocol` of each training function.

What every rule needs besides its algorithm lives here, so that a new rule
is the paper's algorithm and nothing else:

* gradient rules (``exchanges = "gradients"``) get the exact exchange of
  :meth:`Rule.reduce_gradients` (one collective for everything the step
  must agree on, each part reduced the way tmpi read from the graph and
  ``--loss-reduction``), and the averaging of each model's state
  (BatchNorm statistics) that the step did not carry;
* per-model state: a rule that sets :attr:`Rule.per_model` gets one
  :class:`PerModel` object per training function, made after the identical
  start, polled, finished and checkpointed for it;
* :meth:`Rule.poll`, :meth:`Rule.wait_until`, and the helpers that read,
  write and copy a model's values (:meth:`PerModel.values`,
  :meth:`PerModel.assign`, :func:`copies`) or pack a whole model into one
  message (:func:`pack`, :func:`unpack`).
"""
import numpy as np

from tmpi_adapters.core.protocol import read_values, write_values
from tmpi_adapters.options import resolve_knobs


class PerModel:
    """One model's state in a rule (a center variable, a gossip weight).

    Subclass it and name the subclass in :attr:`Rule.per_model`; the rule
    makes one for every model as ``per_model(rule, model, tag)``, where
    ``tag`` and ``tag + 1`` are MPI tags no other model of the rule uses.
    Every method here may be left as it is.
    """

    def __init__(self, rule, model, tag):
        self.rule = rule
        self.model = model
        self.tag = tag
        #: What a parameter rule combines: the model's parameters, then its
        #: state (BatchNorm statistics), in the order every rank shares.
        self.variables = model.params + model.model_state

    def values(self):
        """The arrays behind :attr:`variables`, not copied: read them, or
        :func:`copies` of them to keep."""
        return read_values(self.variables)

    def assign(self, arrays):
        """Make ``arrays`` the values of :attr:`variables`, each in its
        variable's dtype.

        An array already of that dtype is stored itself, not a copy (what
        Theano then updates in place): pass :func:`copies` of arrays the rule
        keeps, such as a center variable.
        """
        write_values(self.variables, [np.asarray(a, dtype=np.asarray(old).dtype)
                                      for a, old in zip(arrays, self.values())])

    def poll(self):
        """Handle what has arrived, without waiting; returns how many messages."""
        return 0

    def finish(self):
        """Training ended: drain messages, leave the final values in the model."""

    def state_dict(self):
        """This model's part of the rule's checkpointed state (picklable)."""
        return None

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned."""


class Rule:
    """Base class of every rule.

    Subclasses set :attr:`name`, :attr:`exchanges` and :attr:`knobs`, and
    implement the methods their algorithm needs: :meth:`after_step` (and
    :attr:`per_model`) for parameter rules; nothing at all for a gradient
    rule that is the exact exchange.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
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
    #: Gradient rules: :meth:`reduce_gradients` is a weighted mean (or sum)
    #: taken element by element, so a gradient's terms that every rank
    #: computes alike (a weight penalty's) are added after it instead of
    #: travelling (:mod:`tmpi_adapters.graphs.terms`).  ``False`` (the safe
    #: default) for a rule that transforms what it reduces (compression,
    #: clipping by the global norm).
    reduces_linearly = False
    #: ``{name: tmpi_adapters.Knob}``
    knobs = {}
    #: A :class:`PerModel` subclass made for every model, or ``None``.
    per_model = None
    #: The first MPI tag of this rule's per-model messages (model k: tags
    #: ``tag_base + 2k`` and ``tag_base + 2k + 1``).
    tag_base = 10000

    def __init__(self, session, **options):
        self.session = session
        self.exchanger = session.exchanger
        self.rank = session.rank
        self.size = session.size
        self.config = resolve_knobs(self.name, self.knobs, options, session.size)
        for key, value in self.config.items():
            setattr(self, key, value)
        #: ``{model: PerModel}`` of the models started so far
        self.models = {}
        self._saved = {}

    # -- what a rule implements ----------------------------------------------------
    def after_step(self, model, samples):
        """The algorithm's work after each step of ``model`` (``samples`` rows
        on this rank), on every rank.  Nothing by default."""

    def finish(self, model):
        """Training ended for ``model``: by default, :meth:`PerModel.finish`."""
        state = self.models.get(model)
        if state is not None:
            state.finish()

    def rule_state(self):
        """Checkpointed state of the rule itself, beyond its models' (a random
        generator, counters); ``{}`` by default."""
        return {}

    def load_rule_state(self, state):
        """Restore what :meth:`rule_state` returned."""

    # -- what every rule shares --------------------------------------------------------
    def start(self, model):
        """Called once per model after the identical start, before its first
        step: makes its :attr:`per_model` state, restored from a checkpoint
        when one was loaded."""
        if self.per_model is None:
            return
        state = self.per_model(self, model, self.tag_base + 2 * len(self.models))
        self.models[model] = state
        saved = self._saved.pop(model.name, None)
        if saved is not None:
            state.load_state_dict(saved)

    def of(self, model):
        """The :class:`PerModel` state of ``model``."""
        return self.models[model]

    def poll(self, model):
        """Handle what has arrived for ``model`` without waiting; returns how
        many messages (always 0 for rules that send none)."""
        state = self.models.get(model)
        return state.poll() if state is not None else 0

    def reduce_gradients(self, arrays, weight, ops=None, total=None):
        """Combine one step's exchanged arrays across ranks.

        Called for gradient rules only, from inside the compiled training
        function, once per step on every rank.  ``arrays`` are the step's
        gradients, then what else the step exchanges (returned losses and
        metrics, model state, metric increments); ``ops`` says how each
        combines (``"mean"`` weighted by rows, or ``"sum"``: tmpi decided it
        from the graph and ``--loss-reduction``); ``weight`` is this rank's
        rows and ``total``, when known, every rank's.  The default is the
        exact exchange in one collective: N ranks then take the one-process
        step.  Returns the arrays to use, in order.
        """
        return self.exchanger.allreduce(arrays, ops=ops, weight=weight, total=total)

    #: Whether a step's exchange may be split into parts that overlap
    #: backpropagation (``--overlap``): then :meth:`start_reduce_gradients`
    #: is called once per part instead of :meth:`reduce_gradients` once.  A
    #: gradient rule whose reduction is the exchanger's exact allreduce says
    #: True (BSP); one that reduces its own way leaves it False, and
    #: ``--overlap`` is refused for it.
    overlaps = False

    def start_reduce_gradients(self, arrays, weight, ops=None, total=None, slot=None):
        """:meth:`reduce_gradients` of one part of an overlapped step, started:
        returns the exchanger's pending reduction (``progress()``,
        ``finish()``).  ``slot`` tells the parts of a step apart.  Only called
        when :attr:`overlaps`."""
        return self.exchanger.start_allreduce(arrays, ops, weight=weight, total=total,
                                              slot=slot)

    def end_step(self, model, samples):
        """What the session calls after each step: :meth:`after_step`, then,
        under a gradient rule, the model's state (statistics each rank
        computed from its own rows) averaged over the ranks' rows."""
        self.after_step(model, samples)
        if self.exchanges == "gradients" and self.size > 1:  # one rank: nothing to average
            inside = {id(v) for v in model.averaged_state}
            state = [v for v in model.model_state if id(v) not in inside]
            if state:
                self.average(state, weight=samples)

    def state_dict(self):
        """Everything a checkpoint keeps of this rule."""
        return {"models": {model.name: state.state_dict()
                           for model, state in self.models.items()},
                "rule": self.rule_state()}

    def load_state_dict(self, state):
        """Restore what :meth:`state_dict` returned (models started later get
        theirs when they start)."""
        saved = dict(state.get("models") or {})
        for model, model_state in self.models.items():
            if saved.get(model.name) is not None:
                model_state.load_state_dict(saved.pop(model.name))
        self._saved = {name: value for name, value in saved.items() if value is not None}
        self.load_rule_state(state.get("rule") or {})

    # -- helpers -------------------------------------------------------------------------
    def average(self, variables, weight=None):
        """Replace shared variables by their (weighted) mean over ranks."""
        if not variables:
            return
        arrays = read_values(variables)
        write_values(variables, self.exchanger.allreduce(arrays, op="mean", weight=weight))

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
            by default.

        Raises
        ------
        tmpi_adapters.errors.StallError
            When ``timeout`` passes and nothing chooses to keep waiting.
        """
        self.exchanger.wait_for(condition, what, timeout)


def copies(arrays):
    """Copies of ``arrays`` that nothing else writes to (a center variable,
    the parameters a rank last pulled)."""
    return [np.array(a, copy=True) for a in arrays]


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
    :func:`~tmpi_adapters.core.protocol.write_values`.
    """
    arrays, pos = [], offset
    for a in like:
        n = int(np.size(a))
        arrays.append(np.array(flat[pos:pos + n], dtype=np.asarray(a).dtype)
                      .reshape(np.shape(a)))
        pos += n
    return arrays
