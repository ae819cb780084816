"""`tmpi bench`: the committed results are well-formed, and one small real run works.

Timings are never judged here: the bars are measured by `tmpi bench` itself
and reported in bench/README.md and README.md.  These tests check the
committed results file the README quotes (every figure the README's tables
need is there and finite, every bar of issue 17 has a value, a bound and a
verdict), that the table and the figure can be made from it, and that the
smallest real run (the exchange and the collectives of a Lasagne script,
about half a minute on 2 cores) writes the same kind of file.
"""
import json
import math
import re
from pathlib import Path

import pytest

from conftest import check, rank_env, tmpi
from tmpi_adapters.bench import command
from tmpi_adapters.process import devices

ROOT = Path(__file__).resolve().parent.parent

#: The figures the README's Performance section and bench/README.md show.
README_FIGURES = (
    "fused_over_raw_allreduce", "fp16_over_fp32", "fp16_over_fp32_wire",
    "per_parameter_over_fused",
    "overhead_1_rank_convnet", "overhead_1_rank_deep", "overhead_1_rank_tiny",
    "speedup_2_ranks", "speedup_ceiling_2_ranks", "scaling_efficiency",
    "convnet_speedup_vs_1_thread", "convnet_speedup_vs_user_baseline",
    "tiny_speedup_per_epoch", "tiny_speedup_vs_user_baseline",
    "collectives_per_step_theano", "collectives_per_step_lasagne",
    "collectives_per_step_keras",
    "envelope_cost_tiny", "envelope_cost_convnet_in_one_job",
)
#: Issue 17's bars, every one listed in a full run's results.
ISSUE_17_BARS = (
    "overhead_1_rank_convnet", "overhead_1_rank_deep", "overhead_1_rank_tiny",
    "collectives_per_step_theano", "collectives_per_step_lasagne", "collectives_per_step_keras",
    "tiny_speedup_per_epoch", "convnet_speedup_vs_1_thread",
    "network_speedup", "network_fp16_over_fp32", "network_exchange_over_ring_floor",
)
EXCHANGE_CASES = {"raw_allreduce", "raw_allreduce_in_place", "fused", "fused_mpi_algorithm",
                  "fused_copy_out", "per_parameter", "fused_fp16", "fused_bf16"}


def finite(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def check_bars(data):
    for key, bar in data["bars"].items():
        assert {"value", "bar", "met"} <= set(bar), key
        assert isinstance(bar["met"], bool), key
        assert re.match(r"(<=|>=|==) [0-9.]+$", bar["bar"]), (key, bar["bar"])
        if bar["value"] is None:
            assert not bar["met"] and bar["note"].startswith("not measured"), (key, bar)
        else:
            assert finite(bar["value"]) and data[key] == bar["value"], (key, bar)


def quoted_results():
    """The results file README.md's Performance section quotes."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Performance", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"bench/results/([\w.-]+\.json)", section)
    assert names, "README.md's Performance section names no bench/results/*.json"
    return ROOT / "bench" / "results" / names[0]


def test_committed_results_are_well_formed(tmp_path):
    path = quoted_results()
    data = json.loads(path.read_text())
    assert path.name in (ROOT / "bench" / "README.md").read_text()
    assert data["command"].startswith("tmpi bench") and not data["quick"]
    assert set(data["parts"]) <= set(command.PARTS)
    assert {p for p in command.PARTS if command.ADDED.get(p, "") <= data["date"]} <= \
        set(data["parts"])
    # The device part runs where THEANO_FLAGS names a device, else says why not.
    assert "skipped" in data["device"] or finite(data["device"]["overhead_1_rank"])
    for variant in ("bound", "unbound"):
        assert len(data["spread"]["step_median_s"][variant]) >= 10
        assert finite(data["spread"]["spread"][variant])
    assert re.match(r"\d{4}-\d\d-\d\d$", data["date"]) and data["machine"]["cpus"] >= 1
    for key in README_FIGURES:
        assert finite(data[key]), (key, data.get(key))
        assert data["headline"][key] == data[key]
    assert set(ISSUE_17_BARS) <= set(data["bars"])
    check_bars(data)
    network = data["network"]
    if "skipped" in network:
        assert network["skipped"]
    else:
        for link in network["links"].values():
            for key in ("fidelity", "fp16_over_fp32", "exchange_over_ring_floor",
                        "speedup_2_ranks"):
                assert finite(link[key]), key
        if "bsp_overlap" in network["variants"]:
            for link in network["links"].values():
                assert finite(link["training"]["speedup_bsp_overlap"])
        else:
            assert "overlap" in network  # not measured: said so
    for model in ("convnet", "deep", "tiny"):
        assert finite(data["overhead"]["models"][model]["overhead"])
    assert set(data["processes"]["convnet"]["step_median_s"]) == {
        "plain_1_thread", "plain_default_threads", "wrapped"}
    # The table and the figure come from the file alone.
    table = command.format_table(data)
    for heading in ("| bar | measured | bar |", "| tmpi fused exchange, fp32 |",
                    "default threads (user's baseline)", "TMPI_ENVELOPES=0"):
        assert heading in table
    png = tmp_path / "bench.png"
    check(tmpi("plot", path, "-o", png))
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_quick_runs_and_writes_json(tmp_path):
    out = tmp_path / "results" / "bench.json"
    # The smallest run that goes from the command line to the JSON and the
    # table: a small exchange, and the collectives of one Lasagne script.
    result = check(tmpi("bench", "--quick", "--parts", "exchange,collectives",
                        "--frameworks", "lasagne", "--width", "0.1", "--repetitions", "2",
                        "--no-progress", "--json", out, timeout=300))
    data = json.loads(out.read_text())
    assert data["command"].startswith("tmpi bench --quick")
    assert data["parts"] == ["exchange", "collectives"] and data["quick"]
    assert finite(data["fused_over_raw_allreduce"])
    assert data["collectives_per_step_lasagne"] == data["bars"][
        "collectives_per_step_lasagne"]["value"]
    check_bars(data)

    exchange = data["exchange"]
    assert exchange["ranks"] == 2 and exchange["bytes"] > 0 and exchange["arrays"] == 16
    assert EXCHANGE_CASES <= set(exchange["median_s"])
    assert all(len(v) == 2 for v in exchange["samples_s"].values())
    if "torch_gloo" not in exchange["median_s"]:
        assert "not installed" in exchange["torch"]["skipped"]
    lasagne = data["collectives"]["lasagne"]
    assert lasagne["steps"] > 0 and len(lasagne["counts"]) == lasagne["steps"]

    assert "| bar | measured | bar |" in result.stdout
    assert "| lasagne | lasagne_mlp.py" in result.stdout


def test_bench_needs_two_ranks():
    result = tmpi("bench", "-n", "1")
    assert result.returncode != 0 and "at least 2" in result.stderr
    assert "Traceback" not in result.stderr


def test_bench_names_an_unknown_part():
    result = tmpi("bench", "--parts", "exchange,nonsense")
    assert result.returncode != 0 and "nonsense" in result.stderr
    assert "Traceback" not in result.stderr


def cuda0_without_cuda():
    """``THEANO_FLAGS`` naming CUDA GPU 0 where none can open (else a skip)."""
    if devices.has_cuda():
        pytest.skip("a CUDA GPU is here: device=cuda0 opens")
    return "device=cuda0"


def test_the_device_part_never_measures_the_cpu_for_a_device(tmp_path):
    env = rank_env("float32")
    env["THEANO_FLAGS"] += "," + cuda0_without_cuda()
    out = tmp_path / "bench.json"
    result = tmpi("bench", "--parts", "device", "--quick", "--no-progress", "--json", out,
                  env=env)
    assert result.returncode == 8, result.stderr
    assert result.stderr.startswith(
        "tmpi: error: tmpi bench: the device part measures no device here: THEANO_FLAGS asks "
        "for device=cuda0, but Theano opened no device, so the device part would measure the "
        "CPU. Theano's reason: "), result.stderr
    assert "make gpu" in result.stderr and not out.exists()
    result = tmpi("bench", "--parts", "device", "--no-progress", env=rank_env("float32"))
    assert result.returncode == 8 and "THEANO_FLAGS names no device" in result.stderr


def test_a_run_of_every_part_leaves_out_a_device_theano_cannot_open(monkeypatch):
    monkeypatch.setenv("THEANO_FLAGS", cuda0_without_cuda())
    results = {}
    parts = command.take_device_part(results, list(command.PARTS), named=False)
    assert parts == [p for p in command.PARTS if p != "device"]
    assert results["device"]["skipped"].startswith("THEANO_FLAGS asks for device=cuda0, but "
                                                   "Theano opened no device")
    top = command.headline(results, 2)
    assert not [k for k in list(top) + list(command.bars(results, top)) if "device" in k]
    assert "device: skipped: THEANO_FLAGS asks for device=cuda0" in command.format_table(results)
