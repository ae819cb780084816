"""Everything a plugin author uses, in one place; its names are kept stable.

::

    from tmpi_adapters.plugin import Knob, PerModel, Rule, hookimpl, positive

Rules (``tmpi_rules``): :class:`Rule` and its per-model state
:class:`PerModel`; :class:`Knob` and the checks of knob values
(:func:`positive`, :func:`non_negative`, :func:`probability`,
:func:`one_of`, :func:`parse_bool`); :func:`copies` (a rule keeping a copy
of a model's arrays); the building blocks of rules that do not wait
(:class:`Mailbox`, :class:`HolderExchange`).  Exchangers
(``tmpi_exchangers``): :class:`Exchanger`, :class:`MPIExchanger`,
:data:`ANY_SOURCE`, :data:`ANY_TAG`.  Framework adapters
(``tmpi_frameworks``): :class:`FrameworkAdapter` (what the core asks of an
adapter), :class:`TheanoAdapter` (the base of adapters of frameworks built
on Theano), :class:`ModelProtocol` (what an adapter hands the core).  Every
hook: :data:`hookimpl`; the hooks themselves are documented in
:mod:`tmpi_adapters.hookspecs` and ``docs/plugins.md``.  The errors a plugin
raises.  Tests of a rule on real ranks: :mod:`tmpi_adapters.testing`.

Importing this module imports neither Theano nor MPI.
"""
from tmpi_adapters.core.protocol import ModelProtocol
from tmpi_adapters.errors import (CheckpointError, ConfigError, LockstepError, MismatchError,
                                  NonFiniteError, StallError, TmpiError)
from tmpi_adapters.exchangers.base import ANY_SOURCE, ANY_TAG, Exchanger
from tmpi_adapters.exchangers.mpi import MPIExchanger
from tmpi_adapters.frameworks.base import FrameworkAdapter
from tmpi_adapters.frameworks.theano import TheanoAdapter
from tmpi_adapters.options import Knob, non_negative, one_of, parse_bool, positive, probability
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.rules.asynchronous import HolderExchange, Mailbox
from tmpi_adapters.rules.base import PerModel, Rule, copies

__all__ = ["hookimpl", "Rule", "PerModel", "Knob", "positive", "non_negative", "probability",
           "one_of", "parse_bool", "copies", "Mailbox", "HolderExchange", "Exchanger",
           "MPIExchanger", "ANY_SOURCE", "ANY_TAG", "FrameworkAdapter", "TheanoAdapter",
           "ModelProtocol", "TmpiError", "ConfigError", "MismatchError", "StallError",
           "NonFiniteError", "CheckpointError", "LockstepError"]
