"""Theano-MPI model files: the adapter (:mod:`.adapter`), the training loop each
rank runs (:mod:`.driver`), and ``tmpi run`` with the Python API (:mod:`.run`)."""
from tmpi_adapters.frameworks.theanompi.adapter import TheanoMPIAdapter, tmpi_frameworks
from tmpi_adapters.pluginmanager import hookimpl


def cmd_run(argv):
    from tmpi_adapters.frameworks.theanompi.run import cmd_run as run
    return run(argv)


@hookimpl
def tmpi_commands():
    return {"run": (cmd_run, "train a Theano-MPI ModelClass (launch_session.cfg)")}


__all__ = ["TheanoMPIAdapter", "tmpi_frameworks", "tmpi_commands"]
