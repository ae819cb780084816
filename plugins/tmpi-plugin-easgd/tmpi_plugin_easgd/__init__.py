"""tmpi-plugin-easgd: Elastic Averaging SGD as a tmpi rule (``--rule easgd``)."""
from tmpi_adapters import hookimpl

from .rule import EASGD

__version__ = "0.1.0"

__all__ = ["EASGD", "tmpi_rules", "__version__"]


@hookimpl
def tmpi_rules():
    """``{"easgd": EASGD}``: the rule this plugin provides."""
    return {"easgd": EASGD}
