"""The Blocks adapter: MainLoop / GradientDescent models and a Blocks extension.

Two ways in, one machinery:

``tmpi wrap --framework blocks script.py``
    the script runs unmodified.  Everything the plain-Theano adapter does
    (marked gradients, training functions that split each batch by rows and
    exchange gradients in-graph) applies, and Blocks itself is hooked where
    it decides things.
``extensions=[..., tmpi.blocks.Distributed(rule="bsp")]``
    the extension starts the session in its ``before_training`` callback,
    which Blocks' ``MainLoop.run`` calls *before* ``algorithm.initialize()``
    compiles the training function, so the same hooks are in place in time.

What is hooked, and why:

``UpdatesAlgorithm.initialize``
    gradients that were taken before tmpi was running (the extension's case)
    are marked first; after Theano compiled the iteration function, the
    model is named from the Blocks bricks (hierarchical names such as
    ``/mlp/linear_0.W``, roles kept), step-rule buffers are optimizer state,
    and every rank starts from rank 0's values before any monitoring runs.
``AggregationBuffer.get_aggregated_values`` and ``DatasetEvaluator._compile``
    monitoring accumulators hold this rank's share of each batch
    (``TrainingDataMonitoring`` on training batches, ``DataStreamMonitoring``
    on its own stream, which is split across ranks too); a read-out sums the
    shares over ranks, so logged values equal the one-process values.
``MainLoop._check_finish_training``
    ranks agree on stopping after every batch and epoch (``FinishAfter``, an
    interrupt on one rank, a custom extension): all stop at the same step.
``MainLoop._run_extensions``
    ``Printing``, ``ProgressBar`` and ``Checkpoint`` (and any extension with
    ``tmpi_rank_zero_only = True``) run on rank 0 only.

Nothing here imports Blocks until a session actually uses this adapter.
"""
import contextlib
import hashlib
import os
import sys
from collections import namedtuple

import numpy as np

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.core.protocol import ModelProtocol, variable_name
from tmpi_adapters.frameworks.base import imports_module
from tmpi_adapters.core.batches import batch_rows, cut_rows, local_rows
from tmpi_adapters.core.function import DistributedFunction
from tmpi_adapters.core.graph import ancestors, is_marker
from tmpi_adapters.frameworks.theano import TheanoAdapter

def blocks_missing_reason():
    """``None`` when Blocks imports here, else the reason it does not."""
    from tmpi_adapters.launch import compat
    compat.apply()  # Blocks needs the collections/getargspec shims to import at all
    try:
        import blocks  # noqa: F401
        import blocks.main_loop  # noqa: F401
    except ImportError as error:
        return str(error)
    return None


def _require_blocks():
    reason = blocks_missing_reason()
    if reason is not None:
        raise TmpiError(
            "the Blocks adapter needs Blocks, which is not importable here (%s). Blocks is not "
            "on PyPI: install it from its repository together with fuel==0.2.0, "
            "picklable-itertools, progressbar2 and toolz (docs/blocks.md), or pass the "
            "framework the script really uses (--framework theano)." % reason)


# ------------------------------------------------------------------ the model

def hierarchical_name(variable):
    """A Blocks parameter's path in its brick hierarchy (``/mlp/linear_0.W``),
    or its plain name for variables no brick owns."""
    from blocks.filter import get_brick
    brick = get_brick(variable)
    if brick is not None:
        return brick.get_hierarchical_name(variable)
    return variable.name


def _roles(variable):
    return [type(role).__name__ for role in getattr(variable.tag, "roles", [])]


class BlocksModel(ModelProtocol):
    """A :class:`~tmpi_adapters.core.protocol.ModelProtocol` named the Blocks way.

    Parameters are the ``GradientDescent``'s own shared variables (names and
    roles untouched); messages and signatures use their hierarchical names,
    step-rule buffers are named after the parameter they belong to
    (``/mlp/linear_0.W:velocity``).

    Attributes
    ----------
    names : list of str
        Hierarchical name of every state variable, in ``state_variables`` order.
    roles : dict
        ``{hierarchical name: [role class names]}`` of the parameters.
    """

    def __init__(self, params, optimizer_state=(), model_state=(), **kwargs):
        super().__init__(params, optimizer_state, model_state, **kwargs)
        self.names = [self._name(v, i) for i, v in enumerate(self.state_variables)]
        self.roles = {name: _roles(v) for name, v in zip(self.names, self.params)}

    @staticmethod
    def _name(variable, index):
        owner = getattr(variable.tag, "for_parameter", None)
        if owner is not None:
            return "%s:%s" % (hierarchical_name(owner), variable_name(variable, index))
        return hierarchical_name(variable) or variable_name(variable, index)

    def param_names(self):
        return self.names[:len(self.params)]

    def signature(self):
        rows = super().signature()
        return [(group, name, shape, dtype)
                for (group, _, shape, dtype), name in zip(rows, self.names)]


# ------------------------------------------------------------------ monitoring

#: One monitoring accumulator that holds this rank's share.  ``additive``:
#: ``acc <- acc + increment`` (Blocks' Mean); otherwise ``acc <- value``
#: (TakeLast).  ``extensive``: the increment is a sum over rows (a Mean whose
#: denominator depends on the data), otherwise a mean over rows.
Accumulator = namedtuple("Accumulator", "variable additive extensive")


def share_fraction(rows, weight):
    """What one rank's increment counts for: its share of a batch's rows."""
    return float(weight) / rows if rows else 0.0


def scale_share(old, new, fraction, counted, additive, extensive):
    """This rank's share of an accumulator after one batch.

    Parameters
    ----------
    old, new : numpy arrays
        The accumulator before and after this rank ran its rows.
    fraction : float
        This rank's rows over the batch's rows (0 for a padding row).
    counted : bool
        False when this rank ran only a padding row.
    additive, extensive : bool
        See :data:`Accumulator`.

    Returns
    -------
    numpy array
        The value whose sum over ranks equals what one process would hold.
    """
    factor = (1.0 if counted else 0.0) if extensive else fraction
    if additive:
        return old + (new - old) * factor
    return new * factor


def _has_data(expression, inputs):
    from theano.gof import Variable
    if not isinstance(expression, Variable):
        return False
    return bool(set(ancestors([expression])) & inputs)


def buffer_accumulators(buffer, loss_reduction="mean"):
    """The accumulators of a Blocks ``AggregationBuffer`` that depend on data.

    Returns ``(shares, local)``: scalar ``Mean``/``TakeLast`` accumulators whose
    values can be summed over ranks, and the data-dependent rest (minimum,
    maximum, concatenation, non-scalars) that stays per rank.  Accumulators
    that do not depend on data (batch counters, parameter norms) are in
    neither: they are identical on every rank.
    """
    from blocks.monitoring.aggregation import Mean, TakeLast
    from theano.compile.sharedvalue import SharedVariable
    inputs = set(buffer.inputs)
    updated = {id(var): expr for var, expr in buffer.accumulation_updates}
    owner = {}
    for variable in buffer.variables:
        scheme = variable.tag.aggregation_scheme
        readout = buffer.readout_variables[variable.name]
        for acc in ancestors([readout]):
            if isinstance(acc, SharedVariable) and id(acc) in updated:
                owner.setdefault(id(acc), scheme)
    shares, local = [], []
    for var, expr in buffer.accumulation_updates:
        if not _has_data(expr, inputs):
            continue
        scheme = owner.get(id(var))
        if isinstance(scheme, (Mean, TakeLast)) and var.ndim == 0:
            extensive = loss_reduction == "sum" or (
                isinstance(scheme, Mean) and _has_data(scheme.denominator, inputs))
            shares.append(Accumulator(var, isinstance(scheme, Mean), extensive))
        else:
            local.append(var)
    return shares, local


class MonitoringShares:
    """The accumulators of one buffer that hold per-rank shares.

    Each rank keeps its share between read-outs; :meth:`summed` lends the
    read-out the sum over ranks and gives every rank its share back.
    """

    def __init__(self, session, accumulators):
        self.session = session
        self.accumulators = list(accumulators)

    def __bool__(self):
        return bool(self.accumulators)

    def values(self):
        return [np.array(a.variable.get_value(), copy=True) for a in self.accumulators]

    def keep_share(self, old, fraction, counted):
        """Turn what the compiled function just wrote into this rank's share."""
        for acc, before in zip(self.accumulators, old):
            new = acc.variable.get_value(borrow=True)
            value = scale_share(before, new, fraction, counted, acc.additive, acc.extensive)
            acc.variable.set_value(np.asarray(value, dtype=before.dtype))

    @contextlib.contextmanager
    def summed(self):
        shares = self.values()
        totals = self.session.exchanger.allreduce(
            [np.asarray(s, dtype=np.float64) for s in shares], op="sum", precision="native")
        for acc, share, total in zip(self.accumulators, shares, totals):
            acc.variable.set_value(np.asarray(total, dtype=share.dtype))
        try:
            yield
        finally:
            for acc, share in zip(self.accumulators, shares):
                acc.variable.set_value(share)


# ------------------------------------------------------------------ functions

class BlocksTrainingFunction:
    """``GradientDescent``'s iteration function under tmpi.

    Calls the :class:`~tmpi_adapters.frameworks.theano.DistributedFunction`
    (which splits the batch and exchanges gradients) and keeps monitoring
    accumulators as this rank's share.  On the first call every rank checks
    that it was handed the same batch.  Pickles (Blocks' ``Checkpoint``) as a
    function that compiles itself again when first called after loading.
    """

    def __init__(self, adapter, algorithm, function, shares):
        self.adapter = adapter
        self.algorithm = algorithm
        self.function = function
        self.shares = shares
        self.calls = 0

    def __getattr__(self, name):
        return getattr(self.function, name)

    def __reduce__(self):
        return (LazyTrainingFunction, (self.algorithm,))

    def __call__(self, *args, **kwargs):
        session = self.adapter.session
        self.calls += 1
        if session.size == 1:
            return self.function(*args, **kwargs)
        if self.calls == 1:
            check_same_batch(session, args, kwargs)
        before = [s.values() for s in self.shares]
        self.adapter.last_samples = None
        result = self.function(*args, **kwargs)
        samples = self.adapter.last_samples
        if samples is not None:  # weak scaling runs a step only every N calls
            fraction = self._fraction(args, kwargs, samples)
            for shares, old in zip(self.shares, before):
                shares.keep_share(old, fraction, samples > 0)
        return result

    def _fraction(self, args, kwargs, samples):
        session = self.adapter.session
        if session.options.scaling == "weak":
            return 1.0 / session.size if samples > 0 else 0.0
        rows, _ = self.function.rows_of(args, kwargs)
        if rows is None:  # nothing to split: every rank ran the same call
            return 1.0 / session.size
        return share_fraction(rows, samples)


class LazyTrainingFunction:
    """What a pickled :class:`BlocksTrainingFunction` loads as: the algorithm's
    iteration function, compiled again (distributed or not) on first use."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def __call__(self, *args, **kwargs):
        self.algorithm.initialize()
        return self.algorithm._function(*args, **kwargs)


def _plain(function):
    return function


class SplitEvaluation:
    """A ``DatasetEvaluator``'s aggregation function that runs this rank's
    rows of each batch and keeps its accumulators as this rank's share."""

    def __init__(self, session, function, shares):
        self.session = session
        self.function = function
        self.shares = shares

    def __getattr__(self, name):
        return getattr(self.function, name)

    def __reduce__(self):
        return (_plain, (self.function,))

    def __call__(self, **batch):
        rows = batch_rows(batch.values())
        if rows is None:
            return self.function(**batch)
        lo, hi, weight = local_rows(rows, self.session.rank, self.session.size)
        local = cut_rows(batch, rows, lo, hi)
        before = self.shares.values()
        result = self.function(**local)
        self.shares.keep_share(before, share_fraction(rows, weight), weight > 0)
        return result


def batch_digest(args, kwargs):
    """A short fingerprint of a call's array arguments."""
    digest = hashlib.sha1()
    for value in list(args) + [kwargs[k] for k in sorted(kwargs)]:
        if isinstance(value, np.ndarray):
            digest.update(str((value.shape, value.dtype.str)).encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def check_same_batch(session, args, kwargs):
    """Every rank must be handed the same batch: tmpi splits it, not the stream."""
    digests = session.exchanger.allgather_object(batch_digest(args, kwargs))
    differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differing:
        raise TmpiError(
            "the first training batch differs between ranks (rank(s) %s differ from rank 0). "
            "Every rank must read the same batches from the Blocks data stream: tmpi gives "
            "each rank its share of every batch. Give the stream's iteration scheme a fixed "
            "rng (e.g. ShuffledScheme(n, batch_size, rng=numpy.random.RandomState(1))) that "
            "does not depend on the rank." % ", ".join(map(str, differing)))


# ------------------------------------------------------------------ the adapter

#: Extensions that only write (stdout, files): they run on rank 0 only.
_RANK_ZERO_ONLY = ("blocks.extensions.Printing", "blocks.extensions.ProgressBar",
                   "blocks.extensions.saveload.Checkpoint")


def _rank_zero_only_types():
    import importlib
    found = []
    for path in _RANK_ZERO_ONLY:
        module, name = path.rsplit(".", 1)
        found.append(getattr(importlib.import_module(module), name))
    return tuple(found)


def wants_finish(main_loop, level):
    """Whether Blocks' ``MainLoop._check_finish_training`` would stop here."""
    status = main_loop.status
    if main_loop.log.current_row.get("training_finish_requested", False):
        return True
    if status.get("batch_interrupt_received", False):
        return True
    return level == "epoch" and bool(status.get("epoch_interrupt_received", False))


class BlocksAdapter(TheanoAdapter):
    """Hooks Blocks on top of the plain-Theano adapter (see module docstring)."""

    name = "blocks"

    def __init__(self, session):
        super().__init__(session)
        self.main_loop = None
        #: rows of the latest training step on this rank (set by tmpi_after_step)
        self.last_samples = None
        self._shares = {}   # id(AggregationBuffer) -> (the buffer, its MonitoringShares)
        self._callbacks = {"after_training": [], "on_error": []}
        self._error = None  # (exception, its args) as Blocks' on_error saw them

    # -- installing -------------------------------------------------------------
    def install(self):
        _require_blocks()
        super().install()
        from blocks.algorithms import UpdatesAlgorithm
        from blocks.main_loop import MainLoop
        from blocks.monitoring.evaluators import AggregationBuffer, DatasetEvaluator
        self._rank_zero_only = _rank_zero_only_types()
        originals = {}

        def hook(owner, name, replacement):
            originals[(owner, name)] = getattr(owner, name)

            def method(obj, *args, **kwargs):
                return replacement(originals[(owner, name)], obj, *args, **kwargs)
            method.__name__ = name
            method.__doc__ = getattr(originals[(owner, name)], "__doc__", None)
            self.patcher.patch(owner, name, method)

        hook(MainLoop, "run", self._run)
        hook(MainLoop, "_run_extensions", self._run_extensions)
        hook(MainLoop, "_check_finish_training", self._check_finish_training)
        hook(UpdatesAlgorithm, "initialize", self._initialize)
        hook(AggregationBuffer, "get_aggregated_values", self._read_out)
        hook(DatasetEvaluator, "_compile", self._compile_evaluator)

    def on(self, callback, action):
        """Run ``action(*args)`` once every extension's ``callback`` has run."""
        self._callbacks[callback].append(action)

    # -- MainLoop ---------------------------------------------------------------
    def _run(self, original, main_loop):
        self.main_loop = main_loop
        try:
            return original(main_loop)
        except TmpiError as error:
            # Blocks re-raises errors with "Original exception: <itself>"
            # appended; tmpi's errors are one clear paragraph.
            if self._error is not None and self._error[0] is error:
                error.args = self._error[1]
            raise

    def _run_extensions(self, original, main_loop, method_name, *args):
        extensions = main_loop.extensions
        if self.session.rank != 0:
            main_loop.extensions = [e for e in extensions if not self.rank_zero_only(e)]
        try:
            original(main_loop, method_name, *args)
        finally:
            main_loop.extensions = extensions
        if str(method_name) == "on_error":
            self._error = (args[0], args[0].args)
        for action in self._callbacks.get(str(method_name), ()):
            action(*args)

    def rank_zero_only(self, extension):
        return (isinstance(extension, self._rank_zero_only)
                or bool(getattr(extension, "tmpi_rank_zero_only", False)))

    def _check_finish_training(self, original, main_loop, level):
        if self.session.size > 1:
            local = wants_finish(main_loop, level)
            anyone = self.session.exchanger.allreduce_scalars([float(local)], op="sum")[0]
            if anyone > 0 and not local:
                # Another rank stops here (FinishAfter, an interrupt): so does this one.
                main_loop.log.current_row["training_finish_requested"] = True
        return original(main_loop, level)

    # -- the training algorithm ----------------------------------------------------
    def _initialize(self, original, algorithm):
        from blocks.algorithms import GradientDescent
        if isinstance(algorithm, GradientDescent):
            mark_gradients(algorithm)
        original(algorithm)
        function = algorithm._function
        if isinstance(function, DistributedFunction):
            algorithm._function = self._distribute(algorithm, function)

    def _distribute(self, algorithm, function):
        session = self.session
        shares = []
        monitored = set()
        for buffer in self._training_buffers(algorithm):
            accumulators, _ = buffer_accumulators(buffer, session.options.loss_reduction)
            monitored.update(id(v) for v, _ in buffer.accumulation_updates)
            if accumulators and session.size > 1:
                shares.append(self._register(buffer, accumulators))
        previous = function.model
        model = self._blocks_model(algorithm, previous, monitored)
        model.train_fn = function
        function.model = model
        session.models = [model if m is previous else m for m in session.models]
        # Identical start now, so that monitoring before the first step
        # (DataStreamMonitoring's before_first_epoch) sees rank 0's parameters.
        session.synchronize(model)
        return BlocksTrainingFunction(self, algorithm, function, shares)

    def _training_buffers(self, algorithm):
        """AggregationBuffers whose accumulation updates the algorithm runs."""
        from blocks.monitoring.evaluators import AggregationBuffer
        if self.main_loop is None:
            return []
        updated = {id(var) for var, _ in algorithm.updates}
        buffers = []
        for extension in self.main_loop.extensions:
            for value in vars(extension).values():
                if (isinstance(value, AggregationBuffer) and value.accumulation_updates
                        and all(id(v) in updated for v, _ in value.accumulation_updates)):
                    buffers.append(value)
        return buffers

    def _register(self, buffer, accumulators):
        shares = MonitoringShares(self.session, accumulators)
        self._shares[id(buffer)] = (buffer, shares)
        return shares

    def _blocks_model(self, algorithm, model, monitored):
        params = list(getattr(algorithm, "parameters", None) or model.params)
        if {id(p) for p in params} != {id(p) for p in model.params}:
            params = model.params  # an UpdatesAlgorithm with its own updates
        keep = [v for v in model.optimizer_state if id(v) not in monitored]
        step_rule = [v for v, _ in getattr(algorithm, "step_rule_updates", [])]
        optimizer_state = ([v for v in step_rule if any(v is k for k in keep)]
                           + [v for v in keep if not any(v is s for s in step_rule)])
        model_state = [v for v in model.model_state if id(v) not in monitored]
        batch_size, n_batch_train, n_epochs = loop_shape(self.main_loop)
        return BlocksModel(params, optimizer_state, model_state, name=model.name,
                           batch_size=batch_size, n_batch_train=n_batch_train,
                           n_epochs=n_epochs)

    # -- monitoring -------------------------------------------------------------
    def _read_out(self, original, buffer):
        entry = self._shares.get(id(buffer))
        if entry is None or entry[0] is not buffer:
            return original(buffer)
        with entry[1].summed():
            return original(buffer)

    def _compile_evaluator(self, original, evaluator):
        original(evaluator)
        session = self.session
        function = getattr(evaluator, "_aggregate_fun", None)
        if session.size == 1 or function is None:
            return
        if evaluator.monitored_quantities or evaluator.updates:
            # Python-side quantities and extra updates see whole batches:
            # every rank evaluates the whole stream (identical results).
            return
        buffer = evaluator.theano_buffer
        accumulators, local = buffer_accumulators(buffer, session.options.loss_reduction)
        if local or not accumulators:
            return
        shares = self._register(buffer, accumulators)
        evaluator._aggregate_fun = SplitEvaluation(session, function, shares)


def loop_shape(main_loop):
    """``(batch_size, batches per epoch, epochs)`` as far as a main loop tells
    (its stream's batch scheme, its ``FinishAfter(after_n_epochs=...)``);
    ``None`` for what it does not."""
    from blocks.extensions import FinishAfter
    batch_size = n_batches = n_epochs = None
    stream = getattr(main_loop, "data_stream", None)
    while stream is not None and batch_size is None:
        scheme = getattr(stream, "iteration_scheme", None)
        size, indices = getattr(scheme, "batch_size", None), getattr(scheme, "indices", None)
        if isinstance(size, int) and size > 0 and indices is not None:
            batch_size, n_batches = size, -(-len(indices) // size)
        stream = getattr(stream, "data_stream", None)  # through Fuel's transformers
    for extension in getattr(main_loop, "extensions", ()):
        if isinstance(extension, FinishAfter):
            for _, predicate, _ in extension._conditions:
                if getattr(predicate, "condition", None) == "after_n_epochs":
                    n_epochs = predicate.num
    return batch_size, n_batches, n_epochs


def mark_gradients(algorithm):
    """Mark ``GradientDescent``'s gradients that were taken before tmpi ran.

    Under ``tmpi wrap`` ``theano.grad`` already marked them; a script that
    adds :class:`Distributed` took them unmarked.  The algorithm's updates
    are rebuilt on the marked gradients, in the order of its parameters.
    """
    import theano
    from tmpi_adapters.core.ops import GradientMarker
    replace = {}
    for parameter in algorithm.parameters:
        gradient = algorithm.gradients[parameter]
        if is_marker(gradient) and gradient.owner.op.wrt is parameter:
            continue
        # A marker that lost its parameter (unpickled from a checkpoint) is redone.
        base = gradient.owner.inputs[0] if is_marker(gradient) else gradient
        replace[gradient] = GradientMarker(parameter)(base)
    if not replace:
        return
    variables = [var for var, _ in algorithm.updates]
    rebuilt = theano.clone([expr for _, expr in algorithm.updates], replace=replace)
    algorithm.updates = list(zip(variables, rebuilt))
    for parameter in algorithm.parameters:
        gradient = algorithm.gradients[parameter]
        algorithm.gradients[parameter] = replace.get(gradient, gradient)


# ------------------------------------------------------------------ the extension

def extension_options(rule="bsp", rule_options=None, **options):
    """Check :class:`Distributed`'s arguments and turn them into run options.

    Raises :class:`~tmpi_adapters.errors.ConfigError` (or ``TmpiError``) for an
    unknown rule, a bad rule option, an unknown or bad run option.
    """
    import dataclasses

    from tmpi_adapters.options import Options, resolve_knobs
    from tmpi_adapters.pluginmanager import lookup
    if not isinstance(rule, str):
        raise ConfigError("Distributed(rule=...) must be a rule name such as 'bsp', not %r"
                          % (rule,))
    if rule_options is not None and not isinstance(rule_options, dict):
        raise ConfigError("Distributed(rule_options=...) must be a dict such as {'tau': 4}, "
                          "not %r" % (rule_options,))
    known = {f.name for f in dataclasses.fields(Options)} - {"rule", "rule_options", "extra",
                                                             "framework"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError("Distributed() got unknown option(s) %s. Its options: rule, "
                          "rule_options, %s." % (", ".join(unknown), ", ".join(sorted(known))))
    result = Options.from_env().replace(rule=rule, rule_options=dict(rule_options or {}),
                                        framework="blocks", **options)
    result.validate()
    rule_class = lookup("rules", rule)
    resolve_knobs(rule_class.name, rule_class.knobs, result.rule_options, _mpi_size_hint())
    if result.exchanger:
        lookup("exchangers", result.exchanger)
    return result


def _mpi_size_hint():
    """The job size from the launcher's environment (MPI is not started yet)."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


class Distributed:
    """A Blocks extension that trains the main loop's model on every MPI rank.

    Add it to an existing main loop and start the script with ``mpiexec -n N
    python script.py`` (or plain ``python``, for one rank)::

        import tmpi_adapters as tmpi   # before Blocks: applies the shims it needs

        main_loop = MainLoop(algorithm, stream, model=model, extensions=[
            FinishAfter(after_n_epochs=5), TrainingDataMonitoring(...),
            Printing(), tmpi.blocks.Distributed(rule="easgd")])

    Its ``before_training`` callback starts a tmpi session before Blocks
    compiles the training function; ``after_training`` ends it after every
    other extension.  Under ``tmpi wrap`` it joins the running session
    (options given on the command line win).  The class needs no Blocks to be
    created: Blocks calls extensions through ``dispatch``.

    Parameters
    ----------
    rule : str
        Synchronisation rule: ``"bsp"`` or an installed plugin's (``"easgd"``).
    rule_options : dict, optional
        The rule's knobs, e.g. ``{"alpha": 0.5, "tau": 4}``.
    **options
        Fields of :class:`tmpi_adapters.options.Options`: ``seed``,
        ``scaling``, ``precision``, ``exchanger``, ``stall_timeout``, ...
    name : str, optional
        The extension's name in ``main_loop.find_extension`` (``"Distributed"``).
    """

    def __init__(self, rule="bsp", rule_options=None, name=None, **options):
        self.name = name or type(self).__name__
        self.options = extension_options(rule, rule_options, **options)
        self.session = None
        self._owns_session = False
        self._main_loop = None

    # What Blocks expects of an extension -----------------------------------------
    @property
    def main_loop(self):
        if self._main_loop is None:
            raise ValueError("main loop must be assigned to extension first")
        return self._main_loop

    @main_loop.setter
    def main_loop(self, value):
        self._main_loop = value

    def dispatch(self, callback_name, *args):
        getattr(self, str(callback_name), self._ignore)(*args)

    def _ignore(self, *args):
        """Callbacks this extension has nothing to do in."""

    def __getstate__(self):
        # Blocks' Checkpoint pickles the main loop; the session is this process's.
        state = dict(self.__dict__)
        state.update(session=None, _owns_session=False)
        return state

    # Callbacks -----------------------------------------------------------------------
    def before_training(self):
        from tmpi_adapters.core.session import active_session
        session = active_session()
        if session is None:
            session = self._start_session()
        elif not isinstance(session.adapter, BlocksAdapter):
            raise ConfigError(
                "tmpi.blocks.Distributed runs inside a tmpi session for framework %r; run the "
                "script with --framework blocks (or without tmpi wrap)." % session.adapter.name)
        session.adapter.main_loop = self.main_loop
        self.session = session

    def _start_session(self):
        from tmpi_adapters.launch import runtime
        from tmpi_adapters.core.session import Session
        rank, size = runtime.mpi_rank_size()
        runtime.route_output(self.options, rank, size)
        session = Session(self.options, script=sys.argv[0] if sys.argv else None).start()
        self._owns_session = True
        session.adapter.on("after_training", self._finish)
        session.adapter.on("on_error", self._fail)
        return session

    def _finish(self):
        session, self.session = self.session, None
        if session is not None and session.started:
            session.finish()

    def _fail(self, error):
        from tmpi_adapters.launch import runtime
        session, self.session = self.session, None
        if session is None:
            return
        if session.size > 1 or isinstance(error, TmpiError):
            # Other ranks would wait for this one forever: end the whole job.
            runtime.end_after_failure(session, error, session.rank, session.size)
        # One process: Blocks re-raises the script's own exception itself.
        runtime.finish_after_failure(session, error)


# ------------------------------------------------------------------ plugin hooks

@hookimpl
def tmpi_frameworks():
    return {"blocks": BlocksAdapter}


@hookimpl(tryfirst=True)
def tmpi_detect_framework(source, path):
    if imports_module(source, "blocks"):
        return "blocks"
    return None


@hookimpl
def tmpi_after_step(session, model, step, samples):
    if isinstance(session.adapter, BlocksAdapter):
        session.adapter.last_samples = samples
