"""Synchronisation rules: how ranks combine their work.

:class:`Rule` is the base class (also ``tmpi_adapters.Rule``); BSP, the
built-in rule, is :mod:`tmpi_adapters.rules.bsp`; the building blocks of
asynchronous rules are in :mod:`tmpi_adapters.rules.asynchronous`.
"""
from tmpi_adapters.rules.base import PerModel, Rule, flat_size, pack, unpack

__all__ = ["Rule", "PerModel", "flat_size", "pack", "unpack"]
