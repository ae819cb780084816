"""Reading a Theano graph, once, when a function is compiled on more than one rank.

Which axis of each input holds the examples (:mod:`.layout`, with the sizes
Theano can infer: :mod:`.sizes`); the one row analysis: what every value is
on a rank, a typed mark (:mod:`.marks`), given node by node by the rule its
op has in one registry (:mod:`.registry`, the rules in :mod:`.ops`) and
converted by one engine (:mod:`.rows`, with scans read step by step in
:mod:`.scans`), which for a training step builds the graph that computes the
one-process value wherever rows meet (its requests for collectives:
:mod:`.pending`); what each returned value is and how the ranks' values
combine (:mod:`.outputs`); which gradient terms every rank computes alike
(:mod:`.terms`); where the graph writes the batch size in and how each
reshape's rows go, proven on a call (:mod:`.fixedbatch`, :mod:`.reshapes`);
and the marker tmpi's ``theano.grad`` leaves on gradients (:mod:`.gradient`).
Nothing here runs during a step: the step (:mod:`tmpi_adapters.core`) uses
what was read.
"""

def is_marker(variable):
    """True for the output of a :class:`~tmpi_adapters.graphs.gradient.GradientMarker`."""
    from tmpi_adapters.graphs.gradient import GradientMarker
    return variable.owner is not None and isinstance(variable.owner.op, GradientMarker)


def ancestors(variables):
    """Every variable ``variables`` are computed from (``None`` entries skipped)."""
    from theano.gof.graph import ancestors as graph_ancestors
    return graph_ancestors([v for v in variables if v is not None])
