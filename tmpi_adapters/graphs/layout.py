"""Which axis of each input holds the batch, read from the graph once.

Most inputs carry one example per row (axis 0).  Sequence models do not:
``theano.scan`` iterates over axis 0 of its sequences, so Blocks' recurrent
bricks (and any scan over time) take ``(time, batch, ...)`` inputs whose
examples lie along axis 1.  Splitting such inputs along axis 0 would hand
each rank a piece of every sequence.  :class:`Layout` reads the graph a
function is compiled from and decides, per input:

* an axis whose length divides the cost (a mean over examples,
  ``cost.sum() / x.shape[1]``) is the batch axis;
* otherwise an input whose axis 0 a ``scan`` iterates over (its *time* axis)
  has its batch on axis 1;
* otherwise axis 0.

Axes are tracked as *symbols*: each data input's axis ``k`` is one symbol,
and the graph's operations (elementwise ops, dimshuffles, slices, reshapes
whose shape is read from another variable's shape, scans' sequences) say
which axes of which variables are the same axis, kept in a union-find.  A
conflict (one input with two batch axes, an axis that is both time and
batch) is reported as :attr:`Layout.problem`, raised only when a batch is
really split.  The analysis runs once per compiled function and only on more
than one rank; nothing here runs per call.  Theano is imported only when a
:class:`Layout` is made.
"""
import numpy as np

from tmpi_adapters.graphs.sizes import node_sizes, reduces_axes


class Layout:
    """What a graph says about the batch axes of its data inputs.

    Parameters
    ----------
    data : list of Variable
        The variables that carry data: a function's inputs, its ``givens``
        targets, shared variables an adapter says carry the batch.
    graph : list of Variable
        Everything the function computes (outputs, update expressions).
    costs : list of Variable
        Scalars whose divisions name the batch (the costs given to
        ``theano.grad``, the function's scalar outputs).
    counts : list of Variable
        Expressions known to count examples (Blocks' ``mean(total, count)``
        denominators).
    axes : dict, optional
        ``{variable: batch axis or None}`` of the data, when already known:
        nothing is read from the costs.
    outputs : list of Variable, optional
        What the function returns (``graph`` without its update
        expressions, whose sizes are the parameters'); all of ``graph`` by
        default.

    Attributes
    ----------
    axes : dict
        ``id(variable) -> batch axis`` (``None``: the input carries no batch).
    problem : str or None
        Why the batch axis of some input cannot be told.
    """

    def __init__(self, data, graph, costs=(), counts=(), axes=None, outputs=None):
        self.data = [d for d in data if d is not None]
        self._data_ids = {id(d) for d in self.data}
        self._parent = {}
        self._names = {}
        self.sizes = {}
        self.time = set()
        #: axis symbols looked up by index (``table[idx]``): a lookup table's, not rows
        self.tables = set()
        self.problem = None
        #: data inputs that carry no batch although they have axes: whole on every rank
        self.whole = []
        self._unread = []
        roots = [v for v in list(graph) + list(costs) + list(counts) if v is not None]
        self.nodes = _toposort(roots)
        self._read_sizes()
        # Classes only once every union is made: a union may change a root.
        self.time = {self._find(sym) for sym in self.time}
        if axes is not None:
            # Axes known already (a scan's inner graph, from its outer inputs).
            self.axes = {id(d): axes.get(d) for d in self.data}
        else:
            self.axes = self._decide(self._evidence(costs, counts))
            self._keep_whole(costs, graph if outputs is None else outputs)
        #: the classes of the symbols that are batch axes
        self.batch = {self._find((id(d), a)) for d in self.data
                      for a in [self.axes.get(id(d))] if a is not None}

    # -- the union-find of axis symbols -----------------------------------------------
    def _find(self, sym):
        parent = self._parent
        root = sym
        while parent.get(root, root) != root:
            root = parent[root]
        while parent.get(sym, sym) != root:
            parent[sym], sym = root, parent[sym]
        return root

    def union(self, a, b):
        """Say that two axis symbols are the same axis."""
        if isinstance(a, tuple) and isinstance(b, tuple):
            ra, rb = self._find(a), self._find(b)
            if ra != rb:
                self._parent[rb] = ra

    def is_batch_size(self, size):
        """True when ``size`` (an entry of :attr:`sizes`) is the batch's length."""
        return isinstance(size, tuple) and self._find(size) in self.batch

    def is_time_size(self, size):
        return isinstance(size, tuple) and self._find(size) in self.time

    # -- sizes --------------------------------------------------------------------------
    def _read_sizes(self):
        from theano.compile.sharedvalue import SharedVariable
        from theano.gof import Constant
        for variable in self.data:
            ndim = getattr(variable, "ndim", 0) or 0
            self.sizes[variable] = tuple((id(variable), k) for k in range(ndim))
            self._names[id(variable)] = variable
        for node in self.nodes:
            for variable in node.inputs:
                if variable in self.sizes or variable.owner is not None:
                    continue
                shape = None
                if isinstance(variable, Constant):
                    shape = getattr(variable.data, "shape", None)
                elif isinstance(variable, SharedVariable):
                    shape = getattr(variable.get_value(borrow=True), "shape", None)
                ndim = getattr(variable, "ndim", 0) or 0
                self.sizes[variable] = (tuple(int(s) for s in shape) if shape is not None
                                        and len(shape) == ndim else (None,) * ndim)
            try:
                out = node_sizes(self, node)
            except Exception:  # noqa: BLE001 - an op we cannot read: sizes unknown
                out = None
            for k, variable in enumerate(node.outputs):
                ndim = getattr(variable, "ndim", 0) or 0
                sizes = out[k] if out is not None and k < len(out) else None
                if sizes is None or len(sizes) != ndim:
                    sizes = (None,) * ndim
                self.sizes[variable] = tuple(sizes)
            if not reduces_axes(self, node):
                # Axes that enter this node and leave it under no name: where
                # they go is not read (kept to tell what carries the batch).
                entering = {s for v in node.inputs for s in self.sizes.get(v, ())
                            if isinstance(s, tuple)}
                if entering:
                    self._unread.append((entering, {s for v in node.outputs
                                                    for s in self.sizes.get(v, ())
                                                    if isinstance(s, tuple)}))

    def size_of(self, variable, axis):
        sizes = self.sizes.get(variable)
        if sizes is None or axis >= len(sizes):
            return None
        return sizes[axis]

    def resolve(self, expr):
        """A scalar size expression as a symbol, an int, or ``None``."""
        from theano.compile.ops import Shape_i
        from theano.gof import Constant
        from theano.tensor.basic import ScalarFromTensor, TensorFromScalar
        from theano.tensor.elemwise import DimShuffle, Elemwise
        from theano.tensor.subtensor import Subtensor
        from theano import scalar
        for _ in range(20):
            if isinstance(expr, Constant):
                ints = constant_ints(expr)
                return ints[0] if ints is not None and len(ints) == 1 else None
            node = expr.owner
            if node is None:
                return None
            op = node.op
            if isinstance(op, Shape_i):
                return self.size_of(node.inputs[0], op.i)
            if isinstance(op, Subtensor) and len(op.idx_list) == 1 \
                    and not isinstance(op.idx_list[0], slice):
                vector = self.resolve_vector(node.inputs[0])
                index = self.resolve(node.inputs[1]) if len(node.inputs) > 1 else op.idx_list[0]
                if vector is None or not isinstance(index, int) or \
                        not -len(vector) <= index < len(vector):
                    return None
                return vector[index]
            if isinstance(op, (ScalarFromTensor, TensorFromScalar, DimShuffle)) or (
                    isinstance(op, Elemwise)
                    and isinstance(op.scalar_op, (scalar.Cast, scalar.Identity))):
                expr = node.inputs[0]
                continue
            if isinstance(op, Elemwise) and isinstance(op.scalar_op, scalar.Mul):
                # n * 1 (T.tile's shapes): the size n.
                others = [v for v in node.inputs if self.resolve(v) != 1]
                if len(others) == 1:
                    expr = others[0]
                    continue
            return None
        return None

    def resolve_vector(self, expr):
        """A shape vector expression as a list of sizes, or ``None``."""
        from theano.compile.ops import Shape
        from theano.gof import Constant
        from theano.tensor.basic import Join
        from theano.tensor.elemwise import Elemwise
        from theano.tensor.opt import MakeVector
        from theano.tensor.subtensor import Subtensor, get_idx_list
        from theano import scalar
        if isinstance(expr, Constant):
            return constant_ints(expr)
        node = expr.owner
        if node is None:
            return None
        op = node.op
        if isinstance(op, Shape):
            return list(self.sizes.get(node.inputs[0], ()))
        if isinstance(op, MakeVector):
            return [self.resolve(v) for v in node.inputs]
        if isinstance(op, Elemwise) and isinstance(op.scalar_op, (scalar.Cast, scalar.Identity)):
            return self.resolve_vector(node.inputs[0])
        if isinstance(op, Join):
            parts = [self.resolve_vector(v) for v in node.inputs[1:]]
            return None if any(p is None for p in parts) else sum(parts, [])
        if isinstance(op, Subtensor) and len(op.idx_list) == 1 \
                and isinstance(op.idx_list[0], slice):
            vector = self.resolve_vector(node.inputs[0])
            index = get_idx_list(node.inputs, op.idx_list)[0]
            bounds = [None if b is None else self.resolve(b)
                      for b in (index.start, index.stop, index.step)]
            if vector is None or any(b is not None and not isinstance(b, int) for b in bounds):
                return None
            return vector[slice(*bounds)]
        return None

    def factors(self, expr):
        """The sizes a count expression multiplies (``None``: not only sizes)."""
        from theano.gof import Constant
        from theano.tensor.elemwise import Elemwise
        from theano import scalar
        size = self.resolve(expr)
        if size is not None:
            return [size]
        node = expr.owner
        if isinstance(expr, Constant) or node is None:
            return None
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op, scalar.Mul):
            found = []
            for factor in node.inputs:
                sub = self.factors(factor)
                if sub is None:
                    return None
                found += sub
            return found
        return None

    # -- evidence and decisions ------------------------------------------------------------
    def _evidence(self, costs, counts):
        """The classes of batch axes named by the costs' divisions and counts."""
        batch = set()
        for denominators in [_top_path(c)[0] for c in costs if c is not None] + \
                [[c] for c in counts if c is not None]:
            classes = set()
            for d in denominators:
                for size in self.factors(d) or ():
                    if isinstance(size, tuple) and not self.is_time_size(size):
                        classes.add(self._find(size))
            if len(classes) == 1:  # a mean over all elements names no one axis
                batch |= classes
        return batch

    def _decide(self, batch):
        axes, problems = {}, []
        for variable in self.data:
            ndim = getattr(variable, "ndim", 0) or 0
            syms = [(id(variable), k) for k in range(ndim)]
            named = [k for k, s in enumerate(syms) if self._find(s) in batch]
            timed = [k for k, s in enumerate(syms) if self.is_time_size(s)]
            name = describe(variable)
            if len(named) > 1:
                problems.append("the cost divides by the lengths of axes %s of %s"
                                % (named, name))
            elif named and named[0] in timed:
                problems.append("axis %d of %s is both the axis a scan iterates over and the "
                                "one the cost is averaged over" % (named[0], name))
            if named:
                axes[id(variable)] = named[0]
            elif timed:
                axis = 0 if 0 not in timed else (1 if ndim >= 2 and 1 not in timed else None)
                axes[id(variable)] = axis
                if axis is not None:
                    batch.add(self._find(syms[axis]))
            elif ndim >= 1 and self._only_a_table(variable):
                axes[id(variable)] = None
            else:
                axes[id(variable)] = 0 if ndim >= 1 else None
        # Inputs without evidence of their own take it from the inputs they
        # are combined with (a mask multiplied with a time-major cost matrix).
        for variable in self.data:
            ndim = getattr(variable, "ndim", 0) or 0
            named = [k for k in range(ndim) if self._find((id(variable), k)) in batch]
            if len(named) == 1 and axes.get(id(variable)) != named[0]:
                axes[id(variable)] = named[0]
        if problems:
            self.problem = "; ".join(problems)
        return axes

    def _keep_whole(self, costs, outputs):
        """Inputs that do not carry the batch stay whole on every rank.

        The batch is proven from the graph, never guessed from lengths: its
        rows are the axes the costs average or sum over last (the rows of the
        loss), and the axes of the outputs that are rows.  An input split
        along an axis that is none of these, and tied to none of them, holds
        something else (a reference batch whose statistics normalise the rows,
        class embeddings, a support set, a pool of negatives): whatever its
        length, every rank takes all of it.  A graph that proves no rows at
        all keeps every input's axis as decided."""
        proven = self._loss_rows(costs) | self._output_rows(outputs)
        if not proven:
            return
        # An axis that some node takes in and gives out under no name, other
        # than by reducing it, may reach the loss unseen: its input stays split.
        unread = set()
        for entering, leaving in self._unread:
            unread |= {self._find(s) for s in entering} - {self._find(s) for s in leaving}
        self.whole = []
        for variable in self.data:
            axis = self.axes.get(id(variable))
            if axis is None:
                continue
            kind = self._find((id(variable), axis))
            if kind not in proven and kind not in unread:
                self.axes[id(variable)] = None
                self.whole.append(variable)

    def _candidates(self):
        """The classes of the axes the data inputs would be split along."""
        return {self._find((id(d), a)) for d in self.data
                for a in [self.axes.get(id(d))] if a is not None}

    def _loss_rows(self, costs):
        """Classes of candidate axes that a cost reduces last: the rows of the loss."""
        from theano.tensor.elemwise import CAReduce
        candidates, found = self._candidates(), set()
        for cost in costs:
            for node in _top_path(cost)[1]:
                if not isinstance(node.op, CAReduce):
                    continue
                sizes = self.sizes.get(node.inputs[0], ())
                axes = range(len(sizes)) if node.op.axis is None else node.op.axis
                for k in axes:
                    if k < len(sizes) and isinstance(sizes[k], tuple) and \
                            self._find(sizes[k]) in candidates:
                        found.add(self._find(sizes[k]))
        return found

    def _output_rows(self, outputs):
        """Classes of candidate axes that the outputs keep (per-row outputs):
        of each output, its first such axis (scores of shape (rows, classes)
        keep the rows, whatever input the classes' axis came from)."""
        candidates, found = self._candidates(), set()
        for variable in outputs:
            for size in self.sizes.get(variable, ()):
                if isinstance(size, tuple) and self._find(size) in candidates:
                    found.add(self._find(size))
                    break
        return found

    def _only_a_table(self, variable):
        """True for an input whose axis 0 the graph only looks up by index
        (class weights ``w[y]``) and ties to no other input's axis: however
        long it is, it carries no rows."""
        tables = {self._find(t) for t in self.tables if isinstance(t, tuple)}
        first = self._find((id(variable), 0))
        if first not in tables:
            return False
        return not any(self._find((id(other), k)) == first for other in self.data
                       if other is not variable
                       for k in range(getattr(other, "ndim", 0) or 0))

    def axis(self, variable):
        """The batch axis of data ``variable`` (``None``: it carries none)."""
        return self.axes.get(id(variable))


def constant_ints(variable):
    """The integers of a Theano constant (a scalar or a vector), or ``None``
    for anything else."""
    from theano.gof import Constant
    if not isinstance(variable, Constant):
        return None
    try:
        return [int(v) for v in np.asarray(variable.data).reshape(-1)]
    except (TypeError, ValueError):
        return None


def describe(variable):
    name = getattr(variable, "name", None)
    return "input %r" % name if name else "an unnamed input (%s)" % getattr(variable, "type", "?")


def _toposort(roots):
    from theano.gof.graph import io_toposort, inputs
    return io_toposort(list(inputs(roots)), roots)


def _top_path(cost):
    """``(divisors, ends)`` along a scalar cost's top path (sums, products,
    negations, casts, dimshuffles, and the numerators of divisions): the
    divisors (``sum / n``, ``mean / m``), and the nodes where the path ends
    (the reductions that make the cost, among them)."""
    from theano import scalar
    from theano.tensor.elemwise import DimShuffle, Elemwise
    divisors, ends, stack, seen = [], [], [cost], set()
    while stack:
        variable = stack.pop()
        if id(variable) in seen or variable.owner is None:
            continue
        seen.add(id(variable))
        op, inputs = variable.owner.op, variable.owner.inputs
        kind = op.scalar_op if isinstance(op, Elemwise) else None
        if isinstance(op, DimShuffle):
            stack.append(inputs[0])
        elif isinstance(kind, (scalar.TrueDiv, scalar.IntDiv)):
            divisors.append(inputs[1])
            stack.append(inputs[0])
        elif isinstance(kind, (scalar.Mul, scalar.Add, scalar.Sub, scalar.Neg, scalar.Cast,
                               scalar.Identity)):
            stack.extend(inputs)
        elif kind is None:
            ends.append(variable.owner)
    return divisors, ends

