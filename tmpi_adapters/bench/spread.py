"""The spread part of `tmpi bench`: the same short N-rank job, again and again.

Two ranks that the kernel left on one core take turns on it: each collective
waits for the other rank's time slice, and a step of a small model takes 20
times as long, in some runs and not in others.  This part runs the tiny MLP's
short job ``runs`` times with each rank bound to cores of its own (tmpi's
default) and as many times with ``--bind none`` (the kernel places the
ranks), taking turns, and reports each run's median step and the spread:
the slowest run's median over the fastest's.
"""
import statistics

from tmpi_adapters.bench.runs import interleaved, models_script, parse_steps, run, tool

VARIANTS = ("bound", "unbound")


def measure(ranks, runs, steps, tick=lambda text: None):
    medians = {v: [] for v in VARIANTS}
    for _, variant in interleaved(runs, VARIANTS):
        command = [tool("tmpi"), "wrap", "-n", str(ranks), "--no-summary",
                   "--bind", "cores" if variant == "bound" else "none", models_script(),
                   "--model", "tiny", "--steps", str(steps)]
        found = parse_steps(run(command, "spread (%s)" % variant, threads=1))
        medians[variant].append(statistics.median(found["seconds"]))
        tick("spread: %s" % variant)
    return {"ranks": ranks, "runs": runs, "steps": steps,
            "step_median_s": medians,
            "spread": {v: max(m) / min(m) for v, m in medians.items()}}
