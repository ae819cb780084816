"""The processes part of `tmpi bench`: N ranks against one, as users run them.

Separate jobs, taking turns round after round (ABBA):

``plain_1_thread``
    ``python models.py`` with one BLAS thread: the 1-rank reference of the
    bars (the same threads per process as each rank gets);
``plain_default_threads``
    ``python models.py`` with the BLAS library's own default threads: the
    script as its user runs it today, the *user's baseline*;
``wrapped``
    ``tmpi wrap -n N --threads-per-rank 1 --record`` on the same global
    batch split across the ranks (its time split from the record).

Two models: the conv net, per step at the same rows per rank (speed-up =
N x 1-rank step / N-rank step), and the latency-bound ``tiny`` MLP, per
epoch of the same global batches (speed-up = 1-rank epoch / N-rank epoch:
strong scaling does not change the number of steps in an epoch).
"""
import os
import statistics

from tmpi_adapters.bench.runs import (interleaved, models_script, paired_ratio, parse_steps,
                                      python, read_record, run, split_of, tool)

VARIANTS = ("plain_1_thread", "plain_default_threads", "wrapped")


def command(variant, ranks, args, record):
    if variant != "wrapped":
        return [python(), models_script()] + args
    return [tool("tmpi"), "wrap", "-n", str(ranks), "--threads-per-rank", "1", "--record",
            record, "--no-summary", models_script()] + args


def _jobs(workdir, tag, ranks, rounds, args_of, tick):
    """Run every variant ``rounds`` times; their bench-steps records and the
    wrapped jobs' step records."""
    found = {v: [] for v in VARIANTS}
    records = []
    for r, variant in interleaved(rounds, VARIANTS):
        record = os.path.join(workdir, "%s-%d.jsonl" % (tag, r))
        threads = None if variant == "plain_default_threads" else 1
        stdout = run(command(variant, ranks, args_of(variant), record),
                     "%s (%s)" % (tag, variant), threads=threads)
        found[variant].append(parse_steps(stdout))
        if variant == "wrapped":
            records += read_record(record)
        tick("processes: %s, %s" % (tag, variant))
    return found, records


def convnet(workdir, ranks, batch_size, steps, rounds, tick=lambda text: None):
    """Conv net steps at ``batch_size`` rows per rank."""
    def args_of(variant):
        rows = batch_size * (ranks if variant == "wrapped" else 1)
        return ["--model", "convnet", "--batch-size", str(rows), "--steps", str(steps)]

    found, records = _jobs(workdir, "convnet", ranks, rounds, args_of, tick)
    step = {v: [statistics.median(f["seconds"]) for f in found[v]] for v in VARIANTS}
    one, one_extent = paired_ratio(step["plain_1_thread"], step["wrapped"], ranks)
    user, user_extent = paired_ratio(step["plain_default_threads"], step["wrapped"], ranks)
    return {"ranks": ranks, "batch_size_per_rank": batch_size, "steps": steps,
            "rounds": rounds,
            "step_median_s": {v: statistics.median(s) for v, s in step.items()},
            "round_medians_s": step,
            "speedup_vs_1_thread": one, "speedup_vs_1_thread_range": one_extent,
            "speedup_vs_default_threads": user,
            "speedup_vs_default_threads_range": user_extent,
            "split_s": split_of(records[-steps:]) if records else None}


def tiny_epochs(workdir, ranks, epochs, rows, rounds, tick=lambda text: None):
    """Whole epochs of the tiny MLP (batch 20, ``rows`` rows) on 1 and N ranks."""
    def args_of(variant):
        return ["--model", "tiny", "--epochs", str(epochs), "--warmup", "1",
                "--rows", str(rows)]

    found, records = _jobs(workdir, "tiny", ranks, rounds, args_of, tick)
    epoch = {v: [statistics.median(f["epochs"]) for f in found[v]] for v in VARIANTS}
    speedup, extent = paired_ratio(epoch["plain_1_thread"], epoch["wrapped"])
    user, user_extent = paired_ratio(epoch["plain_default_threads"], epoch["wrapped"])
    steps = {v: statistics.median(s for f in found[v] for s in f["seconds"]) for v in VARIANTS}
    return {"ranks": ranks, "batch_size": found["wrapped"][0]["batch_size"], "rows": rows,
            "epochs": epochs, "rounds": rounds,
            "epoch_median_s": {v: statistics.median(e) for v, e in epoch.items()},
            "round_medians_s": epoch, "step_median_s": steps,
            "speedup_vs_1_thread": speedup, "speedup_vs_1_thread_range": extent,
            "speedup_vs_default_threads": user,
            "speedup_vs_default_threads_range": user_extent,
            "split_s": split_of(records) if records else None}
