"""The plain-Theano adapter: distributes an unmodified script's training functions.

While the script runs, two Theano entry points are hooked:

``theano.grad``
    gradients with respect to shared variables come back wrapped in a
    :class:`~tmpi_adapters.core.ops.GradientMarker` (an identity).
``theano.function``
    a function whose updates use marked gradients is a *training function*.
    Its markers are replaced by one :class:`~tmpi_adapters.core.ops.FusedAllreduce`
    (gradient rules) or removed (parameter rules), and the compiled function
    is returned wrapped in a :class:`DistributedFunction` that splits each
    batch across ranks.  The shared variables it reads become a
    :class:`~tmpi_adapters.core.protocol.ModelProtocol`: the ``wrt`` of the marked
    gradients are the parameters, other updated variables are optimizer state
    (updates that use gradients or nothing from the data) or model state
    (updates computed from the data, like BatchNorm statistics).

Batches are found in the call's arguments (numpy arrays sharing the length
of their batch axis: axis 0, or axis 1 for the ``(time, batch, ...)`` inputs
of sequence models, read from the graph by :mod:`tmpi_adapters.core.layout`),
for scripts in the ``givens={x: data[i*B:(i+1)*B]}`` style in the slices of
shared datasets, and in shared variables the adapter names
(:meth:`TheanoAdapter.batch_variables`); each is rewritten to the rank's
share (:mod:`tmpi_adapters.core.split`).  A graph that writes the batch size
in (``x.reshape((batch_size, 1, 28, 28))``, ``conv2d(input_shape=...)``) is
rebuilt for each rank's rows (:mod:`tmpi_adapters.core.fixedbatch`).

Functions without updates whose inputs carry a batch (validation, prediction)
are split too, when the graph says how each returned value combines
(:mod:`tmpi_adapters.core.outputs`): means, sums, extrema and per-row values
(:class:`~tmpi_adapters.core.function.SplitFunction`).  Other functions run
unchanged on every rank: their results are identical everywhere.  All of this
happens on more than one rank only: on one rank the script's graphs are its
own.
"""
import inspect
import itertools
import sys

from tmpi_adapters.core.function import DistributedFunction, ObservedFunction
from tmpi_adapters.core.graph import ancestors, is_marker
from tmpi_adapters.core.outputs import Combiner, classify
from tmpi_adapters.core.protocol import ModelProtocol, variable_name
from tmpi_adapters.core.split import input_variables
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.exchangers.envelope import Envelope
from tmpi_adapters.frameworks.base import FrameworkAdapter, imports_module
from tmpi_adapters.frameworks import transparency
from tmpi_adapters.frameworks.theano_split import (analyse_function, pairs, row_axes,
                                                   split_compiler, split_evaluation)
from tmpi_adapters.pluginmanager import hookimpl

_function_ids = itertools.count()


class TheanoAdapter(FrameworkAdapter):
    """Hooks ``theano.grad`` and ``theano.function`` (see module docstring)."""

    name = "theano"

    #: what training functions are returned as: a :class:`DistributedFunction`
    #: subclass, or ``None`` for :class:`DistributedFunction` itself
    function_class = None

    @property
    def split_evaluations(self):
        """Whether functions that do not train but take a batch (validation,
        prediction) are split across ranks.  Adapters that split their
        framework's evaluation themselves say False (a class attribute will
        do); Keras' adapter splits its test function itself (``KerasEvaluation``)."""
        return self.name != "keras"

    def __init__(self, session):
        super().__init__(session)
        self.functions = []
        self._original_grad = None
        self._original_function = None
        #: the cost each gradient marker was taken of (marker index -> cost):
        #: its divisions name the batch axis (:mod:`tmpi_adapters.core.layout`)
        self._costs = {}

    # -- installing -------------------------------------------------------------
    def install(self):
        import theano
        import theano.gradient
        import theano.tensor
        self._original_grad = theano.gradient.grad
        self._original_function = theano.function
        self._signature = inspect.signature(self._original_function)
        grad, function = self.grad, self.function
        for owner in (theano, theano.gradient, theano.tensor):
            self.patcher.patch(owner, "grad", grad)
        self.patcher.patch(theano, "function", function)
        self.patcher.patch(theano.compile, "function", function)
        module = sys.modules.get("theano.compile.function")
        if module is not None and getattr(module, "function", None) is self._original_function:
            self.patcher.patch(module, "function", function)
        self.transparency = transparency.install(self)  # row-wise random draws, files written once

    def rebind(self, namespace):
        swaps = {id(self._original_grad): self.grad, id(self._original_function): self.function}
        for key, value in list(namespace.items()):
            if id(value) in swaps:
                namespace[key] = swaps[id(value)]

    # -- theano.grad --------------------------------------------------------------
    def grad(self, cost, wrt, *args, **kwargs):
        """``theano.grad``, with gradients of shared variables marked."""
        result = self._original_grad(cost, wrt, *args, **kwargs)
        single = not isinstance(wrt, (list, tuple))
        wrts = [wrt] if single else list(wrt)
        grads = [result] if single else list(result)
        marked = [self._mark(g, w) for g, w in zip(grads, wrts)]
        self.remember_cost(cost, marked)
        if single:
            return marked[0]
        return tuple(marked) if isinstance(result, tuple) else marked

    @staticmethod
    def _mark(g, wrt):
        from theano.compile.sharedvalue import SharedVariable
        from theano.tensor import TensorVariable
        from tmpi_adapters.core.ops import GradientMarker
        if (isinstance(wrt, SharedVariable) and isinstance(g, TensorVariable)
                and g.dtype.startswith("float")):
            return GradientMarker(wrt)(g)
        return g

    def remember_cost(self, cost, gradients):
        """Note that the marked ``gradients`` were taken of ``cost`` (only
        needed on more than one rank: the batch axis is read from it)."""
        if self.session.size == 1 or cost is None:
            return
        for gradient in gradients:
            if is_marker(gradient):
                self._costs[gradient.owner.op.index] = cost

    # -- theano.function ----------------------------------------------------------
    def compile(self, *args, **kwargs):
        """Compile with the original ``theano.function`` on every rank at once,
        then meet.

        Most of a compilation is Theano's graph optimisation, pure Python that
        each rank does on its own core; only writing a C module to the shared
        cache takes its lock (retried every 1-2 s, ``compile.wait=1``), and the
        ranks' cache keys agree because they share one ``PYTHONHASHSEED``
        (:func:`~tmpi_adapters.launch.launcher.rank_environment`).  Compiling
        on one rank after the other would take the sum of the ranks' times.
        """
        session = self.session
        if session.size == 1:
            return self._original_function(*args, **kwargs)
        name = kwargs.get("name") or "a function"
        result = self._original_function(*args, **kwargs)
        # The stall timeout holds here too: a rank that never comes (blocked
        # before its first compile) is reported like any other, and a slow
        # cold compile shows in the report as the line compiling.
        session.meet(Envelope("compile", name))
        return result

    def function(self, *args, **kwargs):
        """``theano.function``; training functions come back distributed."""
        import theano
        self.session.functions_compiled += 1
        bound = self._signature.bind(*args, **kwargs)
        params = bound.arguments
        outputs = params.get("outputs")
        updates = params.get("updates")
        update_pairs = list(updates.items()) if hasattr(updates, "items") else list(updates or [])
        output_list, rebuild_outputs = _normalize_outputs(outputs)
        graph = [o.variable if isinstance(o, theano.Out) else o for o in output_list]
        graph += [expr for _, expr in update_pairs]
        markers = sorted({v.owner for v in ancestors(graph) if is_marker(v)},
                         key=lambda node: node.op.index)
        if not markers:
            split = split_evaluation(self, bound, output_list, rebuild_outputs, update_pairs,
                                     updates)
            if split is not None:
                return split
            return self._observed(self.compile(*args, **kwargs), params)
        updated = [var for var, _ in update_pairs]
        params_of = []
        for node in markers:
            wrt = node.op.wrt
            if any(wrt is u for u in updated) and not any(wrt is p for p in params_of):
                params_of.append(wrt)
        if not params_of:
            # Gradients used for something other than training (a norm to
            # monitor, a saliency map): plain values, no exchange.
            replace = {node.outputs[0]: node.inputs[0] for node in markers}
            compile_args, compile_kwargs = self._rebuilt(bound, output_list, rebuild_outputs,
                                                         update_pairs, replace, updates)
            return self._observed(self.compile(*compile_args, **compile_kwargs), params)
        return self._training_function(bound, output_list, rebuild_outputs, update_pairs,
                                       updates, markers, params_of)

    def _observed(self, compiled, params):
        """A function that is not distributed: returned as compiled, or, when a
        plugin watches calls (checkpoint replay answers for them), routed
        through the ``tmpi_call`` hook."""
        if not self.session.observes_calls:
            return compiled
        key = "%s~%d" % (params.get("name") or "function", self.session.functions_compiled)
        return ObservedFunction(self.session, compiled, key, bool(params.get("updates")))

    def _rebuilt(self, bound, output_list, rebuild_outputs, update_pairs, replace, updates,
                 givens=None, step=None, transform=None):
        """``theano.function``'s arguments with ``replace`` made in the outputs
        and updates (and ``givens`` swapped in).  With ``step`` (a
        :class:`_StepExchange`), the outputs and updates it carries are taken
        from the clone of its one exchange; ``transform`` rewrites the whole
        cloned graph (a fixed batch size made the rank's own)."""
        import theano
        graph = [o.variable if isinstance(o, theano.Out) else o for o in output_list]
        graph += [expr for _, expr in update_pairs]
        extra = step.outputs if step is not None else []
        # One clone of everything: the exchange's node is cloned once, so the
        # step stays one collective however many places use its results.
        cloned = theano.clone(graph + extra, replace=replace) if graph else []
        if transform is not None and cloned:
            cloned = transform(cloned)
        if step is not None:
            cloned = step.substitute(cloned[:len(graph)], cloned[len(graph):],
                                     len(output_list), [var for var, _ in update_pairs])
        new_outputs = []
        for o, c in zip(output_list, cloned[:len(output_list)]):
            new_outputs.append(theano.Out(c, borrow=o.borrow) if isinstance(o, theano.Out) else c)
        new_updates = [(var, expr) for (var, _), expr in
                       zip(update_pairs, cloned[len(output_list):len(graph)])]
        if hasattr(updates, "items"):
            from collections import OrderedDict
            new_updates = OrderedDict(new_updates)
        arguments = dict(bound.arguments)
        arguments["outputs"] = rebuild_outputs(new_outputs)
        if "updates" in arguments:
            arguments["updates"] = new_updates
        if givens is not None:
            arguments["givens"] = givens
        inputs = arguments.pop("inputs")
        return (inputs,), arguments

    def make_model(self, key, params, optimizer_state, model_state, graph, data):
        """The :class:`~tmpi_adapters.core.protocol.ModelProtocol` of a training function.

        Framework adapters that know more about the model than the graph shows
        override this to refine the generic analysis.

        Parameters
        ----------
        key : str
            The function's name in messages.
        params, optimizer_state, model_state : list of SharedVariable
            What the generic analysis of the updates found.
        graph : list of Variable
            The function's outputs and update expressions (gradients still marked).
        data : set of Variable
            The variables that carry the batch (inputs and ``givens`` targets).
        """
        return ModelProtocol(params, optimizer_state, model_state, name=key)

    def accumulators(self, update_pairs):
        """Shared variables among the updated ones that accumulate sums over
        the batch (a framework's stateful metrics): each step adds the sum of
        every rank's increment.  Adapters that know such variables override
        this; none by default."""
        return []

    def _training_function(self, bound, output_list, rebuild_outputs, update_pairs, updates,
                           markers, params):
        import theano
        session = self.session
        arguments = bound.arguments
        index = next(_function_ids)
        key = "%s#%d" % (arguments.get("name") or "train_fn", index)

        inputs = list(arguments.get("inputs") or [])
        givens = arguments.get("givens")
        given_pairs = pairs(givens)
        graph = [o.variable if isinstance(o, theano.Out) else o for o in output_list]
        graph += [expr for _, expr in update_pairs]
        outputs = graph[:len(output_list)]
        plan = rows = None
        if session.size > 1:
            costs = self._costs_of(markers) + [o for o in outputs if o.ndim == 0]
            plan, rows = analyse_function(self, inputs, given_pairs, graph, costs, update_pairs,
                                          slice_givens=self.batch_mode() == "rows")
            data = set(plan.data)
        else:
            data = set(input_variables(inputs)) | {var for var, _ in given_pairs}
        optimizer_state, model_state = [], []
        marker_outputs = {node.outputs[0] for node in markers}
        for var, expr in update_pairs:
            if any(var is p for p in params):
                continue
            above = set(ancestors([expr]))
            if above & marker_outputs or not (above & data):
                optimizer_state.append(var)
            else:
                model_state.append(var)
        model = self.make_model(key, params, optimizer_state, model_state, graph, data)
        # Names for the recorder's loss/accuracy curves (None where unnamed).
        model.output_names = [getattr(getattr(o, "variable", o), "name", None)
                              for o in output_list]
        # The exchanged gradients' order, for messages about them.
        model.gradient_names = [variable_name(node.op.wrt, i) for i, node in enumerate(markers)]

        default = self._default_kind()
        kinds = [classify(o, data, default, rows=rows, strict=False) for o in outputs]
        step = None
        if session.rule.exchanges == "gradients" and (session.size > 1 or
                                                      session.watches_exchanges()):
            step = _StepExchange(self, key, markers, outputs, kinds, update_pairs, model,
                                 marker_outputs)
            replace = dict(step.replace)
        else:
            replace = {node.outputs[0]: node.inputs[0] for node in markers}
        compile_with, first_split = split_compiler(
            self, key, bound, output_list, rebuild_outputs, update_pairs, updates, graph, plan,
            replace, step)
        compiled = compile_with(None)
        # What the step's exchange did not combine is combined after the call.
        after = [None if step is not None and i in step.carried else kind
                 for i, kind in enumerate(kinds)]
        function_class = self.function_class or DistributedFunction
        function = function_class(self, compiled, model, plan=plan,
                                  single_output=rebuild_outputs.single,
                                  combiner=Combiner(session, after, row_axes(rows, outputs),
                                                    name=key),
                                  first_split=first_split)
        model.train_fn = function
        session.register_model(model)
        self.functions.append(function)
        return function

    def _costs_of(self, markers):
        found = []
        for node in markers:
            cost = self._costs.get(node.op.index)
            if cost is not None and not any(cost is c for c in found):
                found.append(cost)
        return found

    def batch_variables(self, inputs, outputs, updates):
        """Shared variables that carry the batch of a function being compiled.

        Called on more than one rank for every function tmpi may split, with
        ``theano.function``'s ``inputs``, its ``outputs`` (a list of
        variables) and ``updates`` (a list of pairs).  Returns the shared
        variables (a list, the same on every rank, in the same order) whose
        batch axis holds one entry per example of every call's batch: Keras'
        ``target_tensors`` given as a ``K.variable``, a script's own
        per-example weights kept in a shared variable.  Each is read like an
        input (its batch axis is axis 0 unless the graph says otherwise),
        replaced in the compiled graph by ``variable[lo:hi]`` along that axis,
        and before every call ``lo``/``hi`` are set to this rank's share of the
        call's rows, like a ``givens`` slice (the variable's value itself is
        never changed).  A call whose batch has another number of rows than
        the variable is a clear error.  Adapters that know such variables
        override this; none by default.
        """
        return []

    def _default_kind(self):
        """How a scalar output the graph does not explain combines."""
        return "sum" if self.session.options.loss_reduction == "sum" else "mean"

    def batch_mode(self):
        """How training calls share work across ranks.

        ``"rows"``: each call's batch is split by rows (strong scaling);
        ``"round-robin"``: groups of N calls form one step, rank r training on
        the r-th call's batch (weak scaling of an unmodified loop);
        ``"local"``: each rank already feeds its own data (adapters whose
        models shard their data themselves), so batches are used whole.
        """
        return "round-robin" if self.session.options.scaling == "weak" else "rows"

    # -- end of run ---------------------------------------------------------------
    def check_finished(self):
        if not self.functions:
            self.warn_trained_nothing(
                "the script compiled %d Theano function(s) but no training function, so "
                "nothing was distributed: tmpi distributes a theano.function whose updates "
                "use gradients from theano.grad with respect to shared variables (the "
                "trainable parameters). If the script should train, check that it builds "
                "its updates from theano.grad (or a framework optimizer) and that "
                "--framework matches the script." % self.session.functions_compiled)

    def warn_trained_nothing(self, text):
        """Say once (rank 0) that the script trained nothing.  Not an error: an
        evaluation-only run or a gradient monitor is a run, and its exit
        status stays the script's."""
        self.session.print("tmpi: warning: %s" % text, file=sys.stderr)


class _StepExchange:
    """The one exchange of a training step: its gradients and riders.

    Riders are what else the step computes that the ranks must agree on,
    carried in the same message instead of exchanges of their own: scalar
    outputs that are means or sums over the batch (``--outputs averaged``),
    model state updated from the batch (BatchNorm statistics, averaged), the
    increments of accumulators (summed).  Only values computed without the
    gradients ride: those computed from the exchanged gradients are already
    the same on every rank.

    Terms of a gradient that every rank computes alike (a weight penalty's)
    do not travel when the rule reduces linearly: they are added to the
    exchanged sum of the others (:mod:`tmpi_adapters.core.terms`).
    """

    def __init__(self, adapter, key, markers, outputs, kinds, update_pairs, model,
                 marker_outputs):
        from tmpi_adapters.core.ops import FusedAllreduce
        from tmpi_adapters.core.terms import alike_terms
        session = adapter.session
        gradient_op = "sum" if session.options.loss_reduction == "sum" else "mean"
        arrays = [node.inputs[0] for node in markers]
        differs = self.differs(session, model)
        options = session.options
        # Weak scaling's learning-rate factor multiplies the exchanged gradients alone.
        scaled = options.scaling == "weak" and options.lr_scaling
        added = [None if differs is None or scaled else alike_terms(g, differs)
                 for g in arrays]
        arrays = [a if pair is None else pair[0] for a, pair in zip(arrays, added)]
        # A gradient with no term from the batch is the same on every rank: its
        # mean is itself, where a loss that sums would add it once per rank.
        ops = [gradient_op if differs is None or scaled or differs(a) else "mean"
               for a in arrays]
        self.carried = {}   # output index -> position in the exchange (or in self.outputs)
        self.states = {}    # id(updated variable) -> (position, accumulates)
        summed = []         # (output index, what every rank computes alike)
        if session.size > 1:
            def rides(expr):
                return not (set(ancestors([expr])) & marker_outputs)
            if session.options.outputs == "averaged":
                for i, (output, kind) in enumerate(zip(outputs, kinds)):
                    if kind in ("mean", "sum") and output.ndim == 0 and rides(output):
                        # A sum's penalty is counted once, not once per rank.
                        pair = alike_terms(output, differs) \
                            if kind == "sum" and differs is not None else None
                        self.carried[i] = len(arrays)
                        arrays.append(output if pair is None else pair[0])
                        ops.append(kind)
                        if pair is not None:
                            summed.append((i, pair[1]))
            sums = {id(v) for v in adapter.accumulators(update_pairs)}
            state = {id(v) for v in model.model_state}
            for var, expr in update_pairs:
                if id(var) in sums and rides(expr):
                    self.states[id(var)] = (len(arrays), True)
                    arrays.append(expr - var)
                    ops.append("sum")
                elif id(var) in state and rides(expr):
                    self.states[id(var)] = (len(arrays), False)
                    arrays.append(expr)
                    ops.append("mean")
            model.averaged_state = [v for v in model.model_state if id(v) in self.states]
        if session.overlapping:
            self.outputs = self.parts(session, key, markers, arrays, ops)
        else:
            fused = FusedAllreduce(key, ops, gradients=len(markers),
                                   exchange=session.exchange_gradients,
                                   borrowed=session.size > 1)(*arrays)
            self.outputs = list(fused) if isinstance(fused, (list, tuple)) else [fused]
        #: the exchange's results, then the carried sums with their alike terms added
        for index, alike in summed:
            self.outputs.append(self.outputs[self.carried[index]] + alike)
            self.carried[index] = len(self.outputs) - 1
        self.replace = {node.outputs[0]: out if pair is None else out + pair[1]
                        for node, out, pair in zip(markers, self.outputs, added)}

    @staticmethod
    def parts(session, key, markers, arrays, ops):
        """``--overlap``: the exchange of ``arrays`` (the gradients of
        ``markers``, then the riders) as parts of at most ``--bucket-bytes``
        of gradients, filled from the last parameter back (the last layers'
        gradients exist first), the riders in the last part.  Every part
        starts as soon as its gradients exist; they are waited for once all
        have started, before any update.  Returns the results, in the order
        of ``arrays``."""
        from tmpi_adapters.core.ops import FinishExchange, StartExchange
        limit = session.options.bucket_bytes or OVERLAP_BUCKET_BYTES
        parts, current, size = [], [], 0
        for i in reversed(range(len(markers))):
            nbytes = _nbytes(markers[i].op.wrt, arrays[i].dtype)
            if current and size + nbytes > limit:
                parts.append(current)
                current, size = [], 0
            current.append(i)
            size += nbytes
        parts.append(current)
        riders = list(range(len(markers), len(arrays)))
        members = [sorted(part) + (riders if k == len(parts) - 1 else [])
                   for k, part in enumerate(parts)]
        token = None
        for k, (part, chosen) in enumerate(zip(parts, members)):
            start = StartExchange(key, [ops[i] for i in chosen], k, sorted(part),
                                  start=session.start_exchange)
            token = start(*([token] if k else []) + [arrays[i] for i in chosen])
        order = [i for chosen in members for i in chosen]
        finish = FinishExchange(key, [arrays[i].type for i in order],
                                finish=session.finish_exchange)(token)
        outputs = [None] * len(arrays)
        for i, result in zip(order, finish if isinstance(finish, (list, tuple)) else [finish]):
            outputs[i] = result
        return outputs

    @staticmethod
    def differs(session, model):
        """A :class:`~tmpi_adapters.core.terms.Differs` that knows ``model``'s
        parameters and state when terms every rank computes alike can stay out
        of the exchange (more than one rank, a rule that reduces linearly),
        else ``None``."""
        from tmpi_adapters.core.terms import Differs
        if session.size == 1 or not session.rule.reduces_linearly:
            return None
        return Differs(model.params + model.optimizer_state + model.model_state)

    def substitute(self, cloned, exchanged, n_outputs, updated):
        """The cloned outputs and update expressions, with what the exchange
        carried taken from its (cloned) results."""
        result = list(cloned)
        for index, position in self.carried.items():
            result[index] = exchanged[position]
        for k, var in enumerate(updated):
            found = self.states.get(id(var))
            if found is not None:
                position, accumulates = found
                result[n_outputs + k] = (var + exchanged[position]) if accumulates \
                    else exchanged[position]
        return result


#: ``--overlap``'s largest part, in bytes of gradients, unless ``--bucket-bytes`` says.
OVERLAP_BUCKET_BYTES = 4 << 20


def _nbytes(wrt, dtype):
    """Bytes of the gradient with respect to shared variable ``wrt``."""
    import numpy as np
    try:
        shape = wrt.get_value(borrow=True, return_internal_type=True).shape
    except Exception:   # not a shared variable: a guess is enough to make parts
        return 1 << 20
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def _normalize_outputs(outputs):
    """``(list_of_outputs, rebuild)`` where ``rebuild(list)`` restores the shape
    theano.function was given (None, a single variable, or a list)."""
    if outputs is None:
        def rebuild(new):
            return None
        rebuild.single = False
        return [], rebuild
    if isinstance(outputs, (list, tuple)):
        kind = type(outputs)

        def rebuild(new):
            return kind(new)
        rebuild.single = False
        return list(outputs), rebuild

    def rebuild(new):
        return new[0]
    rebuild.single = True
    return [outputs], rebuild


# -- plugin hooks ------------------------------------------------------------------

@hookimpl
def tmpi_frameworks():
    return {"theano": TheanoAdapter}


@hookimpl(trylast=True)
def tmpi_detect_framework(source, path):
    if imports_module(source, "theano"):
        return "theano"
    return None
