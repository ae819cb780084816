"""The collectives part of `tmpi bench`: how many collectives a BSP step issues.

What a BSP step needs at its end travels in one collective: the gradients,
the returned losses and metrics, the model state and the metric
accumulators ride in one message with its lockstep envelope.  Only values
the step reads again before its end (a BatchNorm's batch mean and variance,
forward and backward) need collectives of their own: with ``--batch-stats
local`` they stay each rank's own, and the step is exactly one collective
(the bar); by default they are the whole batch's, and the count is reported
beside it (``exact``: 26 BatchNorm layers take 4 each in the plain Theano
script).  This part runs a small real script of each framework under
``tmpi wrap -n N --record`` both ways and counts, from the record, the
collectives every training step issued:

``theano``
    :mod:`tmpi_adapters.bench.models` ``--model deep``: 106 gradients, 52
    running statistics, a loss and an accuracy;
``lasagne``
    :mod:`tmpi_adapters.bench.scripts.lasagne_mlp`: the MNIST example's MLP
    (dropout, Nesterov momentum);
``keras``
    :mod:`tmpi_adapters.bench.scripts.keras_mlp`: ``fit`` with a
    BatchNormalization layer, Adam and an accuracy metric.
"""
import os

from tmpi_adapters.bench.runs import models_script, read_record, run, tool

FRAMEWORKS = ("theano", "lasagne", "keras")


def script(framework):
    """The command line (after ``tmpi wrap ...``) of ``framework``'s script."""
    if framework == "theano":
        return [models_script(), "--model", "deep", "--steps", "10", "--warmup", "1"]
    from tmpi_adapters.bench import scripts
    return [os.path.join(os.path.dirname(scripts.__file__), "%s_mlp.py" % framework), "2"]


def count(workdir, frameworks, ranks, tick=lambda text: None):
    """Collectives per training step of each framework's script on ``ranks`` ranks."""
    found = {}
    for framework in frameworks:
        command = script(framework)
        counted = {}
        for stats in ("local", "global"):
            record = os.path.join(workdir, "collectives-%s-%s.jsonl" % (framework, stats))
            run([tool("tmpi"), "wrap", "-n", str(ranks), "--framework", framework,
                 "--threads-per-rank", "1", "--batch-stats", stats, "--record", record,
                 "--no-summary"] + command, "collectives (%s, %s batch statistics)"
                % (framework, stats))
            counted[stats] = [step["collectives"] for step in read_record(record)]
        counts, exact = counted["local"], counted["global"]
        found[framework] = {
            "script": " ".join([os.path.basename(command[0])] + command[1:]),
            "ranks": ranks, "steps": len(counts),
            "collectives_per_step": {"min": min(counts), "max": max(counts)} if counts else None,
            "counts": counts,
            "exact_collectives_per_step": {"min": min(exact), "max": max(exact)}
            if exact else None}
        tick("collectives: %s" % framework)
    return found
