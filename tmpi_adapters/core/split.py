"""How the calls of one compiled function are split across ranks, decided once.

A :class:`SplitPlan` is made when a function is compiled on more than one
rank.  It says where each call's batch is:

arguments
    numpy arrays, cut along each input's batch axis (:mod:`.layout`: axis 0,
    or 1 for the ``(time, batch, ...)`` inputs of sequence models);
``givens``
    ``givens={x: data[i*B:(i+1)*B]}`` slices of shared datasets, rewritten to
    ``data[lo:hi]`` with ``lo``/``hi`` shared scalars set before each call
    (:class:`SlicedGiven`);
shared variables that carry the batch
    named by the framework adapter (Keras' ``target_tensors``), replaced in
    the graph by ``variable[lo:hi]`` the same way (:class:`SlicedShared`).

Per call the plan only reads lengths, cuts arrays and sets a few scalars.
"""
import numpy as np

from tmpi_adapters.core.batches import batch_rows, cut_rows
from tmpi_adapters.errors import TmpiError


def input_variables(inputs):
    """The variables of ``theano.function``'s ``inputs`` (``In`` unwrapped)."""
    from theano.compile.io import In
    for i in inputs:
        yield i.variable if isinstance(i, In) else i


def _bounds():
    import theano
    return (theano.shared(np.int64(0), name="tmpi_lo"),
            theano.shared(np.int64(0), name="tmpi_hi"))


def _along(axis, lo, hi, rest=()):
    """An index that takes ``[lo:hi]`` along ``axis``."""
    return (slice(None),) * axis + (slice(lo, hi),) + tuple(rest)


class SlicedGiven:
    """A ``givens`` value ``data[start:stop]`` (on the batch axis) rewritten to
    ``data[lo:hi]``."""

    def __init__(self, value, axis=0):
        from theano.tensor.subtensor import Subtensor, get_idx_list
        node = value.owner
        if node is None or not isinstance(node.op, Subtensor) or axis is None:
            raise ValueError("not a subtensor")
        idx = list(get_idx_list(node.inputs, node.op.idx_list))
        idx += [slice(None)] * (node.inputs[0].ndim - len(idx))
        # The given's axis `axis` is the base's axis after the integer indices.
        slices = [k for k, entry in enumerate(idx) if isinstance(entry, slice)]
        if axis >= len(slices):
            raise ValueError("no such axis")
        at = slices[axis]
        entry = idx[at]
        if entry.step is not None or entry.stop is None:
            raise ValueError("not a plain slice on the batch axis")
        base = node.inputs[0]
        self.axis = at
        #: the shared dataset sliced (directly, or through a cast), or None
        self.dataset = _shared_source(base)
        self.start = entry.start if entry.start is not None else 0
        self.stop = entry.stop
        self.length = base.shape[at]
        self.lo, self.hi = _bounds()
        idx[at] = slice(self.lo, self.hi)
        self.value = base[tuple(idx)]


def _shared_source(variable):
    """The shared variable ``variable`` is, or is an elementwise function of
    (``T.cast(shared_y, 'int32')``), or the host copy of (a dataset on a GPU),
    or ``None``."""
    from theano.compile.sharedvalue import SharedVariable
    from theano.tensor.elemwise import Elemwise
    while not isinstance(variable, SharedVariable):
        node = variable.owner
        if node is None or len(node.inputs) != 1 or not (
                isinstance(node.op, Elemwise) or type(node.op).__name__ == "HostFromGpu"):
            return None
        variable = node.inputs[0]
    return variable


class SlicedShared:
    """A shared variable that carries the batch, replaced by ``variable[lo:hi]``
    along its batch ``axis``."""

    def __init__(self, variable, axis=0):
        self.variable = variable
        self.axis = axis
        self.lo, self.hi = _bounds()
        self.value = variable[_along(axis, self.lo, self.hi)]

    def rows(self):
        return np.shape(self.variable.get_value(borrow=True, return_internal_type=True))[self.axis]


class SplitPlan:
    """Where a function's batch is and how a rank takes its share (see module doc).

    Parameters
    ----------
    inputs : list
        ``theano.function``'s inputs.
    given_pairs : list of (Variable, Variable)
        Its ``givens``.
    batch_shared : list of SharedVariable
        Shared variables that carry the batch.
    layout : tmpi_adapters.graphs.layout.Layout
        The batch axes read from the graph.
    slice_givens : bool
        Rewrite ``givens`` slices (strong scaling); otherwise they stay whole.
    """

    def __init__(self, inputs, given_pairs, batch_shared, layout, slice_givens=True):
        self.layout = layout
        self.problem = layout.problem
        #: every variable that carries data (inputs, givens targets, shared batches)
        self.data = list(layout.data)
        variables = list(input_variables(inputs))
        self.inputs = variables
        self.positional = [layout.axis(v) for v in variables]
        self.named = {v.name: layout.axis(v) for v in variables if v.name}
        self.sliced, pairs, changed = [], [], False
        for var, value in given_pairs:
            if slice_givens:
                try:
                    s = SlicedGiven(value, layout.axis(var))
                except ValueError:
                    pass
                else:
                    self.sliced.append(s)
                    pairs.append((var, s.value))
                    changed = True
                    continue
            pairs.append((var, value))
        self.given_pairs = pairs if changed else None
        self.shared = [SlicedShared(v, layout.axis(v) or 0) for v in batch_shared]
        #: what the graph's shared batch variables become
        self.replace = {s.variable: s.value for s in self.shared}
        self._given_targets = [var for var, _ in given_pairs]
        self.bounds_fn = None

    def carries_batch(self):
        """True when calls can be split: some argument has a batch axis, or a
        ``givens`` slice or a shared variable carries the batch."""
        return bool(self.sliced or self.shared or
                    any(axis is not None for axis in self.positional))

    def compile_bounds(self, function):
        """Compile, with the original ``theano.function``, what reads each
        ``givens`` slice's bounds from a call's arguments."""
        if self.sliced:
            self.bounds_fn = function(
                self.inputs, [v for s in self.sliced for v in (s.start, s.stop, s.length)],
                on_unused_input="ignore", allow_input_downcast=True)

    def local_rows_variable(self):
        """A symbolic int: the rows this rank's call runs (a batch input's length
        along its batch axis), for graphs that write the batch size in."""
        for variable in self.inputs + self._given_targets:
            axis = self.layout.axis(variable)
            if axis is not None and getattr(variable, "ndim", 0) > axis:
                return variable.shape[axis]
        for s in self.shared:
            return s.value.shape[s.axis]
        return None

    # -- per call ---------------------------------------------------------------------
    def rows_of(self, name, args, kwargs):
        """``(rows, bounds)``: a call's global batch rows (``None`` when no batch
        is found) and, in the ``givens`` style, the slice bounds of each dataset."""
        if self.sliced:
            raw = [int(b) for b in self.bounds_fn(*args, **kwargs)]
            # Python slice semantics: negative and past-the-end bounds clip.
            bounds = []
            for start, stop, length in zip(raw[::3], raw[1::3], raw[2::3]):
                start, stop, _ = slice(start, stop).indices(length)
                bounds += [start, max(start, stop)]
            lengths = {stop - start for start, stop in zip(bounds[::2], bounds[1::2])}
            if len(lengths) != 1:
                raise TmpiError(
                    "%s slices its givens to different lengths %s in one call; tmpi cannot "
                    "split such a batch across ranks." % (name, sorted(lengths)))
            return lengths.pop(), bounds
        values = list(args) + list(kwargs.values())
        axes = self.positional[:len(args)] + [self.named.get(k, 0) for k in kwargs]
        rows = batch_rows(values, axes + [0] * (len(values) - len(axes)))
        if rows is None and self.shared:
            rows = self.shared[0].rows()
        return rows, None

    def batch_values(self, args, kwargs, bounds):
        """The arrays that hold a call's global batch: its arguments, or in
        the ``givens`` style the datasets' slices (for its fingerprint)."""
        values = list(args) + list(kwargs.values())
        for s, start, stop in zip(self.sliced, (bounds or [])[::2], (bounds or [])[1::2]):
            if s.dataset is not None:
                # A dataset on a GPU is sliced there: only the batch is copied.
                data = s.dataset.get_value(borrow=True, return_internal_type=True)
                if hasattr(data, "shape") and len(data.shape) > s.axis:
                    values.append(np.asarray(data[_along(s.axis, start, stop)]))
        values += [s.variable.get_value(borrow=True) for s in self.shared]
        return values

    def local_call(self, name, args, kwargs, rows, bounds, lo, hi):
        """Arguments (and shared bounds) that make the function see rows ``[lo, hi)``."""
        for s, start in zip(self.sliced, (bounds or [])[::2]):
            s.lo.set_value(np.int64(start + lo))
            s.hi.set_value(np.int64(start + hi))
        for s in self.shared:
            length = s.rows()
            if length != rows:
                raise TmpiError(
                    "%s: the shared variable %r carries the batch but has %d rows where the "
                    "call's batch has %s; tmpi cannot split such a call across ranks. Give it "
                    "the batch's rows, or run with --scaling weak."
                    % (name, s.variable.name or "", length, rows))
            s.lo.set_value(np.int64(lo))
            s.hi.set_value(np.int64(hi))
        if self.sliced:
            return args, kwargs
        return (cut_rows(list(args), rows, lo, hi, self.positional),
                cut_rows(kwargs, rows, lo, hi, self.named))


def analyse(inputs, given_pairs, batch_shared, graph, costs, slice_givens=True, outputs=None):
    """``(plan, rows)`` of a function compiled on more than one rank: its
    :class:`SplitPlan` and the :class:`~tmpi_adapters.graphs.rows.Rows`
    marks of its graph (``outputs``: the part of ``graph`` it returns,
    without the update expressions; all of it by default)."""
    from tmpi_adapters.graphs.layout import Layout
    from tmpi_adapters.graphs.rows import Rows
    data = list(input_variables(inputs)) + [var for var, _ in given_pairs] + list(batch_shared)
    layout = Layout(data, graph, costs=costs, outputs=outputs)
    plan = SplitPlan(inputs, given_pairs, batch_shared, layout, slice_givens=slice_givens)
    return plan, Rows(layout)
