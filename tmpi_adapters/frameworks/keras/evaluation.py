"""Whether a Keras test function can be split across ranks: read by the row analysis.

:class:`~tmpi_adapters.frameworks.keras.step.KerasEvaluation` runs each rank's
rows of a batch and combines what they return: the loss averaged weighted by
rows, the metric accumulators' increments added.  That is the one-process
evaluation exactly when every value the function computes is the rank's rows
up to the last reductions, where it becomes

* a ratio of partial sums (Keras' weighted mean: a sum over the rows divided
  by the count of nonzero weights), or
* an accumulator plus a partial sum (a stateful metric's total and count),

and what follows those is linear in them (a weighted sum of losses, a
regulariser added).  :func:`rows_meet` reads the function's graph with the
strict row analysis (:class:`~tmpi_adapters.graphs.rows.Rows`, as split
evaluations are read) and names where anything else happens: a layer that
centres the batch, a correlation over it, a loss of the batch as a whole.
Such an evaluation runs whole on every rank.
"""


def rows_meet(model, keras_function, compiled):
    """Where the rows of a batch meet in a Keras test function (its loss,
    metrics and their updates), in words; ``""`` where a split evaluation
    gives the one-process values (see the module doc)."""
    from tmpi_adapters.graphs.layout import Layout
    from tmpi_adapters.graphs.marks import MIXED
    from tmpi_adapters.graphs.rows import Rows
    inputs = [i.variable for i in getattr(getattr(compiled, "maker", None), "inputs", ())
              if not getattr(i, "implicit", False)]    # not the shared variables
    if not inputs:
        return ""
    metrics = model._get_training_eval_metrics() if \
        hasattr(model, "_get_training_eval_metrics") else []
    updates = [new for m in metrics for _, new in getattr(m, "updates", ())]
    graph = list(keras_function.outputs) + updates
    rows = Rows(Layout(inputs, graph, costs=[o for o in graph if o.ndim == 0],
                       outputs=list(keras_function.outputs)))
    meeting = {v for v in graph if rows(v) is MIXED and _meets(rows, v)}
    names = list(getattr(model, "metrics_names", None) or [])
    found = []
    for k, variable in enumerate(graph):
        if variable in meeting:
            text = "a metric's running totals" if k >= len(keras_function.outputs) else \
                "its %s" % names[k] if k < len(names) else "its output %d" % k
            if text not in found:
                found.append(text)
    return ", ".join(found)


def _meets(rows, variable):
    """True when a :data:`MIXED` ``variable`` is not a linear combination of
    ratios of partial sums and accumulators plus partial sums."""
    from tmpi_adapters.graphs.marks import MIXED, PARTIAL, SAME, SHAPE
    from theano import scalar
    from theano.tensor.elemwise import CAReduce, DimShuffle, Elemwise
    whole = (SAME, SHAPE)
    seen, stack = set(), [variable]
    while stack:
        value = stack.pop()
        if value in seen:
            continue
        seen.add(value)
        node = value.owner
        if node is None or value.ndim != 0:
            return True
        marks = [rows(v) for v in node.inputs]
        op = node.op
        if isinstance(op, DimShuffle):
            stack.append(node.inputs[0])
            continue
        if isinstance(op, CAReduce) and node.inputs[0].ndim == 0 and \
                isinstance(op.scalar_op, scalar.Add):
            stack.append(node.inputs[0])   # a sum of one value
            continue
        if not isinstance(op, Elemwise):
            return True
        kind = op.scalar_op
        if isinstance(kind, scalar.TrueDiv) and all(m in PARTIAL for m in marks):
            continue    # a ratio of partial sums: a weighted mean
        if isinstance(kind, scalar.Add) and all(m in PARTIAL or m in whole for m in marks) \
                and any(m in whole for m in marks):
            continue    # an accumulator plus a partial sum
        linear = isinstance(kind, (scalar.Add, scalar.Sub, scalar.Neg, scalar.Cast,
                                   scalar.Identity)) or (
            isinstance(kind, (scalar.Mul, scalar.TrueDiv)) and
            sum(m is MIXED for m in marks) == 1 and
            all(m is MIXED or m in whole for m in marks) and
            (not isinstance(kind, scalar.TrueDiv) or marks[0] is MIXED))
        if not linear or not all(m is MIXED or m in whole for m in marks):
            return True
        stack.extend(v for v, m in zip(node.inputs, marks) if m is MIXED)
    return False
