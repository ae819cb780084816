"""Run options shared by the CLI, the decorator and every rank, and typed knobs
for rules (``-o alpha=0.5``)."""
import dataclasses
import json
import os

from .errors import ConfigError

OPTIONS_ENV = "TMPI_OPTIONS"

SCALINGS = ("strong", "weak")
COMPILE_DIRS = ("shared", "per-rank")
OUTPUTS = ("averaged", "local")


@dataclasses.dataclass
class Options:
    """Everything that shapes a distributed run; defaults are what users get.

    Every field has a ``tmpi wrap`` flag of the same name (``_`` spelt ``-``).
    """

    framework: str = None         #: adapter name; detected from the script when None
    rule: str = "bsp"             #: synchronisation rule
    rule_options: dict = dataclasses.field(default_factory=dict)  #: raw ``name=value`` knobs
    exchanger: str = None         #: chosen by the tmpi_select_exchanger hook when None
    precision: str = None         #: transfer precision: native, fp32, fp16, bf16
    bucket_bytes: int = None      #: largest fused buffer per collective (None: one per dtype)
    scaling: str = "strong"       #: strong (split each batch) or weak (whole batches per rank)
    lr_scaling: bool = False      #: weak scaling: multiply gradients by the rank count
    warmup_steps: int = 0         #: weak scaling: ramp that multiplier up over this many steps
    loss_reduction: str = "mean"  #: how the script's loss reduces over the batch: mean or sum
    outputs: str = "averaged"     #: a training step's returned values: averaged over ranks, or local
    seed: int = None              #: seed of numpy/random on every rank (rank 0 draws one if None)
    stall_timeout: float = 300.0  #: seconds a collective may wait before a stall is reported
    all_ranks_output: bool = False  #: show every rank's stdout, prefixed, not only rank 0's
    compile_dirs: str = "shared"  #: Theano compile cache: shared (rank 0 first) or per-rank
    summary: bool = True          #: print the per-step time split when the run ends
    extra: dict = dataclasses.field(default_factory=dict)  #: fields of later features

    def validate(self):
        if self.scaling not in SCALINGS:
            raise ConfigError("--scaling must be one of %s, not %r" % (", ".join(SCALINGS),
                                                                        self.scaling))
        if self.compile_dirs not in COMPILE_DIRS:
            raise ConfigError("--compile-dirs must be one of %s, not %r"
                              % (", ".join(COMPILE_DIRS), self.compile_dirs))
        if self.loss_reduction not in ("mean", "sum"):
            raise ConfigError("--loss-reduction must be 'mean' or 'sum', not %r"
                              % (self.loss_reduction,))
        if self.outputs not in OUTPUTS:
            raise ConfigError("--outputs must be one of %s, not %r" % (", ".join(OUTPUTS),
                                                                        self.outputs))
        if self.stall_timeout is not None and self.stall_timeout <= 0:
            raise ConfigError("--stall-timeout must be a positive number of seconds, not %r"
                              % (self.stall_timeout,))
        if self.bucket_bytes is not None and self.bucket_bytes <= 0:
            raise ConfigError("--bucket-bytes must be positive, not %r" % (self.bucket_bytes,))
        if self.warmup_steps < 0:
            raise ConfigError("--warmup-steps must be >= 0, not %r" % (self.warmup_steps,))
        from .exchanger import check_precision
        self.precision = check_precision(self.precision)
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
        One line, shown by ``tmpi plugins --verbose`` and in errors.
    check : callable, optional
        ``check(value) -> str or None``: an error text for a bad value.
    """

    type: object
    default: object
    help: str
    check: object = None


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
        if name in raw and raw[name] is not None:
            try:
                value = knob.type(raw[name])
            except (TypeError, ValueError):
                raise ConfigError("rule %r option %s=%r is not a valid %s (%s)"
                                  % (rule_name, name, raw[name],
                                     getattr(knob.type, "__name__", "value"), knob.help))
        else:
            value = knob.default(size) if callable(knob.default) else knob.default
        if knob.check is not None and value is not None:
            problem = knob.check(value)
            if problem:
                raise ConfigError("rule %r option %s=%r %s (%s)"
                                  % (rule_name, name, value, problem, knob.help))
        values[name] = value
    return values


def parse_assignments(items):
    """``["alpha=0.5", "tau=4"]`` -> ``{"alpha": "0.5", "tau": "4"}``."""
    result = {}
    for item in items or ():
        if "=" not in item:
            raise ConfigError("rule option %r must look like name=value (e.g. -o tau=4)" % item)
        key, value = item.split("=", 1)
        result[key.strip().replace("-", "_")] = value.strip()
    return result
