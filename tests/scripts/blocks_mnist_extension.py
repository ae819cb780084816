"""``blocks_mnist.py`` with tmpi's Blocks extension added to its main loop.

    mpiexec -n 2 python blocks_mnist_extension.py          # no tmpi wrap needed
"""
# The shims Blocks needs on Python 3.11 come from the environment's start-up
# hook (make install), as for any script started without tmpi wrap.
import tmpi_adapters as tmpi

import blocks_mnist

if __name__ == "__main__":
    blocks_mnist.main(more_extensions=[tmpi.blocks.Distributed(rule="bsp")])
