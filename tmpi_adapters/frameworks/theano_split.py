"""How the plain-Theano adapter compiles a function whose batch is split.

:func:`analyse_function` reads a function's graph once on more than one rank
(where its batch is, the batch axis of each input, which values are per row:
:mod:`tmpi_adapters.core.split`); :func:`split_compiler` compiles it for a
rank's share of each batch (shared batches and ``givens`` sliced, a batch
size the graph writes in made each rank's own:
:mod:`tmpi_adapters.graphs.fixedbatch`); :func:`split_evaluation` turns a
function that does not train into a
:class:`~tmpi_adapters.core.function.SplitFunction` where the graph says how
every value it returns combines.  Theano is imported when these run.
"""
from tmpi_adapters.graphs.fixedbatch import FixedBatch, reshape_inputs
from tmpi_adapters.core.function import SplitFunction
from tmpi_adapters.graphs import ancestors
from tmpi_adapters.graphs.layout import Layout, describe
from tmpi_adapters.core.combine import Combiner
from tmpi_adapters.graphs.outputs import KINDS, classify, ratio_of
from tmpi_adapters.graphs.marks import Shard
from tmpi_adapters.graphs.rows import Rows
from tmpi_adapters.core.split import analyse
from tmpi_adapters.errors import ConfigError, TmpiError


def pairs(givens):
    """``givens`` (a dict or pairs) as a list of pairs."""
    return list(givens.items()) if hasattr(givens, "items") else list(givens or [])


def row_axes(rows, outputs):
    """The batch axis of each output: the axis it is row-wise along, else the
    one axis whose length the graph tells is the batch's, else 0."""
    if rows is None:
        return None
    axes = []
    for output in outputs:
        mark, sized = rows(output), rows.batch_axes(output)
        axes.append(mark.axis if isinstance(mark, Shard) else
                    (sized[0] if len(sized) == 1 else 0))
    return axes


def analyse_function(adapter, inputs, given_pairs, graph, costs, update_pairs,
                     slice_givens=True):
    """The :class:`~tmpi_adapters.core.split.SplitPlan` and row-wise marks of a
    function compiled on more than one rank (``graph``: its outputs, then its
    update expressions)."""
    batch_shared = list(adapter.batch_variables(
        inputs=inputs, outputs=graph[:len(graph) - len(update_pairs)],
        updates=update_pairs) or [])
    plan, rows = analyse(inputs, given_pairs, batch_shared, graph, costs,
                         slice_givens=slice_givens,
                         outputs=graph[:len(graph) - len(update_pairs)])
    if plan.layout.whole:
        # Said, not silent: were a tie to the batch missed, nothing would be split there.
        one = len(plan.layout.whole) == 1
        adapter.session.print(
            "tmpi: note: %s carr%s no batch (the graph never meets %s rows with the loss's "
            "rows): every rank takes all of %s." % (
                " and ".join(describe(v) for v in plan.layout.whole),
                "ies" if one else "y", "its" if one else "their", "it" if one else "them"))
    return plan, rows


def coupled_compiler(adapter, call, plan, markers):
    """``(compiled, first_split, steps)`` for a training function converted by
    the row analysis (:class:`~tmpi_adapters.core.coupling.CoupledStep`): the
    function converted and compiled (its step appended to ``steps``);
    ``first_split(sizes, cut)`` decides, on the first split call, where the
    rows of its reshapes go (to constant shapes, or to shapes the sizes did
    not decide), and compiles it again where that changes the conversion
    (else ``None``).  ``call``: the :class:`~.compilation.Compilation`."""
    import theano
    from tmpi_adapters.core.coupling import CoupledStep
    session, key = adapter.session, call.key
    graph = call.graph
    outputs = call.outputs
    local_rows = plan.local_rows_variable()
    fixed = FixedBatch(graph, plan.data, local_rows, key)
    gradients = {node: i for i, node in enumerate(markers)}
    steps, used = [], []
    new_givens = plan_givens(call, plan)

    def decisions():
        if fixed.done:
            return dict(fixed.axes), dict(fixed.rewrites)
        return fixed.assumed_axes(), {}

    def compile_with(_):
        reshapes, rewrite = decisions()
        rows = Rows(plan.layout, convert=True, window=session.rows_window, reshapes=reshapes,
                    rewrite=rewrite, local_rows=local_rows, gradients=gradients,
                    probe=not fixed.done)
        if rows.undecided:
            # Reshapes the sizes do not decide: assumed to keep the rows on axis 0
            # until the first split call decides (nothing runs split before).
            fixed.probe_also(rows.undecided)
            reshapes, _ = decisions()
        step = CoupledStep(session, key, rows, markers, outputs, call.update_pairs)
        steps.append(step)
        used[:] = [(reshapes, {k: repr(v) for k, v in rewrite.items()})]
        new_graph = step.outputs + step.updates
        if plan.replace:
            new_graph = theano.clone(new_graph, replace=plan.replace)
        args, arguments = call.rebuilt(new_graph, new_givens)
        if plan.sliced and arguments.get("on_unused_input") is None:
            arguments["on_unused_input"] = "ignore"
        compiled = adapter.compile(*args, **arguments)
        if plan.bounds_fn is None:
            plan.compile_bounds(adapter._original_function)
        return compiled

    def recompile(sizes, cut):
        plan_replace = dict(plan.replace)
        fixed.resolve(sizes, lambda t, labels, s: probe_shapes(
            adapter, call, graph, plan_replace, new_givens, t, labels, s, cut), couples=True)
        reshapes, rewrite = decisions()
        if [(reshapes, {k: repr(v) for k, v in rewrite.items()})] == used:
            return None
        return compile_with(None)
    compiled = compile_with(None)
    first_split = FirstSplit(fixed, recompile) if fixed.found.reshapes else None
    return compiled, first_split, steps


def default_updates(graph, updated):
    """``(variable, default_update)`` of the shared variables ``graph`` reads
    (or their default updates read) that the function does not update
    itself, as ``theano.function`` would add them."""
    from theano.compile.sharedvalue import SharedVariable
    from theano.gof.graph import inputs
    found, seen, stack = [], {id(v) for v in updated}, list(graph)
    while stack:
        for variable in inputs(stack):
            if isinstance(variable, SharedVariable) and id(variable) not in seen and \
                    getattr(variable, "default_update", None) is not None:
                seen.add(id(variable))
                found.append((variable, variable.default_update))
        new = [expr for var, expr in found if id(expr) not in seen]
        for expr in new:
            seen.add(id(expr))
        stack = new
    return found


class CoupledCombiner:
    """What a converted training step still combines after its call: per-row
    values and extrema (:class:`~tmpi_adapters.core.combine.Combiner`), as the
    latest compilation of the step says (``steps[-1]``).  Its training
    function's ``coupled_step``: the end-of-run line reads :attr:`step`'s levels."""

    def __init__(self, session, steps, name):
        self.session, self.steps, self.name = session, steps, name
        self._made = None

    def _combiner(self):
        step = self.steps[-1]
        if self._made is None or self._made[0] is not step:
            self._made = (step, Combiner(self.session, step.kinds, step.axes, name=self.name))
        return self._made[1]

    def __call__(self, values, weight, rows, total=None):
        return self._combiner()(values, weight, rows, total=total)

    @property
    def step(self):
        """The step as compiled last (:class:`~tmpi_adapters.core.coupling.CoupledStep`)."""
        return self.steps[-1]


def plan_givens(call, plan):
    """The call's ``givens`` as ``plan`` slices them (in the form the script
    gave them), or ``None`` where it does not change them."""
    if plan is None or plan.given_pairs is None:
        return None
    givens = call.arguments.get("givens")
    return type(givens)(plan.given_pairs) if hasattr(givens, "items") else plan.given_pairs


def probe_shapes(adapter, call, graph, plan_replace, new_givens, transform, labels, sizes, cut):
    """``{label: (input shapes, output shapes)}`` of the tagged reshapes
    (``labels``) when the function's graph, rewritten by ``transform``
    (without any exchange: nothing is exchanged), runs each of ``sizes``
    rows, from Theano's own shape inference on the call's inputs cut by
    ``cut(rows)``."""
    import theano
    found = reshape_inputs(transform(theano.clone(graph, replace=plan_replace)))
    arguments = dict(call.arguments, outputs=[found[l][k].shape for l in labels
                                              for k in (0, 1)],
                     on_unused_input="ignore", no_default_updates=True,
                     name="%s (shapes)" % call.key)
    arguments.pop("updates", None)
    if new_givens is not None:
        arguments["givens"] = new_givens
    function = adapter._original_function(**arguments)
    measured = []
    for rows in sizes:
        args, kwargs = cut(rows)
        measured.append([tuple(int(v) for v in shape) for shape in function(*args, **kwargs)])
    return {label: ([m[2 * k] for m in measured], [m[2 * k + 1] for m in measured])
            for k, label in enumerate(labels)}


def split_compiler(adapter, call, graph, plan, replace, step=None, fixed=None):
    """``(compile_with, first_split)`` for a function split by ``plan``:
    ``compile_with(None)`` compiles it (shared batches sliced, ``givens``
    sliced, a batch size its convolutions declare made each rank's own);
    ``first_split(sizes, cut)`` decides, on the first split call, which
    reshapes to constant shapes follow the rows and compiles the function
    again where some must be rebuilt, or returns ``None``
    (:meth:`~tmpi_adapters.graphs.fixedbatch.FixedBatch.resolve`).
    ``replace`` and ``step`` are
    :meth:`~tmpi_adapters.frameworks.theano.TheanoAdapter._rebuilt`'s; ``call``
    the :class:`~.compilation.Compilation`."""
    plan_replace = {}
    if plan is not None:
        plan_replace = dict(plan.replace)
        if plan.replace and replace:
            # The replacement values (marked gradients, the step's exchange)
            # read the shared batch variables too: slice them there as well.
            import theano
            keys = list(replace)
            replace = dict(zip(keys, theano.clone([replace[k] for k in keys],
                                                  replace=plan.replace)))
        replace = {**replace, **plan.replace}
        if fixed is None:
            fixed = FixedBatch(graph, plan.data, plan.local_rows_variable(), call.key)
    new_givens = plan_givens(call, plan)

    def compile_with(transform):
        if transform is None and fixed and fixed.declared:
            transform = fixed.transform()
        if not replace and new_givens is None and transform is None and step is None:
            return adapter.compile(*call.bound.args, **call.bound.kwargs)
        compile_args, compile_kwargs = adapter._rebuilt(call, replace, new_givens, step=step,
                                                        transform=transform)
        if plan is not None and plan.sliced and compile_kwargs.get("on_unused_input") is None:
            # The batch index now only feeds the slice bounds computed outside.
            compile_kwargs["on_unused_input"] = "ignore"
        compiled = adapter.compile(*compile_args, **compile_kwargs)
        if plan is not None and plan.bounds_fn is None:
            plan.compile_bounds(adapter._original_function)
        return compiled

    def recompile(sizes, cut):
        transform = fixed.resolve(sizes, lambda t, labels, s: probe_shapes(
            adapter, call, graph, plan_replace, new_givens, t, labels, s, cut))
        return compile_with(transform) if transform is not None else None
    return compile_with, (FirstSplit(fixed, recompile) if fixed is not None else None)


class FirstSplit:
    """What a function whose batch is split does on its first split call:
    rebuild the reshapes that follow the rows (``FirstSplit(sizes, cut)``
    returns the function compiled again, or ``None``; ``done`` after), and
    explain a first split call that failed."""

    def __init__(self, fixed, recompile):
        self.fixed = fixed
        self._recompile = recompile

    @property
    def done(self):
        return self.fixed.done

    @property
    def confirmed(self):
        """False when the graph was read before the first call (an evaluation's
        values) otherwise than it was then rebuilt."""
        return self.fixed.confirmed

    def __call__(self, sizes, cut):
        """``sizes``: the call's rows, then each share's; ``cut(rows)``: the
        call's arguments made to run its first ``rows`` rows."""
        if self.done:
            return None
        try:
            return self._recompile(sizes, cut)
        except TmpiError:
            raise
        except Exception as error:  # noqa: BLE001 - said as what it means for the split
            raise ConfigError(
                "%s: tmpi could not tell whether its reshapes to constant shapes %s follow the "
                "batch's rows: Theano's shape inference on the call's inputs failed (%s: %s). "
                "Run with --scaling weak so that each rank takes whole batches."
                % (self.fixed.name, sorted(s for _, s in self.fixed.found.reshapes.values()),
                   type(error).__name__, str(error).splitlines()[0][:200] if str(error) else "")
            ) from error

    def explain(self, rows, size, error):
        return self.fixed.explain(rows, size, error)


def split_evaluation(adapter, call):
    """A function without training and without updates whose inputs carry a
    batch, split across ranks (:class:`SplitFunction`), or ``None`` where it
    runs whole on every rank: one rank, an adapter that splits its own
    evaluation, weak scaling, rules whose ranks do not meet per step, random
    draws, or a value whose combination the graph does not tell."""
    session = adapter.session
    if (session.size == 1 or not adapter.split_evaluations or call.update_pairs
            or not call.output_list
            or adapter.batch_mode() != "rows" or session.rule.exchanges != "gradients"
            or session.options.outputs == "local"):
        return None
    arguments = call.arguments
    if not (arguments.get("inputs") or arguments.get("givens")):
        return None
    outputs = call.outputs
    if any(getattr(v, "default_update", None) is not None for v in ancestors(outputs)):
        return None  # random draws: per-row noise would change with the split
    inputs = list(arguments.get("inputs") or [])
    plan, rows = analyse_function(adapter, inputs, pairs(arguments.get("givens")), outputs,
                                  [o for o in outputs if o.ndim == 0], [])
    if plan.problem or not plan.carries_batch():
        return None
    key = call.key = "%s~%d" % (arguments.get("name") or "function", session.functions_compiled)
    fixed = FixedBatch(outputs, plan.data, plan.local_rows_variable(), key)
    graph = outputs
    if fixed and fixed.declared:
        # Per-row values are read from the graph each rank will most likely
        # run (confirmed on the first split call, else it runs whole).
        graph = fixed.assume()(list(outputs))
        rows = Rows(Layout(plan.data, graph, costs=[o for o in graph if o.ndim == 0]))
    data = set(plan.data)
    kinds = [classify(o, data, None, rows=rows) for o in graph]
    if any(kind not in KINDS for kind in kinds) or all(kind == "same" for kind in kinds):
        return None
    # Means the ranks return as their sums and counts, divided once after as
    # the one process divides (in the function's own mode).
    ratios = {i: ratio for i, o in enumerate(graph) if kinds[i] == "mean"
              for ratio in [ratio_of(o, data, rows)] if ratio is not None}
    if ratios:
        def divide(inputs, output):
            return adapter._original_function(inputs, output, mode=arguments.get("mode"))
        divisors = {i: ratio.divisors(outputs[i]) for i, ratio in ratios.items()}
        folded = iter(_folded(adapter, call, [d for i in ratios for d in divisors[i]]))
        for i, ratio in ratios.items():
            ratio.compile(outputs[i], divide, [next(folded) for _ in divisors[i]])
        call = call.with_outputs([_parts(ratios[i], o) if i in ratios else o
                                  for i, o in enumerate(call.output_list)])
    compile_with, first_split = split_compiler(adapter, call, outputs, plan, {}, fixed=fixed)
    return SplitFunction(session, compile_with(None), key, plan,
                         Combiner(session, kinds, row_axes(rows, graph), name=key,
                                  ratios=ratios),
                         call.single, first_split=first_split)


def _folded(adapter, call, variables):
    """Per variable, the constant the optimizer makes of it in the function
    one process compiles (a count of rows the graph declares), or ``None``."""
    from theano.gof import Constant
    arguments = dict(call.arguments, outputs=list(variables), on_unused_input="ignore")
    found = []
    for output in adapter._original_function(**arguments).maker.fgraph.outputs:
        while output.owner is not None and type(output.owner.op).__name__ == "DeepCopyOp":
            output = output.owner.inputs[0]
        found.append(output.data if isinstance(output, Constant) else None)
    return found


def _parts(ratio, output):
    """``output`` (a variable or ``theano.Out``) replaced by ``ratio``'s parts."""
    import theano
    if isinstance(output, theano.Out):
        return theano.Out(ratio.parts(output.variable), borrow=output.borrow)
    return ratio.parts(output)
