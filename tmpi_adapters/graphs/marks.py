"""Small questions about Theano graphs, answered without importing Theano early.

Framework adapters are plugins, imported when the plugin manager is built
(``tmpi plugins``, the command line): nothing here imports Theano until a
function is called.
"""


def is_marker(variable):
    """True for the output of a :class:`~tmpi_adapters.graphs.gradient.GradientMarker`."""
    from tmpi_adapters.graphs.gradient import GradientMarker
    return variable.owner is not None and isinstance(variable.owner.op, GradientMarker)


def ancestors(variables):
    """Every variable ``variables`` are computed from (``None`` entries skipped)."""
    from theano.gof.graph import ancestors as graph_ancestors
    return graph_ancestors([v for v in variables if v is not None])
