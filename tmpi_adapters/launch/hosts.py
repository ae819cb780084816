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
    """``"a:4,b:4"`` (or ``"a,b"``, one slot each) -> ``[Host]``."""
    hosts = []
    for word in text.split(","):
        word = word.strip()
        if not word:
            continue
        name, _, slots = word.partition(":")
        hosts.append(Host(name, _slots(slots or "1", "--hosts %s" % text)))
    if not hosts:
        raise TmpiError("--hosts %r names no host: give them as NAME:RANKS,NAME:RANKS "
                        "(e.g. --hosts node1:4,node2:4)." % text)
    return hosts


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
        name, _, slots = words[0].partition(":")
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key in ("slots", "cpu", "cpus"):
                slots = value
            elif key not in ("max_slots", "max-slots"):
                raise TmpiError("%s: %r is neither MPICH's NAME:RANKS nor Open MPI's "
                                "NAME slots=RANKS." % (where, line.strip()))
        hosts.append(Host(name, _slots(slots or "1", where)))
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


def mpi_flavor(mpiexec):
    """``"hydra"`` (MPICH, Intel MPI), ``"openmpi"`` or ``None``."""
    try:
        text = subprocess.run([mpiexec, "--version"], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if re.search(r"HYDRA|Intel\(R\) MPI", text):
        return "hydra"
    if re.search(r"Open MPI|OpenRTE|open-mpi", text):
        return "openmpi"
    return None


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

    def drop_unreachable(self):
        """Probe every host; drop those that do not answer.  Returns
        ``[(host, why)]`` of the dropped."""
        gone = [(host, why) for host, why in ((h, self.probe(h)) for h in self.hosts) if why]
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
