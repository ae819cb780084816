"""tmpi-plugin-asgd: asynchronous SGD, Downpour style, as a tmpi rule
(``--rule asgd``, also known as ``--rule downpour``)."""
from tmpi_adapters import hookimpl

from .rule import ASGD

__version__ = "0.1.0"

__all__ = ["ASGD", "tmpi_rules", "__version__"]


@hookimpl
def tmpi_rules():
    """``{"asgd": ASGD, "downpour": ASGD}``: one rule under both of its names."""
    return {"asgd": ASGD, "downpour": ASGD}
