"""The spread part of `tmpi bench`: the same short N-rank job, again and again.

Two ranks that the kernel left on one core take turns on it: each collective
waits for the other rank's time slice, and a step of a small model takes 20
times as long, in some runs and not in others.  This part runs the tiny MLP's
short job ``runs`` times with each rank bound to cores of its own (tmpi's
default) and as many times with ``--bind none`` (the kernel places the
ranks), taking turns, and reports each run's median step and the spread:
the slowest run's median over the fastest's.  Then binding's cost where the
ranks compute most: the conv net and the BLAS-bound ``deep`` MLP, bound and
unbound, taking turns (``rounds`` each): the bound median step over the
unbound one.
"""
import statistics

from tmpi_adapters.bench.runs import interleaved, models_script, parse_steps, run, tool

VARIANTS = ("bound", "unbound")


def measure(ranks, runs, steps, rounds=2, model_steps=8, tick=lambda text: None):
    medians = {v: [] for v in VARIANTS}
    for _, variant in interleaved(runs, VARIANTS):
        command = [tool("tmpi"), "wrap", "-n", str(ranks), "--no-summary",
                   "--bind", "cores" if variant == "bound" else "none", models_script(),
                   "--model", "tiny", "--steps", str(steps)]
        found = parse_steps(run(command, "spread (%s)" % variant, threads=1))
        medians[variant].append(statistics.median(found["seconds"]))
        tick("spread: %s" % variant)
    cost = {}
    for model in ("convnet", "deep"):
        found = {v: [] for v in VARIANTS}
        for _, variant in interleaved(rounds, VARIANTS):
            command = [tool("tmpi"), "wrap", "-n", str(ranks), "--no-summary", "--bind",
                       "cores" if variant == "bound" else "none", models_script(),
                       "--model", model, "--steps", str(model_steps)]
            found[variant].append(statistics.median(
                parse_steps(run(command, "spread (%s, %s)" % (model, variant)))["seconds"]))
            tick("spread: %s, %s" % (model, variant))
        cost[model] = {"step_median_s": found,
                       "bound_over_unbound": statistics.median(found["bound"]) /
                       statistics.median(found["unbound"])}
    return {"ranks": ranks, "runs": runs, "steps": steps,
            "step_median_s": medians,
            "spread": {v: max(m) / min(m) for v, m in medians.items()},
            "binding_cost": cost}
