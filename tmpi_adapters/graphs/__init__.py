"""Reading a Theano graph, once, when a function is compiled on more than one rank.

Which axis of each input holds the examples (:mod:`.layout`, with the sizes
Theano can infer: :mod:`.sizes`); the one row analysis (:mod:`.rows`, with
scans read step by step in :mod:`.scans`): what every value is on a rank
(its rows, a partial sum or extremum, a whole value, a size) and, for a
training step, the graph that computes the one-process value wherever rows
meet; what each returned value is and how the ranks' values combine
(:mod:`.outputs`); which gradient terms every rank computes alike
(:mod:`.terms`); where the graph writes the batch size in and how each
reshape's rows go, proven on a call (:mod:`.fixedbatch`); and the mark tmpi's
``theano.grad`` leaves on gradients (:mod:`.gradient`, :mod:`.marks`).
Nothing here runs during a step: the step (:mod:`tmpi_adapters.core`) uses
what was read.
"""
