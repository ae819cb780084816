"""`tmpi bench` runs end to end and writes well-formed results; timings are never judged."""
import json
import math
import re

import pytest

from conftest import check, tmpi

HEADLINE = ("fused_over_raw_allreduce", "speedup_2_ranks", "overhead_1_rank")
EXCHANGE_CASES = {"raw_allreduce", "raw_allreduce_in_place", "fused", "fused_mpi_algorithm",
                  "fused_copy_out", "per_parameter", "fused_fp16", "fused_bf16"}


def finite(value):
    return isinstance(value, float) and math.isfinite(value)


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "results" / "bench.json"
    # --quick, trimmed further: the smallest run that still takes every path.
    result = check(tmpi("bench", "--quick", "--width", "0.1", "--repetitions", "2",
                        "--steps", "2", "--no-progress", "--json", out, timeout=900))
    data = json.loads(out.read_text())
    for key in HEADLINE:
        assert finite(data[key]), (key, data.get(key))
        assert data["headline"][key] == data[key]
    assert data["command"].startswith("tmpi bench --quick")
    assert re.match(r"\d{4}-\d\d-\d\d$", data["date"]) and data["machine"]["cpus"] >= 1
    for key, bar in data["bars"].items():
        assert set(bar) == {"value", "bar", "met"} and isinstance(bar["met"], bool), key

    exchange = data["exchange"]
    assert exchange["ranks"] == 2 and exchange["bytes"] > 0 and exchange["arrays"] == 16
    assert EXCHANGE_CASES <= set(exchange["median_s"])
    assert all(len(v) == 2 for v in exchange["samples_s"].values())
    assert set(exchange["ring_floor_s"]) == {"fp32", "fp16", "bf16"}
    if "torch_gloo" not in exchange["median_s"]:
        assert "not installed" in exchange["torch"]["skipped"]

    scaling = data["scaling"]
    assert set(scaling["samples_per_s"]) == {"1", "2"} and finite(scaling["speedup"])
    assert set(scaling["split_s"]) == {"compute_s", "comm_s", "wait_s"}
    assert finite(scaling["ceiling"]) and finite(data["scaling_efficiency"])
    assert set(data["processes"]["step_median_s"]) == {"unwrapped", "1", "2"}
    assert finite(data["overhead"]["overhead"])

    # The table the README shows, and a figure of it.
    assert "| ratio | measured | bar |" in result.stdout
    assert "| tmpi fused exchange, fp32 |" in result.stdout
    png = tmp_path / "bench.png"
    check(tmpi("plot", out, "-o", png))
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_needs_two_ranks():
    result = tmpi("bench", "-n", "1")
    assert result.returncode != 0 and "at least 2" in result.stderr
    assert "Traceback" not in result.stderr
