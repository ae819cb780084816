"""Run options shared by the command line, the decorator and every rank, and
typed knobs for rules (``--rule-option alpha=0.5``).

Each option is declared once, as a field of :class:`Options` with its flag,
help, choices and check: ``tmpi wrap --help`` is built from these fields, and
:meth:`Options.validate` checks a decorator's keyword arguments against the
same declarations.
"""
from __future__ import annotations

import dataclasses
import math
import json
import os
from typing import TYPE_CHECKING, Any

from tmpi_adapters.errors import ConfigError

if TYPE_CHECKING:
    from argparse import _ActionsContainer  # an ArgumentParser or an argument group
    from collections.abc import Callable, Iterable, Mapping

OPTIONS_ENV = "TMPI_OPTIONS"

SCALINGS = ("strong", "weak")
BINDINGS = ("cores", "none")
COMPILE_DIRS = ("shared", "per-rank")
OUTPUTS = ("averaged", "local")
LOSS_REDUCTIONS = ("mean", "sum")
BATCH_STATS = ("global", "local")


#: Transfer precisions of exchanged buffers (``--precision``).
PRECISIONS = ("native", "fp32", "fp16", "bf16")


def check_precision(precision: str | None) -> str:
    """``precision`` as one of :data:`PRECISIONS` (``None``: native)."""
    precision = "native" if precision in (None, "") else str(precision).lower()
    if precision not in PRECISIONS:
        raise ConfigError("unknown transfer precision %r; choose one of %s"
                          % (precision, ", ".join(PRECISIONS)))
    return precision


def check_timeout(seconds: float | str | None, what: str = "--stall-timeout",
                  allow_none: bool = True) -> float | None:
    """``seconds`` as a positive finite float (``None`` passes when allowed);
    :class:`~tmpi_adapters.errors.ConfigError` otherwise."""
    if seconds is None and allow_none:
        return None
    try:
        value = float(seconds) if seconds is not None else math.nan
    except (TypeError, ValueError):
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError("%s must be a positive, finite number of seconds, not %r"
                          % (what, seconds))
    return value


def _positive_or_none(flag: str) -> Callable[[int | None], int | None]:
    def check(value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ConfigError("%s must be positive, not %r" % (flag, value))
        return value
    return check


def _non_negative(flag: str) -> Callable[[int], int]:
    def check(value: int) -> int:
        if value < 0:
            raise ConfigError("%s must be >= 0, not %r" % (flag, value))
        return value
    return check


def _stall_timeout(value: float | str) -> float | None:
    return check_timeout(value, "--stall-timeout", allow_none=False)


def _start_timeout(value: float | str) -> float | None:
    return check_timeout(value, "--start-timeout", allow_none=False)


def _bytes_or_none(text: str) -> int | None:
    if text in (None, "", "none"):
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError("--bucket-bytes must be a whole number of bytes or none, not %r"
                          % (text,)) from None


def option(default: object, help: str, choices: tuple[str, ...] | None = None,
           type: Callable[[str], object] | None = None,
           check: Callable[[Any], object] | None = None, flag: str | None = None,
           metavar: str | None = None, negate: str | None = None) -> Any:
    """A field of :class:`Options` and the ``tmpi wrap`` option that sets it.

    Parameters
    ----------
    default
        What users get without the option.
    help
        One line for ``--help``.
    choices
        The values allowed (checked by :meth:`Options.validate` too).
    type
        Converts the command line's text.
    check
        ``check(value) -> value``, raising :class:`ConfigError` for a bad one.
    flag
        The flag, when it is not the field's name spelt with dashes.
    negate
        For a boolean that defaults to True: the flag that turns it off.

    Typed ``Any``, as :func:`dataclasses.field` is: the field keeps the type
    it is declared with.
    """
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": choices, "type": type, "check": check, "flag": flag,
        "metavar": metavar, "negate": negate})


@dataclasses.dataclass
class Options:
    """Everything that shapes a distributed run; defaults are what users get.

    Every field but ``rule_options`` and ``extra`` has a ``tmpi wrap`` flag
    (the field's name with ``-`` for ``_``, unless said otherwise).
    """

    framework: str | None = option(None, "theano, keras, lasagne, blocks, theanompi "
                                         "(default: detected from the script's imports)")
    rule: str = option("bsp", "synchronisation rule (default bsp)")
    exchanger: str | None = option(None, "mpi (default), or another installed exchanger")
    precision: str | None = option(None, "transfer precision of exchanged buffers (default "
                                         "native)", choices=PRECISIONS, check=check_precision)
    bucket_bytes: int | None = option(None, "largest fused buffer per collective (default: "
                                            "one per dtype)", type=_bytes_or_none,
                                      check=_positive_or_none("--bucket-bytes"))
    overlap: bool = option(False, "exchange gradients in parts of --bucket-bytes (default "
                                  "4 MiB), each started as soon as backpropagation has "
                                  "computed it, overlapping the rest of the step (for "
                                  "networks; bsp)")
    scaling: str = option("strong", "strong: split each batch across ranks (exact, default); "
                                    "weak: each rank trains on whole batches", choices=SCALINGS)
    lr_scaling: bool = option(False, "weak scaling: scale the gradient (SGD's learning rate) "
                                     "by N")
    warmup_steps: int = option(0, "weak scaling: reach the full --lr-scaling over this many "
                                  "steps", type=int, check=_non_negative("--warmup-steps"))
    loss_reduction: str = option("mean", "how the script's loss reduces over a batch "
                                         "(default mean); read only where tmpi does not read "
                                         "the step's graph itself (--scaling weak, rules that "
                                         "exchange parameters)", choices=LOSS_REDUCTIONS)
    batch_stats: str = option("global", "batch statistics (a BatchNorm's mean and variance, "
                                        "any value the step reduces over the batch's rows "
                                        "and reads again): over the whole batch, as one "
                                        "process computes them (default), or each rank's "
                                        "own, for speed, results then differing from one "
                                        "process's", choices=BATCH_STATS)
    outputs: str = option("averaged", "what a training step returns (loss, accuracy): "
                                      "averaged over ranks after every step (default), or "
                                      "each rank's own, so that asynchronous rules' ranks "
                                      "never meet per step", choices=OUTPUTS)
    seed: int | None = option(None, "seed numpy and random alike on every rank", type=int)
    stall_timeout: float = option(300.0, "seconds a rank may wait on the others before a "
                                         "stall is reported (default 300)",
                                  type=_stall_timeout, check=_stall_timeout)
    start_timeout: float = option(600.0, "seconds every rank has to start and import Theano "
                                         "before the job is ended (default 600)",
                                  type=_start_timeout, check=_start_timeout)
    all_ranks_output: bool = option(False, "show every rank's output, prefixed [rank N]")
    compile_dirs: str = option("shared", "Theano compile cache: shared by the ranks, which "
                                         "compile at once (default), or one per rank",
                               choices=COMPILE_DIRS)
    bind: str = option("cores", "each rank on cores of its own (default; an enclosing job's "
                                "binding is kept), or none: the kernel places the ranks",
                       choices=BINDINGS)
    summary: bool = option(True, "print the per-step time split at the end",
                           negate="--no-summary")
    #: raw ``name=value`` knobs of the rule (``--rule-option``)
    rule_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: options plugins added with ``tmpi_add_arguments``, by ``dest``
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: the fields and plugin options the command line named (they win over a
    #: decorator's; the others are defaults)
    explicit: list[str] = dataclasses.field(default_factory=list)

    def validate(self) -> Options:
        """Check every field against its declaration; returns ``self``."""
        for field in declared_fields():
            meta, value = field.metadata, getattr(self, field.name)
            if meta["choices"] and value is not None and meta["check"] is None \
                    and value not in meta["choices"]:
                raise ConfigError("%s must be one of %s, not %r" % (
                    flag_of(field), ", ".join(meta["choices"]), value))
            if meta["check"] is not None:
                setattr(self, field.name, meta["check"](value))
        return self

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Options:
        env = os.environ if env is None else env
        raw = env.get(OPTIONS_ENV)
        if not raw:
            return cls()
        return cls(**json.loads(raw))

    def replace(self, **changes: Any) -> Options:
        return dataclasses.replace(self, **changes)


def declared_fields() -> list[dataclasses.Field[Any]]:
    """The fields of :class:`Options` that have a command-line flag."""
    return [f for f in dataclasses.fields(Options) if "help" in f.metadata]


def flag_of(field: dataclasses.Field[Any]) -> str:
    """The command-line flag of a declared field."""
    return field.metadata["flag"] or "--" + field.name.replace("_", "-")


def add_option_arguments(group: _ActionsContainer) -> None:
    """Add a flag for every declared field of :class:`Options` to ``group``
    (an ``argparse`` parser or argument group); defaults are the fields'."""
    for field in declared_fields():
        meta = field.metadata
        if meta["negate"]:
            group.add_argument(meta["negate"], dest=field.name, action="store_false",
                               help="do not " + meta["help"])
        elif field.type is bool or field.type == "bool":
            group.add_argument(flag_of(field), dest=field.name, action="store_true",
                               help=meta["help"])
        else:
            group.add_argument(flag_of(field), dest=field.name, default=field.default,
                               type=meta["type"], choices=meta["choices"],
                               metavar=meta["metavar"], help=meta["help"])


# ----------------------------------------------------------- rule knobs

@dataclasses.dataclass
class Knob:
    """One tunable of a rule, as declared in ``Rule.knobs``.

    Parameters
    ----------
    type
        Converts the user's text (``"0.5"``) to a value.
    default
        Used when the user gives none; may be a callable ``default(size)`` of
        the rank count (EASGD's alpha = 0.9 / N).
    help
        One line, shown by ``tmpi plugins`` and in errors.
    check
        ``check(value)``: an error text for a bad value, ``None`` for a good one.
    only_with
        ``(knob, value)``: this knob does something only when that other knob
        has that value (BSP's ``period`` with ``mode=avg``); giving it
        otherwise is an error, not silently ignored.
    """

    type: Callable[[Any], object]
    default: object
    help: str
    check: Callable[[Any], str | None] | None = None
    only_with: tuple[str, object] | None = None


def positive(value: float) -> str | None:
    return None if value > 0 else "must be > 0"


def non_negative(value: float) -> str | None:
    return None if value >= 0 else "must be >= 0"


def probability(value: float) -> str | None:
    return None if 0 <= value <= 1 else "must be in [0, 1]"


def one_of(*choices: object) -> Callable[[object], str | None]:
    def check(value: object) -> str | None:
        return None if value in choices else "must be one of %s" % ", ".join(map(str, choices))
    return check


def parse_bool(text: object) -> bool:
    """``True``/``False`` from their spellings (true/false, yes/no, on/off,
    1/0); anything else is a ``ValueError``."""
    if isinstance(text, bool):
        return text
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("not a boolean: %r" % (text,))



def resolve_knobs(rule_name: str | None, knobs: Mapping[str, Knob],
                  raw: Mapping[str, object], size: int) -> dict[str, Any]:
    """Typed, checked values for every knob of a rule.

    ``raw`` maps names to user text (or already-typed values from Python).
    Unknown names and bad values raise :class:`ConfigError` naming the knob.
    """
    unknown = sorted(set(raw) - set(knobs))
    if unknown:
        known = ", ".join("%s (%s)" % (k, knobs[k].help) for k in sorted(knobs)) or "none"
        raise ConfigError("rule %r has no option %s. Its options: %s."
                          % (rule_name, ", ".join(repr(u) for u in unknown), known))
    values = {}
    for name, knob in knobs.items():
        given = name in raw and raw[name] is not None
        if given:
            # bool("false") is True: a boolean knob reads true/false spellings only.
            convert = parse_bool if knob.type is bool else knob.type
            try:
                value = convert(raw[name])
            except (TypeError, ValueError):
                raise ConfigError("rule %r option %s=%r is not a valid %s (%s)"
                                  % (rule_name, name, raw[name],
                                     getattr(knob.type, "__name__", "value"), knob.help))
        else:
            value = knob_default(knob, size)
        if knob.check is not None and value is not None:
            problem = knob.check(value)
            if problem and not given:
                raise ConfigError(
                    "the default %s=%r of rule %r %s (%s) on %d rank(s): a fault of the "
                    "plugin that provides the rule, not of your options. Pass --rule-option "
                    "%s=VALUE, and tell the plugin's authors." % (
                        name, value, rule_name, problem, knob.help, size, name))
            if problem:
                raise ConfigError("rule %r option %s=%r %s (%s)"
                                  % (rule_name, name, value, problem, knob.help))
        values[name] = value
    for name, knob in knobs.items():
        if knob.only_with and name in raw and raw[name] is not None:
            other, wanted = knob.only_with
            if values.get(other) != wanted:
                raise ConfigError(
                    "rule %r option %s=%s does nothing unless %s=%s (here %s=%s): add "
                    "--rule-option %s=%s, or leave %s out." % (
                        rule_name, name, raw[name], other, wanted, other, values.get(other),
                        other, wanted, name))
    return values


def knob_default(knob: Knob, size: int) -> object:
    """A knob's default on ``size`` ranks (it may depend on them: EASGD's alpha)."""
    return knob.default(size) if callable(knob.default) else knob.default


def parse_assignments(items: Iterable[str] | None) -> dict[str, str]:
    """``["alpha=0.5", "tau=4"]`` -> ``{"alpha": "0.5", "tau": "4"}``."""
    result = {}
    for item in items or ():
        if "=" not in item:
            raise ConfigError("rule option %r must look like name=value (e.g. "
                              "--rule-option tau=4)" % item)
        key, value = item.split("=", 1)
        result[key.strip().replace("-", "_")] = value.strip()
    return result
