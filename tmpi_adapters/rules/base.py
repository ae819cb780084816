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
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from tmpi_adapters.core.protocol import read_values, write_values
from tmpi_adapters.options import resolve_knobs

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable, Iterable, Sequence

    from tmpi_adapters.core.protocol import ModelProtocol, SharedVariable
    from tmpi_adapters.core.session import Session
    from tmpi_adapters.exchangers.base import Array, Exchanger, Reduction
    from tmpi_adapters.options import Knob


class PerModel:
    """One model's state in a rule (a center variable, a gossip weight).

    Subclass it and name the subclass in :attr:`Rule.per_model`; the rule
    makes one for every model as ``per_model(rule, model, tag)``, where
    ``tag`` and ``tag + 1`` are MPI tags no other model of the rule uses.
    Every method here may be left as it is.
    """

    def __init__(self, rule: Rule, model: ModelProtocol, tag: int) -> None:
        self.rule = rule
        self.model = model
        self.tag = tag
        #: What a parameter rule combines: the model's parameters, then its
        #: state (BatchNorm statistics), in the order every rank shares.
        self.variables: list[SharedVariable] = model.params + model.model_state

    def values(self) -> list[Array]:
        """The arrays behind :attr:`variables`, not copied: read them, or
        :func:`copies` of them to keep."""
        return read_values(self.variables)

    def assign(self, arrays: Iterable[Array]) -> None:
        """Make ``arrays`` the values of :attr:`variables`, each in its
        variable's dtype.

        An array already of that dtype is stored itself, not a copy (what
        Theano then updates in place): pass :func:`copies` of arrays the rule
        keeps, such as a center variable.
        """
        write_values(self.variables, [np.asarray(a, dtype=np.asarray(old).dtype)
                                      for a, old in zip(arrays, self.values())])

    def poll(self) -> int:
        """Handle what has arrived, without waiting; returns how many messages."""
        return 0

    def finish(self) -> None:
        """Training ended: drain messages, leave the final values in the model."""

    def state_dict(self) -> Any:
        """This model's part of the rule's checkpointed state: data only (arrays,
        numbers, strings, bytes, ``None``, and lists, tuples, sets and dicts of
        them)."""
        return None

    def load_state_dict(self, state: Any) -> None:
        """Restore what :meth:`state_dict` returned."""


class Rule:
    """Base class of every rule.

    Subclasses set :attr:`name`, :attr:`exchanges` and :attr:`knobs`, and
    implement the methods their algorithm needs: :meth:`after_step` (and
    :attr:`per_model`) for parameter rules; nothing at all for a gradient
    rule that is the exact exchange.

    Parameters
    ----------
    session
        Gives ``exchanger``, ``rank``, ``size`` and ``options``.
    **options
        Raw knob values (``{"alpha": "0.5"}``), typed and checked against
        :attr:`knobs`; the results are attributes of the rule.
    """

    #: the name users pass to ``--rule``
    name: str | None = None
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
    knobs: dict[str, Knob] = {}
    #: A :class:`PerModel` subclass made for every model, or ``None``.
    per_model: type[PerModel] | None = None
    #: The first MPI tag of this rule's per-model messages (model k: tags
    #: ``tag_base + 2k`` and ``tag_base + 2k + 1``).
    tag_base = 10000

    def __init__(self, session: Session, **options: object) -> None:
        self.session = session
        self.exchanger: Exchanger = session.exchanger
        self.rank: int = session.rank
        self.size: int = session.size
        self.config = resolve_knobs(self.name, self.knobs, options, session.size)
        for key, value in self.config.items():
            setattr(self, key, value)
        #: ``{model: PerModel}`` of the models started so far
        self.models: dict[ModelProtocol, PerModel] = {}
        self._saved: dict[str, Any] = {}

    # -- what a rule implements ----------------------------------------------------
    def after_step(self, model: ModelProtocol, samples: int) -> None:
        """The algorithm's work after each step of ``model`` (``samples`` rows
        on this rank), on every rank.  Nothing by default."""

    def finish(self, model: ModelProtocol) -> None:
        """Training ended for ``model``: by default, :meth:`PerModel.finish`."""
        state = self.models.get(model)
        if state is not None:
            state.finish()

    def rule_state(self) -> dict[str, Any]:
        """Checkpointed state of the rule itself, beyond its models' (a random
        generator, counters); ``{}`` by default."""
        return {}

    def load_rule_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`rule_state` returned."""

    # -- what every rule shares --------------------------------------------------------
    def start(self, model: ModelProtocol) -> None:
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

    def of(self, model: ModelProtocol) -> PerModel:
        """The :class:`PerModel` state of ``model``."""
        return self.models[model]

    def poll(self, model: ModelProtocol) -> int:
        """Handle what has arrived for ``model`` without waiting; returns how
        many messages (always 0 for rules that send none)."""
        state = self.models.get(model)
        return state.poll() if state is not None else 0

    def reduce_gradients(self, arrays: Sequence[Array], weight: float,
                         ops: Sequence[str] | None = None,
                         total: float | None = None) -> list[Array]:
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

    def start_reduce_gradients(self, arrays: Sequence[Array], weight: float,
                               ops: Sequence[str] | None = None, total: float | None = None,
                               slot: Hashable = None) -> Reduction:
        """:meth:`reduce_gradients` of one part of an overlapped step, started:
        returns the exchanger's pending reduction (``progress()``,
        ``finish()``).  ``slot`` tells the parts of a step apart.  Only called
        when :attr:`overlaps`."""
        return self.exchanger.start_allreduce(arrays, ops, weight=weight, total=total,
                                              slot=slot)

    def end_step(self, model: ModelProtocol, samples: int) -> None:
        """What the session calls after each step: :meth:`after_step`, then,
        under a gradient rule, the model's state (statistics each rank
        computed from its own rows) averaged over the ranks' rows."""
        self.after_step(model, samples)
        # (A step converted by the row analysis updates its state whole: nothing to average.)
        coupled = getattr(model.train_fn, "coupled", False)
        if self.exchanges == "gradients" and self.size > 1 and not coupled:
            inside = {id(v) for v in model.averaged_state}
            state = [v for v in model.model_state if id(v) not in inside]
            if state:
                self.average(state, weight=samples)

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint keeps of this rule."""
        return {"models": {model.name: state.state_dict()
                           for model, state in self.models.items()},
                "rule": self.rule_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (models started later get
        theirs when they start)."""
        saved = dict(state.get("models") or {})
        for model, model_state in self.models.items():
            if saved.get(model.name) is not None:
                model_state.load_state_dict(saved.pop(model.name))
        self._saved = {name: value for name, value in saved.items() if value is not None}
        self.load_rule_state(state.get("rule") or {})

    # -- helpers -------------------------------------------------------------------------
    def average(self, variables: Sequence[SharedVariable], weight: float | None = None) -> None:
        """Replace shared variables by their (weighted) mean over ranks."""
        if not variables:
            return
        arrays = read_values(variables)
        write_values(variables, self.exchanger.allreduce(arrays, op="mean", weight=weight))

    def wait_until(self, condition: Callable[[], object], what: str | Callable[[], str],
                   timeout: float | None = None) -> None:
        """Poll ``condition()`` until it returns true, leaving the core to others.

        Asynchronous rules wait on several messages at once this way (for
        instance in a termination protocol): ``condition`` tests their
        requests, handles what has arrived and says whether the wait is over.

        Parameters
        ----------
        condition
            Called until it returns true.
        what
            Names what is awaited in the stall report (a callable is asked only
            when a stall is reported, so it can name the ranks still missing).
        timeout
            Seconds before a stall is reported; the exchanger's stall timeout
            by default.

        Raises
        ------
        tmpi_adapters.errors.StallError
            When ``timeout`` passes and nothing chooses to keep waiting.
        """
        self.exchanger.wait_for(condition, what, timeout)


def copies(arrays: Iterable[Array]) -> list[np.ndarray]:
    """Copies of ``arrays`` that nothing else writes to (a center variable,
    the parameters a rank last pulled)."""
    return [np.array(a, copy=True) for a in arrays]


def flat_size(arrays: Iterable[Array]) -> int:
    """Total number of elements of ``arrays``."""
    return sum(int(np.size(a)) for a in arrays)


def pack(arrays: Iterable[Array], out: np.ndarray, offset: int = 0) -> np.ndarray:
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


def unpack(flat: np.ndarray, like: Iterable[Array], offset: int = 0) -> list[np.ndarray]:
    """New arrays shaped and typed like ``like``, read from ``flat`` from ``offset``.

    The one copy out of a received message; the arrays can be handed to
    :func:`~tmpi_adapters.core.protocol.write_values`.
    """
    arrays: list[np.ndarray] = []
    pos = offset
    for a in like:
        n = int(np.size(a))
        arrays.append(np.array(flat[pos:pos + n], dtype=np.asarray(a).dtype)
                      .reshape(np.shape(a)))
        pos += n
    return arrays
