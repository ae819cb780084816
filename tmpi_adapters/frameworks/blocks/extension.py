"""``tmpi.blocks.Distributed``: the Blocks extension that distributes a main loop.

Added to a ``MainLoop``'s extensions, it starts a tmpi session in its
``before_training`` callback (before Blocks compiles the training function,
so the adapter's hooks are in place in time) and ends it after every other
extension's ``after_training``; under ``tmpi wrap`` it joins the running
session.  The class needs neither Blocks nor Theano to be created: its
arguments are checked at once (:func:`extension_options`), in the script's
own process, before MPI starts.
"""
import os
import sys

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.frameworks.blocks.adapter import BlocksAdapter


def extension_options(rule="bsp", rule_options=None, **options):
    """Check :class:`Distributed`'s arguments and turn them into run options.

    Raises :class:`~tmpi_adapters.errors.ConfigError` (or ``TmpiError``) for an
    unknown rule, a bad rule option, an unknown or bad run option.
    """
    import dataclasses

    from tmpi_adapters.options import Options, resolve_knobs
    from tmpi_adapters.pluginmanager import lookup
    if not isinstance(rule, str):
        raise ConfigError("Distributed(rule=...) must be a rule name such as 'bsp', not %r"
                          % (rule,))
    if rule_options is not None and not isinstance(rule_options, dict):
        raise ConfigError("Distributed(rule_options=...) must be a dict such as {'tau': 4}, "
                          "not %r" % (rule_options,))
    known = {f.name for f in dataclasses.fields(Options)} - {"rule", "rule_options", "extra",
                                                             "framework"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError("Distributed() got unknown option(s) %s. Its options: rule, "
                          "rule_options, %s." % (", ".join(unknown), ", ".join(sorted(known))))
    result = Options.from_env().replace(rule=rule, rule_options=dict(rule_options or {}),
                                        framework="blocks", **options)
    result.validate()
    rule_class = lookup("rules", rule)
    resolve_knobs(rule_class.name, rule_class.knobs, result.rule_options, _mpi_size_hint())
    if result.exchanger:
        lookup("exchangers", result.exchanger)
    return result


def _mpi_size_hint():
    """The job size from the launcher's environment (MPI is not started yet)."""
    for name in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 1


class Distributed:
    """A Blocks extension that trains the main loop's model on every MPI rank.

    Add it to an existing main loop and start the script with ``mpiexec -n N
    python script.py`` (or plain ``python``, for one rank)::

        import tmpi_adapters as tmpi   # before Blocks: applies the shims it needs

        main_loop = MainLoop(algorithm, stream, model=model, extensions=[
            FinishAfter(after_n_epochs=5), TrainingDataMonitoring(...),
            Printing(), tmpi.blocks.Distributed(rule="easgd")])

    Its ``before_training`` callback starts a tmpi session before Blocks
    compiles the training function; ``after_training`` ends it after every
    other extension.  Under ``tmpi wrap`` it joins the running session
    (options given on the command line win).  The class needs no Blocks to be
    created: Blocks calls extensions through ``dispatch``.

    Parameters
    ----------
    rule : str
        Synchronisation rule: ``"bsp"`` or an installed plugin's (``"easgd"``).
    rule_options : dict, optional
        The rule's knobs, e.g. ``{"alpha": 0.5, "tau": 4}``.
    **options
        Fields of :class:`tmpi_adapters.options.Options`: ``seed``,
        ``scaling``, ``precision``, ``exchanger``, ``stall_timeout``, ...
    name : str, optional
        The extension's name in ``main_loop.find_extension`` (``"Distributed"``).
    """

    def __init__(self, rule="bsp", rule_options=None, name=None, **options):
        self.name = name or type(self).__name__
        self.options = extension_options(rule, rule_options, **options)
        self.session = None
        self._owns_session = False
        self._main_loop = None

    # What Blocks expects of an extension -----------------------------------------
    @property
    def main_loop(self):
        if self._main_loop is None:
            raise ValueError("main loop must be assigned to extension first")
        return self._main_loop

    @main_loop.setter
    def main_loop(self, value):
        self._main_loop = value

    def dispatch(self, callback_name, *args):
        getattr(self, str(callback_name), self._ignore)(*args)

    def _ignore(self, *args):
        """Callbacks this extension has nothing to do in."""

    def __getstate__(self):
        # Blocks' Checkpoint pickles the main loop; the session is this process's.
        state = dict(self.__dict__)
        state.update(session=None, _owns_session=False)
        return state

    # Callbacks -----------------------------------------------------------------------
    def before_training(self):
        from tmpi_adapters.core.session import active_session
        session = active_session()
        if session is None:
            session = self._start_session()
        elif not isinstance(session.adapter, BlocksAdapter):
            raise ConfigError(
                "tmpi.blocks.Distributed runs inside a tmpi session for framework %r; run the "
                "script with --framework blocks (or without tmpi wrap)." % session.adapter.name)
        session.adapter.main_loop = self.main_loop
        self.session = session

    def _start_session(self):
        from tmpi_adapters.process import output
        from tmpi_adapters.process.rank import mpi_rank_size
        from tmpi_adapters.core.session import Session
        rank, size = mpi_rank_size()
        output.route_output(self.options, rank, size)
        session = Session(self.options, script=sys.argv[0] if sys.argv else None).start()
        self._owns_session = True
        session.adapter.on("after_training", self._finish)
        session.adapter.on("on_error", self._fail)
        return session

    def _finish(self):
        session, self.session = self.session, None
        if session is not None and session.started:
            session.finish()

    def _fail(self, error):
        from tmpi_adapters.process import failure
        session, self.session = self.session, None
        if session is None:
            return
        if session.size > 1 or isinstance(error, TmpiError):
            # Other ranks would wait for this one forever: end the whole job.
            failure.end_after_failure(session, error, session.rank, session.size)
        # One process: Blocks re-raises the script's own exception itself.
        failure.finish_after_failure(session, error)
