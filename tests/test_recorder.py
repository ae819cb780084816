"""The recorder: the per-step split, --record JSON lines, --progress and tmpi plot."""
import json
import os
import re
import subprocess
import threading
import time

import numpy as np
import pytest

from conftest import EXAMPLES, ROOT, RUN_TIMEOUT, SCRIPTS, TMPI, check, rank_env, tmpi

MLP = EXAMPLES / "theano_mlp" / "train.py"
STEP_KEYS = {"type", "model", "step", "time_s", "compute_s", "comm_s", "wait_s", "data_s",
             "collectives", "samples", "rows", "samples_per_s", "transfer_s", "wire_bytes",
             "outputs"}


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_record(records, ranks, rows=1500, batches=24):
    header, steps, summary = records[0], records[1:-1], records[-1]
    if ranks > 1:  # the steps' waits, measured across ranks at the end
        waits, steps = steps[-1], steps[:-1]
        assert waits["type"] == "waits" and waits["first_step"] == 1
        assert len(waits["wait_s"]) == len(waits["comm_s"]) == batches
        assert all(w >= 0 for w in waits["wait_s"]) and all(c >= 0 for c in waits["comm_s"])
    assert header["type"] == "run" and header["ranks"] == ranks and header["rule"] == "bsp"
    assert len(steps) == batches and all(s["type"] == "step" for s in steps)
    for i, s in enumerate(steps, 1):
        assert set(s) == STEP_KEYS and s["step"] == i
        assert all(s[k] >= 0 for k in ("compute_s", "comm_s", "wait_s", "data_s"))
        # Unnamed T.mean outputs: the loss and the accuracy of the example.
        assert set(s["outputs"]) == {"output0", "output1"}
        assert 0 <= s["outputs"]["output1"] <= 1
        # BSP: the gradients, the loss and the accuracy travel in one collective.
        assert s["collectives"] == (1 if ranks > 1 else 0), s
    # Every rank's rows, once: the global sample count of each step.
    assert sum(s["samples"] for s in steps) == rows
    assert summary["type"] == "summary" and summary["samples"] == rows
    # Each rank's share of the rows, its device and its cores.
    assert sum(summary["rows_per_rank"]) == rows and len(summary["rows_per_rank"]) == ranks
    assert summary["devices"] == ["cpu"] * ranks and len(summary["cores"]) == ranks
    assert summary["ranks"] == ranks and summary["samples_per_s"] > 0


@pytest.mark.mpi
def test_record_and_plot_two_ranks(tmp_path):
    path = tmp_path / "run.jsonl"
    result = check(tmpi("wrap", "-n", "2", "--record", path, "--progress", MLP,
                        "--epochs", "1", "--seed", "1"))
    check_record(read_records(path), ranks=2)
    assert "compute" in result.stdout and "wait" in result.stdout \
        and "between steps" in result.stdout
    assert "step" in result.stderr  # the progress bar
    png = tmp_path / "run.png"
    check(tmpi("plot", path, "-o", png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_record_one_rank(tmp_path):
    path = tmp_path / "nested" / "run.jsonl"
    check(tmpi("wrap", "--record", path, MLP, "--epochs", "1", "--seed", "1"))
    records = read_records(path)
    check_record(records, ranks=1)
    assert all(s["comm_s"] + s["wait_s"] < 0.05 for s in records[1:-1])


def test_plot_rejects_what_it_cannot_draw(tmp_path):
    bad = tmp_path / "notes.txt"
    bad.write_text("hello\n")
    result = tmpi("plot", bad)
    assert result.returncode != 0 and "not JSON" in result.stderr
    assert "Traceback" not in result.stderr
    missing = tmpi("plot", tmp_path / "absent.jsonl")
    assert missing.returncode != 0 and "cannot read" in missing.stderr


def test_scalar_outputs_and_strict_json(tmp_path):
    from tmpi_adapters.core.timing import scalar_outputs
    from tmpi_adapters.recording.runlog import RunLog
    values = [np.float32(0.5), np.array([1.0, 2.0]), 3, np.float64("nan")]
    assert scalar_outputs(values, ["loss", None, "mean", "mean"]) == {
        "loss": 0.5, "output2": 3.0, "output3": None}
    log = RunLog(str(tmp_path / "log.jsonl"), {"type": "run", "x": float("inf")})
    log.write({"type": "step", "value": np.float32(1.5)})
    log.close()
    lines = (tmp_path / "log.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["x"] is None and json.loads(lines[1])["value"] == 1.5


@pytest.mark.mpi
def test_the_summary_gives_steps_when_the_batch_rows_are_unknown(tmp_path):
    # givens slices on one rank: nothing is split, so tmpi never learns the
    # rows; a rate of "samples" would be steps in disguise.
    path = tmp_path / "run.jsonl"
    result = check(tmpi("wrap", "--record", path, SCRIPTS / "sharded_data.py", "givens",
                        "same"))
    summary = [line for line in result.stdout.splitlines() if line.startswith("tmpi: ")]
    assert len(summary) == 1 and "8 steps on 1 rank(s), " in summary[0], result.stdout
    assert "steps/s (the batch's rows were not found)" in summary[0]
    assert "samples/s" not in summary[0]
    records = read_records(path)
    assert all(r["samples"] is None for r in records if r["type"] == "step")
    assert records[-1]["samples_per_s"] is None and records[-1]["steps_per_s"] > 0
    # On two ranks the batch is split, so its rows are counted.
    result = check(tmpi("wrap", "-n", "2", SCRIPTS / "sharded_data.py", "givens", "same"))
    assert "8 steps on 2 rank(s), " in result.stdout and " samples/s in the training loop" \
        in result.stdout


@pytest.mark.mpi
def test_a_straggler_shows_as_wait_of_its_size(tmp_path):
    # Rank 1 sleeps 50 ms before each step: rank 0 waits about that long at
    # each exchange, rank 1 not at all, so the split (averaged over the two
    # ranks) shows about half of it as wait, and rank 1's sleep as time
    # between steps.
    sleep = 0.05
    path = tmp_path / "run.jsonl"
    check(tmpi("wrap", "-n", "2", "--record", path, SCRIPTS / "straggler.py", str(sleep)))
    summary = read_records(path)[-1]
    assert summary["type"] == "summary"
    assert 0.3 < summary["wait_s"] / sleep < 0.7, summary
    assert 0.3 < summary["data_s"] / sleep < 0.7, summary
    assert summary["comm_s"] < summary["wait_s"] / 2, summary


@pytest.mark.mpi
def test_periodic_exchanges_show_in_the_means(tmp_path):
    # EASGD exchanges every tau=4 steps: the median step has no exchange.
    path = tmp_path / "run.jsonl"
    result = check(tmpi("wrap", "-n", "2", "--rule", "easgd", "--rule-option", "tau=4",
                        "--record", path, SCRIPTS / "straggler.py", "0"))
    summary = read_records(path)[-1]
    assert summary["collectives_per_step"] == 1
    assert summary["mean_collectives_per_step"] == pytest.approx(1.25, abs=0.05), summary
    assert "1 collective per step (median; mean 1.2" in result.stdout, result.stdout


@pytest.mark.mpi
def test_the_progress_bar_moves_while_the_job_runs():
    # What a terminal shows: tmpi's stderr as it comes, not only at the end.
    process = subprocess.Popen([TMPI, "wrap", "-n", "2", "--progress",
                                SCRIPTS / "slow_steps.py"], env=rank_env(), cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []  # (seconds since start, chunk) of stderr as it arrives
    start = time.monotonic()

    def read():
        for chunk in iter(lambda: os.read(process.stderr.fileno(), 4096), b""):
            seen.append((time.monotonic() - start, chunk.decode("utf-8", "replace")))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        stdout = process.stdout.read()  # stderr is the reader's alone
        process.wait(timeout=RUN_TIMEOUT)
    finally:
        process.kill()
    reader.join(timeout=10)
    ended = time.monotonic() - start
    assert process.returncode == 0, "".join(c for _, c in seen)
    text = "".join(c for _, c in seen)
    assert text.startswith("tmpi: starting 2 ranks"), text[:200]
    assert "compiling: " in text
    # Bars with a step count below the last arrived well before the end (3 s of steps).
    counts = [(at, int(m.group(1))) for at, chunk in seen
              for m in re.finditer(r"training: (\d+)step", chunk)]
    assert any(0 < n < 150 and at < ended - 0.5 for at, n in counts), (counts, ended)
    assert re.search(r"training: 150step .*samples/s=\d+, loss=", text), text[-500:]
    # The bar's line ends before the summary.
    assert b"tmpi: 150 steps on 2 rank(s)" in stdout
