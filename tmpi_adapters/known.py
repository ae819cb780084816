"""Names provided by separately installed distributions, for helpful errors."""
from .pluginmanager import hookimpl

KNOWN = {
    "easgd": "pip install tmpi-plugin-easgd",
    "gosgd": "pip install tmpi-plugin-gosgd",
    "asgd": "pip install tmpi-plugin-asgd",
    "downpour": "pip install tmpi-plugin-asgd",
}


@hookimpl
def tmpi_known_plugins():
    return dict(KNOWN)
