"""Reading a Theano graph, once, when a function is compiled on more than one rank.

Which axis of each input holds the examples (:mod:`.layout`, with the sizes
Theano can infer: :mod:`.sizes`), which values are one per row
(:mod:`.rowwise`), what each returned value is and how the ranks' values
combine into the one-process value (:mod:`.outputs`), which gradient terms
every rank computes alike (:mod:`.terms`), where the graph writes the batch
size in and how to rebuild it per rank (:mod:`.fixedbatch`), and the mark
tmpi's ``theano.grad`` leaves on gradients (:mod:`.gradient`, :mod:`.marks`).
Nothing here runs during a step: the step (:mod:`tmpi_adapters.core`) uses
what was read.
"""
