"""A ``theano.scan`` read by the row analysis: does each step keep the rows apart?

A scan over time with the batch on another axis (a recurrent network's
``(time, batch, ...)`` sequences, and the scans of its gradient) runs each
rank's rows through every step alone, as long as its step function does:
its inner graph is read with the row analysis itself (its strict
reading), its inputs marked from the outer inputs' marks (a sequence's
rows on axis ``k`` are its slices' rows on axis ``k - 1``).  A state is read
until its mark settles: a state that starts at zero and adds partial sums
(a gradient accumulated over the steps) stays a partial sum.

Where a step mixes the rows, or the scan iterates over the rows themselves,
:func:`read_scan` answers ``None`` and the row analysis runs the scan on the
whole batch.
"""
from tmpi_adapters.graphs.marks import MIXED, PARTIAL, REPL, SAME, SHAPE, SUM, Shard

#: How often the states' marks are read again before giving up.
_ROUNDS = 4


def read_scan(rows, node, ins):
    """``(marks, inputs)`` of scan ``node`` whose outer inputs have the marks
    ``ins``, with its outer inputs as the converted graph gives them; ``None``
    where its steps mix the rows."""
    op = node.op
    outer = list(node.inputs)
    if ins[0] is not SAME:
        return None            # the number of steps follows the batch: a scan over rows
    seqs = op.outer_seqs(outer)
    mitmot, mitsot, sitsot = op.outer_mitmot(outer), op.outer_mitsot(outer), \
        op.outer_sitsot(outer)
    shared, nitsot, non_seqs = op.outer_shared(outer), op.outer_nitsot(outer), \
        op.outer_non_seqs(outer)
    mark = dict(zip(outer, ins))
    if any(mark[v] is not SAME for v in nitsot):
        return None
    # Sequences and states lose their leading (time) axis inside.
    inner_in = list(op.inputs)
    start = {}
    for v in seqs:
        m = mark[v]
        if isinstance(m, Shard) and m.axis == 0 or m in PARTIAL or m == SHAPE:
            return None
        start[v] = _shifted(m, -1)
    states = [(v, len(taps)) for v, taps in zip(mitmot, op.mitmot_taps())] + \
        [(v, len(taps)) for v, taps in zip(mitsot, op.mitsot_taps())] + [(v, 1) for v in sitsot]
    for v, _ in states:
        m = mark[v]
        if isinstance(m, Shard) and m.axis == 0 or m == SHAPE or m in PARTIAL and m != SUM:
            return None
        start[v] = _shifted(m, -1)
    for v in shared:
        if mark[v] is not SAME:
            return None
        start[v] = SAME
    for v in non_seqs:
        m = mark[v]
        start[v] = REPL if m in PARTIAL or m == SHAPE else m
    zero = {v: rows.is_zero(v) for v, _ in states}
    for v, _ in states:
        if zero[v] and start[v] is SAME:
            start[v] = SUM      # most likely a gradient summed over the steps; else read again
    order = list(seqs) + [v for v, taps in states for _ in range(taps)] + list(shared) + \
        list(non_seqs)
    for _ in range(_ROUNDS):
        inner_marks = dict(zip(inner_in, [start[v] for v in order]))
        inner = _read_inner(type(rows), op, inner_in, inner_marks)
        if inner is None:
            return None
        outs = _state_outputs(op, inner)
        changed = False
        for (v, _), found in zip(states, outs):
            if any(m == MIXED for m in found):
                return None
            settled = _settle(start[v], found, zero[v])
            if settled is None:
                return None
            if settled != start[v]:
                start[v], changed = settled, True
        if not changed:
            break
    else:
        return None
    out_marks = [inner(v) for v in op.outputs]
    if any(m == MIXED for m in out_marks):
        return None
    n_state_outs = op.n_mit_mot + op.n_mit_sot + op.n_sit_sot + op.n_nit_sot
    marks = []
    per_output = _outer_output_marks(op, out_marks)
    for k, m in enumerate(per_output):
        if k < n_state_outs:
            marks.append(_shifted(m, 1))
        else:
            marks.append(m)
    inputs = [rows.local(outer[0])]
    for v in seqs:
        inputs.append(_outer_form(rows, v, start[v], 1, node))
    for v, _ in states:
        inputs.append(_outer_form(rows, v, start[v], 1, node))
    for v in shared:
        inputs.append(rows.local(v))
    for v in nitsot:
        inputs.append(rows.local(v))
    for v in non_seqs:
        inputs.append(_outer_form(rows, v, start[v], 0, node))
    return marks, inputs


def _shifted(mark, by):
    """A mark with its rows' axis moved by ``by`` (a step's slice loses the time axis)."""
    return mark.moved(mark.axis + by) if isinstance(mark, Shard) else mark


def _outer_form(rows, variable, inner_mark, shift, node):
    """The outer input as the converted graph gives it to the scan."""
    mark = rows(variable)
    if isinstance(inner_mark, Shard):
        return rows.placed(variable, inner_mark.moved(inner_mark.axis + shift))
    if inner_mark == SUM:
        return rows.local(variable)
    if inner_mark == REPL or mark == REPL:
        return rows.replicated(variable, node)
    return rows.local(variable)


def _settle(assumed, found, zero):
    """A state's mark once its step's output mark is ``found`` (a list, one
    per output tap): the mark both agree on, or ``None``."""
    marks = {m for m in found}
    if len(marks) != 1:
        return None
    m = marks.pop()
    if m == assumed:
        return assumed
    if assumed is SAME and zero and m == SUM:
        return SUM             # zeros that accumulate partial sums
    if assumed is SAME and (isinstance(m, Shard) or m == REPL):
        return m               # a whole initial value, cut to the rows or kept whole
    if assumed == REPL and m is SAME:
        return REPL
    if assumed == SUM and zero and (m is SAME or isinstance(m, Shard)):
        return m               # zeros that stay whole, or become rows
    return None


def _read_inner(analysis, op, inner_in, marks):
    """The strict row reading (``analysis``, the row analysis' class) of a
    scan's inner graph, its inputs marked."""
    from tmpi_adapters.graphs.layout import Layout
    axes = {v: m.axis for v, m in marks.items() if isinstance(m, Shard)}
    try:
        layout = Layout(inner_in, list(op.outputs), axes={v: axes.get(v) for v in inner_in})
        return analysis(layout, convert=False, marks=dict(marks))
    except Exception:  # noqa: BLE001 - an inner graph the reading cannot follow
        return None


def _state_outputs(op, inner):
    """Per state (mit_mot, mit_sot, sit_sot in order): the marks of its step's outputs."""
    outs = list(op.outputs)
    found = []
    position = 0
    for taps in op.mitmot_out_taps():
        found.append([inner(v) for v in outs[position:position + len(taps)]])
        position += len(taps)
    for v in op.inner_mitsot_outs(outs):
        found.append([inner(v)])
    for v in op.inner_sitsot_outs(outs):
        found.append([inner(v)])
    return found


def _outer_output_marks(op, out_marks):
    """One mark per outer output, from the marks of the inner outputs."""
    marks = []
    position = 0
    for taps in op.mitmot_out_taps():
        marks.append(out_marks[position])
        position += len(taps)
    marks += out_marks[position:]
    return marks
