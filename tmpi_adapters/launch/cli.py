"""The ``tmpi`` command.

``tmpi wrap [-n N] [options] SCRIPT [script args]``
    run an unmodified training script on N ranks.  tmpi's options may come
    before or after the script; everything else (and everything after ``--``)
    goes to the script.
``tmpi plugins``
    list installed plugins, their versions and the hooks they implement.
"""
import argparse
import os
import sys

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.options import Options, add_option_arguments, declared_fields, parse_assignments
from tmpi_adapters.pluginmanager import commands, get_plugin_manager, hookimpl

#: Options fields set from same-named arguments.
_OPTION_FIELDS = {f.name for f in declared_fields()}


def add_run_arguments(parser):
    """The options shared by ``tmpi wrap`` and ``tmpi run``: every field of
    :class:`~tmpi_adapters.options.Options`, the launcher's own, and the
    plugins' (``tmpi_add_arguments``)."""
    group = parser.add_argument_group("distribution")
    group.add_argument("-n", "--np", dest="n", type=int, default=None,
                       help="number of ranks (default 1, or the enclosing MPI job's)")
    group.add_argument("--rule-option", dest="rule_option", action="append", default=[],
                       metavar="NAME=VALUE", help="a knob of the rule, e.g. tau=4 (repeat)")
    add_option_arguments(group)
    launch = parser.add_argument_group("launching")
    launch.add_argument("--threads-per-rank", type=int, default=1,
                        help="BLAS/OpenMP threads per rank (default 1)")
    launch.add_argument("--mpiexec", help="the mpiexec to use (default: the one installed "
                        "with tmpi, else the first on PATH)")
    launch.add_argument("--mpiexec-arg", dest="mpiexec_args", action="append", default=[],
                        metavar="ARG", help="extra argument for mpiexec (repeat)")
    get_plugin_manager().hook.tmpi_add_arguments(parser=parser.add_argument_group("plugins"))
    return parser


def options_from_args(namespace):
    """Build :class:`Options` from parsed arguments (plugin options go to ``extra``)."""
    values = vars(namespace)
    launch_only = {"n", "rule_option", "threads_per_rank", "mpiexec", "mpiexec_args",
                   "script", "script_args", "command", "config", "handler"}
    fields = {k: v for k, v in values.items() if k in _OPTION_FIELDS}
    extra = {k: v for k, v in values.items() if k not in _OPTION_FIELDS and k not in launch_only}
    options = Options(rule_options=parse_assignments(values.get("rule_option")), extra=extra,
                      **fields)
    return options.validate()


def _option_table(parser):
    """``{option string: takes a value}`` for every option of ``parser``."""
    table = {}
    for action in parser._actions:
        for string in action.option_strings:
            table[string] = action.nargs != 0
    return table


def split_wrap_argv(argv, parser):
    """Separate tmpi's options from the script and its arguments.

    Before the script every option must be tmpi's.  After it, tmpi's own
    options (exact spelling) are still taken, so ``tmpi wrap train.py --rule bsp
    -n 4`` works; anything else, and everything after ``--``, is the script's.
    """
    table = _option_table(parser)
    ours, script, rest = [], None, []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            if script is None and i + 1 < len(argv):
                script = argv[i + 1]
                i += 1
            rest.extend(argv[i + 1:])
            break
        name = token.split("=", 1)[0]
        if name in table:
            ours.append(token)
            if table[name] and "=" not in token:
                if i + 1 >= len(argv):
                    raise TmpiError("option %s needs a value" % token)
                ours.append(argv[i + 1])
                i += 1
        elif script is None:
            if token.startswith("-") and token != "-":
                raise TmpiError("unknown option %s for tmpi wrap (see `tmpi wrap --help`); "
                                "put the script's own options after the script name" % token)
            script = token
        else:
            rest.append(token)
        i += 1
    return ours, script, rest


def check_choices(options, n):
    """Fail before launching for unknown plugins and bad rule options."""
    from tmpi_adapters.options import resolve_knobs
    from tmpi_adapters.pluginmanager import lookup
    if options.framework:
        lookup("frameworks", options.framework)
    rule = lookup("rules", options.rule)
    resolve_knobs(rule.name, rule.knobs, options.rule_options, max(n, 1))
    if options.exchanger:
        lookup("exchangers", options.exchanger)


def cmd_wrap(argv):
    parser = argparse.ArgumentParser(
        prog="tmpi wrap", allow_abbrev=False,
        usage="tmpi wrap [-n N] [--framework F] [--rule R] [options] SCRIPT [script args]",
        description="Run an unmodified Theano/Keras/Lasagne/Blocks training script on N "
                    "MPI ranks. tmpi's options may also follow the script; use -- before "
                    "script arguments that look like tmpi's.")
    add_run_arguments(parser)
    if any(a in ("-h", "--help") for a in argv[:1]) or not argv:
        parser.print_help()
        return 0 if argv else 2
    ours, script, rest = split_wrap_argv(argv, parser)
    if script is None:
        raise TmpiError("no script given: tmpi wrap [options] SCRIPT [script args]")
    namespace = parser.parse_args(ours)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(name, str(namespace.threads_per_rank))
    options = options_from_args(namespace)
    from tmpi_adapters.launch.launcher import check_script
    check_script(script)
    if not options.framework:
        from tmpi_adapters.launch.runtime import detect_framework
        options.framework = detect_framework(script)
        if options.framework is None:
            raise TmpiError("could not tell which framework %r uses (it imports none of "
                            "theano, keras, lasagne, blocks); pass --framework." % script)
    n = 1 if namespace.n is None else namespace.n
    if n < 1:
        raise TmpiError("-n must be at least 1, not %d." % n)
    check_choices(options, n)
    from tmpi_adapters.launch.launcher import launch
    return launch(script, rest, options, n=n, mpiexec=namespace.mpiexec,
                  mpiexec_args=namespace.mpiexec_args,
                  threads_per_rank=namespace.threads_per_rank)


def cmd_plugins(argv):
    parser = argparse.ArgumentParser(prog="tmpi plugins",
                                     description="List installed tmpi plugins.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    from tmpi_adapters.pluginmanager import describe_plugins
    rows = describe_plugins()
    if args.json:
        import json
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print("%s  %s %s" % (row["name"], row["distribution"], row["version"]))
        if row["provides"]:
            print("    provides: %s" % ", ".join(row["provides"]))
        print("    hooks:    %s" % ", ".join(row["hooks"]))
    return 0


@hookimpl
def tmpi_commands():
    return {
        "wrap": (cmd_wrap, "run an unmodified script on N ranks"),
        "plugins": (cmd_plugins, "list installed plugins, versions and hooks"),
    }


def _usage(available):
    lines = ["usage: tmpi COMMAND [args]", "", "commands:"]
    lines += ["  %-9s %s" % (name, text) for name, (_, text) in available.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    available = commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage(available))
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from tmpi_adapters.version import __version__
        print("tmpi-adapters %s" % __version__)
        return 0
    command = available.get(argv[0])
    if command is None:
        print("tmpi: unknown command %r\n%s" % (argv[0], _usage(available)), file=sys.stderr)
        return 2
    try:
        return command[0](argv[1:]) or 0
    except TmpiError as error:
        print("tmpi: error: %s" % error, file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


def run():
    sys.exit(main())


if __name__ == "__main__":
    # Subcommand modules register with `tmpi_adapters.launch.cli`, not with `__main__`.
    from tmpi_adapters.launch.cli import run as _run
    _run()
