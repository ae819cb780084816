"""A training step made exact wherever its rows meet: collectives inside the graph.

The row analysis (:mod:`tmpi_adapters.graphs.rows`, converting reading)
gives a training function's graph as each rank computes it, with a
*request* (a ``Pending`` node) wherever a value must be made whole across
ranks: a partial sum (a gradient, a loss, a batch mean) or rows (a row picked
by index, a Gram matrix).  :class:`CoupledStep` turns them into collectives:

* requests that no other request depends on (the gradients, the losses the
  step returns, a value only the updates read) travel in the step's one
  exchange (:class:`~tmpi_adapters.core.ops.FusedAllreduce`, or its parts
  under ``--overlap``): a step whose rows meet nowhere else keeps one
  collective;
* the others (a batch statistic the next layer reads) are grouped by level,
  the requests of a level independent of each other, each level one
  :class:`~tmpi_adapters.core.ops.Couple`; a level's node depends on the one
  before, and the exchange on the last, so every rank runs them in one order;
* extrema and rows among the first kind are made whole by one ``Couple``
  after the exchange.

Where heavy work of the step needs none of a level's values (a layer's
weight gradient beside the next BatchNorm's sums), the level's gather runs
while the rank computes it (:class:`_Fillers`, :meth:`CoupledStep._overlapped`):
the ranks arrive at a collective at different moments, and the time one
waits for the other goes to work.

What the step returns is then the one-process value on every rank (sums and
whole values), or per-row values and extrema that the
:class:`~tmpi_adapters.core.combine.Combiner` combines after the call.
"""
import sys

from tmpi_adapters.errors import ConfigError
from tmpi_adapters.graphs.marks import DRAW, MAX, MIN, MIXED, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.pending import is_pending


class CoupledStep:
    """The converted graph of one training function, its collectives built.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    key : str
        The training function's name.
    rows : tmpi_adapters.graphs.rows.Rows
        The converting reading of its graph (its gradients' markers known).
    markers : list of Apply
        The gradient markers, in exchange order (``rows.gradients``' keys).
    outputs : list of Variable
        The function's outputs (original graph).
    update_pairs : list of (SharedVariable, Variable)
        Its updates (original graph).

    Attributes
    ----------
    outputs, updates : list of Variable
        The converted outputs and update expressions, ready to compile.
    kinds, axes : list
        Per output, what the :class:`~tmpi_adapters.core.combine.Combiner`
        still does (``None``: nothing, the value is whole) and along which axis.
    levels : list of list of str
        Per collective besides the exchange, the couplings it makes whole.
    """

    def __init__(self, session, key, rows, markers, outputs, update_pairs):
        if rows.refusal is not None:
            raise refusal_error(key, rows.refusal, session.size)
        self.session, self.key, self.rows = session, key, rows
        self.kinds, self.axes = [], []
        roots = [self._output(o) for o in outputs]
        n_outputs = len(roots)
        roots += [self._update(expr) for _, expr in update_pairs]
        #: the original variable of each root (outputs, then update expressions)
        self._sources = list(outputs) + [expr for _, expr in update_pairs]
        if rows.refusal is not None:
            raise refusal_error(key, rows.refusal, session.size)
        self.levels = []
        #: levels whose gather runs while the step computes (:meth:`_overlapped`)
        self.overlapped = 0
        self.exchanged = 0
        built = self._build(roots, markers)
        self.outputs, self.updates = built[:n_outputs], built[n_outputs:]

    # -- what leaves the step -------------------------------------------------------
    def _output(self, output):
        rows = self.rows
        mark = rows(output)
        options = self.session.options
        if isinstance(mark, Shard) and not mark.inner:
            self.kinds.append("rows")
            self.axes.append(mark.axis)
            return rows.local(output)
        self.axes.append(0)
        if mark == SUM and options.outputs == "local":
            # Each rank's own value: its part scaled up to the whole batch's size.
            self.kinds.append(None)
            total, rows_here = rows.window[2], rows.window[3]
            local = rows.local(output)
            scale = rows.T.cast(total, local.dtype) / rows.T.cast(rows_here, local.dtype)
            return rows.T.cast(local * scale, local.dtype)
        if mark in (MAX, MIN):
            self.kinds.append(None if options.outputs == "local" else mark.op)
            return rows.local(output)
        self.kinds.append(None)
        if mark == SHAPE:
            return rows.global_value(output)
        if mark == SUM or isinstance(mark, Shard):
            # (Rows in windows of an axis are returned whole, gathered in the step.)
            return rows.replicated(output)
        return rows.local(output)

    def _update(self, expr):
        rows = self.rows
        mark = rows(expr)
        if mark is SAME or mark in (REPL, DRAW):
            return rows.local(expr)
        if mark == SHAPE:
            return rows.global_value(expr)
        if mark == MIXED:
            raise ConfigError(
                "%s: tmpi could not read how an update of the step is computed from the "
                "batch's rows (%s), so it cannot give every rank the one-process update. Run "
                "with --scaling weak so that each rank takes whole batches." % (
                    self.key, expr))
        return rows.replicated(expr)

    # -- collectives ------------------------------------------------------------------
    def _build(self, roots, markers):
        from theano.gof.graph import inputs, io_toposort
        requests = {r.output: r for r in self.rows.requests}
        nodes = io_toposort(list(inputs(roots)), roots)
        pendings = [node.outputs[0] for node in nodes if is_pending(node.outputs[0])]
        bit = {p: 1 << k for k, p in enumerate(pendings)}
        upstream, level, depends = {}, {}, {}
        for node in nodes:
            above = 0
            for v in node.inputs:
                above |= upstream.get(v, 0)
            if node.outputs[0] in bit:
                p = node.outputs[0]
                depends[p] = above
                level[p] = 1 + max([level[q] for q in pendings if above & bit[q]] or [-1])
                above |= bit[p]
            for v in node.outputs:
                upstream[v] = above
        needed = 0
        for p in pendings:
            needed |= depends[p]
        final = [p for p in pendings if not needed & bit[p]]
        inner = [p for p in pendings if needed & bit[p]]
        memo = {}
        local = self.session.options.batch_stats == "local"
        estimated = []
        fillers = _Fillers(nodes, inner, level, bit, upstream) if _host_graphs() else None
        for depth in sorted({level[p] for p in inner}):
            group = [p for p in inner if level[p] == depth]
            if local:
                mine = [p for p in group if requests[p].kind in ("sum", "max", "min", "stack")]
                self._estimate(mine, requests, memo)
                estimated += mine
                group = [p for p in group if p not in mine]
            if group:
                filler = fillers.choose(depth) if fillers is not None else None
                self._couple(group, requests, memo, depth, filler=filler)
        averaged = self._averaged(estimated, requests, bit, upstream, roots, final) \
            if local else []
        self._exchange(final, requests, markers, memo, averaged)
        return [memo.get(("mean", k), v) for k, v in enumerate(_rebuild(roots, memo))]

    def _estimate(self, group, requests, memo):
        """``--batch-stats local``: sums and extrema the step reads again stay
        each rank's own (its part scaled up to the whole batch's size, as DDP
        without synchronised BatchNorm computes them)."""
        T = self.rows.T
        window = self.rows.window
        for p in group:
            value = _rebuild([p.owner.inputs[0]], memo)[0]
            if requests[p].kind in ("sum", "stack"):
                # (A rank's moments, scaled alike, stand for a batch of rows like its own.)
                scale = T.cast(window[2], value.dtype) / T.cast(window[3], value.dtype)
                value = T.cast(value * scale, value.dtype)
            if requests[p].kind == "stack":
                value = T.shape_padleft(value)
            memo[p] = value

    def _averaged(self, estimated, requests, bit, upstream, roots, final):
        """``(position, root)`` of the whole values the step returns or updates
        from rank-local statistics (the loss, BatchNorm's running averages):
        averaged over the ranks in the step's exchange.  Says once which
        statistics stay local."""
        if not estimated:
            return []
        self.session.print(
            "tmpi: warning: --batch-stats local: %s keeps %d batch statistic%s per rank (%s), "
            "so its results differ from one process's." % (
                self.key, len(estimated), "" if len(estimated) == 1 else "s",
                "; ".join(_describe(self.rows, requests[p]) for p in estimated[:3]) +
                ("; ..." if len(estimated) > 3 else "")), file=sys.stderr)
        mask = exchanged = 0
        for p in estimated:
            mask |= bit[p]
        for p in final:
            exchanged |= bit[p]
        rows = self.rows
        # (Values computed from the step's exchange, a parameter's update, are
        # the same on every rank already.)
        return [(k, root) for k, root in enumerate(roots)
                if upstream.get(root, 0) & mask and not upstream.get(root, 0) & exchanged
                and rows(self._sources[k]) not in (SUM, MAX, MIN)
                and not isinstance(rows(self._sources[k]), Shard)]

    def _couple(self, group, requests, memo, depth, after=(), filler=None):
        """One :class:`~tmpi_adapters.core.ops.Couple` for ``group``; split in
        a start and a finish around ``filler`` (a node of the step that does
        not need the group, from :class:`_Fillers`) where there is one."""
        from tmpi_adapters.core.ops import Couple
        values = _rebuild([p.owner.inputs[0] for p in group], memo)
        kinds = ["sum" if requests[p].kind == "same" else requests[p].kind for p in group]
        axes = [requests[p].axis or 0 for p in group]
        described = [_describe(self.rows, requests[p]) for p in group]
        if filler is not None and not any(v in memo for v in filler.outputs):
            results = self._overlapped(values, kinds, axes, described, memo, depth, filler)
        else:
            op = Couple(self.key, kinds, axes, depth, after=len(after),
                        couple=self.session.couplings.couple, described=described)
            results = op(*(values + list(after)))
        results = results if isinstance(results, (list, tuple)) else [results]
        for p, result in zip(group, results):
            memo[p] = result
        self.levels.append(described)
        return results

    def _exchange(self, final, requests, markers, memo, averaged=()):
        """The step's exchange: gradients (in marker order), then the other
        sums, then the values averaged over ranks (``averaged``: ``(position,
        root)`` under ``--batch-stats local``); extrema and rows made whole
        after it."""
        from tmpi_adapters.core.ops import FusedAllreduce
        from tmpi_adapters.core.step import StepExchange
        session = self.session
        gradients = sorted((p for p in final if requests[p].gradient is not None),
                           key=lambda p: requests[p].gradient)
        riders = [p for p in final if requests[p].gradient is None
                  and requests[p].kind in ("sum", "same")]
        others = [p for p in final if requests[p].gradient is None
                  and requests[p].kind not in ("sum", "same")]
        members = gradients + riders
        results = []
        if members or averaged:
            arrays = _rebuild([p.owner.inputs[0] for p in members] +
                              [root for _, root in averaged], memo)
            ops = ["mean" if requests[p].kind == "same" else "sum" for p in members] + \
                ["mean"] * len(averaged)
            used = [markers[requests[p].gradient] for p in gradients]
            if session.overlapping and used:
                results = StepExchange.parts(session, self.key, used, arrays, ops)
            else:
                fused = FusedAllreduce(self.key, ops, gradients=len(used),
                                       exchange=session.exchange_gradients,
                                       borrowed=session.size > 1)(*arrays)
                results = list(fused) if isinstance(fused, (list, tuple)) else [fused]
            for p, result in zip(members, results):
                memo[p] = result
            for (k, _), result in zip(averaged, results[len(members):]):
                memo[("mean", k)] = result
            self.exchanged = len(members) + len(averaged)
        if others:
            self._couple(others, requests, memo, "after the exchange", after=results[:1])

    def _overlapped(self, values, kinds, axes, described, memo, depth, filler):
        """The level's values made whole by a
        :class:`~tmpi_adapters.core.ops.StartCouple` before ``filler`` runs
        (one of its inputs :class:`~tmpi_adapters.core.ops.Gated` by the
        start's token) and a :class:`~tmpi_adapters.core.ops.FinishCouple`
        after it: the rank computes ``filler`` while the others arrive."""
        from tmpi_adapters.core.ops import FinishCouple, Gated, StartCouple
        from tmpi_adapters.graphs.pending import stacked_type
        session = self.session
        self.overlapped += 1
        token = StartCouple(self.key, kinds, axes, depth, start=session.couplings.start,
                            described=described)(*values)
        inputs = _rebuild(filler.inputs, memo)
        gate = _gate_position(filler)
        inputs[gate] = Gated()(inputs[gate], token)
        gated = filler.clone_with_new_inputs(inputs, strict=False)
        for old, fresh in zip(filler.outputs, gated.outputs):
            fresh.name = old.name
            memo[old] = fresh
        types = [stacked_type(v.type).type if kind == "stack" else v.type
                 for v, kind in zip(values, kinds)]
        return FinishCouple(self.key, depth, types,
                            finish=session.couplings.finish)(token, gated.outputs[0])

    @property
    def collectives(self):
        """Collectives per step: the exchange and the levels of couplings."""
        return 1 + len(self.levels)


def _host_graphs():
    """True where Theano computes on the host: there a coupling may be split
    around work of the step (on a device, a host op between that work and
    its inputs would keep Theano's GPU backend from moving it there)."""
    from tmpi_adapters.process import devices
    gpuarray = sys.modules.get("theano.gpuarray")
    return devices.describe() == "cpu" and not getattr(gpuarray, "pygpu_activated", False)


#: Ops worth computing while a coupling's gather is under way, by the
#: words in their class names, the heaviest first.
_HEAVY = (("Conv", "Corr"), ("Scan",), ("Dot", "Gemm", "Gemv", "Ger"))


def _heaviness(op):
    """How heavy ``op`` is by :data:`_HEAVY` (0: not worth gating)."""
    name = type(op).__name__
    for rank, words in enumerate(_HEAVY):
        if any(word in name for word in words):
            return len(_HEAVY) - rank
    return 0


def _gate_position(node):
    """The input of ``node`` that a gate holds back: its first computed array."""
    from theano.gof import Constant
    for k, v in enumerate(node.inputs):
        if not isinstance(v, Constant) and getattr(v.type, "ndim", 0) and \
                hasattr(v.type, "dtype"):
            return k
    return None


class _Fillers:
    """Per level of couplings, work of the step the rank can do while the
    level's gather is under way: a heavy node (a convolution, a scan, a
    product) that needs none of the level's values nor any later request,
    and that no value of the level or a level before needs.  In
    backpropagation that is a layer's weight gradient beside the next
    BatchNorm's sums.  A node chosen for a level, and what it needs, is
    not chosen again: the levels' starts and finishes stay in one order.

    ``nodes``, ``inner``, ``level``, ``bit``, ``upstream``: what
    :meth:`CoupledStep._build` computed of the converted graph.
    """

    def __init__(self, nodes, inner, level, bit, upstream):
        self.inner, self.level, self.bit, self.upstream = inner, level, bit, upstream
        self.candidates = [n for n in nodes if _heaviness(n.op) and _gate_position(n) is not None
                           and not getattr(n.op, "destroy_map", None)
                           and hasattr(n.outputs[0].type, "dtype")]
        self.needed = set()   # nodes a level so far needs (ancestors of its values)
        self.taken = set()    # chosen fillers and what they need

    @staticmethod
    def _ancestors(variables, into):
        stack = [v.owner for v in variables if v.owner is not None]
        while stack:
            node = stack.pop()
            if node in into:
                continue
            into.add(node)
            stack.extend(v.owner for v in node.inputs if v.owner is not None)

    def choose(self, depth):
        """The filler of level ``depth`` (levels asked in increasing order), or ``None``."""
        if not self.candidates:
            return None
        self._ancestors([p.owner.inputs[0] for p in self.inner if self.level[p] == depth],
                        self.needed)
        earlier = 0
        for p in self.inner:
            if self.level[p] < depth:
                earlier |= self.bit[p]
        found = [n for n in self.candidates if n not in self.needed and n not in self.taken
                 and not self.upstream.get(n.outputs[0], 0) & ~earlier]
        if not found:
            return None
        best = max(found, key=lambda n: _heaviness(n.op))
        self._ancestors(best.outputs, self.taken)
        return best


def _describe(rows, request):
    if request.coupling is not None:
        return request.coupling.describe()
    return "%s of %s" % (request.kind, request.source)


def _rebuild(variables, memo):
    """``variables`` with ``memo``'s replacements made in their graphs."""
    from theano.gof.graph import inputs, io_toposort
    variables = list(variables)
    for node in io_toposort(list(inputs(variables)), variables):
        if all(v in memo for v in node.outputs):
            continue
        new_inputs = [memo.get(v, v) for v in node.inputs]
        if all(a is b for a, b in zip(new_inputs, node.inputs)):
            continue
        new = node.clone_with_new_inputs(new_inputs, strict=False)
        for old, fresh in zip(node.outputs, new.outputs):
            fresh.name = old.name
            memo.setdefault(old, fresh)
    return [memo.get(v, v) for v in variables]


def refusal_error(key, refusal, size=2):
    """The error for a step whose rows meet where tmpi cannot make them exact."""
    from tmpi_adapters.graphs.pending import made_at
    node = refusal.node
    where = made_at(node) if node is not None else ""
    what = type(node.op).__name__ if node is not None else "an expression"
    return ConfigError(
        "%s: the rows of its batch meet in %s%s, where %s, so %d ranks cannot compute what "
        "one process computes from the whole batch. Run with --scaling weak so that each "
        "rank takes whole batches." % (
            key, what, " made at %s" % where if where else "", refusal.why, size))
