"""Where a reshape's rows go, decided from the shapes of one call.

A reshape to a constant shape (``x.reshape((batch_size, 1, 28, 28))``) is
run by Theano's shape inference on the call's real inputs cut to two or
more row counts (:class:`~.fixedbatch.FixedBatch`); :func:`decide` reads
those shapes: which axis of the new shape holds the rows, and the
:class:`Rewrite` that makes the constant shape a rank's own (each rank's
rows times the proven factor), or that rows of different ranks' shares meet
in it (:data:`ROWS_MEET`), or an error naming the reshape.
"""
import math

from tmpi_adapters.errors import ConfigError


class Rewrite:
    """How one reshape's constant shape becomes a rank's: entry ``axis`` is
    ``rows * num // den`` (``rows``: the rank's rows), the others ``entries``."""

    def __init__(self, axis, num, den, entries):
        self.axis, self.num, self.den, self.entries = axis, num, den, tuple(entries)

    def shape(self, local):
        import theano.tensor as T
        rows = T.cast(local, "int64")
        size = rows if self.num == self.den else rows * self.num // self.den
        return T.stack([size if k == self.axis else T.constant(v, dtype="int64")
                        for k, v in enumerate(self.entries)])

    def __repr__(self):
        return "Rewrite(axis=%d, %d/%d, %s)" % (self.axis, self.num, self.den, self.entries)

    def __str__(self):
        share = "a rank's rows" if self.num == self.den else \
            "%s a rank's rows" % ("%d times" % self.num if self.den == 1
                                  else "%d/%d of" % (self.num, self.den))
        return "%s with %s on axis %d" % (self.entries, share, self.axis)


#: A reshape's decision where rows of different ranks' shares meet in it.
ROWS_MEET = "rows meet"


class RowsMeet(ConfigError):
    """A reshape whose rows no rank's share can follow: rows of different
    ranks' shares meet in it (the row analysis then gathers them)."""


def decide(describe, target, sizes, shapes, contiguous=False, outputs=None):
    """``(axis, rewrite)`` of a reshape to the constant shape ``target``: the
    axis of the new shape that holds the rows and the :class:`Rewrite` that
    makes the shape a rank's own (``None`` where the reshape needs none);
    ``(None, None)`` where its input's size does not follow the rows.

    Parameters
    ----------
    describe : str
        The reshape, for messages ("the reshape to (256, 128) made at x.py:7").
    target : tuple of int
        Its constant shape (``-1`` where Theano infers the entry).
    sizes : list of int
        Row counts, the call's whole batch first.
    shapes : list of tuple
        The reshape's input's shape when the function runs each of ``sizes``.

    Raises :class:`RowsMeet` where the reshape's input follows the rows in a
    way each rank's share cannot reproduce exactly, or in a way that can be
    read more than one way; with ``contiguous``, also where the axis holding
    the rows holds them more than once (``(time, batch, d)`` merged into
    ``(time * batch, d)``: a rank's rows are not one block of that axis).

    A reshape to a shape computed in the graph (``target`` ``None``) is read
    from its ``outputs``' shapes at each size: where its rows go for the
    whole batch, and each share's shape must be what that gives (it needs
    no rewrite).
    """
    if target is None:
        axis, rewrite = decide(describe, tuple(outputs[0]), sizes, shapes, contiguous)
        if rewrite is not None:
            for rows, out in zip(sizes[1:], outputs[1:]):
                expected = tuple(rows * rewrite.num // rewrite.den if k == rewrite.axis else v
                                 for k, v in enumerate(rewrite.entries))
                if tuple(out) != expected:
                    raise RowsMeet("%s: for %d rows its new shape is %s, not the %s that holds "
                                   "those rows of the whole batch's %s"
                                   % (describe, rows, tuple(out), expected, tuple(outputs[0])))
        return axis, None
    batch, full = sizes[0], shapes[0]
    varying = [a for a in range(len(full)) if len({s[a] for s in shapes}) > 1]
    if not varying:
        return None, None  # its size does not follow the batch: every rank reshapes alike

    def refuse(why):
        return RowsMeet(
            "%s: its input has the shape %s for a batch of %d rows, and %s, so tmpi cannot "
            "rebuild it for each rank's share of the rows. Take the sizes that follow the batch "
            "from the input's shape (x.shape[0], or -1) instead of constants, or run with "
            "--scaling weak so that each rank takes whole batches."
            % (describe, tuple(full), batch, why))
    if len(varying) > 1:
        raise refuse("axes %s of it all change with the batch's rows" % varying)
    axis = varying[0]
    for rows, shape in zip(sizes, shapes):
        if shape[axis] * batch != full[axis] * rows:
            raise refuse("its axis %d is not proportional to the rows (%d for %d rows)"
                         % (axis, shape[axis], rows))
    pre, post = math.prod(full[:axis]), math.prod(full[axis + 1:])
    total = math.prod(full)
    known = math.prod(v for v in target if v != -1)
    actual = tuple(total // known if v == -1 else v for v in target)
    placed, reasons = {}, []
    if full[axis] % batch == 0:
        # Axis `axis` holds `per_row` entries per row, ordered row-major or not
        # (a transposed or tiled tensor flattened): every order (`outer`
        # entries above the rows, `per_row // outer` below) the new shape can
        # hold is read, and all must agree.
        per_row = full[axis] // batch
        # (A reshape's input proven to hold each row as one block: row-major only.)
        readings = [(outer, per_row // outer) for outer in range(1, per_row + 1)
                    if per_row % outer == 0 and not (contiguous and outer > 1)]
    elif contiguous and batch % full[axis] == 0 and (full[axis] * post) % batch == 0:
        # Each entry of axis `axis` holds whole rows (rows merged upstream).
        readings = [(1, full[axis] * post // batch)]
        post = 1
    else:
        raise refuse("its axis %d does not hold a whole number of entries per row" % axis)
    for outer, inner in readings:
        try:
            placed[outer] = _place(target, actual, batch, sizes[1:], pre * outer,
                                   post * inner, contiguous)
        except ValueError as why:
            reasons.append(str(why))
    if not placed:
        raise refuse(reasons[0])
    found = {repr(p): "left as written" if p[1] is None else str(p[1])
             for p in placed.values()}
    if len(found) > 1:
        raise refuse("its axis %d holds %d entries per row, in an order tmpi cannot tell from "
                     "the sizes alone: each rank's reshape would be %s" % (
                         axis, per_row, " or ".join(sorted(found.values()))))
    return next(iter(placed.values()))


def _place(target, actual, batch, shares, pre, row, contiguous=False):
    """Where the rows of an input of ``pre`` slabs of ``batch`` rows of ``row``
    elements each land in the new shape ``actual`` (``target`` as written):
    ``(axis, rewrite)``, the :class:`Rewrite` ``None`` where none is needed,
    or ``ValueError`` saying why the rows cannot follow a rank's share."""
    period = batch * row                        # one slab: every row
    strides = [math.prod(actual[k + 1:]) for k in range(len(actual))]
    # The axis of the new shape that a slab of rows ends in holds the rows...
    at = [k for k in range(len(actual)) if strides[k] < period <= strides[k] * actual[k]]
    k = at[0] if at else None
    # ...with the slabs above it, whole.
    if k is None or (strides[k] * actual[k]) % period or \
            math.prod(actual[:k]) * (strides[k] * actual[k] // period) != pre:
        raise ValueError("the new shape %s does not keep the rows together on one axis"
                         % (tuple(actual),))
    if contiguous and strides[k] * actual[k] != period:
        raise ValueError("axis %d of the new shape %s holds the rows %d times over, each "
                         "time with other entries between them" % (
                             k, tuple(actual), strides[k] * actual[k] // period))
    if row % strides[k] and strides[k] % row:
        raise ValueError("an entry of axis %d of the new shape %s holds part of one row and "
                         "part of another" % (k, tuple(actual)))
    g = math.gcd(actual[k], batch)
    num, den = actual[k] // g, batch // g
    uneven = [rows for rows in shares if (rows * num) % den]
    if uneven:
        # (Also where Theano infers the entry, -1: a share of 43 rows makes no
        # whole number of pairs.)
        raise ValueError("an entry of axis %d of the new shape %s holds %d rows, which a "
                         "rank's share of %d rows does not divide (use a batch size whose "
                         "shares are multiples of %d)" % (k, tuple(actual), den, uneven[0], den))
    if target[k] == -1:
        return k, None  # Theano infers that entry from each rank's rows already
    return k, Rewrite(k, num, den, actual)
