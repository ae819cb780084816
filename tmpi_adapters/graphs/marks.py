"""What a rank's local value of a variable is: the marks of the row analysis.

Under strong scaling each rank runs rows ``[lo, hi)`` of every global batch.
Each variable of a function's graph gets one mark (:mod:`.rows` gives them),
a small frozen value, in the words of placement engines (PyTorch's
``Shard``, ``Replicate``, ``Partial``):

:class:`Shard` ``(axis)``
    rows ``[lo, hi)`` of the one-process value along ``axis`` (an axis that
    merges rows with the axes after them, ``(B*T, d)``, holds the rank's rows
    contiguously; merged with axes before them, ``(T*B, d)``, it holds rows
    ``[lo, hi)`` of each block: ``Shard(axis, inner=True)``): predictions,
    per-row losses, activations.
:data:`SAME` (:class:`Unbatched`)
    computed without the batch: parameters, constants.
:data:`SHAPE` (:class:`Sizes`)
    computed from the batch's sizes only (``x.shape[0]``, a mean's divisor):
    its one-process value is the same expression of the global sizes.
:data:`SUM`, :data:`MAX`, :data:`MIN` (:class:`Partial`)
    the one-process value is the sum (maximum, minimum) over ranks of the
    local values: a sum over rows, ``dot(x.T, delta)``, a gradient.
:data:`REPL` (:class:`Replicated`)
    the one-process value itself, the same on every rank, computed from
    values made whole by collectives.
:data:`DRAW` (:class:`Draw`)
    a random draw made for the whole batch, of which a rank keeps its rows.
:data:`MIXED` (:class:`Mixed`)
    the rows meet in a way the reading does not make exact (strict reading).

A mark is never an axis: comparing one with an ``int`` raises, so that code
written for the untyped marks of old cannot silently compare false.
Nothing here imports Theano.
"""
from dataclasses import dataclass


class Mark:
    """The base of every mark (see the module doc)."""

    __slots__ = ()

    def __eq__(self, other):
        if isinstance(other, int) and not isinstance(other, bool):
            raise TypeError("a mark (%r) compared with an axis (%r): use Shard(axis) "
                            "or mark.axis" % (self, other))
        return type(self) is type(other) and self._key() == other._key()

    def __hash__(self):
        return hash((type(self).__name__, self._key()))

    def _key(self):
        return ()

    def __repr__(self):
        return type(self).__name__.upper()


@dataclass(frozen=True, eq=False, repr=False)
class Shard(Mark):
    """The rank's rows of the one-process value, along ``axis``.

    ``inner``: the axis merges other axes with the rows, the rows innermost
    (``(T, B, d)`` reshaped to ``(T*B, d)``, a recurrent layer's input
    precomputed for every step): the rank holds rows ``[lo, hi)`` of every
    outer block, not one contiguous block (a *window* of each)."""

    axis: int
    inner: bool = False

    def _key(self):
        return (self.axis, self.inner)

    def __repr__(self):
        return "Shard(%d%s)" % (self.axis, ", inner" if self.inner else "")

    def moved(self, axis):
        """The same rows, now on ``axis``."""
        return Shard(axis, self.inner)


@dataclass(frozen=True, eq=False, repr=False)
class Partial(Mark):
    """A partial value: the one-process value is ``op`` (``"sum"``,
    ``"max"``, ``"min"``) over the ranks' local values."""

    op: str

    def _key(self):
        return (self.op,)

    def __repr__(self):
        return "Partial(%s)" % self.op

    def negated(self):
        """The partial kind of ``-value``: a maximum becomes a minimum."""
        return Partial({"max": "min", "min": "max"}.get(self.op, self.op))


class Unbatched(Mark):
    """Computed without the batch: the same on every rank, for free."""

    __slots__ = ()


class Sizes(Mark):
    """Computed from the batch's sizes alone: rebuilt from the global sizes."""

    __slots__ = ()


class Replicated(Mark):
    """The one-process value on every rank, from values made whole by collectives."""

    __slots__ = ()


class Draw(Mark):
    """A draw made for the whole batch, of which a rank keeps its rows."""

    __slots__ = ()


class Mixed(Mark):
    """Rows meet where the strict reading makes no conversion."""

    __slots__ = ()


SAME = Unbatched()
SHAPE = Sizes()
REPL = Replicated()
DRAW = Draw()
MIXED = Mixed()
SUM, MAX, MIN = Partial("sum"), Partial("max"), Partial("min")
PARTIAL = (SUM, MAX, MIN)
#: Marks whose local value is the one-process value on every rank.
WHOLE = (SAME, SHAPE, REPL)


def is_rows(mark):
    """True for a :class:`Shard` mark (the rank's rows on some axis)."""
    return isinstance(mark, Shard)


def axis_of(mark):
    """The rows' axis of a :class:`Shard` mark, else ``None``."""
    return mark.axis if isinstance(mark, Shard) else None


#: The shared variable whose values say which rows of a draw made for the
#: whole batch a rank keeps (:mod:`tmpi_adapters.frameworks.random_streams`).
NOISE_WINDOW = "tmpi_noise_window"
#: The shared int64 vector ``[lo, hi, max(N, 1), max(hi - lo, 1)]``: this rank's
#: rows of a global batch of ``N`` rows (set before every split call).
ROWS_WINDOW = "tmpi_rows_window"
