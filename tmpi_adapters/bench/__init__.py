"""``tmpi bench``: the exchange, the scaling and the overhead, measured side by side.

The benchmark's code is imported only when ``tmpi bench`` runs: this module
only registers the command.  :mod:`tmpi_adapters.bench.command` runs the
parts, each of them a process of its own (:mod:`.exchange`, :mod:`.overhead`,
:mod:`.scaling`, on the conv net of :mod:`.convnet`).
"""
from tmpi_adapters.pluginmanager import hookimpl


def cmd_bench(argv):
    from tmpi_adapters.bench.command import cmd_bench as run
    return run(argv)


@hookimpl
def tmpi_commands():
    return {"bench": (cmd_bench, "measure exchange, scaling and overhead (bench/)")}
