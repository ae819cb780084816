"""Run options shared by the command line, the decorator and every rank, and
typed knobs for rules (``--rule-option alpha=0.5``).

Each option is declared once, as a field of :class:`Options` with its flag,
help, choices and check: ``tmpi wrap --help`` is built from these fields, and
:meth:`Options.validate` checks a decorator's keyword arguments against the
same declarations.
"""
import dataclasses
import math
import json
import os

from tmpi_adapters.errors import ConfigError

OPTIONS_ENV = "TMPI_OPTIONS"

SCALINGS = ("strong", "weak")
COMPILE_DIRS = ("shared", "per-rank")
OUTPUTS = ("averaged", "local")
LOSS_REDUCTIONS = ("mean", "sum")


#: Transfer precisions of exchanged buffers (``--precision``).
PRECISIONS = ("native", "fp32", "fp16", "bf16")


def check_precision(precision):
    """``precision`` as one of :data:`PRECISIONS` (``None``: native)."""
    precision = "native" if precision in (None, "") else str(precision).lower()
    if precision not in PRECISIONS:
        raise ConfigError("unknown transfer precision %r; choose one of %s"
                          % (precision, ", ".join(PRECISIONS)))
    return precision


def check_timeout(seconds, what="--stall-timeout", allow_none=True):
    """``seconds`` as a positive finite float (``None`` passes when allowed);
    :class:`~tmpi_adapters.errors.ConfigError` otherwise."""
    if seconds is None and allow_none:
        return None
    try:
        value = float(seconds)
    except (TypeError, ValueError):
        value = float("nan")
    if not (math.isfinite(value) and value > 0):
        raise ConfigError("%s must be a positive, finite number of seconds, not %r"
                          % (what, seconds))
    return value


def _positive_or_none(flag):
    def check(value):
        if value is not None and value <= 0:
            raise ConfigError("%s must be positive, not %r" % (flag, value))
        return value
    return check


def _non_negative(flag):
    def check(value):
        if value < 0:
            raise ConfigError("%s must be >= 0, not %r" % (flag, value))
        return value
    return check


def _stall_timeout(value):
    return check_timeout(value, "--stall-timeout", allow_none=False)


def _bytes_or_none(text):
    return None if text in (None, "", "none") else int(text)


def option(default, help, choices=None, type=None, check=None, flag=None, metavar=None,
           negate=None):
    """A field of :class:`Options` and the ``tmpi wrap`` option that sets it.

    Parameters
    ----------
    default : object
        What users get without the option.
    help : str
        One line for ``--help``.
    choices : tuple, optional
        The values allowed (checked by :meth:`Options.validate` too).
    type : callable, optional
        Converts the command line's text.
    check : callable, optional
        ``check(value) -> value``, raising :class:`ConfigError` for a bad one.
    flag : str, optional
        The flag, when it is not the field's name spelt with dashes.
    negate : str, optional
        For a boolean that defaults to True: the flag that turns it off.
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

    framework: str = option(None, "theano, keras, lasagne, blocks, theanompi (default: "
                                  "detected from the script's imports)")
    rule: str = option("bsp", "synchronisation rule (default bsp)")
    exchanger: str = option(None, "mpi (default), or another installed exchanger")
    precision: str = option(None, "transfer precision of exchanged buffers (default native)",
                            choices=PRECISIONS, check=check_precision)
    bucket_bytes: int = option(None, "largest fused buffer per collective (default: one per "
                                     "dtype)", type=_bytes_or_none,
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
                                         "(default mean)", choices=LOSS_REDUCTIONS)
    outputs: str = option("averaged", "what a training step returns (loss, accuracy): "
                                      "averaged over ranks after every step (default), or "
                                      "each rank's own, so that asynchronous rules' ranks "
                                      "never meet per step", choices=OUTPUTS)
    seed: int = option(None, "seed numpy and random alike on every rank", type=int)
    stall_timeout: float = option(300.0, "seconds a rank may wait on the others before a "
                                         "stall is reported (default 300)", type=float,
                                  check=_stall_timeout)
    start_timeout: float = option(600.0, "seconds every rank has to start and import Theano "
                                         "before the job is ended (default 600)", type=float,
                                  check=lambda v: check_timeout(v, "--start-timeout",
                                                                allow_none=False))
    all_ranks_output: bool = option(False, "show every rank's output, prefixed [rank N]")
    compile_dirs: str = option("shared", "Theano compile cache: shared by the ranks, which "
                                         "compile at once (default), or one per rank",
                               choices=COMPILE_DIRS)
    summary: bool = option(True, "print the per-step time split at the end",
                           negate="--no-summary")
    #: raw ``name=value`` knobs of the rule (``--rule-option``)
    rule_options: dict = dataclasses.field(default_factory=dict)
    #: options plugins added with ``tmpi_add_arguments``, by ``dest``
    extra: dict = dataclasses.field(default_factory=dict)
    #: the fields and plugin options the command line named (they win over a
    #: decorator's; the others are defaults)
    explicit: list = dataclasses.field(default_factory=list)

    def validate(self):
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

    def to_env(self):
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls, env=None):
        env = os.environ if env is None else env
        raw = env.get(OPTIONS_ENV)
        if not raw:
            return cls()
        return cls(**json.loads(raw))

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def declared_fields():
    """The fields of :class:`Options` that have a command-line flag."""
    return [f for f in dataclasses.fields(Options) if "help" in f.metadata]


def flag_of(field):
    """The command-line flag of a declared field."""
    return field.metadata["flag"] or "--" + field.name.replace("_", "-")


def add_option_arguments(group):
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
    type : callable
        Converts the user's text (``"0.5"``) to a value.
    default : object
        Used when the user gives none; may be a callable ``default(size)`` of
        the rank count (EASGD's alpha = 0.9 / N).
    help : str
        One line, shown by ``tmpi plugins`` and in errors.
    check : callable, optional
        ``check(value) -> str or None``: an error text for a bad value.
    only_with : tuple, optional
        ``(knob, value)``: this knob does something only when that other knob
        has that value (BSP's ``period`` with ``mode=avg``); giving it
        otherwise is an error, not silently ignored.
    """

    type: object
    default: object
    help: str
    check: object = None
    only_with: tuple = None


def positive(value):
    return None if value > 0 else "must be > 0"


def non_negative(value):
    return None if value >= 0 else "must be >= 0"


def probability(value):
    return None if 0 <= value <= 1 else "must be in [0, 1]"


def one_of(*choices):
    def check(value):
        return None if value in choices else "must be one of %s" % ", ".join(map(str, choices))
    return check


def parse_bool(text):
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



def resolve_knobs(rule_name, knobs, raw, size):
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


def knob_default(knob, size):
    """A knob's default on ``size`` ranks (it may depend on them: EASGD's alpha)."""
    return knob.default(size) if callable(knob.default) else knob.default


def parse_assignments(items):
    """``["alpha=0.5", "tau=4"]`` -> ``{"alpha": "0.5", "tau": "4"}``."""
    result = {}
    for item in items or ():
        if "=" not in item:
            raise ConfigError("rule option %r must look like name=value (e.g. "
                              "--rule-option tau=4)" % item)
        key, value = item.split("=", 1)
        result[key.strip().replace("-", "_")] = value.strip()
    return result
