"""The terms of a gradient that every rank computes alike.

A gradient is often a sum: the loss's part, computed from the batch, and a
weight penalty's (L2 weight decay gives ``2 * l2 * W``), computed from the
parameters alone.  Under a gradient rule whose exchange is a weighted mean or
a sum taken element by element (:attr:`~tmpi_adapters.rules.base.Rule.reduces_linearly`),
the penalty's part need not travel: every rank holds the same parameters, so
it is added to the exchanged part afterwards.  For a mean that is the same
step (the ranks' weights add up to one); for a loss that sums over the batch
it is the one-process step, where exchanging the penalty would count it once
per rank.  It also keeps the parameter out of the exchanged expression:
Theano turns ``dot(x.T, d) + l2 * W`` into a ``Gemm`` that copies ``W`` every
step before the exchange, where ``dot(x.T, d)`` alone is one product.

:class:`Differs` tells which values may differ between ranks;
:func:`split_terms` cuts a gradient's sum into the terms that may and the
terms that cannot.
"""


class Differs:
    """Which variables of a training graph may hold other values on other ranks.

    Every input of the function differs (the batch among them).  Constants
    do not, nor do the shared variables in ``alike`` (the model's parameters
    and state, which the rule keeps identical) and scalar shared variables
    (settings such as a decay rate); any other shared variable might hold
    the batch or this rank's own data, and one that updates itself on every
    call is a random generator's state: they differ.  Random draws differ.  A node's
    outputs differ when an input does, except where only an input's shape
    matters: ``fill(cost, 1)``, the seed of every ``theano.grad``, is the
    same on every rank whatever the cost's value.

    Calling it with a variable answers; answers are kept.
    """

    def __init__(self, alike=()):
        self.alike = set(alike)
        self.known = {}

    def __call__(self, variable):
        known = self.known
        stack = [variable]
        while stack:
            current = stack[-1]
            if current in known:
                stack.pop()
                continue
            node = current.owner
            if node is None:
                known[current] = self._root(current)
                stack.pop()
                continue
            pending = [v for v in node.inputs if v not in known]
            if pending:
                stack.extend(pending)
                continue
            differs = self._node(node)
            for output in node.outputs:
                known[output] = differs
            stack.pop()
        return known[variable]

    def _root(self, variable):
        from theano.compile.sharedvalue import SharedVariable
        from theano.gof import Constant
        if isinstance(variable, Constant):
            return False
        if isinstance(variable, SharedVariable):
            if getattr(variable, "default_update", None) is not None:
                return True
            return not (variable in self.alike or variable.ndim == 0)
        return True

    def _node(self, node):
        from theano.scalar import Second
        from theano.tensor.elemwise import Elemwise
        name = type(node.op).__name__.lower()
        if "rand" in name or "mrg" in name:  # RandomFunction, mrg_uniform, CURAND_*
            return True
        known = self.known
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, Second):
            shape, value = node.inputs
            # Only the shape of the first input matters; a scalar's is fixed.
            return known[value] or (known[shape] and shape.ndim > 0)
        return any(known[v] for v in node.inputs)


def split_terms(gradient, differs):
    """``(varying, alike)``: the terms of ``gradient``'s top-level sum (nested
    sums opened) that may differ between ranks, and those that cannot."""
    from theano.scalar import Add
    from theano.tensor.elemwise import Elemwise
    varying, alike, stack = [], [], [gradient]
    while stack:
        term = stack.pop()
        node = term.owner
        if (node is not None and isinstance(node.op, Elemwise)
                and isinstance(node.op.scalar_op, Add)):
            stack.extend(reversed(node.inputs))
        elif differs(term):
            varying.append(term)
        else:
            alike.append(term)
    return varying, alike


def alike_terms(gradient, differs):
    """``(exchanged, alike)`` for a gradient that has both kinds of terms:
    the sum to exchange and the sum to add to its result; ``None`` when the
    gradient is all of one kind, or the two sums would not add up to the
    gradient's own type."""
    import theano.tensor as T
    varying, alike = split_terms(gradient, differs)
    if not varying or not alike:
        return None
    exchanged = varying[0] if len(varying) == 1 else T.add(*varying)
    added = alike[0] if len(alike) == 1 else T.add(*alike)
    if (exchanged + added).type != gradient.type:
        return None
    return exchanged, added
