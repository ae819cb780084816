"""Theano-MPI model files, a built-in plugin.

:mod:`.adapter`
    :class:`TheanoMPIAdapter` and the ModelClass contract.
:mod:`.driver`
    the training loop each rank runs (started by path as the session's script).

``tmpi run`` (a Theano-MPI ``launch_session.cfg`` works unchanged) and the
Theano-MPI style Python API (``from tmpi_adapters import BSP``) are front
doors: :mod:`tmpi_adapters.launch.theanompi`.
"""
from tmpi_adapters.frameworks.theanompi.adapter import TheanoMPIAdapter
from tmpi_adapters.pluginmanager import hookimpl

__all__ = ["TheanoMPIAdapter", "tmpi_frameworks"]


@hookimpl
def tmpi_frameworks():
    return {"theanompi": TheanoMPIAdapter}
