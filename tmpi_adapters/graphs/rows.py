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
import itertools

import numpy as np

SAME = None
SHAPE = "shape"
MIXED = "mixed"
REPL = "repl"
DRAW = "draw"
SUM, MAX, MIN = "+sum", "+max", "+min"
PARTIAL = (SUM, MAX, MIN)

#: Ops (by class name) that work on each row of their inputs' axis 0 alone:
#: which of their inputs hold the rows (the others are parameters, sizes).
ROW_OPS = {"Softmax": (0,), "SoftmaxWithBias": (0,), "LogSoftmax": (0,),
           "SoftmaxGrad": (0, 1), "LogSoftmaxGrad": (0, 1),
           "CrossentropyCategorical1Hot": (0, 1), "CrossentropyCategorical1HotGrad": (0, 1, 2),
           "CrossentropySoftmaxArgmax1HotWithBias": (0, 2),
           "CrossentropySoftmax1HotWithBiasDx": (0, 1, 2),
           "Prepend_scalar_constant_to_each_row": (0,), "Prepend_scalar_to_each_row": (1,),
           "Pool": (0,), "MaxPoolGrad": (0, 1, 2), "AveragePoolGrad": (0, 1),
           "DownsampleFactorMaxGradGrad": (0, 1, 2), "DownsampleFactorMax": (0,),
           "BatchedDot": (0, 1), "AbstractConv2d": (0,), "AbstractConv3d": (0,),
           "AbstractConv": (0,), "ConvOp": (0,), "CorrMM": (0,), "Corr3dMM": (0,),
           "AbstractConv2d_gradInputs": (1,), "AbstractConv3d_gradInputs": (1,),
           "AbstractConv_gradInputs": (1,)}
#: Ops whose one output is their first input (for the values tmpi reads).
IDENTITIES = {"Rebroadcast", "ViewOp", "DeepCopyOp", "OutputGuard", "DisconnectedGrad", "GradClip", "GradScale", "ZeroGrad", "Assert",
              "HostFromGpu", "GpuFromHost", "GpuContiguous", "SpecifyShape",
              "ConsiderConstant", "Identity"}
#: Convolutions: ``(input, filters)`` forward, and their gradients.
CONVS = {"AbstractConv2d", "AbstractConv3d", "AbstractConv", "ConvOp", "CorrMM", "Corr3dMM"}
CONV_GRAD_INPUTS = {"AbstractConv2d_gradInputs", "AbstractConv3d_gradInputs",
                    "AbstractConv_gradInputs"}
CONV_GRAD_WEIGHTS = {"AbstractConv2d_gradWeights", "AbstractConv3d_gradWeights",
                     "AbstractConv_gradWeights"}
#: Batch normalisation ops, read as the graphs Theano's own optimizer makes of them.
BATCH_NORMS = {"AbstractBatchNormTrain", "AbstractBatchNormTrainGrad",
               "AbstractBatchNormInference"}

#: The shared variable whose values say which rows of a draw made for the
#: whole batch a rank keeps (:mod:`tmpi_adapters.frameworks.random_streams`).
NOISE_WINDOW = "tmpi_noise_window"
#: The shared int64 vector ``[lo, hi, max(N, 1), max(hi - lo, 1)]``: this rank's
#: rows of a global batch of ``N`` rows (set before every split call).
ROWS_WINDOW = "tmpi_rows_window"

_pending_ids = itertools.count()


class Coupling:
    """One place where rows meet and what the converted graph does there.

    Attributes
    ----------
    kind : str
        ``"sum"``, ``"max"``, ``"min"`` (a cross-rank reduction) or
        ``"gather"`` (the rows made whole).
    what : str
        The expression, as the script wrote it ("a sum over the rows (Sum)").
    where : str
        ``file:line`` of the script's line that made it, or ``""``.
    """

    def __init__(self, kind, what, where):
        self.kind, self.what, self.where = kind, what, where

    def describe(self):
        return "%s%s" % (self.what, " (%s)" % self.where if self.where else "")


class Refusal(Exception):
    """Rows meet where no conversion makes the one-process value (a random
    draw shaped like the batch that is not made for the whole batch)."""

    def __init__(self, node, why):
        super().__init__(why)
        self.node, self.why = node, why


class _Strict(Exception):
    """A conversion the strict reading does not make."""


class Request:
    """A value made whole by a collective (a :class:`Pending` node's output).

    ``kind``: ``"sum"``, ``"max"``, ``"min"`` or ``"gather"`` (``axis``: the
    rows' axis); ``source``: the original variable; ``gradient``: the index
    of the gradient whose exchanged part this is, else ``None``.
    """

    def __init__(self, kind, axis, source, output, gradient=None):
        self.kind, self.axis, self.source, self.output = kind, axis, source, output
        self.gradient = gradient
        #: the :class:`Coupling` it makes whole (``None`` for a gradient)
        self.coupling = None


def pending_op():
    """The :class:`Pending` Op class (made when Theano is imported)."""
    global Pending
    if Pending is not None:
        return Pending
    from theano.gof import Apply, Op

    class _Pending(Op):
        """A value to be made whole across ranks: replaced by a collective
        (:mod:`tmpi_adapters.core.coupling`) before the function is compiled."""

        __props__ = ("kind", "axis", "ident")

        def __init__(self, kind, axis=None):
            self.kind, self.axis, self.ident = kind, axis, next(_pending_ids)

        def make_node(self, value):
            return Apply(self, [value], [value.type()])

        def perform(self, node, inputs, output_storage):
            raise AssertionError("a pending collective was compiled unreplaced")

        def do_constant_folding(self, node):
            return False
    Pending = _Pending
    return Pending


Pending = None


def is_pending(variable):
    return variable.owner is not None and Pending is not None and \
        isinstance(variable.owner.op, Pending)


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

    @property
    def couples(self):
        """True when the converted graph has collectives besides the exchange's."""
        return bool(self.couplings)

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
        try:
            marks, forms = self._rule(node, ins)
        except _Strict:
            marks, forms = [MIXED] * n, None
        except Refusal as refusal:
            if self.refusal is None:
                self.refusal = refusal
            marks, forms = [MIXED] * n, None
        self._set(node, marks, forms)

    def _set(self, node, marks, forms=None):
        for k, variable in enumerate(node.outputs):
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
        name = type(node.op).__name__
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
        else:
            inputs = [self.global_value(v) if self(v) == SHAPE or v in self._sized
                      else self.replicated(v) for v in node.inputs]
            result = self._apply(node, inputs)[node.outputs.index(variable)]
        self._global[variable] = result
        return result

    # -- the rules ----------------------------------------------------------------------
    def _rule(self, node, ins, sized=True):
        from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise
        op = node.op
        name = type(op).__name__
        if name in BATCH_NORMS:
            return self._expanded(node)
        if _is_random(node):
            return self._draw(node, ins)
        if sized and name not in ("Shape", "Shape_i") and all(
                m is SAME or m == SHAPE or (isinstance(m, int) and v in self._sized)
                for m, v in zip(ins, node.inputs)):
            return self._sizes_only(node, ins)
        if name in ("Shape", "Shape_i"):
            return self._shape(node, ins)
        if name in IDENTITIES or (name.startswith("Gpu") and name in IDENTITIES):
            if name == "SpecifyShape" and isinstance(ins[0], int):
                return [ins[0]], [self.local(node.inputs[0])]
            if name == "Assert":
                return [ins[0]], [self.local(node.inputs[0])]
            return [ins[0]], self._apply(node, [self.local(node.inputs[0])] +
                                         [self.local(v) for v in node.inputs[1:]])
        if isinstance(op, Elemwise):
            return self._elemwise(node, ins)
        if isinstance(op, DimShuffle):
            return self._dimshuffle(node, ins)
        if isinstance(op, CAReduce):
            return self._careduce(node, ins)
        rule = getattr(self, "_rule_" + name, None)
        if rule is not None:
            return rule(node, ins)
        if name in ROW_OPS:
            return self._row_op(node, ins)
        if name in CONV_GRAD_WEIGHTS:
            return self._conv_weights(node, ins)
        return self._whole_inputs(node, ins)

    def _shape(self, node, ins):
        source = ins[0]
        if isinstance(source, int):
            if type(node.op).__name__ == "Shape_i" and node.op.i != source:
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
        name = type(node.op).__name__
        inputs = [self.local(v) for v in node.inputs]
        if name == "Subtensor" and _keeps_rank_rows(self, node):
            return [0], self._apply(node, inputs)
        if name == "ARange":
            return self._arange(node, ins)
        if name == "Subtensor" and ins[0] == SHAPE and _shape_entry(self, node) is False:
            return [SAME], self._apply(node, inputs)
        if any(isinstance(m, int) for m in ins):
            # Rows built from sizes, transformed: the ordinary rules, still sized.
            marks, forms = self._rule(node, ins, sized=False)
            for variable, mark in zip(node.outputs, marks):
                if isinstance(mark, int):
                    self._sized.add(variable)
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
        some other way: :data:`DRAW`, refused where it is used."""
        from theano.gof.graph import inputs as graph_inputs
        window = any(getattr(v, "name", None) == NOISE_WINDOW
                     for v in graph_inputs(list(node.inputs)))
        local = self._apply(node, [self.local(v) for v in node.inputs])
        if window and not any(isinstance(m, int) and v not in self._sized or m in PARTIAL
                              for m, v in zip(ins, node.inputs)):
            return [REPL] * len(node.outputs), local
        return [DRAW] * len(node.outputs), local

    # Elementwise ------------------------------------------------------------------------
    def _elemwise(self, node, ins):
        from theano import scalar
        op = node.op.scalar_op
        out = node.outputs[0]
        if isinstance(op, scalar.Second):
            return self._fill(node, ins)
        axes = {m for m, v in zip(ins, node.inputs) if isinstance(m, int)}
        if len(axes) > 1:
            return self._whole_inputs(node, ins, "values with rows on different axes")
        if axes:
            k = axes.pop()
            inputs = []
            for m, v in zip(ins, node.inputs):
                if m == k:
                    inputs.append(self.local(v))
                elif v.ndim == out.ndim and not v.broadcastable[k]:
                    inputs.append(self.rows_of(v, k))       # as long as the batch, whole
                else:
                    inputs.append(self.replicated(v, node))
            return [k] * len(node.outputs), self._apply(node, inputs)
        partial = [m for m in ins if m in PARTIAL]
        if partial:
            kind = _linear(self, node, ins)
            if kind is not None:
                inputs = [self.local(v) if m in PARTIAL or self._is_zero(v)
                          else self.replicated(v, node) for m, v in zip(ins, node.inputs)]
                return [kind] * len(node.outputs), self._apply(node, inputs)
        if all(m is SAME or m == SHAPE for m in ins):
            return [SHAPE] * len(node.outputs), self._apply(node, [self.local(v)
                                                                  for v in node.inputs])
        return self._whole_inputs(node, ins)

    def _fill(self, node, ins):
        """``second(a, b)``: ``b`` shaped like ``a``; only ``a``'s shape counts."""
        shape, value = ins
        a, b = node.inputs
        if isinstance(shape, int):
            if isinstance(value, int) and value != shape:
                return self._whole_inputs(node, ins)
            if value == shape:
                return [shape], self._apply(node, [self.local(a), self.local(b)])
            if b.ndim == a.ndim and not b.broadcastable[shape] and value is not SAME:
                return [shape], self._apply(node, [self.local(a), self.rows_of(b, shape)])
            return [shape], self._apply(node, [self.local(a), self.replicated(b, node)])
        # The shape of a partial, whole or size value is the same on every rank.
        if value is SAME and a.ndim == 0:
            # (fill(cost, 1), the seed of every gradient: nothing waits for the cost.)
            return [SAME], [_like(self.T.as_tensor_variable(self.local(b)), node.outputs[0])]
        if value is SAME:
            return [SAME], self._apply(node, [self.local(a), self.local(b)])
        if value in PARTIAL and value == SUM:
            return [SUM], self._apply(node, [self.local(a), self.local(b)])
        if value == SHAPE:
            return [SHAPE], self._apply(node, [self.local(a), self.local(b)])
        if isinstance(value, int):
            return self._whole_inputs(node, ins)
        return [REPL], self._apply(node, [self.local(a), self.replicated(b, node)])

    def _is_zero(self, variable):
        """True for a value that is zero everywhere (``zeros_like``, ``alloc(0)``)."""
        if variable in self._zero:
            return self._zero[variable]
        found = _zero(variable)
        self._zero[variable] = found
        return found

    def _dimshuffle(self, node, ins):
        k = ins[0]
        source = node.inputs[0]
        if isinstance(k, int):
            if k not in node.op.new_order:
                return self._whole_inputs(node, ins)
            return [node.op.new_order.index(k)], self._apply(node, [self.local(source)])
        return [k], self._apply(node, [self.local(source)])

    def _careduce(self, node, ins):
        from theano import scalar
        k = ins[0]
        op = node.op
        axes = op.axis if op.axis is not None else tuple(range(node.inputs[0].ndim))
        source = node.inputs[0]
        scalar_op = op.scalar_op
        if isinstance(k, int):
            if k not in axes:
                return [k - sum(1 for a in axes if a < k)], self._apply(node, [self.local(source)])
            kind = {scalar.Add: SUM, scalar.Maximum: MAX, scalar.Minimum: MIN}.get(
                type(scalar_op))
            if kind is None:
                return self._whole_inputs(node, ins)
            return [kind], self._apply(node, [self.local(source)])
        if (k == SUM and isinstance(scalar_op, scalar.Add)) or \
                (k == MAX and isinstance(scalar_op, scalar.Maximum)) or \
                (k == MIN and isinstance(scalar_op, scalar.Minimum)):
            return [k], self._apply(node, [self.local(source)])
        if k == SHAPE:
            return [SHAPE], self._apply(node, [self.local(source)])
        return self._whole_inputs(node, ins)

    def _rule_MaxAndArgmax(self, node, ins):
        k = ins[0]
        axes = node.op.axis if node.op.axis is not None else range(node.inputs[0].ndim)
        if isinstance(k, int) and k not in axes:
            kept = k - sum(1 for a in axes if a < k)
            return [kept, kept], self._apply(node, [self.local(node.inputs[0])] +
                                             [self.local(v) for v in node.inputs[1:]])
        if isinstance(k, int):
            # The maximum is the maximum over ranks; the position needs the whole rows.
            local = self._apply(node, [self.local(v) for v in node.inputs])
            try:
                whole = self._apply(node, [self.replicated(v, node) for v in node.inputs])
            except _Strict:
                return [MAX, MIXED], [local[0], None]
            return [MAX, REPL], [local[0], whole[1]]
        return self._whole_inputs(node, ins)

    def _rule_Argmax(self, node, ins):
        k = ins[0]
        axes = node.op.axis if node.op.axis is not None else range(node.inputs[0].ndim)
        if isinstance(k, int) and k not in axes:
            return [k - sum(1 for a in axes if a < k)] * len(node.outputs), \
                self._apply(node, [self.local(v) for v in node.inputs])
        return self._whole_inputs(node, ins)

    # The step's gradients -------------------------------------------------------------
    def _rule_GradientMarker(self, node, ins):
        position = self.gradients.get(node)
        if position is None or not self.convert:
            return [ins[0]], [self.local(node.inputs[0])]
        return [REPL], [self.exchanged(node.inputs[0], position, node)]

    def exchanged(self, gradient, position, node=None):
        """The one-process ``gradient`` of the step's ``position``-th
        gradient: its terms that are partial sums travel in the step's
        exchange (one request, ``"sum"``), the terms every rank has whole (a
        weight penalty's) are added after it.  A gradient with no partial
        term travels whole (``"same"``), so that the exchange sees every
        gradient."""
        from theano.tensor.elemwise import Elemwise
        from theano import scalar
        T = self.T
        wrappers = []
        top = gradient
        while top.owner is not None and type(top.owner.op).__name__ in IDENTITIES:
            wrappers.append(top.owner)
            top = top.owner.inputs[0]
        terms, stack = [], [top]
        while stack:
            term = stack.pop()
            owner = term.owner
            if owner is not None and isinstance(owner.op, Elemwise) and \
                    isinstance(owner.op.scalar_op, scalar.Add) and self(term) != SUM:
                stack.extend(reversed(owner.inputs))
            else:
                terms.append(term)
        partial = [t for t in terms if self(t) == SUM]
        whole = [t for t in terms if self(t) != SUM]
        if self(top) == SUM:
            partial, whole = [top], []
        part, kind = None, "sum"
        if partial:
            part = self.local(partial[0]) if len(partial) == 1 else \
                T.add(*[self.local(t) for t in partial])
            added = [self.replicated(t, node) for t in whole]
            if part.type != top.type or (added and (part + T.add(*added)).type != top.type):
                part = None
        if part is None:
            part, added, kind = _like(self.replicated(top, node), top), [], "same"

        def wrapped(value):
            # Back inside the wrappers (a device gradient stays a device array).
            for wrapper in reversed(wrappers):
                value = self._apply(wrapper, [value] + [self.local(v)
                                                        for v in wrapper.inputs[1:]])[0]
            return value
        op = pending_op()(kind)
        output = op(wrapped(part))
        self.requests.append(Request(kind, None, top, output, gradient=position))
        if not added:
            return output
        total = added[0] if len(added) == 1 else T.add(*added)
        return gradient.type.filter_variable(_like(output + wrapped(_like(total, top)), top))

    # Products --------------------------------------------------------------------------
    def _rule_Dot(self, node, ins):
        x, y = node.inputs
        mx, my = ins
        cx = x.ndim - 1
        if mx == SUM and (my is SAME or my in (REPL, SHAPE)):
            return [SUM], self._apply(node, [self.local(x), self.replicated(y, node)])
        if my == SUM and (mx is SAME or mx in (REPL, SHAPE)):
            return [SUM], self._apply(node, [self.replicated(x, node), self.local(y)])
        rx, ry = isinstance(mx, int), isinstance(my, int)
        if rx and ry and mx == cx and my == 0:
            return [SUM], self._apply(node, [self.local(x), self.local(y)])
        if rx and not ry and mx == cx:
            return [SUM], self._apply(node, [self.local(x), self.rows_of(y, 0)])
        if ry and not rx and my == 0:
            return [SUM], self._apply(node, [self.rows_of(x, cx), self.local(y)])
        if rx and not ry:
            return [mx], self._apply(node, [self.local(x), self.replicated(y, node)])
        if ry and not rx:
            return [cx + my - 1], self._apply(node, [self.replicated(x, node), self.local(y)])
        return self._whole_inputs(node, ins, "a product of rows with rows (h hᵀ)")

    def _row_op(self, node, ins):
        """Ops that work on each row of axis 0 alone (softmax, convolutions, pooling)."""
        name = type(node.op).__name__
        carry = ROW_OPS[name]
        rows = [m for m in ins if isinstance(m, int)]
        if name in CONVS and ins[0] == 1 and len(ins) > 1 and ins[1] == 1:
            return self._conv_weights(node, ins)  # ConvOp on dimshuffled rows: a product
        if not rows or set(rows) != {0} or any(isinstance(ins[i], int) for i in range(len(ins))
                                               if i not in carry):
            return self._whole_inputs(node, ins)
        inputs = []
        for i, (m, v) in enumerate(zip(ins, node.inputs)):
            if i in carry:
                inputs.append(self.rows_of(v, 0))
            else:
                inputs.append(self.replicated(v, node))
        op = self._conv_op(node)
        outs = self._apply(node, inputs, op)
        return [0 if getattr(v, "ndim", 0) else MIXED for v in node.outputs], outs

    def _conv_op(self, node):
        """The node's op, without the batch size a convolution declares."""
        import copy
        op = node.op
        imshp = getattr(op, "imshp", None)
        if self.convs and imshp and imshp[0] is not None and not self.layout.problem:
            op = copy.copy(op)
            op.imshp = (None,) + tuple(imshp[1:])
        return op

    def _conv_weights(self, node, ins):
        """A convolution's gradient for its filters: a product over the rows."""
        name = type(node.op).__name__
        if name in CONV_GRAD_WEIGHTS and ins[0] == 0 and ins[1] == 0:
            inputs = [self.local(node.inputs[0]), self.local(node.inputs[1])] + \
                [self.replicated(v, node) for v in node.inputs[2:]]
            return [SUM], self._apply(node, inputs, self._conv_op(node))
        if name in CONVS and ins[0] == 1 and ins[1] == 1 and \
                getattr(node.op, "bsize", None) is None:
            return [SUM], self._apply(node, [self.local(v) for v in node.inputs])
        return self._whole_inputs(node, ins)

    # Indexing ---------------------------------------------------------------------------
    def _rule_Subtensor(self, node, ins):
        from theano.tensor.subtensor import get_idx_list
        k = ins[0]
        source = node.inputs[0]
        if _keeps_rank_rows(self, node):
            # A draw made for the whole batch: this rank keeps its own rows.
            return [0], self._apply(node, [self.local(v) for v in node.inputs])
        if k == DRAW:
            raise Refusal(node, "a random draw shaped like the batch's rows, sliced")
        if k == SHAPE:
            entry = _shape_entry(self, node)
            indices = [self.local(v) for v in node.inputs]
            return [SAME if entry is False else SHAPE], self._apply(node, indices)
        indices = [self.replicated(v, node) for v in node.inputs[1:]]
        if k in (SUM,) and all(m is SAME or m in (SHAPE, REPL) for m in ins[1:]):
            return [SUM], self._apply(node, [self.local(source)] + indices)
        if isinstance(k, int):
            index = get_idx_list(node.inputs, node.op.idx_list)
            whole_axis = k >= len(index) or (isinstance(index[k], slice) and
                                            (index[k].start, index[k].stop, index[k].step)
                                            == (None, None, None))
            if whole_axis:
                dropped = sum(1 for entry in index[:k] if not isinstance(entry, slice))
                return [k - dropped], self._apply(node, [self.local(source)] + indices)
            return self._whole_inputs(node, ins, "particular rows of the batch (%s)"
                                      % _index_text(index, k))
        return self._whole_inputs(node, ins)

    def _rule_IncSubtensor(self, node, ins):
        from theano.tensor.subtensor import get_idx_list
        x, y = node.inputs[:2]
        mx, my = ins[:2]
        rest = node.inputs[2:]
        if all(m is SAME or m in (SHAPE, REPL) for m in ins[2:]):
            indices = [self.replicated(v, node) for v in rest]
            if isinstance(mx, int):
                index = get_idx_list(node.inputs, node.op.idx_list)
                k = mx
                whole_axis = k >= len(index) or (isinstance(index[k], slice) and
                                                (index[k].start, index[k].stop, index[k].step)
                                                == (None, None, None))
                if whole_axis:
                    sub = k - sum(1 for entry in index[:k] if not isinstance(entry, slice))
                    if my == sub:
                        return [k], self._apply(node, [self.local(x), self.local(y)] + indices)
                    if not isinstance(my, int) and my not in PARTIAL and \
                            (y.ndim <= sub or y.broadcastable[sub]):
                        return [k], self._apply(node, [self.local(x),
                                                       self.replicated(y, node)] + indices)
            if SUM in (mx, my) and self.convert:
                parts = [self._partial_or_zero(x), self._partial_or_zero(y)]
                if None not in parts:
                    return [SUM], self._apply(node, parts + indices)
        return self._whole_inputs(node, ins)

    def _rule_AdvancedSubtensor1(self, node, ins):
        x, index = node.inputs
        mx, mi = ins
        if mi == 0 and not isinstance(mx, int) and mx not in PARTIAL:
            return [0], self._apply(node, [self.replicated(x, node), self.local(index)])
        if isinstance(mx, int) and mx > 0 and not isinstance(mi, int) and mi not in PARTIAL:
            return [mx], self._apply(node, [self.local(x), self.replicated(index, node)])
        if mx == SUM and (mi is SAME or mi in (SHAPE, REPL)):
            return [SUM], self._apply(node, [self.local(x), self.replicated(index, node)])
        return self._whole_inputs(node, ins, "rows picked by index")

    def _rule_AdvancedIncSubtensor1(self, node, ins):
        x, y, index = node.inputs
        mx, my, mi = ins
        if not node.op.set_instead_of_inc and (mx == SUM or mx is SAME and self._is_zero(x)):
            if my == 0 and mi == 0:
                # A scatter-add of each rank's rows (an embedding's gradient): partial sums.
                return [SUM], self._apply(node, [self.local(x), self.local(y), self.local(index)])
            if my == SUM and (mi is SAME or mi in (SHAPE, REPL)):
                return [SUM], self._apply(node, [self.local(x), self.local(y),
                                                 self.replicated(index, node)])
        return self._whole_inputs(node, ins, "rows updated by index")

    def _picked(self, node, ins, first):
        """``x[arange(n), y]`` and its gradient: one entry picked per row,
        at the rank's own positions."""
        arange = node.inputs[first]
        if arange not in self._positions or ins[0] != 0:
            return None
        others = ins[first + 1:]
        if len(others) != 1 or others[0] != 0 or node.inputs[0].ndim != 2:
            return None
        return [self.local(v) for v in node.inputs[:first]] + [self._positions[arange],
                                                               self.local(node.inputs[-1])]

    def _rule_AdvancedSubtensor(self, node, ins):
        picked = self._picked(node, ins, 1)
        if picked is not None:
            return [0], self._apply(node, picked)
        x = node.inputs[0]
        marks = ins[1:]
        if not isinstance(ins[0], int) and ins[0] not in PARTIAL and \
                all(m == 0 or m is SAME or m in (SHAPE, REPL) for m in marks) and 0 in marks \
                and all(v.ndim <= 1 for v in node.inputs[1:]):
            indices = [self.local(v) if m == 0 else self.replicated(v, node)
                       for m, v in zip(marks, node.inputs[1:])]
            return [0], self._apply(node, [self.replicated(x, node)] + indices)
        return self._whole_inputs(node, ins, "rows picked by index")

    def _rule_AdvancedIncSubtensor(self, node, ins):
        picked = self._picked(node, ins, 2)
        value = node.inputs[1]
        if picked is not None and (ins[1] == 0 or ins[1] in (SAME, REPL, SHAPE)
                                   and value.ndim == 0):
            # One entry per row set or added (to_one_hot, a picked cost's gradient).
            if ins[1] != 0:
                picked[1] = self.replicated(value, node)
            return [0], self._apply(node, picked)
        return self._whole_inputs(node, ins, "rows updated by index")

    # Shapes -----------------------------------------------------------------------------
    def _rule_Reshape(self, node, ins):
        from tmpi_adapters.graphs.fixedbatch import label_of
        k, shape = ins[0], ins[1]
        x = node.inputs[0]
        if k == SUM and (shape is SAME or shape == SHAPE):
            return [SUM], self._apply(node, [self.local(x), self.replicated(node.inputs[1])])
        if not isinstance(k, int):
            return self._whole_inputs(node, ins)
        out = node.outputs[0]
        label = label_of(out)
        if label is not None and label in self.reshapes:
            decided = self.reshapes[label]     # proven on a call (fixedbatch)
        else:
            decided = _reshaped_axis(self, node, k)
            if decided is None:
                self.undecided.append(node)
                decided = 0 if self.probe and self.convert else MIXED
        if not isinstance(decided, int):
            return self._whole_inputs(node, ins, "a reshape that moves rows across the ranks' "
                                                 "shares")
        rewrite = self.rewrite.get(label)
        if rewrite is not None and self.local_rows is not None:
            return [decided], self._apply(node, [self.local(x),
                                                 rewrite.shape(self.local_rows)])
        return [decided], self._apply(node, [self.local(x), self.local(node.inputs[1])])

    def _rule_Join(self, node, ins):
        from theano.tensor import get_scalar_constant_value
        if ins[0] is not SAME:
            return self._whole_inputs(node, ins)
        axes = {m for m in ins[1:] if isinstance(m, int)}
        try:
            along = int(get_scalar_constant_value(node.inputs[0]))
        except Exception:  # noqa: BLE001 - a symbolic axis
            return self._whole_inputs(node, ins)
        if along < 0:
            along += node.outputs[0].ndim
        if len(axes) == 1 and along not in axes:
            k = axes.pop()
            inputs = [self.local(node.inputs[0])] + [
                self.local(v) if m == k else self.rows_of(v, k)
                for m, v in zip(ins[1:], node.inputs[1:])]
            return [k], self._apply(node, inputs)
        if all(m == SUM or m is SAME and self._is_zero(v)
               for m, v in zip(ins[1:], node.inputs[1:])):
            return [SUM], self._apply(node, [self.local(v) for v in node.inputs])
        return self._whole_inputs(node, ins, "rows joined with other rows")

    def _rule_Alloc(self, node, ins):
        value = ins[0]
        if value == SUM and all(m is SAME or m == SHAPE for m in ins[1:]):
            sizes = [self.replicated(v) for v in node.inputs[1:]]
            return [SUM], self._apply(node, [self.local(node.inputs[0])] + sizes)
        return self._whole_inputs(node, ins)

    def _rule_IfElse(self, node, ins):
        condition = self.replicated(node.inputs[0], node)
        n = node.op.n_outs
        marks, inputs = [], [condition] + [None] * (2 * n)
        for k in range(n):
            a, b = node.inputs[1 + k], node.inputs[1 + n + k]
            ma, mb = ins[1 + k], ins[1 + n + k]
            if ma == mb and (isinstance(ma, int) or ma in PARTIAL or ma is SAME):
                marks.append(ma)
                inputs[1 + k], inputs[1 + n + k] = self.local(a), self.local(b)
            else:
                marks.append(REPL)
                inputs[1 + k], inputs[1 + n + k] = self.replicated(a, node), \
                    self.replicated(b, node)
        return marks, self._apply(node, inputs)

    # Scan ----------------------------------------------------------------------------
    def _rule_Scan(self, node, ins):
        from tmpi_adapters.graphs.scans import read_scan
        found = read_scan(self, node, ins)
        if found is None:
            return self._whole_inputs(node, ins, "a scan whose steps mix the rows")
        marks, inputs = found
        return marks, self._apply(node, inputs)

    # Batch normalisation ---------------------------------------------------------------
    def _expanded(self, node):
        """A batch normalisation op read as the graph Theano's optimizer makes
        of it on the CPU (means and variances over the batch's rows)."""
        from theano.tensor.nnet import bn
        name = type(node.op).__name__
        expand = {"AbstractBatchNormTrain": bn.local_abstract_batch_norm_train,
                  "AbstractBatchNormTrainGrad": bn.local_abstract_batch_norm_train_grad,
                  "AbstractBatchNormInference": bn.local_abstract_batch_norm_inference}[name]
        results = expand.transform(node)
        if not results:
            return self._whole_inputs(node, [self(v) for v in node.inputs])
        from theano.gof.graph import io_toposort
        for inner in io_toposort(list(node.inputs), list(results)):
            if any(v not in self.marks for v in inner.outputs):
                for variable in inner.outputs:
                    if hasattr(node.outputs[0].tag, "trace"):
                        variable.tag.trace = node.outputs[0].tag.trace
                self._visit(inner)
        return [self(v) for v in results], [self.local(v) for v in results]


def _like(form, variable):
    """``form`` with ``variable``'s broadcastable pattern and dtype."""
    import theano.tensor as T
    if form.dtype != variable.dtype:
        form = T.cast(form, variable.dtype)
    if hasattr(variable.type, "broadcastable") and \
            form.broadcastable != variable.broadcastable:
        form = T.patternbroadcast(form, variable.broadcastable)
    return form


def _constant(variable):
    from theano.gof import Constant
    if isinstance(variable, Constant):
        try:
            return int(np.asarray(variable.data))
        except (TypeError, ValueError):
            return None
    return None


def _zero(variable):
    """True for ``zeros_like(x)``, ``alloc(0, ...)``, a constant 0, through
    dimshuffles and casts."""
    from theano.gof import Constant
    from theano import scalar
    from theano.tensor.elemwise import DimShuffle, Elemwise
    for _ in range(20):
        if isinstance(variable, Constant):
            try:
                return not np.any(np.asarray(variable.data))
            except (TypeError, ValueError):
                return False
        node = variable.owner
        if node is None:
            return False
        op = node.op
        name = type(op).__name__
        if isinstance(op, Elemwise) and isinstance(op.scalar_op, scalar.Second):
            variable = node.inputs[1]
        elif isinstance(op, DimShuffle) or name in ("Alloc", "Rebroadcast") or (
                isinstance(op, Elemwise) and isinstance(op.scalar_op,
                                                         (scalar.Cast, scalar.Identity))):
            variable = node.inputs[0]
        else:
            return False
    return False


def _linear(rows, node, ins):
    """The partial kind of an elementwise node that is linear in its partial
    inputs (their sum over ranks gives the one-process value), or ``None``."""
    from theano import scalar
    op = node.op.scalar_op
    partial = [m for m in ins if m in PARTIAL]
    kinds = set(partial)
    others = [(m, v) for m, v in zip(ins, node.inputs) if m not in PARTIAL]
    if kinds == {SUM}:
        if isinstance(op, (scalar.Add, scalar.Sub)):
            if all(rows._is_zero(v) for _, v in others):
                return SUM
            return None
        if isinstance(op, (scalar.Neg, scalar.Identity)):
            return SUM
        if isinstance(op, scalar.Cast):
            return SUM if node.outputs[0].dtype.startswith("float") else None
        if isinstance(op, scalar.Mul) and len(partial) == 1:
            return SUM if all(m is SAME or m in (REPL, SHAPE) for m, _ in others) else None
        if isinstance(op, scalar.TrueDiv) and ins[0] == SUM and ins[1] not in PARTIAL:
            return SUM if ins[1] is SAME or ins[1] in (REPL, SHAPE) else None
        return None
    if len(kinds) == 1 and len(partial) == 1 and not others:
        kind = partial[0]
        if isinstance(op, (scalar.Identity, scalar.Cast)):
            return kind
        if isinstance(op, scalar.Neg):
            return MIN if kind == MAX else MAX
    return None


def _shape_entry(rows, node):
    """For ``shape(x)[j]`` (through casts): ``True`` when entry ``j`` is the
    batch's length, ``False`` when it is another axis', ``None`` unknown."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    from theano.tensor.subtensor import get_idx_list
    index = get_idx_list(node.inputs, node.op.idx_list)
    if len(index) != 1 or isinstance(index[0], slice):
        return None
    j = _constant(index[0]) if hasattr(index[0], "owner") else index[0]
    if not isinstance(j, (int, np.integer)):
        return None
    vector = node.inputs[0]
    while vector.owner is not None and isinstance(vector.owner.op, Elemwise) and \
            isinstance(vector.owner.op.scalar_op, (scalar.Cast, scalar.Identity)):
        vector = vector.owner.inputs[0]
    if vector.owner is None or type(vector.owner.op).__name__ != "Shape":
        return None
    source = vector.owner.inputs[0]
    axis = rows(source)
    if not isinstance(axis, int):
        return None
    return int(j) % max(source.ndim, 1) == axis


def _keeps_rank_rows(rows, node):
    """``draw[s:s + n]``, ``n`` the rank's rows and ``s`` read from the
    :data:`NOISE_WINDOW`, of a value computed without the batch's values: a
    random draw made for the whole batch of which each rank keeps its own
    rows, so that row ``i`` is the one-process row ``i``'s.  (A script's own
    ``pool[i:i + n]`` would give every rank the same rows: not per row.)"""
    from theano.gof.graph import inputs
    from theano.tensor.subtensor import get_idx_list
    index = get_idx_list(node.inputs, node.op.idx_list)
    if not index or not isinstance(index[0], slice) or index[0].step is not None:
        return False
    start, stop = _uncast(index[0].start), _uncast(index[0].stop)
    owner = getattr(stop, "owner", None)
    if start is None or owner is None or type(owner.op).__name__ != "Elemwise" \
            or type(owner.op.scalar_op).__name__ != "Add" or len(owner.inputs) != 2 \
            or not any(getattr(v, "name", None) == NOISE_WINDOW for v in inputs([start])):
        return False
    first, second = owner.inputs
    length = second if first is start else (first if second is start else None)
    if length is None:
        return False
    return rows.layout.is_batch_size(rows.layout.resolve(length)) or _counts_rows(rows, length)


def _counts_rows(rows, length):
    """True for ``v.shape[k]`` (through casts) of a value ``v`` whose rows are on axis ``k``."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    for _ in range(10):
        length = _uncast(length)
        node = getattr(length, "owner", None)
        if node is None:
            return False
        name = type(node.op).__name__
        if name == "Shape_i":
            return rows(node.inputs[0]) == node.op.i
        if name == "Subtensor":
            return _shape_entry(rows, node) is True
        if isinstance(node.op, Elemwise) and isinstance(node.op.scalar_op,
                                                        (scalar.Cast, scalar.Identity)):
            length = node.inputs[0]
            continue
        return False
    return False


def _uncast(variable):
    """``variable`` without the scalar/tensor conversions Theano puts around indices."""
    while getattr(variable, "owner", None) is not None and type(variable.owner.op).__name__ in (
            "ScalarFromTensor", "TensorFromScalar"):
        variable = variable.owner.inputs[0]
    return variable


def _is_random(node):
    name = type(node.op).__name__.lower()
    return "rand" in name or "mrg" in name


def _reshaped_axis(rows, node, k):
    """The axis of a reshape's output that holds its input's rows (axis
    ``k``), where the sizes show it; :data:`MIXED` where they show that no
    axis does; ``None`` where they do not tell."""
    layout = rows.layout
    source = node.inputs[0]
    before = layout.sizes.get(source, ())
    after = layout.resolve_vector(node.inputs[1])
    if after is None or k >= len(before):
        return None
    head = before[:k]
    # The rows (axis k, proven) land on an axis as long as the batch, with the
    # same axes before them: each rank's rows are the same block of the
    # flattened value on both sides.
    for j, size in enumerate(after):
        if isinstance(size, tuple) and layout.is_batch_size(size):
            if list(after[:j]) == list(head) and all(s is not None and s != -1 for s in head):
                return j
    # (-1, *tail): the rows (and the axes after them up to the tail) merged in axis 0.
    if k == 0 and after and after[0] == -1 and len(after) >= 1:
        tail = list(after[1:])
        if not tail or (len(tail) <= len(before) - 1 and list(before[len(before) - len(tail):])
                        == tail and all(s is not None for s in tail)):
            return 0
    return None


def _made_at(node):
    from tmpi_adapters.graphs.fixedbatch import made_at
    if node is None:
        return ""
    for variable in node.outputs:
        at = made_at(variable)
        if at:
            return at
    return ""


_KIND_WORDS = {"sum": "a sum over the batch's rows", "max": "a maximum over the batch's rows",
               "min": "a minimum over the batch's rows", "gather": "the batch's rows gathered",
               "same": "a whole value"}


def _what(kind, node, what, variable):
    """The words for a coupling: what is made whole and, where known, why."""
    text = _KIND_WORDS[kind]
    return text + " for %s" % what if what else text


def _index_text(index, k):
    entry = index[k]
    if isinstance(entry, slice):
        return "a slice of the rows"
    return "one row"
