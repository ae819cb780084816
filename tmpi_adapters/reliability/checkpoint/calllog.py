"""The call log: every call of the script's compiled functions, and what it returned.

A resume replays the script's first calls from it (see
:mod:`~tmpi_adapters.reliability.checkpoint.replay`): each entry names the
function called, holds a :func:`fingerprint` of the arguments (to notice a
script that does not retrace its run) and, where it is small enough, what the
call returned (the metrics history the script's own loop accumulates).
"""
import array
import copy
import zlib

import numpy as np

#: Outputs of one call larger than this are not kept in the call log.
MAX_RECORDED_BYTES = 64 * 1024

#: Bytes of each array argument that go into a call's fingerprint.
FINGERPRINT_BYTES = 2048


def fingerprint(args, kwargs):
    """A cheap checksum of a call's arguments: shapes, dtypes, and the first and
    last :data:`FINGERPRINT_BYTES` bytes of every array (a reshuffled batch shows
    there), plus the text of other values."""
    crc = 0
    items = list(args) + [v for _, v in sorted(kwargs.items())]
    for value in items:
        if isinstance(value, np.ndarray):
            crc = zlib.crc32(("%s%s" % (value.shape, value.dtype.str)).encode(), crc)
            if value.size and not value.dtype.hasobject:  # pointers differ run to run
                flat = value.reshape(-1) if value.flags.c_contiguous else \
                    np.ascontiguousarray(value[:2]).reshape(-1)
                count = max(1, FINGERPRINT_BYTES // max(flat.itemsize, 1))
                crc = zlib.crc32(np.ascontiguousarray(flat[:count]).tobytes(), crc)
                crc = zlib.crc32(np.ascontiguousarray(flat[-count:]).tobytes(), crc)
        elif isinstance(value, (int, float, str, bytes, bool, np.generic)) or value is None:
            crc = zlib.crc32(repr(value).encode(), crc)
        else:
            crc = zlib.crc32(type(value).__name__.encode(), crc)
    return crc


def _element_kind(value):
    """How one returned element is stored in a column, or ``None`` (kept whole)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        shape = "0d"
    elif isinstance(value, np.generic):
        shape = "scalar"
    elif isinstance(value, bool):
        return ("bool", "b")
    elif isinstance(value, int):
        return ("int", "q")
    elif isinstance(value, float):
        return ("float", "d")
    else:
        return None
    dtype = value.dtype
    if dtype.kind == "f" and dtype.itemsize <= 8:
        return (shape, dtype.str, "d")
    if dtype.kind in "iub" and dtype.itemsize <= 8 and dtype.str not in ("<u8", ">u8"):
        return (shape, dtype.str, "q")
    return None


def template_of(value):
    """``(container, element kinds)`` of a returned value, or ``None``."""
    if isinstance(value, (list, tuple)):
        container, elements = type(value).__name__, value
    else:
        container, elements = "single", [value]
    kinds = tuple(_element_kind(e) for e in elements)
    if any(k is None for k in kinds):
        return None
    return container, kinds


def _column_value(kind, number):
    if kind[0] == "bool":
        return bool(number)
    if kind[0] == "int":
        return int(number)
    if kind[0] == "float":
        return float(number)
    dtype = np.dtype(kind[1])
    return np.array(number, dtype=dtype) if kind[0] == "0d" else dtype.type(number)


def _recorded_bytes(value):
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (list, tuple)):
        return sum(_recorded_bytes(v) for v in value)
    return 64


def _is_data(value):
    """Whether a checkpoint can hold ``value`` (else the call is not recorded
    and a replay runs it again)."""
    from tmpi_adapters.reliability.checkpoint.payload import StateError, check
    try:
        check(value)
    except StateError:
        return False
    return True


class CallLog:
    """Every call of the script's compiled functions, in order, and what it returned.

    Returned values of the usual shape (scalars, or lists of scalars, the same
    every call) are kept in one typed column per element, 8 bytes a value;
    other values whole, up to :data:`MAX_RECORDED_BYTES` a call.
    """

    NOT_RECORDED, WHOLE = -1, -2

    def __init__(self):
        self.keys = []
        self._key_ids = {}
        self.sequence = array.array("i")      # key id of each call
        self.rows = array.array("q")          # row in the key's columns, or a marker
        self.fingerprints = array.array("I")
        self.templates = {}                   # key id -> template
        self.columns = {}                     # key id -> [array per element]
        self.whole = {}                       # call index -> value

    def __len__(self):
        return len(self.sequence)

    def append(self, key, print_, value, record=True):
        """Log a call of function ``key`` with argument fingerprint ``print_``
        that returned ``value`` (kept only with ``record``)."""
        key_id = self._key_ids.get(key)
        if key_id is None:
            key_id = self._key_ids[key] = len(self.keys)
            self.keys.append(key)
        row = self.NOT_RECORDED
        if record:
            row = self._store(key_id, value)
        self.sequence.append(key_id)
        self.rows.append(row)
        self.fingerprints.append(print_ & 0xFFFFFFFF)

    def _store(self, key_id, value):
        template = self.templates.get(key_id)
        if template is None and key_id not in self.columns:
            template = template_of(value)
            if template is not None:
                self.templates[key_id] = template
                self.columns[key_id] = [array.array(kind[-1]) for kind in template[1]]
        if template is not None and template_of(value) == template:
            elements = value if template[0] != "single" else [value]
            columns = self.columns[key_id]
            for column, element in zip(columns, elements):
                column.append(element.item() if hasattr(element, "item") else element)
            return len(columns[0]) - 1 if columns else 0
        if _recorded_bytes(value) > MAX_RECORDED_BYTES or not _is_data(value):
            return self.NOT_RECORDED
        self.whole[len(self.sequence)] = copy.deepcopy(value)
        return self.WHOLE

    def key(self, index):
        """The function the ``index``-th call called."""
        return self.keys[self.sequence[index]]

    def value(self, index):
        """``(True, value)`` for a recorded call, ``(False, None)`` otherwise."""
        row = self.rows[index]
        if row == self.NOT_RECORDED:
            return False, None
        if row == self.WHOLE:
            return True, copy.deepcopy(self.whole[index])
        key_id = self.sequence[index]
        container, kinds = self.templates[key_id]
        elements = [_column_value(kind, column[row])
                    for kind, column in zip(kinds, self.columns[key_id])]
        if container == "single":
            return True, elements[0]
        return True, (tuple(elements) if container == "tuple" else list(elements))

    def state(self):
        """The log as numpy arrays and plain values, for the checkpoint."""
        return {
            "keys": list(self.keys),
            "sequence": np.frombuffer(self.sequence, dtype=np.int32).copy(),
            "rows": np.frombuffer(self.rows, dtype=np.int64).copy(),
            "fingerprints": np.frombuffer(self.fingerprints, dtype=np.uint32).copy(),
            "templates": dict(self.templates),
            "columns": {k: [(c.typecode, c.tobytes()) for c in cols]
                        for k, cols in self.columns.items()},
            "whole": dict(self.whole),
        }

    @classmethod
    def from_state(cls, state):
        """The log that :meth:`state` returned."""
        log = cls()
        log.keys = list(state["keys"])
        log._key_ids = {k: i for i, k in enumerate(log.keys)}
        log.sequence.frombytes(state["sequence"].astype(np.int32).tobytes())
        log.rows.frombytes(state["rows"].astype(np.int64).tobytes())
        log.fingerprints.frombytes(state["fingerprints"].astype(np.uint32).tobytes())
        log.templates = dict(state["templates"])
        for key_id, columns in state["columns"].items():
            restored = []
            for typecode, data in columns:
                column = array.array(typecode)
                column.frombytes(data)
                restored.append(column)
            log.columns[key_id] = restored
        log.whole = dict(state["whole"])
        return log
