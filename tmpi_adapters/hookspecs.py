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
"""
import pluggy

hookspec = pluggy.HookspecMarker("tmpi")


# --------------------------------------------------------------- registries

@hookspec
def tmpi_rules():
    """Return the synchronisation rules this plugin provides.

    Returns
    -------
    dict
        ``{name: RuleClass}``; each class subclasses :class:`tmpi_adapters.rules.Rule`.
        ``name`` is what users pass to ``--rule``.
    """


@hookspec
def tmpi_exchangers():
    """Return the exchangers this plugin provides.

    Returns
    -------
    dict
        ``{name: ExchangerClass}``; each class subclasses
        :class:`tmpi_adapters.exchanger.Exchanger`.  ``name`` is what users pass
        to ``--exchanger``.
    """


@hookspec
def tmpi_frameworks():
    """Return the framework adapters this plugin provides.

    Returns
    -------
    dict
        ``{name: AdapterClass}``; each class subclasses
        :class:`tmpi_adapters.frameworks.base.FrameworkAdapter`.  ``name`` is
        what users pass to ``--framework``.
    """


@hookspec
def tmpi_known_plugins():
    """Return names that are provided by distributions not installed here.

    Used only to word the error for an unknown ``--rule``/``--exchanger``/
    ``--framework``.

    Returns
    -------
    dict
        ``{name: "pip install <distribution>"}``.
    """


@hookspec
def tmpi_add_arguments(parser):
    """Add command-line options to ``tmpi wrap`` and ``tmpi run``.

    Parameters
    ----------
    parser : argparse.ArgumentParser (or an argument group)
        Options added here arrive on every rank as
        ``session.options.extra[dest]``; the decorator accepts the same names
        as keyword arguments.
    """


# ---------------------------------------------------------------- decisions

@hookspec(firstresult=True)
def tmpi_detect_framework(source, path):
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
def tmpi_select_exchanger(session):
    """Choose an exchanger when the user did not name one.

    Parameters
    ----------
    session : tmpi_adapters.session.Session
        The running session; ``session.options`` holds the user's choices.

    Returns
    -------
    str or None
        An exchanger name, or ``None`` to let other plugins decide (the
        built-in answer is ``"mpi"``).
    """


# ---------------------------------------------------------------- lifecycle

@hookspec
def tmpi_session_start(session):
    """Called on every rank once the session (exchanger, rule, adapter) is ready,
    before the user's code runs."""


@hookspec
def tmpi_model_ready(session, model):
    """Called on every rank when a :class:`~tmpi_adapters.protocol.ModelProtocol`
    has been synchronised (identical start) and is about to take its first step."""


@hookspec
def tmpi_after_step(session, model, step, samples):
    """Called on every rank after each training step of ``model``.

    Parameters
    ----------
    session : tmpi_adapters.session.Session
    model : tmpi_adapters.protocol.ModelProtocol
    step : int
        1-based count of steps taken by this model.
    samples : int
        Rows this rank processed in the step.
    """


@hookspec
def tmpi_checkpoint_state(session):
    """Return extra state to store in a checkpoint.

    Returns
    -------
    dict or None
        ``{key: picklable}``; keys should be prefixed with the plugin's name.
    """


@hookspec
def tmpi_restore_state(session, state):
    """Restore what :func:`tmpi_checkpoint_state` stored (``state`` is the whole dict)."""


@hookspec
def tmpi_session_end(session, error):
    """Called on every rank when the user's code has finished.

    Parameters
    ----------
    error : BaseException or None
        The exception that ended the run, if any.
    """
