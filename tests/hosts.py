"""Several hosts on this one machine, for tests of multi-host runs.

``tools/emulated-hosts`` makes each host a set of namespaces (network, UTS,
IPC, mount) joined to this machine by a bridge: its own hostname, address
and ``/tmp``, this machine's file system and process ids otherwise.  This
module is its pytest side: the module-scoped :func:`emulated_hosts` fixture
brings :data:`COUNT` hosts up, yields an :class:`EmulatedHosts`, and takes
them down at the end of the module (unless they were up before: then they
are left as they were found, but for processes the tests left on them).
One test module at a time has them (:data:`LOCK`): the tests kill what runs
on a host, halt hosts and cut them off, and each module ends by killing every
process left on them, so two modules run at once by pytest-xdist's workers
(``make test``), or by two pytest runs, would break each other's jobs.

Use it from a test module with ``from hosts import emulated_hosts`` (the
fixture) and ask for ``emulated_hosts``.  Where the hosts cannot be made
-- not root, not Linux, iproute2 or util-linux missing, namespaces refused
(an unprivileged container) -- every test that asks for them is skipped,
saying why; they never fail for that.

Nothing extra is needed in mpiexec's environment: hydra enters a host with
``-launcher ssh -launcher-exec tools/emulated-hosts``, its proxies reach the
mpiexec here by this machine's hostname (which resolves to the bridge inside
the hosts), and MPICH's UCX netmod sees ranks on other hosts as other nodes
and talks TCP to them over their links (tests/test_hosts.py checks that the
bytes cross them).
"""
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The script that makes and enters the hosts.
TOOL = ROOT / "tools" / "emulated-hosts"
#: Hosts the fixture brings up.
COUNT = 3
#: The file a test module holds locked while it uses the hosts.
LOCK = "/run/tmpi-emulated-hosts.tests.lock"
#: Seconds a module waits for another to be done with the hosts.
LOCK_TIMEOUT = 1800
#: What an ``up`` that failed said when the machine does not allow it (as
#: opposed to a fault of the script, which fails the session's first test).
REFUSALS = ("operation not permitted", "permission denied", "not supported",
            "unknown device type", "no such device", "needs ")


def _tool(*args, check=True, timeout=60):
    result = subprocess.run([str(TOOL)] + [str(a) for a in args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise RuntimeError("tools/emulated-hosts %s failed (%d): %s" % (
            " ".join(str(a) for a in args), result.returncode, result.stderr.strip()))
    return result


def unavailable():
    """Why emulated hosts cannot be made here, or ``None``."""
    if not sys.platform.startswith("linux"):
        return "emulated hosts need Linux namespaces (this is %s)" % sys.platform
    if os.geteuid() != 0:
        return "emulated hosts need root (network, UTS and mount namespaces, a bridge)"
    missing = [tool for tool in ("ip", "unshare", "nsenter", "mount", "flock")
               if shutil.which(tool) is None]
    if missing:
        return "emulated hosts need %s (iproute2, util-linux)" % ", ".join(missing)
    probe = subprocess.run(["unshare", "--net", "--uts", "--ipc", "--mount", "true"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if probe.returncode != 0:
        return "namespaces are refused here (an unprivileged container?): %s" % (
            probe.stderr.strip() or "unshare exited %d" % probe.returncode)
    listed = subprocess.run(["ip", "netns", "list"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    if listed.returncode != 0:
        return "`ip netns` is unavailable here: %s" % listed.stderr.strip()
    return None


class EmulatedHosts:
    """The hosts that are up, and what a test needs to run ranks on them.

    Attributes
    ----------
    names : list of str
        ``["tmpi-h1", "tmpi-h2", ...]``: each is also the host's hostname.
    addresses : dict
        Each name's IPv4 address (the names resolve everywhere too).
    launcher_exec : str
        The program hydra enters a host with (``-launcher-exec``; ``tmpi
        wrap --launcher-exec``): ``tools/emulated-hosts`` itself, which takes
        ssh's arguments.
    env : dict
        Variables mpiexec's environment needs for the hosts: none.
    """

    def __init__(self, names, addresses):
        self.names = list(names)
        self.addresses = dict(addresses)
        self.tool = str(TOOL)
        self.launcher_exec = str(TOOL)
        self.env = {}

    def spec(self, *slots):
        """``spec(2, 2)`` -> ``"tmpi-h1:2,tmpi-h2:2"``: the first hosts, each with its slots."""
        if len(slots) > len(self.names):
            raise ValueError("%d hosts asked for, %d are up" % (len(slots), len(self.names)))
        return ",".join("%s:%d" % (name, count) for name, count in zip(self.names, slots))

    def mpiexec_args(self, *slots, flavor="hydra", passed=()):
        """The MPI launcher's arguments that start ranks on the first hosts
        (``slots`` each): hydra's, or Open MPI's (``flavor="openmpi"``, which
        passes on only the variables ``passed`` names)."""
        if flavor == "openmpi":
            return ["--host", self.spec(*slots), "--mca", "plm_rsh_agent",
                    self.launcher_exec] + [word for name in passed for word in ("-x", name)]
        return ["-hosts", self.spec(*slots), "-launcher", "ssh",
                "-launcher-exec", self.launcher_exec] + _control_interface()

    def tmpi_args(self, *slots):
        """``tmpi wrap``'s arguments for the same."""
        return ["--hosts", self.spec(*slots), "--launcher-exec", self.launcher_exec] + \
            self.interface_args()

    @staticmethod
    def interface_args():
        """``tmpi wrap``'s words for what hydra needs to be told on a machine
        called ``localhost`` (:func:`_control_interface`), if anything."""
        return ["--mpiexec-arg=%s" % word for word in _control_interface()]

    def write_hostfile(self, path, *slots):
        """An MPICH host file (``NAME:SLOTS`` a line) of the first hosts; returns ``path``."""
        Path(path).write_text("".join("%s\n" % word for word in self.spec(*slots).split(",")))
        return path

    def enter(self, name, *command, timeout=60):
        """Run ``command`` on host ``name``; the :class:`subprocess.CompletedProcess`."""
        return _tool("enter", name, *command, check=False, timeout=timeout)

    def host_pids(self, name, ranks_only=False):
        """The pids of the processes on host ``name`` (hydra's proxy and the ranks;
        ``ranks_only``: the MPI ranks alone)."""
        result = _tool("pids", name, *(["--ranks"] if ranks_only else []))
        return [int(word) for word in result.stdout.split()]

    def kill_host(self, name, sig=signal.SIGKILL, ranks_only=False):
        """Send ``sig`` to every process on host ``name`` (or to its ranks only);
        returns the pids signalled."""
        pids = self.host_pids(name, ranks_only)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return pids

    def offline(self, name):
        """Cut host ``name`` off: its link drops every packet (what runs there
        runs on, unreachable, and its peers hear nothing), and entering it
        the way hydra does fails (ssh's status 255)."""
        _tool("offline", name)

    def online(self, name):
        """Join host ``name`` to the others again."""
        _tool("online", name)

    def halt(self, name):
        """Host ``name`` goes away for good: it refuses to be entered, all its
        processes are killed (their connections close, so the other hosts and
        hydra see it at once), then it goes offline."""
        _tool("halt", name)

    def link_bytes(self, name):
        """Bytes host ``name`` has sent over its link so far (what this
        machine's end of its veth pair received)."""
        with open("/sys/class/net/veth-%s/statistics/rx_bytes" % name) as handle:
            return int(handle.read())

    def host_path(self, name, path):
        """Where this machine sees ``path`` of host ``name``: a path under ``/tmp``
        is the host's own, any other is the same file everywhere."""
        path = Path(path)
        try:
            inside = path.relative_to("/tmp")
        except ValueError:
            return path
        return Path(_tool("tmpdir", name).stdout.strip()) / inside

    def clean(self):
        """End every process left on the hosts (a stopped one too), and join
        any host a test took offline again."""
        for name in self.names:
            _tool("kill", name, "CONT")
            _tool("kill", name, "KILL")
            self.online(name)


def _refused(text):
    return any(word in text.lower() for word in REFUSALS)


def _hold_lock():
    """The hosts for this module alone: :data:`LOCK` held (released when the
    descriptor closes, or the process dies); waits for another module at most
    :data:`LOCK_TIMEOUT` seconds."""
    handle = open(LOCK, "a")
    deadline = time.monotonic() + LOCK_TIMEOUT
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if time.monotonic() > deadline:
                handle.close()
                pytest.fail("the emulated hosts were still in use by another test module "
                            "(%s held) after %d s" % (LOCK, LOCK_TIMEOUT))
            time.sleep(1)


@pytest.fixture(scope="module")
def emulated_hosts():
    """:class:`EmulatedHosts` of :data:`COUNT` hosts, up for the test module."""
    why = unavailable()
    if why:
        pytest.skip(why)
    held = _hold_lock()
    try:
        yield from _hosts_up()
    finally:
        held.close()


def _hosts_up():
    before = [line.split()[0] for line in _tool("list").stdout.splitlines() if line.strip()]
    count = max(COUNT, len(before))
    made = _tool("up", count, check=False)
    if made.returncode != 0:
        if not before:
            _tool("down", check=False)
        if _refused(made.stderr):
            pytest.skip("emulated hosts cannot be made here: %s" % made.stderr.strip())
        pytest.fail("tools/emulated-hosts up %d failed (%d): %s" % (
            count, made.returncode, made.stderr.strip()))
    listed = dict(line.split() for line in _tool("list").stdout.splitlines() if line.strip())
    hosts = EmulatedHosts(made.stdout.split(), listed)
    try:
        yield hosts
    finally:
        hosts.clean()
        if not before:
            _tool("down", check=False)


def _control_interface():
    """hydra's proxies reach mpiexec at this machine's hostname, which the
    hosts map to the bridge; a machine called ``localhost`` cannot be
    remapped, so hydra is told the bridge's interface instead."""
    if socket.gethostname().split(".")[0] == "localhost":
        return ["-iface", "tmpibr0"]
    return []
