"""Per-step timing: where each training step's time went, like Theano-MPI's recorder.

Every step is split into

``compute``  the compiled function's own work (forward, backward, update);
``comm``     exchanging gradients, parameters and returned values: packing,
             converting and moving bytes once every rank has arrived (the
             part spent inside MPI is also recorded as ``transfer``);
``wait``     waiting at the step's synchronisation point for the slowest rank
             (a straggler, or an uneven split of the work): under a lockstep
             rule measured at the end of the run, as each step's exchange
             time beyond the shortest rank's (the last to arrive);
``data``     time between steps: the script's own work in its loop
             (loading and preparing the batch, logging, and any validation
             pass); reported as "between steps".

Every rank keeps its own records; rank 0 prints a summary averaged over ranks
at the end.  The recording plugin (:mod:`tmpi_adapters.recording`) writes
them to ``--record`` files and shows ``--progress``.
"""
import re
import socket
import time

import numpy as np

from tmpi_adapters.process import binding
from tmpi_adapters.process.binding import current_cpu
from tmpi_adapters.process.devices import describe as describe_device


#: Keys of a step record's times, in the order they are reported.
PHASES = ("compute", "comm", "wait", "data")
#: How the summary line names each.
LABELS = {"compute": "compute", "comm": "comm", "wait": "wait", "data": "between steps"}
#: Functions whose rows meet that the end-of-run line names (the record has all).
SHOWN_COUPLINGS = 3


class Recorder:
    """Collects step timings on every rank; rank 0 reports them.

    Attributes
    ----------
    steps : list of tuple
        ``(compute_s, comm_s, wait_s, data_s, samples, collectives)`` per
        step, where ``samples`` counts the rows of every rank and
        ``collectives`` the exchanger's collectives the step issued.
    last : dict or None
        The latest step's record (what ``--record`` writes).
    last_summary : dict or None
        What :meth:`summary` returned last.
    """

    def __init__(self, session):
        self.session = session
        self.steps = []
        #: the rows this rank computed, over every step
        self.own_rows = 0
        #: the cores this rank was seen running on, every 8th step
        self.cpus = []
        self._last = self._last_record = None
        self.last_summary = None
        self.measured = None
        #: callables ``note(summary) -> str or None`` whose words end the
        #: end-of-run line (an adapter's word on where its batches came from)
        self.notes = []
        self.started = time.perf_counter()
        self._step_start = None
        self._last_end = None
        self._exchange = 0.0
        self._data = 0.0

    # -- called by the session ------------------------------------------------
    def begin_step(self):
        now = time.perf_counter()
        self._data = (now - self._last_end) if self._last_end is not None else 0.0
        self._step_start = now
        self._exchange = 0.0
        self.session.exchanger.stats.take()  # forget what happened between steps

    def add_exchange(self, seconds):
        """Count ``seconds`` of this step as exchange (comm + wait)."""
        self._exchange += seconds

    def end_step(self, samples, outputs=None, model=None):
        """Close the step that ran ``samples`` rows on this rank (``None``:
        not known, so the job's throughput is reported in steps).

        ``outputs`` are the training function's returned values (already
        combined across ranks); scalars among them are recorded.
        """
        now = time.perf_counter()
        total = now - self._step_start if self._step_start is not None else 0.0
        stats = self.session.exchanger.stats.take()
        wait = min(stats["wait_s"], self._exchange)
        comm = self._exchange - wait
        compute = max(total - self._exchange, 0.0)
        # The weighted gradient mean summed every rank's rows; without it
        # (sum reduction, parameter rules) assume every rank ran as many.
        total_weight = stats["last_total_weight"]
        global_samples = total_weight if total_weight else (
            float("nan") if samples is None else samples * self.session.size)
        self.steps.append((compute, comm, wait, self._data, global_samples,
                           stats["collectives"]))
        self.own_rows += samples or 0
        if len(self.steps) % 8 == 1:
            self.cpus.append(current_cpu())  # where the rank ran, now and then
        self._last = (now, compute, comm, wait, self._data, global_samples, stats, outputs,
                      model, samples)
        self._last_record = None
        self._last_end = now
        self._step_start = None

    @property
    def last(self):
        """The latest step's record (a dict; ``None`` before the first step),
        built when asked for: a step that nobody records costs nothing more."""
        if self._last_record is None and self._last is not None:
            now, compute, comm, wait, data, global_samples, stats, outputs, model, samples = \
                self._last
            busy = compute + comm + wait + data
            self._last_record = {
                "type": "step",
                "model": getattr(model, "name", None),
                "step": len(self.steps),
                "time_s": round(now - self.started, 6),
                "compute_s": compute, "comm_s": comm, "wait_s": wait, "data_s": data,
                "samples": None if np.isnan(global_samples) else int(round(global_samples)),
                "rows": samples,        # this rank's share of them
                "samples_per_s": global_samples / busy
                if busy > 0 and not np.isnan(global_samples) else None,
                "transfer_s": min(stats["transfer_s"], comm),
                "wire_bytes": stats["wire_bytes"],
                "collectives": stats["collectives"],
                "outputs": scalar_outputs(outputs,
                                          model.output_names if model is not None else None),
            }
        return self._last_record

    # -- reporting --------------------------------------------------------------
    def summary(self):
        """Medians per step (seconds), totals and throughput, averaged over ranks.

        Collective: every rank must call it.
        """
        if not self.steps:
            return None
        data = np.asarray(self.steps, dtype=np.float64)
        self._measure_waits(data)
        medians = np.median(data[:, :4], axis=0)
        means = data[:, :4].mean(axis=0)
        # The training loop's pace: a median step, the time before it
        # included (a validation pass or another test's compile between two
        # steps is no part of it).
        step = np.median(data[:, :4].sum(axis=1))
        ex = self.session.exchanger
        avg, = ex.allreduce([np.concatenate([medians, [step], means])], op="mean")
        # Every rank counted each step's rows on all ranks: its own total is the job's.
        counted = not np.isnan(data[:, 4]).any()
        samples = data[:, 4].sum() if counted else None
        per_step = float(np.median(data[:, 4])) if counted else 1.0
        rate = per_step / avg[4] if avg[4] > 0 else float("nan")
        self.last_summary = {
            "type": "summary",
            "steps": len(self.steps),
            "ranks": self.session.size,
            "compute_s": float(avg[0]),
            "comm_s": float(avg[1]),
            "wait_s": float(avg[2]),
            "data_s": float(avg[3]),
            "exchange_s": float(avg[1] + avg[2]),
            "samples": int(round(samples)) if counted else None,
            "samples_per_s": float(rate) if counted else None,
            "steps_per_s": float(1.0 / avg[4]) if avg[4] > 0 else float("nan"),
            "collectives_per_step": float(np.median(data[:, 5])),
            # Means over every step: periodic exchanges (EASGD every tau
            # steps) and stragglers that the medians above do not show.
            "mean_comm_s": float(avg[6]),
            "mean_wait_s": float(avg[7]),
            "mean_collectives_per_step": float(data[:, 5].mean()),
        }
        # Where each rank computed ("cpu", or its GPU or OpenCL device), how
        # many rows it computed in all (its share of every batch), on which
        # host and cores it could run and which cores it was seen on.
        mine = (describe_device(), int(self.own_rows), binding.BOUND or binding.cores(),
                [c for c in self.cpus if c is not None], socket.gethostname())
        ranks = ex.allgather_object(mine) if self.session.size > 1 else [mine]
        self.last_summary["devices"] = [r[0] for r in ranks]
        self.last_summary["rows_per_rank"] = [r[1] for r in ranks]
        self.last_summary["cores"] = [r[2] for r in ranks]
        self.last_summary["cpus_seen"] = [r[3] for r in ranks]
        self.last_summary["hosts"] = [r[4] for r in ranks]
        shared = []
        for host in dict.fromkeys(r[4] for r in ranks):  # each host's cores on their own
            local = [rank for rank, r in enumerate(ranks) if r[4] == host]
            shared += [(core, [local[i] for i in stacked]) for core, stacked in
                       binding.shared_while_free([(ranks[r][2], ranks[r][3]) for r in local])]
        self.last_summary["shared_cores"] = shared
        # Collectives besides the exchange where a step's rows meet, per
        # training function: what each makes whole and where (core/coupling.py).
        steps = [(model, getattr(model.train_fn, "coupled_step", None))
                 for model in self.session.models]
        self.last_summary["couplings"] = {
            model.name: coupled.step.levels for model, coupled in steps
            if coupled is not None and model.step and coupled.step.levels}
        # ... and how many of them gather while the step computes on.
        self.last_summary["couplings_overlapped"] = {
            model.name: coupled.step.overlapped for model, coupled in steps
            if coupled is not None and model.step and coupled.step.overlapped}
        return self.last_summary

    #: Steps (the latest) whose exchanges the summary compares across ranks.
    WAIT_WINDOW = 4096

    def _measure_waits(self, data):
        """Split each step's exchange into the wait for the slowest rank and
        the exchange itself, measured: ranks that meet in the same steps
        (lockstep rules) compare each step's exchange time, and the one
        that arrived last, whose exchange is the shortest, waited for no
        one.  So ``wait = exchange - the shortest exchange of that step``.

        Collective: one exchange of every rank's times at the end of the run.
        """
        session = self.session
        if session.size == 1 or session.rule.exchanges != "gradients":
            return
        window = data[-self.WAIT_WINDOW:]
        exchange = window[:, 1] + window[:, 2]
        table = np.zeros((session.size, self.WAIT_WINDOW + 1))
        table[session.rank, 0] = len(data)
        table[session.rank, 1:1 + len(exchange)] = exchange
        table, = session.exchanger.allreduce([table.ravel()], op="sum")
        table = table.reshape(session.size, -1)
        if len(set(table[:, 0])) != 1:
            return  # ranks took different numbers of steps: nothing to compare
        shortest = table[:, 1:1 + len(exchange)].min(axis=0)
        window[:, 2] = exchange - shortest
        window[:, 1] = shortest
        #: what ``--record`` adds for ``tmpi plot``: this rank's measured split
        self.measured = {"type": "waits", "first_step": len(data) - len(window) + 1,
                         "comm_s": window[:, 1].tolist(), "wait_s": window[:, 2].tolist()}

    def format_summary(self, summary):
        step = sum(summary[p + "_s"] for p in PHASES)
        parts = " + ".join(
            "%s %.2f ms (%.0f%%)" % (LABELS[p], summary[p + "_s"] * 1e3,
                                     100.0 * summary[p + "_s"] / step if step > 0 else 0.0)
            for p in PHASES)
        pace = ("%.0f samples/s" % summary["samples_per_s"]
                if summary.get("samples_per_s") is not None
                else "%.4g steps/s (the batch's rows were not found)" % summary["steps_per_s"])
        text = ("tmpi: %d steps on %d rank(s), %s in the training loop; median step "
                "%.2f ms = %s" % (summary["steps"], summary["ranks"], pace, step * 1e3, parts))
        exchange = summary["comm_s"] + summary["wait_s"]
        mean = summary.get("mean_comm_s", 0.0) + summary.get("mean_wait_s", 0.0)
        if mean > 1.5 * exchange + 1e-4:
            # Periodic exchanges (EASGD's every tau steps) or rare long
            # waits: the median step has none of them.
            text += "; mean comm %.2f ms + wait %.2f ms per step" % (
                summary["mean_comm_s"] * 1e3, summary["mean_wait_s"] * 1e3)
        if summary["ranks"] > 1:
            count = summary["collectives_per_step"]
            mean_count = summary.get("mean_collectives_per_step", count)
            text += "; %g collective%s per step" % (count, "" if count == 1 else "s")
            if abs(mean_count - count) > 1e-9:
                text += " (median; mean %.2f)" % mean_count
            couplings = sorted((summary.get("couplings") or {}).items(),
                               key=lambda item: _natural(item[0]))
            overlapped = summary.get("couplings_overlapped") or {}
            for name, levels in couplings[:SHOWN_COUPLINGS]:
                text += " (%s: the exchange + %d where the batch's rows meet, %sfirst %s)" % (
                    name, len(levels), "%d of them while the step computes on, " % overlapped[
                        name] if overlapped.get(name) else "", levels[0][0])
            if len(couplings) > SHOWN_COUPLINGS:
                text += " (and %d more functions whose rows meet: --record names each)" % (
                    len(couplings) - SHOWN_COUPLINGS)
        from tmpi_adapters.process.threads import blas_threads
        threads = blas_threads()
        if threads:
            text += "; %d BLAS thread%s per rank" % (threads, "" if threads == 1 else "s")
        cores = summary.get("cores") or []
        hosts = summary.get("hosts") or []
        if summary["ranks"] > 1 and cores and len(set(hosts)) > 1:
            text += "; cores " + ", ".join(
                "%s: %s" % (host, " | ".join(binding.describe(cores[r]) for r in ranks))
                for host, ranks in _ranks_by_host(hosts))
        elif summary["ranks"] > 1 and cores:
            text += "; cores " + " | ".join(binding.describe(c) for c in cores)
        for note in self.notes:
            words = note(summary)
            if words:
                text += "; " + words
        devices = [d for d in summary.get("devices") or [] if d]
        if any(d != "cpu" for d in devices):
            if len(set(devices)) == 1:
                text += "; %s %s" % ("device" if len(devices) == 1 else "every rank on",
                                     devices[0])
            else:
                text += "; devices: " + ", ".join(
                    "rank %d %s" % (r, d) for r, d in enumerate(devices))
        return text


def scalar_outputs(values, names=None):
    """``{name: float}`` for the scalar values a training function returned."""
    if values is None:
        return {}
    if not isinstance(values, (list, tuple)):
        values = [values]
    names = list(names or [])
    names += [None] * (len(values) - len(names))
    result = {}
    for i, value in enumerate(values):
        if np.ndim(value) != 0:
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        # Theano names every T.mean "mean": a name counts only when unique.
        name = names[i] if names[i] and names.count(names[i]) == 1 else "output%d" % i
        result[name] = number if np.isfinite(number) else None
    return result


def _natural(name):
    """A sort key that puts ``train_fn#2`` before ``train_fn#10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _ranks_by_host(hosts):
    """``[(host, [ranks])]`` in the order the hosts first appear."""
    grouped = {}
    for rank, host in enumerate(hosts):
        grouped.setdefault(host, []).append(rank)
    return list(grouped.items())
