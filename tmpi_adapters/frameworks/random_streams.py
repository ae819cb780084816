"""Random draws made for the whole batch, so that N ranks draw the one-process noise.

A script seeds its random streams alike on every rank (the classic Theano
tutorials seed ``MRG_RandomStreams`` from a fixed ``RandomState``; Keras
seeds each ``Dropout`` from ``numpy.random``, which tmpi seeds alike).  Under
strong scaling rank r computes on rows ``[lo, hi)`` of each batch of R rows:
a draw shaped like its own rows would give every rank the same numbers for
different rows (a 2-rank step would see only R/2 distinct dropout masks), and
would consume the generator differently from the one-process run.

So every draw whose first dimension is the batch's rows draws for the whole
batch and keeps this rank's rows: each rank advances its generator exactly as
the one process does, and row i gets the one-process row i's noise.  Dropout,
Gaussian noise and input corruption are then exact under BSP.

Which draws
    ``uniform``, ``binomial`` and ``normal`` (``truncated_normal`` goes through
    ``normal``) of Theano's ``MRG_RandomStreams`` and of its ``RandomStreams``
    (``theano.tensor.shared_randomstreams``), whatever calls them: a plain
    Theano script, Keras' ``K.dropout``/``K.random_*``, Lasagne's noise
    layers, Blocks' dropout.  A draw is split when its first dimension is
    axis 0 of a tensor computed from the script's inputs (``size=x.shape``,
    ``(x.shape[0], 1)``): the rows of this rank's part of the batch.  Draws
    of a fixed size, or shaped like parameters, are left alone.  Lasagne's
    adapter also hands its noise layers a :class:`RowSplitStreams`, which
    splits every draw of theirs (their first dimension is the batch's, even
    when a layer declares it as a constant).
How many rows
    a :class:`NoiseWindow` (one shared int64 vector read by the graph) says,
    set around each training step by :class:`RowSplitFunction` (and Keras'
    split evaluation): the whole batch under strong scaling; under weak
    scaling, where every rank takes whole batches of its own, rank r keeps
    the r-th of N stacked draws so that ranks draw distinct noise.

Nothing is installed on one rank: its graphs are the script's own.  Theano
is imported when a session installs this, never when this module is imported.
"""
import inspect

import numpy as np

from tmpi_adapters.core.function import DistributedFunction
from tmpi_adapters.graphs.marks import NOISE_WINDOW

#: The drawing methods split, per streams class: ``(module, class, names)``.
_STREAMS = (("theano.sandbox.rng_mrg", "MRG_RandomStreams", ("uniform", "binomial", "normal")),
            ("theano.tensor.raw_random", "RandomStreamsBase", ("uniform", "binomial", "normal")))


class NoiseWindow:
    """Which rows of the whole batch a rank's draws are made for.

    One shared int64 vector ``(a, b, c, d, e)``: for a draw of ``n`` entries
    on the rows' axis, ``e`` the rank's rows (``n = k*e`` for ``k`` entries a
    row), a draw is made for ``a*n/e + b*n`` and entries
    ``[c*n/e + d*n, ... + n)`` are kept.

    ``(0, 1, 0, 0, 1)`` (outside training steps): draw ``n``, keep all.
    ``(rows, 0, lo, 0, hi - lo)`` (strong scaling): draw for the whole batch,
    keep this rank's share.
    ``(0, size, 0, rank, 1)`` (weak scaling): ranks take distinct slabs of one draw.
    """

    def __init__(self):
        import theano
        self.coefficients = theano.shared(np.array([0, 1, 0, 0, 1], dtype="int64"),
                                          name=NOISE_WINDOW)

    def _set(self, *values):
        self.coefficients.set_value(np.array(values, dtype="int64"), borrow=True)

    def local(self):
        self._set(0, 1, 0, 0, 1)

    def whole_batch(self, rows, lo, hi):
        self._set(rows, 0, lo, 0, max(hi - lo, 1))

    def stacked(self, size, rank):
        self._set(0, size, 0, rank, 1)

    def draw_rows_and_offset(self, local_rows):
        """Symbolic ``(rows to draw, first row kept)`` for a draw whose first
        dimension is ``local_rows`` (``k`` entries for each of the rank's
        ``e`` rows: ``T.repeat(h, k, axis=0)``'s; ``e`` is the window's last
        entry, so the draw is made for ``k`` entries of every row of the
        batch and keeps the rank's)."""
        import theano.tensor as T
        a, b, c, d, e = [self.coefficients[i] for i in range(5)]
        # (A rank with no rows still draws for the whole batch, one entry a row,
        # so that its generator advances as every other rank's.)
        whole = T.switch(T.gt(local_rows, 0), a * local_rows // e, a)
        return whole + b * local_rows, c * local_rows // e + d * local_rows

    def used_by(self, function):
        """True when the compiled Theano ``function`` reads this window."""
        return any(v is self.coefficients for v in function.get_shared())


class RandomRows:
    """The row-split draws of one session (made by :func:`install`).

    Attributes
    ----------
    window : NoiseWindow
    """

    def __init__(self):
        self.window = NoiseWindow()
        self._inside = 0   # > 0 while a split draw runs (draws nest: binomial -> uniform)

    def install(self, patcher):
        """Split the batch-shaped draws of Theano's random streams (class-level
        patches, undone by ``patcher.restore()``)."""
        import importlib
        for module, name, methods in _STREAMS:
            cls = getattr(importlib.import_module(module), name)
            for method in methods:
                patcher.patch(cls, method, self._splitting(method, getattr(cls, method)))
        return self

    def _splitting(self, name, original):
        rows = self

        def draw(streams, *args, **kwargs):
            if rows._inside:
                return original(streams, *args, **kwargs)
            return rows.split(streams, name, args, kwargs, force=False)
        draw.__name__, draw.__doc__ = original.__name__, original.__doc__
        draw.__wrapped__ = original
        return draw

    def split(self, streams, name, args, kwargs, force):
        """``streams.name(*args, **kwargs)``, drawn for the rows the window says
        when its first dimension is the batch's (always, with ``force``, unless
        it is the constant 1: a draw shared by every row)."""
        method = getattr(streams, name)
        bound = inspect.signature(method).bind(*args, **kwargs)
        size = bound.arguments.get("size")
        dims = _dims(size) if size is not None else None
        if not dims or _is_one(dims[0]) or not (force or _is_batch_rows(dims[0])):
            return self._run(method, bound)
        if "nstreams" in inspect.signature(method).parameters and \
                bound.arguments.get("nstreams") is None:
            # MRG picks its stream count from the size: keep the one the
            # one-process draw picks, or its numbers would differ.
            bound.arguments["nstreams"] = streams.n_streams(size)
        local = dims[0]
        rows, offset = self.window.draw_rows_and_offset(local)
        bound.arguments["size"] = (rows,) + tuple(dims[1:])
        return self._run(method, bound)[offset:offset + local]

    def _run(self, method, bound):
        self._inside += 1
        try:
            return method(*bound.args, **bound.kwargs)
        finally:
            self._inside -= 1


class RowSplitStreams:
    """Stands in for a noise layer's random streams while its expression is
    built: every draw of a size other than 1 rows is split (see
    :meth:`RandomRows.split`).  Other attributes are the wrapped streams'."""

    def __init__(self, streams, rows):
        self._streams = streams
        self._rows = rows

    def __getattr__(self, name):
        return getattr(self._streams, name)

    def uniform(self, *args, **kwargs):
        return self._rows.split(self._streams, "uniform", args, kwargs, force=True)

    def binomial(self, *args, **kwargs):
        return self._rows.split(self._streams, "binomial", args, kwargs, force=True)

    def normal(self, *args, **kwargs):
        return self._rows.split(self._streams, "normal", args, kwargs, force=True)


def is_random_streams(obj):
    """True for an object with the drawing methods of Theano's random streams."""
    return all(callable(getattr(obj, m, None)) for m in ("uniform", "binomial", "normal"))


class RowSplitFunction(DistributedFunction):
    """A training function whose draws are made for the whole batch.

    Around each step the window says which rows this rank keeps: its share of
    the batch under strong scaling, its slab of N stacked draws when every
    rank steps on a whole batch of its own (weak scaling, ``batch_mode()``
    other than ``"rows"``).  Functions that draw nothing batch-shaped do no
    more than a :class:`~tmpi_adapters.core.function.DistributedFunction`.
    """

    def __init__(self, adapter, compiled, model, *args, **kwargs):
        super().__init__(adapter, compiled, model, *args, **kwargs)
        rows = random_rows(adapter)
        self._window = rows.window if rows is not None and rows.window.used_by(compiled) \
            else None
        self._share = None   # (batch rows, first row) of the call being split

    def _local_call(self, args, kwargs, rows, bounds, lo, hi):
        self._share = (rows, lo, hi)
        return super()._local_call(args, kwargs, rows, bounds, lo, hi)

    def _step(self, args, kwargs, weight, rows, batch=None, data=None):
        window, share, self._share = self._window, self._share, None
        if window is None:
            return super()._step(args, kwargs, weight, rows, batch=batch, data=data)
        if batch is not None and share is not None:
            window.whole_batch(*share)
        elif batch is None and self.adapter.batch_mode() != "rows":
            window.stacked(self.session.size, self.session.rank)
        try:
            return super()._step(args, kwargs, weight, rows, batch=batch, data=data)
        finally:
            window.local()


def random_rows(adapter):
    """The adapter's :class:`RandomRows`, or ``None`` (one rank)."""
    transparency = getattr(adapter, "transparency", None)
    return getattr(transparency, "random", None)


# ------------------------------------------------------------------ reading sizes

def _dims(size):
    """``size`` of a random draw as a tuple, or ``None`` when its length is unknown."""
    import theano.tensor as T
    if isinstance(size, (tuple, list)):
        return tuple(size)
    try:
        length = T.get_vector_length(size)
    except (ValueError, TypeError):
        return None
    return tuple(size[i] for i in range(length))


def _is_one(dim):
    """True when a draw's first dimension is the constant 1 (shared over the batch)."""
    import theano.tensor as T
    if isinstance(dim, (int, np.integer)):
        return int(dim) == 1
    try:
        return int(T.get_scalar_constant_value(dim)) == 1
    except T.NotScalarConstantError:
        return False


def _is_batch_rows(dim):
    """True when ``dim`` is axis 0 of a tensor computed from the script's
    inputs (``x.shape[0]`` of the batch or of a layer's output), not of a
    parameter or a constant."""
    import theano.tensor as T
    from theano.compile.ops import Shape, Shape_i
    from theano.tensor.opt import MakeVector
    from theano.tensor.subtensor import Subtensor, get_idx_list
    for _ in range(32):
        node = getattr(dim, "owner", None)
        if node is None:
            return False
        op = node.op
        if isinstance(op, Shape_i):
            return op.i == 0 and _from_inputs(node.inputs[0])
        if isinstance(op, Subtensor):
            index = get_idx_list(node.inputs, op.idx_list)
            if len(index) != 1 or isinstance(index[0], slice):
                return False
            try:
                k = int(T.get_scalar_constant_value(index[0]))
            except T.NotScalarConstantError:
                return False
            vector = node.inputs[0].owner
            if vector is not None and isinstance(vector.op, Shape):
                return k == 0 and _from_inputs(vector.inputs[0])
            if vector is not None and isinstance(vector.op, MakeVector):
                dim = vector.inputs[k]
                continue
            return False
        if _is_cast(op):
            dim = node.inputs[0]
            continue
        return False
    return False


def _is_cast(op):
    """True for an op that only changes a value's type (scalar/tensor, dtype)."""
    from theano import scalar
    from theano.tensor.basic import ScalarFromTensor, TensorFromScalar
    from theano.tensor.elemwise import Elemwise
    if isinstance(op, (ScalarFromTensor, TensorFromScalar)):
        return True
    return isinstance(op, Elemwise) and isinstance(op.scalar_op, (scalar.Cast, scalar.Identity))


def _from_inputs(variable):
    """True when ``variable`` is computed from a root that is neither shared
    nor constant: an input of the functions that will use it."""
    from theano.compile.sharedvalue import SharedVariable
    from theano.gof.graph import Constant, inputs
    return any(not isinstance(v, (SharedVariable, Constant)) for v in inputs([variable]))
