"""The Theano Ops that put the gradient exchange inside the compiled graph.

``theano.grad`` under tmpi wraps each gradient with respect to a shared
variable in a :class:`~tmpi_adapters.graphs.gradient.GradientMarker` (an
identity).  When the function that uses them is compiled, all markers of
that function are replaced by **one** :class:`FusedAllreduce` node
(:mod:`~tmpi_adapters.core.step`), so a training step performs one fused
exchange.
With ``--overlap`` they are replaced by parts instead, each started by a
:class:`StartExchange` as soon as its gradients exist, and one
:class:`FinishExchange` before the updates.

Copies
------
Theano's gradient arrays are copied once, into the exchanger's fused buffer
(scaled on the way).  The reduced gradients come back as views of that buffer
(:meth:`~tmpi_adapters.exchangers.base.Exchanger.borrowing`), not copied out again:
the optimizer's update reads them straight from it.  Two rules keep that
safe: the outputs are marked indestructible, so no in-place optimisation can
turn the buffer into a parameter's storage; and an output that leaves the
function (returned by it, or an update on its own) is copied, because the
buffer is rewritten at the next step.  On one rank the outputs are Theano's
own gradient arrays and stay destructible, so the graph computes its
updates in place exactly as it would without tmpi.

On a device (Theano's GPU backend) the gradients are device arrays: the Ops
take them as they are, and :class:`~tmpi_adapters.exchangers.device.Staging`
moves them to the host and the results back in one fused copy per dtype
each way; the outputs are device arrays, borrowed the same way.

The Op is given the session's exchange when the training function is
compiled: nothing in it looks for a session at run time.
"""

import numpy as np

import theano
from theano.gof import Apply, Op

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.exchangers.device import Staging
from tmpi_adapters.process.devices import is_device_array, is_device_type


def as_variable(value):
    """``value`` as a Theano variable: device variables stay on their device."""
    if isinstance(value, theano.gof.Variable) and is_device_type(value.type):
        return value
    return theano.tensor.as_tensor_variable(value)


def device_contexts(variables):
    """``{position: device context}`` of the device variables among ``variables``."""
    return {i: v.type.context for i, v in enumerate(variables) if is_device_type(v.type)}

class FusedAllreduce(Op):
    """Everything one training step exchanges, in one collective.

    Its inputs are the step's gradients, then what else the ranks must
    agree on that the graph computes in the same step (the *riders*): the
    returned losses and metrics, model state such as BatchNorm statistics,
    the increments of metric accumulators.  Each input is reduced as its
    entry of ``ops`` says: ``"mean"`` (weighted by each rank's rows) or
    ``"sum"``.  Outputs are the reduced inputs, shaped alike.

    Parameters
    ----------
    key : str
        Names the training function (for messages and the recorder).
    ops : tuple of str
        One reduction per input.
    gradients : int
        How many of the inputs, first, are gradients (the others are riders).
    exchange : callable
        ``exchange(arrays, key=key, ops=ops, gradients=gradients) -> arrays``: the session's
        :meth:`~tmpi_adapters.core.session.Session.exchange_gradients`, given
        when the training function is compiled.
    borrowed : bool
        The exchange returns views of buffers it reuses next step (more than
        one rank), not the input arrays themselves.
    """

    __props__ = ("key", "ops", "gradients")

    def __init__(self, key, ops, gradients=None, exchange=None, borrowed=True):
        self.key = key
        self.ops = tuple(ops)
        self.gradients = len(self.ops) if gradients is None else gradients
        self._exchange = exchange
        self.borrowed = borrowed
        # Where output i *is* input i (one rank: nothing to reduce), declaring
        # the alias keeps Theano from destroying the input while the output lives.
        self.view_map = {i: [i] for i in range(len(self.ops))}

    def do_constant_folding(self, node):
        # A collective must run on every call, never at compile time.
        return False

    def make_node(self, *inputs):
        inputs = [as_variable(v) for v in inputs]
        outputs = [v.type() for v in inputs]
        for output in outputs:
            # The value lives in the exchanger's buffer: nothing may reduce it
            # in place into storage that outlives the step.
            output.tag.indestructible = self.borrowed
        return Apply(self, inputs, outputs)

    def perform(self, node, inputs, output_storage):
        if self._exchange is None:
            raise _unbound(self.key)
        staging = _staging(self)
        results = self._exchange(staging.to_host(inputs), key=self.key, ops=self.ops,
                                 gradients=self.gradients)
        results = staging.to_device(results, device_contexts(node.inputs),
                                    fresh=not self.borrowed)
        store_borrowed(node, results, output_storage)

    def infer_shape(self, node, shapes):
        return shapes

    def grad(self, inputs, output_grads):
        return output_grads

    def __reduce__(self):
        return (FusedAllreduce, (self.key, self.ops, self.gradients))


def _generic():
    from theano.gof.type import generic
    return generic()


class StartExchange(Op):
    """Starts part ``part`` of a step's exchange split into parts (``--overlap``).

    Its inputs are the previous part's token (from the second part on),
    then the part's arrays: its gradients first (those at ``positions``
    among the step's gradients), riders after.  It packs them,
    starts their collective and moves the parts already started on; its
    output, the *token*, is every part's pending exchange so far.  Chaining
    the parts through their tokens fixes the order in which Theano runs the
    starts: each as soon as backpropagation has computed its gradients.

    ``start`` is the session's
    :meth:`~tmpi_adapters.core.session.Session.start_exchange`.
    """

    __props__ = ("key", "ops", "part", "positions")

    def __init__(self, key, ops, part, positions, start=None):
        self.key, self.ops = key, tuple(ops)
        self.part, self.positions = part, tuple(positions)
        self._start = start

    def do_constant_folding(self, node):
        return False

    def make_node(self, *inputs):
        token = list(inputs[:1]) if self.part else []
        arrays = [as_variable(v) for v in inputs[len(token):]]
        return Apply(self, token + arrays, [_generic()])

    def perform(self, node, inputs, output_storage):
        if self._start is None:
            raise _unbound(self.key)
        before = tuple(inputs[0]) if self.part else ()
        # The host views are packed when the part starts: reused next step.
        arrays = _staging(self).to_host(list(inputs[1:] if self.part else inputs))
        handle = self._start(arrays, key=self.key, ops=self.ops, part=self.part,
                             positions=self.positions, started=before)
        output_storage[0][0] = before + (handle,)

    def __reduce__(self):
        return (StartExchange, (self.key, self.ops, self.part, self.positions))


class FinishExchange(Op):
    """Waits for every part of a step's exchange and gives their results.

    Its input is the token of the step's last start, so Theano runs it once
    every part has started, and the updates, which use its results, after
    it: no update runs before the whole exchange has been checked (what
    ``tmpi_after_exchange`` and a skipped step rely on).  Outputs are the
    parts' arrays, part after part, typed as ``types``; as the
    :class:`FusedAllreduce`'s, they live in the exchanger's buffers:
    indestructible, copied when they leave the function.

    ``finish`` is the session's
    :meth:`~tmpi_adapters.core.session.Session.finish_exchange`.
    """

    __props__ = ("key", "types")

    def __init__(self, key, types, finish=None):
        self.key, self.types = key, tuple(types)
        self._finish = finish

    def do_constant_folding(self, node):
        return False

    def make_node(self, token):
        outputs = [t() for t in self.types]
        for output in outputs:
            output.tag.indestructible = True
        return Apply(self, [token], outputs)

    def perform(self, node, inputs, output_storage):
        if self._finish is None:
            raise _unbound(self.key)
        results = _staging(self).to_device(self._finish(inputs[0]),
                                           device_contexts(node.outputs))
        store_borrowed(node, results, output_storage)

    def __reduce__(self):
        return (FinishExchange, (self.key, self.types))


def _unbound(key):
    return TmpiError(
        "training function %s was loaded from a pickle outside the tmpi session that "
        "compiled it; compile it again under tmpi (its gradients need the session's "
        "exchange)." % key)


def _staging(op):
    """The op's :class:`~tmpi_adapters.exchangers.device.Staging` (its buffers
    fit the op's arrays), made on first use."""
    staging = op.__dict__.get("_staging")
    if staging is None:
        staging = op.__dict__["_staging"] = Staging()
    return staging


def store_borrowed(node, results, output_storage):
    """Hand ``node``'s results (views of the exchanger's buffers) to Theano,
    copying those that leave the function: they outlive the step, the
    buffer does not."""
    escaping = leaving_outputs(node)
    for i, (value, store) in enumerate(zip(results, output_storage)):
        if i in escaping:
            value = value.copy() if is_device_array(value) else np.array(value, copy=True)
        store[0] = value


def leaving_outputs(node):
    """Indices of ``node``'s outputs whose memory can leave the function: a
    function output or an update value, directly or through views.

    Computed once per compiled node (cached on ``node.tag``).
    """
    cached = getattr(node.tag, "tmpi_leaving", None)
    if cached is not None:
        return cached
    found = set()
    for index, variable in enumerate(node.outputs):
        stack, seen = [variable], set()
        while stack and index not in found:
            current = stack.pop()
            if id(current) in seen:
                continue
            seen.add(id(current))
            for client, position in getattr(current, "clients", ()):
                if client == "output":
                    found.add(index)
                    break
                view_map = getattr(client.op, "view_map", None) or {}
                stack.extend(client.outputs[o] for o, ins in view_map.items()
                             if position in ins)
    node.tag.tmpi_leaving = frozenset(found)
    return node.tag.tmpi_leaving



class Couple(Op):
    """Values of a training step made whole across ranks, in one collective.

    Where a step's rows meet (a batch statistic, a loss the updates read, a
    row picked by index), the row analysis (:mod:`tmpi_adapters.graphs.rows`)
    asks for the one-process value: this node makes every such value of one
    *level* (values that do not depend on each other) whole at once.  Its
    inputs are each rank's parts, one per entry of ``kinds``: ``"sum"``,
    ``"max"``, ``"min"`` (partial values, reduced over the ranks whose rows
    count), ``"gather"`` (rows along ``axes[i]``, joined in rank order) or
    ``"stack"`` (one part from each such rank, stacked in rank order);
    after them come ``after`` inputs that only order the node (it runs after
    the nodes that make them).  Outputs are the whole values, the same on
    every rank.

    ``couple`` is the session's :meth:`~tmpi_adapters.core.levels.Couplings.couple`,
    given when the training function is compiled.
    """

    __props__ = ("key", "kinds", "axes", "level", "after")

    def __init__(self, key, kinds, axes, level, after=0, couple=None, described=None):
        self.key, self.kinds, self.axes = key, tuple(kinds), tuple(axes)
        self.level, self.after = level, after
        self._couple = couple
        #: each value's expression and script line, for messages
        self.described = list(described or [])

    def do_constant_folding(self, node):
        return False

    def make_node(self, *inputs):
        # A host op: Theano moves device values to it and back itself.
        inputs = [theano.tensor.as_tensor_variable(v) for v in inputs]
        from tmpi_adapters.graphs.pending import stacked_type
        values = inputs[:len(self.kinds)]
        return Apply(self, inputs, [stacked_type(v.type) if kind == "stack" else v.type()
                                    for v, kind in zip(values, self.kinds)])

    def perform(self, node, inputs, output_storage):
        if self._couple is None:
            raise _unbound(self.key)
        results = self._couple(list(inputs[:len(self.kinds)]), self.kinds, self.axes,
                               key=self.key, described=getattr(self, "described", None))
        # Each whole value has its part's dtype, which is its output's.
        for store, value in zip(output_storage, results):
            store[0] = value

    def __reduce__(self):
        return (Couple, (self.key, self.kinds, self.axes, self.level, self.after))


class StartCouple(Op):
    """Begins a :class:`Couple` whose gather the rank leaves running.

    Where the graph has work that does not need a level's whole values (in
    backpropagation, a layer's weight gradient beside the next BatchNorm's
    sums), the level is split in three: this node copies the parts in and
    starts the gather, its output (the *token*) gates that work
    (:class:`Gated`), and :class:`FinishCouple` takes the token and the
    work's result, so Theano runs the work while the other ranks arrive.
    Inputs and ``kinds``, ``axes`` as :class:`Couple`'s.

    ``start`` is the session's :meth:`~tmpi_adapters.core.levels.Couplings.start`.
    """

    __props__ = ("key", "kinds", "axes", "level")

    def __init__(self, key, kinds, axes, level, start=None, described=None):
        self.key, self.kinds, self.axes, self.level = key, tuple(kinds), tuple(axes), level
        self._start = start
        self.described = list(described or [])

    def do_constant_folding(self, node):
        return False

    def make_node(self, *inputs):
        return Apply(self, [theano.tensor.as_tensor_variable(v) for v in inputs], [_generic()])

    def perform(self, node, inputs, output_storage):
        if self._start is None:
            raise _unbound(self.key)
        output_storage[0][0] = self._start(list(inputs), self.kinds, self.axes, key=self.key,
                                           described=self.described, level=self.level)

    def __reduce__(self):
        return (StartCouple, (self.key, self.kinds, self.axes, self.level))


class Gated(Op):
    """Its first input, once its second (a :class:`StartCouple`'s token)
    exists: a view that orders the work reading it after the start."""

    __props__ = ()
    view_map = {0: [0]}

    def make_node(self, value, token):
        return Apply(self, [value, token], [value.type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = inputs[0]

    def infer_shape(self, node, shapes):
        return shapes[:1]


class FinishCouple(Op):
    """Ends what :class:`StartCouple` began: the level's whole values.

    Its inputs are the start's token, then values the gated work computes
    (they order this node after that work); its outputs are typed ``types``,
    one per value of the level, as :class:`Couple`'s.

    ``finish`` is the session's :meth:`~tmpi_adapters.core.levels.Couplings.finish`.
    """

    __props__ = ("key", "level", "types")

    def __init__(self, key, level, types, finish=None):
        self.key, self.level, self.types = key, level, tuple(types)
        self._finish = finish

    def do_constant_folding(self, node):
        return False

    def make_node(self, token, *after):
        return Apply(self, [token] + list(after), [t() for t in self.types])

    def perform(self, node, inputs, output_storage):
        if self._finish is None:
            raise _unbound(self.key)
        for store, value in zip(output_storage, self._finish(inputs[0])):
            store[0] = value

    def __reduce__(self):
        return (FinishCouple, (self.key, self.level, self.types))
