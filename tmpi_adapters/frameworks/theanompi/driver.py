"""The training loop ``tmpi run`` drives a Theano-MPI ModelClass with, on every rank.

Runs as the script of a tmpi session whose framework adapter is ``theanompi``:
construct the model (with Theano-MPI's config dict when it takes one), let it
compile its functions, then epochs of ``train_iter``/``val_iter`` with the
validation results averaged over ranks and printed once.
"""
import argparse
import importlib
import os
import sys
import time

import numpy as np

# Run as a script, this file's folder leads sys.path; the user's model
# modules must not find tmpi's own modules under their plain names.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]


class Recorder:
    """The recorder Theano-MPI passes to ``train_iter``/``val_iter``.

    Models call ``start()``/``end(kind)`` around their work and report
    ``train_error(count, cost, error)`` and ``val_error(count, cost, error,
    error_top5)``; validation values are averaged over every rank's calls.
    """

    def __init__(self, session, verbose):
        self.session = session
        self.verbose = verbose
        self.train = []
        self.val = []
        self.times = {}
        self._start = None
        self.latest_val = None

    # timing --------------------------------------------------------------------
    def start(self):
        self._start = time.perf_counter()

    def end(self, kind="calc"):
        if self._start is not None:
            self.times[kind] = self.times.get(kind, 0.0) + time.perf_counter() - self._start
            self._start = None

    def start_epoch(self):
        self.times = {}

    def end_epoch(self, count=None, epoch=None):
        pass

    # values --------------------------------------------------------------------
    def train_error(self, count, cost, error, *more):
        self.train.append([float(cost), float(error)])

    def val_error(self, count, cost, error, error_top5=None, *more):
        top5 = np.nan if error_top5 is None else float(error_top5)
        self.val.append([float(cost), float(error), top5])

    def print_train_info(self, count=None):
        pass

    def clear_train_info(self):
        self.train = []

    def gather_val_info(self):
        """Average this epoch's validation values over all ranks' calls."""
        local = np.asarray(self.val, dtype=np.float64).reshape(-1, 3)
        top5 = local[:, 2][np.isfinite(local[:, 2])]
        sums = np.array([local[:, 0].sum(), local[:, 1].sum(), len(local), top5.sum(),
                         len(top5)])
        total = self.session.exchanger.allreduce([sums], op="sum")[0]
        self.val = []
        if total[2] == 0:
            self.latest_val = None
            return None
        self.latest_val = {"cost": total[0] / total[2], "error": total[1] / total[2],
                           "error_top5": total[3] / total[4] if total[4] else None}
        return self.latest_val

    def get_latest_val_info(self):
        return self.latest_val

    def train_summary(self):
        local = np.asarray(self.train, dtype=np.float64).reshape(-1, 2)
        sums = np.concatenate([local.sum(axis=0), [len(local)]])
        total = self.session.exchanger.allreduce([sums], op="sum")[0]
        self.train = []
        return None if total[-1] == 0 else (total[0] / total[-1], total[1] / total[-1])


def call_with_optional(method, *args):
    """Call a ModelClass method with as many of ``args`` as it accepts."""
    from tmpi_adapters.frameworks.theanompi.adapter import positional_arity
    return method(*args[:positional_arity(method)])


def build_model(modelfile, modelclass, session):
    from tmpi_adapters.errors import ConfigError
    from tmpi_adapters.frameworks.theanompi.adapter import positional_arity
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(modelfile)
    except ModuleNotFoundError as exc:
        raise ConfigError("cannot import modelfile %r (%s); give it as a module path "
                          "relative to the working directory, e.g. models.mymodel."
                          % (modelfile, exc))
    cls = getattr(module, modelclass, None)
    if cls is None:
        raise ConfigError("module %r has no class %r" % (modelfile, modelclass))
    config = {"verbose": session.rank == 0, "rank": session.rank, "size": session.size,
              "mname": modelclass}
    return cls(config) if positional_arity(cls) >= 1 else cls()


def agreed_min(session, value):
    return int(min(session.exchanger.allgather_object(int(value))))


def main(argv=None):
    parser = argparse.ArgumentParser(prog="tmpi run (driver)")
    parser.add_argument("--modelfile", required=True)
    parser.add_argument("--modelclass", required=True)
    parser.add_argument("--epochs", type=int, default=None)
    args = parser.parse_args(argv)

    from tmpi_adapters.core.session import current_session
    from tmpi_adapters.errors import ConfigError
    from tmpi_adapters.frameworks.theanompi.adapter import (TheanoMPIAdapter, accepts_keyword,
                                                            check_contract)
    session = current_session()
    if not isinstance(session.adapter, TheanoMPIAdapter):
        raise ConfigError("the Theano-MPI driver needs --framework theanompi")
    model = build_model(args.modelfile, args.modelclass, session)
    check_contract(model)
    sync_type = "avg" if getattr(session.rule, "mode", "grad") == "avg" else "cdd"
    if accepts_keyword(model.compile_iter_fns, "sync_type"):
        model.compile_iter_fns(sync_type=sync_type)
    else:
        model.compile_iter_fns()
    n_epochs = args.epochs or getattr(model, "n_epochs", None)
    if not n_epochs:
        raise ConfigError("%s has no n_epochs attribute; pass --epochs to tmpi run."
                          % args.modelclass)
    n_subb = int(getattr(model, "n_subb", 1) or 1)
    protocol = session.adapter.protocol_for(
        model, n_batch_train=agreed_min(session, model.data.n_batch_train) * n_subb,
        n_epochs=n_epochs)
    recorder = Recorder(session, verbose=session.rank == 0)
    session.print("tmpi run: %s from %s, %d epochs, %d rank(s), rule %s, %d parameters"
                  % (args.modelclass, args.modelfile, n_epochs, session.size,
                     session.options.rule, len(protocol.params)))
    for epoch in range(n_epochs):
        model.epoch = epoch
        recorder.start_epoch()
        start = time.time()
        # Every rank must take the same number of steps: the shortest shard rules.
        n_train = agreed_min(session, model.data.n_batch_train)
        for count in range(n_train):
            for _ in range(n_subb):
                result = call_with_optional(model.train_iter, count, recorder)
                if isinstance(result, (tuple, list)) and len(result) >= 2:
                    recorder.train_error(count, result[0], result[1])
        if hasattr(model, "reset_iter"):
            model.reset_iter("train")
        train = recorder.train_summary()
        stop = False
        for count in range(model.data.n_batch_val):
            out = None
            for _ in range(n_subb):
                out = call_with_optional(model.val_iter, count, recorder)
                if isinstance(out, (tuple, list)) and len(out) >= 2:
                    recorder.val_error(count, *out[:3])
            if isinstance(out, str) and out == "stop":
                stop = True
                break
        if hasattr(model, "reset_iter"):
            model.reset_iter("val")
        val = recorder.gather_val_info()
        model.current_info = val
        line = "epoch %d/%d" % (epoch + 1, n_epochs)
        if train:
            line += "  train cost %.4f error %.4f" % train
        if val:
            line += "  val cost %.4f error %.4f" % (val["cost"], val["error"])
            if val["error_top5"] is not None:
                line += " top5 %.4f" % val["error_top5"]
        session.print(line + "  (%.2f s)" % (time.time() - start))
        call_with_optional(model.adjust_hyperp, epoch)
        if hasattr(model, "print_info"):
            try:
                call_with_optional(model.print_info, recorder, session.rank == 0)
            except TypeError:
                pass
        stop = any(session.exchanger.allgather_object(stop))
        if stop:
            session.print("tmpi run: the model asked to stop after epoch %d" % (epoch + 1))
            break
    if val:
        session.print("final val_cost %.17g val_error %.17g" % (val["cost"], val["error"]))
    model.cleanup()


if __name__ == "__main__":
    main()
