"""Values made whole across ranks in one collective: every rank's parts, packed and combined.

Where the rows of a training step meet, each rank holds a *part* of a value
(:class:`Part`): a partial sum, maximum or minimum, or its own rows of it.
:func:`combine_parts` sends every part of one level of the step in one
counted gather (each rank's bytes, whose lengths every rank knows already, so
nothing is said about sizes first), then combines them alike on every rank,
in rank order: sums added, extrema taken, rows joined along their axis.  So
every rank computes the same bytes, and a sum is added in the same order on
every rank.  Who gives what (a rank whose rows do not count gives nothing) is
the caller's: :meth:`tmpi_adapters.core.session.Session.couple`.
"""
from dataclasses import dataclass
from typing import Any, List, Sequence

import numpy as np

KINDS = ("sum", "max", "min", "gather", "stack")


@dataclass
class Part:
    """One rank's part of a value to make whole.

    Attributes
    ----------
    value : numpy.ndarray
        This rank's part (for ``"gather"``, its rows on axis 0; for
        ``"stack"``, one part a rank, stacked on a new first axis).
    kind : str
        One of :data:`KINDS`.
    entries : list of int
        Per rank, how many entries it gives: rows on axis 0 for a gather, 1
        for a reduction or a stack; 0 for a rank that gives nothing.
    """

    value: Any
    kind: str
    entries: List[int]


def combine_parts(exchanger, parts: Sequence[Part], rank: int):
    """The whole values of ``parts`` (the same list on every rank), in one
    :meth:`~tmpi_adapters.exchangers.base.Exchanger.allgather_counted`.

    Returns one array per part; a reduction no rank gave a part of is
    ``None``."""
    size = exchanger.size
    tails = [p.value.shape[1:] if p.kind == "gather" else p.value.shape for p in parts]
    mine = [np.ascontiguousarray(p.value) for p in parts if p.entries[rank]]
    body = b"".join(v.tobytes() for v in mine)
    counts = [sum(p.entries[r] * int(np.prod(tail, dtype=np.int64)) * p.value.dtype.itemsize
                  for p, tail in zip(parts, tails)) for r in range(size)]
    joined = exchanger.allgather_counted(np.frombuffer(body, dtype=np.uint8), counts).tobytes()
    pieces: List[list] = [[] for _ in parts]
    offset = 0
    for r in range(size):
        for k, (p, tail) in enumerate(zip(parts, tails)):
            if not p.entries[r]:
                continue
            shape = ((p.entries[r],) + tuple(tail)) if p.kind == "gather" else tuple(tail)
            count = int(np.prod(shape, dtype=np.int64))
            pieces[k].append(np.frombuffer(joined, dtype=p.value.dtype, count=count,
                                           offset=offset).reshape(shape))
            offset += count * p.value.dtype.itemsize
    return [_combined(p, tail, found) for p, tail, found in zip(parts, tails, pieces)]


def _combined(part, tail, found):
    """One value from the parts ``found`` (in rank order), as its kind says."""
    if part.kind == "gather":
        return np.concatenate(found, axis=0) if found else \
            np.empty((0,) + tuple(tail), dtype=part.value.dtype)
    if part.kind == "stack":
        return np.stack(found) if found else \
            np.empty((0,) + tuple(tail), dtype=part.value.dtype)
    if not found:
        return None
    if part.kind == "sum":
        total = np.array(found[0], copy=True)
        for piece in found[1:]:
            total += piece
        return total
    if part.kind == "max":
        return np.maximum.reduce(found)
    return np.minimum.reduce(found)
