"""Rules for the step's gradients, random draws, branches, scans and batch normalisation.

These ops build more than their own node: the exchange of a gradient's
partial terms, a draw made again for the whole batch, a scan's inputs in
the forms its steps read, the graph Theano makes of a batch normalisation.
"""
from tmpi_adapters.graphs.catalogue import BATCH_NORMS, IDENTITIES, name_of
from tmpi_adapters.graphs.marks import NOISE_WINDOW, PARTIAL, REPL, SAME, SHAPE, SUM, Shard
from tmpi_adapters.graphs.patterns import like
from tmpi_adapters.graphs.pending import Request, pending_op
from tmpi_adapters.graphs.registry import KEEP, Signature, rule, whole

#: Random ops: Theano's and the MRG generator's (its GPU draws derive from it).
RANDOM = ("RandomFunction", "mrg_uniform_base")


@rule("GradientMarker")
def gradient_marker(rows, node, ins):
    """A gradient of the step: exchanged (its partial terms summed over
    ranks in the step's one exchange)."""
    position = rows.gradients.get(node)
    if position is None or not rows.convert:
        return [ins[0]], [rows.local(node.inputs[0])]
    return [REPL], [exchanged(rows, node.inputs[0], position, node)]


def exchanged(rows, gradient, position, node=None):
    """The one-process ``gradient`` of the step's ``position``-th gradient:
    its terms that are partial sums travel in the step's exchange (one
    request, ``"sum"``), the terms every rank has whole (a weight penalty's)
    are added after it.  A gradient with no partial term travels whole
    (``"same"``), so that the exchange sees every gradient."""
    from theano import scalar
    from theano.tensor.elemwise import Elemwise
    T = rows.T
    wrappers = []
    top = gradient
    while top.owner is not None and name_of(top.owner.op) in IDENTITIES:
        wrappers.append(top.owner)
        top = top.owner.inputs[0]
    terms, stack = [], [top]
    while stack:
        term = stack.pop()
        owner = term.owner
        if owner is not None and isinstance(owner.op, Elemwise) and \
                isinstance(owner.op.scalar_op, scalar.Add) and rows(term) != SUM:
            stack.extend(reversed(owner.inputs))
        else:
            terms.append(term)
    partial = [t for t in terms if rows(t) == SUM]
    whole_terms = [t for t in terms if rows(t) != SUM]
    if rows(top) == SUM:
        partial, whole_terms = [top], []
    part, kind, added = None, "sum", []
    if partial:
        part = rows.local(partial[0]) if len(partial) == 1 else \
            T.add(*[rows.local(t) for t in partial])
        added = [rows.replicated(t, node) for t in whole_terms]
        if part.type != top.type or (added and (part + T.add(*added)).type != top.type):
            part = None
    if part is None:
        part, added, kind = like(rows.replicated(top, node), top), [], "same"

    def wrapped(value):
        # Back inside the wrappers (a device gradient stays a device array).
        for wrapper in reversed(wrappers):
            value = rows.apply(wrapper, [value] + [rows.local(v)
                                                   for v in wrapper.inputs[1:]])[0]
        return value
    op = pending_op()(kind)
    output = op(wrapped(part))
    rows.requests.append(Request(kind, None, top, output, gradient=position))
    if not added:
        return output
    total = added[0] if len(added) == 1 else T.add(*added)
    return gradient.type.filter_variable(like(output + wrapped(like(total, top)), top))


@rule(*RANDOM, sizes=False)
def draw(rows, node, ins):
    """A random op.  Drawn for the whole batch on every rank, as tmpi draws
    (its size reads the :data:`NOISE_WINDOW`): the one-process draw, whole;
    drawn from the batch's values or shaped like a rank's rows some other
    way: drawn again from the whole batch's sizes and values (converting), or
    :data:`~..marks.DRAW` (strict: not split)."""
    from theano.gof.graph import inputs as graph_inputs
    from tmpi_adapters.graphs.marks import DRAW
    window = any(getattr(v, "name", None) == NOISE_WINDOW
                 for v in graph_inputs(list(node.inputs)))
    local = rows.apply(node, [rows.local(v) for v in node.inputs])
    if window and not any(isinstance(m, Shard) and v not in rows.sized or m in PARTIAL
                          for m, v in zip(ins, node.inputs)):
        return [REPL] * len(node.outputs), local
    if not rows.convert:
        return [DRAW] * len(node.outputs), local
    # Any other draw shaped by the batch (a permutation of its rows, a draw from
    # its values): every rank draws the whole batch's numbers from the same
    # generator state, which then advances as in one process (the generator's
    # update is converted with the step).
    return Signature([SHAPE if m == SHAPE else REPL for m in ins], [REPL] * len(node.outputs))


@rule("IfElse")
def if_else(rows, node, ins):
    """Both branches alike (rows on one axis, partial, unbatched) keep their
    mark; otherwise both are made whole.  The condition is made whole."""
    n = node.op.n_outs
    placements, marks = [REPL] + [None] * (2 * n), []
    for k in range(n):
        ma, mb = ins[1 + k], ins[1 + n + k]
        if ma == mb and (isinstance(ma, Shard) or ma in PARTIAL or ma is SAME):
            marks.append(ma)
            placements[1 + k] = placements[1 + n + k] = KEEP
        else:
            marks.append(REPL)
            placements[1 + k] = placements[1 + n + k] = REPL
    return Signature(placements, marks)


@rule("Scan")
def scan(rows, node, ins):
    """A scan whose steps keep the rows apart (:mod:`..scans`); else run whole."""
    from tmpi_adapters.graphs.scans import read_scan
    found = read_scan(rows, node, ins)
    if found is None:
        return whole(node, "a scan whose steps mix the rows")
    marks, inputs = found
    return marks, rows.apply(node, inputs)


@rule(*sorted(BATCH_NORMS), sizes=False)
def batch_norm(rows, node, ins):
    """A batch normalisation op read as the graph Theano's optimizer makes
    of it on the CPU (means and variances over the batch's rows)."""
    from theano.gof.graph import io_toposort
    from theano.tensor.nnet import bn
    expand = {"AbstractBatchNormTrain": bn.local_abstract_batch_norm_train,
              "AbstractBatchNormTrainGrad": bn.local_abstract_batch_norm_train_grad,
              "AbstractBatchNormInference": bn.local_abstract_batch_norm_inference}[
        name_of(node.op)]
    results = expand.transform(node)
    if not results:
        return whole(node)
    for inner in io_toposort(list(node.inputs), list(results)):
        if any(v not in rows.marks for v in inner.outputs):
            for variable in inner.outputs:
                if hasattr(node.outputs[0].tag, "trace"):
                    variable.tag.trace = node.outputs[0].tag.trace
            rows.visit(inner)
    return [rows(v) for v in results], [rows.local(v) for v in results]
