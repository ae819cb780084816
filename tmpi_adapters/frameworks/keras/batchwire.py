"""A batch of a generator-fed loop as one buffer, and what else rank 0 hands out.

:mod:`~tmpi_adapters.frameworks.keras.feeding` broadcasts each message in two
parts: a :func:`header` (the message's kind and bytes, the bytes of the batch
drawn ahead, the batch's number and a checksum of its stream's name), then
the buffer :func:`pack` makes: the length of a small pickle of the batch's
structure and the arrays' layout, that pickle, then the arrays' bytes at
:data:`ALIGN` boundaries (arrays never pickled).  The pickle comes from rank 0
of the same job, as every collective's bytes do.
"""
import pickle
import zlib

import numpy as np

from tmpi_adapters.errors import TmpiError

#: The arrays of a message start at multiples of this many bytes.
ALIGN = 64


class _Slot:
    """Where an array of a batch goes back into its structure."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __getstate__(self):
        return self.index

    def __setstate__(self, index):
        self.index = index


def _mapped(value, leaf):
    """``value`` with each leaf ``leaf`` answers for (not ``None``) replaced,
    through tuples, lists and dicts."""
    found = leaf(value)
    if found is not None:
        return found
    if type(value) is tuple:
        return tuple(_mapped(v, leaf) for v in value)
    if type(value) is list:
        return [_mapped(v, leaf) for v in value]
    if type(value) is dict:
        return {k: _mapped(v, leaf) for k, v in value.items()}
    return value


def _take_arrays(value, arrays):
    """``value`` with its numpy arrays (of plain dtypes) taken out into
    ``arrays`` and :class:`_Slot` s in their place."""
    def take(leaf):
        if type(leaf) is np.ndarray and not leaf.dtype.hasobject:
            arrays.append(leaf)
            return _Slot(len(arrays) - 1)
        return None
    return _mapped(value, take)


def _put_arrays(value, arrays):
    return _mapped(value, lambda leaf: arrays[leaf.index] if isinstance(leaf, _Slot) else None)


def header(kind, size, following, stream):
    """What rank 0 broadcasts first: the kind of message, its bytes (0: drawn
    ahead, on its way), the bytes of the next batch drawn ahead (0: none), the
    batch's number and a checksum of the stream's name."""
    return np.array([kind, size, following, stream.count, crc(stream.label)], dtype=np.int64)


def crc(label):
    return zlib.crc32(label.encode("utf-8"))


def pack(label, count, value, batch=True):
    """One message: ``int64`` length of the pickle, the pickle of ``(label,
    count, structure, layout)``, then the arrays' bytes at :data:`ALIGN`
    boundaries (``batch``: ``value``'s arrays travel as bytes, not pickled)."""
    arrays = []
    skeleton = _take_arrays(value, arrays) if batch else value
    arrays = [np.ascontiguousarray(a) for a in arrays]
    layout, offset = [], 0
    for array in arrays:
        offset = _aligned(offset)
        layout.append((offset, array.dtype.str, array.shape))
        offset += array.nbytes
    meta = pickle.dumps((label, count, skeleton, layout), protocol=4)
    start = _aligned(8 + len(meta))
    buffer = np.empty(start + offset, dtype=np.uint8)
    buffer[:8] = np.frombuffer(np.int64(len(meta)).tobytes(), dtype=np.uint8)
    buffer[8:8 + len(meta)] = np.frombuffer(meta, dtype=np.uint8)
    for (at, _, _), array in zip(layout, arrays):
        if array.nbytes:
            buffer[start + at:start + at + array.nbytes] = array.reshape(-1).view(np.uint8)
    return buffer


def unpack(buffer):
    """``(label, count, value)`` of a :func:`_pack` message; the arrays are
    views of ``buffer``."""
    length = int(np.frombuffer(buffer[:8].tobytes(), dtype=np.int64)[0])
    label, count, skeleton, layout = pickle.loads(buffer[8:8 + length].tobytes())
    start = _aligned(8 + length)
    arrays = []
    for at, dtype, shape in layout:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        arrays.append(buffer[start + at:start + at + nbytes].view(dtype).reshape(shape))
    return label, count, _put_arrays(skeleton, arrays)


def size_text(nbytes):
    return "%.1f MB" % (nbytes / 1e6) if nbytes >= 1e5 else "%.1f kB" % (nbytes / 1e3)


def _aligned(offset):
    return -(-offset // ALIGN) * ALIGN


def pickled_error(error):
    """Rank 0's generator's ``error`` as the other ranks will raise it."""
    try:
        data = pickle.dumps(error, protocol=4)
        pickle.loads(data)
        return ("pickle", data)
    except Exception:  # noqa: BLE001 - an error of any kind travels as its text
        return ("text", "%s: %s" % (type(error).__name__, error))


def raised_on_root(travelled):
    how, data = travelled
    error = None
    if how == "pickle":
        try:
            error = pickle.loads(data)
        except Exception:  # noqa: BLE001 - its class is not importable here
            error = None
    if not isinstance(error, BaseException):
        error = TmpiError("rank 0's generator raised %s" % (
            data if how == "text" else "an error this rank cannot rebuild"))
    error.add_note("(rank 0's generator raised this; under tmpi rank 0 alone draws the "
                   "batches and the other ranks raise what it raised)")
    return error
