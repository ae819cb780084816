"""Where each step's time went: the recorder (every rank), ``--record`` files,
``--progress`` bars (rank 0) and ``tmpi plot``.

A built-in plugin: :mod:`tmpi_adapters.recording.recorder` does the work;
this module adds its options and hooks it into a run.
"""
import os
import sys
import time

from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.recording.recorder import RunLog
from tmpi_adapters.version import __version__


def cmd_plot(argv):
    from tmpi_adapters.recording.plot import main
    return main(argv)


@hookimpl
def tmpi_commands():
    return {"plot": (cmd_plot, "draw a --record run (or a bench result) to PNG")}


class Progress:
    """A tqdm bar on rank 0: steps, samples/s and the first scalar outputs.

    Its length is the run's steps when the adapter knows them (batches per
    epoch times epochs).
    """

    def __init__(self, total=None):
        from tqdm import tqdm
        self.bar = tqdm(total=total, unit="step", file=sys.stderr, dynamic_ncols=True,
                        mininterval=0.5)

    def update(self, record):
        self.bar.update(1)
        postfix = {}
        if record.get("samples_per_s"):
            postfix["samples/s"] = "%.0f" % record["samples_per_s"]
        for name, value in list(record["outputs"].items())[:2]:
            if value is not None:
                postfix[name] = "%.4g" % value
        if postfix:
            self.bar.set_postfix(postfix, refresh=False)

    def close(self):
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
        self.progress = None
        self.wants_progress = progress
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

    @hookimpl
    def tmpi_after_step(self, session, model, step, samples):
        record = session.recorder.last
        if session is not self.session or record is None:
            return
        if self.log is not None:
            self.log.write(record)
        if self.wants_progress:
            if self.progress is None:  # opened at the first step, after compilation
                self.progress = Progress(planned_steps(model))
            self.progress.update(record)

    @hookimpl
    def tmpi_session_end(self, session, error):
        if session is not self.session:
            return
        session.pm.unregister(self)
        if self.progress is not None:
            self.progress.close()
        if self.log is not None:
            summary = session.recorder.last_summary
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
