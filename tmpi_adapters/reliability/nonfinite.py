"""NaN and Inf at the exchange: found, named, and then a stop or a skipped step.

Gradient rules (BSP): the exchanged gradients are checked right after the
exchange, inside the compiled training function.  They are identical on every
rank, so every rank takes the same decision without talking.  The check is one
sum per gradient (NaN and Inf survive a sum); only when a sum is not finite is
the gradient searched element by element.

Parameter rules (EASGD, BSP ``mode=avg``): the parameters are checked after
each step's exchange.

``--nonfinite stop`` (default) ends the job naming the step and parameter; no
checkpoint is written after the bad step, so the last one stays good.
``--nonfinite skip`` undoes the step (parameters and optimizer state go back
to what they were before it) and training goes on; ten skipped steps in a row
stop the job.
"""
import copy
import math

import numpy as np

from tmpi_adapters.errors import NonFiniteError
from tmpi_adapters.pluginmanager import hookimpl

#: Consecutive skipped steps after which skipping stops the job.
MAX_CONSECUTIVE_SKIPS = 10


def first_nonfinite(arrays):
    """Indexes of the arrays that hold NaN or Inf (floating arrays only).

    The common case costs one ``sum`` per array and one test: NaN and Inf
    survive a sum.  Only a sum that is not finite (or overflowed on finite
    values) leads to the exact search.
    """
    with np.errstate(over="ignore", invalid="ignore"):  # inf - inf, overflow: expected
        if math.isfinite(abs(sum([a.sum() for a in arrays if a.dtype.kind in "fc"]))):
            return []
    return [i for i, a in enumerate(arrays) if a.dtype.kind in "fc" and
            not np.isfinite(a).all()]


def count_nonfinite(array):
    return int(np.isnan(array).sum()), int(np.isinf(array).sum())


class NonFiniteGuard:
    """Checks exchanged gradients (or parameters) of every step.

    Parameters
    ----------
    session : tmpi_adapters.core.session.Session
    mode : str
        ``"stop"`` or ``"skip"``.
    reliability : tmpi_adapters.reliability.plugin.Reliability
        Gives the last good checkpoint for the message.
    """

    def __init__(self, session, mode, reliability=None):
        self.session = session
        self.mode = mode
        self.reliability = reliability
        self.pending = {}       # model name -> (description, snapshot or None)
        self.skipped = 0
        self.consecutive = 0

    # -- gradient rules: inside the compiled function ------------------------------
    @hookimpl
    def tmpi_after_exchange(self, session, model, gradients, reduced, weight):
        if session is self.session:
            self.observe(model, gradients, reduced, weight)

    @hookimpl
    def tmpi_after_step(self, session, model, step, samples):
        if session is self.session:
            self.after_step(model, step)

    def observe(self, model, grads, reduced, weight):
        bad = first_nonfinite(reduced)
        if not bad:
            return
        names = (model.exchanged_names(len(reduced)) if model is not None
                 else ["gradient #%d" % i for i in range(len(reduced))])
        parts = []
        for i in bad:
            nans, infs = count_nonfinite(reduced[i])
            parts.append("%r has %d NaN and %d Inf of %d values"
                         % (names[i], nans, infs, reduced[i].size))
        local = [i for i in bad if weight and not np.isfinite(np.asarray(grads[i])).all()]
        if self.session.size == 1:
            origin = "computed from this step's batch"
        else:
            # Every rank sees the same exchanged gradients, so every rank is
            # here: one more collective names the ranks whose rows did it.
            from tmpi_adapters.reliability.watchdog import format_ranks
            sources = [r for r, own in enumerate(
                self.session.exchanger.allgather_object(bool(local))) if own]
            origin = ("the gradient of %s's own rows was already non-finite"
                      % format_ranks(sources) if sources else
                      "every rank's own gradient was finite: their sum overflowed")
        text = "non-finite gradient in step %d of %s after the exchange: %s (%s)" % (
            (model.step if model else 0) + 1, model.name if model else "?",
            "; ".join(parts), origin)
        # The updates have not run yet: what the variables hold now is the
        # state before this step, the one a skip returns to.
        snapshot = _snapshot(model.state_variables) if self.mode == "skip" and model else None
        self.pending[model.name if model else None] = (text, snapshot)

    # -- after each step ---------------------------------------------------------------
    def after_step(self, model, step):
        found = self.pending.pop(model.name, None)
        if found is None and self.session.rule.exchanges != "gradients":
            found = self._check_parameters(model, step)
        if found is None:
            self.consecutive = 0
            return
        text, snapshot = found
        if snapshot is None or self.consecutive + 1 >= MAX_CONSECUTIVE_SKIPS:
            if snapshot is not None:
                text += "; %d steps in a row were skipped" % MAX_CONSECUTIVE_SKIPS
            raise NonFiniteError(self._stop_message(text))
        _restore(model.state_variables, snapshot)
        self.skipped += 1
        self.consecutive += 1
        if self.session.rank == 0:
            from tmpi_adapters.process.output import report
            report("tmpi: skipped %s (--nonfinite skip; %d skipped so far)."
                   % (text.replace("non-finite gradient in step", "step", 1)
                      .replace(" after the exchange:", ": non-finite gradient,", 1),
                      self.skipped))

    def _check_parameters(self, model, step):
        values = [np.asarray(v) for v in model.get_params()]
        bad = first_nonfinite(values)
        if not bad:
            return None
        names = model.param_names()
        parts = ["%r has %d NaN and %d Inf of %d values"
                 % ((names[i],) + count_nonfinite(values[i]) + (values[i].size,)) for i in bad]
        # A parameter rule cannot take a step back: stop, whatever the mode.
        return ("non-finite parameters after step %d of %s on rank %d: %s"
                % (step, model.name, self.session.rank, "; ".join(parts)), None)

    def _stop_message(self, text):
        checkpointer = self.reliability.checkpointer if self.reliability else None
        last = checkpointer and (checkpointer.last_written or checkpointer.resumed_from)
        advice = ("Lower the learning rate, check the data for NaN/Inf, or pass "
                  "--nonfinite skip to skip such steps.")
        if last:
            advice += " The last good checkpoint is %s (--resume it)." % last
        return "%s. %s" % (text, advice)


def _snapshot(variables):
    return [copy.deepcopy(v.get_value(borrow=True, return_internal_type=True))
            for v in variables]


def _restore(variables, values):
    for variable, value in zip(variables, values):
        variable.set_value(value, borrow=True)
