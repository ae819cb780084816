"""The job's channel: the files of ranks on other machines, over TCP.

A rank leaves its launcher files in the job directory (:mod:`.jobdir`): its
pid and host, its stderr, its training step, how its script ended.  Ranks
on the launcher's machine write them there.  A rank on another machine
(``tmpi wrap --hosts``) has a temporary directory of its own and no shared
file system with the launcher, so it sends the same files over a TCP
connection to the launcher (:class:`ChannelServer`), which writes them into
the job directory: the launcher then watches every rank alike, whatever
machine it runs on.

Each connection starts with one line, ``TMPI <token> <rank> <kind>``
(the token keeps strangers out), and then carries one of:

``life``
    nothing; it closes when the rank's process ends, however it ends (the
    kernel closes it), which tells the launcher the rank is gone.
``file <name>``
    the whole content of ``rank<N>.<name>``, written when the rank closes
    the connection (a mark: ``pid``, ``failed``, ``exit``, ...).
``stream <name>``
    bytes appended to ``rank<N>.<name>`` as they come (the rank's stderr is
    this socket itself, so that what a killed rank wrote still arrives).
``progress``
    the training step, 8 bytes at a time, the newest kept in
    ``rank<N>.progress`` (:class:`~tmpi_adapters.process.jobdir.Progress`).
"""
import errno
import fcntl
import os
import secrets
import select
import socket
import struct
import sys
import threading
import time

#: ``"<address>,<address>...:<port>:<token>"`` of the launcher's channel,
#: in the environment of the ranks it starts with ``--hosts``.
CHANNEL_ENV = "TMPI_JOB_CHANNEL"
#: Seconds a rank tries each of the launcher's addresses.
CONNECT_TIMEOUT = 5.0
#: Seconds within which the launcher notices a host that went away silently.
KEEPALIVE = 30


def own_addresses():
    """This machine's IPv4 addresses, those of its network interfaces first
    and the loopback last: the ranks try them in turn."""
    found = []
    siocgifaddr = 0x8915
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(probe.fileno(), siocgifaddr,
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address on this interface
            found.append(socket.inet_ntoa(packed[20:24]))
    except (OSError, AttributeError):
        pass
    finally:
        probe.close()
    try:
        found += [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                            socket.AF_INET)]
    except OSError:
        pass
    unique = list(dict.fromkeys(found))
    return [a for a in unique if not a.startswith("127.")] + \
        [a for a in unique if a.startswith("127.")] or ["127.0.0.1"]


# ---------------------------------------------------------------- the launcher

class ChannelServer:
    """The launcher's end: accepts the ranks' connections and writes what
    they carry into the files ``path_of(rank, name)`` names, from a thread of
    its own."""

    def __init__(self, path_of):
        self._path_of = path_of
        self.token = secrets.token_hex(8)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.bind(("0.0.0.0", 0))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        #: ``{rank: monotonic time}`` when each rank's life connection closed.
        self.ended = {}
        #: Ranks that opened a life connection.
        self.joined = set()
        self._connections = {}  # socket -> [header bytes, rank, kind, name, body]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def address(self):
        return "%s:%d:%s" % (",".join(own_addresses()), self.port, self.token)

    def start(self):
        self._thread.start()
        return self

    def close(self):
        """Stop serving once what the ranks sent so far is written."""
        self._stop.set()
        self._thread.join(timeout=5)

    def gone(self, rank):
        """True once ``rank`` (which reached the channel) has ended."""
        return rank in self.ended

    def _serve(self):
        try:
            while True:
                stopping = self._stop.is_set()
                sockets = [self._listener] + list(self._connections)
                ready, _, _ = select.select(sockets, [], [], 0.3 if stopping else 0.1)
                for sock in ready:
                    if sock is self._listener:
                        self._accept()
                    else:
                        self._receive(sock)
                if stopping and not ready:
                    break
        finally:
            for sock in list(self._connections):
                self._finish(sock)
            self._listener.close()

    def _accept(self):
        try:
            sock, _ = self._listener.accept()
        except OSError:
            return
        sock.setblocking(False)
        # A host that goes away (powered off, cut off) closes nothing: the
        # kernel's keepalive probes find it within KEEPALIVE seconds.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for option, value in (("TCP_KEEPIDLE", KEEPALIVE // 2), ("TCP_KEEPINTVL", KEEPALIVE // 6),
                              ("TCP_KEEPCNT", 3)):
            if hasattr(socket, option):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
        self._connections[sock] = [b"", None, None, None, []]

    def _receive(self, sock):
        state = self._connections[sock]
        try:
            data = sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._finish(sock)
            return
        if state[1] is None:  # the header line
            state[0] += data
            if b"\n" not in state[0]:
                if len(state[0]) > 4096:
                    self._drop(sock)
                return
            line, data = state[0].split(b"\n", 1)
            words = line.decode("ascii", "replace").split()
            if len(words) < 4 or words[0] != "TMPI" or words[1] != self.token or \
                    not words[2].isdigit():
                self._drop(sock)
                return
            state[1], state[2] = int(words[2]), words[3]
            state[3] = words[4] if len(words) > 4 else None
            if state[2] == "life":
                self.joined.add(state[1])
                self.ended.pop(state[1], None)
            if not data:
                return
        self._take(state, data)

    def _take(self, state, data):
        rank, kind, name, body = state[1], state[2], state[3], state[4]
        if kind == "stream" and name:
            with open(self._path_of(rank, name), "ab") as handle:
                handle.write(data)
        elif kind == "progress":
            body.append(data)
            pending = b"".join(body)
            whole = len(pending) // 8 * 8
            if whole:  # in place: a reader never finds the file short
                fd = os.open(self._path_of(rank, "progress"), os.O_WRONLY | os.O_CREAT, 0o644)
                try:
                    os.pwrite(fd, pending[whole - 8:whole], 0)
                finally:
                    os.close(fd)
            body[:] = [pending[whole:]]
        elif kind == "file":
            body.append(data)

    def _finish(self, sock):
        state = self._connections.get(sock)
        if state is not None and state[1] is not None:
            rank, kind, name = state[1], state[2], state[3]
            if kind == "life":
                self.ended[rank] = time.monotonic()
            elif kind == "file" and name:
                path = self._path_of(rank, name)
                try:
                    with open(path + ".part", "wb") as handle:
                        handle.write(b"".join(state[4]))
                    os.replace(path + ".part", path)
                except OSError:
                    pass
        self._drop(sock)

    def _drop(self, sock):
        self._connections.pop(sock, None)
        try:
            sock.close()
        except OSError:
            pass


# ------------------------------------------------------------------- the ranks

_LIFE = None     # this rank's life connection, open until the process ends
_WARNED = False


def connect(rank, kind, name=None):
    """A connection to the launcher's channel, its header sent, or ``None``
    (said once on stderr) when the launcher cannot be reached."""
    global _WARNED
    if _WARNED:
        return None  # tried and failed: no further waits of CONNECT_TIMEOUT
    addresses, port, token = _parse(os.environ.get(CHANNEL_ENV, ""))
    errors = []
    for address in addresses:
        try:
            sock = socket.create_connection((address, port), timeout=CONNECT_TIMEOUT)
        except OSError as exc:
            errors.append("%s: %s" % (address, os.strerror(exc.errno) if exc.errno else exc))
            continue
        sock.settimeout(None)
        try:
            sock.sendall(("TMPI %s %d %s%s\n" % (token, rank, kind,
                                                  " " + name if name else "")).encode())
        except OSError:
            sock.close()
            continue
        return sock
    if not _WARNED:
        _WARNED = True
        sys.stderr.write("tmpi: warning: rank %d on %s cannot reach its launcher (port %s; "
                         "%s): the launcher will not see this rank's errors or its end. "
                         "Let the hosts reach the launcher's machine over TCP.\n"
                         % (rank, socket.gethostname(), port, "; ".join(errors) or
                            "no address"))
        sys.stderr.flush()
    return None


def _parse(text):
    try:
        addresses, port, token = text.rsplit(":", 2)
        return addresses.split(","), int(port), token
    except ValueError:
        return [], 0, ""


def join(rank):
    """Open this rank's life connection (once)."""
    global _LIFE
    if _LIFE is None:
        _LIFE = connect(rank, "life") or False
    return _LIFE


def send_file(rank, name, text, life=True):
    """Leave ``rank<N>.<name>`` holding ``text`` in the launcher's job directory
    (``life``: the rank's own life connection opened first)."""
    if life:
        join(rank)
    sock = connect(rank, "file", name)
    if sock is None:
        return False
    try:
        sock.sendall(text.encode("utf-8", "replace") if isinstance(text, str) else text)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(CONNECT_TIMEOUT)
        sock.recv(1)  # the launcher closes once it has written the file
    except OSError:
        pass
    finally:
        sock.close()
    return True


def stream_descriptor(rank, name):
    """A descriptor whose bytes are appended to ``rank<N>.<name>`` in the
    launcher's job directory (a socket: put it in place of descriptor 2),
    or ``None``."""
    join(rank)
    sock = connect(rank, "stream", name)
    if sock is None:
        return None
    return sock.detach()


class ProgressSender:
    """:class:`~tmpi_adapters.process.jobdir.Progress` of a rank on another
    machine: each step goes to the launcher, never waiting for it."""

    def __init__(self, rank=0):
        join(rank)
        self._sock = connect(rank, "progress")
        if self._sock is not None:
            self._sock.setblocking(False)

    def write(self, step):
        if self._sock is None:
            return
        try:
            self._sock.send(struct.pack("<q", step))
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EWOULDBLOCK):
                self._sock = None
