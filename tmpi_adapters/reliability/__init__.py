"""Reliability: failed and stalled ranks, checkpoints and exact resume, non-finite values.

The built-in plugin is :mod:`~tmpi_adapters.reliability.plugin` (its options
and the per-run object that registers the pieces); the pieces are
:mod:`~tmpi_adapters.reliability.watchdog`,
:mod:`~tmpi_adapters.reliability.nonfinite` and
:mod:`~tmpi_adapters.reliability.checkpoint`.  Nothing is imported here.
"""
