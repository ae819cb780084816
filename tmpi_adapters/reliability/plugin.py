"""Reliability: failed and stalled ranks, checkpoints and resume, non-finite values.

A built-in plugin.  Its options (``tmpi wrap --help``, or keyword arguments of
``@tmpi_adapters.distributed``)::

    --checkpoint-dir DIR          write checkpoints there (rank 0)
    --checkpoint-every N[unit]    steps (default unit), epochs, s, min or h
    --checkpoint-keep K           keep the newest K checkpoints of a run
    --resume latest|auto|FILE     continue a run from a checkpoint
    --allow-new-arguments         resume although the script's arguments changed
    --on-stall report|abort       what a stall does after --stall-timeout
    --nonfinite off|stop|skip     NaN/Inf in exchanged gradients or parameters
    --max-restarts K              restart a job whose rank failed, from its checkpoint
    --min-ranks M                 let a restart continue on fewer ranks, at least M
    --preempt-grace S             seconds a preemption waits for the step in flight

With ``--checkpoint-dir`` a SIGTERM or SIGUSR1 writes a checkpoint and ends
the job with status 75 (:mod:`~tmpi_adapters.reliability.preemption`), within
``--preempt-grace`` seconds whatever the ranks do.

The pieces live in :mod:`~tmpi_adapters.reliability.watchdog` (heartbeats and
stall reports), :mod:`~tmpi_adapters.reliability.checkpoint` (checkpoint files,
exact resume by replay) and :mod:`~tmpi_adapters.reliability.nonfinite`;
failed and killed ranks are handled by :mod:`~tmpi_adapters.process.failure`
and :mod:`~tmpi_adapters.launch.watch`, restarts by
:mod:`~tmpi_adapters.launch.restarts`.
"""
import argparse
import dataclasses
import os

from tmpi_adapters.errors import ConfigError
from tmpi_adapters.pluginmanager import hookimpl
from tmpi_adapters.reliability.checkpoint.policy import parse_every

ON_STALL = ("report", "abort")
NONFINITE = ("off", "stop", "skip")


@dataclasses.dataclass
class Settings:
    """The reliability options of one run, parsed and checked."""

    checkpoint_dir: str = None
    checkpoint_every: tuple = None  #: ``(count, unit)``; None for the default policy
    checkpoint_keep: int = 3
    resume: str = None
    allow_new_arguments: bool = False
    on_stall: str = "report"
    #: Off unless asked: the script's own safety nets (Keras's TerminateOnNaN)
    #: act as they do without tmpi.
    nonfinite: str = "off"
    max_restarts: int = 0
    min_ranks: int = None  #: None: every restart runs on the job's ranks
    #: Seconds a preemption waits for the step in flight before the job is
    #: stopped anyway (:data:`~tmpi_adapters.reliability.preemption.GRACE`).
    preempt_grace: float = None

    @classmethod
    def from_extra(cls, extra, ranks=None):
        """Read ``options.extra`` (command-line strings or decorator values);
        ``ranks``, when known, is what ``--min-ranks`` is checked against."""
        extra = extra or {}
        settings = cls(
            checkpoint_dir=_absolute(extra.get("checkpoint_dir")),
            checkpoint_every=(parse_every(extra["checkpoint_every"])
                              if extra.get("checkpoint_every") else None),
            checkpoint_keep=_positive_int("--checkpoint-keep",
                                          extra.get("checkpoint_keep") or 3),
            resume=(extra.get("resume") if extra.get("resume") in ("latest", "auto")
                    else _absolute(extra.get("resume"))),
            allow_new_arguments=bool(extra.get("allow_new_arguments")),
            on_stall=_choice("--on-stall", extra.get("on_stall") or "report", ON_STALL),
            nonfinite=_choice("--nonfinite", extra.get("nonfinite") or "off", NONFINITE),
            max_restarts=_whole("--max-restarts", extra.get("max_restarts") or 0, 0),
            min_ranks=(_whole("--min-ranks", extra["min_ranks"], 1)
                       if extra.get("min_ranks") is not None else None),
            preempt_grace=_seconds("--preempt-grace", extra.get("preempt_grace")),
        )
        if settings.resume in ("latest", "auto") and not settings.checkpoint_dir:
            raise ConfigError("--resume %s needs --checkpoint-dir: the directory to find "
                              "the newest checkpoint in." % settings.resume)
        for flag, key in (("--checkpoint-every", "checkpoint_every"),
                          ("--checkpoint-keep", "checkpoint_keep"),
                          ("--preempt-grace", "preempt_grace")):
            if extra.get(key) and not settings.checkpoint_dir:
                raise ConfigError("%s needs --checkpoint-dir: the directory to write the "
                                  "checkpoints to." % flag)
        settings._check_restarts(ranks)
        return settings

    def _check_restarts(self, ranks):
        if self.max_restarts and not self.checkpoint_dir:
            raise ConfigError(
                "--max-restarts needs --checkpoint-dir: a restart continues the job from its "
                "newest checkpoint there. Add --checkpoint-dir DIR (checkpoints are written "
                "every epoch by default; --checkpoint-every sets how often).")
        if self.min_ranks is not None and not self.max_restarts:
            raise ConfigError("--min-ranks needs --max-restarts K: it says on how few ranks "
                              "a restart may continue when a rank cannot come back.")
        if self.min_ranks is not None and ranks is not None and self.min_ranks > ranks:
            raise ConfigError(
                "--min-ranks %d is more than the %d rank(s) the job starts with (-n %d): a "
                "restart can only continue on fewer ranks than it had. Pass --min-ranks "
                "between 1 and %d." % (self.min_ranks, ranks, ranks, ranks))

    @property
    def checkpointing(self):
        return bool(self.checkpoint_dir)


def _absolute(path):
    """A path option made absolute when the run starts, before the script
    runs: a script that changes its working directory (``os.chdir``) must
    not move the checkpoints elsewhere halfway through."""
    return os.path.abspath(os.path.expanduser(path)) if path else None


def _choice(flag, value, choices):
    if value not in choices:
        raise ConfigError("%s must be one of %s, not %r" % (flag, ", ".join(choices), value))
    return value


def _seconds(flag, value):
    """A number of seconds > 0 (``None``: the default, :data:`GRACE`)."""
    from tmpi_adapters.reliability.preemption import GRACE
    if value is None:
        return GRACE
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = None
    if number is None or not 0 < number < float("inf"):
        raise ConfigError("%s must be a number of seconds > 0, not %r" % (flag, value))
    return number


def _positive_int(flag, value):
    return _whole(flag, value, 1)


def _whole(flag, value, least):
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < least or str(value).strip() != str(number):
        raise ConfigError("%s must be a whole number >= %d, not %r" % (flag, least, value))
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
    group.add_argument("--allow-new-arguments", action="store_true", default=None,
                       help="resume although the script's arguments differ from those of "
                            "the run that wrote the checkpoint (e.g. more --epochs); by "
                            "default that is refused")
    group.add_argument("--max-restarts", metavar="K",
                       type=_argparse_type(lambda v: _whole("--max-restarts", v, 0)),
                       help="when a rank fails (killed, crashed, gone), start the job again "
                            "from its newest checkpoint in --checkpoint-dir, at most K times "
                            "(default 0); the result is the uninterrupted run's")
    group.add_argument("--min-ranks", metavar="M",
                       type=_argparse_type(lambda v: _whole("--min-ranks", v, 1)),
                       help="with --max-restarts: when a restarted job fails again at once "
                            "(a rank cannot come back), continue on one rank fewer, down to "
                            "M ranks (exact under BSP)")
    group.add_argument("--preempt-grace", metavar="S",
                       type=_argparse_type(lambda v: _seconds("--preempt-grace", v)),
                       help="with --checkpoint-dir: after a SIGTERM or SIGUSR1, the seconds "
                            "the step in flight has to end and rank 0 to write its "
                            "checkpoint; then the job is stopped anyway, with status 75 and "
                            "the newest checkpoint on disk named (default 20, inside Slurm's "
                            "30 s KillWait)")
    group.add_argument("--on-stall", choices=ON_STALL,
                       help="when ranks wait longer than --stall-timeout on others: report "
                            "the missing ranks and keep waiting (default), or abort the job")
    group.add_argument("--nonfinite", choices=NONFINITE,
                       help="NaN/Inf in exchanged gradients or parameters: do not check "
                            "(default: the script's own checks, such as Keras's "
                            "TerminateOnNaN, act as without tmpi), stop the job (the last "
                            "good checkpoint stays), or skip the step")


@hookimpl
def tmpi_check_options(options, ranks):
    Settings.from_extra(options.extra, ranks)
    if options.extra.get("max_restarts") and options.scaling == "weak":
        raise ConfigError("--max-restarts needs --scaling strong: a restart resumes from a "
                          "checkpoint, and a weak-scaling run cannot be resumed (its global "
                          "batch depends on the rank count).")


class Reliability:
    """What this plugin keeps for one run, registered with the session's
    plugin manager while the run lasts.

    The pieces that are active register themselves too, each for the hooks
    it needs: the :class:`~tmpi_adapters.reliability.watchdog.Watchdog`
    when heartbeats run (``tmpi_stall``, ``tmpi_after_step``), the
    :class:`~tmpi_adapters.reliability.nonfinite.NonFiniteGuard` unless
    ``--nonfinite off`` (``tmpi_after_exchange``, ``tmpi_after_step``) and
    the :class:`~tmpi_adapters.reliability.checkpoint.checkpointer.Checkpointer`
    with ``--checkpoint-dir`` or ``--resume`` (``tmpi_call``,
    ``tmpi_before_finish``, ``tmpi_after_step``).  All of them are
    unregistered at ``tmpi_session_end``, or at once when starting fails.
    """

    def __init__(self, session, settings):
        self.session, self.settings = session, settings
        #: The pieces; ``None`` until started, or when not active.
        self.control = self.watchdog = self.guard = self.checkpointer = None

    def start(self):
        """Start and register the active pieces; undo it all if one fails
        (the session never learns of a start that failed, so it would never
        end this one)."""
        try:
            self._start()
        except BaseException as error:  # noqa: B902 - undone, then re-raised
            self._end(error)
            raise
        return self

    def _start(self):
        session, settings = self.session, self.settings
        from tmpi_adapters.reliability.watchdog import Watchdog
        heartbeats = session.size > 1 and Watchdog.threads_supported()
        if heartbeats:
            # A communicator of our own: control collectives never match the
            # script's or the rule's by accident.
            self.control = session.comm.Dup()
        session.pm.register(self)
        self.watchdog = Watchdog(session, on_stall=settings.on_stall, heartbeats=heartbeats)
        self.watchdog.start()
        if heartbeats:
            # Without heartbeats nobody could be told of a stall: the
            # exchanger's own StallError (with its advice) is the answer.
            session.pm.register(self.watchdog)
        if settings.nonfinite != "off":
            from tmpi_adapters.reliability.nonfinite import NonFiniteGuard
            self.guard = NonFiniteGuard(session, settings.nonfinite, self)
            session.pm.register(self.guard)
        if settings.checkpointing or settings.resume:
            from tmpi_adapters.reliability.checkpoint.checkpointer import Checkpointer
            self.checkpointer = Checkpointer(session, settings, self.control)
            self.checkpointer.start()
            session.pm.register(self.checkpointer)

    @hookimpl
    def tmpi_session_end(self, session, error):
        if session is self.session:
            self._end(error)

    def _end(self, error):
        """Write the final checkpoint (after success), unregister every piece,
        stop the watchdog (the ranks meet there only when all is well)."""
        pm, failed = self.session.pm, error
        try:
            if self.checkpointer is not None:
                self.checkpointer.end(error)
        except BaseException as exc:  # noqa: B902 - re-raised; only noted here
            failed = exc
            raise
        finally:
            for piece in (self.checkpointer, self.guard, self.watchdog, self):
                if piece is not None and pm.is_registered(piece):
                    pm.unregister(piece)
            if self.watchdog is not None:
                self.watchdog.stop(together=failed is None, leaving=_leaving(error))


def _leaving(error):
    """``(status, where)`` when the script ended this rank with a non-zero
    ``sys.exit`` (the others may still be training), else ``None``."""
    from tmpi_adapters.process.failure import leaves_together
    from tmpi_adapters.reliability.preemption import Preempted
    if isinstance(error, Preempted) and leaves_together():
        # srun's tasks: the others are told, and leave with it.
        return error.code, None
    if not isinstance(error, SystemExit) or isinstance(error, Preempted):
        return None  # a preempted rank 0 ends the job itself
    from tmpi_adapters.process.failure import exit_status
    from tmpi_adapters.reliability.watchdog import where_in_script
    status = exit_status(error.code)
    if not status:
        return None
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return status, where_in_script(tb.tb_frame) if tb is not None else None


@hookimpl
def tmpi_session_start(session):
    Reliability(session, Settings.from_extra(session.options.extra)).start()
