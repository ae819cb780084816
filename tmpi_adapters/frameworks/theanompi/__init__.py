"""Theano-MPI model files, a built-in plugin.

:mod:`.adapter`
    :class:`TheanoMPIAdapter` and the ModelClass contract.
:mod:`.driver`
    the training loop each rank runs (started by path as the session's script).
:mod:`.run`
    ``tmpi run`` (a Theano-MPI ``launch_session.cfg`` works unchanged) and the
    Theano-MPI style Python API (``from tmpi_adapters import BSP``).
"""
from tmpi_adapters.frameworks.theanompi.adapter import TheanoMPIAdapter
from tmpi_adapters.pluginmanager import hookimpl

__all__ = ["TheanoMPIAdapter", "tmpi_frameworks", "tmpi_commands"]


def cmd_run(argv):
    """``tmpi run``, imported when it runs (:func:`.run.cmd_run`)."""
    from tmpi_adapters.frameworks.theanompi.run import cmd_run as run
    return run(argv)


@hookimpl
def tmpi_frameworks():
    return {"theanompi": TheanoMPIAdapter}


@hookimpl
def tmpi_commands():
    return {"run": (cmd_run, "train a Theano-MPI ModelClass (launch_session.cfg)")}
