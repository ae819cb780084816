"""Batches split across ranks by rows: the one place that decides who takes which rows.

Strong scaling gives each of the ``size`` ranks a contiguous, balanced share
of every batch.  A rank whose share is empty (a batch with fewer rows than
ranks) runs one *padding row* with weight 0: it takes part in the step's
collectives, and its gradient and outputs count for nothing.
"""
import numpy as np

from tmpi_adapters.errors import ConfigError


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


def is_rows(value, rows):
    """True for a numpy array whose first dimension is the batch's ``rows``."""
    return isinstance(value, np.ndarray) and value.ndim >= 1 and value.shape[0] == rows


def batch_rows(values):
    """A call's batch size: the commonest first dimension of its numpy arrays
    (``None`` when it has none)."""
    leading = [v.shape[0] for v in values if isinstance(v, np.ndarray) and v.ndim >= 1]
    if not leading:
        return None
    found, counts = np.unique(leading, return_counts=True)
    return int(found[np.argmax(counts)])


def cut_rows(values, rows, lo, hi):
    """``values`` (a list, or a dict of keyword arguments) with every batch
    array cut to rows ``[lo, hi)``; other values pass through."""
    if isinstance(values, dict):
        return {k: v[lo:hi] if is_rows(v, rows) else v for k, v in values.items()}
    return [v[lo:hi] if is_rows(v, rows) else v for v in values]


def check_ranks_vs_rows(rows, size, name):
    """A clear error for a first batch with fewer rows than ranks."""
    if rows < size:
        raise ConfigError(
            "%s was called with a batch of %d rows on %d ranks: each rank needs at least one "
            "row. Use fewer ranks (-n %d) or a larger batch, or --scaling weak so that each "
            "rank takes whole batches." % (name, rows, size, max(rows, 1)))
