"""The plain-Theano adapter: distributes an unmodified script's training functions.

While the script runs, two Theano entry points are hooked:

``theano.grad``
    gradients with respect to shared variables come back wrapped in a
    :class:`~tmpi_adapters.graphs.gradient.GradientMarker` (an identity).
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
of sequence models, read from the graph by :mod:`tmpi_adapters.graphs.layout`),
for scripts in the ``givens={x: data[i*B:(i+1)*B]}`` style in the slices of
shared datasets, and in shared variables the adapter names
(:meth:`TheanoAdapter.batch_variables`); each is rewritten to the rank's
share (:mod:`tmpi_adapters.core.split`).  A graph that writes the batch size
in (``x.reshape((batch_size, 1, 28, 28))``, ``conv2d(input_shape=...)``) is
rebuilt for each rank's rows (:mod:`tmpi_adapters.graphs.fixedbatch`).

Functions without updates whose inputs carry a batch (validation, prediction)
are split too, when the graph says how each returned value combines
(:mod:`tmpi_adapters.graphs.outputs`): means, sums, extrema and per-row values
(:class:`~tmpi_adapters.core.function.SplitFunction`).  Other functions run
unchanged on every rank: their results are identical everywhere.  All of this
happens on more than one rank only: on one rank the script's graphs are its
own.
"""
import inspect
import itertools
import sys

from tmpi_adapters.core.function import DistributedFunction, ObservedFunction
from tmpi_adapters.graphs import ancestors, is_marker
from tmpi_adapters.core.combine import Combiner
from tmpi_adapters.graphs.outputs import classify
from tmpi_adapters.core.protocol import ModelProtocol, variable_name
from tmpi_adapters.core.split import input_variables
from tmpi_adapters.core.step import StepExchange
from tmpi_adapters.exchangers.envelope import Envelope
from tmpi_adapters.frameworks.base import FrameworkAdapter, imports_module
from tmpi_adapters.frameworks import transparency
from tmpi_adapters.frameworks.compilation import Compilation
from tmpi_adapters.frameworks.theano_split import (CoupledCombiner, analyse_function,
                                                   coupled_compiler, default_updates, pairs,
                                                   row_axes, split_compiler, split_evaluation)
from tmpi_adapters.pluginmanager import hookimpl

_function_ids = itertools.count()


class TheanoAdapter(FrameworkAdapter):
    """Hooks ``theano.grad`` and ``theano.function`` (see module docstring)."""

    name = "theano"

    #: what training functions are returned as: a :class:`DistributedFunction`
    #: subclass, or ``None`` for :class:`DistributedFunction` itself
    function_class = None

    def __init__(self, session):
        super().__init__(session)
        self.functions = []
        self._original_grad = None
        self._original_function = None
        #: the cost each gradient marker was taken of (marker index -> cost):
        #: its divisions name the batch axis (:mod:`tmpi_adapters.graphs.layout`)
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
        from tmpi_adapters.process.devices import is_device_type
        from tmpi_adapters.graphs.gradient import GradientMarker
        # On a GPU, shared variables live on the device and so do their gradients.
        if (isinstance(wrt, SharedVariable)
                and (isinstance(g, TensorVariable) or is_device_type(getattr(g, "type", None)))
                and str(g.dtype).startswith("float")):
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
        self.session.functions_compiled += 1
        call = Compilation(self._signature.bind(*args, **kwargs))
        params = call.arguments
        markers = sorted({v.owner for v in ancestors(call.graph) if is_marker(v)},
                         key=lambda node: node.op.index)
        if not markers:
            split = split_evaluation(self, call)
            if split is not None:
                return split
            return self._observed(self.compile(*args, **kwargs), params)
        updated = [var for var, _ in call.update_pairs]
        params_of = []
        for node in markers:
            wrt = node.op.wrt
            if any(wrt is u for u in updated) and not any(wrt is p for p in params_of):
                params_of.append(wrt)
        if not params_of:
            # Gradients used for something other than training (a norm to
            # monitor, a saliency map): plain values, no exchange.
            replace = {node.outputs[0]: node.inputs[0] for node in markers}
            compile_args, compile_kwargs = self._rebuilt(call, replace)
            return self._observed(self.compile(*compile_args, **compile_kwargs), params)
        return self._training_function(call, markers, params_of)

    def _observed(self, compiled, params):
        """A function that is not distributed: returned as compiled, or, when a
        plugin watches calls (checkpoint replay answers for them), routed
        through the ``tmpi_call`` hook."""
        if not self.session.observes_calls:
            return compiled
        key = "%s~%d" % (params.get("name") or "function", self.session.functions_compiled)
        return ObservedFunction(self.session, compiled, key, bool(params.get("updates")))

    def _rebuilt(self, call, replace, givens=None, step=None, transform=None):
        """``theano.function``'s arguments with ``replace`` made in the outputs
        and updates (and ``givens`` swapped in).  With ``step`` (a
        :class:`~tmpi_adapters.core.step.StepExchange`), the outputs and updates it carries are taken
        from the clone of its one exchange; ``transform`` rewrites the whole
        cloned graph (a fixed batch size made the rank's own)."""
        import theano
        graph = call.graph
        extra = step.outputs if step is not None else []
        # One clone of everything: the exchange's node is cloned once, so the
        # step stays one collective however many places use its results.
        cloned = theano.clone(graph + extra, replace=replace) if graph else []
        if transform is not None and cloned:
            cloned = transform(cloned)
        if step is not None:
            cloned = step.substitute(cloned[:len(graph)], cloned[len(graph):],
                                     len(call.output_list), [var for var, _ in call.update_pairs])
        return call.rebuilt(cloned[:len(graph)], givens)

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

    def _training_function(self, call, markers, params):
        session = self.session
        arguments = call.arguments
        index = next(_function_ids)
        key = call.key = "%s#%d" % (arguments.get("name") or "train_fn", index)

        inputs = list(arguments.get("inputs") or [])
        given_pairs = pairs(arguments.get("givens"))
        graph, outputs = call.graph, call.outputs
        plan = rows = None
        own_pairs = list(call.update_pairs)
        if session.size > 1 and self.batch_mode() == "rows" and \
                session.rule.exchanges == "gradients":
            # Shared variables updated by their default_update (Lasagne's BatchNorm
            # averages) are read with the rest of the step: it converts them too.
            refused = arguments.get("no_default_updates")
            if refused is not True:
                call.update_pairs = call.update_pairs + default_updates(
                    graph, [var for var, _ in call.update_pairs] + list(refused or []))
                graph = call.graph
        if session.size > 1:
            costs = self._costs_of(markers) + [o for o in outputs if o.ndim == 0]
            plan, rows = analyse_function(self, inputs, given_pairs, graph, costs,
                                          call.update_pairs,
                                          slice_givens=self.batch_mode() == "rows")
            data = set(plan.data)
        else:
            data = set(input_variables(inputs)) | {var for var, _ in given_pairs}
        optimizer_state, model_state = [], []
        marker_outputs = {node.outputs[0] for node in markers}
        for var, expr in own_pairs:
            if any(var is p for p in params):
                continue
            above = set(ancestors([expr]))
            if above & marker_outputs or not (above & data):
                optimizer_state.append(var)
            else:
                model_state.append(var)
        model = self.make_model(key, params, optimizer_state, model_state, graph, data)
        # Names for the recorder's loss/accuracy curves (None where unnamed).
        model.output_names = [getattr(o, "name", None) for o in outputs]
        # The exchanged gradients' order, for messages about them.
        model.gradient_names = [variable_name(node.op.wrt, i) for i, node in enumerate(markers)]

        if self.coupled(plan):
            return self._coupled_function(call, markers, plan, model)
        default = self._default_kind()
        kinds = [classify(o, data, default, rows=rows, strict=False) for o in outputs]
        step = None
        if session.rule.exchanges == "gradients" and (session.size > 1 or
                                                      session.watches_exchanges()):
            step = StepExchange(session, key, markers, outputs, kinds, call.update_pairs, model,
                                marker_outputs,
                                accumulators=self.accumulators(call.update_pairs))
            replace = dict(step.replace)
        else:
            replace = {node.outputs[0]: node.inputs[0] for node in markers}
        compile_with, first_split = split_compiler(self, call, graph, plan, replace, step)
        compiled = compile_with(None)
        # What the step's exchange did not combine is combined after the call.
        after = [None if step is not None and i in step.carried else kind
                 for i, kind in enumerate(kinds)]
        function_class = self.function_class or DistributedFunction
        function = function_class(self, compiled, model, plan=plan,
                                  single_output=call.single,
                                  combiner=Combiner(session, after, row_axes(rows, outputs),
                                                    name=key),
                                  first_split=first_split)
        model.train_fn = function
        session.register_model(model)
        self.functions.append(function)
        return function

    def coupled(self, plan):
        """True when a training function is converted by the row analysis so
        that N ranks compute what one process computes from each whole batch
        (:mod:`tmpi_adapters.core.coupling`): more than one rank, each batch
        split by rows (strong scaling), gradients exchanged inside the step."""
        session = self.session
        return (plan is not None and session.size > 1 and self.batch_mode() == "rows"
                and session.rule.exchanges == "gradients")

    def _coupled_function(self, call, markers, plan, model):
        """A training function converted by the row analysis, compiled, and
        wrapped as its rank's :class:`DistributedFunction`."""
        session, key = self.session, call.key
        compiled, first_split, steps = coupled_compiler(self, call, plan, markers)
        # Every piece of model state is updated from the whole batch inside the step.
        model.averaged_state = list(model.model_state)
        coupled = CoupledCombiner(session, steps, name=key)
        function_class = self.function_class or DistributedFunction
        function = function_class(self, compiled, model, plan=plan,
                                  single_output=call.single,
                                  combiner=coupled, first_split=first_split, coupled=coupled)
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


# -- plugin hooks ------------------------------------------------------------------

@hookimpl
def tmpi_frameworks():
    return {"theano": TheanoAdapter}


@hookimpl(trylast=True)
def tmpi_detect_framework(source, path):
    if imports_module(source, "theano"):
        return "theano"
    return None
