"""Where each step's time went: the recorder (every rank), ``--record`` files,
``--progress`` bars (rank 0) and ``tmpi plot``.

A built-in plugin: the session times every step (:mod:`tmpi_adapters.core.timing`);
this module adds its options and hooks it into a run.
"""
import os
import statistics
import sys
import threading
import time

from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.process import devices
from tmpi_adapters.recording.runlog import RunLog
from tmpi_adapters.version import __version__


def cmd_plot(argv):
    from tmpi_adapters.recording.plot import main
    return main(argv)


@hookimpl
def tmpi_commands():
    return {"plot": (cmd_plot, "draw a --record run (or a bench result) to PNG")}


class Progress:
    """A tqdm bar on rank 0, from the start of the session: "compiling" until
    the first step, then steps, samples/s and the first scalar outputs under
    the script's names.

    Its length is the run's steps when the adapter knows them (batches per
    epoch times epochs).  Samples/s is the pace the end-of-run summary
    reports (the median step's rows over the median step's time, the time
    before it included), over the latest 64 steps.
    """

    def __init__(self):
        from tqdm import tqdm
        self.bar = tqdm(total=None, unit="step", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5, desc="compiling")
        self.steps = []  # (rows, seconds) of the latest steps
        self.training = False
        self._done = threading.Event()
        # tqdm redraws on updates only: the clock moves while nothing is counted.
        threading.Thread(target=self._tick, name="tmpi-progress", daemon=True).start()

    def _tick(self):
        while not self._done.wait(1.0):
            if not self.training:
                self.bar.refresh()

    def update(self, record, total=None):
        """One more step (``total``: the steps the run will take, if known)."""
        if not self.training:  # the first step: the bar counts steps from here
            self.training = True
            self.bar.set_description_str("training", refresh=False)
            self.bar.reset(total=total)
        self.bar.update(1)
        postfix = {}
        seconds = sum(record[k] for k in ("compute_s", "comm_s", "wait_s", "data_s"))
        self.steps.append((record.get("samples"), seconds))
        del self.steps[:-64]
        if record.get("samples"):
            rows = statistics.median(r for r, _ in self.steps if r)
            pace = statistics.median(t for _, t in self.steps)
            if pace > 0:
                postfix["samples/s"] = "%.0f" % (rows / pace)
        for name, value in list(record["outputs"].items())[:2]:
            if value is not None:
                postfix[name] = "%.4g" % value
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)

    def close(self):
        self._done.set()
        self.bar.close()


def planned_steps(model):
    """Training steps the adapter expects ``model`` to take, or ``None``."""
    if model.n_batch_train and model.n_epochs:
        return int(model.n_batch_train) * int(model.n_epochs)
    return None


class RecordedRun:
    """One run's ``--record`` file and ``--progress`` bar, on rank 0.

    Registered with the session's plugin manager while the run lasts.
    """

    def __init__(self, session, record, progress):
        self.session = session
        self.log = None
        # Shown from the start: compiling is most of a short run's wait.
        self.progress = Progress() if progress else None
        if record:
            options = session.options
            self.log = RunLog(record, {
                "type": "run", "version": __version__, "ranks": session.size,
                "script": os.path.basename(session.script) if session.script else None,
                "framework": options.framework, "rule": options.rule,
                "exchanger": session.exchanger.name, "precision": options.precision,
                "bucket_bytes": options.bucket_bytes, "scaling": options.scaling,
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            })
            if devices.notice is not None:  # ranks on the CPU that asked for a device
                self.log.write(devices.notice)

    @hookimpl
    def tmpi_after_step(self, session, model, step, samples):
        record = session.recorder.last
        if session is not self.session or record is None:
            return
        if self.log is not None:
            self.log.write(record)
        if self.progress is not None:
            self.progress.update(record, planned_steps(model))

    @hookimpl
    def tmpi_before_finish(self, session):
        """Training is over: the bar ends its line before the summary is printed."""
        if session is self.session and self.progress is not None:
            self.progress.close()
            self.progress = None

    @hookimpl
    def tmpi_session_end(self, session, error):
        if session is not self.session:
            return
        session.pm.unregister(self)
        if self.progress is not None:
            self.progress.close()
        if self.log is not None:
            summary = session.recorder.last_summary
            if session.recorder.measured is not None:
                self.log.write(session.recorder.measured)  # the steps' waits, measured
            if summary is not None:
                self.log.write(summary)
            if error is not None:
                self.log.write({"type": "error",
                                "error": "%s: %s" % (type(error).__name__, error)})
            self.log.close()


@hookimpl
def tmpi_add_arguments(parser):
    parser.add_argument("--record", metavar="FILE.jsonl", default=None,
                        help="write per-step timings, throughput and the training "
                             "function's scalar outputs as JSON lines (rank 0); draw "
                             "them with `tmpi plot FILE.jsonl`")
    parser.add_argument("--progress", action="store_true", default=False,
                        help="show a progress bar on rank 0")


@hookimpl
def tmpi_session_start(session):
    extra = session.options.extra or {}
    if session.rank == 0 and (extra.get("record") or extra.get("progress")):
        session.pm.register(RecordedRun(session, extra.get("record"),
                                        bool(extra.get("progress"))))
