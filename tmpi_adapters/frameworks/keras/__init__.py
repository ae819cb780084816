"""The Keras 2.3.1 (Theano backend) adapter, a built-in plugin.

:mod:`.adapter`
    :class:`KerasAdapter`: hooks Keras' classes while a script runs (training
    and test functions, callbacks).
:mod:`.step`
    what a model's compiled functions become: a distributed step that keeps
    Keras' metrics global, an evaluation split across ranks.
:mod:`.metrics`
    how each metric accumulator's increments combine across ranks.
:mod:`.feeding`
    generator-fed loops: rank 0 alone draws each batch and hands it to every rank.
:mod:`.sharding`
    ``--scaling weak``: each rank's ``fit`` sees its own shard of the data.
:mod:`.writers`
    ``save_model``, ``save_weights``, ``CSVLogger`` under tmpi's rule for files.

Keras' dropout and noise layers draw for the whole batch through
:mod:`tmpi_adapters.frameworks.random_streams`, as every framework's do.

Importing this package imports neither Keras nor Theano.
"""
from tmpi_adapters.frameworks.base import imports_module
from tmpi_adapters.frameworks.keras.adapter import KerasAdapter
from tmpi_adapters.pluginmanager import hookimpl

__all__ = ["KerasAdapter", "tmpi_frameworks", "tmpi_detect_framework"]


@hookimpl
def tmpi_frameworks():
    return {"keras": KerasAdapter}


@hookimpl(tryfirst=True)
def tmpi_detect_framework(source, path):
    if imports_module(source, "keras"):
        return "keras"
    return None
