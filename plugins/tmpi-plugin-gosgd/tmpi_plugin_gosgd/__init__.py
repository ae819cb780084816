"""tmpi-plugin-gosgd: Gossip SGD as a tmpi rule (``tmpi wrap --rule gosgd``).

This module is the plugin: the ``tmpi`` entry point of this distribution
names it, and tmpi calls the hooks it implements.  It implements one hook,
``tmpi_rules``, which tells tmpi which rule classes it provides and under
which ``--rule`` names.
"""
from tmpi_adapters import hookimpl

from .rule import GoSGD

__version__ = "0.1.0"

__all__ = ["GoSGD", "tmpi_rules", "__version__"]


@hookimpl
def tmpi_rules():
    """``{"gosgd": GoSGD}``: the rule this plugin provides."""
    return {"gosgd": GoSGD}
