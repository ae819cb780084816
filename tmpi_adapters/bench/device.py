"""The device part of `tmpi bench`: the conv net on the device Theano is given.

It runs where ``THEANO_FLAGS`` names a device (``device=cuda0`` on a GPU, or
the OpenCL flags ``make gpu`` writes) that Theano opens; the other parts run
on the CPU whatever ``THEANO_FLAGS`` says.  A device Theano cannot open (no
pygpu, no CUDA driver) is never measured as if it were one: :func:`refusal`
says why, and `tmpi bench` stops (``--parts device``) or leaves the part out.

First the conv net is compiled into the benchmark's Theano cache, once (the
plain script and a 2-rank job, one step each); then separate jobs take turns,
round after round (ABBA), all on that device, each printing a line as it ends:

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

Float32, as on a GPU; the device is named in the result.  What was measured
stays in the part's result as it comes (``runs``), so a run cut short still
writes it (:func:`figures` makes what figures it can of it).
"""
import json
import os
import statistics
import subprocess
import time

from tmpi_adapters.bench.runs import (bench_environment, communicate, interleaved,
                                      models_script, paired_ratio, parse_steps, python,
                                      read_record, run, split_of, start, stop, tool)
from tmpi_adapters.errors import DeviceError
from tmpi_adapters.process.devices import DEVICE_PREFIXES, device_flag

VARIANTS = ("plain", "wrapped_1", "wrapped_2", "independent_2")

#: What a probe process prints: what this process asked for, got, and why not.
_PROBE = ("import json; from tmpi_adapters.process import devices; devices.watch_theano(); "
          "import theano; print('bench-device ' + json.dumps(devices.opened()))")


def refusal(environ=None):
    """Why the device part cannot measure a device here, or ``None``.

    Without a device in ``THEANO_FLAGS`` that is said at once; with one, a
    process in the benchmark's environment imports Theano and says what it
    got (a few seconds): a device it could not open would be the CPU.
    """
    environ = os.environ if environ is None else environ
    device = device_flag(environ.get("THEANO_FLAGS"))
    if not device or not device.startswith(DEVICE_PREFIXES):
        return ("THEANO_FLAGS names no device: set device=cuda0 on a GPU, or the flags "
                "`make gpu` writes for the OpenCL device on the CPU "
                "(THEANO_FLAGS=$(cat .venv/opencl-theano-flags))")
    result = subprocess.run([python(), "-c", _PROBE], env=bench_environment(1, device=True),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            timeout=300)
    found = [line for line in result.stdout.splitlines() if line.startswith("bench-device ")]
    if result.returncode != 0 or not found:
        return ("Theano could not start with THEANO_FLAGS device=%s (exit %d): %s" % (
            device, result.returncode, (result.stderr or result.stdout).strip()[-1500:]))
    asked, got, why = json.loads(found[-1][len("bench-device "):])
    if got == "cpu":
        return ("THEANO_FLAGS asks for device=%s, but Theano opened no device, so the device "
                "part would measure the CPU. Theano's reason: %s. `make gpu` sets up "
                "Theano's GPU backend (docs/gpu.md)" % (asked or device, (why or "").rstrip(".")))
    return None


def _command(variant, batch_size, steps, record, warmup=None):
    args = ["--model", "convnet", "--batch-size", str(batch_size), "--steps", str(steps)]
    if warmup is not None:
        args += ["--warmup", str(warmup)]
    if variant == "plain":
        return [python(), models_script()] + args
    ranks = variant[-1]
    return [tool("tmpi"), "wrap", "-n", ranks, "--threads-per-rank", "1", "--record", record,
            "--no-summary", "--require-device", models_script()] + args


def _side_by_side(batch_size, steps):
    """Two plain processes at once; their bench-steps records."""
    command = [python(), models_script(), "--model", "convnet", "--batch-size",
               str(batch_size), "--steps", str(steps)]
    processes = []
    try:
        for _ in range(2):
            processes.append(start(command, bench_environment(1, device=True)))
        found = []
        for process in processes:
            stdout, stderr = communicate(process, command, "device (independent_2)")
            if process.returncode != 0:
                raise DeviceError("the device benchmark's independent processes failed "
                                  "(exit %d):\n%s" % (process.returncode, stderr[-3000:]))
            found.append(parse_steps(stdout))
        return found
    finally:
        for process in processes:
            stop(process)


def _on_the_device(found, variant):
    """A run that computed on the CPU measured no device: refused, never judged."""
    if found.get("device") == "cpu":
        raise DeviceError("the device part's %s run computed on the CPU: Theano opened no "
                          "device in it, so nothing it measured is a device's figure" % variant)


def measure(workdir, batch_size, steps, rounds, tick=lambda text, line=None: None,
            found=None):
    """The device part's result; ``found`` (a dict) holds it as it is
    measured, so that a run cut short can write what it has."""
    device = device_flag(os.environ.get("THEANO_FLAGS"))
    found = {} if found is None else found
    found.update({"device": device, "batch_size": batch_size, "steps": steps,
                  "rounds": rounds, "runs": [], "partial": True})
    try:
        _measure(workdir, batch_size, steps, rounds, tick, found)
    finally:
        found.update(figures(found))  # cut short too: the figures its runs give
    del found["partial"]
    return found


def _measure(workdir, batch_size, steps, rounds, tick, found):
    half = batch_size // 2
    begin = time.monotonic()
    # Compile once: every timed job then finds the graphs in the cache.
    for variant in ("plain", "wrapped_2"):
        record = os.path.join(workdir, "device-compile-%s.jsonl" % variant)
        _on_the_device(parse_steps(run(_command(variant, batch_size, 1, record, warmup=0),
                                       "device (compiling, %s)" % variant, device=True)),
                       variant)
    found["compile_s"] = round(time.monotonic() - begin, 1)
    tick("device: compiled", line="device: the conv net compiled (plain and 2 ranks, one "
                                  "step each) in %.0f s" % found["compile_s"])
    for r, variant in interleaved(rounds, VARIANTS):
        started = time.monotonic()
        entry = {"round": r, "variant": variant}
        if variant == "independent_2":
            pair = _side_by_side(half, steps)
            for one in pair:
                _on_the_device(one, variant)
            medians = [statistics.median(f["seconds"]) for f in pair]
            entry.update(step_s=max(medians), samples_per_s=sum(half / m for m in medians))
        else:
            record = os.path.join(workdir, "device-%s-%d.jsonl" % (variant, r))
            steps_found = parse_steps(run(_command(variant, batch_size, steps, record),
                                          "device (%s)" % variant, device=True))
            _on_the_device(steps_found, variant)
            median = statistics.median(steps_found["seconds"])
            entry.update(step_s=median, samples_per_s=batch_size / median)
            if variant == "wrapped_2":
                entry["split_s"] = split_of(read_record(record))
                summary = _last_summary(record)
                if summary.get("devices"):
                    found["device"] = summary["devices"][0]
        entry["seconds"] = round(time.monotonic() - started, 1)
        found["runs"].append(entry)
        tick("device: %s" % variant, line="device: round %d/%d, %s: %s per step, %.0f "
             "samples/s (%.0f s; %.0f s in all)" % (
                 r + 1, rounds, variant, "%.1f ms" % (1e3 * entry["step_s"]),
                 entry["samples_per_s"], entry["seconds"], time.monotonic() - begin))


def figures(found):
    """The part's figures from the runs in ``found`` (those that can be made
    of them: a run cut short may have some variants only)."""
    runs = found.get("runs") or []
    step = {v: [e["step_s"] for e in runs if e["variant"] == v] for v in VARIANTS}
    rates = {v: [e["samples_per_s"] for e in runs if e["variant"] == v] for v in VARIANTS}
    result = {"step_median_s": {v: statistics.median(s) for v, s in step.items() if s},
              "samples_per_s": {v: statistics.median(s) for v, s in rates.items() if s}}
    # Each round's pair, taken next to each other (a round cut short has none).
    by_round = {}
    for entry in runs:
        by_round.setdefault(entry["round"], {})[entry["variant"]] = entry
    pairs = [(one["wrapped_1"]["step_s"], one["plain"]["step_s"]) for one in by_round.values()
             if "wrapped_1" in one and "plain" in one]
    if pairs:
        overhead, low_high = paired_ratio(*zip(*pairs))
        result["overhead_1_rank"] = overhead - 1.0
        result["overhead_1_rank_range"] = [low_high[0] - 1.0, low_high[1] - 1.0]
    pairs = [(one["wrapped_2"]["samples_per_s"], one["independent_2"]["samples_per_s"])
             for one in by_round.values() if "wrapped_2" in one and "independent_2" in one]
    if pairs:
        ratio, low_high = paired_ratio(*zip(*pairs))
        result["two_ranks_over_independent"] = ratio
        result["two_ranks_over_independent_range"] = low_high
    if rates["wrapped_2"] and rates["plain"]:
        result["two_ranks_over_one_process"] = statistics.median(rates["wrapped_2"]) / \
            statistics.median(rates["plain"])
    splits = [e["split_s"] for e in runs if "split_s" in e]
    if splits:
        split = {k: statistics.median(s[k] for s in splits) for k in splits[0]}
        result["split_s"] = split
        result["exchange_s_per_step"] = split["comm_s"] + split["wait_s"]
    return result


def _last_summary(path):
    try:
        with open(path) as handle:
            found = [r for r in map(json.loads, handle) if r.get("type") == "summary"]
    except OSError:
        return {}
    return found[-1] if found else {}
