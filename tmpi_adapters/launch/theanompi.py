"""``tmpi run`` and the Theano-MPI style Python API, for Theano-MPI model files:
the front door of users of Theano-MPI (the adapter is
:mod:`tmpi_adapters.frameworks.theanompi`).

Command line (a Theano-MPI ``launch_session.cfg`` works unchanged)::

    tmpi run --config launch_session.cfg
    tmpi run --modelfile models.mymodel --modelclass MyModel --rule easgd -n 4

Python, mirroring Theano-MPI's ``launch_session.py``::

    from tmpi_adapters import BSP
    rule = BSP()
    rule.init(devices=["cpu0", "cpu1"], modelfile="models.mymodel", modelclass="MyModel")
    rule.wait()
"""
import os
import shlex
import subprocess
import sys

from tmpi_adapters.process.devices import DEVICES_ENV
from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.launch.arguments import (OptionParser, add_run_arguments, check_choices,
                                            options_from_args)

#: Theano-MPI's rule names and ours.
RULES = {"BSP": "bsp", "EASGD": "easgd", "GOSGD": "gosgd", "ASGD": "asgd"}
#: BSP_SYNC_TYPE: ``cdd`` exchanges gradients, ``avg`` averages parameters.
SYNC_TYPES = {"cdd": "grad", "avg": "avg"}
#: BSP_EXCH_STRATEGY: (exchanger, transfer precision).
EXCHANGE_STRATEGIES = {
    "ar": ("mpi", "native"),
    "copper": ("mpi", "native"),
    "asa32": ("mpi", "native"),
    "copper16": ("mpi", "fp16"),
    "asa16": ("mpi", "fp16"),
    "nccl32": ("mpi", "native"),
    "nccl16": ("mpi", "fp16"),
}
CONFIG_KEYS = ("RULE", "MODELFILE", "MODELCLASS", "DEVICES", "BSP_SYNC_TYPE",
               "BSP_EXCH_STRATEGY")

#: The training loop every rank runs, started by path as the session's script
#: (:mod:`tmpi_adapters.frameworks.theanompi.driver`).
DRIVER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                      "frameworks", "theanompi", "driver.py")


def read_config(path):
    """Parse a Theano-MPI ``launch_session.cfg`` (shell-style ``KEY=VALUE`` lines).

    Unknown keys, text that is not UTF-8 and values a shell could not read
    (an unclosed quote) are errors naming the file and line.
    """
    if not os.path.isfile(path):
        raise ConfigError("config file %r not found." % path)
    try:
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
    except UnicodeDecodeError as exc:
        line = exc.object[:exc.start].count(b"\n") + 1
        raise ConfigError("%s:%d: not UTF-8 text (byte 0x%02x): a launch_session.cfg holds "
                          "KEY=VALUE lines of text; save it as UTF-8."
                          % (path, line, exc.object[exc.start]))
    except OSError as exc:
        raise ConfigError("config file %r cannot be read: %s." % (path, exc.strerror or exc))
    values = {}
    for number, line in enumerate(lines, start=1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        if text.startswith("export "):
            text = text[len("export "):].strip()
        if "=" not in text:
            raise ConfigError("%s:%d: expected KEY=VALUE, found %r" % (path, number, text))
        key, value = (part.strip() for part in text.split("=", 1))
        if key not in CONFIG_KEYS:
            raise ConfigError("%s:%d: unknown key %s; %s knows %s." % (
                path, number, key, "tmpi run", ", ".join(CONFIG_KEYS)))
        try:
            values[key] = " ".join(shlex.split(value)) if value else ""
        except ValueError as exc:
            raise ConfigError("%s:%d: %s cannot be read as a shell value (%s): %s. Close "
                              "the quote, or leave the quotes out."
                              % (path, number, key, str(exc).lower(), value))
    return values


def session_settings(rule=None, devices=None, sync_type=None, exch_strategy=None):
    """Translate Theano-MPI settings to ``(rule, rule_options, n, exchanger, precision)``."""
    name = RULES.get(str(rule).upper()) if rule else "bsp"
    if rule and name is None:
        name = str(rule).lower()
    rule_options = {}
    if sync_type:
        if sync_type not in SYNC_TYPES:
            raise ConfigError("BSP_SYNC_TYPE must be one of %s, not %r"
                              % (", ".join(SYNC_TYPES), sync_type))
        if name != "bsp":
            raise ConfigError("BSP_SYNC_TYPE applies to RULE=BSP only (RULE is %s)" % rule)
        rule_options["mode"] = SYNC_TYPES[sync_type]
    exchanger = precision = None
    if exch_strategy:
        if exch_strategy not in EXCHANGE_STRATEGIES:
            raise ConfigError("BSP_EXCH_STRATEGY must be one of %s, not %r"
                              % (", ".join(EXCHANGE_STRATEGIES), exch_strategy))
        exchanger, precision = EXCHANGE_STRATEGIES[exch_strategy]
    if isinstance(devices, str):
        devices = [d for d in devices.replace(" ", ",").split(",") if d]
        if not devices:
            raise ConfigError("DEVICES is empty: list one device per rank, e.g. "
                              "DEVICES=cpu0,cpu1 or DEVICES=\"cuda0 cuda1\".")
    n = len(devices) if devices else None
    return name, rule_options, n, exchanger, precision


def cmd_run(argv):
    parser = OptionParser(
        prog="tmpi run", allow_abbrev=False,
        description="Train a Theano-MPI ModelClass (from a launch_session.cfg or "
                    "--modelfile/--modelclass) on N ranks.")
    parser.add_argument("--config", "-cfg", help="a Theano-MPI launch_session.cfg")
    parser.add_argument("--modelfile", help="module holding the ModelClass, e.g. models.mlp")
    parser.add_argument("--modelclass", help="the ModelClass name")
    parser.add_argument("--epochs", type=int, default=None,
                        help="epochs when the model has no n_epochs attribute")
    add_run_arguments(parser)
    args = parser.parse_args(argv)
    config = read_config(args.config) if args.config else {}
    modelfile = args.modelfile or config.get("MODELFILE")
    modelclass = args.modelclass or config.get("MODELCLASS")
    if not modelfile or not modelclass:
        raise ConfigError("tmpi run needs a model: MODELFILE and MODELCLASS in --config, or "
                          "--modelfile and --modelclass.")
    rule, rule_options, n, exchanger, precision = session_settings(
        config.get("RULE"), config.get("DEVICES"), config.get("BSP_SYNC_TYPE"),
        config.get("BSP_EXCH_STRATEGY"))
    if "--rule" in argv or not config.get("RULE"):
        rule = args.rule
    options = options_from_args(args)
    options.framework = "theanompi"
    options.rule = rule
    options.rule_options = dict(rule_options, **options.rule_options)
    options.exchanger = options.exchanger or exchanger
    if precision and options.precision == "native":
        options.precision = precision
    from tmpi_adapters.launch.hosts import host_set
    hosts = host_set(args.hosts, args.hostfile, args.launcher, args.launcher_exec)
    n = args.n or n or (hosts.slots if hosts else 1)
    check_choices(options, n)
    devices = config.get("DEVICES")
    if devices:
        # Rank r computes on DEVICES' entry r, as under Theano-MPI.
        os.environ[DEVICES_ENV] = ",".join(devices.replace(" ", ",").split(","))
    driver_args = ["--modelfile", modelfile, "--modelclass", modelclass]
    if args.epochs:
        driver_args += ["--epochs", str(args.epochs)]
    from tmpi_adapters.launch.launcher import launch
    return launch(DRIVER, driver_args, options, n=n, mpiexec=args.mpiexec,
                  mpiexec_args=args.mpiexec_args, threads_per_rank=args.threads_per_rank,
                  oversubscribe=args.oversubscribe, hosts=hosts)


class TheanoMPIRule:
    """Theano-MPI's ``rule = BSP(); rule.init(...); rule.wait()``, starting tmpi ranks."""

    #: tmpi rule name
    rule = None

    def __init__(self):
        self.process = None

    def init(self, devices, modelfile, modelclass, sync_type=None, exch_strategy=None,
             rule_options=None, extra_args=()):
        """Start the ranks (one per device) in the background.

        Parameters
        ----------
        devices : list of str
            One entry per rank (``"cuda0"``, ``"cpu"``, ...); its length is N.
        modelfile, modelclass : str
            As in Theano-MPI: ``models.mymodel`` and ``MyModel``, imported from
            the current directory.
        sync_type, exch_strategy : str, optional
            Theano-MPI's ``avg``/``cdd`` and ``ar``/``nccl32``/``nccl16``.
        rule_options : dict, optional
            Knobs of the rule (``{"tau": 4}``).
        extra_args : sequence of str
            More ``tmpi run`` options (``["--seed", "1"]``).
        """
        if not devices:
            raise ConfigError("devices must list one entry per rank, e.g. ['cuda0', 'cuda1']")
        _, mode_options, n, exchanger, precision = session_settings(
            self.rule.upper(), devices, sync_type, exch_strategy)
        command = [sys.executable, "-m", "tmpi_adapters.launch.cli", "run",
                   "--modelfile", modelfile, "--modelclass", modelclass,
                   "--rule", self.rule, "-n", str(n)]
        for key, value in dict(mode_options, **(rule_options or {})).items():
            command += ["--rule-option", "%s=%s" % (key, value)]
        if exchanger:
            command += ["--exchanger", exchanger]
        if precision and precision != "native":
            command += ["--precision", precision]
        self.process = subprocess.Popen(command + list(extra_args), env=dict(
            os.environ, **{DEVICES_ENV: ",".join(devices)}))
        return self

    def wait(self):
        """Block until training ends; a failed run raises :class:`TmpiError`."""
        if self.process is None:
            raise TmpiError("call init(...) before wait()")
        code = self.process.wait()
        if code != 0:
            raise TmpiError("the %s session ended with exit status %d" % (self.rule, code))
        return code


def rule_class(name):
    """``BSP``, ``EASGD``, ``GOSGD``, ``ASGD`` as Theano-MPI-style launcher classes."""
    return type(name, (TheanoMPIRule,), {"rule": RULES[name],
                                         "__doc__": "Theano-MPI style launcher for %s." % name})
