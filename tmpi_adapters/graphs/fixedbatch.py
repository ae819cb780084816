"""Graphs that write the batch size in, rebuilt for each rank's share.

The Theano tutorials' LeNet reshapes its input with the batch size as a
constant (``x.reshape((batch_size, 1, 28, 28))``) and tells ``conv2d`` the
input shape (``input_shape=(batch_size, ...)``).  A rank that runs part of the
batch cannot run that graph.  :func:`find` lists such nodes once, when a
function is compiled; :func:`rebuild` replaces the constant by the rank's
own row count, taken from the batch input's shape (so it follows uneven
shares, padding rows and short last batches without compiling again), and
drops the batch size from convolutions' declared input shapes.  Where the
constant cannot be told apart (two axes of that length), :func:`explain`
words the error, naming the op and offering ``--scaling weak``.
"""
import copy

from tmpi_adapters.errors import ConfigError

#: Convolution ops whose ``imshp[0]`` is the batch size.
_CONVS = ("AbstractConv2d", "AbstractConv3d", "AbstractConv2d_gradWeights",
          "AbstractConv2d_gradInputs", "AbstractConv3d_gradWeights",
          "AbstractConv3d_gradInputs")


def _nodes(variables):
    from theano.gof.graph import inputs, io_toposort
    variables = [v for v in variables if v is not None]
    return io_toposort(list(inputs(variables)), variables)


def _constant_shape(variable):
    """The ints of a constant shape vector, or ``None``."""
    from tmpi_adapters.graphs.layout import constant_ints
    return constant_ints(variable)


class Found:
    """The fixed-batch nodes of a graph (see :func:`find`)."""

    def __init__(self, reshapes, convs):
        #: ``(node, constant shape)`` of reshapes of the batch to constant shapes
        self.reshapes = reshapes
        #: convolution nodes on the batch that declare their input's batch size
        self.convs = convs

    def __bool__(self):
        return bool(self.reshapes or self.convs)

    @property
    def batch(self):
        """The batch size the graph declares (its convolutions'), or ``None``."""
        sizes = {node.op.imshp[0] for node in self.convs}
        return sizes.pop() if len(sizes) == 1 else None

    def constants(self):
        """Every constant a reshape of the batch uses, for choosing the batch size."""
        return {v for _, shape in self.reshapes for v in shape}


def _batch_dependent(nodes, data):
    """The ids of the variables of ``nodes`` computed from ``data``."""
    found = {id(v) for v in data}
    for node in nodes:
        if any(id(v) in found for v in node.inputs):
            found.update(id(v) for v in node.outputs)
    return found


def find(variables, data):
    """The nodes of ``variables``' graph that fix the batch size (``data``:
    the variables that carry the batch)."""
    nodes = _nodes(variables)
    dependent = _batch_dependent(nodes, data)
    reshapes, convs = [], []
    for node in nodes:
        name = type(node.op).__name__
        if name == "Reshape":
            shape = _constant_shape(node.inputs[1])
            if shape and id(node.inputs[0]) in dependent:
                reshapes.append((node, shape))
        elif name in _CONVS:
            imshp = getattr(node.op, "imshp", None)
            if imshp and imshp[0] is not None and id(node.outputs[0]) in dependent:
                convs.append(node)
    return Found(reshapes, convs)


class Ambiguous(Exception):
    """A constant that may or may not be the batch size."""


def rebuild(variables, batch, local, data):
    """``variables`` with every fixed batch size ``batch`` replaced.

    Parameters
    ----------
    variables : list of Variable
        The graph to rebuild (outputs and update expressions, already cloned).
    batch : int
        The batch size the graph writes in.
    local : Variable
        An int64 scalar: this rank's rows (an input's length along its batch axis).
    data : list of Variable
        The variables that carry the batch.

    Raises :class:`Ambiguous` when a reshape has the batch size on several
    axes but not on its first.
    """
    import theano.tensor as T
    nodes = _nodes(variables)
    dependent = _batch_dependent(nodes, data)
    memo = {}
    for node in nodes:
        inputs = [memo.get(v, v) for v in node.inputs]
        op = node.op
        name = type(op).__name__
        if name == "Reshape":
            shape = _constant_shape(node.inputs[1])
            if shape and batch in shape and id(node.inputs[0]) in dependent:
                positions = [k for k, v in enumerate(shape) if v == batch]
                if shape[0] != batch and len(positions) > 1:
                    raise Ambiguous("Reshape to %s" % (tuple(shape),))
                at = 0 if shape[0] == batch else positions[0]
                entries = [T.cast(local, "int64") if k == at else T.constant(v, dtype="int64")
                           for k, v in enumerate(shape)]
                inputs[1] = T.stack(entries)
        elif name in _CONVS and getattr(op, "imshp", None) and op.imshp[0] == batch:
            op = copy.copy(op)
            op.imshp = (None,) + tuple(op.imshp[1:])
        if op is node.op and all(a is b for a, b in zip(inputs, node.inputs)):
            continue
        if op is node.op:
            new = node.clone_with_new_inputs(inputs, strict=False)
        else:
            new = op.make_node(*inputs)
        for old, fresh in zip(node.outputs, new.outputs):
            fresh.name = old.name
            memo[old] = fresh
    return [memo.get(v, v) if v is not None else None for v in variables]


class FixedBatch:
    """One function's fixed batch size, made each rank's own.

    Where the graph declares the batch size (its convolutions' input shapes)
    the graph is rebuilt when the function is compiled; where only reshapes
    to constant shapes show it, on the first split call, whose rows say which
    constant is the batch size (the function is compiled once more then, and
    never again: the rebuilt graph reads each call's rows).

    Parameters
    ----------
    graph : list of Variable
        The function's outputs and update expressions.
    data : list of Variable
        The variables that carry the batch.
    local : Variable
        An int64 scalar: this rank's rows in a call.
    name : str
        The function, for messages.
    """

    def __init__(self, graph, data, local, name):
        self.found = find(graph, data)
        self.data = list(data)
        self.local = local
        self.name = name
        self.done = False

    def __bool__(self):
        return bool(self.found) and self.local is not None

    @property
    def batch(self):
        """The batch size the graph declares, or ``None``."""
        return self.found.batch

    def needs(self, rows):
        """True when the first split call's ``rows`` is a constant of the
        graph that the graph did not declare (rebuild then)."""
        return bool(self) and not self.done and rows in self.found.constants()

    def transform(self, batch):
        """What rewrites a cloned graph for ``batch`` (see :func:`rebuild`);
        raises :class:`~tmpi_adapters.errors.ConfigError` where the batch size
        cannot be told apart from other constants."""
        self.done = True

        def rewrite(variables):
            try:
                return rebuild(variables, batch, self.local, self.data)
            except Ambiguous as error:
                raise ConfigError(
                    "%s writes the batch size %d in a %s, on more than one axis and not on "
                    "the first: tmpi cannot tell which axis to make each rank's share of the "
                    "rows. Take the batch size from the input's shape (x.shape[0]) instead "
                    "of a constant, or run with --scaling weak so that each rank takes whole "
                    "batches." % (self.name, batch, error)) from None
        return rewrite


def explain(nodes, rows, size, name, error):
    """A :class:`~tmpi_adapters.errors.ConfigError` for a function whose first
    split call failed (``error``) because its graph (``nodes``) writes the
    batch size ``rows`` in, or ``None`` when no such op is found."""
    culprit = None
    for node in nodes:
        op_name = type(node.op).__name__
        if op_name in _CONVS + ("ConvOp",):
            declared = getattr(node.op, "imshp", None) or ()
            if rows in tuple(declared[:1]) + (getattr(node.op, "bsize", None),):
                culprit = "%s (its declared input shape %s)" % (op_name, tuple(declared))
        elif op_name in ("Reshape", "Alloc", "AllocEmpty", "SpecifyShape"):
            for variable in node.inputs[1:]:
                shape = _constant_shape(variable)
                if shape and rows in shape:
                    culprit = "%s to the constant shape %s" % (op_name, tuple(shape))
        if culprit:
            break
    if culprit is None:
        return None
    return ConfigError(
        "%s failed on its first split batch (%s: %s). Its graph writes the batch size %d in "
        "(%s), and tmpi could not rebuild it for each rank's share of the rows: strong "
        "scaling gives each of the %d ranks part of every batch. Take the batch size from "
        "the input's shape (x.shape[0]) instead of a constant, or run with --scaling weak "
        "so that each rank takes whole batches."
        % (name, type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "",
           rows, culprit, size))
