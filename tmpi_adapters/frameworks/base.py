"""What every framework adapter is: something that hooks a framework while a
user's script runs, and hands tmpi :class:`~tmpi_adapters.core.protocol.ModelProtocol` s."""
from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, Any

from tmpi_adapters.process.compat import Patcher

if TYPE_CHECKING:
    from tmpi_adapters.core.protocol import ModelProtocol, SharedVariable
    from tmpi_adapters.core.session import Session


def imported_modules(source: str) -> set[str]:
    """Every module name a script imports (``a.b`` gives ``a`` and ``a.b``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set(re.findall(r"^\s*(?:import|from)\s+([\w.]+)", source, re.MULTILINE))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    expanded: set[str] = set()
    for name in names:
        parts = name.split(".")
        expanded.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    return expanded


def imports_module(source: str, module: str) -> bool:
    """True when ``source`` imports ``module`` (or something inside it)."""
    return module in imported_modules(source)


class FrameworkAdapter:
    """Base class of framework adapters: what the core asks of every adapter.

    An adapter hooks its framework while the script runs (:meth:`install`)
    and hands the session one
    :class:`~tmpi_adapters.core.protocol.ModelProtocol` per training
    function (:meth:`make_model`).  Adapters of frameworks built on Theano
    subclass :class:`~tmpi_adapters.frameworks.theano.TheanoAdapter`, which
    finds training functions in ``theano.function`` calls; a framework that
    is not can subclass this class directly.

    Parameters
    ----------
    session
        The session the adapter serves.
    """

    #: the name users pass to ``--framework``
    name: str | None = None
    #: Whether functions that do not train but take a batch (validation,
    #: prediction) are split across ranks; an adapter that splits its
    #: framework's evaluation itself (Keras') says False.
    split_evaluations = True

    def __init__(self, session: Session) -> None:
        self.session = session
        self.patcher = Patcher()

    def install(self) -> None:
        """Hook the framework; called on every rank before the user's code runs."""

    def uninstall(self) -> None:
        """Undo :meth:`install`."""
        self.patcher.restore()

    def batch_mode(self) -> str:
        """How training calls share work across ranks.

        ``"rows"``: each call's batch is split by rows (strong scaling);
        ``"round-robin"``: groups of N calls form one step, rank r training on
        the r-th call's batch (weak scaling of an unmodified loop);
        ``"local"``: each rank already feeds its own data (adapters whose
        models shard their data themselves), so batches are used whole.
        """
        return "round-robin" if self.session.options.scaling == "weak" else "rows"

    def make_model(self, key: str, params: list[SharedVariable],
                   optimizer_state: list[SharedVariable], model_state: list[SharedVariable],
                   graph: list[Any], data: set[Any]) -> ModelProtocol:
        """The :class:`~tmpi_adapters.core.protocol.ModelProtocol` of training
        function ``key`` from what was found of it: its trainable parameters,
        optimizer state and model state (shared variables), its ``graph``
        (outputs and update expressions) and the variables that hold its
        ``data`` (Theano variables).  Adapters that know more than the graph
        shows refine it."""
        raise NotImplementedError("%s does not make models" % type(self).__name__)

    def check_finished(self) -> None:
        """Called when the user's code returned without error; raise
        :class:`~tmpi_adapters.errors.TmpiError` if nothing was distributed."""

    def rebind(self, namespace: dict[str, Any]) -> None:
        """Point names in a module namespace (a decorated script's globals) that
        were imported before :meth:`install` at the hooked versions."""
