"""``--record`` files: one JSON object per line, written on rank 0.

A ``run`` header, a ``warning`` where ranks that asked for a device compute
on the CPU (:mod:`tmpi_adapters.reliability.device`), one ``step`` per
training step (the time split of :mod:`tmpi_adapters.core.timing`, the
training function's scalar outputs), the steps' waits measured at the end,
and a closing ``summary``; ``tmpi plot`` draws them.
"""
import json
import os
import time

import numpy as np


class RunLog:
    """JSON lines on rank 0, flushed about once a second (and at the end)."""

    def __init__(self, path, header):
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        self.path = path
        self._handle = open(path, "w", encoding="utf-8")
        self._flushed = time.monotonic()
        self.write(header)

    def write(self, record):
        self._handle.write(json.dumps(_finite(record), allow_nan=False, default=_jsonable)
                           + "\n")
        if time.monotonic() - self._flushed > 1.0:
            self._handle.flush()
            self._flushed = time.monotonic()

    def close(self):
        self._handle.close()


def _finite(value):
    """The record with NaN/inf replaced by null (strict JSON has no NaN)."""
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, float) and not np.isfinite(value):
        return None
    return value


def _jsonable(value):
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError("not JSON serialisable: %r" % (value,))
