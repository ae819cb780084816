"""What every framework adapter adds so that an unmodified script on N ranks
does what it does in one process, beyond its training steps.

:mod:`~tmpi_adapters.frameworks.random_streams`
    random draws shaped like the batch are made for the whole batch, each
    rank keeping its rows: the one-process noise (dropout masks, input
    corruption).
:mod:`~tmpi_adapters.frameworks.writes`
    a file every rank writes to the same path is written once, and every rank
    continues only once it is complete; rank-specific paths are written by
    their own rank.

:meth:`~tmpi_adapters.frameworks.theano.TheanoAdapter.install`, which every
framework adapter extends, calls :func:`install`; the adapter's ``patcher``
undoes it.  Training functions become :class:`~.random_streams.RowSplitFunction` s
(adapters with a function class of their own extend it).  On one rank nothing is installed: the script runs as it is.
"""
from tmpi_adapters.frameworks.random_streams import RandomRows, RowSplitFunction
from tmpi_adapters.frameworks.writes import FileWrites


class Transparency:
    """What :func:`install` installed for one adapter.

    Attributes
    ----------
    random : RandomRows or None
        The row-split random draws (``None`` on one rank).
    files : FileWrites or None
        The rule for files (``None`` on one rank).
    """

    def __init__(self, random=None, files=None):
        self.random = random
        self.files = files


def install(adapter):
    """Row-split random draws and the rule for files, for ``adapter``'s session."""
    if adapter.session.size == 1:
        return Transparency()
    if adapter.function_class is None:
        # Training functions set the rows their draws keep around each step.
        adapter.function_class = RowSplitFunction
    return Transparency(random=RandomRows().install(adapter.patcher),
                        files=FileWrites(adapter.session).install(adapter.patcher))
