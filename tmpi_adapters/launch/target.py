"""Running the user's script as ``python`` would: what it is (a script or
``-m MODULE``), its ``sys.argv`` and ``sys.path``, its exit status; and what
tmpi reads from its text before it runs (its framework, a decorator's
arguments).
"""
import builtins
import contextlib
import io
import os
import runpy
import sys
import types

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.options import Options

def take_decorator_options(options, target, rank):
    """Start with the options the script's ``@distributed(...)`` sets, for
    every option the command line did not name (those win, said once)."""
    try:
        with open(target_file(target), encoding="utf-8", errors="replace") as handle:
            source = handle.read()
    except (OSError, TmpiError):
        return
    if "distributed" not in source:
        return
    declared, _ = declared_options(source)
    overridden = apply_declared(options, declared, set(options.explicit))
    if overridden and rank == 0:
        print("tmpi: note: the command line wins over the decorator for %s."
              % ", ".join("%s (%r, not %r)" % (key, ours, theirs)
                          for key, (ours, theirs) in sorted(overridden.items())),
              file=sys.stderr, flush=True)


#: The decorator's parameters before ``**options``, in order.
_POSITIONAL = ("framework", "rule", "rule_options")


def declared_options(source):
    """The options a script's ``@distributed(...)`` sets, read from its text
    without running it: ``(options, unread)``.

    ``tmpi wrap`` starts its session before the script runs, so it reads the
    decorator's literal arguments here (``rule="easgd"``, ``seed=1``,
    ``rule_options={"tau": 4}``) and starts with them; ``unread`` names the
    arguments that are not literals (a variable), which it cannot know.
    """
    import ast
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}, []
    found, unread = {}, set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name != "distributed":
            continue
        named = list(zip(_POSITIONAL, call.args)) + [
            (k.arg, k.value) for k in call.keywords if k.arg]
        for key, value in named:
            try:
                value = ast.literal_eval(value)
            except ValueError:
                unread.add(key)
                continue
            if key in found and found[key] != value:
                unread.add(key)  # two calls that disagree: which one runs is not known
            found.setdefault(key, value)
    return {k: v for k, v in found.items() if k not in unread}, sorted(unread)


def apply_declared(options, declared, explicit):
    """``options`` with the decorator's ``declared`` values for every option
    the command line did not set (``explicit``: the fields and plugin
    options it named); returns the options the command line overrode."""
    import dataclasses
    known = {f.name for f in dataclasses.fields(Options)}
    overridden = {}
    for key, value in declared.items():
        if key in explicit:
            current = getattr(options, key, None) if key in known else options.extra.get(key)
            if current != value:
                overridden[key] = (current, value)
            continue
        if key == "rule_options":
            options.rule_options = dict(value or {}, **options.rule_options)
        elif key in known:
            setattr(options, key, value)
        else:
            options.extra[key] = value
    options.validate()
    return overridden


def detect_framework(target, pm=None):
    """The framework a script (a path) or module (``("module", name)``) uses,
    from the ``tmpi_detect_framework`` hook; a module inside a package is read
    with its package's other modules (its ``__main__`` often only imports
    them), a script with the modules beside it that it imports (a two-line
    ``import mlp; mlp.test_mlp()``)."""
    from tmpi_adapters.pluginmanager import get_plugin_manager
    pm = pm or get_plugin_manager()
    kind, name = as_target(target)
    if kind == "module":
        try:
            path, in_package = find_module(name)
        except TmpiError:
            return None
        files = _package_files(path) if in_package else [path]
    else:
        path, files = name, [name] + _imported_neighbours(name)
    sources = []
    for file in files:
        try:
            with open(file, encoding="utf-8", errors="replace") as handle:
                sources.append(handle.read())
        except OSError:
            continue
    if not sources:
        return None
    return pm.hook.tmpi_detect_framework(source="\n".join(sources), path=path)


def _imported_neighbours(script):
    """The modules in ``script``'s directory that it imports (first level)."""
    from tmpi_adapters.frameworks.base import imported_modules
    try:
        with open(script, encoding="utf-8", errors="replace") as handle:
            names = imported_modules(handle.read())
    except OSError:
        return []
    directory = os.path.dirname(os.path.abspath(script))
    found = [os.path.join(directory, name + ".py") for name in sorted(names) if "." not in name]
    return [path for path in found if os.path.isfile(path)]


def _package_files(path, most=100):
    directory = os.path.dirname(path)
    names = sorted(n for n in os.listdir(directory) if n.endswith(".py"))[:most]
    return [path] + [os.path.join(directory, n) for n in names
                     if os.path.join(directory, n) != path]


# -------------------------------------------------------- running it as python does

def as_target(target):
    """``("script", path)`` or ``("module", name)``; a bare path is a script."""
    if isinstance(target, (tuple, list)):
        return tuple(target)
    return ("script", os.fspath(target))


def target_argv(target):
    """The words naming ``target`` on a command line: ``[SCRIPT]`` or ``["-m", MODULE]``."""
    kind, name = as_target(target)
    return ["-m", name] if kind == "module" else [name]


def module_path0():
    """What ``python -m`` puts first on ``sys.path``: the working directory."""
    return os.getcwd()


def script_path0(script):
    """What ``python SCRIPT`` puts first on ``sys.path``: the script's directory
    (symbolic links resolved)."""
    return os.path.dirname(os.path.realpath(script))


def find_module(name):
    """``(file, in_package)`` of what ``python -m NAME`` would run, found the
    way Python finds it (the working directory first on the path) without
    importing anything: the user's packages run only on the ranks, after tmpi
    has hooked the framework.  :class:`TmpiError` when there is none."""
    import importlib.machinery
    import importlib.util
    parts = name.split(".")
    if not all(p.isidentifier() for p in parts):
        raise TmpiError("-m %s: not a module name (use a dotted name such as package.train, "
                        "without .py)." % name)
    saved = list(sys.path)
    sys.path[:] = [module_path0()] + [p for p in sys.path[1:]]
    try:
        spec = importlib.util.find_spec(parts[0]) if parts[0] not in sys.modules else \
            getattr(sys.modules[parts[0]], "__spec__", None)
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    for i in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[:i + 1]), list(locations)) if locations else None
    if spec is None:
        raise TmpiError("no module named %s (looked in the working directory %s and the "
                        "installed packages, as python -m does)." % (name, os.getcwd()))
    if spec.submodule_search_locations is not None:
        main = importlib.machinery.PathFinder.find_spec(
            name + ".__main__", list(spec.submodule_search_locations))
        if main is None or not main.origin:
            raise TmpiError("no module named %s.__main__: %r is a package and cannot be run "
                            "directly (python -m needs %s/__main__.py)." % (name, name, name))
        return main.origin, True
    if not spec.origin or not os.path.isfile(spec.origin):
        raise TmpiError("module %s has no source file to run (%s)." % (name, spec.origin))
    return spec.origin, len(parts) > 1


def target_file(target):
    """The file that runs: the script, or the module's source."""
    kind, name = as_target(target)
    return find_module(name)[0] if kind == "module" else os.path.abspath(name)


@contextlib.contextmanager
def as_python_runs(target, args):
    """``sys.argv`` and ``sys.path[0]`` as ``python SCRIPT ARGS`` (or ``python
    -m MODULE ARGS``) would set them, instead of this process's own, until
    the block ends."""
    kind, name = as_target(target)
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [target_file(target) if kind == "module" else name] + list(args)
    if not getattr(sys.flags, "safe_path", False):  # python -P adds no first entry
        first = module_path0() if kind == "module" else script_path0(name)
        if sys.path:
            sys.path[0] = first
        else:
            sys.path.append(first)
    try:
        yield
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def run_target(target):
    """Run ``target`` as ``__main__`` (inside :func:`as_python_runs`); returns
    ``None`` when it returned, the ``SystemExit`` that ended it otherwise."""
    kind, name = as_target(target)
    try:
        if kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            run_script(name)
    except SystemExit as exit_:
        return exit_
    return None


def run_script(name):
    """Run the script ``name`` as ``python name`` does: as ``__main__``, its
    ``__file__`` absolute, ``sys.argv[0]`` left as typed (``runpy.run_path``
    would put the path it was given there)."""
    # As python makes it absolute: joined to the working directory, as it is.
    path = name if os.path.isabs(name) else os.path.join(os.getcwd(), name)
    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    from importlib.machinery import SourceFileLoader
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                         __loader__=SourceFileLoader("__main__", path),
                         __builtins__=builtins)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def parse_argv(argv):
    """``(target, args)`` from ``SCRIPT ARGS...`` or ``-m MODULE ARGS...``."""
    if argv[0] == "-m" and len(argv) > 1:
        return ("module", argv[1]), argv[2:]
    return ("script", argv[0]), argv[1:]
