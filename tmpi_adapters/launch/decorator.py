"""``@tmpi_adapters.distributed(...)``: distribute a script's entry point in two lines."""
from __future__ import annotations

import functools
import sys
from typing import TYPE_CHECKING, Any, TypeVar

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.options import Options

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import ParamSpec

    _P = ParamSpec("_P")
_R = TypeVar("_R")


def distributed(framework: str | None = None, rule: str = "bsp",
                rule_options: Mapping[str, object] | None = None,
                **options: Any) -> Callable[[Callable[_P, _R]], Callable[_P, _R | None]]:
    """Run the decorated function as a distributed training session.

    Under ``mpiexec -n N python script.py`` each rank runs the function with its
    training functions distributed; under plain ``python script.py`` it runs on
    one process; under ``tmpi wrap`` the wrap's session is used: it started
    with the decorator's options (read from the script's text,
    :func:`~tmpi_adapters.launch.target.declared_options`) except those its
    command line names.

    Parameters
    ----------
    framework
        ``"theano"``, ``"keras"``, ``"lasagne"``, ``"blocks"``, ...; detected
        from the script's imports when omitted.
    rule
        Synchronisation rule (``"bsp"``, or an installed plugin's rule).
    rule_options
        Knobs of the rule, e.g. ``{"tau": 4}``.
    **options
        Any field of :class:`tmpi_adapters.options.Options` (``seed``,
        ``scaling``, ``precision``, ``stall_timeout``, ...); other names go to
        ``options.extra`` for plugins.

    The decorated function returns what the function returns, or ``None``
    where the run had nothing to do (``--resume auto`` of a finished run).

    Examples
    --------
    >>> import tmpi_adapters as tmpi
    >>> @tmpi.distributed(framework="lasagne", rule="bsp")
    ... def main(num_epochs=500):
    ...     ...
    """
    def decorate(main: Callable[_P, _R]) -> Callable[_P, _R | None]:
        @functools.wraps(main)
        def run(*args: _P.args, **kwargs: _P.kwargs) -> _R | None:
            from tmpi_adapters.core.session import active_session
            if active_session() is not None:
                _check_joined(active_session().options, framework, rule, rule_options,
                              options)
                active_session().adapter.rebind(main.__globals__)
                return main(*args, **kwargs)
            return _run_distributed(main, args, kwargs, framework, rule, rule_options,
                                    options)
        run.tmpi_distributed = True  # type: ignore[attr-defined]
        return run
    return decorate


def _check_joined(session_options: Options, framework: str | None, rule: str,
                  rule_options: Mapping[str, object] | None,
                  options: Mapping[str, Any]) -> None:
    """Under ``tmpi wrap``: the session must run with what the decorator sets,
    unless the command line named it; a value ``tmpi wrap`` could not read
    from the script (not a literal) is an error, not silently dropped."""
    wanted = dict(options)
    if framework is not None:
        wanted["framework"] = framework
    if rule != "bsp":
        wanted["rule"] = rule
    if rule_options:
        wanted["rule_options"] = dict(rule_options)
    explicit = set(session_options.explicit)
    for key, value in wanted.items():
        if key in explicit:
            continue
        current: Any = getattr(session_options, key) if hasattr(session_options, key) \
            else session_options.extra.get(key)
        if key == "rule_options":
            current = {k: current.get(k) for k in value}
        if current != value:
            raise TmpiError(
                "@distributed(%s=%r) cannot take effect under tmpi wrap, which started "
                "with %s=%r: it reads the decorator's arguments from the script before "
                "running it, and this one is not a literal. Pass it on tmpi wrap's command "
                "line instead (or write it as a literal)." % (key, value, key, current))


def _options(main: Callable[..., Any], framework: str | None, rule: str,
             rule_options: Mapping[str, object] | None, options: Mapping[str, Any]) -> Options:
    from dataclasses import fields
    known = {f.name for f in fields(Options)}
    base = Options.from_env()
    chosen = {k: v for k, v in options.items() if k in known}
    extra = dict(base.extra)
    extra.update({k: v for k, v in options.items() if k not in known})
    result = base.replace(rule=rule, rule_options=dict(rule_options or {}), extra=extra,
                          **chosen)
    result.framework = framework or base.framework
    if not result.framework:
        from tmpi_adapters.launch.target import detect_framework
        script = getattr(sys.modules.get(main.__module__), "__file__", None)
        result.framework = (detect_framework(script) if script else None) or "theano"
    return result


def _run_distributed(main: Callable[_P, _R], args: tuple[Any, ...], kwargs: dict[str, Any],
                     framework: str | None,
                     rule: str, rule_options: Mapping[str, object] | None,
                     options: Mapping[str, Any]) -> _R | None:
    from tmpi_adapters.launch import runtime
    from tmpi_adapters.process import compat, failure, output
    from tmpi_adapters.process.rank import mpi_rank_size
    compat.apply()
    opts = _options(main, framework, rule, rule_options, options)
    from tmpi_adapters.reliability import preemption
    preemption.install(opts)
    rank, size = mpi_rank_size()
    output.route_output(opts, rank, size)
    from mpi4py import MPI
    from tmpi_adapters.process.binding import settle
    settle(MPI.COMM_WORLD, opts.bind)
    runtime.quiet_compile_lock(opts, size)
    from tmpi_adapters.core.session import Session
    session = None
    try:
        session = Session(opts, script=getattr(sys.modules.get(main.__module__), "__file__",
                                               None)).start()
        session.adapter.rebind(main.__globals__)
        try:
            result = main(*args, **kwargs)
        except SystemExit as exit_:
            if isinstance(exit_, preemption.Preempted):
                failure.end_preempted(session, exit_, size)
            # A deliberate exit: the script's status, as under plain python,
            # without a failure report (nor end-of-run exchanges unless 0).
            if exit_.code in (None, 0):
                session.finish()
            else:
                failure.finish_after_failure(session, exit_)
            raise
        session.finish()
        return result
    except SystemExit:
        raise
    except BaseException as error:  # noqa: B902 - every failure must end the job
        if failure.ends_cleanly(error):
            failure.end_quietly(session, error, rank)
            return None
        if size == 1 and not isinstance(error, TmpiError):
            # One process: the script's own exception, as plain python raises it.
            failure.finish_after_failure(session, error)
            raise
        failure.end_after_failure(session, error, rank, size)
        return None  # not reached: end_after_failure ends the job


__all__ = ["distributed"]
