"""The one plugin manager: built-ins first, then the ``tmpi`` entry points.

Environment variables:

``TMPI_DISABLE_PLUGIN_AUTOLOAD=1``
    load only the built-in plugins, none from installed distributions.
``TMPI_TRACE_HOOKS=1``
    print every hook call and its result to stderr.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from importlib.metadata import Distribution, EntryPoint

from tmpi_adapters import hookspecs
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.version import __version__

#: Marks a plugin's hook implementations (``@hookimpl``, ``@hookimpl(tryfirst=True)``,
#: ``@hookimpl(wrapper=True)``); re-exported as :data:`tmpi_adapters.hookimpl`.
hookimpl = pluggy.HookimplMarker("tmpi")

#: Modules registered before any entry point, in this order.
BUILTIN_PLUGINS = (
    "tmpi_adapters.exchangers.mpi",
    "tmpi_adapters.rules.bsp",
    "tmpi_adapters.frameworks.theano",
    "tmpi_adapters.frameworks.keras",
    "tmpi_adapters.frameworks.lasagne",
    "tmpi_adapters.frameworks.blocks",
    "tmpi_adapters.frameworks.theanompi",
    "tmpi_adapters.core.function",
    "tmpi_adapters.reliability.plugin",
    "tmpi_adapters.reliability.device",
    "tmpi_adapters.recording",
    "tmpi_adapters.bench",
    "tmpi_adapters.launch.cli",
    "tmpi_adapters.pluginmanager",
)

#: Names provided by distributions that may not be installed, for the error
#: an unknown ``--rule`` gets.  In the virtual environment ``make install``
#: makes, ``pip install tmpi-plugin-<rule>`` works as it is: ``make install``
#: builds the plugins' wheels into ``dist/`` and the venv's ``pip.conf`` names
#: an index of them.  Anywhere else pip needs to be told where the wheels
#: are (``make wheels`` builds them all), so the hint says both.
KNOWN = {name: "pip install %s (in the project's venv as it is; elsewhere add "
               "--find-links DIR, DIR holding the wheels `make wheels` builds)" % dist
         for name, dist in (("easgd", "tmpi-plugin-easgd"), ("gosgd", "tmpi-plugin-gosgd"),
                            ("asgd", "tmpi-plugin-asgd"), ("downpour", "tmpi-plugin-asgd"))}

AUTOLOAD_ENV = "TMPI_DISABLE_PLUGIN_AUTOLOAD"
TRACE_ENV = "TMPI_TRACE_HOOKS"

_manager = None


def _truthy(value: object) -> bool:
    return str(value).strip().lower() not in ("", "0", "false", "no", "off")


def make_plugin_manager(autoload: bool | None = None,
                        trace: bool | None = None) -> pluggy.PluginManager:
    """Build a fresh manager: specs, built-ins, entry points, then ``check_pending``."""
    pm = pluggy.PluginManager("tmpi")
    pm.add_hookspecs(hookspecs)
    for name in BUILTIN_PLUGINS:
        pm.register(importlib.import_module(name), name=name)
    pm.check_pending()
    if autoload is None:
        autoload = not _truthy(os.environ.get(AUTOLOAD_ENV, ""))
    if autoload:
        _load_entry_points(pm)
    if trace is None:
        trace = _truthy(os.environ.get(TRACE_ENV, ""))
    if trace:
        pm.trace.root.setwriter(sys.stderr.write)
        pm.enable_tracing()
    return pm


#: Installed plugins that could not be loaded: ``{entry point: one line}``.
broken: dict[str, str] = {}


def _entry_points() -> list[tuple[EntryPoint, Distribution]]:
    """``[(entry point, distribution)]`` of the ``tmpi`` group, read without importing."""
    import importlib.metadata
    found = []
    for dist in importlib.metadata.distributions():
        for ep in dist.entry_points:
            if ep.group == "tmpi":
                found.append((ep, dist))
    return found


def _load_entry_points(pm: pluggy.PluginManager) -> None:
    """Register every installed plugin, one at a time: a plugin that does not
    import, or implements a hook that does not exist, is left out with one
    line on stderr, and tmpi goes on without it."""
    for ep, dist in _entry_points():
        if pm.has_plugin(ep.name) or pm.is_blocked(ep.name):
            continue
        try:
            pm.load_setuptools_entrypoints("tmpi", name=ep.name)
            pm.check_pending()
        except Exception as error:  # noqa: BLE001 - one bad plugin must not stop tmpi
            if pm.get_plugin(ep.name) is not None:
                pm.unregister(name=ep.name)
            problem = str(error).splitlines()[0] if str(error) else ""
            broken[ep.name] = (
                "tmpi: warning: the installed plugin %r (%s %s) was not loaded: %s%s. "
                "Fix or uninstall it; TMPI_DISABLE_PLUGIN_AUTOLOAD=1 starts tmpi without "
                "any installed plugin." % (
                    ep.name, dist.metadata["Name"], dist.version, type(error).__name__,
                    ": " + problem if problem else ""))
            if os.environ.get("PMI_RANK", "0") == "0":
                sys.stderr.write(broken[ep.name] + "\n")


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide manager, built on first use."""
    global _manager
    if _manager is None:
        _manager = make_plugin_manager()
    return _manager


def _collect(hook_results: Iterable[dict[str, Any] | None]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for result in hook_results:
        merged.update(result or {})
    return merged


def available(kind: str, pm: pluggy.PluginManager | None = None) -> dict[str, type[Any]]:
    """``{name: class}`` of every installed rule, exchanger or framework.

    ``kind`` is ``"rules"``, ``"exchangers"`` or ``"frameworks"``.
    """
    pm = pm or get_plugin_manager()
    return _collect(getattr(pm.hook, "tmpi_" + kind)())


def lookup(kind: str, name: str, pm: pluggy.PluginManager | None = None) -> type[Any]:
    """The class registered as ``name`` of ``kind``; a clear error otherwise."""
    pm = pm or get_plugin_manager()
    found = available(kind, pm)
    if name in found:
        return found[name]
    singular = {"rules": "rule", "exchangers": "exchanger", "frameworks": "framework"}[kind]
    installed = ", ".join(sorted(found)) or "none"
    hint = _collect(pm.hook.tmpi_known_plugins()).get(name)
    message = "unknown %s %r. Installed %ss: %s." % (singular, name, singular, installed)
    unloaded = _unloaded_provider(kind, name, pm)
    if unloaded:
        message += " %r is provided by %s, which is installed but was not loaded: %s" % (
            name, unloaded[0], unloaded[1])
    elif hint:
        message += " %r is provided by a separate distribution: %s" % (name, hint)
    else:
        message += " Run `tmpi plugins` to see what is installed."
    raise TmpiError(message)


def _unloaded_provider(kind: str, name: str,
                       pm: pluggy.PluginManager) -> tuple[str, str] | None:
    """``(distribution, why)`` of an installed plugin that was not loaded
    (autoloading off, or broken) and provides ``name``, or ``None``."""
    autoload_off = _truthy(os.environ.get(AUTOLOAD_ENV, ""))
    for ep, dist in _entry_points():
        if pm.has_plugin(ep.name):
            continue
        if ep.name in broken:
            why = broken[ep.name].split("was not loaded: ", 1)[-1]
        elif autoload_off:
            why = "%s is set. Unset it to use installed plugins." % AUTOLOAD_ENV
        else:
            continue
        try:
            provided = getattr(ep.load(), "tmpi_" + kind, None)
            if provided is not None and name in (provided() or {}):
                return "%s %s" % (dist.metadata["Name"], dist.version), why
        except Exception:  # noqa: BLE001 - a broken plugin only loses the hint
            continue
    return None


def commands(pm: pluggy.PluginManager | None = None
             ) -> dict[str, tuple[Callable[[list[str]], int | None], str]]:
    """``{name: (handler, help)}`` of every ``tmpi`` subcommand plugins provide."""
    pm = pm or get_plugin_manager()
    return _collect(pm.hook.tmpi_commands())


def describe_plugins(pm: pluggy.PluginManager | None = None) -> list[dict[str, Any]]:
    """One dict per registered plugin: name, version, distribution, hooks."""
    pm = pm or get_plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    rows = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None or not pm.get_hookcallers(plugin):
            continue
        dist = dists.get(id(plugin))
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or [])
        rows.append({
            "name": name,
            "distribution": dist.project_name if dist else "tmpi-adapters (built-in)",
            "version": dist.version if dist else __version__,
            "hooks": hooks,
            "provides": _provides(plugin),
            "knobs": rule_knobs(plugin),
        })
    return rows


def rule_knobs(plugin: object) -> dict[str, list[dict[str, Any]]]:
    """``{rule: [{"name", "type", "default", "help"}]}`` of the rules ``plugin``
    provides (a default that depends on the rank count reads ``"f(N)"``)."""
    impl = getattr(plugin, "tmpi_rules", None)
    found = {}
    for name, rule in sorted((impl() or {}).items() if impl is not None else ()):
        found[name] = [{
            "name": knob_name,
            "type": getattr(knob.type, "__name__", str(knob.type)),
            "default": "f(N)" if callable(knob.default) else knob.default,
            "help": knob.help,
        } for knob_name, knob in sorted(getattr(rule, "knobs", {}).items())]
    return found


def _provides(plugin: object) -> list[str]:
    provided = []
    for kind in ("rules", "exchangers", "frameworks"):
        impl = getattr(plugin, "tmpi_" + kind, None)
        if impl is not None:
            provided += ["%s:%s" % (kind[:-1], name) for name in sorted(impl() or {})]
    return provided


@hookimpl
def tmpi_known_plugins() -> dict[str, str]:
    return dict(KNOWN)
