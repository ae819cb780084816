"""Machines without a scheduler: ``tmpi wrap --hosts a:4,b:4`` and ``--hostfile FILE``.

tmpi's own launcher starts the ranks on the hosts named, through the MPI
launcher in its own words (MPICH's hydra: ``-hosts``, ``-launcher``,
``-launcher-exec``; Open MPI: ``--host``, ``--mca plm_rsh_agent``), so that
everything it does on one machine (failure reports, restarts, ``--min-ranks``,
the watch for stalled and vanished ranks) holds across machines.  The ranks
on other machines send the launcher their files over TCP
(:mod:`~tmpi_adapters.process.channel`): no shared file system is needed.
"""
import os
import re
import subprocess
import threading

from tmpi_adapters.errors import TmpiError

#: How hydra and Open MPI's launcher reach a host unless told otherwise.
DEFAULT_LAUNCHER = "ssh"
#: Seconds a host may take to answer before a restart counts it gone.
PROBE_TIMEOUT = 20.0


class Host:
    def __init__(self, name, slots=1):
        self.name, self.slots = name, slots

    def __eq__(self, other):
        return (self.name, self.slots) == (other.name, other.slots)

    def __repr__(self):
        return "%s:%d" % (self.name, self.slots)


def parse_hosts(text):
    """``"a:4,b:4"`` (or ``"a,b"``, one slot each) -> ``[Host]``; a host named
    twice is one host with the slots added (:func:`merged`, later)."""
    hosts = []
    where = "--hosts %r" % text
    for word in text.split(","):
        if not word.strip():
            raise TmpiError("%s: an empty entry (two commas, or one at an end): give the "
                            "hosts as NAME:RANKS,NAME:RANKS (e.g. --hosts node1:4,node2:4)."
                            % where)
        hosts.append(_host(word.strip(), where))
    return hosts


def _host(word, where):
    """``NAME`` or ``NAME:RANKS`` -> :class:`Host`, each part checked."""
    name, colon, slots = word.partition(":")
    if not name:
        raise TmpiError("%s: %r names no host before the colon: write NAME:RANKS (e.g. "
                        "node1:%s)." % (where, word, slots or "4"))
    if not _HOST_NAME.match(name):
        raise TmpiError("%s: %r is not a host name (letters, digits, '.', '-' and '_', not "
                        "starting with '-' or '.')." % (where, name))
    if colon and not slots:
        raise TmpiError("%s: %r has no number of ranks after the colon: write %s:RANKS "
                        "(e.g. %s:4), or %s alone for one rank." % (where, word, name, name,
                                                                    name))
    return Host(name, _slots(slots or "1", where))


#: A host name or address as MPI launchers and ``ssh`` take it.
_HOST_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")


def read_hostfile(path):
    """The hosts of an MPICH (``name[:slots]``) or Open MPI
    (``name [slots=N] [max_slots=M]``) host file; ``#`` starts a comment."""
    try:
        with open(path) as handle:
            lines = handle.read().splitlines()
    except OSError as exc:
        raise TmpiError("--hostfile %s cannot be read: %s." % (path, exc.strerror or exc))
    hosts = []
    for number, line in enumerate(lines, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = "--hostfile %s line %d" % (path, number)
        host = _host(words[0], where)
        for word in words[1:]:
            key, equals, value = word.partition("=")
            if key in ("slots", "cpu", "cpus") and equals and ":" not in words[0]:
                host.slots = _slots(value, where)
            elif key not in ("max_slots", "max-slots") or not equals:
                raise TmpiError("%s: %r is neither MPICH's NAME:RANKS nor Open MPI's "
                                "NAME slots=RANKS." % (where, line.strip()))
        hosts.append(host)
    if not hosts:
        raise TmpiError("--hostfile %s names no host: write one host a line, NAME:RANKS "
                        "(MPICH) or NAME slots=RANKS (Open MPI)." % path)
    return hosts


def _slots(text, where):
    if not text.isdigit() or int(text) < 1:
        raise TmpiError("%s: the ranks of a host must be a whole number >= 1, not %r."
                        % (where, text))
    return int(text)


def merged(hosts):
    """Hosts named twice count once, their slots added (as hydra does)."""
    slots = {}
    for host in hosts:
        slots[host.name] = slots.get(host.name, 0) + host.slots
    return [Host(name, count) for name, count in slots.items()]


class HostSet:
    """The hosts of a job, the way to reach them, and what remains of them
    after a restart found some gone.

    Parameters
    ----------
    hosts : list of Host
    launcher : str
        hydra's ``-launcher`` (``ssh``, ``rsh``; Open MPI: the agent).
    launcher_exec : str or None
        The program that enters a host, called as ``ssh`` is (``PROGRAM
        HOST COMMAND...``): hydra's ``-launcher-exec``, Open MPI's
        ``plm_rsh_agent``.
    """

    def __init__(self, hosts, launcher=None, launcher_exec=None):
        self.hosts = merged(hosts)
        self.launcher = launcher or DEFAULT_LAUNCHER
        self.launcher_exec = launcher_exec
        self.dropped = []

    @property
    def slots(self):
        return sum(host.slots for host in self.hosts)

    def describe(self):
        return ",".join(repr(host) for host in self.hosts)

    def mpiexec_args(self, flavor, environment=()):
        """The launcher's arguments that place the ranks on the hosts
        (Open MPI also needs the variables of ``environment`` named: it
        passes none on to other machines by itself)."""
        spec = self.describe()
        if flavor == "openmpi":
            args = ["--host", spec]
            agent = self.launcher_exec or (self.launcher if self.launcher != "ssh" else None)
            if agent:
                args += ["--mca", "plm_rsh_agent", agent]
            for name in environment:
                args += ["-x", name]
            return args
        args = ["-hosts", spec, "-launcher", self.launcher]
        if self.launcher_exec:
            args += ["-launcher-exec", self.launcher_exec]
        return args

    def command_name(self):
        """The program that enters a host, as a user would type it."""
        return os.path.basename(self.launcher_exec or self.launcher)

    def probe(self, host):
        """``None`` when ``host`` answers the launcher's command, else why not."""
        program = self.launcher_exec or self.launcher
        command = [program] + (["-o", "BatchMode=yes", "-o", "ConnectTimeout=10"]
                               if os.path.basename(program) == "ssh" else []) + \
            [host.name, "true"]
        try:
            result = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True,
                                    timeout=PROBE_TIMEOUT)
        except subprocess.TimeoutExpired:
            return "no answer within %.0f s" % PROBE_TIMEOUT
        except OSError as exc:
            return "%s: %s" % (program, exc.strerror or exc)
        if result.returncode != 0:
            said = result.stderr.decode("utf-8", "replace").strip().splitlines()
            return "%s %s true: status %d%s" % (os.path.basename(program), host.name,
                                                  result.returncode,
                                                  (": " + said[-1]) if said else "")
        return None

    def unreachable(self):
        """``[(host, why)]`` of the hosts that do not answer :meth:`probe`,
        all asked at once (within :data:`PROBE_TIMEOUT`)."""
        answers = {}

        def ask(host):
            answers[host.name] = self.probe(host)
        threads = [threading.Thread(target=ask, args=(host,), daemon=True)
                   for host in self.hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(PROBE_TIMEOUT + 5)
        return [(host, answers.get(host.name) or "no answer within %.0f s" % PROBE_TIMEOUT)
                for host in self.hosts if answers.get(host.name, "") is not None]

    def drop_unreachable(self):
        """Probe every host; drop those that do not answer.  Returns
        ``[(host, why)]`` of the dropped."""
        gone = self.unreachable()
        for host, _ in gone:
            self.hosts.remove(host)
            self.dropped.append(host)
        return gone


def host_set(hosts=None, hostfile=None, launcher=None, launcher_exec=None):
    """The :class:`HostSet` that ``--hosts``/``--hostfile`` name, or ``None``."""
    if hosts and hostfile:
        raise TmpiError("--hosts and --hostfile both name the hosts: give one of them.")
    if launcher_exec and not (hosts or hostfile):
        raise TmpiError("--launcher-exec enters the hosts of --hosts or --hostfile; "
                        "name them too.")
    if not (hosts or hostfile):
        return None
    return HostSet(parse_hosts(hosts) if hosts else read_hostfile(hostfile), launcher,
                   launcher_exec)
