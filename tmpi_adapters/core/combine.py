"""Combining, after a call, what the ranks returned into the one-process values.

Each returned value's kind was read from its graph when the function was
compiled (:mod:`tmpi_adapters.graphs.outputs`); a call combines them in one
collective.
"""
import math
import sys

import numpy as np

from tmpi_adapters.graphs.outputs import UNDECIDED


class Combiner:
    """Combines, after a call, the values the call's own exchange did not carry.

    One collective per call: an allreduce when every value is a mean or a
    sum, otherwise one gather of every rank's packed values, combined the
    same way on every rank.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    kinds : list
        Per returned value: a kind of :data:`~tmpi_adapters.graphs.outputs.KINDS`, :data:`~tmpi_adapters.graphs.outputs.UNDECIDED`, or
        ``None`` (nothing to do: the step's exchange carried it).
    axes : list of int, optional
        Per value, the batch axis of ``"rows"`` and :data:`~tmpi_adapters.graphs.outputs.UNDECIDED` values
        (0 by default).
    name : str, optional
        The function's name, for the warning about undecided values.
    ratios : dict, optional
        ``{position: Ratio}``: values a split evaluation returns as the parts
        of a :class:`~tmpi_adapters.graphs.outputs.Ratio` (their kind is ``"ratio"``).
    """

    def __init__(self, session, kinds, axes=None, name="a function", ratios=None):
        self.session = session
        self.ratios = dict(ratios or {})
        self.kinds = ["ratio" if i in self.ratios else kind for i, kind in enumerate(kinds)]
        self.axes = list(axes) if axes is not None else [0] * len(self.kinds)
        self.name = name

    @property
    def needed(self):
        """True when some value must still be combined."""
        return any(kind not in (None, "same") for kind in self.kinds)

    def __call__(self, values, weight, rows, total=None):
        """The combined ``values`` of this rank's ``rows`` rows, which count
        for ``weight`` (``total``: every rank's weight, when known)."""
        session = self.session
        if session.size == 1 or session.options.outputs == "local" or not self.needed:
            return values
        if UNDECIDED in self.kinds:
            self._decide(values, rows)
        active = [i for i, kind in enumerate(self.kinds) if kind not in (None, "same")]
        if all(self.kinds[i] in ("mean", "sum") for i in active):
            return self._allreduce(values, active, weight, total)
        return self._gathered(values, active, weight)

    def finish(self, values):
        """``values`` of a call run whole on this rank, ratios divided out."""
        return [self.ratios[i].combine([np.asarray(value)]) if i in self.ratios else value
                for i, value in enumerate(values)]

    def _allreduce(self, values, active, weight, total):
        result = list(values)
        arrays = [np.asarray(values[i], dtype=np.float64) for i in active]
        reduced = self.session.exchanger.allreduce(
            arrays, ops=[self.kinds[i] for i in active], weight=weight, total=total)
        for i, value in zip(active, reduced):
            result[i] = _like(value, values[i])
        return result

    def _gathered(self, values, active, weight):
        """Every rank's values in one gather, combined in rank order."""
        parts, counts = [], []
        for i in active:
            value = np.asarray(values[i])
            if self.kinds[i] == "rows":
                value = np.moveaxis(value, self.axes[i], 0)[:int(weight)]
                counts.append(value.shape[0])
            else:
                counts.append(0)
            parts.append(np.ascontiguousarray(value))
        header = np.asarray([0, weight] + counts, dtype=np.int64)
        body = b"".join(p.tobytes() for p in parts)
        header[0] = header.nbytes + len(body)
        packed = np.frombuffer(header.tobytes() + body, dtype=np.uint8)
        gathered = self.session.exchanger.allgather_rows(packed)
        blocks = _unpack(gathered, parts, [self.kinds[i] for i in active])
        result = list(values)
        for k, i in enumerate(active):
            kind = self.kinds[i]
            weights = [w for w, _ in blocks]
            pieces = [block[k] for _, block in blocks]
            counted = [p for w, p in zip(weights, pieces) if w > 0] or pieces[:1]
            if kind == "rows":
                combined = np.moveaxis(np.concatenate(pieces, axis=0), 0, self.axes[i])
            elif kind == "mean":
                total = float(sum(weights)) or 1.0
                combined = sum(p.astype(np.float64) * (w / total)
                               for w, p in zip(weights, pieces))
            elif kind == "sum":
                combined = _exact_sum(counted)
            elif kind == "ratio":
                result[i] = self.ratios[i].combine(counted)
                continue
            elif kind == "max":
                combined = np.maximum.reduce(counted)
            else:
                combined = np.minimum.reduce(counted)
            result[i] = _like(np.asarray(combined), values[i])
        return result

    def _decide(self, values, rows):
        """Per-row or not, the same on every rank: a value is gathered as rows
        when on every rank its batch axis has that rank's rows, and averaged
        otherwise.  The graph did not tell, so the run says so."""
        undecided = [i for i, kind in enumerate(self.kinds) if kind == UNDECIDED]
        local = [np.ndim(values[i]) > self.axes[i] and np.shape(values[i])[self.axes[i]] == rows
                 for i in undecided]
        votes = self.session.exchanger.allgather_object(local)
        for k, i in enumerate(undecided):
            self.kinds[i] = "rows" if all(v[k] for v in votes) else "mean"
        done = {"rows": "gathered as one value per example, each rank's computed from its "
                        "own share of the batch (they may differ from the one-process rows)",
                "mean": "averaged over the ranks, weighted by their rows"}
        self.session.print(
            "tmpi: warning: %s: the graph does not show how its returned values combine "
            "across ranks: %s. Name a value '<name>:mean' or '<name>:sum' to say how it "
            "combines." % (self.name, "; ".join("value %d is %s" % (i, done[self.kinds[i]])
                                                for i in undecided)), file=sys.stderr)


def _exact_sum(pieces):
    """The sum of ``pieces`` (arrays of one shape and dtype) rounded once into
    their dtype: integers exactly, floats by an exact sum (``math.fsum``)."""
    stacked = np.stack([np.asarray(p) for p in pieces])
    if stacked.dtype.kind != "f":
        return stacked.sum(axis=0)
    sums = [math.fsum(column) for column in stacked.reshape(len(pieces), -1).T]
    return np.asarray(sums).astype(stacked.dtype).reshape(stacked.shape[1:])


def _like(value, original):
    """``value`` in ``original``'s dtype (integers rounded, not truncated), a
    numpy scalar for a scalar."""
    like = np.asarray(original)
    if like.dtype.kind in "iub" and value.dtype.kind == "f":
        value = np.rint(value)
    value = value.astype(like.dtype, copy=False)
    return value[()] if value.ndim == 0 else value


def _unpack(gathered, parts, kinds):
    """``[(weight, [piece per value]), ...]`` per rank from a gather of packed blocks."""
    raw = gathered.tobytes()
    blocks, offset, n = [], 0, len(parts)
    while offset < len(raw):
        header = np.frombuffer(raw, dtype=np.int64, count=2 + n, offset=offset)
        length, weight, counts = int(header[0]), int(header[1]), header[2:]
        cursor = offset + header.nbytes
        pieces = []
        for part, kind, count in zip(parts, kinds, counts):
            if kind == "rows":
                shape = (int(count),) + part.shape[1:]
            else:
                shape = part.shape
            size = int(np.prod(shape, dtype=np.int64)) * part.dtype.itemsize
            pieces.append(np.frombuffer(raw, dtype=part.dtype, count=size // part.dtype.itemsize,
                                        offset=cursor).reshape(shape))
            cursor += size
        blocks.append((weight, pieces))
        offset += length
    return blocks
