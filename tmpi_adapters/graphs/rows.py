"""The one row analysis of a function's graph: what each value is, row by row.

For each variable of a function's graph (outputs, updates, and the
gradients Theano built for them) :class:`Rows` proves what a rank's local
computation of it is, as a mark (:mod:`.marks`: ``Shard(axis)``, a partial
sum, a whole value, a size, ...).

The marks come from one walk over the graph in topological order.  Each
node is read by the rule its op has in the registry (:mod:`.registry`, the
rules in :mod:`.ops`), which says what each input must be made into first
and which mark each output gets; the engine here makes the conversions, in
the *converting* reading (``convert=True``, a training step):

* made whole (:meth:`Rows.replicated`): rows are gathered, partial values
  reduced (each a *request*, a :class:`~.pending.Pending` node that
  :mod:`tmpi_adapters.core.coupling` turns into collectives), a size
  expression is rebuilt from the global sizes (free);
* cut to the rank's rows (:meth:`Rows.rows_of`): a whole value that meets
  rows (a per-row weight vector kept in a shared variable, a value made
  whole upstream) is sliced to ``[lo, hi)``, free.

Rows meet where the rule says so: reductions over the row axis (partial),
products over it (``dot(h.T, d)``: partial), and everything else that mixes
rows (a row picked by index, ``h hᵀ``, a reshape that pairs rows, a scan
over rows): there every input is made whole and the op runs on the whole
batch.  An op with no rule is read the same way, and named.  So the
converted graph computes the one-process value of everything, whatever the
step does; where no rows meet it costs nothing but the step's one exchange.

The strict reading (``convert=False``) makes no conversion: a node that
would need one is :data:`~.marks.MIXED`.  Split evaluations use it (what
they return is combined after the call: :mod:`.outputs`).

The engine reads, in this order: a node computed without the batch keeps
it (:data:`~.marks.SAME`); one with a :data:`~.marks.MIXED` input is mixed;
one computed from the batch's sizes alone is read by the sizes rule
(:func:`.ops.shapes.sizes_only`), unless its own rule reads sizes itself;
every other node by its rule.

Reshapes are read from the sizes where the graph shows them
(:mod:`.layout`); others are decided by running the function's shapes on
the first split call (:mod:`.fixedbatch`), handed in as ``reshapes``.
Theano is imported when a :class:`Rows` is made.
"""
from tmpi_adapters.graphs import ops
from tmpi_adapters.graphs.catalogue import name_of
from tmpi_adapters.graphs.marks import DRAW, MIXED, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.patterns import like, window_slice, zero
from tmpi_adapters.graphs.pending import (Coupling, Refusal, Request, Strict, made_at,
                                          pending_op, what_is_made_whole)
from tmpi_adapters.graphs.registry import KEEP, Signature, rule_for, whole


def is_window_slice(node):
    """True for the slice that keeps a rank's entries of a draw tmpi made for
    the whole batch (it reads the noise window: never the same on every rank)."""
    return name_of(node.op) == "Subtensor" and window_slice(node) is not None


class Rows:
    """The row marks of every variable of ``layout``'s graph (see module doc).

    Parameters
    ----------
    layout : tmpi_adapters.graphs.layout.Layout
        The graph and its inputs' batch axes.
    convert : bool
        Build the converted graph (requests for collectives, slices, global
        sizes); otherwise what would need a conversion is :data:`MIXED`.
    window : Variable, optional
        The :data:`ROWS_WINDOW` shared vector (needed to convert).
    reshapes : dict, optional
        ``{label: decision}`` for the reshapes to constant shapes that
        :mod:`.fixedbatch` tagged: the axis of the new shape that holds the
        rows, or :data:`MIXED` for a reshape that pairs rows across ranks'
        shares (decided on a call, or assumed before the first).
    rewrite : dict, optional
        ``{label: Rewrite}``: the constant shapes made a rank's own.
    convs : bool
        Drop the batch size convolutions declare (they run on a share).
    local_rows : Variable, optional
        An int64 scalar: this rank's rows in a call (for rewritten reshapes).
    marks : dict, optional
        Marks known before the walk (a scan's inner inputs).
    gradients : dict, optional
        ``{GradientMarker node: position}``: the step's gradients, in
        exchange order.
    probe : bool
        Reshapes neither the sizes nor ``reshapes`` decide are assumed to
        keep the rows on axis 0 (a call decides before any split step runs).

    Calling it with a variable returns the variable's mark.  In the
    converting reading :meth:`local` gives the variable of the converted
    graph, and :attr:`requests`, :attr:`couplings` what was converted.
    """

    def __init__(self, layout, convert=False, window=None, reshapes=None, rewrite=None,
                 convs=True, local_rows=None, marks=None, gradients=None, probe=False):
        import theano.tensor as T
        self.T = T
        self.layout = layout
        self.convert = convert
        self.window = window
        self.reshapes = dict(reshapes or {})
        self.rewrite = dict(rewrite or {})
        self.convs = convs
        self.local_rows = local_rows
        self.gradients = dict(gradients or {})
        self.probe = probe
        self.marks = dict(marks or {})
        #: ``variable -> its form in the converted graph`` (where it differs)
        self.forms = {}
        self.requests = []
        self.couplings = []
        #: reshapes whose rows neither the sizes nor ``reshapes`` decided
        self.undecided = []
        #: the node where a conversion was refused, and why
        self.refusal = None
        #: rows computed from the batch's sizes alone (``ones_like(x)``, ``arange(n)``)
        self.sized = set()
        #: ``ARange(0, n)`` of the rows: its local positions
        self.positions = {}
        #: partial sums whose whole value waits for fewer collectives made from
        #: other partial sums: ``variable -> (parts, combine)``, its whole value
        #: ``combine(the whole of each part)`` (:mod:`.ops.reductions`)
        self.deferred = {}
        self._whole = {}
        self._global = {}
        self._cut = {}
        self._zero = {}
        self._levels = {}
        for variable in layout.data:
            axis = layout.axis(variable)
            self.marks.setdefault(variable, SAME if axis is None else Shard(axis))
        for node in layout.nodes:
            self.visit(node)

    # -- reading ------------------------------------------------------------------
    def __call__(self, variable):
        return self.marks.get(variable, SAME if variable.owner is None else MIXED)

    mark = __call__

    def batch_axes(self, variable):
        """The axes of ``variable`` whose length is the batch's."""
        sizes = self.layout.sizes.get(variable, ())
        return [k for k, s in enumerate(sizes) if self.layout.is_batch_size(s)]

    def local(self, variable):
        """``variable`` in the converted graph (its rank's value, as its mark says)."""
        return self.forms.get(variable, variable)

    def level(self, variable):
        """How many collectives, one after the other, the converted graph runs
        before ``variable``'s value exists (0: none)."""
        return self._levels.get(variable, 0)

    def is_zero(self, variable):
        """True for a value that is zero everywhere (``zeros_like``, ``alloc(0)``)."""
        if variable not in self._zero:
            self._zero[variable] = zero(variable)
        return self._zero[variable]

    def is_sized_rows(self, variable):
        """True for rows computed from the batch's sizes alone."""
        return isinstance(self(variable), Shard) and variable in self.sized

    # -- the walk ------------------------------------------------------------------
    def visit(self, node):
        """Mark ``node``'s outputs (and, converting, build their forms)."""
        ins = [self(v) for v in node.inputs]
        n = len(node.outputs)
        if all(m is SAME for m in ins) and not is_window_slice(node):
            # (A size of a whole value is SAME, but read from the converted graph.)
            changed = any(v in self.forms for v in node.inputs)
            self._set(node, [SAME] * n, self.apply(node, [self.local(v) for v in node.inputs])
                      if changed else None)
            return
        if MIXED in ins:
            self._set(node, [MIXED] * n)
            return
        made = len(self.requests)
        try:
            marks, forms = self.read(node, ins)
        except Strict:
            marks, forms = [MIXED] * n, None
        except Refusal as refusal:
            if self.refusal is None:
                self.refusal = refusal
            marks, forms = [MIXED] * n, None
        self._set(node, marks, forms, made)

    def read(self, node, ins, sized=True):
        """``(marks, forms)`` of ``node`` whose inputs have the marks ``ins``."""
        found = rule_for(node.op)
        if sized and getattr(found, "sizes", True) and not is_window_slice(node) and all(
                m is SAME or m == SHAPE or (isinstance(m, Shard) and v in self.sized)
                for m, v in zip(ins, node.inputs)):
            result = ops.shapes.sizes_only(self, node, ins)
        elif found is None:
            result = whole(node, "%s, an op tmpi has no rule for" % node.op)
        else:
            result = found(self, node, ins)
        return self.take(node, result)

    def take(self, node, result):
        """``(marks, forms)`` of a rule's ``result``: a :class:`Signature`'s
        inputs converted and the op applied, or the rule's own."""
        if not isinstance(result, Signature):
            return result
        inputs = [self.placed(v, placement, node, result.what)
                  for v, placement in zip(node.inputs, result.inputs)]
        return list(result.outputs), self.apply(node, inputs, result.op)

    def placed(self, variable, placement, node=None, what=None):
        """``variable`` in the converted graph as ``placement`` (see
        :mod:`.registry`) asks."""
        if placement is KEEP:
            return self.local(variable)
        if placement == REPL:
            return self.replicated(variable, node, what)
        if placement == SHAPE:
            return self.global_value(variable)
        if isinstance(placement, Shard):
            return self.rows_of(variable, placement)
        raise ValueError("no placement %r" % (placement,))

    def _set(self, node, marks, forms=None, made=0):
        # This node's outputs wait for its inputs' collectives and its own requests.
        depth = max([self.level(v) for v in node.inputs] +
                    [1 + self.level(r.source) for r in self.requests[made:]] + [0])
        for k, variable in enumerate(node.outputs):
            self._levels.setdefault(variable, depth)
            self.marks.setdefault(variable, marks[k])
            if forms is not None and forms[k] is not None and forms[k] is not variable:
                form = forms[k]
                if form.type != variable.type:
                    form = like(form, variable)
                self.forms.setdefault(variable, form)

    def apply(self, node, inputs, op=None):
        """The outputs of ``node`` (or ``op``) applied to ``inputs``: the
        node's own where nothing changed."""
        op = node.op if op is None else op
        if op is node.op and all(a is b for a, b in zip(inputs, node.inputs)):
            return list(node.outputs)
        if op is node.op:
            new = node.clone_with_new_inputs(inputs, strict=False)
        else:
            new = op.make_node(*inputs)
        for old, fresh in zip(node.outputs, new.outputs):
            fresh.name = old.name
            if hasattr(old.tag, "trace"):
                fresh.tag.trace = old.tag.trace
        return list(new.outputs)

    # -- conversions -----------------------------------------------------------------
    def replicated(self, variable, node=None, what=None, gradient=None):
        """``variable``'s one-process value on every rank (a form of the
        converted graph); ``node`` is where it is needed (for messages)."""
        mark = self(variable)
        if mark is SAME or mark == REPL:
            return self.local(variable)
        if mark == SHAPE or self.is_sized_rows(variable):
            return self.global_value(variable)
        if not self.convert:
            raise Strict()
        if isinstance(mark, Shard) and self.is_zero(variable):
            return self._zeros(variable, mark.axis)
        if mark == DRAW or mark == MIXED:
            raise Refusal(node, "a random draw shaped like the batch's rows that is not drawn "
                                "for the whole batch")
        key = (variable, gradient)
        if key not in self._whole and mark == SUM and gradient is None:
            self._whole[key] = self._deferred(variable, node, what)
        if key not in self._whole and isinstance(mark, Shard) and mark.inner:
            self._whole[key] = self._gathered_blocks(variable, mark, node, what)
        if self._whole.get(key) is None:
            axis = mark.axis if isinstance(mark, Shard) else None
            self._whole[key] = self.request("gather" if axis is not None else mark.op,
                                            self.local(variable), variable, node, what, axis,
                                            gradient)
        return self._whole[key]

    def _gathered_blocks(self, variable, mark, node, what):
        """The whole value of rows on the inner factor of an axis (``(T*b,
        d)``): each rank's ``(T, b, d)`` gathered along the rows, then merged
        back to ``(T*B, d)``."""
        local = self.local(variable)
        axis = mark.axis
        here = self.window_values()[3]
        shape = [local.shape[j] for j in range(local.ndim)]
        blocks = local.reshape(shape[:axis] + [shape[axis] // here, here] + shape[axis + 1:],
                               ndim=local.ndim + 1)
        whole_blocks = self.request("gather", blocks, variable, node, what, axis + 1)
        merged = [whole_blocks.shape[j] for j in range(whole_blocks.ndim)]
        return whole_blocks.reshape(merged[:axis] + [merged[axis] * merged[axis + 1]] +
                                    merged[axis + 2:], ndim=local.ndim)

    def _deferred(self, variable, node, what, depth=0):
        """The whole value of partial sum ``variable`` made from a deferred
        sum (:attr:`deferred`) it is a linear function of (through
        dimshuffles, ``-``, casts, and products or quotients by whole values),
        else ``None``."""
        from theano import scalar
        if variable in self.deferred:
            parts, combine = self.deferred[variable]
            return combine([self.request("sum", part, variable, node, what) for part in parts])
        owner = variable.owner
        if owner is None or depth > 8 or len(owner.outputs) != 1:
            return None
        op = getattr(owner.op, "scalar_op", None)
        ins = [self(v) for v in owner.inputs]
        if name_of(owner.op) == "DimShuffle" or isinstance(op, (scalar.Neg, scalar.Identity)) \
                or isinstance(op, scalar.Cast) and variable.dtype.startswith("float"):
            inner = self._deferred(owner.inputs[0], node, what, depth + 1)
            return None if inner is None else self.apply(owner, [inner])[0]
        if isinstance(op, (scalar.Mul, scalar.TrueDiv)) and ins.count(SUM) == 1 and \
                (isinstance(op, scalar.Mul) or ins[0] == SUM) and \
                all(m == SUM or m is SAME or m in (REPL, SHAPE) for m in ins):
            k = ins.index(SUM)
            inner = self._deferred(owner.inputs[k], node, what, depth + 1)
            if inner is None:
                return None
            inputs = [inner if j == k else self.placed(v, SHAPE if m == SHAPE else REPL, node)
                      for j, (m, v) in enumerate(zip(ins, owner.inputs))]
            return self.apply(owner, inputs)[0]
        return None

    def request(self, kind, part, source, node=None, what=None, axis=None, gradient=None):
        """The whole value that this rank's ``part`` of ``source`` is a part of,
        made by a collective of ``kind`` (a :class:`~.pending.Pending` node,
        recorded as a request and a coupling); ``node``: where it is needed."""
        op = pending_op()(kind, axis)
        output = op(part)
        request = Request(kind, op.axis, source, output, gradient)
        request.coupling = Coupling(kind, what_is_made_whole(kind, what),
                                    made_at(node if node is not None else source.owner))
        self.requests.append(request)
        self.couplings.append(request.coupling)
        return output

    def _zeros(self, variable, axis):
        """Zeros shaped like the whole of rows ``variable`` (``zeros_like(h)`` in a
        gradient): built from the global sizes, nothing gathered."""
        if (variable, "zeros") not in self._cut:
            local = self.local(variable)
            shape = [self.global_length(variable, k) if k == axis else local.shape[k]
                     for k in range(variable.ndim)]
            zeros = self.T.zeros(shape, dtype=variable.dtype)
            self._cut[(variable, "zeros")] = self.T.patternbroadcast(zeros,
                                                                     variable.broadcastable)
        return self._cut[(variable, "zeros")]

    def partial_or_zero(self, variable):
        """A linear op's input: a partial sum as it is, a zero made whole (a
        zero as long as the batch's rows is rebuilt from the global sizes),
        else ``None``."""
        mark = self(variable)
        if mark == SUM:
            return self.local(variable)
        if self.is_zero(variable) and (mark is SAME or isinstance(mark, Shard)):
            return self.replicated(variable)
        return None

    def rows_of(self, variable, rows):
        """``variable``'s rows ``[lo, hi)`` as the :class:`~.marks.Shard`
        ``rows`` says (a form of the converted graph): its local value when it
        is those rows, else its whole value sliced (a value as long as the
        batch that is not split)."""
        mark = self(variable)
        if mark == rows:
            return self.local(variable)
        if not self.convert or isinstance(mark, Shard):
            raise Strict()
        key = (variable, rows)
        if key not in self._cut:
            self._cut[key] = self._slice(self.replicated(variable), rows)
        return self._cut[key]

    def window_values(self):
        """``lo, hi`` and the global and local row counts, at least 1 each
        (read from the window, where the host keeps them: no integer
        ``maximum`` for a device's kernels to build)."""
        w = self.window
        return w[0], w[1], w[2], w[3]

    def _slice(self, whole_value, rows):
        """Rows ``[lo, hi)`` of a whole value along ``rows``' axis (scaled
        when the axis holds several entries per row; of each outer block
        where the rows are the inner factor of the axis)."""
        lo, hi, total, _ = self.window_values()
        axis = rows.axis
        length = whole_value.shape[axis]
        if not rows.inner:
            index = (slice(None),) * axis + (slice(lo * length // total, hi * length // total),)
            return whole_value[index]
        shape = [whole_value.shape[j] for j in range(whole_value.ndim)]
        blocks = whole_value.reshape(shape[:axis] + [length // total, total] + shape[axis + 1:],
                                     ndim=whole_value.ndim + 1)
        cut = blocks[(slice(None),) * (axis + 1) + (slice(lo, hi),)]
        return cut.reshape(shape[:axis] + [(length // total) * (hi - lo)] + shape[axis + 1:],
                           ndim=whole_value.ndim)

    def global_length(self, variable, axis):
        """The one-process length of a rows ``variable``'s ``axis``."""
        _, _, total, local = self.window_values()
        value = self.local(variable)
        return self.T.cast(value.shape[axis] * total // local, "int64")

    def global_value(self, variable):
        """A value computed from the batch's sizes, rebuilt from the global sizes."""
        if variable not in self._global:
            mark = self(variable)
            if mark is SAME or variable.owner is None:
                return self.local(variable)
            if not self.convert:
                raise Strict()
            self._global[variable] = ops.shapes.rebuilt(self, variable)
        return self._global[variable]
