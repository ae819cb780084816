"""An emulated network link between 2 MPI ranks on one Linux host.

The network part of `tmpi bench` (:mod:`tmpi_adapters.bench.remote`) runs its
two ranks across this link.  Each rank runs in a network namespace of its own
(``tmpibench-<pid>-<rank>``); the two are joined by a veth pair, or, when a
one-way delay is asked for, by two TAP devices and the userspace delay line
of :mod:`tmpi_adapters.bench.delayline` (this kernel has no netem).  The
egress of each end is shaped with a ``tbf`` qdisc, so both directions carry
the rate at once (full duplex).  Addresses exist only inside the namespaces:
nothing on the host's own interfaces changes.

MPICH must be told that the ranks are not local, or every byte still goes
through shared memory (a network namespace does not separate ``/dev/shm``):
:attr:`Link.env` makes every rank remote (``MPIR_CVAR_NOLOCAL``) and UCX use
TCP on the link's interface only.  Hydra's PMI descriptor survives ``ip netns
exec``, so ``mpiexec``'s MPMD form starts each rank in its namespace
(:meth:`Link.mpiexec_argv`).

Everything is removed when the ``with`` block ends, and by a reaper process
(``python -m tmpi_adapters.bench.network --reap PID``) when the process that
made the link dies without ending it (``kill -9``).  Needs root, iproute2's
``ip`` and ``tc``, and for a delay a C compiler and ``/dev/net/tun``;
:func:`unavailable` says what is missing.

How faithful the link is depends on spare CPU: the kernel's TCP copies cost
about 1 CPU-second per GB, so on 2 cores 10 Gbit/s in both directions at
once is CPU-bound (0.6-0.9 GB/s per direction of the 1.2 nominal), while 5
Gbit/s comes within 10-15 % and 2 Gbit/s within 4-9 % of the ring-allreduce
floor.  The network part therefore measures the link as it performs
(:func:`~tmpi_adapters.bench.remote.fidelity`) and says which rate to trust.
"""
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

from tmpi_adapters.bench import delayline
from tmpi_adapters.errors import TmpiError

#: Namespaces are ``<PREFIX>-<pid>-<rank>``; the interface in each is ``PREFIX``.
PREFIX = "tmpibench"
SUBNET = "10.201.0"
#: tbf's bucket holds at least two 64 KB GSO frames (a VM's timers wake tbf
#: 20-50 µs late: with one frame every late wake-up is lost rate) and at
#: least 200 µs of tokens.
MIN_BURST = 150000
#: tbf's queue holds at least 8 MB: TCP small queues park up to 4 MB of one
#: socket in the qdisc, and a dropped tail segment costs a 200 ms timeout.
MIN_QUEUE = 8 << 20


def _ip(*args, check=True):
    result = subprocess.run(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    if check and result.returncode != 0:
        raise TmpiError("%s failed: %s" % (" ".join(args), (result.stderr or
                                                            result.stdout).strip()))
    return result


def parse_rate(text):
    """``"10gbit"`` -> 1e10 bits/s (tc's units; ``"bps"`` is bytes/s)."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([kmgt]?)(bit|bps)\s*", str(text).lower())
    if not match:
        raise TmpiError("cannot read the rate %r: write it as tc does, e.g. 10gbit, 500mbit"
                        % (text,))
    value = float(match.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}[
        match.group(2)]
    return value * (8 if match.group(3) == "bps" else 1)


def parse_time(text):
    """``"50us"`` -> 5e-5 seconds; ``"0"`` -> 0."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*(s|ms|us|ns)?\s*", str(text).lower())
    if not match:
        raise TmpiError("cannot read the delay %r: write it as e.g. 50us, 1ms, 0" % (text,))
    return float(match.group(1)) * {None: 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6,
                                    "ns": 1e-9}[match.group(2)]


def goodput_fraction(mtu=1500):
    """TCP payload per byte tbf charges (IPv4 and TCP headers with timestamps,
    the 14-byte Ethernet header): 1448/1514 at MTU 1500."""
    return (mtu - 52.0) / (mtu + 14.0)


def unavailable(delay_s=0.0):
    """Why no link can be made here (a sentence), or ``None``."""
    if os.geteuid() != 0:
        return ("not root: the emulated link needs network namespaces, veth pairs and tc "
                "qdiscs (run `sudo tmpi bench` or as root)")
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return "`%s` (iproute2) is not installed" % tool
    listed = _ip("ip", "netns", "list", check=False)
    if listed.returncode != 0:
        return "`ip netns` is unavailable here: %s" % listed.stderr.strip()
    if delay_s:
        return delayline.unavailable()
    return None


def _namespaces():
    return [line.split()[0] for line in _ip("ip", "netns", "list", check=False)
            .stdout.splitlines() if line.strip()]


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove(owner=None):
    """Delete the namespaces of ``owner`` (a pid), or of every owner that is
    gone; their veth and TAP devices go with them."""
    pattern = re.compile(r"%s-(\d+)-\d+$" % PREFIX)
    for name in _namespaces():
        match = pattern.match(name)
        if match and (int(match.group(1)) == owner if owner is not None
                      else not _alive(int(match.group(1)))):
            _ip("ip", "netns", "del", name, check=False)


class Link:
    """A shaped link between two namespaces, one rank in each.

    Attributes
    ----------
    namespaces, addresses : list of str
        Per rank.
    ifname : str
        The link's interface (the same name in both namespaces).
    rate_bps : float or None
        Per direction; ``None``: unshaped.
    delay_s : float
        One-way delay added (by the delay line).
    env : dict
        What every rank's environment needs so MPI uses the link.
    """

    def __init__(self, rate_bps, delay_s, mtu):
        owner = os.getpid()
        self.namespaces = ["%s-%d-%d" % (PREFIX, owner, rank) for rank in range(2)]
        self.addresses = ["%s.%d" % (SUBNET, rank + 1) for rank in range(2)]
        self.ifname = PREFIX
        self.rate_bps, self.delay_s, self.mtu = rate_bps, delay_s, mtu
        self.line = None
        self.line_stats = None
        self.env = {"MPIR_CVAR_NOLOCAL": "1",      # every rank remote: no MPICH shared memory
                    "MPIR_CVAR_CH4_NETMOD": "ucx",
                    "UCX_TLS": "tcp",              # no UCX shared memory or CMA either
                    "UCX_NET_DEVICES": self.ifname}

    @property
    def goodput(self):
        """Bytes of TCP payload per second one direction carries at the rate."""
        return self.rate_bps / 8 * goodput_fraction(self.mtu) if self.rate_bps else None

    def rank_prefix(self, rank):
        """The command prefix that runs a program in ``rank``'s namespace."""
        return ["ip", "netns", "exec", self.namespaces[rank]]

    def mpiexec_argv(self, mpiexec, commands):
        """``mpiexec``'s MPMD command line: rank r runs ``commands[r]`` in its namespace."""
        argv = [mpiexec]
        for key, value in sorted(self.env.items()):
            argv += ["-genv", key, value]
        for rank, command in enumerate(commands):
            argv += ([":"] if rank else []) + ["-n", "1"] + self.rank_prefix(rank) + list(command)
        return argv

    def counters(self):
        """Bytes each namespace's interface sent and received."""
        found = {}
        for ns in self.namespaces:
            info = json.loads(_ip("ip", "-n", ns, "-s", "-j", "link", "show", "dev",
                                  self.ifname).stdout)[0]
            stats = info.get("stats64") or info["stats"]
            found[ns] = {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"]}
        return found

    def describe(self):
        return {"rate_bps": self.rate_bps, "one_way_delay_s": self.delay_s, "mtu": self.mtu,
                "path": "TAP + delay line" if self.delay_s else "veth",
                "shaping": "tbf on both ends" if self.rate_bps else None,
                "goodput_bytes_per_s": self.goodput, "env": self.env,
                "namespaces": self.namespaces, "addresses": self.addresses}

    # -- making and removing it ----------------------------------------------------
    def _shape(self, ns):
        if not self.rate_bps:
            return
        tokens = self.rate_bps / 8
        burst = max(MIN_BURST, int(tokens * 200e-6))
        queue = max(MIN_QUEUE, int(tokens * 5e-3) + burst)
        _ip("tc", "-n", ns, "qdisc", "replace", "dev", self.ifname, "root", "tbf", "rate",
            "%dbit" % int(self.rate_bps), "burst", str(burst), "limit", str(queue))

    def _wait_up(self, timeout=5.0):
        # UCX ignores an interface until the kernel marks it running, which
        # happens a moment after `ip link set up`.
        deadline = time.monotonic() + timeout
        for ns in self.namespaces:
            while True:
                info = json.loads(_ip("ip", "-n", ns, "-j", "link", "show", "dev",
                                      self.ifname).stdout)[0]
                if "LOWER_UP" in info.get("flags", []):
                    break
                if time.monotonic() > deadline:
                    raise TmpiError("the link's interface in %s did not come up" % ns)
                time.sleep(0.02)

    def create(self):
        for ns in self.namespaces:
            _ip("ip", "netns", "add", ns)
            _ip("ip", "-n", ns, "link", "set", "lo", "up")
        if self.delay_s:
            self.line = delayline.start(self.namespaces, self.ifname, self.delay_s)
            for ns in self.namespaces:
                _ip("ip", "-n", ns, "link", "set", self.ifname, "mtu", str(self.mtu))
        else:
            _ip("ip", "link", "add", self.ifname, "netns", self.namespaces[0], "mtu",
                str(self.mtu), "type", "veth", "peer", "name", self.ifname, "netns",
                self.namespaces[1], "mtu", str(self.mtu))
        for ns, address in zip(self.namespaces, self.addresses):
            _ip("ip", "-n", ns, "addr", "add", address + "/24", "dev", self.ifname)
            _ip("ip", "-n", ns, "link", "set", self.ifname, "up")
            self._shape(ns)
        self._wait_up()
        if self.delay_s:  # resolve ARP now, not in the first timed message
            _ip(*self.rank_prefix(0), sys.executable, "-c",
                "import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM)"
                ".sendto(b'x', (%r, 9))" % self.addresses[1], check=False)
            time.sleep(0.05)

    def destroy(self):
        if self.line is not None:
            self.line_stats = delayline.stop(self.line)
            self.line = None
        remove(os.getpid())


class _Reaper:
    """A process that removes this process's namespaces once it dies.

    It waits for its standard input to close, which happens when this
    process ends however it ends, and runs in a session of its own so that
    the Ctrl-C or kill of this process's group does not end it first.
    """

    def __enter__(self):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tmpi_adapters.bench.network", "--reap", str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
        return self

    def __exit__(self, *exc):
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass  # it finishes on its own
        return False


@contextlib.contextmanager
def shaped_link(rate=None, delay=0.0, mtu=1500):
    """A :class:`Link` of ``rate`` (``"10gbit"``; ``None``: unshaped) and one-way
    ``delay`` (``"50us"`` or seconds), removed when the block ends."""
    rate_bps = parse_rate(rate) if rate else None
    delay_s = parse_time(delay) if isinstance(delay, str) else float(delay or 0.0)
    why = unavailable(delay_s)
    if why:
        raise TmpiError(why)
    remove()  # what runs killed before their reaper could act left behind
    link = Link(rate_bps, delay_s, mtu)
    with _Reaper():
        try:
            link.create()
            yield link
        finally:
            link.destroy()


def _reap(owner):
    """``--reap PID``: wait until standard input closes, then remove ``PID``'s namespaces."""
    try:
        sys.stdin.buffer.read()
    finally:
        remove(owner)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--reap":
        _reap(int(sys.argv[2]))
    else:
        sys.exit("usage: python -m tmpi_adapters.bench.network --reap PID")
