"""The one row analysis of a function's graph: what each value is, row by row.

Under strong scaling each rank runs rows ``[lo, hi)`` of every global batch
of ``N`` rows.  For each variable of a function's graph (outputs, updates,
and the gradients Theano built for them) :class:`Rows` proves what a rank's
local computation of it is, as a *mark*:

``int k`` (rows)
    the local value is rows ``[lo, hi)`` of the one-process value along axis
    ``k`` (an axis that merges rows with other axes, ``(B*T, d)``, holds the
    rank's rows contiguously): predictions, per-row losses, activations.
:data:`SAME`
    computed without the batch: parameters, constants.
:data:`SHAPE`
    computed from the batch's sizes only (``x.shape[0]``, a mean's divisor):
    its one-process value is the same expression of the global sizes.
:data:`SUM`, :data:`MAX`, :data:`MIN` (partial)
    the one-process value is the sum (maximum, minimum) over ranks of the
    local values: a sum over rows, ``dot(x.T, delta)``, a gradient.
:data:`REPL`
    the one-process value itself, the same on every rank, computed from
    values made whole by collectives.
:data:`DRAW`
    a random draw made for the whole batch, of which a rank keeps its rows.
:data:`MIXED`
    the rows meet in a way the reading does not make exact (strict reading).

The marks come from one walk over the graph in topological order; each
node's rule says what its outputs are from its inputs' marks, and, in the
*converting* reading (``convert=True``, a training step), what each input
must be turned into first:

* made whole (:meth:`Rows.replicated`): rows are gathered, partial values
  reduced (each a *request*, a :class:`Pending` node that
  :mod:`tmpi_adapters.core.coupling` turns into collectives), a size
  expression is rebuilt from the global sizes (free);
* cut to the rank's rows (:meth:`Rows.rows_of`): a whole value that meets
  rows (a per-row weight vector kept in a shared variable, a value made
  whole upstream) is sliced to ``[lo, hi)``, free.

Rows meet where the rule says so: reductions over the row axis (partial),
products over it (``dot(h.T, d)``: partial), and everything else that mixes
rows (a row picked by index, ``h hᵀ``, a reshape that pairs rows, a scan
over rows, ops the walk does not know): there every input is made whole and
the op runs on the whole batch (:data:`REPL`).  So the converted graph
computes the one-process value of everything, whatever the step does; where
no rows meet it costs nothing but the step's one exchange.

The strict reading (``convert=False``) makes no conversion: a node that
would need one is :data:`MIXED`.  Split evaluations use it (what they
return is combined after the call: :mod:`tmpi_adapters.graphs.outputs`).

Reshapes are read from the sizes where the graph shows them
(:mod:`tmpi_adapters.graphs.layout`); others are decided by running the
function's shapes on the first split call (:mod:`.fixedbatch`), handed in as
``reshapes``.  Theano is imported when a :class:`Rows` is made.
"""
from tmpi_adapters.graphs.rowmarks import (  # noqa: F401 - the marks, read with the analysis
    DRAW, MAX, MIN, MIXED, NOISE_WINDOW, PARTIAL, REPL, ROWS_WINDOW, SAME, SHAPE, SUM,
    Coupling, Refusal, Request, _constant, _counts_rows, _keeps_rank_rows, _like, _made_at,
    _shape_entry, _Strict, _what, is_pending, name_of, pending_op)
from tmpi_adapters.graphs.rowrules import RowRules


class Rows(RowRules):
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
        #: ``label -> Rewrite`` of reshapes to constant shapes (:mod:`.fixedbatch`)
        self.rewrite = dict(rewrite or {})
        self.convs = convs
        #: an int64 scalar: this rank's rows in a call (for rewritten reshapes)
        self.local_rows = local_rows
        #: ``{GradientMarker node: position}``: the step's gradients, in exchange order
        self.gradients = dict(gradients or {})
        self.marks = dict(marks or {})
        self.forms = {}
        self.requests = []
        self.couplings = []
        #: reshapes whose rows neither the sizes nor ``reshapes`` decided
        self.undecided = []
        #: such reshapes are assumed to keep the rows on axis 0 (a call will
        #: decide before any split step runs), not made whole
        self.probe = probe
        #: the node where a conversion was refused, and why
        self.refusal = None
        self._whole = {}
        self._global = {}
        self._cut = {}
        self._sized = set()          # row values computed from the batch's sizes alone
        self._positions = {}         # ARange(0, n) of the rows: its local positions
        self._zero = {}
        self._levels = {}
        for variable in layout.data:
            axis = layout.axis(variable)
            self.marks.setdefault(variable, SAME if axis is None else axis)
        for node in layout.nodes:
            self._visit(node)

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

    # -- the walk ------------------------------------------------------------------
    def _visit(self, node):
        ins = [self(v) for v in node.inputs]
        n = len(node.outputs)
        if all(m is SAME for m in ins):
            # (A size of a whole value is SAME, but read from the converted graph.)
            changed = any(v in self.forms for v in node.inputs)
            self._set(node, [SAME] * n, self._apply(node, [self.local(v) for v in node.inputs])
                      if changed else None)
            return
        if MIXED in ins:
            self._set(node, [MIXED] * n)
            return
        made = len(self.requests)
        try:
            marks, forms = self._rule(node, ins)
        except _Strict:
            marks, forms = [MIXED] * n, None
        except Refusal as refusal:
            if self.refusal is None:
                self.refusal = refusal
            marks, forms = [MIXED] * n, None
        self._set(node, marks, forms, made)

    def level(self, variable):
        """How many collectives, one after the other, the converted graph runs
        before ``variable``'s value exists (0: none)."""
        return self._levels.get(variable, 0)

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
                    form = _like(form, variable)
                self.forms.setdefault(variable, form)

    def _apply(self, node, inputs, op=None):
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

    def _whole_inputs(self, node, ins, what=None):
        """Every input made whole; the node runs on the whole batch."""
        inputs = [self.replicated(v, node, what) for v in node.inputs]
        return [REPL] * len(node.outputs), self._apply(node, inputs)

    # -- conversions -----------------------------------------------------------------
    def replicated(self, variable, node=None, what=None, gradient=None):
        """``variable``'s one-process value on every rank (a form of the
        converted graph); ``node`` is where it is needed (for messages)."""
        mark = self(variable)
        if mark is SAME or mark == REPL:
            return self.local(variable)
        if mark == SHAPE or (isinstance(mark, int) and variable in self._sized):
            return self.global_value(variable)
        if not self.convert:
            raise _Strict()
        if isinstance(mark, int) and self._is_zero(variable):
            return self._zeros(variable, mark)
        if mark == DRAW or mark == MIXED:
            raise Refusal(node, "a random draw shaped like the batch's rows that is not drawn "
                                "for the whole batch")
        key = (variable, gradient)
        if key in self._whole:
            return self._whole[key]
        kind = "gather" if isinstance(mark, int) else mark[1:]
        op = pending_op()(kind, mark if isinstance(mark, int) else None)
        output = op(self.local(variable))
        request = Request(kind, op.axis, variable, output, gradient)
        request.coupling = Coupling(kind, _what(kind, node, what, variable),
                                    _made_at(node if node is not None else variable.owner))
        self.requests.append(request)
        self.couplings.append(request.coupling)
        self._whole[key] = output
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

    def _partial_or_zero(self, variable):
        """A linear op's input: a partial sum as it is, a zero made whole (a
        zero as long as the batch's rows is rebuilt from the global sizes),
        else ``None``."""
        mark = self(variable)
        if mark == SUM:
            return self.local(variable)
        if self._is_zero(variable) and (mark is SAME or isinstance(mark, int)):
            return self.replicated(variable)
        return None

    def rows_of(self, variable, axis):
        """``variable``'s rows ``[lo, hi)`` along ``axis`` (a form of the
        converted graph): its local value when it is rows there, else its
        whole value sliced (a value as long as the batch that is not split)."""
        mark = self(variable)
        if mark == axis:
            return self.local(variable)
        if not self.convert or isinstance(mark, int):
            raise _Strict()
        key = (variable, axis)
        if key not in self._cut:
            self._cut[key] = self._slice(self.replicated(variable), axis)
        return self._cut[key]

    def _window(self):
        """``lo, hi`` and the global and local row counts, at least 1 each
        (read from the window, where the host keeps them: no integer
        ``maximum`` for a device's kernels to build)."""
        w = self.window
        return w[0], w[1], w[2], w[3]

    def _slice(self, whole, axis):
        """Rows ``[lo, hi)`` of a whole value along ``axis`` (scaled when the
        axis holds several entries per row)."""
        lo, hi, total, _ = self._window()
        length = whole.shape[axis]
        index = (slice(None),) * axis + (slice(lo * length // total, hi * length // total),)
        return whole[index]

    def global_length(self, variable, axis):
        """The one-process length of a rows ``variable``'s ``axis``."""
        _, _, total, local = self._window()
        value = self.local(variable)
        return self.T.cast(value.shape[axis] * total // local, "int64")

    def global_value(self, variable):
        """A value computed from the batch's sizes, rebuilt from the global sizes."""
        if variable in self._global:
            return self._global[variable]
        mark = self(variable)
        node = variable.owner
        if mark is SAME or node is None:
            return self.local(variable)
        if not self.convert:
            raise _Strict()
        name = name_of(node.op)
        T = self.T
        if name in ("Shape", "Shape_i"):
            source = node.inputs[0]
            axis = self(source)
            local = self.local(source)
            if not isinstance(axis, int):
                result = self._apply(node, [local])[0]
            elif name == "Shape_i":
                result = self.global_length(source, node.op.i) if node.op.i == axis \
                    else local.shape[node.op.i]
            else:
                result = T.stack([self.global_length(source, k) if k == axis else
                                  T.cast(local.shape[k], "int64") for k in range(local.ndim)])
            result = T.cast(result, variable.dtype)
        elif name == "ARange" and variable in self._positions:
            result = self._apply(node, [self.global_value(v) for v in node.inputs])[0]
        elif name == "Elemwise" and type(node.op.scalar_op).__name__ == "Second" and \
                isinstance(self(node.inputs[0]), int) and node.inputs[0] not in self._sized:
            # b shaped like rows a: only a's global shape is needed, not its values.
            a, b = node.inputs
            axis, local = self(a), self.local(a)
            shape = [self.global_length(a, k) if k == axis else local.shape[k]
                     for k in range(a.ndim)]
            value = self.global_value(b) if self(b) == SHAPE else self.local(b)
            result = T.patternbroadcast(T.alloc(T.cast(value, variable.dtype), *shape),
                                        variable.broadcastable)
        else:
            inputs = [self.global_value(v) if self(v) == SHAPE or v in self._sized
                      else self.replicated(v) for v in node.inputs]
            result = self._apply(node, inputs)[node.outputs.index(variable)]
        self._global[variable] = result
        return result

    # -- the rules ----------------------------------------------------------------------
    def _shape(self, node, ins):
        source = ins[0]
        if isinstance(source, int):
            if name_of(node.op) == "Shape_i" and node.op.i != source:
                return [SAME], [self.local(node.inputs[0]).shape[node.op.i]
                                if node.inputs[0] in self.forms else None]
            return [SHAPE], self._apply(node, [self.local(node.inputs[0])])
        if source == DRAW:
            return [SAME], self._apply(node, [self.local(node.inputs[0])])
        # The shape of a partial or whole value is the same on every rank.
        return [SAME], self._apply(node, [self.local(node.inputs[0])])

    def _sizes_only(self, node, ins):
        """A node that reads the batch's sizes only: a size (SHAPE), a value
        uniform along the rows (``ones_like(x)``, ``zeros((n, d))``), the
        rows' positions (``arange(n)``), or anything else rebuilt whole.  Such
        rows are made whole without a collective: rebuilt from the global sizes."""
        name = name_of(node.op)
        inputs = [self.local(v) for v in node.inputs]
        if name == "Subtensor" and _keeps_rank_rows(self, node):
            return [0], self._apply(node, inputs)
        if name == "ARange":
            return self._arange(node, ins)
        if name == "Subtensor" and ins[0] == SHAPE and _shape_entry(self, node) is False:
            return [SAME], self._apply(node, inputs)
        if any(isinstance(m, int) for m in ins):
            # Rows built from sizes, transformed: the ordinary rules, still sized;
            # reduced over the rows, a value of the sizes alone (a count of rows).
            marks, forms = self._rule(node, ins, sized=False)
            for k, (variable, mark) in enumerate(zip(node.outputs, marks)):
                if isinstance(mark, int):
                    self._sized.add(variable)
                elif mark in PARTIAL and self.convert:
                    marks[k] = SHAPE
                    forms[k] = self.global_value(variable)
            return marks, forms
        marks = []
        for variable in node.outputs:
            axes = self.batch_axes(variable)
            if name in ("Alloc", "AllocEmpty"):
                # zeros((x.shape[0], n)): an axis as long as some value's rows.
                dims = node.inputs[1:] if name == "Alloc" else node.inputs
                axes = sorted(set(axes) | {j for j, d in enumerate(dims)
                                           if _counts_rows(self, d)})
            if not axes:
                marks.append(SHAPE)
            elif len(axes) == 1 and name in ("Alloc", "AllocEmpty"):
                marks.append(axes[0])
                self._sized.add(variable)
            else:
                marks.append(REPL)
        forms = self._apply(node, inputs)
        for k, variable in enumerate(node.outputs):
            if marks[k] == REPL:
                if not self.convert:
                    raise _Strict()
                forms[k] = self.global_value(variable)
        return marks, forms

    def _arange(self, node, ins):
        """``arange(start, stop)`` whose length is the rows': rows of the
        one-process ``arange``; its local positions kept for picking rows."""
        start, stop, step = node.inputs
        out = node.outputs[0]
        positions = self._apply(node, [self.local(v) for v in node.inputs])[0]
        if (self.batch_axes(out) == [0] or _counts_rows(self, stop)) and ins[0] is SAME \
                and _constant(start) == 0 and _constant(step) == 1:
            self._sized.add(out)
            self._positions[out] = positions
            if not self.convert:
                return [0], [positions]
            # This rank's rows of the whole arange: offset by the entries before them.
            local_stop = self.local(stop)
            offset = self.T.cast(self.window[0], local_stop.dtype) * local_stop // \
                self.T.cast(self.window[3], local_stop.dtype)
            return [0], [self.T.arange(offset, local_stop + offset, dtype=out.dtype)]
        if not self.batch_axes(out):
            return [SHAPE], [positions]
        if not self.convert:
            raise _Strict()
        return [REPL], [self.global_value(out)]

    def _draw(self, node, ins):
        """A random op.  Drawn for the whole batch on every rank, as tmpi draws
        (its size reads the :data:`NOISE_WINDOW`): the one-process draw,
        whole; drawn from the batch's values or shaped like a rank's rows
        some other way: drawn again from the whole batch's sizes and values
        (converting), or :data:`DRAW` (strict: not split)."""
        from theano.gof.graph import inputs as graph_inputs
        window = any(getattr(v, "name", None) == NOISE_WINDOW
                     for v in graph_inputs(list(node.inputs)))
        local = self._apply(node, [self.local(v) for v in node.inputs])
        if window and not any(isinstance(m, int) and v not in self._sized or m in PARTIAL
                              for m, v in zip(ins, node.inputs)):
            return [REPL] * len(node.outputs), local
        if not self.convert:
            return [DRAW] * len(node.outputs), local
        # Any other draw shaped by the batch (a permutation of its rows, a draw from
        # its values): every rank draws the whole batch's numbers from the same
        # generator state, which then advances as in one process (the generator's
        # update is converted with the step).
        inputs = [self.global_value(v) if m == SHAPE else self.replicated(v, node)
                  for m, v in zip(ins, node.inputs)]
        return [REPL] * len(node.outputs), self._apply(node, inputs)

