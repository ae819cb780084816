"""Per-step timing: where each training step's time went, like Theano-MPI's recorder.

Each step is split into

``compute``   the compiled function's own work (forward, backward, update),
``exchange``  time inside the rule's collectives (gradient or parameter exchange),
``other``     time between steps spent in the user's loop (data, logging).
"""
import time

import numpy as np


class Recorder:
    """Collects step timings on every rank; rank 0 reports them."""

    def __init__(self, session):
        self.session = session
        self.steps = []          # (compute, exchange, other, samples) per step
        self._step_start = None
        self._last_end = None
        self._exchange = 0.0
        self.started = time.perf_counter()

    # -- called by the session ------------------------------------------------
    def begin_step(self):
        now = time.perf_counter()
        self._other = (now - self._last_end) if self._last_end is not None else 0.0
        self._step_start = now
        self._exchange = 0.0

    def add_exchange(self, seconds):
        self._exchange += seconds

    def end_step(self, samples):
        now = time.perf_counter()
        total = now - self._step_start if self._step_start is not None else 0.0
        self.steps.append((max(total - self._exchange, 0.0), self._exchange, self._other,
                           samples))
        self._last_end = now
        self._step_start = None

    # -- reporting --------------------------------------------------------------
    def summary(self):
        """Medians per step (seconds), totals and throughput, averaged over ranks."""
        if not self.steps:
            return None
        data = np.asarray(self.steps, dtype=np.float64)
        local = [np.median(data[:, 0]), np.median(data[:, 1]), np.median(data[:, 2]),
                 data[:, 3].sum(), data[:, :3].sum()]
        ex = self.session.exchanger
        avg = ex.allreduce([np.asarray(local[:3])], op="mean")[0]
        samples = ex.allreduce([np.asarray([local[3]])], op="sum")[0][0]
        busy = ex.allreduce([np.asarray([local[4]])], op="mean")[0][0]
        return {
            "steps": len(self.steps),
            "ranks": self.session.size,
            "compute_s": float(avg[0]),
            "exchange_s": float(avg[1]),
            "other_s": float(avg[2]),
            "samples": int(samples),
            "samples_per_s": float(samples / busy) if busy > 0 else float("nan"),
        }

    def format_summary(self, summary):
        step = summary["compute_s"] + summary["exchange_s"] + summary["other_s"]
        share = (lambda x: 100.0 * x / step) if step > 0 else (lambda x: 0.0)
        return ("tmpi: %d steps on %d rank(s), %.0f samples/s; median step %.2f ms = "
                "compute %.2f ms (%.0f%%) + exchange %.2f ms (%.0f%%) + other %.2f ms (%.0f%%)"
                % (summary["steps"], summary["ranks"], summary["samples_per_s"], step * 1e3,
                   summary["compute_s"] * 1e3, share(summary["compute_s"]),
                   summary["exchange_s"] * 1e3, share(summary["exchange_s"]),
                   summary["other_s"] * 1e3, share(summary["other_s"])))
