"""The Theano Ops that put the gradient exchange inside the compiled graph.

``theano.grad`` under tmpi wraps each gradient with respect to a shared
variable in a :class:`GradientMarker` (an identity).  When the function that
uses them is compiled, all markers of that function are replaced by **one**
:class:`FusedAllreduce` node, so a training step performs one fused collective.
"""
import itertools

import theano
from theano.gof import Apply, Op

_marker_ids = itertools.count()


class GradientMarker(Op):
    """Identity on a gradient, remembering which shared variable it belongs to.

    Outside tmpi (or in a function that is not a training function) it costs
    nothing: the output is a view of the input.
    """

    __props__ = ("index",)
    view_map = {0: [0]}

    def __init__(self, wrt, index=None):
        self.wrt = wrt
        self.index = next(_marker_ids) if index is None else index

    def make_node(self, grad):
        grad = theano.tensor.as_tensor_variable(grad)
        return Apply(self, [grad], [grad.type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = inputs[0]

    def infer_shape(self, node, shapes):
        return shapes

    def grad(self, inputs, output_grads):
        return output_grads

    def __reduce__(self):
        return (GradientMarker, (None, self.index))


class FusedAllreduce(Op):
    """Combine all gradients of one step across ranks in one exchange.

    Parameters
    ----------
    key : str
        Names the training function (for messages and the recorder).
    exchange : callable, optional
        ``exchange(arrays) -> arrays``; default: the running session's
        :meth:`~tmpi_adapters.session.Session.exchange_gradients`.
    """

    __props__ = ("key", "n")

    def __init__(self, key, n, exchange=None):
        self.key = key
        self.n = n
        self._exchange = exchange

    def do_constant_folding(self, node):
        # A collective must run on every call, never at compile time.
        return False

    def make_node(self, *grads):
        grads = [theano.tensor.as_tensor_variable(g) for g in grads]
        return Apply(self, grads, [g.type() for g in grads])

    def perform(self, node, inputs, output_storage):
        exchange = self._exchange
        if exchange is None:
            from .session import current_session
            exchange = current_session().exchange_gradients
        out = []
        for value, store in zip(inputs, output_storage):
            previous = store[0]
            if previous is None or previous.shape != value.shape or previous.dtype != value.dtype:
                previous = store[0] = value.copy()
            out.append(previous)
        results = exchange(list(inputs), out=out, key=self.key)
        for value, store in zip(results, output_storage):
            store[0] = value

    def infer_shape(self, node, shapes):
        return shapes

    def grad(self, inputs, output_grads):
        return output_grads

    def __reduce__(self):
        return (FusedAllreduce, (self.key, self.n))
