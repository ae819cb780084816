"""The Keras 2.3.1 (Theano backend) adapter: how a Keras script is hooked.

Keras' Theano backend takes gradients with ``theano.grad`` and compiles with
``theano.function``, so the plain-Theano adapter this one extends already
turns a model's ``train_function`` into a
:class:`~tmpi_adapters.core.function.DistributedFunction` (batch split
across ranks, one fused gradient allreduce inside the graph).  This adapter
adds what Keras itself needs, hooked on Keras' classes while the script runs:

``Model._make_train_function``
    the model's own lists become the :class:`~tmpi_adapters.core.protocol.ModelProtocol`
    (``trainable_weights``, the optimizer's ``weights``, the updated
    ``non_trainable_weights`` such as BatchNorm statistics), and the compiled
    function is wrapped in a :class:`~.step.KerasStep` that keeps Keras'
    stateful metrics (running ``total``/``count`` sums) global: each rank's
    increment becomes the one-process increment (:mod:`.metrics`: sums of
    per-row values and of batch sums are added, batch means averaged).
``Model._make_test_function``
    evaluation (``evaluate``, validation in ``fit``) is split across ranks the
    same way (:class:`~.step.KerasEvaluation`); results are identical to one
    process.
``CallbackList.on_epoch_end``
    epoch logs are made identical on every rank (averaged when a rule lets the
    ranks' models differ) and ``stop_training`` is agreed, so ``EarlyStopping``
    and ``ReduceLROnPlateau`` act at the same epoch everywhere.
``save_model``, ``Network.save_weights``, ``CSVLogger``, ``RemoteMonitor``
    files follow tmpi's rule for files (:mod:`.writers`): a path shared by the
    ranks is written once and every rank waits until it is complete, so a
    following ``load_model`` reads it whole; a rank's own path is written by
    that rank.  Reports go out from rank 0 only.
``training_generator``'s loops, enqueuers and ``iter_sequence_infinite``
    a generator or ``Sequence`` that feeds ``fit_generator``,
    ``evaluate_generator`` or ``predict_generator`` runs on rank 0 alone, which
    hands every batch to every rank (:mod:`.feeding`): the batches are those
    of one process, whatever the generator's worker threads did.
``training_arrays.fit_loop``, ``training_generator.fit_generator``
    with ``--scaling weak`` each rank's ``fit`` sees its own shard (every N-th
    sample, or every N-th batch of a generator: :mod:`.sharding`) and every
    call of the training function is one step on that rank's whole batch.
    ``--lr-scaling`` then multiplies the optimizer's ``learning_rate`` inside
    the graph, which is linear scaling for every Keras optimizer, Adam included.

Keras' random layers (``Dropout``, ``GaussianNoise``, ...) draw through
Theano's MRG streams, which draw for the whole batch and keep this rank's
rows (:mod:`tmpi_adapters.frameworks.random_streams`): the masks are the
one-process masks.  Nothing here imports Keras until the user's script does.
"""
import contextlib
import functools
import inspect

import numpy as np

from tmpi_adapters.core.batches import batch_rows
from tmpi_adapters.core.function import DistributedFunction, ObservedFunction
from tmpi_adapters.graphs import ancestors
from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.frameworks.keras import feeding
from tmpi_adapters.frameworks.keras.evaluation import rows_meet
from tmpi_adapters.frameworks.keras.metrics import metric_kinds, metric_variables
from tmpi_adapters.frameworks.keras.sharding import (shard_fit_arguments,
                                                     shard_generator_arguments)
from tmpi_adapters.frameworks.keras.step import KerasEvaluation, KerasStep, agree_logs
from tmpi_adapters.frameworks.keras.writers import patch_writers
from tmpi_adapters.frameworks.random_streams import random_rows
from tmpi_adapters.frameworks.theano import TheanoAdapter
from tmpi_adapters.process import compat


class KerasAdapter(TheanoAdapter):
    """Hooks Keras on top of ``theano.grad``/``theano.function`` (see module docstring)."""

    name = "keras"
    #: Keras' test function is split by the adapter itself (``KerasEvaluation``).
    split_evaluations = False

    def __init__(self, session):
        super().__init__(session)
        #: ``(Keras model, its ModelProtocol)`` for every distributed training
        #: function, in build order (a model may own several over a run)
        self.trained = []
        self._building = None      # the Model whose train function is compiling
        self._lr_scale = None      # its in-graph learning-rate factor, if any
        self._local_steps = 0      # > 0 while a weak-scaling fit runs on a shard
        self._installed = False
        #: the batches rank 0 draws from the script's generators for every rank
        self.feed = feeding.Feed(self)

    # -- installing -------------------------------------------------------------
    def install(self):
        super().install()
        self._installed = True
        self.session.recorder.notes.append(self.feed.note)
        compat.when_imported("keras", self._hook_keras)

    def uninstall(self):
        self._installed = False
        try:
            super().uninstall()
        finally:
            self.feed.close()

    def _hook_keras(self, keras):
        """Patch Keras' classes once ``import keras`` has finished."""
        if not self._installed:
            return
        _check_keras(keras)
        self._patch_training()
        patch_writers(self)
        callbacks = keras.callbacks
        self.patcher.patch(callbacks.CallbackList, "on_epoch_end",
                           self._agreeing_epoch_end(callbacks.CallbackList.on_epoch_end))

    def _patch_training(self):
        from keras.engine import training, training_arrays, training_generator
        patch, model_cls = self.patcher.patch, training.Model
        patch(model_cls, "_make_train_function",
              self._making_train_function(model_cls._make_train_function))
        patch(model_cls, "_make_test_function",
              self._making_test_function(model_cls._make_test_function))
        patch(training_arrays, "fit_loop",
              self._sharding(training_arrays.fit_loop, shard_fit_arguments))
        feed = self.feed
        patch(training_generator, "fit_generator", self._sharding(
            feeding.fed_loop(feed, training_generator.fit_generator, "fit_generator"),
            shard_generator_arguments))
        for name in ("evaluate_generator", "predict_generator"):
            patch(training_generator, name,
                  feeding.fed_loop(feed, getattr(training_generator, name), name))
        for name in ("GeneratorEnqueuer", "OrderedEnqueuer"):
            patch(training_generator, name,
                  feeding.enqueuer(feed, getattr(training_generator, name)))
        patch(training_generator, "iter_sequence_infinite", feeding.iterate_sequence(
            feed, training_generator.iter_sequence_infinite))

    # -- callbacks see the same logs on every rank ---------------------------------------
    def _agreeing_epoch_end(self, on_epoch_end):
        session = self.session

        @functools.wraps(on_epoch_end)
        def agreeing_epoch_end(callbacks, epoch, logs=None):
            if session.size == 1:
                return on_epoch_end(callbacks, epoch, logs)
            if logs is not None:
                agree_logs(logs, session.exchanger)
            result = on_epoch_end(callbacks, epoch, logs)
            model = getattr(callbacks, "model", None)
            if model is not None:
                # A rank-local reason to stop (a user callback reading its own
                # files) must stop every rank, or the others wait forever.
                votes = session.exchanger.allgather_object(
                    bool(getattr(model, "stop_training", False)))
                model.stop_training = any(votes)
            return result
        return agreeing_epoch_end

    # -- the training function -----------------------------------------------------
    def _making_train_function(self, make_train_function):
        adapter = self

        @functools.wraps(make_train_function)
        def _make_train_function(model):
            if getattr(model, "train_function", None) is not None:
                return make_train_function(model)
            adapter._building, adapter._lr_scale = model, None
            try:
                result = make_train_function(model)
            finally:
                adapter._building = None
            adapter._adopt(model, adapter._lr_scale)
            return result
        return _make_train_function

    def function(self, *args, **kwargs):
        """``theano.function``; while a Keras train function compiles, with
        ``--lr-scaling`` the optimizer's learning rate is scaled in the graph."""
        model = self._building
        if model is not None and self._scales_learning_rate():
            learning_rate = _learning_rate_variable(getattr(model, "optimizer", None))
            if learning_rate is not None:
                args, kwargs, scale = self._scaled_learning_rate(learning_rate, args, kwargs)
                if scale is not None:
                    self._lr_scale = scale
        return super().function(*args, **kwargs)

    def _scales_learning_rate(self):
        options = self.session.options
        return options.scaling == "weak" and options.lr_scaling and self.session.size > 1

    def _scaled_learning_rate(self, learning_rate, args, kwargs):
        """The call's arguments with ``learning_rate`` replaced by
        ``learning_rate * scale`` in outputs and updates; ``scale`` is a new
        shared scalar (``None`` when the graph does not use the rate)."""
        import theano
        bound = self._signature.bind(*args, **kwargs)
        arguments = dict(bound.arguments)
        outputs = arguments.get("outputs")
        updates = arguments.get("updates")
        pairs = list(updates.items()) if hasattr(updates, "items") else list(updates or [])
        single = outputs is not None and not isinstance(outputs, (list, tuple))
        output_list = [] if outputs is None else ([outputs] if single else list(outputs))
        graph = output_list + [expr for _, expr in pairs]
        if not any(v is learning_rate for v in ancestors(graph)):
            return args, kwargs, None
        scale = theano.shared(np.asarray(1.0, dtype=learning_rate.dtype),
                              name="tmpi_learning_rate_scale")
        cloned = theano.clone(graph, replace={learning_rate: learning_rate * scale})
        new_outputs = cloned[:len(output_list)]
        if outputs is not None:
            arguments["outputs"] = new_outputs[0] if single else type(outputs)(new_outputs)
        arguments["updates"] = [(var, expr) for (var, _), expr in
                                zip(pairs, cloned[len(output_list):])]
        inputs = arguments.pop("inputs")
        return (inputs,), arguments, scale

    def accumulators(self, update_pairs):
        """The stateful metrics' sums (``total``/``count``) among the variables
        a compiling Keras train function updates whose increments add up over
        ranks (per-row values, batch sums): its exchange adds every rank's
        increment.  The others (batch means, counts of batches) stay model
        state, whose new values the exchange averages: so Keras reads the
        whole batch's metrics."""
        if self._building is None:
            return []
        kinds = metric_kinds(self._building)
        return [var for var, _ in update_pairs if kinds.get(id(var)) == "sum"]

    def batch_variables(self, inputs, outputs, updates):
        """``compile(target_tensors=[K.variable(...)])``: the targets of a
        compiling Keras train function that are shared variables carry the
        batch, and are split across ranks like the inputs."""
        return _shared_targets(self._building) if self._building is not None else []

    def _adopt(self, model, lr_scale):
        """Fill the ModelProtocol from the Keras model and wrap its step."""
        keras_function = getattr(model, "train_function", None)
        distributed = getattr(keras_function, "function", None)
        if not isinstance(distributed, DistributedFunction):
            return
        protocol = distributed.model
        accumulators = metric_variables(model)
        # Metric sums are not model state for a rule to average: the step's
        # own exchange combines them where it carried them (:meth:`accumulators`),
        # else the KerasStep does after the call.
        moved = [v for v in protocol.model_state if _contains(accumulators, v)]
        in_step = [v for v in moved if _contains(protocol.averaged_state, v)]
        protocol.model_state = [v for v in protocol.model_state if not _contains(moved, v)]
        protocol.averaged_state = [v for v in protocol.averaged_state
                                   if not _contains(moved, v)]
        _reorder_like(protocol.params, getattr(model, "_collected_trainable_weights", []))
        _reorder_like(protocol.optimizer_state, getattr(model.optimizer, "weights", []))
        _reorder_like(protocol.model_state, model.non_trainable_weights)
        protocol.scales_learning_rate = lr_scale is not None
        # The step returns the loss and metrics Keras names ("loss", "acc").
        names = list(getattr(model, "metrics_names", None) or [])
        if names and len(names) == len(protocol.output_names or names):
            protocol.output_names = names
        kinds = metric_kinds(model)
        keras_function.function = KerasStep(self, distributed, moved,
                                            [kinds.get(id(v), "sum") for v in moved],
                                            lr_scale, carried=in_step)
        self.trained.append((model, protocol))

    @contextlib.contextmanager
    def local_steps(self):
        """While active, every training call is one step on this rank's whole batch."""
        self._local_steps += 1
        try:
            yield
        finally:
            self._local_steps -= 1

    @property
    def stepping_locally(self):
        """True while :meth:`local_steps` is active."""
        return self._local_steps > 0

    # -- evaluation -----------------------------------------------------------------
    def _making_test_function(self, make_test_function):
        adapter = self

        @functools.wraps(make_test_function)
        def _make_test_function(model):
            fresh = getattr(model, "test_function", None) is None
            result = make_test_function(model)
            if fresh and adapter.session.size > 1:
                adapter._split_evaluation(model)
            return result
        return _make_test_function

    def _split_evaluation(self, model):
        keras_function = getattr(model, "test_function", None)
        if keras_function is None or getattr(model, "state_updates", None) or \
                _shared_targets(model):
            # Stateful layers carry state from batch to batch, and targets
            # held in shared variables are whole in the test function's
            # graph: every rank must see every row, so such models evaluate
            # whole on every rank.
            return
        combine = [not hasattr(output, "_is_metric") for output in keras_function.outputs]
        function = keras_function.function
        observed = isinstance(function, ObservedFunction)
        compiled = function._tmpi_fn if observed else function
        meet = rows_meet(model, keras_function, compiled)
        if meet:
            # Rows meet in the loss or a metric (a layer centring the batch, a
            # correlation over it): no rank's share gives its part of the
            # one-process value, so every rank evaluates the whole batch.
            self.session.print(
                "tmpi: note: %s evaluates whole on every rank: rows of the batch meet in %s."
                % (getattr(model, "name", "the model"), meet))
            return
        accumulators, kinds = metric_variables(model), metric_kinds(model)
        rows = random_rows(self)
        window = rows.window if rows is not None and rows.window.used_by(compiled) else None
        evaluation = KerasEvaluation(self.session, compiled, accumulators,
                                     [kinds.get(id(v), "sum") for v in accumulators],
                                     combine, window)
        # The tmpi_call hook sees the whole batch, the same on every rank (a
        # resume compares its fingerprint), and the split happens inside.
        keras_function.function = ObservedFunction(
            self.session, evaluation, function.key, function.has_updates) if observed \
            else evaluation

    # -- weak scaling: each rank's fit sees its shard ---------------------------------
    def _weak(self):
        return self.session.options.scaling == "weak" and self.session.size > 1

    def _sharding(self, fit, shard):
        """Keras' ``fit`` (``fit_loop`` or ``fit_generator``), which under weak
        scaling runs on this rank's shard: ``shard(arguments, rank, size)``
        rewrites its bound arguments (False: leave the call whole), and every
        training call inside is one step on this rank's whole batch."""
        adapter = self
        signature = inspect.signature(fit)

        @functools.wraps(fit)
        def sharded_fit(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            session = adapter.session
            local = adapter._weak() and shard(bound.arguments, session.rank, session.size)
            adapter._describe_fit(bound.arguments)
            if not local:
                return fit(*args, **kwargs)
            with adapter.local_steps():
                return fit(*bound.args, **bound.kwargs)
        return sharded_fit

    def _describe_fit(self, arguments):
        """What ``fit`` tells of its steps and epochs, for the model's
        :class:`~tmpi_adapters.core.protocol.ModelProtocol` (``fit_generator``
        compiles the training function inside, so its first call tells nothing)."""
        steps = arguments.get("steps_per_epoch")
        if steps is None:
            rows = batch_rows(list(arguments.get("fit_inputs") or []))
            batch_size = arguments.get("batch_size")
            steps = -(-rows // batch_size) if rows and batch_size else None
        model = arguments.get("model")
        for protocol in [p for m, p in self.trained if m is model]:
            protocol.n_epochs = arguments.get("epochs")
            if steps:
                protocol.n_batch_train = steps

    # -- end of run ---------------------------------------------------------------
    def check_finished(self):
        if self.functions:
            return
        self.warn_trained_nothing(
            "the script compiled %d Theano function(s) but trained no Keras model, so "
            "nothing was distributed: tmpi distributes the training of a compiled Keras "
            "model (fit, fit_generator, train_on_batch) whose trainable_weights are not "
            "empty. If the script should train, check that it trains a model and that "
            "--framework matches the script." % self.session.functions_compiled)


# -- reading Keras models ----------------------------------------------------------------

def _check_keras(keras):
    """A clear error for a Keras tmpi cannot distribute."""
    from keras import backend as K
    version = getattr(keras, "__version__", "?")
    if tuple(int(p) for p in version.split(".")[:2] if p.isdigit()) < (2, 2):
        raise ConfigError("tmpi's Keras adapter needs Keras 2.2 or 2.3 (2.3.1 is the last "
                          "with a Theano backend); found Keras %s." % version)
    if K.backend() != "theano":
        raise ConfigError(
            "Keras is using its %r backend; tmpi distributes Keras' Theano backend. "
            "Set KERAS_BACKEND=theano (or \"backend\": \"theano\" in ~/.keras/keras.json)."
            % K.backend())


def _contains(variables, variable):
    return any(v is variable for v in variables)


def _reorder_like(variables, reference):
    """Put ``variables`` (a list, changed in place) in ``reference``'s order
    when both hold the same objects; leave it alone otherwise."""
    ids = {id(v) for v in variables}
    ordered = [v for v in reference if id(v) in ids]
    if len(ordered) == len(variables) and len({id(v) for v in ordered}) == len(ids):
        variables[:] = ordered


def _shared_targets(model):
    """The model's targets given as shared variables (``target_tensors``)."""
    from theano.compile.sharedvalue import SharedVariable
    return [t for t in getattr(model, "targets", None) or [] if isinstance(t, SharedVariable)]


def _learning_rate_variable(optimizer):
    """The shared variable holding a Keras optimizer's learning rate, or None."""
    from theano.compile.sharedvalue import SharedVariable
    for name in ("learning_rate", "lr"):
        value = getattr(optimizer, name, None)
        if isinstance(value, SharedVariable):
            return value
    return None

