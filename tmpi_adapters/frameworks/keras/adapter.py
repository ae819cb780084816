"""The Keras 2.3.1 (Theano backend) adapter: distributes an unmodified Keras script.

Keras' Theano backend takes gradients with ``theano.grad`` and compiles with
``theano.function``, so the plain-Theano adapter this one extends already
turns a model's ``train_function`` into a
:class:`~tmpi_adapters.frameworks.theano.DistributedFunction` (batch split
across ranks, one fused gradient allreduce inside the graph).  This adapter
adds what Keras itself needs, hooked on Keras' classes while the script runs:

``Model._make_train_function``
    the model's own lists become the :class:`~tmpi_adapters.core.protocol.ModelProtocol`
    (``trainable_weights``, the optimizer's ``weights``, the updated
    ``non_trainable_weights`` such as BatchNorm statistics), and the compiled
    function is wrapped in a :class:`KerasStep` that keeps Keras' stateful
    metrics (running ``total``/``count`` sums) global: their per-step
    increments are summed over ranks instead of averaged.
``Model._make_test_function``
    evaluation (``evaluate``, validation in ``fit``) is split across ranks the
    same way (:class:`KerasEvaluation`); results are identical to one process.
``CallbackList.on_epoch_end``
    epoch logs are made identical on every rank (averaged when a rule lets the
    ranks' models differ) and ``stop_training`` is agreed, so ``EarlyStopping``
    and ``ReduceLROnPlateau`` act at the same epoch everywhere.
``save_model``, ``Network.save_weights``, ``CSVLogger``, ``RemoteMonitor``
    files and reports are written by rank 0 only; the other ranks wait until
    the file is complete, so a following ``load_model`` reads it whole.
``training_arrays.fit_loop``, ``training_generator.fit_generator``
    with ``--scaling weak`` each rank's ``fit`` sees its own shard (every N-th
    sample, or every N-th batch of a generator) and every call of the training
    function is one step on that rank's whole batch.  ``--lr-scaling`` then
    multiplies the optimizer's ``learning_rate`` inside the graph, which is
    linear scaling for every Keras optimizer, Adam included.

Nothing here imports Keras until the user's script does.
"""
import contextlib
import functools
import inspect
import numbers

import numpy as np

from tmpi_adapters.launch import compat
from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.core.protocol import write_values
from tmpi_adapters.frameworks.base import imports_module
from tmpi_adapters.core.batches import batch_rows, cut_rows, is_rows, local_rows
from tmpi_adapters.core.function import DistributedFunction
from tmpi_adapters.frameworks.theano import TheanoAdapter


class KerasAdapter(TheanoAdapter):
    """Hooks Keras on top of ``theano.grad``/``theano.function`` (see module docstring)."""

    name = "keras"

    def __init__(self, session):
        super().__init__(session)
        #: Keras models whose training function is distributed, in build order
        self.keras_models = []
        self._building = None      # the Model whose train function is compiling
        self._lr_scale = None      # its in-graph learning-rate factor, if any
        self._local_steps = 0      # > 0 while a weak-scaling fit runs on a shard
        self._installed = False

    # -- installing -------------------------------------------------------------
    def install(self):
        super().install()
        self._installed = True
        compat.when_imported("keras", self._hook_keras)

    def uninstall(self):
        self._installed = False
        super().uninstall()

    def _hook_keras(self, keras):
        """Patch Keras' classes once ``import keras`` has finished."""
        if not self._installed:
            return
        _check_keras(keras)
        self._patch_training()
        self._patch_writers()
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
        patch(training_arrays, "fit_loop", self._sharding_fit_loop(training_arrays.fit_loop))
        patch(training_generator, "fit_generator",
              self._sharding_fit_generator(training_generator.fit_generator))

    def _patch_writers(self):
        import keras.callbacks
        import keras.models
        from keras.engine import network, saving
        patch = self.patcher.patch
        # Network.save looks save_model up in keras.models at call time.
        save_model = self._on_rank_zero(saving.save_model, wait=True)
        patch(saving, "save_model", save_model)
        patch(keras.models, "save_model", save_model)
        patch(network.Network, "save_weights",
              self._on_rank_zero(network.Network.save_weights, wait=True))
        callbacks = keras.callbacks
        for cls, names in ((callbacks.CSVLogger, ("on_train_begin", "on_epoch_end",
                                                  "on_train_end")),
                           (callbacks.RemoteMonitor, ("on_epoch_end",))):
            for name in names:
                patch(cls, name, self._on_rank_zero(getattr(cls, name), wait=False))

    # -- rank 0 writes ---------------------------------------------------------------
    def _on_rank_zero(self, method, wait):
        """``method`` run by rank 0 only; with ``wait`` the other ranks return
        once rank 0 has finished (a file they may read next is complete)."""
        session = self.session

        @functools.wraps(method)
        def on_rank_zero(*args, **kwargs):
            if session.size == 1:
                return method(*args, **kwargs)
            result = method(*args, **kwargs) if session.rank == 0 else None
            if wait:
                session.exchanger.barrier(timeout=session.options.stall_timeout)
            return result
        return on_rank_zero

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
        from theano.gof.graph import ancestors
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

    def _adopt(self, model, lr_scale):
        """Fill the ModelProtocol from the Keras model and wrap its step."""
        keras_function = getattr(model, "train_function", None)
        distributed = getattr(keras_function, "function", None)
        if not isinstance(distributed, DistributedFunction):
            return
        protocol = distributed.model
        accumulators = _metric_variables(model)
        moved = [v for v in protocol.model_state if _contains(accumulators, v)]
        protocol.model_state = [v for v in protocol.model_state if not _contains(moved, v)]
        _reorder_like(protocol.params, getattr(model, "_collected_trainable_weights", []))
        _reorder_like(protocol.optimizer_state, getattr(model.optimizer, "weights", []))
        _reorder_like(protocol.model_state, model.non_trainable_weights)
        protocol.keras_model = model
        if lr_scale is not None:
            protocol.scales_learning_rate = True
        protocol.val_fn = getattr(model, "test_function", None)
        _decorrelate_random_streams(keras_function.outputs, self.session.rank)
        keras_function.function = KerasStep(self, distributed, moved, lr_scale)
        self.keras_models.append(model)

    @contextlib.contextmanager
    def local_steps(self):
        """While active, every training call is one step on this rank's whole batch."""
        self._local_steps += 1
        try:
            yield
        finally:
            self._local_steps -= 1

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
        if keras_function is None or getattr(model, "state_updates", None):
            # Stateful layers carry state from batch to batch: every rank must
            # see every row, so such models evaluate whole on every rank.
            return
        combine = [not hasattr(output, "_is_metric") for output in keras_function.outputs]
        keras_function.function = KerasEvaluation(
            self.session, keras_function.function, _metric_variables(model), combine)
        for protocol in self._protocols_of(model):
            protocol.val_fn = keras_function

    def _protocols_of(self, model):
        return [f.model for f in self.functions
                if getattr(f.model, "keras_model", None) is model]

    # -- weak scaling: each rank's fit sees its shard ---------------------------------
    def _weak(self):
        return self.session.options.scaling == "weak" and self.session.size > 1

    def _sharding_fit_loop(self, fit_loop):
        adapter = self
        signature = inspect.signature(fit_loop)

        @functools.wraps(fit_loop)
        def sharded_fit_loop(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            arguments = bound.arguments
            if not adapter._weak() or arguments.get("steps_per_epoch") is not None:
                adapter._describe_fit(arguments)
                return fit_loop(*args, **kwargs)
            session = adapter.session
            arguments["fit_inputs"] = shard_arrays(list(arguments["fit_inputs"]),
                                                   session.rank, session.size)
            adapter._describe_fit(arguments)
            with adapter.local_steps():
                return fit_loop(*bound.args, **bound.kwargs)
        return sharded_fit_loop

    def _sharding_fit_generator(self, fit_generator):
        adapter = self
        signature = inspect.signature(fit_generator)

        @functools.wraps(fit_generator)
        def sharded_fit_generator(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            arguments = bound.arguments
            if not adapter._weak():
                return fit_generator(*args, **kwargs)
            session = adapter.session
            generator, steps = shard_batches(arguments["generator"],
                                             arguments.get("steps_per_epoch"),
                                             session.rank, session.size)
            arguments["generator"] = generator
            arguments["steps_per_epoch"] = steps
            with adapter.local_steps():
                return fit_generator(*bound.args, **bound.kwargs)
        return sharded_fit_generator

    def _describe_fit(self, arguments):
        """What ``fit`` tells of batches and epochs, for the ModelProtocol."""
        rows = batch_rows(list(arguments.get("fit_inputs") or []))
        batch_size = arguments.get("batch_size")
        for protocol in self._protocols_of(arguments.get("model")):
            protocol.batch_size = batch_size
            protocol.n_epochs = arguments.get("epochs")
            if rows and batch_size:
                protocol.n_batch_train = -(-rows // batch_size)

    # -- end of run ---------------------------------------------------------------
    def check_finished(self):
        if self.functions:
            return
        raise TmpiError(
            "the script compiled %d Theano function(s) but trained no Keras model: tmpi "
            "distributes the training of a compiled Keras model (fit, fit_generator, "
            "train_on_batch) whose trainable_weights are not empty. Check that the script "
            "trains a model and that --framework matches the script."
            % self.session.functions_compiled)


# -- the training step ------------------------------------------------------------------

class KerasStep:
    """What a Keras ``train_function`` calls in place of its Theano function.

    One distributed training step (the
    :class:`~tmpi_adapters.frameworks.theano.DistributedFunction`), plus:
    Keras' metric accumulators (``total``/``count`` of ``Mean`` metrics) get
    the sum of every rank's increment, so the metric values Keras reads back
    after the call are those of the whole batch; and, with ``--lr-scaling``,
    the learning-rate factor for the coming step is set first.

    Parameters
    ----------
    adapter : KerasAdapter
    distributed : DistributedFunction
    accumulators : list of SharedVariable
        Metric state updated by the step (scalars, Keras' floatx).
    lr_scale : SharedVariable or None
        The in-graph factor of the optimizer's learning rate.
    """

    def __init__(self, adapter, distributed, accumulators, lr_scale=None):
        self.adapter = adapter
        self.session = adapter.session
        self.distributed = distributed
        self.accumulators = list(accumulators)
        self.lr_scale = lr_scale
        self._after_step = None   # accumulator values after the latest step

    def __getattr__(self, name):
        return getattr(self.distributed, name)

    def __repr__(self):
        return "<tmpi KerasStep %s>" % self.distributed.model.name

    def __call__(self, *args, **kwargs):
        session, distributed = self.session, self.distributed
        model = distributed.model
        if self.lr_scale is not None:
            factor = session.learning_rate_scale(model)
            self.lr_scale.set_value(np.asarray(factor, dtype=self.lr_scale.dtype))
        before = read_copies(self.accumulators) if session.size > 1 else None
        steps = model.step
        if self.adapter._local_steps:
            outputs = distributed.step_local(*args, **kwargs)
        else:
            outputs = distributed(*args, **kwargs)
        if before is None:
            return outputs
        if model.step != steps:
            sum_increments(self.accumulators, before, session.exchanger,
                           counts=bool(distributed.last_weight))
            self._after_step = read_copies(self.accumulators)
        elif self._after_step is not None and not any(np.any(b) for b in before):
            # A weak-scaling call that only handed this rank its batch returns
            # the latest step's outputs; after train_on_batch's metric reset
            # Keras would read 0/0 from the accumulators, so give it the
            # latest step's values too.
            write_values(self.accumulators, [a.copy() for a in self._after_step])
        return outputs


class KerasEvaluation:
    """A Keras ``test_function`` split across ranks like a training step.

    Each call's batch is cut into contiguous per-rank parts; the loss (and
    every other output that is not a stateful metric) is averaged weighted by
    rows, and metric accumulators get the sum of every rank's increment, all
    in one collective.  Keras then reads the metrics from the accumulators, so
    results equal the one-process evaluation.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    function : theano compiled function
    accumulators : list of SharedVariable
    combine : list of bool
        Per output: True to average it over ranks (Keras reads the others
        back from the accumulators).
    """

    def __init__(self, session, function, accumulators, combine):
        self.session = session
        self.fn = function
        self.accumulators = list(accumulators)
        self.combine = list(combine)

    def __getattr__(self, name):
        return getattr(self.fn, name)

    def __call__(self, *args):
        session = self.session
        rows = batch_rows(args)
        if rows is None:
            return self.fn(*args)
        lo, hi, weight = local_rows(rows, session.rank, session.size)
        local = cut_rows(args, rows, lo, hi)
        before = read_copies(self.accumulators)
        outputs = self.fn(*local)
        means = [float(o) for o, c in zip(outputs, self.combine) if c]
        totals = [np.asarray([weight * m for m in means] + [weight], dtype=np.float64)]
        totals += increments(self.accumulators, before, counts=weight > 0)
        reduced = session.exchanger.allreduce(totals, op="sum")
        write_sums(self.accumulators, before, reduced[1:])
        sums, count = reduced[0][:-1], reduced[0][-1]
        combined = iter(sums / count)
        return [np.asarray(next(combined), dtype=np.asarray(o).dtype) if c else o
                for o, c in zip(outputs, self.combine)]


# -- helpers (numpy in, numpy out) ---------------------------------------------------

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


def _metric_variables(model):
    """Shared variables of the model's stateful metrics (``total``, ``count``)."""
    found = []
    getter = getattr(model, "_get_training_eval_metrics", None)
    for metric in (getter() if getter else []):
        for variable in getattr(metric, "weights", []):
            if not _contains(found, variable):
                found.append(variable)
    return found


def _learning_rate_variable(optimizer):
    """The shared variable holding a Keras optimizer's learning rate, or None."""
    from theano.compile.sharedvalue import SharedVariable
    for name in ("learning_rate", "lr"):
        value = getattr(optimizer, name, None)
        if isinstance(value, SharedVariable):
            return value
    return None


def read_copies(variables):
    """Copies of the values of shared variables (list of numpy arrays)."""
    return [np.array(v.get_value(borrow=True), copy=True) for v in variables]


def increments(variables, before, counts=True):
    """Each variable's change since ``before``, as float64 (zeros unless ``counts``)."""
    result = []
    for variable, old in zip(variables, before):
        new = np.asarray(variable.get_value(borrow=True), dtype=np.float64)
        result.append(new - old if counts else np.zeros_like(new))
    return result


def write_sums(variables, before, summed):
    """``variable = before + summed increment``, in the variable's dtype."""
    for variable, old, delta in zip(variables, before, summed):
        variable.set_value(np.asarray(old + delta, dtype=old.dtype))


def sum_increments(variables, before, exchanger, counts=True):
    """Replace each rank's own increment of accumulators by the sum over ranks."""
    if not variables:
        return
    summed = exchanger.allreduce(increments(variables, before, counts), op="sum")
    write_sums(variables, before, summed)


def agree_logs(logs, exchanger):
    """Make a Keras ``logs`` dict identical on every rank (in place).

    Scalars that already agree are left untouched (so exact runs stay exact);
    otherwise each is replaced by its mean over ranks.
    """
    keys = sorted(k for k, v in logs.items() if _is_scalar(v))
    values = [float(logs[k]) for k in keys]
    gathered = exchanger.allgather_object((keys, values))
    if all(g == gathered[0] for g in gathered):
        return
    common = set(keys)
    for other_keys, _ in gathered:
        common &= set(other_keys)
    for key in sorted(common):
        mean = np.mean([vals[ks.index(key)] for ks, vals in gathered])
        old = logs[key]
        logs[key] = np.asarray(mean, dtype=old.dtype) if isinstance(old, np.ndarray) \
            else type(old)(mean)


def _is_scalar(value):
    if isinstance(value, (bool, np.bool_)):
        return False
    if isinstance(value, numbers.Real):
        return True
    return isinstance(value, np.ndarray) and value.size == 1 and value.dtype.kind in "fiu"


def shard_arrays(arrays, rank, size):
    """This rank's shard of ``fit``'s inputs: every ``size``-th sample from ``rank``.

    Every rank keeps ``rows // size`` samples (the last ``rows % size`` samples
    are left out) so that all ranks take the same number of steps per epoch.
    Arrays without the sample dimension (the learning-phase flag) pass through.
    """
    rows = batch_rows(arrays)
    if rows is None:
        return arrays
    keep = rows // size
    if keep == 0:
        raise ConfigError(
            "fit was given %d samples for %d ranks with --scaling weak: every rank needs "
            "at least one. Use fewer ranks (-n %d) or --scaling strong." % (rows, size,
                                                                            max(rows, 1)))
    return [a[rank::size][:keep] if is_rows(a, rows) else a for a in arrays]


def shard_batches(generator, steps_per_epoch, rank, size):
    """This rank's share of ``fit_generator``'s batches and its steps per epoch.

    A ``keras.utils.Sequence`` is indexed directly (batch ``i * size + rank``);
    a Python generator is read in full and every ``size``-th batch kept.
    """
    from keras.engine.training_utils import is_sequence
    sequence = is_sequence(generator)
    if steps_per_epoch is None and not sequence:
        return generator, steps_per_epoch  # Keras reports the missing argument
    total = steps_per_epoch if steps_per_epoch is not None else len(generator)
    if total // size == 0:
        raise ConfigError(
            "fit_generator has %d batches per epoch for %d ranks with --scaling weak: "
            "every rank needs at least one. Use fewer ranks or --scaling strong."
            % (total, size))
    if sequence:
        generator = _sharded_sequence(generator, rank, size)
    else:
        generator = _every_nth(generator, rank, size)
    # A Sequence without steps_per_epoch: Keras takes len() of the shard each epoch.
    return generator, (total // size if steps_per_epoch is not None else None)


def _every_nth(generator, rank, size):
    """Items ``rank, rank + size, ...`` of an iterator."""
    while True:
        kept = None
        for position in range(size):
            try:
                item = next(generator)
            except StopIteration:
                return
            if position == rank:
                kept = item
        yield kept


def _sharded_sequence(sequence, rank, size):
    from keras.utils import Sequence

    class ShardedSequence(Sequence):
        """Batches ``rank, rank + size, ...`` of a Keras ``Sequence``."""

        def __len__(self):
            return len(sequence) // size

        def __getitem__(self, index):
            return sequence[index * size + rank]

        def on_epoch_end(self):
            sequence.on_epoch_end()

    return ShardedSequence()


def _decorrelate_random_streams(outputs, rank):
    """Give each rank its own random numbers (dropout masks, noise).

    Every rank builds the same MRG random streams from the same seed, so
    without this rank r's i-th row would get the same dropout mask as rank 0's
    i-th row.  Rank r's streams jump ahead by r * 2**134 draws (MRG31k3p's own
    stream spacing); rank 0 keeps the one-process streams.
    """
    if rank == 0:
        return
    from theano.gof.graph import ancestors
    from theano.sandbox import rng_mrg
    seen = set()
    for variable in ancestors(list(outputs)):
        update = getattr(variable, "default_update", None)
        owner = getattr(update, "owner", None)
        if owner is None or not isinstance(owner.op, rng_mrg.mrg_uniform_base):
            continue
        if id(variable) in seen:
            continue
        seen.add(id(variable))
        variable.set_value(jump_streams(variable.get_value(), rank))


def jump_streams(states, times):
    """MRG31k3p states (int32, shape (n_streams, 6)) advanced ``times`` * 2**134 draws."""
    from theano.sandbox import rng_mrg
    states = np.array(states, dtype=np.int64, copy=True)
    for columns, jump, modulus in ((slice(0, 3), rng_mrg.A1p134, rng_mrg.M1),
                                   (slice(3, 6), rng_mrg.A2p134, rng_mrg.M2)):
        jump, modulus = np.asarray(jump, dtype=np.int64), np.int64(modulus)
        part = states[:, columns]
        for _ in range(times):
            # Row-wise jump @ state (mod m); every product stays below 2**62.
            part = ((part[:, None, :] * jump[None, :, :]) % modulus).sum(axis=2) % modulus
        states[:, columns] = part
    return states.astype(np.int32)


# -- plugin hooks ------------------------------------------------------------------

@hookimpl
def tmpi_frameworks():
    return {"keras": KerasAdapter}


@hookimpl(tryfirst=True)
def tmpi_detect_framework(source, path):
    if imports_module(source, "keras"):
        return "keras"
    return None
