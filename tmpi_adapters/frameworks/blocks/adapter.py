"""The Blocks adapter: how Blocks' MainLoop and GradientDescent are hooked.

Two ways in, one machinery:

``tmpi wrap --framework blocks script.py``
    the script runs unmodified.  Everything the plain-Theano adapter does
    (marked gradients, training functions that split each batch by rows and
    exchange gradients in-graph) applies, and Blocks itself is hooked where
    it decides things.
``extensions=[..., tmpi.blocks.Distributed(rule="bsp")]``
    the extension (:mod:`.extension`) starts the session in its
    ``before_training`` callback, which Blocks' ``MainLoop.run`` calls *before*
    ``algorithm.initialize()`` compiles the training function, so the same
    hooks are in place in time.

What is hooked, and why:

``UpdatesAlgorithm.initialize``
    gradients that were taken before tmpi was running (the extension's case)
    are marked first; after Theano compiled the iteration function, the
    model is named from the Blocks bricks (:mod:`.model`: hierarchical names
    such as ``/mlp/linear_0.W``, roles kept), step-rule buffers are optimizer
    state, and every rank starts from rank 0's values before any monitoring
    runs.
``AggregationBuffer.get_aggregated_values`` and ``DatasetEvaluator._compile``
    monitoring accumulators hold this rank's share of each batch
    (``TrainingDataMonitoring`` on training batches, ``DataStreamMonitoring``
    on its own stream, which is split across ranks too: :mod:`.functions`); a
    read-out sums the shares over ranks (:mod:`.monitoring`), so logged values
    equal the one-process values.
``MainLoop._check_finish_training``
    ranks agree on stopping after every batch and epoch (``FinishAfter``, an
    interrupt on one rank, a custom extension): all stop at the same step.
``MainLoop._run_extensions``
    ``Printing`` and ``ProgressBar`` (and any extension with
    ``tmpi_rank_zero_only = True``) run on rank 0 only.
``blocks.extensions.saveload.secure_dump``
    ``Checkpoint`` runs on every rank and writes under tmpi's rule for files
    (:mod:`tmpi_adapters.frameworks.writes`): a path the ranks share is
    written once and every rank goes on once it is complete; a rank's own
    path is written by that rank.

Nothing here imports Blocks until a session actually uses this adapter.
"""
import importlib
import sys

from tmpi_adapters.core.function import DistributedFunction
from tmpi_adapters.graphs import is_marker
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.frameworks.blocks.functions import BlocksTrainingFunction, SplitEvaluation
from tmpi_adapters.frameworks.blocks.model import BlocksModel, loop_shape
from tmpi_adapters.frameworks.blocks.monitoring import (MonitoringShares, buffer_accumulators,
                                                        buffer_layout, channels_of)
from tmpi_adapters.frameworks.theano import TheanoAdapter
from tmpi_adapters.frameworks.writes import is_path
from tmpi_adapters.process import compat
from tmpi_adapters.pluginmanager import hookimpl


def blocks_missing_reason():
    """``None`` when Blocks imports here, else the reason it does not."""
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


#: Extensions that only print: they run on rank 0 only.
_RANK_ZERO_ONLY = ("blocks.extensions.Printing", "blocks.extensions.ProgressBar")


def _rank_zero_only_types():
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
        self._monitored = set()  # ids of the training monitors' accumulators

    # -- installing -------------------------------------------------------------
    def install(self):
        _require_blocks()
        super().install()
        # Told of this session's steps only, not every framework's.
        self.session.pm.register(self)
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
        self._write_checkpoints_once()

    def uninstall(self):
        if self.session.pm.is_registered(self):
            self.session.pm.unregister(self)
        super().uninstall()

    @hookimpl
    def tmpi_after_step(self, session, model, step, samples):
        """The rows of the step just taken (the monitoring shares need them)."""
        if session is self.session:
            self.last_samples = samples

    def _write_checkpoints_once(self):
        """Blocks' ``Checkpoint`` dumps under tmpi's rule for files."""
        files = self.transparency.files
        if files is None:
            return
        from blocks.extensions import saveload
        original = saveload.secure_dump

        def secure_dump(object_, path, *args, **kwargs):
            def dump():
                return original(object_, path, *args, **kwargs)
            return files.call("Blocks Checkpoint", [path], dump) if is_path(path) else dump()
        self.patcher.patch(saveload, "secure_dump", secure_dump)

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
            # The cost's divisions name the batch axis (gradients taken
            # before tmpi ran were not seen by the theano.grad hook).
            self.remember_cost(getattr(algorithm, "cost", None),
                               list(algorithm.gradients.values()))
        # Monitoring accumulators are shares kept per rank (monitoring.py),
        # not model state: the step's exchange must not average them.
        self._monitored = {id(v) for buffer in self._training_buffers(algorithm)
                           for v, _ in buffer.accumulation_updates}
        original(algorithm)
        function = algorithm._function
        if isinstance(function, DistributedFunction):
            algorithm._function = self._distribute(algorithm, function)

    def make_model(self, key, params, optimizer_state, model_state, graph, data):
        model_state = [v for v in model_state if id(v) not in self._monitored]
        return super().make_model(key, params, optimizer_state, model_state, graph, data)

    def _distribute(self, algorithm, function):
        session = self.session
        shares = []
        monitored = set()
        for buffer in self._training_buffers(algorithm):
            monitored.update(id(v) for v, _ in buffer.accumulation_updates)
            if session.size > 1:
                accumulators, local = buffer_accumulators(buffer,
                                                          session.options.loss_reduction)
                if accumulators:
                    shares.append(self._register(buffer, accumulators))
                if local:
                    names = channels_of(buffer, local)
                    session.print(
                        "tmpi: warning: the training monitoring channel(s) %s are rank 0's "
                        "own values, computed from its rows only: tmpi cannot tell from their "
                        "graphs how they combine over ranks (a non-scalar, a value of an op "
                        "tmpi does not read). Monitor them with DataStreamMonitoring, which "
                        "gives the one-process values." % ", ".join(names), file=sys.stderr)
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
        n_batch_train, n_epochs = loop_shape(self.main_loop)
        return BlocksModel(params, optimizer_state, model_state, name=model.name,
                           n_batch_train=n_batch_train, n_epochs=n_epochs)

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
        layout = buffer_layout(buffer)
        if layout[0].problem:
            return  # the batch axis cannot be told: every rank evaluates the whole stream
        accumulators, local = buffer_accumulators(buffer, session.options.loss_reduction,
                                                  layout)
        if local or not accumulators:
            return
        shares = self._register(buffer, accumulators)
        axes = {v.name: layout[0].axis(v) for v in buffer.inputs if v.name}
        evaluator._aggregate_fun = SplitEvaluation(session, function, shares, axes)


def mark_gradients(algorithm):
    """Mark ``GradientDescent``'s gradients that were taken before tmpi ran.

    Under ``tmpi wrap`` ``theano.grad`` already marked them; a script that
    adds :class:`~.extension.Distributed` took them unmarked.  The algorithm's
    updates are rebuilt on the marked gradients, in the order of its parameters.
    """
    import theano
    from tmpi_adapters.graphs.gradient import GradientMarker
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
