"""Compatibility shims that let the 2017-era Theano stack run on Python 3.11
and 3.12.

Every shim lives here and restores one thing, saying why.  They are applied
in one of two ways, never by importing ``tmpi_adapters``:

:func:`apply`
    everything at once, where a run starts (``tmpi wrap``'s ranks,
    ``tmpi run``, the decorator, the Blocks extension).
:func:`install`
    nothing yet: each shim waits for the import of the library it is for
    (Theano, Keras, Lasagne, Blocks, Fuel, h5py) and is applied just before
    or after it.  The start-up hook that ``make install`` writes into the
    virtual environment (``tmpi_adapters_shims.pth``) calls it, so plain
    ``python train.py``, ``pytest`` and ``mpiexec python`` in that
    environment run the script as they would on the Python it was written for.

This module imports nothing but the standard library: the start-up hook
runs in every interpreter of the environment.
"""
from __future__ import annotations

import collections
import collections.abc
import importlib.abc
import importlib.util
import os
import sys
import types

# Types are for type checkers: the start-up hook imports nothing it need not.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["apply", "install", "theano_flags", "when_imported", "before_import"]

_applied = False

#: Theano flags tmpi adds unless the user already set them.
DEFAULT_THEANO_FLAGS = {
    # Theano 1.0.5 reads numpy.distutils' BLAS info when this is unset, which
    # numpy 1.23 no longer provides; the NumPy C-API fallback is within ~10% of
    # OpenBLAS on the models we run.
    "blas.ldflags": "",
    # The ranks of a job compile the same C modules at once, queueing on
    # Theano's compile lock; its default retry sleeps 5-10 s, this one 1-2 s.
    "compile.wait": "1",
}


class Patcher:
    """Replaces attributes and puts the originals back on :meth:`restore`: how
    tmpi patches a library, for a shim or for the length of a run (a framework
    adapter's hooks, the generators a checkpoint tracks)."""

    def __init__(self) -> None:
        self._saved: list[tuple[object, str, Any]] = []

    def patch(self, owner: object, name: str, value: object) -> Any:
        """Set ``owner.name`` to ``value``; returns the original."""
        original = getattr(owner, name)
        self._saved.append((owner, name, original))
        setattr(owner, name, value)
        return original

    def restore(self) -> None:
        while self._saved:
            owner, name, original = self._saved.pop()
            setattr(owner, name, original)


def theano_flags(env=None, **extra):
    """Return ``THEANO_FLAGS`` with tmpi's defaults added under the user's own.

    Parameters
    ----------
    env : mapping, optional
        Environment to read the current ``THEANO_FLAGS`` from (``os.environ``).
    **extra
        More ``flag=value`` defaults (dots spelt as ``__``); the user's flags
        still win.
    """
    env = os.environ if env is None else env
    current = env.get("THEANO_FLAGS", "")
    present = {item.split("=", 1)[0].strip() for item in current.split(",") if "=" in item}
    defaults = dict(DEFAULT_THEANO_FLAGS)
    defaults.update({k.replace("__", "."): str(v) for k, v in extra.items()})
    added = ["%s=%s" % (k, v) for k, v in defaults.items() if k not in present]
    return ",".join([f for f in [current.strip(",")] + added if f])


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Runs callbacks just before a watched module is imported
    (:attr:`before`) or right after it finished importing (:attr:`callbacks`),
    serves modules that exist only as aliases (:attr:`aliases`), and modules
    that newer Pythons or numpy removed where nothing else provides them
    (:attr:`fallbacks`: name to a function of the name that returns its spec,
    or None)."""

    def __init__(self):
        self.callbacks = {}
        self.before = {}
        self.aliases = {}
        self.fallbacks = {}
        self._busy = set()

    def find_spec(self, name, path=None, target=None):
        for callback in self.before.pop(name, []):
            callback()
        if name in self.aliases:
            return importlib.util.spec_from_loader(name, _AliasLoader(self.aliases.pop(name)))
        if name in self._busy or (name not in self.callbacks and name not in self.fallbacks):
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        if spec is None and name in self.fallbacks:
            return self.fallbacks.pop(name)(name)
        if spec is None or spec.loader is None or name not in self.callbacks:
            return spec
        loader = spec.loader
        exec_module = loader.exec_module
        callbacks = self.callbacks

        def exec_then_patch(module):
            exec_module(module)
            for callback in callbacks.pop(name, []):
                callback(module)

        loader.exec_module = exec_then_patch
        return spec


class _AliasLoader(importlib.abc.Loader):
    """Loads a module that ``make()`` builds."""

    def __init__(self, make):
        self.make = make

    def create_module(self, spec):
        return self.make()

    def exec_module(self, module):
        pass


_finder = _PostImportFinder()


def _watch():
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def before_import(name, callback):
    """Call ``callback()`` just before module ``name`` is first imported (now,
    if it already is)."""
    if name in sys.modules:
        callback()
        return
    _finder.before.setdefault(name, []).append(callback)
    _watch()


def when_imported(name, callback):
    """Call ``callback(module)`` once module ``name`` is imported (now, if it is)."""
    if name in sys.modules and sys.modules[name] is not None:
        callback(sys.modules[name])
        return
    _finder.callbacks.setdefault(name, []).append(callback)
    _watch()


# ---------------------------------------------------------------- the shims

def _restore_collections_aliases():
    # Keras 2.3.1, Blocks and Fuel use collections.Iterable & co., moved to
    # collections.abc and removed from collections in Python 3.10.
    for name in ("Iterable", "Mapping", "MutableMapping", "Sequence", "Callable",
                 "Hashable", "Sized", "Container", "MutableSet", "Set",
                 "Iterator", "Generator", "MutableSequence"):
        if not hasattr(collections, name):
            setattr(collections, name, getattr(collections.abc, name))


def _restore_getargspec():
    # Blocks and picklable-itertools call inspect.getargspec, removed in 3.11.
    import inspect
    if hasattr(inspect, "getargspec"):
        return
    ArgSpec = collections.namedtuple("ArgSpec", "args varargs keywords defaults")

    def getargspec(func):
        spec = inspect.getfullargspec(func)
        return ArgSpec(spec.args, spec.varargs, spec.varkw, spec.defaults)

    inspect.getargspec = getargspec


def _disable_scan_cython():
    # Theano's shipped scan_perform.c needs longintrepr.h, gone in 3.11; a
    # failing import sends Scan to its working pure-Python path.
    sys.modules.setdefault("theano.scan_module.scan_perform_ext", None)


def _set_theano_flags():
    os.environ["THEANO_FLAGS"] = theano_flags()
    # With blas.ldflags empty Theano warns once per process; tmpi chose that.
    import logging
    logging.getLogger("theano.tensor.blas").setLevel(logging.ERROR)


_DOWNSAMPLE = "theano.tensor.signal.downsample"


def _alias_lasagne_downsample():
    # Lasagne 0.1 imports theano.tensor.signal.downsample, removed in Theano
    # 1.0; pool_2d still accepts its ds/st/padding keywords.
    if _DOWNSAMPLE not in sys.modules:
        sys.modules[_DOWNSAMPLE] = _downsample_module()


def _downsample_module():
    module = types.ModuleType(_DOWNSAMPLE,
                              "tmpi alias of theano.tensor.signal.pool for Lasagne 0.1")

    def max_pool_2d(input, ds=None, ignore_border=None, st=None, padding=(0, 0), mode="max"):
        from theano.tensor.signal.pool import pool_2d
        return pool_2d(input, ws=ds, ignore_border=ignore_border, stride=st, pad=padding,
                       mode=mode)

    module.max_pool_2d = max_pool_2d
    return module


class _DecodableStr(str):
    """A ``str`` that also answers ``.decode()``, as h5py 2 attributes did."""

    def decode(self, encoding="utf-8", errors="strict"):
        return str(self)


def _patch_h5py_attrs(h5py):
    # Keras 2.3.1 calls .decode on HDF5 attributes that h5py 3 already returns
    # as str, so load_model/load_weights fail; hand back str that decodes.
    manager = h5py.AttributeManager
    if getattr(manager.__getitem__, "_tmpi_shim", False):
        return
    original = manager.__getitem__

    def __getitem__(self, name):
        value = original(self, name)
        if isinstance(value, str):
            return _DecodableStr(value)
        if getattr(value, "dtype", None) is not None and value.dtype.kind == "O":
            import numpy
            return numpy.array([_DecodableStr(v) if isinstance(v, str) else v
                                for v in value.ravel()], dtype=object).reshape(value.shape)
        return value

    __getitem__._tmpi_shim = True
    manager.__getitem__ = __getitem__


def _keras_backend():
    # Keras 2.3.1 is the last Keras with a Theano backend; it must not look for
    # TensorFlow.
    os.environ.setdefault("KERAS_BACKEND", "theano")


def _version_ops_without_props(cc):
    # Theano 1.0.5 puts each op's __props__ among the versions of a C
    # module's key and takes any empty entry for "unversioned": every op
    # whose __props__ is () (Alloc, Shape, DeepCopyOp, the softmax and
    # cross-entropy ops, MRG's DotModulo, ...) is compiled again by every
    # process, each holding the machine-wide compile lock that the other
    # ranks then wait on for 5-10 s.  Such an op's instances are all equal,
    # so its C code is fixed by its class, its c_code_cache_version and its
    # node's types, all of which stay in the key; only the empty props are
    # read as present.
    linker = cc.CLinker
    if getattr(linker.cmodule_key_, "_tmpi_shim", False):
        return
    original = linker.cmodule_key_

    def cmodule_key_(self, fgraph, no_recycling, *args, **kwargs):
        key = original(self, fgraph, no_recycling, *args, **kwargs)
        if key is None or key[0] != ():
            return key
        version = []
        for node in self.schedule(fgraph):
            found = [v.type.c_code_cache_version() for v in node.inputs + node.outputs]
            if hasattr(node.op, "c_code_cache_version_apply"):
                found.insert(0, node.op.c_code_cache_version_apply(node))
            if not all(found):
                return key  # a really unversioned op or type
            version += found
            if hasattr(node.op, "__props__"):
                version.append(("props",) + tuple(node.op.__props__))
        return tuple(version), key[1]

    cmodule_key_._tmpi_shim = True
    linker.cmodule_key_ = cmodule_key_


# -- what Python 3.12 and numpy 1.24 removed (numpy 1.26 is 3.12's first numpy);
# each shim is lazy and does nothing where the name still exists (Python 3.11
# with numpy 1.23 is left as it is).

#: numpy's aliases of builtins and old names that numpy 1.24 removed, as numpy
#: 1.23 answered them (with its DeprecationWarning).
_NUMPY_ALIASES = {"bool": bool, "int": int, "float": float, "complex": complex,
                  "object": object, "str": str, "long": int, "unicode": str}


def _restore_numpy_aliases(numpy):
    # 2017-era scripts and Keras' numpy backend use np.int, np.float, np.bool
    # & co., which numpy 1.24 removed (3.12 has no older numpy); served again
    # with the DeprecationWarning numpy 1.23 gave.
    original = getattr(numpy, "__getattr__", None)
    if original is None or getattr(original, "_tmpi_shim", False):
        return
    import warnings
    aliases = dict(_NUMPY_ALIASES, typeDict=numpy.sctypeDict)
    missing = {}
    for name, value in aliases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # numpy 1.26 warns on the way to its error
            try:
                original(name)
            except AttributeError:
                missing[name] = value
    if not missing:
        return

    def __getattr__(name):
        if name not in missing:
            return original(name)
        value = missing[name]
        warnings.warn("`np.%s` is a deprecated alias (removed in numpy 1.24, restored by tmpi "
                      "for old scripts): use `%s`" % (name, "np.sctypeDict" if name == "typeDict"
                                                      else value.__name__),
                      DeprecationWarning, stacklevel=2)
        return value

    __getattr__._tmpi_shim = True
    numpy.__getattr__ = __getattr__


def _distutils_spec(name):
    # Python 3.12 removed distutils, which Theano's C compiler driver imports
    # (sysconfig, spawn); setuptools (a requirement of tmpi's on 3.12) serves
    # its copy, so this only says what to do where setuptools is missing.
    if importlib.util.find_spec("setuptools") is not None:
        return None
    raise ModuleNotFoundError(
        "No module named 'distutils': Python 3.12 removed it and Theano 1.0.5 imports it; "
        "install setuptools, which provides it: pip install 'setuptools<80'", name=name)


def _restore_configparser_names(configparser):
    # Python 3.12 removed SafeConfigParser (ConfigParser since 3.2) and readfp
    # (read_file), which 2017-era code and setups still call.
    if not hasattr(configparser, "SafeConfigParser"):
        configparser.SafeConfigParser = configparser.ConfigParser
    if not hasattr(configparser.RawConfigParser, "readfp"):
        def readfp(self, fp, filename=None):
            return self.read_file(fp, source=filename)
        configparser.RawConfigParser.readfp = readfp


#: unittest.TestCase's old names that Python 3.12 removed, and what they were.
_UNITTEST_ALIASES = {
    "failUnlessEqual": "assertEqual", "assertEquals": "assertEqual",
    "failIfEqual": "assertNotEqual", "assertNotEquals": "assertNotEqual",
    "failUnlessAlmostEqual": "assertAlmostEqual", "assertAlmostEquals": "assertAlmostEqual",
    "failIfAlmostEqual": "assertNotAlmostEqual", "assertNotAlmostEquals": "assertNotAlmostEqual",
    "failUnless": "assertTrue", "assert_": "assertTrue", "failUnlessRaises": "assertRaises",
    "failIf": "assertFalse", "assertRaisesRegexp": "assertRaisesRegex",
    "assertRegexpMatches": "assertRegex", "assertNotRegexpMatches": "assertNotRegex",
}


def _restore_unittest_aliases(unittest):
    # Python 3.12 removed TestCase's old names (assertEquals, failUnless, ...)
    # and assertDictContainsSubset, which the tests beside 2017-era models use.
    case = unittest.TestCase
    for old, new in _UNITTEST_ALIASES.items():
        if not hasattr(case, old):
            setattr(case, old, _deprecated_alias(old, getattr(case, new)))
    if not hasattr(case, "assertDictContainsSubset"):
        def assertDictContainsSubset(self, subset, dictionary, msg=None):
            missing = [repr(k) for k in subset if k not in dictionary]
            mismatched = ["%r, expected: %r, actual: %r" % (k, v, dictionary[k])
                          for k, v in subset.items() if k in dictionary and dictionary[k] != v]
            if missing or mismatched:
                parts = (["Missing: " + ",".join(missing)] if missing else []) + (
                    ["Mismatched values: " + "; ".join(mismatched)] if mismatched else [])
                self.fail(self._formatMessage(msg, "; ".join(parts)))
        case.assertDictContainsSubset = assertDictContainsSubset


def _deprecated_alias(old, method):
    def alias(self, *args, **kwargs):
        import warnings
        warnings.warn("Please use %s instead." % method.__name__, DeprecationWarning, 2)
        return method(self, *args, **kwargs)
    alias.__name__ = old
    return alias


def _quiet_invalid_escapes():
    # Python 3.12 reports invalid escape sequences ("\\s" in a docstring, common
    # in 2017-era scripts) as a SyntaxWarning at every run, where 3.11 raised a
    # DeprecationWarning that is hidden by default; left alone where the user
    # chose warnings (-W, PYTHONWARNINGS).
    if sys.version_info >= (3, 12) and not sys.warnoptions:
        import warnings
        warnings.filterwarnings("ignore", "invalid escape sequence", SyntaxWarning)


def _standin(builder):
    """The spec of a stand-in module that ``standins.<builder>()`` makes
    (standins.py is imported only when a script imports such a module)."""
    def make():
        from tmpi_adapters.process import standins
        return getattr(standins, builder)()
    return lambda name: importlib.util.spec_from_loader(name, _AliasLoader(make))


def _for_removed_names():
    _quiet_invalid_escapes()
    # Python 3.12 removed imp; 2017-era scripts load configs and model
    # definitions with imp.load_source / find_module / load_module / reload.
    _finder.fallbacks.setdefault("imp", _standin("imp"))
    _finder.fallbacks.setdefault("distutils", _distutils_spec)
    # Theano imports numpy.distutils for numpy's headers and BLAS info, which
    # numpy dropped on Python 3.12.
    _finder.fallbacks.setdefault("numpy.distutils", _standin("numpy_distutils"))
    when_imported("numpy", _restore_numpy_aliases)
    when_imported("configparser", _restore_configparser_names)
    when_imported("unittest", _restore_unittest_aliases)
    _watch()


def _for_old_libraries():
    _restore_collections_aliases()
    _restore_getargspec()


def _for_theano():
    _disable_scan_cython()
    _set_theano_flags()
    when_imported("theano.gof.cc", _version_ops_without_props)


def apply():
    """Apply every shim now (where a run starts); safe to call again."""
    global _applied
    if _applied:
        return
    _applied = True
    _for_removed_names()
    _for_old_libraries()
    _for_theano()
    _alias_lasagne_downsample()
    _keras_backend()
    when_imported("h5py", _patch_h5py_attrs)


#: Libraries that need the collections aliases or ``getargspec`` to import.
OLD_LIBRARIES = ("keras", "blocks", "fuel", "picklable_itertools", "lasagne")


def install():
    """Apply each shim only when the library it is for is imported.

    Called by the virtual environment's start-up hook; costs nothing in an
    interpreter that never imports Theano or its frameworks.
    """
    if _applied:
        return
    _for_removed_names()
    before_import("theano", _for_theano)
    for name in OLD_LIBRARIES:
        before_import(name, _for_old_libraries)
    before_import("keras", _keras_backend)
    _finder.aliases.setdefault(_DOWNSAMPLE, _downsample_module)
    when_imported("h5py", _patch_h5py_attrs)


#: The start-up hook's file name and its one line: site runs ``.pth`` lines
#: that start with ``import``; a tmpi that was uninstalled is passed over.
STARTUP_HOOK = "tmpi_adapters_shims.pth"
STARTUP_LINE = ("import sys; exec('try:\\n import tmpi_adapters.process.compat as c\\n "
                "c.install()\\nexcept ImportError:\\n pass')\n")


def install_startup_hook(site_packages=None):
    """Write :data:`STARTUP_HOOK` into ``site_packages`` (this interpreter's
    by default), so every interpreter of the environment calls :func:`install`;
    returns its path."""
    if site_packages is None:
        import sysconfig
        site_packages = sysconfig.get_paths()["purelib"]
    path = os.path.join(site_packages, STARTUP_HOOK)
    with open(path, "w") as handle:
        handle.write(STARTUP_LINE)
    return path


if __name__ == "__main__":
    if sys.argv[1:] == ["--install-startup-hook"]:
        print("wrote %s" % install_startup_hook())
    else:
        sys.exit("usage: python -m tmpi_adapters.process.compat --install-startup-hook")
