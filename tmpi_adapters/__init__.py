"""tmpi: data-parallel training for existing Theano models, without rewriting them.

The public API is small::

    import tmpi_adapters as tmpi

    @tmpi.distributed(framework="lasagne", rule="bsp")
    def main(num_epochs=10): ...

    tmpi.wrap("train.py", ["--epochs", "3"], n=2)   # what `tmpi wrap` does

plus :class:`ModelProtocol`, :class:`Exchanger` and :data:`hookimpl` for
adapter and plugin authors, and :mod:`tmpi_adapters.testing` to test a rule
on real ranks.
"""
from . import compat

__version__ = "0.1.0"

compat.apply()

from .pluginmanager import hookimpl  # noqa: E402

__all__ = ["distributed", "wrap", "ModelProtocol", "Exchanger", "hookimpl", "__version__"]


def wrap(script, args=(), n=1, **options):
    """Run ``script`` with ``args`` on ``n`` ranks, like ``tmpi wrap``; returns
    the exit status.  ``options`` are :class:`~tmpi_adapters.options.Options` fields."""
    from .launcher import launch
    from .options import Options
    return launch(script, list(args), Options(**options).validate(), n=n)


def __getattr__(name):
    # Imported on first use: `import tmpi_adapters` must stay cheap and must
    # not import Theano or numpy before the shims and thread settings apply.
    if name == "distributed":
        from .decorator import distributed
        return distributed
    if name == "ModelProtocol":
        from .protocol import ModelProtocol
        return ModelProtocol
    if name == "Exchanger":
        from .exchanger import Exchanger
        return Exchanger
    if name in ("BSP", "EASGD", "GOSGD", "ASGD"):
        from .theanompi_run import rule_class
        return rule_class(name)
    if name == "blocks":
        from .frameworks import blocks
        return blocks
    raise AttributeError("module 'tmpi_adapters' has no attribute %r" % name)
