"""The rules of the row analysis, op by op (:class:`RowRules`, a part of :class:`~.rows.Rows`).

Each rule says, for one node, what its outputs are from its inputs' marks
(:mod:`.rowmarks`) and, in the converting reading, which form of each input
it takes (its rows, its whole value) and what node it makes of them.
Theano is imported when a rule runs.
"""
from tmpi_adapters.graphs.rowmarks import (
    BATCH_NORMS, CONV_GRAD_WEIGHTS, CONVS, DRAW, IDENTITIES, MAX, MIN, MIXED, PARTIAL, REPL,
    ROW_OPS, SAME, SHAPE, SUM, Refusal, Request, _index_text, _is_random, _keeps_rank_rows,
    _like, _linear, _reshaped_axis, _shape_entry, _Strict, _zero, name_of, pending_op)


class RowRules:
    """The per-op rules of :class:`~tmpi_adapters.graphs.rows.Rows` (a mixin:
    they use its marks, forms and conversions)."""

    def _rule(self, node, ins, sized=True):
        from theano.compile.ops import ViewOp
        from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise
        op = node.op
        name = name_of(op)
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
        if name in IDENTITIES or isinstance(op, ViewOp):
            # (A ViewOp is an identity by Theano's contract: its subclasses too,
            # a gradient reversal's or a user's marker.)
            # A shape declared for the whole batch, or a check of local sizes: not a
            # rank's share's; the value passes through.
            if name == "SpecifyShape" and isinstance(ins[0], int) or name == "Assert":
                return [ins[0]], [self.local(node.inputs[0])]
            return [ins[0]], self._apply(node, [self.local(node.inputs[0])] +
                                         [self.local(v) for v in node.inputs[1:]])
        if isinstance(op, Elemwise):
            return self._elemwise(node, ins)
        if isinstance(op, DimShuffle):
            return self._dimshuffle(node, ins)
        if isinstance(op, CAReduce):
            return self._careduce(node, ins)
        for kind in type(op).__mro__:   # a subclass meets its base's rule
            rule = getattr(self, "_rule_" + kind.__name__, None)
            if rule is not None:
                return rule(node, ins)
        if name in ROW_OPS:
            return self._row_op(node, ins)
        if name in CONV_GRAD_WEIGHTS:
            return self._conv_weights(node, ins)
        # No rule: exact, the op run on the whole batch, and named.
        return self._whole_inputs(node, ins, "%s, an op tmpi has no rule for" % op)

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
        if isinstance(shape, int) and (value is SAME or value == SHAPE) and \
                (b.ndim < a.ndim or b.broadcastable[shape]):
            # Ones (zeros, a size) shaped like the rows: read from sizes only, so its
            # whole value is rebuilt from the global sizes (sum(ones_like(x)) counts rows).
            self._sized.add(node.outputs[0])
            return [shape], self._apply(node, [self.local(a), self.replicated(b, node)])
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
        name = name_of(node.op)
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
        name = name_of(node.op)
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
        target = self.local(node.inputs[1])
        if shape is SAME and self.convert:
            # A shape every rank holds alike, its row axis the whole batch's (read
            # from a value made whole, or a constant): that axis's length scaled to
            # the rank's share (a length -1 is left to the reshape).
            lo, hi, total, _ = self._window()
            length = target[decided]
            share = self.T.switch(self.T.lt(length, 0), length,
                                  length * self.T.cast(hi - lo, length.dtype) //
                                  self.T.cast(total, length.dtype))
            target = self.T.set_subtensor(target[decided], share)
        return [decided], self._apply(node, [self.local(x), target])

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
        name = name_of(node.op)
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


