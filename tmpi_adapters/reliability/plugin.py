"""Reliability: failed and stalled ranks, checkpoints and resume, non-finite values.

A built-in plugin.  Its options (``tmpi wrap --help``, or keyword arguments of
``@tmpi_adapters.distributed``)::

    --checkpoint-dir DIR          write checkpoints there (rank 0)
    --checkpoint-every N[unit]    steps (default unit), epochs, s, min or h
    --checkpoint-keep K           keep the newest K checkpoints of a run
    --resume latest|auto|FILE     continue a run from a checkpoint
    --on-stall report|abort       what a stall does after --stall-timeout
    --nonfinite stop|skip|off     NaN/Inf in exchanged gradients or parameters

The pieces live in :mod:`~tmpi_adapters.reliability.watchdog` (heartbeats and stall
reports), :mod:`~tmpi_adapters.reliability.checkpoint.checkpointer` (checkpoint files, exact resume by
replay) and :mod:`~tmpi_adapters.reliability.nonfinite`; failed and killed ranks are
handled by :mod:`~tmpi_adapters.launch.runtime` and :mod:`~tmpi_adapters.launch.launcher`.
"""
import argparse
import dataclasses
import re

from tmpi_adapters.errors import ConfigError
from tmpi_adapters.pluginmanager import hookimpl

ON_STALL = ("report", "abort")
NONFINITE = ("stop", "skip", "off")

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


@dataclasses.dataclass
class Settings:
    """The reliability options of one run, parsed and checked."""

    checkpoint_dir: str = None
    checkpoint_every: tuple = None  #: ``(count, unit)``; None for the default policy
    checkpoint_keep: int = 3
    resume: str = None
    on_stall: str = "report"
    nonfinite: str = "stop"

    @classmethod
    def from_extra(cls, extra):
        """Read ``options.extra`` (command-line strings or decorator values)."""
        extra = extra or {}
        settings = cls(
            checkpoint_dir=extra.get("checkpoint_dir") or None,
            checkpoint_every=(parse_every(extra["checkpoint_every"])
                              if extra.get("checkpoint_every") else None),
            checkpoint_keep=_positive_int("--checkpoint-keep",
                                          extra.get("checkpoint_keep") or 3),
            resume=extra.get("resume") or None,
            on_stall=_choice("--on-stall", extra.get("on_stall") or "report", ON_STALL),
            nonfinite=_choice("--nonfinite", extra.get("nonfinite") or "stop", NONFINITE),
        )
        if settings.resume in ("latest", "auto") and not settings.checkpoint_dir:
            raise ConfigError("--resume %s needs --checkpoint-dir: the directory to find "
                              "the newest checkpoint in." % settings.resume)
        return settings

    @property
    def checkpointing(self):
        return bool(self.checkpoint_dir)


def _choice(flag, value, choices):
    if value not in choices:
        raise ConfigError("%s must be one of %s, not %r" % (flag, ", ".join(choices), value))
    return value


def _positive_int(flag, value):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < 1 or str(value).strip() != str(number):
        raise ConfigError("%s must be a whole number >= 1, not %r" % (flag, value))
    return number


def _argparse_type(check):
    """An argparse ``type`` that validates with ``check`` and keeps the text."""
    def convert(text):
        try:
            check(text)
        except ConfigError as error:
            raise argparse.ArgumentTypeError(str(error))
        return text
    convert.__name__ = getattr(check, "__name__", "value")
    return convert


# ------------------------------------------------------------------- hooks

@hookimpl
def tmpi_add_arguments(parser):
    group = parser  # the CLI's "plugins" argument group
    group.add_argument("--checkpoint-dir", metavar="DIR",
                       help="write checkpoints to DIR (rank 0): atomically, every "
                            "--checkpoint-every and when the script ends")
    group.add_argument("--checkpoint-every", metavar="N[UNIT]",
                       type=_argparse_type(parse_every),
                       help="checkpoint every N steps (default unit), Nepochs, or a time "
                            "(30s, 10min, 1h); default: every epoch, at most once a "
                            "minute and at least every 30 minutes")
    group.add_argument("--checkpoint-keep", metavar="K",
                       type=_argparse_type(lambda v: _positive_int("--checkpoint-keep", v)),
                       help="keep the newest K checkpoints of this run (default 3)")
    group.add_argument("--resume", metavar="latest|auto|FILE",
                       help="continue from a checkpoint: the newest in --checkpoint-dir "
                            "(latest), the newest if there is one (auto), or FILE; the "
                            "script runs again from its start and its first training calls "
                            "are replayed, so the result equals an uninterrupted run")
    group.add_argument("--on-stall", choices=ON_STALL,
                       help="when ranks wait longer than --stall-timeout on others: report "
                            "the missing ranks and keep waiting (default), or abort the job")
    group.add_argument("--nonfinite", choices=NONFINITE,
                       help="NaN/Inf in exchanged gradients or parameters: stop the job "
                            "(default; the last good checkpoint stays), skip the step, or "
                            "do not check")


class Reliability:
    """What this plugin keeps for one run, registered with the session's
    plugin manager while the run lasts.

    The pieces that are active register themselves too, each for the hooks
    it needs: the :class:`~tmpi_adapters.reliability.watchdog.Watchdog`
    (``tmpi_stall``, ``tmpi_after_step``), the
    :class:`~tmpi_adapters.reliability.nonfinite.NonFiniteGuard`
    (``tmpi_after_exchange``, ``tmpi_after_step``) and the
    :class:`~tmpi_adapters.reliability.checkpoint.checkpointer.Checkpointer`
    (``tmpi_call``, ``tmpi_before_finish``, ``tmpi_after_step``).
    """

    def __init__(self, session, settings):
        self.session = session
        self.settings = settings
        self.control = None
        self.watchdog = None
        self.checkpointer = None
        self.guard = None

    def start(self):
        session = self.session
        from tmpi_adapters.reliability.watchdog import Watchdog
        heartbeats = session.size > 1 and Watchdog.threads_supported()
        if heartbeats:
            # A communicator of our own: control collectives never match the
            # script's or the rule's by accident.
            self.control = session.comm.Dup()
        session.pm.register(self)
        self.watchdog = Watchdog(session, on_stall=self.settings.on_stall,
                                 heartbeats=heartbeats).start()
        session.pm.register(self.watchdog)
        if self.settings.nonfinite != "off":
            from tmpi_adapters.reliability.nonfinite import NonFiniteGuard
            self.guard = NonFiniteGuard(session, self.settings.nonfinite, self)
            session.pm.register(self.guard)
        if self.settings.checkpointing or self.settings.resume:
            from tmpi_adapters.reliability.checkpoint.checkpointer import Checkpointer
            self.checkpointer = Checkpointer(session, self.settings, self.control).start()
            session.pm.register(self.checkpointer)

    @hookimpl(trylast=True)
    def tmpi_before_finish(self, session):
        """Every rank reaches the end of the script before the end-of-run exchanges.

        Under a gradient rule every step is a collective, so a rank that runs
        out of batches early would otherwise pair its end-of-run exchanges
        with the others' gradient exchange; here it waits on a communicator
        of its own, and a stall names who is still training.  (Parameter
        rules, asynchronous ones above all, drain their messages in
        ``finish``: a barrier before it could starve them.)
        """
        if session is not self.session or self.control is None:
            return
        if session.rule.exchanges != "gradients":
            return
        self.watchdog.phase = "finishing"
        self.watchdog.wait(self.control.Ibarrier(), "the end of the script (barrier)")

    @hookimpl
    def tmpi_session_end(self, session, error):
        if session is not self.session:
            return
        failed = error
        try:
            if self.checkpointer is not None:
                self.checkpointer.end(error)
        except BaseException as exc:  # noqa: B902 - re-raised; only noted here
            failed = exc
            raise
        finally:
            for piece in (self.checkpointer, self.guard, self.watchdog, self):
                if piece is not None and session.pm.is_registered(piece):
                    session.pm.unregister(piece)
            if self.watchdog is not None:
                self.watchdog.stop(together=failed is None)


@hookimpl
def tmpi_session_start(session):
    Reliability(session, Settings.from_extra(session.options.extra)).start()
