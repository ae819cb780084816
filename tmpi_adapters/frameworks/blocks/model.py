"""A Blocks model as tmpi sees it: hierarchical names and the data loop's shape.

:class:`BlocksModel` is the :class:`~tmpi_adapters.core.protocol.ModelProtocol`
of a ``GradientDescent``: its parameters keep their Blocks names and roles,
and messages, signatures and checkpoints name them by their place in the
brick hierarchy (``/mlp/linear_0.W``).  :func:`loop_shape` reads what a
``MainLoop`` tells of its epochs, for ``--progress`` and ``--checkpoint-every``.
Blocks is imported only when these are called.
"""
from tmpi_adapters.core.protocol import ModelProtocol, variable_name


def hierarchical_name(variable):
    """A Blocks parameter's path in its brick hierarchy (``/mlp/linear_0.W``),
    or its plain name for variables no brick owns."""
    from blocks.filter import get_brick
    brick = get_brick(variable)
    if brick is not None:
        return brick.get_hierarchical_name(variable)
    return variable.name


def _roles(variable):
    return [type(role).__name__ for role in getattr(variable.tag, "roles", [])]


class BlocksModel(ModelProtocol):
    """A :class:`~tmpi_adapters.core.protocol.ModelProtocol` named the Blocks way.

    Parameters are the ``GradientDescent``'s own shared variables (names and
    roles untouched); messages and signatures use their hierarchical names,
    step-rule buffers are named after the parameter they belong to
    (``/mlp/linear_0.W:velocity``).

    Attributes
    ----------
    names : list of str
        Hierarchical name of every state variable, in ``state_variables`` order.
    roles : dict
        ``{hierarchical name: [role class names]}`` of the parameters.
    """

    def __init__(self, params, optimizer_state=(), model_state=(), **kwargs):
        super().__init__(params, optimizer_state, model_state, **kwargs)
        self.names = [self._name(v, i) for i, v in enumerate(self.state_variables)]
        self.roles = {name: _roles(v) for name, v in zip(self.names, self.params)}

    @staticmethod
    def _name(variable, index):
        owner = getattr(variable.tag, "for_parameter", None)
        if owner is not None:
            return "%s:%s" % (hierarchical_name(owner), variable_name(variable, index))
        return hierarchical_name(variable) or variable_name(variable, index)

    def param_names(self):
        return self.names[:len(self.params)]

    def signature(self):
        rows = super().signature()
        return [(group, name, shape, dtype)
                for (group, _, shape, dtype), name in zip(rows, self.names)]


def loop_shape(main_loop):
    """``(batches per epoch, epochs)`` as far as a main loop tells (its
    stream's batch scheme, its ``FinishAfter(after_n_epochs=...)``); ``None``
    for what it does not."""
    from blocks.extensions import FinishAfter
    n_batches = n_epochs = None
    stream = getattr(main_loop, "data_stream", None)
    while stream is not None and n_batches is None:
        scheme = getattr(stream, "iteration_scheme", None)
        size, indices = getattr(scheme, "batch_size", None), getattr(scheme, "indices", None)
        if isinstance(size, int) and size > 0 and indices is not None:
            n_batches = -(-len(indices) // size)
        stream = getattr(stream, "data_stream", None)  # through Fuel's transformers
    for extension in getattr(main_loop, "extensions", ()):
        if isinstance(extension, FinishAfter):
            for _, predicate, _ in extension._conditions:
                if getattr(predicate, "condition", None) == "after_n_epochs":
                    n_epochs = predicate.num
    return n_batches, n_epochs
