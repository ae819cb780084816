"""Reads data the user points at: ``mnist DIR`` (tmpi's loader) or ``npz FILE`` (numpy)."""
import sys

import numpy as np
import theano  # noqa: F401 - a Theano script, like any other

from tmpi_adapters import datasets

kind, path = sys.argv[1], sys.argv[2]
if kind == "mnist":
    (x_train, y_train), _ = datasets.mnist(path)
else:
    data = np.load(path)
