"""ModelProtocol: the one shape every framework adapter hands to the rules."""
import numpy as np

from .errors import MismatchError


def variable_name(variable, index):
    """A readable name for a shared variable (``param3`` when it has none)."""
    return variable.name or "param%d" % index


def read_values(variables):
    """The numpy arrays behind shared variables, not copied (``borrow=True``)."""
    return [v.get_value(borrow=True, return_internal_type=True) for v in variables]


def write_values(variables, arrays):
    """Store arrays into shared variables without copying (``borrow=True``)."""
    for v, a in zip(variables, arrays):
        v.set_value(a, borrow=True)


class ModelProtocol:
    """What tmpi needs of a model, whatever framework built it.

    Adapters fill it with the user's own objects, never copies: the shared
    variables are the ones the user's graph reads and updates.

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
        statistics).  Rules average it across ranks after each step.
    train_fn : callable
        One training iteration: ``train_fn(*batch) -> outputs``.
    val_fn : callable, optional
        One validation iteration.
    name : str
        Shown in messages (e.g. the function name the script gave Theano).
    n_batch_train, n_batch_val, batch_size, n_epochs : int, optional
        What the adapter knows of the data loop.
    """

    def __init__(self, params, optimizer_state=(), model_state=(), train_fn=None,
                 val_fn=None, name="model", n_batch_train=None, n_batch_val=None,
                 batch_size=None, n_epochs=None):
        self.params = list(params)
        self.optimizer_state = list(optimizer_state)
        self.model_state = list(model_state)
        self.train_fn = train_fn
        self.val_fn = val_fn
        self.name = name
        self.n_batch_train = n_batch_train
        self.n_batch_val = n_batch_val
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        #: training steps taken so far (updated by the session)
        self.step = 0
        #: set once the identical start has been done
        self.synchronized = False

    # -- names and signature -----------------------------------------------
    def param_names(self):
        return [variable_name(v, i) for i, v in enumerate(self.params)]

    @property
    def state_variables(self):
        """Everything a checkpoint or an identical start must carry."""
        return self.params + self.optimizer_state + self.model_state

    def signature(self):
        """``[(group, name, shape, dtype), ...]`` for every state variable, in order."""
        rows = []
        for group, variables in (("param", self.params),
                                 ("optimizer state", self.optimizer_state),
                                 ("model state", self.model_state)):
            for i, v in enumerate(variables):
                value = v.get_value(borrow=True, return_internal_type=True)
                rows.append((group, variable_name(v, i), tuple(np.shape(value)),
                             str(np.asarray(value).dtype)))
        return rows

    # -- values ---------------------------------------------------------------
    def get_params(self):
        return read_values(self.params)

    def set_params(self, arrays):
        write_values(self.params, arrays)

    def __repr__(self):
        return "<ModelProtocol %s: %d params, %d optimizer state, %d model state>" % (
            self.name, len(self.params), len(self.optimizer_state), len(self.model_state))


def check_signatures(signatures, rank_of=None):
    """Raise :class:`MismatchError` naming the first difference from rank 0.

    ``signatures`` is one :meth:`ModelProtocol.signature` per rank.
    """
    reference = signatures[0]
    for rank, sig in enumerate(signatures[1:], start=1):
        if sig == reference:
            continue
        for i, (a, b) in enumerate(zip(reference, sig)):
            if a != b:
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
                (sig[len(reference)] if len(sig) > len(reference) else reference[len(sig)])[1]))
