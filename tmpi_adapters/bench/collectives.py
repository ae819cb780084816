"""The collectives part of `tmpi bench`: how many collectives a BSP step issues.

What a BSP step needs at its end travels in one collective: the gradients,
the returned losses and metrics, the model state and the metric
accumulators ride in one message with its lockstep envelope.  Only values
the step reads again before its end (a BatchNorm's batch mean and variance,
forward and backward) need collectives of their own.  By default (exact:
the one-process numbers) a BatchNorm layer takes two, the floor: its mean
and its variance in one (the variance from each rank's moments), its
backward's sums in one; the bar is ``1 + 2`` per BatchNorm layer, judged on
the default.  With ``--batch-stats local`` they stay each rank's own and the
step is one collective; that count is reported beside it.  This part runs a
small real script of each framework under ``tmpi wrap -n N --record`` both
ways and counts, from the record, the collectives every training step
issued:

``theano``
    :mod:`tmpi_adapters.bench.models` ``--model deep``: 26 BatchNorm layers,
    106 gradients, 52 running statistics, a loss and an accuracy;
``lasagne``
    :mod:`tmpi_adapters.bench.scripts.lasagne_mlp`: the MNIST example's MLP
    (dropout, Nesterov momentum), no BatchNorm;
``keras``
    :mod:`tmpi_adapters.bench.scripts.keras_mlp`: ``fit`` with one
    BatchNormalization layer, Adam and an accuracy metric.
"""
import os

from tmpi_adapters.bench.runs import models_script, read_record, run, tool

FRAMEWORKS = ("theano", "lasagne", "keras")
#: BatchNorm layers in each framework's script (:data:`FRAMEWORKS`).
BATCH_NORM_LAYERS = {"theano": 26, "lasagne": 0, "keras": 1}


def floor(framework):
    """The fewest collectives an exact step of ``framework``'s script can
    issue: the exchange, and two per BatchNorm layer."""
    return 1 + 2 * BATCH_NORM_LAYERS[framework]


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
        exact, local = counted["global"], counted["local"]
        found[framework] = {
            "script": " ".join([os.path.basename(command[0])] + command[1:]),
            "ranks": ranks, "steps": len(exact),
            "batch_norm_layers": BATCH_NORM_LAYERS[framework], "floor": floor(framework),
            "collectives_per_step": {"min": min(exact), "max": max(exact)} if exact else None,
            "counts": exact,
            "local_collectives_per_step": {"min": min(local), "max": max(local)}
            if local else None}
        tick("collectives: %s" % framework)
    return found
