"""What the functions Blocks compiles become under tmpi.

:class:`BlocksTrainingFunction` is ``GradientDescent``'s iteration function:
the distributed training step, with the training monitors' accumulators kept
as this rank's share (:mod:`.monitoring`).  :class:`SplitEvaluation` is a
``DatasetEvaluator``'s aggregation function, run on this rank's rows of each
batch.  Both pickle (Blocks' ``Checkpoint``) as functions that do not need a
running session.  :func:`check_same_batch` makes sure that every rank reads
the same stream: tmpi splits each batch, the stream must not.
"""
import hashlib

import numpy as np

from tmpi_adapters.core.batches import batch_rows, cut_rows, local_share
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.frameworks.blocks.monitoring import share_fraction


class _StandIn:
    """Stands in for a compiled ``function``: what it does not define itself
    (``input_storage``, ``outputs``, ...) is the function's own."""

    def __init__(self, function, shares):
        self.function = function
        self.shares = shares

    def __getattr__(self, name):
        return getattr(self.function, name)


class BlocksTrainingFunction(_StandIn):
    """``GradientDescent``'s iteration function under tmpi.

    Calls the :class:`~tmpi_adapters.core.function.DistributedFunction`
    (which splits the batch and exchanges gradients) and keeps monitoring
    accumulators as this rank's share.  On the first call every rank checks
    that it was handed the same batch.  Pickles (Blocks' ``Checkpoint``) as a
    function that compiles itself again when first called after loading.

    Parameters
    ----------
    adapter : tmpi_adapters.frameworks.blocks.adapter.BlocksAdapter
        Its ``last_samples`` tells the rows of the step just taken.
    algorithm : blocks.algorithms.GradientDescent
    function : DistributedFunction
    shares : list of MonitoringShares
        The training monitors' accumulators the step updates.
    """

    def __init__(self, adapter, algorithm, function, shares):
        super().__init__(function, shares)
        self.adapter = adapter
        self.algorithm = algorithm
        self.calls = 0

    def __reduce__(self):
        return (LazyTrainingFunction, (self.algorithm,))

    def __call__(self, *args, **kwargs):
        session = self.adapter.session
        self.calls += 1
        if session.size == 1:
            return self.function(*args, **kwargs)
        if self.calls == 1:
            check_same_batch(session, args, kwargs)
        before = [s.values() for s in self.shares]
        self.adapter.last_samples = None
        result = self.function(*args, **kwargs)
        samples = self.adapter.last_samples
        if samples is not None:  # weak scaling runs a step only every N calls
            fraction = self._fraction(args, kwargs, samples)
            for shares, old in zip(self.shares, before):
                shares.keep_share(old, fraction, samples > 0)
        return result

    def _fraction(self, args, kwargs, samples):
        session = self.adapter.session
        if session.options.scaling == "weak":
            return 1.0 / session.size if samples > 0 else 0.0
        rows, _ = self.function.rows_of(args, kwargs)
        if rows is None:  # nothing to split: every rank ran the same call
            return 1.0 / session.size
        # An empty batch counts for rank 0 alone (weight 1 of 1).
        return share_fraction(rows or 1, samples)


class LazyTrainingFunction:
    """What a pickled :class:`BlocksTrainingFunction` loads as: the algorithm's
    iteration function, compiled again (distributed or not) on first use."""

    def __init__(self, algorithm):
        self.algorithm = algorithm

    def __call__(self, *args, **kwargs):
        self.algorithm.initialize()
        return self.algorithm._function(*args, **kwargs)


def _plain(function):
    return function


class SplitEvaluation(_StandIn):
    """A ``DatasetEvaluator``'s aggregation function that runs this rank's
    rows of each batch and keeps its accumulators as this rank's share
    (``shares``, a :class:`~.monitoring.MonitoringShares`).  ``axes`` gives
    each source's batch axis (``{name: axis}``: 1 for the ``(time, batch)``
    inputs of recurrent bricks).  Pickles as the plain compiled function."""

    def __init__(self, session, function, shares, axes=None):
        super().__init__(function, shares)
        self.session = session
        self.axes = dict(axes or {})

    def __reduce__(self):
        return (_plain, (self.function,))

    def __call__(self, **batch):
        rows = batch_rows(batch, self.axes)
        if rows is None:
            return self.function(**batch)
        lo, hi, weight, total = local_share(rows, self.session.rank, self.session.size)
        local = cut_rows(batch, rows, lo, hi, self.axes)
        before = self.shares.values()
        result = self.function(**local)
        self.shares.keep_share(before, share_fraction(total, weight), weight > 0)
        return result


def batch_digest(args, kwargs):
    """A short fingerprint of a call's array arguments."""
    digest = hashlib.sha1()
    for value in list(args) + [kwargs[k] for k in sorted(kwargs)]:
        if isinstance(value, np.ndarray):
            digest.update(str((value.shape, value.dtype.str)).encode())
            digest.update(np.ascontiguousarray(value).tobytes())
    return digest.hexdigest()


def check_same_batch(session, args, kwargs):
    """Every rank must be handed the same batch: tmpi splits it, not the stream."""
    digests = session.exchanger.allgather_object(batch_digest(args, kwargs))
    differing = [rank for rank, d in enumerate(digests) if d != digests[0]]
    if differing:
        raise TmpiError(
            "the first training batch differs between ranks (rank(s) %s differ from rank 0). "
            "Every rank must read the same batches from the Blocks data stream: tmpi gives "
            "each rank its share of every batch. Give the stream's iteration scheme a fixed "
            "rng (e.g. ShuffledScheme(n, batch_size, rng=numpy.random.RandomState(1))) that "
            "does not depend on the rank." % ", ".join(map(str, differing)))
