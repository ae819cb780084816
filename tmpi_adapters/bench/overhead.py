"""The overhead part of `tmpi bench`: one wrapped rank against the plain script.

For each model of :mod:`tmpi_adapters.bench.models` (the compute-bound conv
net, the many-array ``deep`` MLP, the latency-bound ``tiny`` MLP) the plain
script (``python models.py``) and ``tmpi wrap -n 1 models.py`` run as
separate processes, as a user runs them, with the same BLAS threads given to
both explicitly.  The processes take turns, round after round and model
after model (ABBA), so that a shared machine's swings hit both alike; every
process reports the seconds of each timed step, and a round's overhead is
the ratio of the two processes' median steps, minus one.  The part's
overhead is the median over rounds; beside it, the ratio of the fastest
steps of all rounds, the figure a busy machine disturbs least.
"""
import statistics

from tmpi_adapters.bench.runs import (models_script, paired_ratio, parse_steps, python, run,
                                      tool)

#: The models whose overhead is measured, and the steps each process times
#: at full length (steps take ~110 ms, ~12 ms and ~3 ms).
MODELS = {"convnet": 30, "deep": 150, "tiny": 600}
VARIANTS = ("plain", "wrapped")


def command(variant, model, steps, threads):
    """The plain script's or ``tmpi wrap -n 1``'s command line."""
    script = [models_script(), "--model", model, "--steps", str(steps), "--warmup", "5"]
    if variant == "plain":
        return [python()] + script
    return [tool("tmpi"), "wrap", "-n", "1", "--threads-per-rank", str(threads),
            "--no-summary"] + script


def measure(models, rounds, scale, threads=1, tick=lambda text: None):
    """The overhead of each of ``models``; ``scale`` multiplies the timed steps."""
    samples = {m: {v: [] for v in VARIANTS} for m in models}
    for r, model in ((r, m) for r in range(rounds) for m in models):
        steps = max(5, int(MODELS[model] * scale))
        for variant in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            stdout = run(command(variant, model, steps, threads),
                         "%s %s" % (variant, model), threads=threads)
            samples[model][variant].append(parse_steps(stdout)["seconds"])
        tick("overhead: %s, round %d" % (model, r + 1))
    return {"threads": threads, "rounds": rounds,
            "models": {m: summarize(samples[m]) for m in models}}


def summarize(samples):
    """Medians, the per-round overheads and their median (the headline)."""
    plain = [statistics.median(s) for s in samples["plain"]]
    wrapped = [statistics.median(s) for s in samples["wrapped"]]
    ratio, extent = paired_ratio(wrapped, plain)
    # The fastest step of all rounds: the least disturbed by other load.
    fastest = {v: min(min(times) for times in samples[v]) for v in VARIANTS}
    return {"steps": len(samples["plain"][0]),
            "fastest_step_s": fastest,
            "fastest_step_overhead": fastest["wrapped"] / fastest["plain"] - 1.0,
            "plain_median_s": statistics.median(plain),
            "wrapped_median_s": statistics.median(wrapped),
            "plain_round_medians_s": plain, "wrapped_round_medians_s": wrapped,
            "overhead": ratio - 1.0, "overhead_range": [extent[0] - 1.0, extent[1] - 1.0],
            "samples_s": samples}
