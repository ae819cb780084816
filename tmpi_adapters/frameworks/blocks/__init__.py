"""The Blocks adapter and the ``tmpi.blocks.Distributed`` extension: see :mod:`.adapter`."""
from tmpi_adapters.frameworks.blocks.adapter import (BlocksAdapter, Distributed,
                                                     tmpi_after_step, tmpi_detect_framework,
                                                     tmpi_frameworks)

__all__ = ["BlocksAdapter", "Distributed", "tmpi_frameworks", "tmpi_detect_framework",
           "tmpi_after_step"]
