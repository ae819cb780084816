"""``tmpi bench``: the exchange, the overhead, the scaling and the collectives, side by side.

The benchmark's code is imported only when ``tmpi bench`` runs: this module
only registers the command.  :mod:`tmpi_adapters.bench.command` runs the
parts, each as processes of their own (:mod:`.runs`), on the plain Theano
models of :mod:`.models`.
"""
from tmpi_adapters.pluginmanager import hookimpl


def cmd_bench(argv):
    from tmpi_adapters.bench.command import cmd_bench as run
    return run(argv)


@hookimpl
def tmpi_commands():
    return {"bench": (cmd_bench, "measure exchange, overhead, scaling and collectives (bench/)")}
