"""When a checkpoint falls due: ``--checkpoint-every`` and the default policy.

``--checkpoint-every`` counts training steps, epochs or seconds
(:func:`parse_every`).  Without it a checkpoint falls due at the end of every
epoch, but not more often than :data:`DEFAULT_MIN_GAP` seconds, and at least
every :data:`DEFAULT_MAX_GAP` seconds (for scripts whose epochs tmpi cannot
see).

An epoch ends where the adapter says (``ModelProtocol.n_batch_train`` steps),
or, for a plain Theano script, where the script leaves its training loop to
call another compiled function (the validation pass).
"""
import re
import time

from tmpi_adapters.errors import ConfigError

#: ``--checkpoint-every`` units and what one of them is (steps, epochs, seconds).
_UNITS = {"": "steps", "step": "steps", "steps": "steps", "epoch": "epochs",
          "epochs": "epochs", "s": "seconds", "sec": "seconds", "min": "seconds",
          "h": "seconds"}
_SECONDS = {"s": 1, "sec": 1, "min": 60, "h": 3600}

#: Without ``--checkpoint-every``: at the end of every epoch, but not more
#: often than :data:`DEFAULT_MIN_GAP` seconds, and at least every
#: :data:`DEFAULT_MAX_GAP` seconds (for scripts whose epochs tmpi cannot see).
DEFAULT_MIN_GAP = 60.0
DEFAULT_MAX_GAP = 1800.0


def parse_every(text):
    """``"500"``/``"500steps"`` -> ``(500, "steps")``; ``"2epochs"`` -> ``(2, "epochs")``;
    ``"10min"`` -> ``(600, "seconds")``.  Raises :class:`ConfigError` otherwise."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in _UNITS:
        raise ConfigError("--checkpoint-every must be a number of steps, epochs or time "
                          "(e.g. 500, 500steps, 2epochs, 30min, 1h), not %r" % (text,))
    number, unit = float(match.group(1)), match.group(2)
    kind = _UNITS[unit]
    if kind == "seconds":
        number *= _SECONDS[unit]
    elif number != int(number):
        raise ConfigError("--checkpoint-every %s: a number of %s must be whole" % (text, kind))
    if number <= 0:
        raise ConfigError("--checkpoint-every must be positive, not %r" % (text,))
    return (number if kind == "seconds" else int(number)), kind


class Policy:
    """Counts where the run is and says when the next checkpoint is due.

    Parameters
    ----------
    every : tuple or None
        ``(count, unit)`` from :func:`parse_every`; ``None`` for the default
        policy.

    Attributes
    ----------
    calls, train_calls, epochs : int
        Calls of compiled functions, training steps among them, and epochs
        ended so far: the point a checkpoint is taken at.
    due : bool
        A checkpoint is due at the start of the next call.
    """

    def __init__(self, every=None):
        if every is None:
            self.every, self.unit = 1, "epochs"
            self.min_gap, self.max_gap = DEFAULT_MIN_GAP, DEFAULT_MAX_GAP
        else:
            self.every, self.unit = every
            self.min_gap, self.max_gap = 0.0, None
        self.calls = 0
        self.train_calls = 0
        self.epochs = 0
        self.due = False
        self._wrote = False
        self._last_kind = None
        self._last_time = time.monotonic()

    def before_call(self, kind):
        """A call of ``kind`` (``"train"`` or ``"other"``) starts."""
        if kind != "train" and self._last_kind == "train":
            # The script left its training loop (to validate): an epoch ended.
            self.epochs += 1
            if self.unit == "epochs" and self.epochs % self.every == 0:
                self._make_due()
        self._last_kind = kind

    def after_call(self, kind):
        """A call of ``kind`` returned."""
        self.calls += 1
        if kind == "train":
            self.train_calls += 1
            if self.unit == "steps" and self.train_calls % self.every == 0:
                self._make_due()
        since = time.monotonic() - self._last_time
        if self.unit == "seconds" and since >= self.every or \
                self.max_gap is not None and since >= self.max_gap:
            self.due = True

    def after_step(self, step, per_epoch):
        """Training step ``step`` of a model with ``per_epoch`` steps an epoch
        (``None`` when its adapter does not know) has ended."""
        if per_epoch and self.unit == "epochs" and step % per_epoch == 0 and \
                (step // per_epoch) % self.every == 0:
            self._make_due()

    def _make_due(self):
        # The default policy writes at most every min_gap seconds after the first.
        if not self._wrote or time.monotonic() - self._last_time >= self.min_gap:
            self.due = True

    def written(self):
        """A checkpoint was written: the gaps count from now."""
        self._wrote = True
        self.restart()

    def restart(self):
        """Nothing is due, and the gaps count from now (after a write or a replay)."""
        self.due = False
        self._last_time = time.monotonic()
