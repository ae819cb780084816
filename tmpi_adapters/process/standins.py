"""Stand-ins for modules that Python 3.12 (and numpy on it) removed and
2017-era code still imports: built only when such code imports them, by the
shims in :mod:`tmpi_adapters.process.compat`, which say why each is needed.

Like compat, this imports nothing but the standard library (numpy where the
stand-in is numpy's).
"""
import importlib.util
import os
import sys
import types


def numpy_distutils():
    """``numpy.distutils`` with the names Theano 1.0.5 reads (numpy's headers,
    its BLAS info); numpy has none on Python 3.12."""
    import numpy
    package = types.ModuleType("numpy.distutils",
                               "tmpi stand-in for numpy.distutils (gone on Python 3.12)")
    package.__path__ = []
    misc_util = types.ModuleType("numpy.distutils.misc_util")
    misc_util.get_numpy_include_dirs = lambda: [numpy.get_include()]
    config = types.ModuleType("numpy.distutils.__config__")
    # No BLAS to report: Theano then links none, as with blas.ldflags= (tmpi's default).
    config.blas_opt_info = {}
    system_info = types.ModuleType("numpy.distutils.system_info")

    class _SystemInfo:
        verbosity = 0

    system_info.system_info = _SystemInfo
    system_info.get_info = lambda name, notfound_action=0: {}
    for name, module in (("misc_util", misc_util), ("__config__", config),
                         ("system_info", system_info)):
        setattr(package, name, module)
        sys.modules[module.__name__] = module
    return package


def imp():
    """``imp`` as Python 3.11 had it, for what 2017-era scripts call:
    ``load_source``, ``find_module``/``load_module``, ``reload``,
    ``new_module``, ``get_suffixes`` and the import lock (Python 3.12 removed
    the module)."""
    import _imp
    import importlib.machinery
    module = types.ModuleType("imp", "tmpi stand-in for the imp module Python 3.12 removed")
    module.SEARCH_ERROR, module.PY_SOURCE, module.PY_COMPILED, module.C_EXTENSION = 0, 1, 2, 3
    module.PKG_DIRECTORY, module.C_BUILTIN, module.PY_FROZEN = 5, 6, 7
    module.reload = importlib.reload
    module.new_module = types.ModuleType
    module.cache_from_source = importlib.util.cache_from_source
    module.source_from_cache = importlib.util.source_from_cache
    module.get_magic = lambda: importlib.util.MAGIC_NUMBER
    module.get_tag = lambda: sys.implementation.cache_tag
    for name in ("is_builtin", "acquire_lock", "release_lock", "lock_held"):
        setattr(module, name, getattr(_imp, name))

    def get_suffixes():
        return ([(s, "rb", module.C_EXTENSION) for s in importlib.machinery.EXTENSION_SUFFIXES]
                + [(s, "r", module.PY_SOURCE) for s in importlib.machinery.SOURCE_SUFFIXES]
                + [(s, "rb", module.PY_COMPILED) for s in importlib.machinery.BYTECODE_SUFFIXES])

    def _load(name, loader, pathname, package_dir=None):
        spec = importlib.util.spec_from_file_location(
            name, pathname, loader=loader,
            submodule_search_locations=None if package_dir is None else [package_dir])
        existing = sys.modules.get(name)
        if existing is not None:
            spec.loader.exec_module(existing)  # as imp did: reload in place
            return existing
        new = importlib.util.module_from_spec(spec)
        sys.modules[name] = new
        try:
            spec.loader.exec_module(new)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        return new

    def load_source(name, pathname, file=None):
        return _load(name, importlib.machinery.SourceFileLoader(name, pathname), pathname)

    def load_compiled(name, pathname, file=None):
        return _load(name, importlib.machinery.SourcelessFileLoader(name, pathname), pathname)

    def load_dynamic(name, path, file=None):
        return _load(name, importlib.machinery.ExtensionFileLoader(name, path), path)

    def load_package(name, path):
        init = os.path.join(path, "__init__.py")
        return _load(name, importlib.machinery.SourceFileLoader(name, init), init, path)

    def find_module(name, path=None):
        if path is None and name in sys.builtin_module_names:
            return None, name, ("", "", module.C_BUILTIN)
        for entry in sys.path if path is None else path:
            base = os.path.join(entry, name)
            if os.path.isfile(os.path.join(base, "__init__.py")):
                return None, base, ("", "", module.PKG_DIRECTORY)
            for suffix, mode, kind in get_suffixes():
                candidate = base + suffix
                if os.path.isfile(candidate):
                    if "b" in mode:
                        return open(candidate, mode), candidate, (suffix, mode, kind)
                    import tokenize
                    with open(candidate, "rb") as raw:
                        encoding = tokenize.detect_encoding(raw.readline)[0]
                    return open(candidate, mode, encoding=encoding), candidate, (suffix, mode,
                                                                                kind)
        raise ImportError("No module named %r" % name, name=name)

    def load_module(name, file, filename, details):
        kind = details[2]
        try:
            if kind == module.PY_SOURCE:
                return load_source(name, filename)
            if kind == module.PY_COMPILED:
                return load_compiled(name, filename)
            if kind == module.C_EXTENSION:
                return load_dynamic(name, filename)
            if kind == module.PKG_DIRECTORY:
                return load_package(name, filename)
            if kind == module.C_BUILTIN:
                return importlib.import_module(name)
            raise ImportError("Don't know how to import %s (type code %r)" % (name, kind),
                              name=name)
        finally:
            if file is not None:
                file.close()

    for function in (get_suffixes, load_source, load_compiled, load_dynamic, load_package,
                     find_module, load_module):
        setattr(module, function.__name__, function)
    return module
