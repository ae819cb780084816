"""``blocks_mnist.py`` with tmpi's Blocks extension added to its main loop.

    mpiexec -n 2 python blocks_mnist_extension.py          # no tmpi wrap needed
"""
import tmpi_adapters as tmpi  # first: applies the shims Blocks needs on Python 3.11

import blocks_mnist

if __name__ == "__main__":
    blocks_mnist.main(more_extensions=[tmpi.blocks.Distributed(rule="bsp")])
