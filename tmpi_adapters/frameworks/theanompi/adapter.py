"""The Theano-MPI adapter: ModelClass files written to Theano-MPI's contract.

Theano-MPI models compile their own iteration functions
(``compile_iter_fns``) and feed them their own shard of the data
(``data[rank::size]``), so the training functions compiled inside are
distributed as they are — whole local batches, gradients averaged weighted by
rows (a global batch of N x B) — instead of splitting each batch.

The model contract accepted (both of Theano-MPI's generations):

``params``            list of Theano shared variables (trainable)
``data``              has ``n_batch_train`` and ``n_batch_val``
``compile_iter_fns``  ``()`` or ``(sync_type=...)``
``train_iter``        ``()`` or ``(count, recorder)``
``val_iter``          ``()`` or ``(count, recorder)``; may return ``"stop"``
``adjust_hyperp``     ``(epoch)``
``cleanup``           ``()``
constructor           ``()`` or ``(config)`` with ``rank``, ``size``, ``verbose``

Optional: ``n_epochs``, ``n_subb``, ``reset_iter(mode)``, ``print_info``.
"""
import inspect

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.frameworks.theano import TheanoAdapter

REQUIRED_METHODS = ("compile_iter_fns", "train_iter", "val_iter", "adjust_hyperp", "cleanup")


class TheanoMPIAdapter(TheanoAdapter):
    """Distributes the functions a Theano-MPI ModelClass compiles."""

    name = "theanompi"

    def batch_mode(self):
        return "local"

    def protocol_for(self, model, n_batch_train=None, n_epochs=None):
        """The :class:`~tmpi_adapters.core.protocol.ModelProtocol` of a
        ModelClass instance after ``compile_iter_fns``: the one of the training
        function that updates ``model.params``, told the shape of the driver's
        loop (``n_batch_train`` steps per epoch, ``n_epochs``) for
        ``--progress`` and ``--checkpoint-every``.
        """
        mine = {id(p) for p in model.params}
        for function in self.functions:
            protocol = function.model
            if any(id(p) in mine for p in protocol.params):
                protocol.n_batch_train, protocol.n_epochs = n_batch_train, n_epochs
                return protocol
        raise TmpiError(
            "%s.compile_iter_fns compiled no training function that updates model.params "
            "(%d shared variables): its train function must apply updates computed with "
            "theano.grad of a cost with respect to model.params."
            % (type(model).__name__, len(model.params)))


def check_contract(model):
    """Raise :class:`ConfigError` naming what a ModelClass instance lacks."""
    name = type(model).__name__
    missing = [m for m in REQUIRED_METHODS if not callable(getattr(model, m, None))]
    if missing:
        raise ConfigError("%s lacks method(s) %s required by the Theano-MPI ModelClass "
                          "contract (%s)." % (name, ", ".join(missing),
                                              ", ".join(REQUIRED_METHODS)))
    params = getattr(model, "params", None)
    if not params:
        raise ConfigError("%s.params is missing or empty: it must list the model's "
                          "trainable Theano shared variables." % name)
    from theano.compile.sharedvalue import SharedVariable
    bad = [i for i, p in enumerate(params) if not isinstance(p, SharedVariable)]
    if bad:
        raise ConfigError("%s.params[%d] is a %s, not a Theano shared variable."
                          % (name, bad[0], type(params[bad[0]]).__name__))
    data = getattr(model, "data", None)
    for attribute in ("n_batch_train", "n_batch_val"):
        if not isinstance(getattr(data, attribute, None), int):
            raise ConfigError("%s.data.%s must be an int (batches per epoch on this rank)."
                              % (name, attribute))


def positional_arity(function):
    """How many positional arguments a callable takes (bound methods: without self)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 0
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return 99
    return sum(1 for p in parameters
               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def accepts_keyword(function, name):
    """True when a callable takes keyword argument ``name`` (or ``**kwargs``)."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    return name in parameters or any(p.kind == p.VAR_KEYWORD for p in parameters.values())
