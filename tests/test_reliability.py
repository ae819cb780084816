"""A rank that dies ends the whole job, fast, naming the rank; nothing is left running.

Ranks are really killed (SIGKILL) or really fail under the installed mpiexec.
The time from the failure to the end of the job is printed (``-s``); the
tests only bound it generously, timings are not what they judge.
"""
import os
import re
import signal
import subprocess
import threading
import time
import uuid

import pytest

from conftest import EXAMPLES, ROOT, SCRIPTS, TMPI, rank_env

MLP = EXAMPLES / "theano_mlp" / "train.py"
CRASH = SCRIPTS / "reliability_crash.py"

#: Generous bound for a job to end once a rank failed; the target is 15 s.
END_TIMEOUT = 60
#: Bound for a job to start training on a loaded machine (Theano may compile).
START_TIMEOUT = 300

TOKEN_ENV = "TMPI_RELIABILITY_TEST_TOKEN"


class Job:
    """``tmpi ARGS...`` running in the background, its output read as it comes.

    Every process of the job inherits a unique token in its environment, so
    the test can find the ranks (and any process left behind) in ``/proc``.
    """

    def __init__(self, *args, env=None, cwd=ROOT, session=False):
        self.token = uuid.uuid4().hex
        env = dict(env or rank_env())
        env[TOKEN_ENV] = self.token
        self.stdout, self.stderr = [], []
        # As a terminal starts it: Ctrl-C stops it, even where the tests run
        # with SIGINT ignored (in the background).  ``session``: in a process
        # group of its own, which a terminal's Ctrl-C reaches as a whole.
        self.process = subprocess.Popen([TMPI] + [str(a) for a in args], env=env, cwd=cwd,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, start_new_session=session,
                                        preexec_fn=_sigint_default)
        self._readers = [threading.Thread(target=self._read, args=(stream, sink), daemon=True)
                         for stream, sink in ((self.process.stdout, self.stdout),
                                              (self.process.stderr, self.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, sink):
        for line in iter(stream.readline, ""):
            sink.append(line)

    def wait_for_output(self, text, timeout=START_TIMEOUT):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.stdout):
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        self.kill()
        pytest.fail("%r never appeared (exit %s)\n--- stdout\n%s\n--- stderr\n%s" % (
            text, self.process.poll(), "".join(self.stdout)[-3000:],
            "".join(self.stderr)[-3000:]))

    def wait_for_checkpoint(self, directory, timeout=START_TIMEOUT):
        """Wait until a checkpoint file is in ``directory``; fail the test if none comes."""
        deadline = time.monotonic() + timeout
        while not checkpoints(directory) and time.monotonic() < deadline and \
                self.process.poll() is None:
            time.sleep(0.02)
        assert checkpoints(directory), "no checkpoint appeared: %s" % "".join(self.stderr)

    def processes(self):
        """``{pid: environment}`` of every live process carrying this job's token."""
        marker = ("%s=%s" % (TOKEN_ENV, self.token)).encode()
        found = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open("/proc/%s/environ" % entry, "rb") as handle:
                    variables = handle.read().split(b"\0")
                with open("/proc/%s/stat" % entry) as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if marker in variables and state != "Z":
                found[int(entry)] = dict(v.decode("utf-8", "replace").split("=", 1)
                                         for v in variables if b"=" in v)
        return found

    def rank_pid(self, rank):
        """The process that runs the script as ``rank`` (not a supervisor above it)."""
        for pid, env in self.processes().items():
            if rank_of(env) == rank and runs_script(pid):
                return pid
        raise AssertionError("rank %d of the job is not running" % rank)

    def finish(self, timeout=END_TIMEOUT):
        """Wait for the job; returns (exit status, stdout, stderr)."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail("the job did not end within %d s\n--- stderr\n%s"
                        % (timeout, "".join(self.stderr)[-3000:]))
        for reader in self._readers:
            reader.join(timeout=10)
        return code, "".join(self.stdout), "".join(self.stderr)

    def kill(self):
        """Test cleanup: SIGKILL every process of this job (found by its token)."""
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def _sigint_default():
    signal.signal(signal.SIGINT, signal.SIG_DFL)


#: Where MPI launchers name a process's rank: hydra's PMI, Open MPI, PMIx.
RANK_NAMES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def rank_of(env):
    """The rank a launcher gave the process of environment ``env``, or ``None``."""
    for name in RANK_NAMES:
        if env.get(name, "").isdigit():
            return int(env[name])
    return None


def runs_script(pid):
    """True for a process that runs a rank's script (tmpi's runtime)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return b"tmpi_adapters.launch.runtime" in handle.read().split(b"\0")
    except OSError:
        return False


def checkpoints(directory):
    """The checkpoint files in ``directory``, oldest first."""
    return sorted(p for p in os.listdir(directory) if p.endswith(".tmpi")) \
        if os.path.isdir(directory) else []


def own_lines(stderr):
    """stderr without Theano's notes about waiting for its shared compile cache."""
    return "".join(line for line in stderr.splitlines(True) if "compilelock" not in line)


@pytest.mark.mpi
def test_sigkill_of_a_rank_in_a_long_bsp_run_ends_the_job_naming_it():
    job = Job("wrap", "-n", "2", MLP, "--epochs", "100000", "--batch-size", "16")
    try:
        job.wait_for_output("epoch  2/")
        os.kill(job.rank_pid(1), signal.SIGKILL)
        killed = time.monotonic()
        code, stdout, stderr = job.finish()
        elapsed = time.monotonic() - killed
    finally:
        job.kill()
    print("job ended %.2f s after SIGKILL of rank 1" % elapsed)
    assert code != 0
    assert "tmpi: rank 1 (pid" in stderr and "SIGKILL" in stderr, stderr
    assert "BAD TERMINATION" not in stdout + stderr  # the launcher's banner is replaced
    assert not job.processes(), "processes left behind: %s" % job.processes()


@pytest.mark.mpi
def test_exception_in_a_rank_ends_the_job_with_the_error():
    job = Job("wrap", "-n", "2", CRASH, "raise", "300")
    code, _, stderr = job.finish(timeout=START_TIMEOUT)
    assert code != 0
    assert "tmpi: rank 1 of 2 failed: ValueError: batch 300 of rank 1 is unreadable" in stderr
    assert 'reliability_crash.py", line' in stderr  # the user's frame, nothing deeper
    ours = own_lines(stderr)
    assert "tmpi_adapters" not in ours and "theano" not in ours.lower(), ours
    assert stderr.count("failed: ValueError") == 1
    assert not job.processes()


@pytest.mark.mpi
def test_an_error_in_a_training_call_shows_the_users_line_and_says_whose_share_it_ran():
    job = Job("wrap", "-n", "2", CRASH, "shape", "3")
    code, _, stderr = job.finish(timeout=START_TIMEOUT)
    assert code == 1, stderr
    # Whichever rank reports, the shapes in Theano's message are its rows of the
    # script's batch of 4, and it says so.
    found = re.search(r"tmpi: rank (\d) of 2 failed: ValueError: .*\(rank (\d) of 2 ran rows "
                      r"(\d-\d) of the call's 4: shapes above are that share's\)", stderr)
    assert found and found.group(1) == found.group(2), stderr
    assert found.group(3) == ("0-1" if found.group(1) == "0" else "2-3"), stderr
    assert 'reliability_crash.py", line' in stderr and "frame(s) inside libraries" in stderr
    assert "tmpi_adapters" not in own_lines(stderr), stderr  # tmpi's frames folded


@pytest.mark.mpi
def test_rank_leaving_without_finalize_is_not_a_success():
    # mpiexec ends such a job at once, with the vanished rank's status: 0.
    job = Job("wrap", "-n", "2", CRASH, "exit", "300")
    code, _, stderr = job.finish(timeout=START_TIMEOUT)
    assert code != 0, stderr
    assert "tmpi: rank 1 (pid" in stderr and "left without finishing the script" in stderr \
        and "os._exit" in stderr, stderr
    assert "rank(s) 0, 1" not in stderr  # the rank that left, not every rank mpiexec stopped


@pytest.mark.mpi
def test_rank_ending_its_script_with_a_status_ends_the_job_with_it():
    # Rank 1 calls sys.exit(3) at step 5 while rank 0 trains on: rank 1 waits in
    # MPI's finalize, rank 0 in the next step's exchange, for ever unless told.
    job = Job("wrap", "-n", "2", CRASH, "sysexit", "5")
    code, _, stderr = job.finish(timeout=START_TIMEOUT)
    assert code == 3, stderr
    assert "tmpi: rank 1 ended its script with status 3 (sys.exit) while rank 0 went on" \
        in stderr, stderr
    assert "reliability_crash.py:" in stderr and "sys.exit(3)" in stderr, stderr
    assert "rank 0: waiting" in stderr and "in step 6 of train" in stderr, stderr
    assert not job.processes(), "processes left behind: %s" % job.processes()


@pytest.mark.mpi
def test_a_rank_killed_by_a_signal_exits_with_128_plus_the_signal():
    # A bare 6 would read as tmpi's own checkpoint error.
    job = Job("wrap", "-n", "2", CRASH, "abort", "5")
    code, _, stderr = job.finish(timeout=START_TIMEOUT)
    assert code == 128 + signal.SIGABRT, stderr
    assert "rank 1 (pid" in stderr and "SIGABRT" in stderr, stderr


@pytest.mark.mpi
def test_killing_mpiexec_is_reported_and_leaves_nothing_running():
    job = Job("wrap", "-n", "2", MLP, "--epochs", "100000", "--batch-size", "16")
    try:
        job.wait_for_output("epoch  2/")
        launchers = [pid for pid, env in job.processes().items() if rank_of(env) is None
                     and pid != job.process.pid]
        # hydra's mpiexec, or Open MPI's (prterun, as its mpiexec runs it)
        mpiexec = [pid for pid in launchers if os.path.basename(open(
            "/proc/%d/cmdline" % pid, "rb").read().split(b"\0")[0]) in (
                b"mpiexec", b"mpiexec.hydra", b"mpirun", b"prterun")]
        assert mpiexec, launchers
        os.kill(mpiexec[0], signal.SIGKILL)
        code, _, stderr = job.finish()
    finally:
        job.kill()
    assert code == 128 + signal.SIGKILL, stderr
    assert "tmpi: mpiexec (pid %d) was killed by signal 9 (SIGKILL)" % mpiexec[0] in stderr, \
        stderr
    assert not job.processes(), "processes left behind: %s" % job.processes()


@pytest.mark.mpi
def test_reading_stdin_on_another_rank_than_0_is_a_clear_error():
    # mpiexec feeds rank 0 only: rank 1's input() would wait for ever.
    job = Job("wrap", "-n", "2", SCRIPTS / "reliability_before_compile.py", "stdin")
    code, _, stderr = job.finish(timeout=START_TIMEOUT)
    assert code == 2, stderr
    assert "rank 1 read standard input, which mpiexec gives to rank 0 only" in stderr, stderr
    assert not job.processes()


@pytest.mark.mpi
def test_stall_timeout_holds_before_the_first_compile():
    # Rank 1 is held before it compiles anything: the meeting after rank 0's
    # compile is a stall like any other, reported and aborted at the timeout.
    job = Job("wrap", "-n", "2", "--stall-timeout", "5", "--on-stall", "abort",
              SCRIPTS / "reliability_before_compile.py", "sleep", "600")
    code, _, stderr = job.finish(timeout=START_TIMEOUT)
    assert code == 4, stderr
    assert "tmpi: stall: rank 0 waited" in stderr and "rank 1 has not reached it" in stderr
    assert "reliability_before_compile.py:21" in stderr and "time.sleep" in stderr, stderr
    assert not job.processes()


@pytest.mark.mpi
def test_a_relative_checkpoint_dir_stays_where_the_job_started(tmp_path):
    # The script moves to another directory before its first checkpoint.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    job = Job("wrap", "-n", "2", "--checkpoint-dir", "ckpt", "--checkpoint-every", "2",
              SCRIPTS / "reliability_before_compile.py", "chdir", elsewhere, cwd=tmp_path)
    code, stdout, stderr = job.finish(timeout=START_TIMEOUT)
    assert code == 0, stderr
    assert "trained in %s" % elsewhere in stdout
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir())[-1] \
        == "checkpoint-step00000006.tmpi"
    assert not (elsewhere / "ckpt").exists()


@pytest.mark.mpi
def test_killing_tmpi_itself_leaves_no_rank_behind():
    job = Job("wrap", "-n", "2", MLP, "--epochs", "100000", "--batch-size", "16")
    try:
        job.wait_for_output("epoch  2/")
        ranks = [pid for pid, env in job.processes().items() if rank_of(env) is not None]
        assert len(ranks) == 2
        job.process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        while job.processes() and time.monotonic() - killed < END_TIMEOUT:
            time.sleep(0.1)
        left = job.processes()
        print("all ranks gone %.2f s after SIGKILL of tmpi" % (time.monotonic() - killed))
    finally:
        job.kill()
        job.process.wait()
    assert not left, "left behind after tmpi was killed: %s" % sorted(left)
