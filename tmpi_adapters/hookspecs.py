"""The hooks a tmpi plugin can implement: the contract a plugin author reads first.

A plugin is any module or object with functions decorated by
:data:`tmpi_adapters.hookimpl`, advertised under the ``tmpi`` entry-point group::

    # setup.py of tmpi-plugin-myrule
    entry_points={"tmpi": ["myrule = tmpi_plugin_myrule"]}

    # tmpi_plugin_myrule/__init__.py
    from tmpi_adapters import hookimpl

    @hookimpl
    def tmpi_rules():
        return {"myrule": MyRule}

Hooks are called with keyword arguments only.  Hooks marked ``firstresult``
stop at the first plugin that returns something other than ``None``.
See ``docs/plugins.md`` for a guide and ``plugins/tmpi-plugin-gosgd`` for a
template.

The annotations are what implementations receive and return; a hook's body
here is only its documentation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from argparse import _ActionsContainer
    from collections.abc import Callable, Sequence
    from types import FrameType

    from tmpi_adapters.core.function import Call
    from tmpi_adapters.core.protocol import ModelProtocol
    from tmpi_adapters.core.session import Session
    from tmpi_adapters.exchangers.base import Array, Exchanger
    from tmpi_adapters.frameworks.base import FrameworkAdapter
    from tmpi_adapters.options import Options
    from tmpi_adapters.rules.base import Rule

hookspec = pluggy.HookspecMarker("tmpi")


# --------------------------------------------------------------- registries

@hookspec
def tmpi_rules() -> dict[str, type[Rule]]:
    """Return the synchronisation rules this plugin provides.

    Returns
    -------
    dict
        ``{name: RuleClass}``; each class subclasses :class:`tmpi_adapters.rules.base.Rule`.
        ``name`` is what users pass to ``--rule``.
    """


@hookspec
def tmpi_exchangers() -> dict[str, type[Exchanger]]:
    """Return the exchangers this plugin provides.

    Returns
    -------
    dict
        ``{name: ExchangerClass}``; each class subclasses
        :class:`tmpi_adapters.exchangers.base.Exchanger`.  ``name`` is what users pass
        to ``--exchanger``.
    """


@hookspec
def tmpi_frameworks() -> dict[str, type[FrameworkAdapter]]:
    """Return the framework adapters this plugin provides.

    Returns
    -------
    dict
        ``{name: AdapterClass}``; ``name`` is what users pass to
        ``--framework``.  Each class subclasses
        :class:`tmpi_adapters.plugin.FrameworkAdapter` (what the core asks of
        an adapter: ``install``, ``uninstall``, ``batch_mode``,
        ``make_model``, ``check_finished``), in practice through
        :class:`tmpi_adapters.plugin.TheanoAdapter` for a framework built on
        Theano, which finds training functions in ``theano.function`` calls.
    """


@hookspec
def tmpi_known_plugins() -> dict[str, str]:
    """Return names that are provided by distributions not installed here.

    Used only to word the error for an unknown ``--rule``/``--exchanger``/
    ``--framework``.

    Returns
    -------
    dict
        ``{name: "pip install <distribution>"}``.
    """


@hookspec
def tmpi_add_arguments(parser: _ActionsContainer) -> None:
    """Add command-line options to ``tmpi wrap`` and ``tmpi run``.

    Parameters
    ----------
    parser : argparse.ArgumentParser (or an argument group)
        Options added here arrive on every rank as
        ``session.options.extra[dest]``; the decorator accepts the same names
        as keyword arguments.
    """


@hookspec
def tmpi_check_options(options: Options, ranks: int) -> None:
    """Refuse bad values of this plugin's options before any rank starts.

    Called by ``tmpi wrap`` once the command line is read, and by the
    decorator, so that a bad combination is one line at once instead of an
    error after the ranks have started and imported Theano.  Raise
    :class:`~tmpi_adapters.errors.ConfigError` with what to change.

    Parameters
    ----------
    options : tmpi_adapters.options.Options
        The run's options; a plugin's own are in ``options.extra[dest]``.
    ranks : int
        The number of ranks the run will have.
    """


@hookspec
def tmpi_commands() -> dict[str, tuple[Callable[[list[str]], int | None], str]]:
    """Return ``tmpi`` subcommands this plugin provides.

    Returns
    -------
    dict
        ``{name: (handler, help)}``: ``tmpi NAME ARGS...`` calls
        ``handler(argv) -> exit status`` with the arguments after ``NAME``;
        ``help`` is one line for ``tmpi --help``.  Import heavy modules
        inside the handler, not when the hook is called.
    """


# ---------------------------------------------------------------- decisions

@hookspec(firstresult=True)
def tmpi_detect_framework(source: str, path: str) -> str | None:
    """Guess the framework of a user script that was run without ``--framework``.

    Parameters
    ----------
    source : str
        The script's text.
    path : str
        The script's path.

    Returns
    -------
    str or None
        A framework name, or ``None`` to let other plugins decide.
    """


@hookspec(firstresult=True)
def tmpi_select_exchanger(session: Session) -> str | None:
    """Choose an exchanger when the user did not name one.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
        The running session; ``session.options`` holds the user's choices.

    Returns
    -------
    str or None
        An exchanger name, or ``None`` to let other plugins decide (the
        built-in answer is ``"mpi"``).
    """


# ---------------------------------------------------------------- lifecycle

@hookspec
def tmpi_session_start(session: Session) -> None:
    """Called on every rank once the session (exchanger, rule, adapter) is ready,
    before the user's code runs.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    """


@hookspec
def tmpi_model_ready(session: Session, model: ModelProtocol) -> None:
    """Called on every rank when a :class:`~tmpi_adapters.core.protocol.ModelProtocol`
    has been synchronised (identical start) and is about to take its first step.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    model : tmpi_adapters.core.protocol.ModelProtocol
    """


@hookspec(firstresult=True)
def tmpi_call(session: Session, call: Call) -> Any:
    """Run one call of a compiled function tmpi handed the script.

    Every call of a distributed training function and of every other
    compiled function passes through this hook.  The built-in
    implementation (``trylast``) runs ``call.run()`` and returns what it
    returns.  A ``wrapper=True`` implementation sees the call before and
    its result after (checkpointing records the call log and writes a
    checkpoint that fell due); a ``tryfirst`` implementation that returns a
    value answers the call without running it (a resume replays calls this
    way).  Return ``None`` to let the call run: so a plain implementation
    cannot answer a call with ``None`` (a function compiled without
    outputs); a wrapper can turn a marker of its own back into ``None``.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    call : tmpi_adapters.core.function.Call
        ``call.function`` (has ``.key``, the function's name in logs and
        checkpoints, and ``.has_updates``, whether the call changes state),
        ``call.kind`` (``"train"`` for a training step,
        ``"other"`` otherwise), ``call.args``, ``call.kwargs``, and
        ``call.run()``.

    Returns
    -------
    object
        The call's result, exactly as the compiled function would return it.
    """


@hookspec
def tmpi_after_exchange(session: Session, model: ModelProtocol, gradients: Sequence[Array],
                        reduced: Sequence[Array], weight: float) -> None:
    """Called on every rank inside a training step, right after its gradients
    were exchanged and before the updates use them.

    The non-finite guard checks the reduced gradients here.  Nothing may be
    written into ``reduced``.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    model : tmpi_adapters.core.protocol.ModelProtocol
    gradients : list of numpy.ndarray
        This rank's own gradients, as the graph computed them; under a rule
        that reduces linearly, without the terms every rank computes alike
        (a weight penalty's), which are added after the exchange
        (:mod:`tmpi_adapters.graphs.terms`).
    reduced : list of numpy.ndarray
        What the rule made of them (the same on every rank under BSP).
    weight : float
        This rank's rows in the step (0 for a padding row).
    """


@hookspec
def tmpi_after_step(session: Session, model: ModelProtocol, step: int,
                    samples: int) -> None:
    """Called on every rank after each training step of ``model``.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    model : tmpi_adapters.core.protocol.ModelProtocol
    step : int
        1-based count of steps taken by this model.
    samples : int
        Rows this rank processed in the step.
    """


@hookspec(firstresult=True)
def tmpi_stall(session: Session, what: str, waited: float,
               frame: FrameType) -> bool | None:
    """A wait of this rank passed ``--stall-timeout``.

    Called on the waiting thread from inside the wait.  The watchdog
    implements it: it notes the stall, reports which ranks are missing and
    lets the wait go on.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    what : str
        What is awaited (``"allreduce"``, ``"the end of the script"``, ...).
    waited : float
        Seconds waited so far.
    frame : frame
        The waiting loop's frame: it stays on the stack exactly as long as
        the wait lasts.

    Returns
    -------
    bool or None
        ``True`` to keep waiting; ``None`` (nobody handles it) raises
        :class:`~tmpi_adapters.errors.StallError`.
    """


@hookspec
def tmpi_before_finish(session: Session) -> None:
    """Called on every rank when the user's code has returned without error,
    before the rule finishes and the end-of-run summary is exchanged.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    """


@hookspec
def tmpi_checkpoint_state(session: Session) -> dict[str, Any] | None:
    """Return extra state to store in a checkpoint.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session

    Returns
    -------
    dict or None
        ``{key: value}``; keys should be prefixed with the plugin's name.
        Values are data: numpy arrays, numbers, strings, bytes, ``None``, and
        lists, tuples, sets and dicts of them (a checkpoint never holds
        objects or code: anything else stops the run at its first
        checkpoint, naming the plugin).
    """


@hookspec
def tmpi_restore_state(session: Session, state: dict[str, Any]) -> None:
    """Restore what :func:`tmpi_checkpoint_state` stored.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    state : dict
        Everything every plugin stored, merged.
    """


@hookspec
def tmpi_session_end(session: Session, error: BaseException | None) -> None:
    """Called on every rank when the user's code has finished.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    error : BaseException or None
        The exception that ended the run, if any.
    """
