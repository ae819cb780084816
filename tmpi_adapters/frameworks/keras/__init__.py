"""The Keras 2.3.1 (Theano backend) adapter: see :mod:`.adapter`."""
from tmpi_adapters.frameworks.keras.adapter import (KerasAdapter, tmpi_detect_framework,
                                                    tmpi_frameworks)

__all__ = ["KerasAdapter", "tmpi_frameworks", "tmpi_detect_framework"]
