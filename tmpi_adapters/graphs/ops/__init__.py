"""The row rules, op by op, registered in :mod:`..registry` when imported.

:mod:`.elementwise` (elementwise ops, dimshuffles, identities),
:mod:`.reductions` (sums, maxima, minima), :mod:`.products` (products,
row-wise ops, convolutions), :mod:`.indexing` (slices, picks, their
updates), :mod:`.shapes` (sizes, reshapes, joins, allocations) and
:mod:`.control` (the step's gradients, draws, branches, scans, batch
normalisation).  Theano is imported when a rule runs.
"""
from tmpi_adapters.graphs.ops import (  # noqa: F401 - each module registers its rules
    control, elementwise, indexing, products, reductions, shapes)
