"""Values made whole across ranks in one collective: every rank's parts, packed and combined.

Where the rows of a training step meet, each rank holds a *part* of a value
(:class:`Part`): a partial sum, maximum or minimum, or its own rows of it.
:func:`combine_parts` sends every part of one level of the step in one
counted gather (each rank's bytes, whose lengths every rank knows already, so
nothing is said about sizes first), then combines them alike on every rank,
in rank order: sums added, extrema taken, rows joined along their axis.  So
every rank computes the same bytes, and a sum is added in the same order on
every rank.  Who gives what (a rank whose rows do not count gives nothing) is
the caller's: :class:`tmpi_adapters.core.levels.Couplings`.
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


#: Layouts kept per exchanger (a step's levels, each its own signature).
_MAX_LAYOUTS = 256


class Layout:
    """One level's parts laid out for its collective, for one signature (the
    parts' kinds, shapes, dtypes and entries): built once, then each step
    only copies its parts in (:meth:`run`), gathers and combines.

    It holds the level's prepared gather
    (:meth:`~tmpi_adapters.exchangers.base.Exchanger.counted_gather`), typed
    views of this rank's parts in its message and of every giving rank's
    piece of each part in its blocks, and where each piece goes in the
    part's whole value.  Consecutive reductions of one kind and dtype that
    the same ranks give (a BatchNorm layer's sums, a level's layers) lie
    side by side in every block, so they are combined as one *run*: one
    operation per rank for all of them, whose result the parts are views
    of.  A step's couplings run with the processor's caches full of the
    step's arrays, where each interpreted operation is slow: the work per
    call is kept to a few copies.

    Attributes
    ----------
    gather : CountedGather
        The level's prepared collective.
    empty : bool
        Some reduction is given by no rank (its whole value is ``None``).
    """

    def __init__(self, exchanger, parts, rank):
        size = exchanger.size
        tails = [p.value.shape[1:] if p.kind == "gather" else p.value.shape for p in parts]
        shapes = [[((p.entries[r],) + tuple(t)) if p.kind == "gather" else tuple(t)
                   for r in range(size)] for p, t in zip(parts, tails)]
        nbytes = [[int(np.prod(s[r], dtype=np.int64)) * p.value.dtype.itemsize
                   if p.entries[r] else 0 for r in range(size)]
                  for p, s in zip(parts, shapes)]
        self.gather = exchanger.counted_gather([sum(n[r] for n in nbytes) for r in range(size)])
        self.count = len(parts)
        #: per part, per rank: where its bytes start in that rank's block
        offsets = [[0] * size for _ in parts]
        self.mine, pieces = [], [[] for _ in parts]
        for r, block in enumerate(self.gather.blocks):
            at = 0
            for k, p in enumerate(parts):
                if not p.entries[r]:
                    continue
                n = nbytes[k][r]
                offsets[k][r] = at
                piece = block[at:at + n].view(p.value.dtype).reshape(shapes[k][r])
                pieces[k].append(piece)
                if r == rank:
                    self.mine.append((k, self.gather.message[at:at + n].view(p.value.dtype)
                                      .reshape(shapes[k][r])))
                at += n
        #: (part, kind, whole shape, dtype, [(where, piece)]): a gathered or stacked value
        self.joins = []
        groups = []  # the reductions' parts, consecutive ones that combine alike together
        for k, p in enumerate(parts):
            if p.kind in ("gather", "stack"):
                found = pieces[k]
                lengths = [len(f) if p.kind == "gather" else 1 for f in found]
                ends = np.cumsum(lengths, dtype=np.int64)
                where = [slice(int(e - n), int(e)) if p.kind == "gather" else int(e - 1)
                         for e, n in zip(ends, lengths)]
                shape = (int(sum(lengths)),) + tuple(tails[k])
                self.joins.append((k, p.kind, shape, p.value.dtype, list(zip(where, found))))
                continue
            last = parts[groups[-1][-1]] if groups and groups[-1][-1] == k - 1 else None
            if last is not None and (p.kind, p.value.dtype, p.entries) == \
                    (last.kind, last.value.dtype, last.entries):
                groups[-1].append(k)
            else:
                groups.append([k])
        self.empty = any(not pieces[ks[0]] for ks in groups)
        #: (combine, pieces, [(part, flat slice or None, shape)]): a run of reductions
        self.runs = [self._run(parts, ks, offsets, nbytes) for ks in groups if pieces[ks[0]]]

    def _run(self, parts, ks, offsets, nbytes):
        kind = parts[ks[0]].kind
        combine = np.add if kind == "sum" else np.maximum if kind == "max" else np.minimum
        dtype = parts[ks[0]].value.dtype
        giving = [r for r, e in enumerate(parts[ks[0]].entries) if e]
        span = sum(nbytes[k][giving[0]] for k in ks)
        pieces = [self.gather.blocks[r][offsets[ks[0]][r]:offsets[ks[0]][r] + span].view(dtype)
                  for r in giving]
        if len(ks) == 1 and parts[ks[0]].value.ndim:
            # (not a 0-d part: numpy combines two 0-d arrays into a scalar)
            shape = parts[ks[0]].value.shape
            return combine, [p.reshape(shape) for p in pieces], [(ks[0], None, shape)]
        where, at = [], 0
        for k in ks:
            n = parts[k].value.size
            where.append((k, slice(at, at + n), parts[k].value.shape))
            at += n
        return combine, pieces, where

    def run(self, values):
        """The whole values from this rank's ``values`` (one array per part,
        ``gather`` parts with their rows on axis 0): new arrays (or views of
        new arrays), never views of the gathered bytes; a reduction no rank
        gave a part of is ``None``."""
        for k, view in self.mine:
            view[...] = values[k]
        self.gather.run()
        return self._combined()

    def start(self, values):
        """Copy this rank's ``values`` in and start the gather: the rank may
        compute until :meth:`finish` (the values may change meanwhile)."""
        for k, view in self.mine:
            view[...] = values[k]
        self.gather.start()

    def finish(self):
        """What :meth:`run` returns, for the gather :meth:`start` began."""
        self.gather.finish()
        return self._combined()

    def _combined(self):
        results = [None] * self.count
        for combine, pieces, where in self.runs:
            # In rank order on every rank, so every rank computes the same bytes.
            total = combine(pieces[0], pieces[1]) if len(pieces) > 1 else pieces[0].copy()
            for piece in pieces[2:]:
                combine(total, piece, out=total)
            for k, span, shape in where:
                results[k] = total if span is None else total[span].reshape(shape)
        for k, kind, shape, dtype, found in self.joins:
            whole = np.empty(shape, dtype=dtype)
            for at, piece in found:
                whole[at] = piece
            results[k] = whole
        return results


def layout_of(exchanger, parts, rank):
    """The :class:`Layout` of ``parts``, kept on ``exchanger`` between calls."""
    layouts = exchanger.__dict__.setdefault("_part_layouts", {})
    key = tuple((p.kind, p.value.shape, p.value.dtype.str, tuple(p.entries)) for p in parts)
    layout = layouts.get(key)
    if layout is None:
        if len(layouts) >= _MAX_LAYOUTS:
            layouts.pop(next(iter(layouts))).gather.free()
        layout = layouts[key] = Layout(exchanger, parts, rank)
    return layout


def combine_parts(exchanger, parts: Sequence[Part], rank: int):
    """The whole values of ``parts`` (the same list on every rank), in one
    :meth:`~tmpi_adapters.exchangers.base.Exchanger.allgather_counted`.

    Returns one array per part, new (never a view of the gathered bytes); a
    reduction no rank gave a part of is ``None``."""
    return layout_of(exchanger, parts, rank).run([p.value for p in parts])
