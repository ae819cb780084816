"""The ``tmpi`` command.

``tmpi wrap [-n N] [options] SCRIPT [args]``, ``tmpi wrap [options] -m MODULE [args]``
    run an unmodified training script (or module, as ``python -m``) on N
    ranks.  As with ``python``, ``mpiexec`` and ``torchrun``, tmpi's options
    come before the script; everything after it is the script's, untouched.
``tmpi plugins``
    list installed plugins, their versions and the hooks they implement.
"""
import sys

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.launch.arguments import (OptionParser, check_choices, given_dests,
                                            misplaced_options, options_from_args,
                                            split_wrap_argv, wrap_parser)
from tmpi_adapters.pluginmanager import commands, hookimpl


def cmd_wrap(argv):
    parser = wrap_parser()
    if not argv:
        parser.print_help()
        return 2
    ours, target, rest = split_wrap_argv(argv, parser)
    namespace = parser.parse_args(ours)  # prints the help and exits for -h
    if target is None:
        raise TmpiError("no script given: tmpi wrap [options] SCRIPT [args], or "
                        "tmpi wrap [options] -m MODULE [args]")
    options = options_from_args(namespace, given_dests(ours, parser))
    from tmpi_adapters.launch.launcher import check_target, launch
    check_target(target)
    from tmpi_adapters.launch.target import detect_framework
    detected = detect_framework(target)
    if not options.framework:
        options.framework = detected
        if options.framework is None:
            raise TmpiError("could not tell which framework %s uses (it imports none of "
                            "theano, keras, lasagne, blocks); pass --framework."
                            % _describe_target(target))
    elif detected and detected != options.framework:
        what = ("%s's own parts (its fit loop, callbacks, metrics or extensions) are not "
                "handled the %s way" % (detected, detected) if detected != "theano" else
                "it imports none of keras, lasagne, blocks")
        print("tmpi: note: %s uses %s, but --framework %s was given: %s. Leave --framework "
              "out to let tmpi pick %s." % (_describe_target(target), detected,
                                             options.framework, what, detected),
              file=sys.stderr)
    from tmpi_adapters.launch.hosts import host_set
    hosts = host_set(namespace.hosts, namespace.hostfile, namespace.launcher,
                     namespace.launcher_exec)
    n = namespace.n or (hosts.slots if hosts else 1)
    check_choices(options, n)
    code = launch(target, rest, options, n=n, mpiexec=namespace.mpiexec,
                  mpiexec_args=namespace.mpiexec_args,
                  threads_per_rank=namespace.threads_per_rank,
                  oversubscribe=namespace.oversubscribe, hosts=hosts)
    misplaced = misplaced_options(rest, parser) if code == 2 else []
    if misplaced:
        # Exit status 2 is argparse's "bad arguments": most likely tmpi's
        # options were written after the script, where they are the script's.
        print("tmpi: note: the script's arguments include %s, which are also tmpi's "
              "options. tmpi's options go before the script: tmpi wrap [options] SCRIPT "
              "[args]." % " ".join(misplaced), file=sys.stderr)
    return code


def _describe_target(target):
    kind, name = target
    return "module %r" % name if kind == "module" else "%r" % name


def cmd_plugins(argv):
    parser = OptionParser(prog="tmpi plugins",
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
        for rule, knobs in row["knobs"].items():
            print("    --rule %s options (--rule-option NAME=VALUE):%s" % (
                rule, "" if knobs else " none"))
            for knob in knobs:
                print("      %-20s %s, default %s: %s" % (knob["name"], knob["type"],
                                                       knob["default"], knob["help"]))
    return 0


def cmd_run(argv):
    """``tmpi run``, imported when it runs (:func:`tmpi_adapters.launch.theanompi.cmd_run`)."""
    from tmpi_adapters.launch.theanompi import cmd_run as run
    return run(argv)


@hookimpl
def tmpi_commands():
    return {
        "wrap": (cmd_wrap, "run an unmodified script on N ranks"),
        "run": (cmd_run, "train a Theano-MPI ModelClass (launch_session.cfg)"),
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
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM while a job starts
        return 128 + int(getattr(stop, "signum", 2))


def run():
    sys.exit(main())


if __name__ == "__main__":
    # Subcommand modules register with `tmpi_adapters.launch.cli`, not with `__main__`.
    from tmpi_adapters.launch.cli import run as _run
    _run()
