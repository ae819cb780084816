"""The mark tmpi's ``theano.grad`` leaves on each gradient of a shared variable.

A marked gradient is what a training function's exchange replaces
(:mod:`tmpi_adapters.core.step`); the mark itself is an identity, so a
function that is not a training function computes exactly what it would
without tmpi.
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
        from tmpi_adapters.process.devices import is_device_type
        if not isinstance(grad, theano.gof.Variable) or not is_device_type(grad.type):
            grad = theano.tensor.as_tensor_variable(grad)   # a device gradient stays one
        return Apply(self, [grad], [grad.type()])

    def perform(self, node, inputs, output_storage):
        output_storage[0][0] = inputs[0]

    def infer_shape(self, node, shapes):
        return shapes

    def grad(self, inputs, output_grads):
        return output_grads

    def __reduce__(self):
        return (GradientMarker, (None, self.index))
