"""The pieces of ``--hosts`` that need no second machine: the ranks' TCP
channel to the launcher, and reading the hosts (tests/test_hosts.py runs
them across emulated hosts)."""
import os
import socket
import struct
import time

import pytest

from conftest import EXAMPLES, tmpi

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.launch.hosts import HostSet, host_set, parse_hosts, read_hostfile
from tmpi_adapters.process import channel


@pytest.fixture
def server(tmp_path, monkeypatch):
    served = channel.ChannelServer(lambda rank, name: str(tmp_path / ("rank%d.%s" % (rank, name))))
    served.start()
    monkeypatch.setenv(channel.CHANNEL_ENV, served.address())
    monkeypatch.setattr(channel, "_LIFE", None)
    monkeypatch.setattr(channel, "_WARNED", False)
    yield served
    served.close()


def settle(condition, seconds=5.0):
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_a_rank_s_files_stream_and_progress_land_in_the_job_directory(server, tmp_path):
    assert channel.send_file(3, "pid", "4242 hostb")
    assert (tmp_path / "rank3.pid").read_text() == "4242 hostb"  # written before the reply
    fd = channel.stream_descriptor(3, "stderr")
    os.write(fd, b"first line\n\xff\xfe raw bytes\n")
    progress = channel.ProgressSender(3)
    for step in (5, 6, 7):
        progress.write(step)
    assert settle(lambda: (tmp_path / "rank3.progress").exists() and struct.unpack(
        "<q", (tmp_path / "rank3.progress").read_bytes())[0] == 7)
    assert settle(lambda: (tmp_path / "rank3.stderr").exists() and
                  (tmp_path / "rank3.stderr").read_bytes().endswith(b"raw bytes\n"))
    assert (tmp_path / "rank3.stderr").read_bytes() == b"first line\n\xff\xfe raw bytes\n"
    os.close(fd)
    assert 3 in server.joined and not server.gone(3)


def test_the_launcher_sees_a_rank_end_when_its_life_connection_closes(server):
    life = channel.join(1)
    assert settle(lambda: 1 in server.joined)
    assert not server.gone(1)
    life.close()  # what the kernel does when the process ends
    assert settle(lambda: server.gone(1))


def test_a_stranger_without_the_token_writes_nothing(server, tmp_path):
    with socket.create_connection(("127.0.0.1", server.port)) as stranger:
        stranger.sendall(b"TMPI not-the-token 0 file failed\nforged")
    with socket.create_connection(("127.0.0.1", server.port)) as stranger:
        stranger.sendall(b"GET / HTTP/1.0\r\n\r\n")
    time.sleep(0.5)
    assert not list(tmp_path.iterdir())


def test_an_unreachable_launcher_is_said_once_and_costs_one_wait(monkeypatch, capfd):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now
    monkeypatch.setenv(channel.CHANNEL_ENV, "127.0.0.1:%d:token" % port)
    monkeypatch.setattr(channel, "_LIFE", None)
    monkeypatch.setattr(channel, "_WARNED", False)
    assert not channel.send_file(2, "done", "")
    assert channel.stream_descriptor(2, "stderr") is None
    said = capfd.readouterr().err
    assert said.count("tmpi: warning: rank 2") == 1 and "cannot reach its launcher" in said


def test_hosts_in_both_host_file_formats_and_on_the_command_line(tmp_path):
    assert [repr(h) for h in parse_hosts("a:4,b")] == ["a:4", "b:1"]
    mpich = tmp_path / "mpich"
    mpich.write_text("# nodes\na:2\nb   # one slot\n")
    openmpi = tmp_path / "openmpi"
    openmpi.write_text("a slots=2 max_slots=4\nb\n")
    assert [repr(h) for h in read_hostfile(str(mpich))] == ["a:2", "b:1"]
    assert [repr(h) for h in read_hostfile(str(openmpi))] == ["a:2", "b:1"]
    # Open MPI's format lists a host once a line, a slot each unless told.
    repeated = tmp_path / "repeated"
    repeated.write_text("a\na\nb slots=2\n")
    assert [repr(h) for h in host_set(hostfile=str(repeated)).hosts] == ["a:2", "b:2"]
    hosts = host_set(hosts="a:2,b:1,a:1", launcher_exec="enter-host")
    assert hosts.describe() == "a:3,b:1" and hosts.slots == 4
    assert hosts.mpiexec_args("hydra") == ["-hosts", "a:3,b:1", "-launcher", "ssh",
                                           "-launcher-exec", "enter-host"]
    assert hosts.mpiexec_args("openmpi", ["TMPI_OPTIONS"]) == [
        "--host", "a:3,b:1", "--mca", "plm_rsh_agent", "enter-host", "-x", "TMPI_OPTIONS"]


@pytest.mark.parametrize("make, words", [
    (lambda tmp: host_set(hosts="a:0"), "whole number >= 1"),
    (lambda tmp: host_set(hosts=","), "an empty entry"),
    (lambda tmp: host_set(hosts="a:2,,b:2"), "an empty entry"),
    (lambda tmp: host_set(hosts="a:"), "'a:' has no number of ranks after the colon"),
    (lambda tmp: host_set(hosts=":2"), "':2' names no host before the colon"),
    (lambda tmp: host_set(hosts="-oProxyCommand=x:2"), "is not a host name"),
    (lambda tmp: host_set(hosts="node 1:2"), "is not a host name"),
    (lambda tmp: (tmp / "f").write_text("a:2\nb:\n") and host_set(hostfile=str(tmp / "f")),
     "line 2: 'b:' has no number of ranks"),
    (lambda tmp: (tmp / "f").write_text(":2\n") and host_set(hostfile=str(tmp / "f")),
     "line 1: ':2' names no host"),
    (lambda tmp: (tmp / "f").write_text("a slots=\n") and host_set(hostfile=str(tmp / "f")),
     "line 1: the ranks of a host must be a whole number >= 1, not ''"),
    (lambda tmp: (tmp / "f").write_text("a:2 slots=3\n") and host_set(hostfile=str(tmp / "f")),
     "line 1: 'a:2 slots=3' is neither"),
    (lambda tmp: host_set(hosts="a", hostfile="f"), "give one of them"),
    (lambda tmp: host_set(launcher_exec="x"), "name them too"),
    (lambda tmp: host_set(hostfile=str(tmp / "missing")), "cannot be read"),
    (lambda tmp: (tmp / "bad").write_text("a cores=2\n") and host_set(hostfile=str(tmp / "bad")),
     "line 1"),
])
def test_hosts_that_cannot_be_used_are_refused_clearly(tmp_path, make, words):
    with pytest.raises(TmpiError) as refused:
        make(tmp_path)
    assert words in str(refused.value)


def test_a_host_that_does_not_answer_is_left_out(tmp_path):
    enter = tmp_path / "enter"
    enter.write_text("#!/bin/sh\n[ \"$1\" = gone ] && { echo 'no route to host' >&2; exit 255; }\n"
                     "exit 0\n")
    enter.chmod(0o755)
    hosts = HostSet(parse_hosts("here:2,gone:2"), launcher_exec=str(enter))
    dropped = hosts.drop_unreachable()
    assert [(h.name, "no route to host" in why) for h, why in dropped] == [("gone", True)]
    assert hosts.describe() == "here:2" and hosts.slots == 2


#: A program that enters no host, failing as ssh does for a name it cannot
#: resolve; called by hydra as ``enter -x HOST COMMAND``, by tmpi as ``enter HOST true``.
UNRESOLVED = """#!/bin/sh
for word in "$@"; do case "$word" in -*) ;; *) host=$word; break;; esac; done
echo "enter: Could not resolve hostname $host: Name or service not known" >&2
exit 255
"""


@pytest.mark.mpi
def test_hosts_that_cannot_be_entered_are_one_line_of_tmpis_not_the_launchers(tmp_path):
    # Real mpiexec, whose proxies the program cannot start: its own words
    # reach the user once, inside tmpi's line naming each host, the last line.
    enter = tmp_path / "enter"
    enter.write_text(UNRESOLVED)
    enter.chmod(0o755)
    result = tmpi("wrap", "--hosts", "a:1,b:1", "--launcher-exec", enter,
                  EXAMPLES / "theano_mlp" / "train.py", "--epochs", "1", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [lines[-1]] and lines[-1].startswith(
        "tmpi: the ranks could not be started: host a cannot be reached (enter a true: status "
        "255: enter: Could not resolve hostname a: Name or service not known); host b "), \
        result.stderr


@pytest.mark.parametrize("words, said", [
    (["--hosts", "a:1,b:1", "-n", "3"], "-n 3 is more ranks than the 2 that --hosts"),
    (["--launcher-exec", "enter-host"], "name them too"),
    (["--hosts", "a:2", "--hostfile", "f"], "give one of them"),
    (["--hosts", "h1:"], "'h1:' has no number of ranks after the colon"),
    (["--hosts", ":2"], "':2' names no host before the colon"),
    # A host named twice is one host with the slots added, as hydra counts them.
    (["--hosts", "a:2,a:2", "-n", "5"], "-n 5 is more ranks than the 4 that --hosts/--hostfile "
                                         "name (a:4)"),
])
def test_the_command_line_refuses_hosts_it_cannot_use_before_starting(words, said):
    result = tmpi("wrap", *words, EXAMPLES / "theano_mlp" / "train.py", "--epochs", "1")
    assert result.returncode == 2, result.stderr
    assert said in result.stderr and "Traceback" not in result.stderr
