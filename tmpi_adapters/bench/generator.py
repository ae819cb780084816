"""The generator part of `tmpi bench`: a generator-fed Keras step against an in-memory one.

Under strong scaling rank 0 alone runs a Keras loop's generator and hands every
batch to every rank (:mod:`tmpi_adapters.frameworks.keras.feeding`).  This part
runs the same ``tmpi wrap -n N --threads-per-rank 1 --record`` job of
:mod:`tmpi_adapters.bench.scripts.keras_feed` (the benchmark's conv net) fed
both ways, taking turns round after round (ABBA): ``fit`` from arrays every rank
holds, and ``fit_generator`` on a ``Sequence`` that keeps up (one worker thread
slicing the arrays).  A step's time is its whole time in the record, the time
between steps included (where a batch is drawn, and where it travels); a round's
figure is the ratio of the two jobs' median steps, the part's the median over
rounds (the bar: within 3%).  It also reads, from the end-of-run line, how long handing a
batch out took rank 0, how long rank 0 waited for its generator, and the
share of batches whose broadcast ran during the step before.
"""
import os
import re
import statistics

from tmpi_adapters.bench.runs import interleaved, paired_ratio, read_record, run, tool

VARIANTS = ("memory", "generator")
#: Steps of each job left out of the figures (the first calls settle).
WARMUP = 3
#: What the end-of-run line says of the batches rank 0 handed out.
_NOTE = re.compile(r"every rank: (\d+) \(.*?; (\d+) sent during the step before\), "
                   r"([\d.]+) ms each to hand out; rank 0 waited ([\d.]+) ms per batch")


def script():
    from tmpi_adapters.bench import scripts
    return os.path.join(os.path.dirname(scripts.__file__), "keras_feed.py")


def command(ranks, variant, steps, batch_size, record):
    return [tool("tmpi"), "wrap", "-n", str(ranks), "--framework", "keras",
            "--threads-per-rank", "1", "--record", record, script(), "--feed", variant,
            "--steps", str(steps + WARMUP), "--batch-size", str(batch_size)]


def measure(workdir, ranks, steps, rounds, batch_size, tick=lambda text: None):
    """Generator-fed over in-memory step of the conv net on ``ranks`` ranks,
    ``batch_size`` rows per step."""
    medians = {v: [] for v in VARIANTS}
    hand_out, waited, ahead = [], [], []
    for r, variant in interleaved(rounds, VARIANTS):
        record = os.path.join(workdir, "generator-%s-%d.jsonl" % (variant, r))
        stdout = run(command(ranks, variant, steps, batch_size, record),
                     "generator (%s)" % variant)
        found = read_record(record)[WARMUP:]
        medians[variant].append(statistics.median(
            s["compute_s"] + s["comm_s"] + s["wait_s"] + s["data_s"] for s in found))
        if variant == "generator":
            note = _NOTE.search(stdout)
            if note:
                ahead.append(int(note.group(2)) / max(int(note.group(1)), 1))
                hand_out.append(float(note.group(3)) / 1e3)
                waited.append(float(note.group(4)) / 1e3)
        tick("generator: %s" % variant)
    ratio, extent = paired_ratio(medians["generator"], medians["memory"])
    return {"ranks": ranks, "steps": steps, "rounds": rounds, "batch_size": batch_size,
            "step_median_s": {v: statistics.median(m) for v, m in medians.items()},
            "round_medians_s": medians, "generator_over_memory": ratio,
            "generator_over_memory_range": extent,
            "hand_out_s_per_batch": statistics.median(hand_out) if hand_out else None,
            "sent_during_the_step_before": statistics.median(ahead) if ahead else None,
            "rank0_wait_s_per_batch": statistics.median(waited) if waited else None}
