"""A step's couplings at run time: values made whole across ranks where rows meet.

The nodes :mod:`tmpi_adapters.core.coupling` builds into a converted
training step (:class:`~tmpi_adapters.core.ops.Couple`, or
:class:`~tmpi_adapters.core.ops.StartCouple` and
:class:`~tmpi_adapters.core.ops.FinishCouple` around work that does not need
the level) call the session's :class:`Couplings`.  Each level's
:class:`~tmpi_adapters.exchangers.parts.Layout` (who gives how many entries
of each value, in the running call) is made on its first call and kept per
signature, so a step's coupling only copies its parts in, gathers and
combines.
"""
import time

import numpy as np

from tmpi_adapters.errors import TmpiError

#: Layouts kept (a step's levels, each its own signature).
KEPT = 256


class Couplings:
    """The couplings of one session's steps.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
        Whose exchanger gathers, whose recorder counts the time, and whose
        rows window (``set_rows``) says who gives what in the running call.
    """

    def __init__(self, session):
        self.session = session
        self._kept = {}

    def _shares(self):
        """Per rank, ``(rows, counts)`` in the running call, as every rank
        can tell from the global batch alone: its rows in the window's terms,
        and whether its parts count (not a padding row; in a call every rank
        runs whole, rank 0's only)."""
        from tmpi_adapters.core.batches import split_bounds
        lo, hi, total, whole = getattr(self.session, "_rows_share", None) or (0, 1, 1, True)
        if whole:
            return [(1, True)] + [(0, False)] * (self.session.size - 1)
        if total == 0:
            return [(0, True)] + [(0, False)] * (self.session.size - 1)
        shares = []
        for rank in range(self.session.size):
            first, last = split_bounds(total, rank, self.session.size)
            shares.append((last - first, last > first))
        return shares

    def couple(self, values, kinds, axes, key=None, described=None):
        """What :class:`~tmpi_adapters.core.ops.Couple` calls:
        ``values`` made whole across ranks in one collective (a gather of
        every rank's part, whose length every rank knows), combined alike on
        every rank in rank order: sums added, extrema taken, rows joined along
        ``axes``.  A rank whose rows do not count (a padding row, or every
        rank but rank 0 where each runs the whole call) gives nothing.
        ``described``: each value's expression and script line, for messages."""
        begin = time.perf_counter()
        layout, moved, values = self._level(values, kinds, axes, key, described)
        results = self._whole(layout.run(values), layout, moved, key)
        self.session.recorder.add_exchange(time.perf_counter() - begin)
        return results

    def start(self, values, kinds, axes, key=None, described=None, level=None):
        """What :class:`~tmpi_adapters.core.ops.StartCouple` calls:
        :meth:`couple` begun, its gather left running while the graph
        computes what does not need it.  Returns the handle
        :meth:`finish` takes (``level``: the coupling's, so that
        levels never share the buffers of a gather in flight)."""
        begin = time.perf_counter()
        layout, moved, values = self._level(values, kinds, axes, key, described,
                                            started=level)
        layout.start(values)
        self.session.recorder.add_exchange(time.perf_counter() - begin)
        return layout, moved, key

    def finish(self, handle):
        """What :class:`~tmpi_adapters.core.ops.FinishCouple` calls: the whole
        values of the coupling :meth:`start` began (``handle``)."""
        begin = time.perf_counter()
        layout, moved, key = handle
        results = self._whole(layout.finish(), layout, moved, key)
        self.session.recorder.add_exchange(time.perf_counter() - begin)
        return results

    def _level(self, values, kinds, axes, key, described, started=None):
        """The coupling's :meth:`_layout` and its gathered values moved to
        axis 0 (kept per signature), and the values as the layout takes them."""
        share = getattr(self.session, "_rows_share", None) or (0, 1, 1, True)
        values = [np.asarray(v) for v in values]
        signature = (key, tuple(kinds), tuple(axes), share,
                     tuple((v.shape, v.dtype) for v in values), started)
        level = self._kept.get(signature)
        if level is None:
            if len(self._kept) >= KEPT:
                self._kept.pop(next(iter(self._kept)))[0].gather.free()
            # The gathered values whose rows are not on axis 0, and that axis.
            moved = [(i, axis) for i, (kind, axis) in enumerate(zip(kinds, axes))
                     if kind == "gather" and axis]
            level = self._kept[signature] = (
                self._layout(values, kinds, axes, key, described), moved)
        layout, moved = level
        for i, axis in moved:
            values[i] = np.moveaxis(values[i], axis, 0)
        return layout, moved, values

    @staticmethod
    def _whole(results, layout, moved, key):
        if layout.empty:
            raise TmpiError("%s: no rank's rows count in a step's batch statistics" % key)
        for i, axis in moved:
            results[i] = np.moveaxis(results[i], 0, axis)
        return results

    def _layout(self, values, kinds, axes, key, described):
        """The :class:`~tmpi_adapters.exchangers.parts.Layout` of one
        coupling's values in the running call: who gives how many entries of
        each (checked: a gathered value must hold a whole number of entries
        per row of this rank's share)."""
        from tmpi_adapters.exchangers.parts import Layout, Part
        shares = self._shares()
        lo, hi = (getattr(self.session, "_rows_share", None) or (0, 1, 1, True))[:2]
        mine = max(hi - lo, 1)
        parts = []
        for k, (value, kind, axis) in enumerate(zip(values, kinds, axes)):
            if kind == "gather":
                value = np.moveaxis(value, axis, 0)
                per_row, remainder = divmod(value.shape[0], mine)
                if remainder:
                    what = (described or [])[k:k + 1] or ["a value whose rows meet"]
                    raise TmpiError(
                        "%s: %s has %d entries along the batch's axis on rank %d, whose "
                        "share is %d rows: it does not hold a whole number of entries per "
                        "row, so the ranks' parts cannot be joined into the one-process "
                        "value. Run with --scaling weak so that each rank takes whole "
                        "batches."
                        % (key, what[0], value.shape[0], self.session.rank, mine))
                entries = [per_row * rows if counts else 0 for rows, counts in shares]
            else:
                entries = [1 if counts else 0 for _, counts in shares]
            parts.append(Part(value, kind, entries))
        return Layout(self.session.exchanger, parts, self.session.rank)
