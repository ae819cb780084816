"""The options of ``tmpi wrap`` and ``tmpi run``, read from their command lines:
tmpi's own, before the script; the script's, after it, untouched."""
import argparse

from tmpi_adapters.errors import ConfigError, TmpiError
from tmpi_adapters.options import Options, add_option_arguments, declared_fields, parse_assignments
from tmpi_adapters.pluginmanager import get_plugin_manager

#: Options fields set from same-named arguments.
_OPTION_FIELDS = {f.name for f in declared_fields()}


#: What a value of an argparse ``type`` that is a plain Python type must be.
_ACCEPTED = {int: "a whole number", float: "a number"}


class OptionParser(argparse.ArgumentParser):
    """An ``argparse`` parser whose every refusal is one ``tmpi: error:`` line
    (a :class:`ConfigError`, status 2) naming the option, the value and what
    it accepts, instead of argparse's usage and ``tmpi wrap: error:`` lines.
    ``--help`` still prints the usage.

    A ``type`` may raise :class:`ConfigError` or ``argparse.ArgumentTypeError``
    with its own sentence; a plain ``int`` or ``float`` gets one written here.
    """

    def _get_value(self, action, text):
        convert = self._registry_get("type", action.type, action.type)
        if not callable(convert):
            return super()._get_value(action, text)
        try:
            return convert(text)
        except (ConfigError, argparse.ArgumentTypeError) as error:
            raise ConfigError(str(error)) from None
        except (TypeError, ValueError):
            raise ConfigError("%s must be %s, not %r" % (
                _flag(action), _ACCEPTED.get(convert, "a valid value"), text)) from None

    def _check_value(self, action, value):
        if action.choices is not None and value not in action.choices:
            raise ConfigError("%s must be one of %s, not %r" % (
                _flag(action), ", ".join(map(str, action.choices)), value))

    def error(self, message):
        raise ConfigError("%s (see `%s --help`)" % (message, self.prog))


def _flag(action):
    """The option's name as its declaration spells it first (``-n`` of ``-n/--np``)."""
    return (action.option_strings or [action.dest])[0]


def add_run_arguments(parser):
    """The options shared by ``tmpi wrap`` and ``tmpi run``: every field of
    :class:`~tmpi_adapters.options.Options`, the launcher's own, and the
    plugins' (``tmpi_add_arguments``)."""
    group = parser.add_argument_group("distribution")
    group.add_argument("-n", "--np", dest="n", type=_at_least_one("-n"), default=None,
                       help="number of ranks (default 1, or the enclosing MPI job's)")
    group.add_argument("--rule-option", dest="rule_option", action="append", default=[],
                       metavar="NAME=VALUE", help="a knob of the rule, e.g. tau=4 (repeat)")
    add_option_arguments(group)
    launch = parser.add_argument_group("launching")
    launch.add_argument("--threads-per-rank", type=_at_least_one("--threads-per-rank"),
                        default=None, metavar="T",
                        help="BLAS/OpenMP threads per rank (default: the cores divided "
                             "among the ranks, at least 1; with -n 1 the libraries' own)")
    launch.add_argument("--oversubscribe", action="store_true",
                        help="start the ranks here even when they cannot fit this "
                             "machine's memory, or outnumber its cores many times over")
    launch.add_argument("--mpiexec", help="the mpiexec to use (default: the one installed "
                        "with tmpi, else the first on PATH)")
    launch.add_argument("--mpiexec-arg", dest="mpiexec_args", action="append", default=[],
                        metavar="ARG", help="extra argument for mpiexec (repeat)")
    launch.add_argument("--hosts", metavar="HOST:RANKS,...",
                        help="start the ranks on these machines (e.g. node1:4,node2:4; "
                             "-n defaults to the ranks named), reached with --launcher")
    launch.add_argument("--hostfile", metavar="FILE",
                        help="the machines of --hosts from a file: MPICH's NAME:RANKS or "
                             "Open MPI's NAME slots=RANKS, one a line")
    launch.add_argument("--launcher", default=None, metavar="NAME",
                        help="how the MPI launcher enters the hosts (default ssh; hydra "
                             "also knows rsh)")
    launch.add_argument("--launcher-exec", default=None, metavar="PROGRAM",
                        help="the program that enters a host, called as ssh is (PROGRAM "
                             "HOST COMMAND): hydra's -launcher-exec, Open MPI's "
                             "plm_rsh_agent")
    get_plugin_manager().hook.tmpi_add_arguments(parser=parser.add_argument_group("plugins"))
    return parser


def _at_least_one(flag):
    """An argparse ``type``: a whole number >= 1."""
    def whole_number(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < 1:
            raise argparse.ArgumentTypeError("%s must be a whole number >= 1, not %r"
                                             % (flag, text))
        return value
    return whole_number


def options_from_args(namespace, given=()):
    """Build :class:`Options` from parsed arguments (plugin options go to
    ``extra``); ``given`` are the option words of the command line, whose
    fields become ``options.explicit``."""
    values = vars(namespace)
    launch_only = {"n", "rule_option", "threads_per_rank", "oversubscribe", "mpiexec",
                   "mpiexec_args", "hosts", "hostfile", "launcher", "launcher_exec",
                   "module", "script", "script_args", "command", "config", "handler"}
    fields = {k: v for k, v in values.items() if k in _OPTION_FIELDS}
    extra = {k: v for k, v in values.items() if k not in _OPTION_FIELDS and k not in launch_only}
    options = Options(rule_options=parse_assignments(values.get("rule_option")), extra=extra,
                      **fields)
    options.explicit = sorted({"rule_options" if dest == "rule_option" else dest
                               for dest in given} - launch_only)
    return options.validate()


def given_dests(words, parser):
    """The ``dest`` of every option among ``words`` (a command line's options)."""
    actions = parser._option_string_actions
    dests = set()
    for word in words:
        if not word.startswith("-"):
            continue
        action = actions.get(word.split("=", 1)[0]) or actions.get(word[:2])
        if action is not None:
            dests.add(action.dest)
    return dests


def _option_table(parser):
    """``{option string: takes a value}`` for every option of ``parser``."""
    table = {}
    for action in parser._actions:
        for string in action.option_strings:
            table[string] = action.nargs != 0
    return table


def split_wrap_argv(argv, parser):
    """Separate tmpi's options from what they run: ``(ours, target, rest)``.

    As with ``python``, ``mpiexec`` and ``torchrun``: every word before the
    script is one of tmpi's options (or its value), the first other word is
    the script, and everything after it is the script's own, untouched (its
    ``-n``, ``--seed`` and ``--help`` included).  ``--`` may mark where tmpi's
    options end.  ``-m MODULE`` runs a module as ``python -m`` does; ``target``
    is then ``("module", MODULE)``, else ``("script", SCRIPT)`` (``None``
    when there is neither).
    """
    table = _option_table(parser)
    ours = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            i += 1
            break
        if token == "-m" or (token.startswith("-m") and not token.startswith("--")):
            module = token[2:] or (argv[i + 1] if i + 1 < len(argv) else None)
            if not module:
                raise TmpiError("-m needs a module name: tmpi wrap [options] -m MODULE [args]")
            return ours, ("module", module), argv[i + (1 if token[2:] else 2):]
        if not token.startswith("-") or token == "-":
            break
        name = token.split("=", 1)[0]
        attached = not token.startswith("--") and len(token) > 2 and token[:2] in table
        if name not in table and not attached:
            raise TmpiError("unknown option %s for tmpi wrap (see `tmpi wrap --help`). tmpi's "
                            "options go before the script; everything after the script "
                            "is the script's own." % token)
        ours.append(token)
        if name in table and table[name] and "=" not in token:
            if i + 1 >= len(argv):
                raise TmpiError("option %s needs a value" % token)
            ours.append(argv[i + 1])
            i += 1
        i += 1
    if i >= len(argv):
        return ours, None, []
    return ours, ("script", argv[i]), argv[i + 1:]


def misplaced_options(rest, parser):
    """The script's arguments that are spelt like tmpi's options (for a hint
    when the script refuses them)."""
    table = _option_table(parser)
    return [a for a in rest if a.split("=", 1)[0] in table and a not in ("-h", "--help")]


def check_choices(options, n):
    """Fail before launching for unknown plugins and bad rule options."""
    from tmpi_adapters.options import resolve_knobs
    from tmpi_adapters.pluginmanager import get_plugin_manager, lookup
    if options.framework:
        lookup("frameworks", options.framework)
    rule = lookup("rules", options.rule)
    resolve_knobs(rule.name, rule.knobs, options.rule_options, max(n, 1))
    if options.exchanger:
        lookup("exchangers", options.exchanger)
    get_plugin_manager().hook.tmpi_check_options(options=options, ranks=max(n, 1))


def wrap_parser():
    """The parser of ``tmpi wrap``'s own options (those before the script)."""
    parser = OptionParser(
        prog="tmpi wrap", allow_abbrev=False,
        usage="tmpi wrap [-n N] [--framework F] [--rule R] [options] SCRIPT [args]\n"
              "       tmpi wrap [-n N] [options] -m MODULE [args]",
        description="Run an unmodified Theano/Keras/Lasagne/Blocks training script (or "
                    "module, as python -m) on N MPI ranks. tmpi's options come before the "
                    "script; everything after the script is its own, untouched.")
    parser.add_argument("-m", dest="module", metavar="MODULE",
                        help="run a module as `python -m MODULE` does, instead of a script")
    return add_run_arguments(parser)
