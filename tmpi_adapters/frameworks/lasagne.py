"""The Lasagne adapter (Lasagne 0.1 and the 0.2 development version).

Lasagne hands its users Theano expressions, and its optimizers
(``lasagne.updates.*``) call ``theano.grad``, so the plain-Theano hooks
(:mod:`tmpi_adapters.frameworks.theano`) already find the gradients and turn
the script's training functions into distributed ones.  This adapter adds
what only Lasagne knows:

``lasagne.updates.*``
    the optimizer state each update rule creates (velocities, Adam moments,
    step counters) is recorded as optimizer state and, when Lasagne left it
    unnamed, named after its parameter (``W.adam[0]``).
``lasagne.layers.get_output``
    remembers the networks whose expressions the script builds, and hands
    the noise layers in them (``DropoutLayer``, ``GaussianNoiseLayer``, any
    layer drawing from its ``_srng``) a
    :class:`~tmpi_adapters.frameworks.random_streams.RowSplitStreams`: they
    draw their random numbers for the *whole* batch and keep this rank's rows
    (even where a layer declares its batch size), so dropout masks are the
    one-process masks and BSP stays exact with dropout.
the networks' parameters
    (``lasagne.layers.get_all_params``, every tag) that a training function
    reads without updating them -- the generator inside a GAN critic's
    function, frozen layers -- are checked and broadcast from rank 0 before
    the function's first step, so every function starts identically.
running averages
    shared variables updated through ``default_update`` from the batch
    (``BatchNormLayer``'s statistics in Lasagne 0.2) are model state, averaged
    across ranks after every step.

Lasagne is imported when the adapter is installed (the script uses it), never
when this module is imported.
"""
import functools
import inspect

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.core.protocol import ModelProtocol
from tmpi_adapters.frameworks.base import imports_module
from tmpi_adapters.graphs import is_marker
from tmpi_adapters.frameworks.random_streams import (RowSplitFunction, RowSplitStreams,
                                                     is_random_streams, random_rows)
from tmpi_adapters.frameworks.theano import TheanoAdapter

#: ``lasagne.updates`` functions that do not return an updates dictionary.
_NOT_UPDATE_RULES = ("get_or_compute_grads", "norm_constraint", "total_norm_constraint")


def import_lasagne():
    """Import Lasagne, or fail with what to install."""
    try:
        import lasagne
        import lasagne.layers
        import lasagne.layers.helper
        import lasagne.updates
    except ImportError as error:
        raise ConfigError(
            "--framework lasagne needs Lasagne, which cannot be imported here (%s). Install "
            "it with `pip install lasagne==0.1` (or Lasagne's development version from its "
            "repository), or pick another --framework." % error)
    return lasagne


# ------------------------------------------------------------------ the adapter

class LasagneAdapter(TheanoAdapter):
    """Distributes Lasagne scripts: the Theano hooks plus Lasagne's own knowledge
    (see the module docstring)."""

    name = "lasagne"

    def __init__(self, session):
        super().__init__(session)
        self.function_class = LasagneFunction
        self.networks = []
        self.update_rules = []          # names of the lasagne.updates rules called
        self._optimizer_state = {}      # id -> shared variable made by lasagne.updates
        self._originals = {}            # id(original) -> hooked replacement
        self._update_depth = 0
        self._lasagne = None

    # -- installing -------------------------------------------------------------
    def install(self):
        super().install()
        lasagne = self._lasagne = import_lasagne()
        helper = lasagne.layers.helper
        self._get_output = helper.get_output
        self._hook(helper.get_output, self.get_output, (lasagne.layers, helper), "get_output")
        for name, rule in _update_rules(lasagne.updates):
            self._hook(rule, self._wrap_update_rule(name, rule), (lasagne.updates,), name)

    def _hook(self, original, replacement, owners, name):
        for owner in owners:
            if getattr(owner, name, None) is original:
                self.patcher.patch(owner, name, replacement)
        self._originals[id(original)] = replacement

    def rebind(self, namespace):
        super().rebind(namespace)
        for key, value in list(namespace.items()):
            if id(value) in self._originals:
                namespace[key] = self._originals[id(value)]

    # -- lasagne.layers.get_output -------------------------------------------------
    def get_output(self, layer_or_layers, inputs=None, **kwargs):
        """``lasagne.layers.get_output``: remembers the network; noise layers in it
        draw for the whole batch (see :class:`RowSplitStreams`)."""
        self._remember(layer_or_layers)
        swapped, rows = [], random_rows(self)
        for layer in self._lasagne.layers.get_all_layers(layer_or_layers) if rows else ():
            streams = getattr(layer, "_srng", None)
            if (streams is not None and not isinstance(streams, RowSplitStreams)
                    and is_random_streams(streams)):
                layer._srng = RowSplitStreams(streams, rows)
                swapped.append((layer, streams))
        try:
            return self._get_output(layer_or_layers, inputs, **kwargs)
        finally:
            for layer, streams in swapped:
                layer._srng = streams

    def _remember(self, layer_or_layers):
        layers = layer_or_layers if isinstance(layer_or_layers, (list, tuple)) else [
            layer_or_layers]
        for layer in layers:
            if not any(layer is known for known in self.networks):
                self.networks.append(layer)

    def network_params(self):
        """Every parameter (all tags) of the networks the script took outputs of,
        from ``lasagne.layers.get_all_params``."""
        found, seen = [], set()
        for network in self.networks:
            for param in self._lasagne.layers.get_all_params(network):
                if id(param) not in seen:
                    seen.add(id(param))
                    found.append(param)
        return found

    def fixed_batch_inputs(self, function):
        """``InputLayer`` s feeding ``function`` whose shape fixes the batch size."""
        inputs = {id(i.variable) for i in function.maker.inputs if not i.implicit}
        found = []
        for network in self.networks:
            for layer in self._lasagne.layers.get_all_layers(network):
                shape = getattr(layer, "shape", None)
                var = getattr(layer, "input_var", None)
                if (var is not None and id(var) in inputs and shape and shape[0] is not None
                        and layer not in found):
                    found.append(layer)
        return found

    # -- lasagne.updates.* ----------------------------------------------------------
    def _wrap_update_rule(self, name, rule):
        signature = inspect.signature(rule)
        adapter = self

        @functools.wraps(rule)
        def update_rule(*args, **kwargs):
            adapter._update_depth += 1
            try:
                updates = rule(*args, **kwargs)
            finally:
                adapter._update_depth -= 1
            # Rules call each other (nesterov_momentum calls sgd): record the
            # outermost call only, under the name the script used.
            if adapter._update_depth == 0 and hasattr(updates, "items"):
                arguments = signature.bind(*args, **kwargs).arguments
                params = arguments.get("params")
                if params is None:
                    params = list(arguments.get("updates") or updates)
                adapter._record_updates(name, updates, params)
            return updates
        return update_rule

    def _record_updates(self, rule, updates, params):
        """Note (and name, when unnamed) the optimizer state an update rule created."""
        if rule not in self.update_rules:
            self.update_rules.append(rule)
        param_ids = {id(p) for p in params}
        count = {}
        for var, expr in updates.items():
            if id(var) in param_ids:
                continue
            self._optimizer_state[id(var)] = var
            owner = _gradient_owner(expr)
            prefix = "%s." % (owner.name or "param") if owner is not None else ""
            k = count[id(owner)] = count.get(id(owner), -1) + 1
            if var.name is None:
                var.name = "%s%s[%d]" % (prefix, rule, k)

    # -- the model of a training function ---------------------------------------------
    def make_model(self, key, params, optimizer_state, model_state, graph, data):
        made_by_lasagne = [v for v in model_state if id(v) in self._optimizer_state]
        optimizer_state = list(optimizer_state) + made_by_lasagne
        model_state = [v for v in model_state if id(v) not in self._optimizer_state]
        taken = {id(v) for v in list(params) + optimizer_state + model_state}
        model_state += [v for v in _running_averages(graph, data) if id(v) not in taken]
        return ModelProtocol(params, optimizer_state, model_state, name=key)

    def read_only_params(self, function, model):
        """Network parameters ``function`` reads but does not train or update."""
        state = {id(v) for v in model.state_variables}
        used = {id(v) for v in function.get_shared()}
        return [p for p in self.network_params() if id(p) in used and id(p) not in state]

    def synchronize_read_only(self, function):
        """Identical start for what a training function reads but does not update."""
        variables = function.read_only
        self.session.identical_start(
            variables, ModelProtocol(variables, name=function.model.name).signature())

    # -- end of run -------------------------------------------------------------------
    def check_finished(self):
        if not self.functions and self.update_rules:
            self.warn_trained_nothing(
                "the script built updates with lasagne.updates.%s but compiled no "
                "theano.function that applies them (%d function(s) compiled), so nothing "
                "was distributed: tmpi distributes the training function, "
                "theano.function(inputs, outputs, updates=updates). If the script should "
                "train, check that it is compiled with those updates while the script runs "
                "under tmpi." % (self.update_rules[0], self.session.functions_compiled))
            return
        super().check_finished()


class LasagneFunction(RowSplitFunction):
    """A distributed training function of a Lasagne script.

    Adds to :class:`~tmpi_adapters.frameworks.random_streams.RowSplitFunction`
    (whose noise layers draw for the whole batch): the identical start of the
    network parameters it only reads, and a clear error for networks with a
    fixed batch size.
    """

    def __init__(self, adapter, compiled, model, *args, **kwargs):
        super().__init__(adapter, compiled, model, *args, **kwargs)
        self.read_only = adapter.read_only_params(compiled, model)

    def __call__(self, *args, **kwargs):
        first = self.calls == 0
        if first and self.session.size > 1:
            self.adapter.synchronize_read_only(self)
        try:
            return super().__call__(*args, **kwargs)
        except TmpiError:
            raise
        except Exception as error:
            if first and self.session.size > 1:
                self._explain_fixed_batch(error)
            raise

    def _explain_fixed_batch(self, error):
        fixed = self.adapter.fixed_batch_inputs(self.fn)
        if not fixed or self.session.options.scaling != "strong":
            return
        layer = fixed[0]
        raise ConfigError(
            "%s failed on its first split batch (%s: %s). Its InputLayer%s declares a fixed "
            "batch size of %d rows, but strong scaling gives each of the %d ranks a share of "
            "every batch. Declare the batch dimension as None (shape=(None, ...)), or run "
            "with --scaling weak so that each rank takes whole batches."
            % (self.model.name, type(error).__name__, str(error).splitlines()[0][:200],
               " %r" % layer.name if layer.name else "", layer.shape[0],
               self.session.size)) from error


# ------------------------------------------------------------------ graph helpers

def _update_rules(module):
    """``(name, function)`` of every update rule in ``lasagne.updates``."""
    for name, value in sorted(vars(module).items()):
        if (inspect.isfunction(value) and not name.startswith("_")
                and value.__module__ == module.__name__ and name not in _NOT_UPDATE_RULES):
            yield name, value


def _gradient_owner(expr):
    """The parameter whose (marked) gradient an update expression uses, if exactly one.

    The walk stops at gradient markers, so it only visits the update formula.
    """
    owners, seen, stack = [], set(), [expr]
    while stack:
        var = stack.pop()
        if id(var) in seen:
            continue
        seen.add(id(var))
        if is_marker(var):
            wrt = var.owner.op.wrt
            if wrt is not None and not any(wrt is o for o in owners):
                owners.append(wrt)
            continue
        if var.owner is not None:
            stack.extend(var.owner.inputs)
    return owners[0] if len(owners) == 1 else None


def _running_averages(graph, data):
    """Float shared variables whose ``default_update`` is computed from the batch
    (BatchNorm statistics): model state that each rank updates from its own rows."""
    from theano.compile.sharedvalue import SharedVariable
    from theano.gof.graph import ancestors
    found = []
    for var in ancestors([v for v in graph if v is not None]):
        update = getattr(var, "default_update", None)
        if (isinstance(var, SharedVariable) and update is not None
                and str(getattr(var, "dtype", "")).startswith("float")
                and not getattr(var.tag, "is_rng", False)
                and set(ancestors([update])) & data):
            found.append(var)
    return found


# ------------------------------------------------------------------ plugin hooks

@hookimpl
def tmpi_frameworks():
    return {"lasagne": LasagneAdapter}


@hookimpl(tryfirst=True)
def tmpi_detect_framework(source, path):
    if imports_module(source, "lasagne"):
        return "lasagne"
    return None
