"""Graphs that fix the batch size, made each rank's own, where that is proven.

The Theano tutorials' LeNet reshapes its input with the batch size as a
constant (``x.reshape((batch_size, 1, 28, 28))``) and tells ``conv2d`` the
input shape (``input_shape=(batch_size, ...)``).  A rank that runs part of the
batch cannot run that graph as it is.  But a constant that *equals* the batch
size is not always the batch size: Keras' ``TimeDistributed`` reshapes to
``(-1, 128)`` where 128 is a layer's width, which may well be the batch size
too.  So nothing is rewritten because of its value:

* a convolution's declared input shape starts with the batch size by
  definition: that entry is dropped when the function is compiled;
* a reshape to a constant shape is rewritten only where Theano's own shape
  inference, run on the call's real inputs cut to two or more row counts,
  shows that its input's size is proportional to the rows and which axis of
  the new shape holds them.  That is decided on the first split call
  (:meth:`FixedBatch.resolve`); the entry then becomes this rank's rows times
  the proven factor, read from each call's input (uneven shares, padding rows
  and short last batches follow without compiling again).  A reshape whose
  input grows with the batch in a way no rank's share can follow exactly is
  an error naming the reshape and where it was made, before the first step.

:func:`explain` words the error of a first split call that failed anyway,
naming a constant of the script's graph that equals the batch size and meets
the batch (``T.zeros((batch_size, n))``, ``T.arange(batch_size)``), and only
where there is one.
"""
import copy
import itertools

from tmpi_adapters.errors import ConfigError
from tmpi_adapters.graphs.catalogue import DECLARE_BATCH as _CONVS, name_of
from tmpi_adapters.graphs.reshapes import ROWS_MEET, Rewrite, RowsMeet, decide

#: The tag a reshape to a constant shape carries, so that it is found again in
#: the clones a function is compiled from (``Variable.clone`` copies tags).
TAG = "tmpi_reshape"
_labels = itertools.count()

#: Ops that make a tensor of a constant size: where such a size equals the
#: batch size and the tensor meets the batch, a split call may fail.
_SIZED = ("Alloc", "AllocEmpty", "ARange", "Tile", "Repeat", "SpecifyShape", "Reshape",
          "Eye")


def _nodes(variables):
    from theano.gof.graph import inputs, io_toposort
    variables = [v for v in variables if v is not None]
    return io_toposort(list(inputs(variables)), variables)


def _constant_shape(variable):
    """The ints of a constant shape vector, or ``None``."""
    from tmpi_adapters.graphs.layout import constant_ints
    return constant_ints(variable)


def _batch_dependent(nodes, data):
    """The ids of the variables of ``nodes`` computed from ``data``."""
    found = {id(v) for v in data}
    for node in nodes:
        if any(id(v) in found for v in node.inputs):
            found.update(id(v) for v in node.outputs)
    return found


def label_of(variable):
    """The label of a tagged reshape's output, or ``None``."""
    return getattr(variable.tag, TAG, None)


def reshape_inputs(variables):
    """``{label: (input, output)}`` of the tagged reshapes in ``variables``' graph."""
    return {label_of(node.outputs[0]): (node.inputs[0], node.outputs[0])
            for node in _nodes(variables) if label_of(node.outputs[0]) is not None}


def tag(variable):
    """The label of a reshape's output, given one if it has none."""
    label = label_of(variable)
    if label is None:
        label = next(_labels)
        setattr(variable.tag, TAG, label)
    return label


def made_at(variable):
    """``file:line`` of the script's line that made ``variable`` (from the
    trace Theano keeps in its tag), or ``""``."""
    from tmpi_adapters.process.failure import is_library_frame
    trace = getattr(variable.tag, "trace", None) or []
    frames = [f for stack in trace for f in stack]
    for frame in reversed(frames):
        filename, lineno = frame[0], frame[1]
        if not is_library_frame(filename):
            return "%s:%d" % (filename.rsplit("/", 1)[-1], lineno)
    return ""


def _where(variable):
    at = made_at(variable)
    return " made at %s" % at if at else ""


class Found:
    """The nodes of a graph that may fix the batch size (see :func:`find`)."""

    def __init__(self, reshapes, convs):
        #: ``{label: (node, constant shape)}`` of reshapes of the batch to
        #: constant shapes (their outputs tagged with the label)
        self.reshapes = reshapes
        #: convolution nodes on the batch that declare their input's batch size
        self.convs = convs

    def __bool__(self):
        return bool(self.reshapes or self.convs)


def find(variables, data):
    """The nodes of ``variables``' graph that may fix the batch size
    (``data``: the variables that carry the batch); reshapes to constant
    shapes are tagged (:data:`TAG`)."""
    nodes = _nodes(variables)
    dependent = _batch_dependent(nodes, data)
    reshapes, convs = {}, []
    for node in nodes:
        name = name_of(node.op)
        if name == "Reshape":
            shape = _constant_shape(node.inputs[1])
            if shape and id(node.inputs[0]) in dependent:
                label = label_of(node.outputs[0])
                if label is None:
                    label = next(_labels)
                    setattr(node.outputs[0].tag, TAG, label)
                reshapes[label] = (node, tuple(shape))
        elif name in _CONVS:
            imshp = getattr(node.op, "imshp", None)
            if imshp and imshp[0] is not None and id(node.outputs[0]) in dependent:
                convs.append(node)
    return Found(reshapes, convs)


def rebuild(variables, rewrites, local, data, convs=True):
    """``variables`` with the tagged reshapes of ``rewrites`` (``{label:
    Rewrite}``) made each rank's own, and (with ``convs``) convolutions on the
    batch declaring no batch size.

    Parameters
    ----------
    variables : list of Variable
        The graph to rebuild (outputs and update expressions, already cloned).
    rewrites : dict
        ``label -> Rewrite`` (:func:`decide`).
    local : Variable
        An int64 scalar: this rank's rows (an input's length along its batch axis).
    data : list of Variable
        The variables that carry the batch.
    """
    nodes = _nodes(variables)
    dependent = _batch_dependent(nodes, data) if convs else set()
    memo = {}
    for node in nodes:
        inputs = [memo.get(v, v) for v in node.inputs]
        op = node.op
        name = name_of(op)
        if name == "Reshape":
            rewrite = rewrites.get(label_of(node.outputs[0]))
            if rewrite is not None:
                inputs[1] = rewrite.shape(local)
        elif name in _CONVS and convs and getattr(op, "imshp", None) \
                and op.imshp[0] is not None and id(node.outputs[0]) in dependent:
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

    Convolutions that declare the batch size are rebuilt when the function is
    compiled (:meth:`transform`); reshapes to constant shapes on the first
    split call, once Theano's shape inference has shown which of them follow
    the rows (:meth:`resolve`; the function is then compiled once more, and
    only where some reshape needs it).

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
        self.graph = list(graph)
        self.found = find(graph, data)
        self.data = list(data)
        self.local = local
        self.name = name
        #: ``label -> Rewrite or None``, once decided
        self.rewrites = {}
        #: ``label -> the axis of the new shape that holds the rows`` (``None``:
        #: its size does not follow the rows; :data:`ROWS_MEET`: rows of
        #: different ranks' shares meet in it), once decided
        self.axes = {}
        #: the rewrites :meth:`assume` took for granted, if it was asked
        self.assumed = None
        self.done = not self.found.reshapes

    def __bool__(self):
        return bool(self.found) and self.local is not None

    @property
    def declared(self):
        """True when convolutions declare the batch size (rebuilt at compile time)."""
        return bool(self.found.convs)

    def assume(self):
        """The transform of the graph as it will most likely be rebuilt, for
        reading the graph before the first call: the batch size the
        convolutions declare taken for the rows wherever a reshape's constant
        shape has it on one axis.  :meth:`resolve` decides for real;
        :attr:`confirmed` says whether it decided the same."""
        sizes = {node.op.imshp[0] for node in self.found.convs}
        batch = sizes.pop() if len(sizes) == 1 else None
        self.assumed = {label: Rewrite(shape.index(batch), 1, 1, shape)
                        for label, (_, shape) in self.found.reshapes.items()
                        if shape is not None and shape.count(batch) == 1 and -1 not in shape}
        return self.transform(self.assumed)

    @property
    def confirmed(self):
        """False when :meth:`resolve` rebuilt the reshapes otherwise than
        :meth:`assume` assumed."""
        if self.assumed is None:
            return True
        return all(repr(self.assumed.get(label)) == repr(self.rewrites.get(label))
                   for label in self.found.reshapes)

    def transform(self, rewrites=None):
        """What rewrites a cloned graph: convolutions, and ``rewrites`` (by
        default the reshapes decided so far)."""
        rewrites = {k: v for k, v in (self.rewrites if rewrites is None else rewrites).items()
                    if v is not None}

        def rewrite(variables):
            return rebuild(variables, rewrites, self.local, self.data)
        return rewrite

    def describe(self, label):
        node, shape = self.found.reshapes[label]
        if shape is None:
            return "%s: the reshape%s" % (self.name, _where(node.outputs[0]))
        return "%s: the reshape to the constant shape %s%s" % (
            self.name, shape, _where(node.outputs[0]))

    def probe_also(self, nodes):
        """Decide on the first split call the rows of these reshapes too
        (shapes computed in the graph, which the sizes did not decide)."""
        for node in nodes:
            self.found.reshapes.setdefault(tag(node.outputs[0]), (node, None))
            self.done = False

    def _upstream(self):
        """``label -> labels of the reshapes above it``."""
        labels = set(self.found.reshapes)
        above = {}
        for label, (node, _) in self.found.reshapes.items():
            above[label] = {label_of(n.outputs[0]) for n in _nodes([node.inputs[0]])} & labels
        return above

    def assumed_axes(self):
        """Where the rows of each reshape most likely go, before :meth:`resolve`
        decides: the axis holding the batch size the convolutions declare,
        else axis 0."""
        sizes = {node.op.imshp[0] for node in self.found.convs}
        batch = sizes.pop() if len(sizes) == 1 else None
        return {label: shape.index(batch) if shape is not None and shape.count(batch) == 1
                else 0 for label, (_, shape) in self.found.reshapes.items()}

    def resolve(self, sizes, probe, couples=False):
        """Decide every reshape to a constant shape; the transform to compile
        with when some reshape needs rewriting, else ``None``.  With
        ``couples``, a reshape no share can follow is decided
        :data:`ROWS_MEET` (the row analysis makes its rows whole) instead of
        an error, and the reshapes below it need no decision.

        Parameters
        ----------
        sizes : list of int
            Row counts the function can run now: the call's whole batch first,
            then each rank's share (at least two distinct counts).
        probe : callable
            ``probe(transform, labels, sizes)`` -> ``{label: [shape of the
            reshape's input at each size]}``, from the function's graph
            rewritten by ``transform``.
        """
        above = self._upstream()
        pending = set(self.found.reshapes)
        while pending:
            ready = sorted(l for l in pending if not above[l] & pending)
            whole = [l for l in ready if any(self.axes.get(u) == ROWS_MEET for u in above[l])]
            for label in whole:
                self.rewrites[label], self.axes[label] = None, ROWS_MEET
            ready = [l for l in ready if l not in whole]
            shapes = probe(self.transform(), ready, sizes) if ready else {}
            for label in ready:
                _, target = self.found.reshapes[label]
                ins, outs = shapes[label]
                try:
                    axis, rewrite = decide(self.describe(label), target, sizes, ins,
                                           contiguous=couples, outputs=outs)
                except RowsMeet:
                    if not couples:
                        raise
                    axis, rewrite = ROWS_MEET, None
                self.rewrites[label], self.axes[label] = rewrite, axis
            pending -= set(ready) | set(whole)
        self.done = True
        if not any(self.rewrites.values()):
            return None
        return self.transform()

    def explain(self, rows, size, error):
        """See :func:`explain` (for this function's graph)."""
        return explain(self.graph, self.data, rows, size, self.name, error)


def explain(graph, data, rows, size, name, error):
    """A :class:`~tmpi_adapters.errors.ConfigError` for a function whose first
    split call failed (``error``) where its graph (``graph``, on ``data``)
    makes a tensor of a constant size equal to the batch's ``rows`` and uses it
    with the batch, or ``None`` where it has no such tensor."""
    nodes = _nodes(graph)
    dependent = _batch_dependent(nodes, data)
    culprit = None
    for node in nodes:
        op_name = name_of(node.op)
        if op_name not in _SIZED or id(node.outputs[0]) in dependent:
            continue  # a reshape of the batch was proven by the first split call
        constants = [v for v in node.inputs[1:] if _constant_shape(v)] \
            if op_name in ("Reshape", "SpecifyShape", "Tile", "Repeat") else \
            [v for v in node.inputs if _constant_shape(v)]
        if not any(rows in _constant_shape(v) for v in constants):
            continue
        if _meets(nodes, node, dependent):
            culprit = _constant_tensor(node, op_name) + _where(node.outputs[0])
            break
    if culprit is None:
        return None
    return ConfigError(
        "%s failed on its first split batch (%s: %s). Its graph makes a tensor whose constant "
        "size equals the batch size %d (%s) and uses it with the batch, and strong scaling "
        "gives each of the %d ranks only part of every batch. If that size is the batch "
        "size, take it from the input's shape (x.shape[0]) instead of a constant, or run with "
        "--scaling weak so that each rank takes whole batches."
        % (name, type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "",
           rows, culprit, size))


def _constant_tensor(node, op_name):
    """A node of :data:`_SIZED`, as the script wrote it."""
    values = [_constant_shape(v) for v in node.inputs]
    text = [str(v[0]) if v is not None and len(v) == 1 else
            str(tuple(v)) if v is not None else "?" for v in values]
    if op_name in ("Alloc", "AllocEmpty"):
        dims = text[1:] if op_name == "Alloc" else text
        return "a tensor of the constant shape (%s) (T.zeros, T.ones, T.alloc or T.tile)" \
            % ", ".join(dims)
    if op_name == "ARange":
        return "T.arange(%s)" % ", ".join(text)
    return "%s(%s)" % (op_name, ", ".join(text))


def _meets(nodes, start, dependent):
    """True when a value computed from ``start``'s output is an input of a
    node together with a value computed from the batch."""
    derived = {id(v) for v in start.outputs}
    for node in nodes:
        if any(id(v) in derived for v in node.inputs):
            if any(id(v) in dependent for v in node.inputs):
                return True
            derived.update(id(v) for v in node.outputs)
    return False
