"""Batches split across ranks by rows: the one place that decides who takes which rows.

Strong scaling gives each of the ``size`` ranks a contiguous, balanced share
of every batch.  A rank whose share is empty (a batch with fewer rows than
ranks) runs one *padding row* with weight 0: it takes part in the step's
collectives, and its gradient and outputs count for nothing.  An empty batch
(0 rows) is run whole by every rank, as one process would run it; rank 0's
results count (:func:`local_share`).

The rows of a batch are found along each array's *batch axis*: axis 0 unless
the graph says otherwise (a sequence model's ``(time, batch, ...)`` inputs
have theirs on axis 1; :mod:`tmpi_adapters.graphs.layout` reads it from the
graph once, when the function is compiled).  ``axes`` arguments below give
one batch axis per value (``None``: the value carries no batch), in the same
structure as the values (a list, or a dict for keyword arguments); without
them every array's batch axis is 0.
"""
import zlib

import numpy as np

from tmpi_adapters.errors import ConfigError

#: Elements of each array a batch's fingerprint reads (:func:`fingerprint`).
FINGERPRINT_SAMPLES = 512


def split_bounds(rows, rank, size):
    """This rank's ``[lo, hi)`` of ``rows`` rows split in contiguous, balanced parts."""
    return rows * rank // size, rows * (rank + 1) // size


def local_rows(rows, rank, size):
    """``(lo, hi, weight)``: the rows this rank runs and what they count for.

    ``weight`` is ``hi - lo``, except for a rank whose share is empty: it runs
    the padding row ``[0, 1)`` with weight 0.
    """
    lo, hi = split_bounds(rows, rank, size)
    weight = hi - lo
    if weight == 0:
        lo, hi = 0, 1
    return lo, hi, weight


def local_share(rows, rank, size):
    """``(lo, hi, weight, total)``: :func:`local_rows`, and the sum of every
    rank's weight.

    An empty batch (``rows == 0``) has no row to pad with: every rank runs it
    whole (``[0, 0)``), and rank 0's results stand for all (weight 1 on rank
    0, 0 elsewhere, total 1), so N ranks take the step one process takes.
    """
    if rows == 0:
        return 0, 0, int(rank == 0), 1
    lo, hi, weight = local_rows(rows, rank, size)
    return lo, hi, weight, rows


def _axis(axes, key):
    if axes is None:
        return 0
    try:
        return axes[key]
    except (KeyError, IndexError):
        return 0


def axis_size(value, axis):
    """The length of ``value`` along ``axis``, or ``None`` when it is not an
    array with that axis."""
    if axis is None or not isinstance(value, np.ndarray) or value.ndim <= axis:
        return None
    return value.shape[axis]


def is_rows(value, rows, axis=0):
    """True for a numpy array whose ``axis`` has the batch's ``rows``."""
    return axis_size(value, axis) == rows


def batch_rows(values, axes=None):
    """A call's batch size: the commonest length of its numpy arrays along
    their batch axes (``None`` when it has none)."""
    if isinstance(values, dict):
        pairs = [(v, _axis(axes, k)) for k, v in values.items()]
    else:
        pairs = [(v, _axis(axes, i)) for i, v in enumerate(values)]
    leading = [n for n in (axis_size(v, a) for v, a in pairs) if n is not None]
    if not leading:
        return None
    if leading.count(leading[0]) == len(leading):
        return leading[0]
    # The commonest; of equally common lengths the smallest.
    return min(set(leading), key=lambda n: (-leading.count(n), n))


def take_rows(value, lo, hi, axis=0):
    """Rows ``[lo, hi)`` of ``value`` along ``axis`` (a view for axis 0, a
    contiguous copy otherwise: Theano's C code prefers it)."""
    if axis == 0:
        return value[lo:hi]
    index = (slice(None),) * axis + (slice(lo, hi),)
    return np.ascontiguousarray(value[index])


def cut_rows(values, rows, lo, hi, axes=None):
    """``values`` (a list, or a dict of keyword arguments) with every batch
    array cut to rows ``[lo, hi)`` along its batch axis; other values pass
    through."""
    def cut(value, axis):
        return take_rows(value, lo, hi, axis) if is_rows(value, rows, axis) else value
    if isinstance(values, dict):
        return {k: cut(v, _axis(axes, k)) for k, v in values.items()}
    return [cut(v, _axis(axes, i)) for i, v in enumerate(values)]


def check_ranks_vs_rows(rows, size, name):
    """A clear error for a batch with fewer rows than ranks, for callers that
    cannot pad (training functions pad such batches instead)."""
    if rows < size:
        raise ConfigError(
            "%s was called with a batch of %d rows on %d ranks: each rank needs at least one "
            "row. Use fewer ranks (-n %d) or a larger batch, or --scaling weak so that each "
            "rank takes whole batches." % (name, rows, size, max(rows, 1)))


def fingerprinted(call):
    """True for the calls whose batch is fingerprinted: the first ones, then
    ever more rarely (calls 1, 2, 4, 8, ... and every 64th)."""
    return call & (call - 1) == 0 or call % 64 == 0


def fingerprint(values):
    """A cheap digest of a batch's contents, ``0 <= fingerprint < 2**24``.

    Every rank is handed the same global batch and takes its own rows of it;
    ranks handed *different* batches of the same shape (a script that shards
    its data by rank itself) would each keep part of their own batch and
    silently drop the rest.  Ranks compare this digest in the step's envelope.
    It reads at most :data:`FINGERPRINT_SAMPLES` evenly spaced elements of
    each array (microseconds), so a difference elsewhere can go unseen in
    one call; the batches of later calls are sampled at other positions.
    """
    digest = 0
    for value in values:
        if not isinstance(value, np.ndarray) or value.size == 0 or value.dtype.hasobject:
            continue
        step = max(1, value.size // FINGERPRINT_SAMPLES)
        sample = value.flat[step // 2::step][:FINGERPRINT_SAMPLES]
        digest = zlib.crc32(("%s%s" % (value.dtype.str, value.shape)).encode(), digest)
        digest = zlib.crc32(np.ascontiguousarray(sample).view(np.uint8), digest)
    return digest & 0xFFFFFF
