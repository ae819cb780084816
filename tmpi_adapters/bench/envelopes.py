"""The envelopes part of `tmpi bench`: what the lockstep envelopes cost.

Every collective of a step carries a lockstep envelope (a token per rank in
the message's header, checked on arrival: :mod:`tmpi_adapters.exchangers.lockstep`).
``TMPI_ENVELOPES=0`` turns them off for a whole job.  This part runs the same
``tmpi wrap -n N --threads-per-rank 1`` job of each model of
:mod:`tmpi_adapters.bench.models` with the envelopes (the default) and
without, the two taking turns round after round (ABBA); a round's cost is
the ratio of the two jobs' median steps, minus one, and the part's cost the
median over rounds.  The model is the latency-bound ``tiny`` MLP, where a
fixed cost per message shows most.  (The scaling part measures the same
cost on the conv net inside one job, switching the envelopes off for every
other N-rank step: :mod:`tmpi_adapters.bench.scaling`.)
"""
import statistics

from tmpi_adapters.bench.runs import (bench_environment, interleaved, models_script,
                                      paired_ratio, parse_steps, run, tool)

#: The models, and the steps each job times at full length.
MODELS = {"tiny": 400}
#: ``TMPI_ENVELOPES`` of each variant.
VARIANTS = {"envelopes": "1", "no_envelopes": "0"}


def command(ranks, model, steps):
    return [tool("tmpi"), "wrap", "-n", str(ranks), "--threads-per-rank", "1", "--no-summary",
            models_script(), "--model", model, "--steps", str(steps), "--warmup", "5"]


def measure(ranks, models, rounds, scale, tick=lambda text: None):
    """The envelopes' cost on each of ``models``; ``scale`` multiplies the timed steps."""
    found = {}
    for model in models:
        steps = max(10, int(MODELS[model] * scale))
        medians = {v: [] for v in VARIANTS}
        for r, variant in interleaved(rounds, VARIANTS):
            env = bench_environment(1, {"TMPI_ENVELOPES": VARIANTS[variant]})
            stdout = run(command(ranks, model, steps), "%s %s" % (model, variant), env=env)
            medians[variant].append(statistics.median(parse_steps(stdout)["seconds"]))
            tick("envelopes: %s, %s" % (model, variant))
        ratio, extent = paired_ratio(medians["envelopes"], medians["no_envelopes"])
        found[model] = {"ranks": ranks, "steps": steps, "rounds": rounds,
                        "step_median_s": {v: statistics.median(m) for v, m in medians.items()},
                        "round_medians_s": medians,
                        "cost": ratio - 1.0, "cost_range": [extent[0] - 1.0, extent[1] - 1.0]}
    return found
