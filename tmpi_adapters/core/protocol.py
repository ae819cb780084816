"""ModelProtocol: the one shape every framework adapter hands to the rules."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import numpy as np

from tmpi_adapters.errors import MismatchError
from tmpi_adapters.process.devices import is_device_array

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from tmpi_adapters.exchangers.base import Array

    #: A Theano shared variable (``theano.compile.SharedVariable``): Theano
    #: ships no types.
    SharedVariable = Any
    #: A :meth:`ModelProtocol.signature` row: ``(group, name, shape, dtype)``.
    SignatureRow = tuple[str, str, tuple[int, ...], str]


def variable_name(variable: SharedVariable, index: int) -> str:
    """A readable name for a shared variable (``param3`` when it has none)."""
    return variable.name or "param%d" % index


def read_values(variables: Iterable[SharedVariable]) -> list[Array]:
    """The numpy arrays behind shared variables, not copied (``borrow=True``);
    a variable on a GPU is copied to the host."""
    values = [v.get_value(borrow=True, return_internal_type=True) for v in variables]
    return [np.asarray(a) if is_device_array(a) else a for a in values]


def write_values(variables: Iterable[SharedVariable], arrays: Iterable[Array]) -> None:
    """Store arrays into shared variables without copying (``borrow=True``)."""
    for v, a in zip(variables, arrays):
        v.set_value(a, borrow=True)


class ModelProtocol:
    """What tmpi needs of a model, whatever framework built it.

    Adapters fill it with the user's own objects, never copies: the shared
    variables are the ones the user's graph reads and updates.  Every
    attribute below is read by tmpi; nothing else is.

    Parameters
    ----------
    params : list of theano SharedVariable
        Trainable parameters, in a fixed order that every rank shares.
    optimizer_state : list of SharedVariable
        State the optimizer updates from the (identical) gradients: momentum
        velocities, Adam moments, iteration counters.  Identical across ranks
        under gradient-exchange rules.
    model_state : list of SharedVariable
        Non-trainable state updated from each rank's data (BatchNorm moving
        statistics).  Gradient rules average it across ranks after each step.
    name
        Names the model's training function in messages, logs and checkpoints.
    train_fn
        One training iteration, ``train_fn(*batch) -> outputs`` (a
        :class:`~tmpi_adapters.core.function.DistributedFunction`): the session
        completes what its last calls left open when the script ends.
    n_batch_train, n_epochs
        What the adapter knows of the data loop: training steps per epoch (the
        ``epochs`` unit of ``--checkpoint-every``) and epochs (with the former,
        the length of the ``--progress`` bar).
    output_names
        A name for each value the training function returns (``None`` where
        unnamed): the columns of ``--record`` and the progress bar.
    gradient_names
        A name for each exchanged gradient, in exchange order, for messages
        about them (non-finite values); the parameters' names by default.
    scales_learning_rate
        True when the adapter applies ``--lr-scaling`` to the optimizer's
        learning rate itself (Keras, in the graph), so gradients are left alone.
    averaged_state : list of SharedVariable
        The part of ``model_state`` whose new values the training step itself
        averages (they travel in the step's one exchange); the rest is
        averaged after the step.

    Attributes
    ----------
    step : int
        Training steps taken so far (kept by the session).
    synchronized : bool
        Set once the identical start has been done.
    """

    def __init__(self, params: Iterable[SharedVariable],
                 optimizer_state: Iterable[SharedVariable] = (),
                 model_state: Iterable[SharedVariable] = (), name: str = "model",
                 train_fn: Callable[..., Any] | None = None, n_batch_train: int | None = None,
                 n_epochs: int | None = None,
                 output_names: Sequence[str | None] | None = None,
                 gradient_names: Sequence[str] | None = None, scales_learning_rate: bool = False,
                 averaged_state: Iterable[SharedVariable] = ()) -> None:
        self.params = list(params)
        self.optimizer_state = list(optimizer_state)
        self.model_state = list(model_state)
        self.name = name
        self.train_fn = train_fn
        self.n_batch_train = n_batch_train
        self.n_epochs = n_epochs
        self.output_names = output_names
        self.gradient_names = gradient_names
        self.scales_learning_rate = scales_learning_rate
        self.averaged_state = list(averaged_state)
        self.step = 0
        self.synchronized = False

    # -- names and signature -----------------------------------------------
    def param_names(self) -> list[str]:
        return [variable_name(v, i) for i, v in enumerate(self.params)]

    def exchanged_names(self, count: int) -> list[str]:
        """Names of ``count`` exchanged gradients: :attr:`gradient_names`, else
        the parameters' names, else their positions."""
        if self.gradient_names and len(self.gradient_names) == count:
            return list(self.gradient_names)
        if len(self.params) == count:
            return self.param_names()
        return ["gradient #%d" % i for i in range(count)]

    @property
    def state_variables(self) -> list[SharedVariable]:
        """Everything a checkpoint or an identical start must carry."""
        return self.params + self.optimizer_state + self.model_state

    def signature(self) -> list[SignatureRow]:
        """``[(group, name, shape, dtype), ...]`` for every state variable, in order."""
        rows: list[SignatureRow] = []
        for group, variables in (("param", self.params),
                                 ("optimizer state", self.optimizer_state),
                                 ("model state", self.model_state)):
            for i, v in enumerate(variables):
                value = v.get_value(borrow=True, return_internal_type=True)
                rows.append((group, variable_name(v, i), tuple(np.shape(value)),
                             str(np.dtype(value.dtype))))
        return rows

    # -- values ---------------------------------------------------------------
    def get_params(self) -> list[Array]:
        return read_values(self.params)

    def set_params(self, arrays: Iterable[Array]) -> None:
        write_values(self.params, arrays)

    def __repr__(self) -> str:
        return "<ModelProtocol %s: %d params, %d optimizer state, %d model state>" % (
            self.name, len(self.params), len(self.optimizer_state), len(self.model_state))


#: The counter Keras and Theano append to a name to keep it unique in their
#: process (``dense_2``, ``gru_1/kernel``): it counts what the process built
#: before, not what the variable is.
_COUNTER = re.compile(r"_\d+(?=/|$)")


def comparable(row: Sequence[Any]) -> SignatureRow:
    """A :meth:`ModelProtocol.signature` row as ranks and checkpoints compare
    it: the name without counters (``loss/gru_2/kernel`` reads
    ``loss/gru/kernel``), the shape, the dtype."""
    group, name, shape, dtype = row
    return group, _COUNTER.sub("", name), tuple(shape), dtype


def check_signatures(signatures: Sequence[Sequence[Sequence[Any]]],
                     rank_of: object = None) -> None:
    """Raise :class:`MismatchError` naming the first difference from rank 0.

    ``signatures`` is one :meth:`ModelProtocol.signature` per rank.  Names
    that differ only by counters (:func:`comparable`) are the same variable:
    something the process did before (a test of a suite that failed on one
    rank) may have advanced one rank's counters.
    """
    reference = [comparable(row) for row in signatures[0]]
    for rank, sig in enumerate(signatures[1:], start=1):
        if [comparable(row) for row in sig] == reference:
            continue
        for i, (a, b) in enumerate(zip(signatures[0], sig)):
            if comparable(a) != comparable(b):
                raise MismatchError(
                    "rank %d's model differs from rank 0's at %s #%d: rank 0 has %s %r "
                    "shape %s dtype %s, rank %d has %s %r shape %s dtype %s. Every rank must "
                    "build the same model in the same order (same script, same arguments, "
                    "same floatX)." % (rank, a[0], i, a[0], a[1], a[2], a[3], rank, b[0],
                                       b[1], b[2], b[3]))
        raise MismatchError(
            "rank %d's model has %d state variables, rank 0's has %d (first extra: %r). "
            "Every rank must build the same model." % (
                rank, len(sig), len(reference),
                (sig[len(reference)] if len(sig) > len(reference) else
                 signatures[0][len(sig)])[1]))


#: Elements of each variable a state digest reads (:func:`state_digest`).
DIGEST_SAMPLES = 256


def state_digest(variables: Sequence[SharedVariable]) -> tuple[int, tuple[list[str], list[float]]]:
    """A cheap digest of ``variables``' values, the same on every rank whose
    values are the same: ``(digest, (names, per-variable sums of magnitudes))``.

    It reads at most :data:`DIGEST_SAMPLES` evenly spaced elements of each
    variable (on a device, only those are copied to the host): microseconds
    per variable.  The digest rides in a step's envelope; the sums say which
    variable differs when the digests do.
    """
    import zlib
    digest, names, sums = 0, [], []
    for i, variable in enumerate(variables):
        value = variable.get_value(borrow=True, return_internal_type=True)
        flat = value.reshape((-1,)) if hasattr(value, "reshape") else np.asarray(value).reshape(-1)
        size = int(np.prod(getattr(value, "shape", ()), dtype=np.int64))
        step = max(1, size // DIGEST_SAMPLES)
        sample = np.ascontiguousarray(np.asarray(flat[step // 2::step][:DIGEST_SAMPLES]))
        digest = zlib.crc32(sample.tobytes(), digest)
        names.append(variable_name(variable, i))
        sums.append(float(np.sum(np.abs(sample), dtype=np.float64))
                    if sample.dtype.kind in "fiub" else 0.0)
    return digest & 0xFFFFFF, (names, sums)
