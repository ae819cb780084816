"""Ranks on several hosts: emulated hosts on this machine (tests/hosts.py).

First the harness itself, with plain mpiexec and mpi4py: ranks run on the
hosts hydra is told, each under its host's name and with its host's own
``/tmp``, and talk to each other across the bridge.  Then tmpi across hosts
(``tmpi wrap --hosts ... --launcher-exec tools/emulated-hosts``): a Theano, a
Keras and a Lasagne script give the one-host numbers; a job whose host's
ranks are killed is restarted and still gives the uninterrupted result, and
so does one whose host goes away for good (the restart runs on the hosts
left); a host whose ranks are stopped is reported as a stall.

Every test is skipped, saying why, where the hosts cannot be made (not
root, namespaces refused).
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import (EXAMPLES, MPI_FLAVOR, MPIEXEC, ROOT, SCRIPTS, assert_close, check, rank_env,
                      run, tmpi)
from hosts import emulated_hosts  # noqa: F401 (the fixture)
from test_reliability import START_TIMEOUT, Job, own_lines

MLP = EXAMPLES / "theano_mlp" / "train.py"
RESTART = SCRIPTS / "reliability_restart.py"
#: The numbers across hosts and on one host agree to this (float64).
RTOL = 1e-10

#: What each rank sees; rank 0 prints them all, one JSON line (hydra
#: interleaves what ranks on different hosts print at once).
PROBE = """\
import json, os, socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
seen = comm.gather({"rank": comm.rank, "size": comm.size, "host": socket.gethostname(),
                    "node": MPI.Get_processor_name(), "sum": comm.allreduce(comm.rank),
                    "tmp": sorted(os.listdir("/tmp")), "cwd": os.getcwd(),
                    "marker": os.environ.get("TMPI_HOSTS_TEST_MARKER")})
if comm.rank == 0:
    print(json.dumps(seen), flush=True)
"""


@pytest.fixture
def hosts(emulated_hosts):  # noqa: F811 (the fixture of hosts.py)
    """The emulated hosts, with nothing left running on them after the test."""
    yield emulated_hosts
    emulated_hosts.clean()


def probe(hosts, *slots, env=None):
    """PROBE on the first hosts (``slots`` ranks each) under plain mpiexec:
    ``{rank: what it saw}``."""
    n = sum(slots)
    result = check(run([MPIEXEC, "-n", str(n)] + placed(hosts, *slots) +
                       [sys.executable, "-c", PROBE], env=env, timeout=120))
    [seen] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("[")]
    assert sorted(s["rank"] for s in seen) == list(range(n)), result.stdout
    return {s["rank"]: s for s in seen}


def placed(hosts, *slots):
    """The venv's MPI launcher's words for ranks on the first hosts (``slots``
    each); Open MPI is told which variables of this test to pass on (hydra
    passes them all)."""
    return hosts.mpiexec_args(*slots, flavor=MPI_FLAVOR, passed=[
        "TMPI_HOSTS_TEST_MARKER", "UCX_PROTO_INFO", "PYTHONPATH", "THEANO_FLAGS"])


# -- the harness -------------------------------------------------------------------------

@pytest.mark.mpi
def test_harness_ranks_run_on_their_hosts_each_with_its_own_tmp(hosts, tmp_path):
    marks = {}
    for name in hosts.names[:2]:
        marks[name] = "tmpi-hosts-test-%s-%d" % (name, os.getpid())
        entered = hosts.enter(name, "sh", "-c", "hostname; touch /tmp/%s" % marks[name])
        assert entered.returncode == 0 and entered.stdout.strip() == name, entered
    try:
        seen = probe(hosts, 2, 2, env=rank_env(TMPI_HOSTS_TEST_MARKER="passed on"))
        for rank, what in seen.items():
            host = hosts.names[rank // 2]
            other = hosts.names[1 - rank // 2]
            assert what["host"] == host and what["node"] == host, what
            assert what["size"] == 4 and what["sum"] == 6, what
            # The host's own /tmp, as the file entering it left it, and no other.
            assert marks[host] in what["tmp"] and marks[other] not in what["tmp"], what
            # mpiexec's environment and directory reach the ranks (hydra passes them).
            assert what["marker"] == "passed on" and what["cwd"] == str(ROOT), what
        for name, mark in marks.items():
            assert not os.path.exists("/tmp/" + mark)  # not this machine's /tmp either
            assert hosts.host_path(name, "/tmp/" + mark).exists()
    finally:
        for name, mark in marks.items():
            hosts.enter(name, "rm", "-f", "/tmp/" + mark)


@pytest.mark.mpi
def test_harness_three_hosts_and_an_uneven_placement(hosts):
    seen = probe(hosts, 1, 1, 2)
    assert [seen[r]["host"] for r in range(4)] == [hosts.names[0], hosts.names[1],
                                                   hosts.names[2], hosts.names[2]]
    assert {s["sum"] for s in seen.values()} == {6}


#: 4 allreduces of 25 MB among 2 hosts x 2 ranks, and where MPI saw each rank.
TRAFFIC = """\
import json
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
node = comm.Split_type(MPI.COMM_TYPE_SHARED)
mine, total = np.ones(25 * 2 ** 20 // 8), np.empty(25 * 2 ** 20 // 8)
for _ in range(4):
    comm.Allreduce(mine, total)
seen = comm.gather({"rank": comm.rank, "node": MPI.Get_processor_name(), "shared": node.size,
                    "sum": float(total[0])})
if comm.rank == 0:
    print(json.dumps(seen), flush=True)
"""


@pytest.mark.mpi
def test_harness_mpi_traffic_between_hosts_crosses_their_links(hosts):
    """Each host is a node of its own to MPI: shared memory among the ranks
    of a host only, and the bytes between hosts go over their links (which
    is what makes a link cut or slowed a test of anything).  Where MPI runs
    on UCX, UCX says so too: inter-node protocols over TCP on eth0."""
    first, second = hosts.names[:2]
    before = {name: hosts.link_bytes(name) for name in (first, second)}
    result = check(run([MPIEXEC, "-n", "4"] + placed(hosts, 2, 2) +
                       [sys.executable, "-c", TRAFFIC],
                       env=rank_env(UCX_PROTO_INFO="y"), timeout=120))
    sent = {name: hosts.link_bytes(name) - before[name] for name in (first, second)}
    [seen] = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("[{")]
    assert [(s["node"], s["shared"], s["sum"]) for s in seen] == \
        [(first, 2, 4.0)] * 2 + [(second, 2, 4.0)] * 2, seen
    # A ring or tree allreduce sends each host's half out at least once per call.
    print("bytes sent over the links: %s" % sent)
    assert all(bytes_ >= 4 * 25 * 2 ** 20 // 2 for bytes_ in sent.values()), sent
    said = result.stdout + result.stderr
    if "ucp_context" in said:
        assert ucx_transports(said, "inter-node") == {"tcp/eth0"}, said[-3000:]
        assert ucx_transports(said, "intra-node") <= {"sysv/memory", "cma/memory",
                                                      "posix/memory", "tcp/lo"}


def ucx_transports(text, scope):
    """The transports UCX_PROTO_INFO's tables name for ``scope``
    (``inter-node``, ``intra-node``) in ``text``."""
    found, inside = set(), {}
    for line in text.splitlines():
        # The ranks' tables come interleaved: each line names its process.
        process = re.search(r"\] \[(\S+?:\s*\d+)\s*:\d+\]", line)
        if process is None:
            continue
        if "ucp_context" in line:
            inside[process.group(1)] = " %s cfg#" % scope in line
        elif inside.get(process.group(1)):
            match = re.search(r"\|\s*(\w+/\w+)\s*\|\s*$", line)
            if match:
                found.add(match.group(1))
    return found


def test_harness_enters_a_host_as_ssh_would(hosts):
    tool = hosts.launcher_exec
    # hydra's call: ssh's options, the host, the words of a command line.
    result = run([tool, "-x", hosts.names[1], "hostname;", "echo", "$((6", "*", "7))"])
    assert result.returncode == 0 and result.stdout.split() == [hosts.names[1], "42"], result
    # By address too; an unknown host is ssh's status 255.
    result = run([tool, hosts.addresses[hosts.names[0]], "hostname"])
    assert result.stdout.strip() == hosts.names[0], result
    result = run([tool, "-x", "tmpi-no-such-host", "true"])
    assert result.returncode == 255 and "tmpi-no-such-host" in result.stderr, result


@pytest.mark.mpi
def test_harness_stops_and_kills_a_hosts_processes(hosts):
    # Plain mpiexec: two ranks that wait, one on each host.
    process = subprocess.Popen(
        [MPIEXEC, "-n", "2"] + placed(hosts, 1, 1) +
        [sys.executable, "-c", "import time; from mpi4py import MPI; print('up', flush=True); "
                               "time.sleep(120)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=rank_env())
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
                hosts.host_pids(name, ranks_only=True) for name in hosts.names[:2]):
            time.sleep(0.1)
        ranks = {name: hosts.host_pids(name, ranks_only=True) for name in hosts.names[:2]}
        assert all(len(pids) == 1 for pids in ranks.values()), ranks
        everything = hosts.host_pids(hosts.names[1])
        assert set(ranks[hosts.names[1]]) < set(everything)  # and hydra's proxy
        assert hosts.host_pids(hosts.names[2]) == []
        [stopped] = ranks[hosts.names[1]]
        hosts.kill_host(hosts.names[1], signal.SIGSTOP, ranks_only=True)
        deadline = time.monotonic() + 10
        while _state(stopped) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(stopped) == "T"
        hosts.kill_host(hosts.names[1], signal.SIGKILL)
        code = process.wait(timeout=60)
        # Open MPI's launcher says a daemon failed to report back, and exits 0
        # (tmpi's watch does not take that for a success: the ranks did not finish).
        assert code != 0 or MPI_FLAVOR == "openmpi"
        assert hosts.host_pids(hosts.names[1]) == []
    finally:
        process.kill()
        process.communicate()


def _state(pid):
    with open("/proc/%d/stat" % pid) as handle:
        return handle.read().rsplit(")", 1)[1].split()[0]


# -- tmpi across hosts -------------------------------------------------------------------

def finals(stdout):
    """``{label: [numbers]}`` of every ``final LABEL NUMBERS`` line."""
    found = {}
    for line in stdout.splitlines():
        if line.startswith("final "):
            words = line.split()[1:]
            numbers = [w for w in words if re.fullmatch(r"[-+]?\d+(\.\d*)?([eE][-+]?\d+)?|nan",
                                                        w)]
            found[" ".join(w for w in words if w not in numbers)] = [float(n) for n in numbers]
    assert found, stdout[-3000:]
    return found


def keras_env():
    return rank_env("float64", KERAS_BACKEND="theano")


# Each: script and arguments, its environment, the slots on each host (the
# same number of ranks on one host is the reference), and how the hosts are
# named (--hosts, or a --hostfile).
ACROSS = {
    "theano": ([MLP, "--epochs", "3", "--batch-size", "50", "--seed", "7"], rank_env,
               (2, 2), "hosts"),
    "keras": ([SCRIPTS / "keras_mlp.py", "--floatx", "float64", "--cases", "sgd-fit",
               "--epochs", "4"], keras_env, (2, 1), "hosts"),
    "lasagne": ([SCRIPTS / "lasagne_mnist.py", "mlp", "3"], rank_env, (1, 1), "hostfile"),
}


@pytest.mark.mpi
@pytest.mark.parametrize("framework", sorted(ACROSS))
def test_a_script_on_two_hosts_gives_the_one_host_numbers(hosts, framework, tmp_path):
    script, env, slots, named = ACROSS[framework]
    where = hosts.tmpi_args(*slots) if named == "hosts" else [
        "--hostfile", hosts.write_hostfile(tmp_path / "hosts", *slots),
        # hydra's rsh launcher calls the program as its ssh launcher does.
        "--launcher", "rsh", "--launcher-exec", hosts.launcher_exec] + hosts.interface_args()
    across = tmpi("wrap", *where, *script, env=env())
    check(across)
    # -n is the hosts' slots: every host ran its share.
    said = across.stdout + across.stderr
    assert "on %d rank(s)" % sum(slots) in said, said[-3000:]
    one = check(tmpi("wrap", "-n", str(sum(slots)), *script, env=env()))
    got, expected = finals(across.stdout), finals(one.stdout)
    assert sorted(got) == sorted(expected)
    for label in expected:
        print("%s %s: hosts %s\n    one host %s" % (framework, label, got[label],
                                                    expected[label]))
        assert_close(got[label], expected[label], RTOL)


@pytest.mark.mpi
def test_files_a_script_writes_and_reads_back_stay_on_each_host(hosts, tmp_path):
    """No shared file system: rank 0 writes the script's files on its host, the
    other host's first rank writes its own copies (which its ranks read
    back), and the numbers are the one-process numbers."""
    script = SCRIPTS / "transparency_files_checkpoint.py"
    env = rank_env("float64")
    env["THEANO_FLAGS"] += ",cxx="
    one = finals(check(tmpi("wrap", "-n", "1", script, tmp_path / "one", env=env)).stdout)
    out = "/tmp/files-%d" % os.getpid()  # each host's own /tmp
    across = check(tmpi("wrap", *hosts.tmpi_args(1, 1), script, out, env=env))
    assert finals(across.stdout) == one
    assert one["files read back True, log lines"] == [3]
    first, second = (hosts.host_path(name, out) for name in hosts.names[:2])
    assert sorted(p.name for p in first.iterdir()) == [
        "W.npy", "best_model.pkl", "checkpoint.pkl", "log.txt", "master.npz", "master.txt"]
    assert len((first / "log.txt").read_text().splitlines()) == 3
    # Rank 1's host has what the script reads back there, not rank 0's own files.
    assert not {"master.npz", "master.txt"} & {p.name for p in second.iterdir()}
    assert not os.path.exists(out)  # nor the launcher's machine's


#: Steps of reliability_restart.py for the restart tests: the job still
#: trains when the first checkpoint (step 500) is in, on 4 ranks sharing 2 cores.
STEPS = "4000"


@pytest.fixture(scope="module")
def uninterrupted():
    """The final parameters of reliability_restart.py on 4 ranks of one host."""
    return finals(check(tmpi("wrap", "-n", "4", RESTART, STEPS)).stdout)["params"]


def restarted(hosts, tmp_path, fail_host):
    """reliability_restart.py on 2 hosts x 2 ranks with restarts, ``fail_host(name)``
    done to the second host once rank 0 (on the first) wrote a checkpoint:
    ``(status, stdout, stderr)``, restarts included."""
    first, second = hosts.names[:2]
    # Rank 0 writes the checkpoints on its own host: a directory under /tmp is
    # that host's, and it is still there when the restarted job enters it.
    directory = tmp_path / "ck"
    job = Job("wrap", *hosts.tmpi_args(2, 2), "--checkpoint-dir", directory,
              "--checkpoint-every", "500", "--max-restarts", "2", "--min-ranks", "2",
              RESTART, STEPS)
    try:
        job.wait_for_checkpoint(hosts.host_path(first, directory))
        fail_host(second)
        code, stdout, stderr = job.finish(timeout=START_TIMEOUT)
    finally:
        job.kill()
    return code, stdout, own_lines(stderr)


@pytest.mark.mpi
def test_a_host_whose_ranks_are_killed_is_restarted_and_the_result_is_the_uninterrupted_one(
        hosts, tmp_path, uninterrupted):
    second = hosts.names[1]

    killed = []

    def kill_ranks(name):
        killed.extend(hosts.kill_host(name, signal.SIGKILL, ranks_only=True))
        assert len(killed) == 2

    code, stdout, stderr = restarted(hosts, tmp_path, kill_ranks)
    assert code == 0, stderr[-3000:]
    # Every rank found dead is named: the whole host.
    [named] = [line for line in stderr.splitlines()
               if "was killed by" in line and not line.startswith("tmpi: restart")]
    match = re.match(r"tmpi: every rank of %s \(ranks 2-3, pids (\d+), (\d+)\) was killed by "
                     r"signal 9 \(SIGKILL\): " % second, named)
    assert match and sorted(map(int, match.groups())) == sorted(killed), named
    restarts = [line for line in stderr.splitlines() if line.startswith("tmpi: restart ")]
    assert len(restarts) == 1, stderr[-3000:]
    assert restarts[0].startswith("tmpi: restart 1 of 2 (every rank of %s (ranks 2-3) was "
                                  "killed by signal 9 (SIGKILL) at step " % second), restarts
    assert "tmpi: the job was restarted 1 time(s); " in stderr
    assert_close(finals(stdout)["params"], uninterrupted, RTOL)


@pytest.mark.mpi
@pytest.mark.parametrize("which", ["one rank", "every rank"])
def test_every_rank_found_dead_is_named_and_no_other(hosts, which):
    """A rank's own supervisor (its parent on its host) says which signal
    killed it; ranks that hydra tears down afterwards are not named, and
    ranks that crashed meanwhile are named as such."""
    second = hosts.names[1]
    job = Job("wrap", *hosts.tmpi_args(2, 2), RESTART, "100000000")
    try:
        job.wait_for_output("step 500")
        ranks = hosts.host_pids(second, ranks_only=True)
        assert len(ranks) == 2, ranks
        killed = ranks if which == "every rank" else ranks[:1]
        for pid in killed:
            os.kill(pid, signal.SIGKILL)
        code, stdout, stderr = job.finish(timeout=120)
    finally:
        job.kill()
    stderr = own_lines(stderr)
    said = [line for line in stderr.splitlines() if line.startswith("tmpi: ")]
    assert code == 128 + 9 and len(said) == 1, stderr[-3000:]
    if which == "every rank":
        match = re.match(r"tmpi: every rank of %s \(ranks 2-3, pids (\d+), (\d+)\) was killed "
                         r"by signal 9 \(SIGKILL\): killed from outside" % second, said[0])
        assert match and sorted(map(int, match.groups())) == sorted(killed), said
    else:
        match = re.match(r"tmpi: rank [23] \(pid %d on %s\) was killed by signal 9 "
                         r"\(SIGKILL\): killed from outside" % (killed[0], second), said[0])
        assert match, said
    # Ranks MPI made crash when it lost them are said to be that, not killed.
    rest = said[0].split(". The other ranks were stopped.")[0].split(";")[1:]
    assert all(re.fullmatch(r" ranks? [-, 0-9]+ crashed meanwhile with signal \d+ \(SIG\w+\), "
                            r"most likely inside MPI on losing (it|them)", part)
               for part in rest), said


@pytest.mark.mpi
def test_a_host_that_goes_away_leaves_the_job_to_the_other_hosts(hosts, tmp_path,
                                                                  uninterrupted):
    first, second = hosts.names[:2]
    code, stdout, stderr = restarted(hosts, tmp_path, hosts.halt)
    assert code == 0, stderr[-3000:]
    assert "host %s is gone" % second in stderr, stderr[-3000:]
    assert "the restart runs on %s:2 (--min-ranks 2)" % first in stderr, stderr[-3000:]
    assert stderr.count("tmpi: restart ") == 1, stderr[-3000:]
    assert "on 2 rank(s)" in stderr, stderr[-3000:]
    # Two ranks instead of four: the same sums, in another order (as
    # tests/test_reliability_restart.py's --min-ranks test allows).
    assert_close(finals(stdout)["params"], uninterrupted, 1e-8)


@pytest.mark.mpi
def test_a_host_whose_ranks_are_stopped_is_reported_as_a_stall(hosts):
    second = hosts.names[1]
    job = Job("wrap", *hosts.tmpi_args(2, 2), "--stall-timeout", "3", "--on-stall", "abort",
              RESTART, "100000000")
    try:
        job.wait_for_output("step 500")
        stopped = hosts.kill_host(second, signal.SIGSTOP, ranks_only=True)
        assert len(stopped) == 2, stopped
        code, stdout, stderr = job.finish(timeout=120)
    finally:
        hosts.clean()
        job.kill()
    stderr = own_lines(stderr)
    assert code != 0, stderr[-3000:]
    assert stderr.count("tmpi: stall:") == 1, stderr[-3000:]
    report = stderr[stderr.index("tmpi: stall:"):]
    report = report[:report.index("\n", report.index("Ending the job (--on-stall abort)"))]
    # The stopped ranks are among those that have not reached the collective
    # (a rank of the first host may be a step ahead of the one reporting),
    # they are silent, and the report says which host they are on.
    missing = re.search(r"; (ranks? [-, 0-9]+) ha(s|ve) not reached it\.", report)
    assert missing and {2, 3} <= set(ranks_in(missing.group(1))), report
    silent = [line for line in report.splitlines() if "last heard" in line]
    assert {2, 3} <= {r for line in silent for r in ranks_in(line.split(":")[0])}, report
    assert second in report, report
    assert "final params" not in stdout


@pytest.mark.mpi
@pytest.mark.parametrize("how", ["unknown", "offline"])
def test_a_host_that_cannot_be_reached_is_named_with_the_launchers_reason(hosts, how):
    first, second = hosts.names[:2]
    if how == "offline":
        hosts.offline(second)
        target, reason = second, "No route to host"
    else:
        target, reason = "tmpi-h99", "Could not resolve emulated host tmpi-h99"
    try:
        result = tmpi("wrap", "--hosts", "%s:1,%s:1" % (first, target), "--launcher-exec",
                      hosts.launcher_exec, *hosts.interface_args(), RESTART, "10", timeout=120)
    finally:
        hosts.online(second)
    said = [line for line in result.stderr.splitlines() if line.startswith("tmpi: ")]
    assert result.returncode == 2, result.stderr[-3000:]
    assert len(said) == 1 and said[0].startswith(
        "tmpi: the ranks could not be started: host %s cannot be reached (emulated-hosts %s "
        "true: status 255: " % (target, target)) and reason in said[0], result.stderr[-3000:]
    assert first not in said[0]


def ranks_in(text):
    """``"ranks 1-3, 5"`` -> ``[1, 2, 3, 5]`` (the watchdog's way of naming ranks)."""
    found = []
    for part in re.sub(r"^\s*ranks?\s*", "", text).split(","):
        low, _, high = part.strip().partition("-")
        found += list(range(int(low), int(high or low) + 1))
    return found
