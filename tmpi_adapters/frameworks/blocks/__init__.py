"""The Blocks adapter and the ``tmpi.blocks.Distributed`` extension, a built-in plugin.

:mod:`.adapter`
    :class:`BlocksAdapter`: hooks Blocks' ``MainLoop``, ``GradientDescent``
    and monitoring while a script runs.
:mod:`.model`
    the model named the Blocks way (hierarchical names), the loop's shape.
:mod:`.monitoring`
    monitoring accumulators that hold each rank's share of a batch.
:mod:`.functions`
    what the training and evaluation functions Blocks compiles become.
:mod:`.extension`
    :class:`Distributed`, the extension that distributes a main loop without
    ``tmpi wrap``.

Importing this package imports neither Blocks nor Theano (``import
tmpi_adapters as tmpi; tmpi.blocks.Distributed(...)`` works before either).
"""
from tmpi_adapters.frameworks.base import imports_module
from tmpi_adapters.frameworks.blocks.adapter import BlocksAdapter, blocks_missing_reason
from tmpi_adapters.frameworks.blocks.extension import Distributed
from tmpi_adapters.pluginmanager import hookimpl

__all__ = ["BlocksAdapter", "Distributed", "blocks_missing_reason", "tmpi_frameworks",
           "tmpi_detect_framework"]


@hookimpl
def tmpi_frameworks():
    return {"blocks": BlocksAdapter}


@hookimpl(tryfirst=True)
def tmpi_detect_framework(source, path):
    if imports_module(source, "blocks"):
        return "blocks"
    return None
