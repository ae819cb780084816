"""Compatibility shims that let the 2017-era Theano stack run on Python 3.11.

Every shim lives here, applied once by :func:`apply` before any user code runs
(``tmpi wrap``, ``tmpi run``, the decorator and ``import tmpi_adapters`` all call
it).  Each shim restores one thing and says why.  None of them imports Theano,
Keras or Lasagne eagerly: shims for a library are attached with
:func:`when_imported` and run right after that library's own import.
"""
import collections
import collections.abc
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import types

__all__ = ["apply", "theano_flags", "when_imported"]

_applied = False

#: Theano flags tmpi adds unless the user already set them.
DEFAULT_THEANO_FLAGS = {
    # Theano 1.0.5 reads numpy.distutils' BLAS info when this is unset, which
    # numpy 1.23 no longer provides; the NumPy C-API fallback is within ~10% of
    # OpenBLAS on the models we run.
    "blas.ldflags": "",
}


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
    """Runs callbacks right after a watched module finishes importing."""

    def __init__(self):
        self.callbacks = {}
        self._busy = set()

    def find_spec(self, name, path=None, target=None):
        if name not in self.callbacks or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None:
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


_finder = _PostImportFinder()


def when_imported(name, callback):
    """Call ``callback(module)`` once module ``name`` is imported (now, if it is)."""
    if name in sys.modules and sys.modules[name] is not None:
        callback(sys.modules[name])
        return
    _finder.callbacks.setdefault(name, []).append(callback)
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


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
    logging.getLogger("theano.tensor.blas").setLevel(logging.ERROR)


def _alias_lasagne_downsample():
    # Lasagne 0.1 imports theano.tensor.signal.downsample, removed in Theano
    # 1.0; pool_2d still accepts its ds/st/padding keywords.
    name = "theano.tensor.signal.downsample"
    if name in sys.modules:
        return
    module = types.ModuleType(name, "tmpi alias of theano.tensor.signal.pool for Lasagne 0.1")

    def max_pool_2d(input, ds=None, ignore_border=None, st=None, padding=(0, 0), mode="max"):
        from theano.tensor.signal.pool import pool_2d
        return pool_2d(input, ws=ds, ignore_border=ignore_border, stride=st, pad=padding,
                       mode=mode)

    module.max_pool_2d = max_pool_2d
    sys.modules[name] = module


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


def apply():
    """Apply every shim once; safe to call again."""
    global _applied
    if _applied:
        return
    _applied = True
    _restore_collections_aliases()
    _restore_getargspec()
    _disable_scan_cython()
    _set_theano_flags()
    _alias_lasagne_downsample()
    # Keras 2.3.1 is the last Keras with a Theano backend; it must not look for
    # TensorFlow.
    os.environ.setdefault("KERAS_BACKEND", "theano")
    when_imported("h5py", _patch_h5py_attrs)
