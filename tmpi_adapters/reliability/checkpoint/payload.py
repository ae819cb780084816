"""A checkpoint's state as data: a JSON tree and numpy arrays, no pickle.

The payload of a format-2 checkpoint is an ``.npz`` archive (numpy's zip of
``.npy`` files), read with ``allow_pickle=False``: the member ``tree`` holds
the state as UTF-8 JSON, and every array, scalar or byte string in it is a
member of its own (``a0``, ``a1``, ...) that the tree names.  Loading it
builds arrays and plain values and runs nothing: a file that is not of this
shape is refused.

What a state may hold (:func:`check` says so at the first checkpoint, naming
where): ``None``, booleans, integers, floats, complex numbers, strings and
bytes; numpy arrays of any dtype but ``object``, numpy scalars and dtypes;
numpy's ``RandomState`` (its state); and lists, tuples, sets and dicts of
these (dicts keyed by any of them).

In the tree, JSON's own values stand for themselves (lists for lists, objects
for dicts whose keys are strings); every other value is an object of one key
beginning with ``$`` (:data:`TAGS`).
"""
import io
import json
import zipfile

import numpy as np

from tmpi_adapters.errors import CheckpointError

#: What a state may hold, in words, for the messages.
ALLOWED_WORDS = ("arrays (numpy, not of dtype object), numbers, strings, bytes, None, and "
                 "lists, tuples, sets and dicts of them")

TREE = "tree"
BIT_GENERATORS = ("MT19937", "PCG64", "Philox", "SFC64")


class StateError(CheckpointError):
    """A value that a checkpoint cannot hold, and where it is.

    Attributes
    ----------
    found : str
        The value's type and its path from the top of what was checked
        (``a mymodule.Thing at ['plugins']['x'][0]``).
    """

    def __init__(self, where, value):
        kind = type(value)
        self.found = "a %s.%s%s" % (kind.__module__, kind.__qualname__,
                                    " at %s" % where if where else "")
        super().__init__("%s: a checkpoint holds only %s." % (self.found, ALLOWED_WORDS))


class _Encoder:
    def __init__(self):
        self.arrays = []

    def member(self, array):
        self.arrays.append(array)
        return len(self.arrays) - 1

    def encode(self, value, where=""):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, np.generic):   # before float: np.float64 is one
            if value.dtype.hasobject:
                raise StateError(where, value)
            return {"$scalar": self.member(np.asarray(value))}
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return float(value)
        if isinstance(value, complex):
            return {"$complex": [value.real, value.imag]}
        if isinstance(value, (bytes, bytearray)):
            return {"$bytes": self.member(np.frombuffer(bytes(value), dtype=np.uint8))}
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                raise StateError(where, value)
            return {"$array": self.member(value)}
        if isinstance(value, np.dtype):
            return {"$dtype": self.encode(np.lib.format.dtype_to_descr(value), where)}
        if isinstance(value, np.random.RandomState):
            return {"$RandomState": self.encode(value.get_state(legacy=False), where)}
        if isinstance(value, list):
            return [self.encode(v, "%s[%d]" % (where, i)) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"$tuple": [self.encode(v, "%s[%d]" % (where, i))
                               for i, v in enumerate(value)]}
        if isinstance(value, (set, frozenset)):
            return {"$set" if isinstance(value, set) else "$frozenset":
                    [self.encode(v, where + "{...}") for v in value]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: self.encode(v, "%s[%r]" % (where, k)) for k, v in value.items()}
            return {"$dict": [[self.encode(k, where + "{key}"),
                               self.encode(v, "%s[%r]" % (where, k))]
                              for k, v in value.items()]}
        raise StateError(where, value)


def check(value):
    """Raise :class:`StateError` if ``value`` holds anything a checkpoint cannot."""
    _Encoder().encode(value)


def encode(state):
    """The payload bytes of ``state``: an uncompressed ``.npz`` archive."""
    encoder = _Encoder()
    tree = json.dumps(encoder.encode(state), separators=(",", ":")).encode()
    members = {"a%d" % i: a for i, a in enumerate(encoder.arrays)}
    members[TREE] = np.frombuffer(tree, dtype=np.uint8)
    out = io.BytesIO()
    np.savez(out, **members)
    return out.getvalue()


class _Decoder:
    def __init__(self, archive):
        self.archive = archive

    def member(self, index):
        if not isinstance(index, int):
            raise ValueError("a member index %r" % (index,))
        return self.archive["a%d" % index]

    def decode(self, node):
        if isinstance(node, list):
            return [self.decode(n) for n in node]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            (tag, body), = node.items()
            if tag.startswith("$"):
                return self.tagged(tag, body)
        return {k: self.decode(v) for k, v in node.items()}

    def tagged(self, tag, body):
        if tag == "$array":
            return self.member(body)
        if tag == "$scalar":
            return self.member(body)[()]
        if tag == "$bytes":
            return self.member(body).tobytes()
        if tag == "$complex":
            return complex(*body)
        if tag == "$tuple":
            return tuple(self.decode(body))
        if tag in ("$set", "$frozenset"):
            return (set if tag == "$set" else frozenset)(self.decode(body))
        if tag == "$dict":
            return {self.decode(k): self.decode(v) for k, v in body}
        if tag == "$dtype":
            return np.lib.format.descr_to_dtype(self.decode(body))
        if tag == "$RandomState":
            state = self.decode(body)
            name = state.get("bit_generator")
            if name not in BIT_GENERATORS:
                raise ValueError("a RandomState of bit generator %r" % (name,))
            generator = np.random.RandomState(getattr(np.random, name)())
            generator.set_state(state)
            return generator
        raise ValueError("an unknown tag %r" % tag)


def decode(payload, path):
    """The state in ``payload`` (bytes of :func:`encode`): arrays and plain
    values only; :class:`CheckpointError` naming ``path`` when it is not one."""
    try:
        with np.load(io.BytesIO(payload), allow_pickle=False) as archive:
            tree = json.loads(archive[TREE].tobytes().decode())
            return _Decoder(archive).decode(tree)
    except (ValueError, KeyError, TypeError, AttributeError, OSError, EOFError,
            UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise CheckpointError("checkpoint %s cannot be loaded: its state is not arrays and "
                              "plain values as tmpi writes them (%s: %s). Nothing in it was "
                              "run." % (path, type(exc).__name__, exc))
