"""The ``tmpi`` command.

``tmpi wrap [-n N] [options] SCRIPT [script args]``
    run an unmodified training script on N ranks.  tmpi's options may come
    before or after the script; everything else (and everything after ``--``)
    goes to the script.
``tmpi plugins``
    list installed plugins, their versions and the hooks they implement.
"""
import argparse
import dataclasses
import os
import sys

from .errors import TmpiError
from .options import OUTPUTS, Options, parse_assignments

#: Options fields set from same-named arguments.
_OPTION_FIELDS = {f.name for f in dataclasses.fields(Options)} - {"extra", "rule_options"}


def _int_or_none(text):
    return None if text in (None, "", "none") else int(text)


def add_run_arguments(parser):
    """The options shared by ``tmpi wrap`` and ``tmpi run``."""
    group = parser.add_argument_group("distribution")
    group.add_argument("-n", "--np", dest="n", type=int, default=None,
                       help="number of ranks (default 1, or the enclosing MPI job's)")
    group.add_argument("--framework", help="theano, keras, lasagne, blocks, theanompi "
                       "(default: detected from the script's imports)")
    group.add_argument("--rule", default="bsp", help="synchronisation rule (default bsp)")
    group.add_argument("--rule-option", dest="rule_option", action="append", default=[],
                       metavar="NAME=VALUE", help="a knob of the rule, e.g. tau=4 (repeat)")
    group.add_argument("--exchanger", help="mpi (default), or a GPU exchanger")
    group.add_argument("--precision", choices=("native", "fp32", "fp16", "bf16"),
                       help="transfer precision of exchanged buffers (default native)")
    group.add_argument("--bucket-bytes", type=_int_or_none, default=None,
                       help="largest fused buffer per collective (default: one per dtype)")
    group.add_argument("--scaling", choices=("strong", "weak"), default="strong",
                       help="strong: split each batch across ranks (exact, default); weak: "
                            "each rank trains on whole batches")
    group.add_argument("--lr-scaling", action="store_true",
                       help="weak scaling: scale the gradient (SGD's learning rate) by N")
    group.add_argument("--warmup-steps", type=int, default=0,
                       help="weak scaling: reach the full --lr-scaling over this many steps")
    group.add_argument("--loss-reduction", choices=("mean", "sum"), default="mean",
                       help="how the script's loss reduces over a batch (default mean)")
    group.add_argument("--outputs", choices=OUTPUTS, default="averaged",
                       help="what a training step returns (loss, accuracy): averaged over "
                            "ranks after every step (default), or each rank's own, so that "
                            "asynchronous rules' ranks never meet per step")
    group.add_argument("--seed", type=int, default=None,
                       help="seed numpy and random alike on every rank")
    group.add_argument("--stall-timeout", type=float, default=300.0,
                       help="seconds a rank may wait on the others before a stall is "
                            "reported (default 300)")
    group.add_argument("--all-ranks-output", action="store_true",
                       help="show every rank's output, prefixed [rank N]")
    group.add_argument("--compile-dirs", choices=("shared", "per-rank"), default="shared",
                       help="Theano compile cache: shared, filled by rank 0 first (default), "
                            "or one per rank")
    group.add_argument("--no-summary", dest="summary", action="store_false",
                       help="do not print the per-step time split at the end")
    launch = parser.add_argument_group("launching")
    launch.add_argument("--threads-per-rank", type=int, default=1,
                        help="BLAS/OpenMP threads per rank (default 1)")
    launch.add_argument("--mpiexec", help="the mpiexec to use (default: the one installed "
                        "with tmpi, else the first on PATH)")
    launch.add_argument("--mpiexec-arg", dest="mpiexec_args", action="append", default=[],
                        metavar="ARG", help="extra argument for mpiexec (repeat)")
    from .pluginmanager import get_plugin_manager
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
    from .options import resolve_knobs
    from .pluginmanager import lookup
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
    from .launcher import check_script
    check_script(script)
    if not options.framework:
        from .runtime import detect_framework
        options.framework = detect_framework(script)
        if options.framework is None:
            raise TmpiError("could not tell which framework %r uses (it imports none of "
                            "theano, keras, lasagne, blocks); pass --framework." % script)
    n = 1 if namespace.n is None else namespace.n
    if n < 1:
        raise TmpiError("-n must be at least 1, not %d." % n)
    check_choices(options, n)
    from .launcher import launch
    return launch(script, rest, options, n=n, mpiexec=namespace.mpiexec,
                  mpiexec_args=namespace.mpiexec_args,
                  threads_per_rank=namespace.threads_per_rank)


def cmd_plugins(argv):
    parser = argparse.ArgumentParser(prog="tmpi plugins",
                                     description="List installed tmpi plugins.")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)
    from .pluginmanager import describe_plugins
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


COMMANDS = {
    "wrap": (cmd_wrap, "run an unmodified script on N ranks"),
    "plugins": (cmd_plugins, "list installed plugins, versions and hooks"),
}


def register_command(name, handler, help_text):
    """Add a ``tmpi`` subcommand (``handler(argv) -> exit status``)."""
    COMMANDS[name] = (handler, help_text)


def _usage():
    lines = ["usage: tmpi COMMAND [args]", "", "commands:"]
    lines += ["  %-9s %s" % (name, text) for name, (_, text) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    _load_commands()
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] in ("-V", "--version"):
        from . import __version__
        print("tmpi-adapters %s" % __version__)
        return 0
    command = COMMANDS.get(argv[0])
    if command is None:
        print("tmpi: unknown command %r\n%s" % (argv[0], _usage()), file=sys.stderr)
        return 2
    try:
        return command[0](argv[1:]) or 0
    except TmpiError as error:
        print("tmpi: error: %s" % error, file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130


#: Modules that add subcommands with :func:`register_command` when imported.
COMMAND_MODULES = ("tmpi_adapters.bench", "tmpi_adapters.theanompi_run")


def _load_commands():
    import importlib
    for module in COMMAND_MODULES:
        importlib.import_module(module)


def run():
    sys.exit(main())


if __name__ == "__main__":
    # Subcommand modules register with `tmpi_adapters.cli`, not with `__main__`.
    from tmpi_adapters.cli import run as _run
    _run()
