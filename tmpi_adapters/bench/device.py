"""The device part of `tmpi bench`: the conv net on the device Theano is given.

It runs where ``THEANO_FLAGS`` names a device (``device=cuda0`` on a GPU, or
the OpenCL flags ``make gpu`` writes), and is skipped, saying so, elsewhere;
the other parts run on the CPU whatever ``THEANO_FLAGS`` says.
Separate jobs, taking turns round after round (ABBA), all on that device:

``plain``
    ``python models.py``: the script as its user runs it, batch B;
``wrapped_1``
    ``tmpi wrap -n 1`` of the same: the 1-rank overhead;
``wrapped_2``
    ``tmpi wrap -n 2 --record`` of the same global batch B, the two ranks
    sharing the device (each B/2 rows); the record gives the exchange's
    share of a step (comm + wait: the fused copies to the host and back
    and the reduction);
``independent_2``
    two plain processes at B/2 rows, side by side on the device: what two
    processes that exchange nothing reach, the ceiling of ``wrapped_2``.

Float32, as on a GPU; the device is named in the result.
"""
import os
import statistics
import subprocess

from tmpi_adapters.bench.runs import (bench_environment, interleaved, models_script,
                                      paired_ratio, parse_steps, python, read_record, run,
                                      split_of, tool, TIMEOUT)
from tmpi_adapters.errors import TmpiError
from tmpi_adapters.process.devices import device_flag

VARIANTS = ("plain", "wrapped_1", "wrapped_2", "independent_2")


def _command(variant, batch_size, steps, record):
    args = ["--model", "convnet", "--batch-size", str(batch_size), "--steps", str(steps)]
    if variant == "plain":
        return [python(), models_script()] + args
    ranks = variant[-1]
    return [tool("tmpi"), "wrap", "-n", ranks, "--threads-per-rank", "1", "--record", record,
            "--no-summary", models_script()] + args


def _side_by_side(batch_size, steps):
    """Two plain processes at once; their bench-steps records."""
    command = [python(), models_script(), "--model", "convnet", "--batch-size",
               str(batch_size), "--steps", str(steps)]
    processes = [subprocess.Popen(command, env=bench_environment(1, device=True),
                                  stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(2)]
    found = []
    for process in processes:
        stdout, stderr = process.communicate(timeout=TIMEOUT)
        if process.returncode != 0:
            raise TmpiError("the device benchmark's independent processes failed (exit %d):\n%s"
                            % (process.returncode, stderr[-3000:]))
        found.append(parse_steps(stdout))
    return found


def measure(workdir, batch_size, steps, rounds, tick=lambda text: None):
    """The device part's result (``{"skipped": why}`` without a device)."""
    device = device_flag(os.environ.get("THEANO_FLAGS"))
    if not device or device == "cpu":
        return {"skipped": "THEANO_FLAGS names no device: set device=cuda0 on a GPU, or the "
                           "flags `make gpu` writes for the OpenCL device on the CPU"}
    half = batch_size // 2
    step = {v: [] for v in VARIANTS}
    rates = {v: [] for v in VARIANTS}
    records = []
    for r, variant in interleaved(rounds, VARIANTS):
        if variant == "independent_2":
            pair = _side_by_side(half, steps)
            medians = [statistics.median(f["seconds"]) for f in pair]
            step[variant].append(max(medians))
            rates[variant].append(sum(half / m for m in medians))
        else:
            record = os.path.join(workdir, "device-%s-%d.jsonl" % (variant, r))
            found = parse_steps(run(_command(variant, batch_size, steps, record),
                                    "device (%s)" % variant, device=True))
            median = statistics.median(found["seconds"])
            step[variant].append(median)
            rates[variant].append(batch_size / median)
            if variant == "wrapped_2":
                records += read_record(record)
        tick("device: %s" % variant)
    summary = _last_summary(os.path.join(workdir, "device-wrapped_2-0.jsonl"))
    overhead, overhead_range = paired_ratio(step["wrapped_1"], step["plain"])
    over_independent, independent_range = paired_ratio(rates["wrapped_2"],
                                                       rates["independent_2"])
    split = split_of(records)
    return {
        "device": (summary.get("devices") or [device])[0],
        "batch_size": batch_size, "steps": steps, "rounds": rounds,
        "step_median_s": {v: statistics.median(s) for v, s in step.items()},
        "samples_per_s": {v: statistics.median(s) for v, s in rates.items()},
        "overhead_1_rank": overhead - 1.0,
        "overhead_1_rank_range": [overhead_range[0] - 1.0, overhead_range[1] - 1.0],
        "two_ranks_over_independent": over_independent,
        "two_ranks_over_independent_range": independent_range,
        "two_ranks_over_one_process": statistics.median(rates["wrapped_2"]) /
        statistics.median(rates["plain"]),
        "exchange_s_per_step": split["comm_s"] + split["wait_s"],
        "split_s": split,
    }


def _last_summary(path):
    import json
    try:
        with open(path) as handle:
            found = [r for r in map(json.loads, handle) if r.get("type") == "summary"]
    except OSError:
        return {}
    return found[-1] if found else {}
