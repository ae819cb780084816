"""Unpickling that builds data and nothing else.

A pickle is a program: its ``GLOBAL`` and ``REDUCE`` instructions may call any
function the unpickling process can import (``os.system`` among them).  tmpi
reads pickles it did not write in two places, checkpoints of the first format
and CIFAR-10's python batches, and reads both through :func:`loads`: the
only callables a pickle may name are those of :data:`ALLOWED`, which build
numpy arrays, dtypes and scalars, numpy's legacy random generator, and the
builtin containers.  Any other name stops the load before it is constructed,
with :class:`DisallowedObject` naming it, as ``torch.load(weights_only=True)``
does.  Containers, numbers, strings and bytes need no callable at all.

Each allowed callable only builds a value from values: whatever a crafted
pickle hands them, they construct an array, a dtype, a container, or fail.
"""
import io
import pickle

#: ``module -> names`` a pickle may name.
ALLOWED = {
    "builtins": frozenset({"set", "frozenset", "complex", "slice"}),
    "collections": frozenset({"OrderedDict"}),
    "numpy": frozenset({"ndarray", "dtype"}),
    "numpy.core.multiarray": frozenset({"_reconstruct", "scalar"}),
    # RandomState pickles as its constructor by bit generator name, then its state.
    "numpy.random._pickle": frozenset({"__randomstate_ctor"}),
    # Python 2's pickles (CIFAR-10's batches) name builtins by their old module.
    "__builtin__": frozenset({"set", "frozenset", "complex", "slice"}),
    # Bytes in a protocol-2 pickle written by Python 3: text to bytes by a codec.
    "_codecs": frozenset({"encode"}),
}


class DisallowedObject(pickle.UnpicklingError):
    """A pickle named a callable outside :data:`ALLOWED`.

    Attributes
    ----------
    name : str
        ``module.name`` as the pickle spelt it.
    """

    def __init__(self, name):
        super().__init__("it names %s, which is not data" % name)
        self.name = name


class _Unpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if name in ALLOWED.get(module, ()):
            if module == "__builtin__":
                module = "builtins"
            return super().find_class(module, name)
        raise DisallowedObject("%s.%s" % (module, name))

    def persistent_load(self, pid):
        raise DisallowedObject("a persistent object %r" % (pid,))


def loads(data, encoding="ASCII"):
    """The value pickled in ``data`` (bytes or a memoryview), built through
    :data:`ALLOWED` only; :class:`DisallowedObject` before anything else is
    built, other :class:`pickle.UnpicklingError`\\ s for broken bytes.

    ``encoding`` is :func:`pickle.loads`'s, for Python 2's strings."""
    return _Unpickler(io.BytesIO(data), encoding=encoding).load()
