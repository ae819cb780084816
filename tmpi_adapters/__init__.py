"""tmpi: data-parallel training for existing Theano models, without rewriting them.

The public API is small::

    import tmpi_adapters as tmpi

    @tmpi.distributed(framework="lasagne", rule="bsp")
    def main(num_epochs=10): ...

    tmpi.wrap("train.py", ["--epochs", "3"], n=2)   # what `tmpi wrap` does

and the errors (:class:`TmpiError` and its kinds).  Plugin authors find what
they use in :mod:`tmpi_adapters.plugin` (rules, knobs, exchangers, framework
adapters, :data:`hookimpl`; the hooks are documented in
:mod:`tmpi_adapters.hookspecs`) and :mod:`tmpi_adapters.testing` (testing a
rule on real ranks); :class:`Rule`, :class:`Knob`, :class:`Exchanger`,
:class:`ModelProtocol` and :data:`hookimpl` are here too.  Everything else
may change between versions.

Importing this package changes nothing in the interpreter: the compatibility
shims that Theano, Keras, Lasagne and Blocks need on today's Python are
applied where a run starts (``tmpi wrap``, ``@distributed``) and, in a
virtual environment that ``make install`` made, at interpreter start-up.

(PYTEST_DONT_REWRITE: the start-up hook imports this package before pytest
starts, so pytest, which loads tmpi's plugin for the ``mpi`` mark, must not
try to rewrite it; :mod:`tmpi_adapters.testing` is rewritten as usual.)
"""
from __future__ import annotations

from tmpi_adapters.version import __version__

# Not typing.TYPE_CHECKING: every interpreter of the venv imports this
# package (the start-up hook), and typing costs milliseconds to import.
TYPE_CHECKING = False

if TYPE_CHECKING:
    # What the lazy names below are, for type checkers (never imported here).
    import os
    from collections.abc import Iterable
    from typing import Any

    from tmpi_adapters.core.protocol import ModelProtocol
    from tmpi_adapters.errors import (CheckpointError, ConfigError, LockstepError,
                                      MismatchError, NonFiniteError, StallError, TmpiError)
    from tmpi_adapters.exchangers.base import Exchanger
    from tmpi_adapters.launch.decorator import distributed
    from tmpi_adapters.options import Knob
    from tmpi_adapters.pluginmanager import hookimpl
    from tmpi_adapters.rules.base import Rule

__all__ = ["distributed", "wrap", "Rule", "Knob", "Exchanger", "ModelProtocol", "hookimpl",
           "TmpiError", "ConfigError", "MismatchError", "StallError", "NonFiniteError",
           "CheckpointError", "LockstepError", "__version__"]


def wrap(script: str | os.PathLike[str], args: Iterable[str] = (), n: int = 1,
         **options: Any) -> int:
    """Run ``script`` with ``args`` on ``n`` ranks, like ``tmpi wrap``; returns
    the exit status.  ``options`` are :class:`~tmpi_adapters.options.Options` fields."""
    from tmpi_adapters.launch.launcher import launch
    from tmpi_adapters.options import Options
    return launch(script, list(args), Options(**options).validate(), n=n)


#: Public names imported on first use: importing the package stays cheap (the
#: virtual environment's start-up hook imports it in every interpreter) and
#: never imports Theano or numpy before a run has set them up.
_LAZY = {
    "hookimpl": ("tmpi_adapters.pluginmanager", "hookimpl"),
    "distributed": ("tmpi_adapters.launch.decorator", "distributed"),
    "ModelProtocol": ("tmpi_adapters.core.protocol", "ModelProtocol"),
    "Exchanger": ("tmpi_adapters.exchangers.base", "Exchanger"),
    "Rule": ("tmpi_adapters.rules.base", "Rule"),
    "Knob": ("tmpi_adapters.options", "Knob"),
    "blocks": ("tmpi_adapters.frameworks.blocks", None),
}
_LAZY.update({name: ("tmpi_adapters.errors", name) for name in (
    "TmpiError", "ConfigError", "MismatchError", "StallError", "NonFiniteError",
    "CheckpointError", "LockstepError")})
#: Theano-MPI's launcher classes (``from tmpi_adapters import BSP``).
_THEANO_MPI_RULES = ("BSP", "EASGD", "GOSGD", "ASGD")


def __getattr__(name: str) -> Any:
    import importlib
    if name in _LAZY:
        module_name, attribute = _LAZY[name]
        module = importlib.import_module(module_name)
        return module if attribute is None else getattr(module, attribute)
    if name in _THEANO_MPI_RULES:
        from tmpi_adapters.launch.theanompi import rule_class
        return rule_class(name)
    raise AttributeError("module 'tmpi_adapters' has no attribute %r" % name)
