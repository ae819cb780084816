"""The coupling part of `tmpi bench`: what exactness costs where a step's rows meet.

By default tmpi gives every step the one-process numbers, also where rows
meet (BatchNorm's batch statistics, a recurrent layer's time steps merged
with the rows).  This part times, in one run, the same ``tmpi wrap
--threads-per-rank 1 --record`` jobs taking turns round after round (ABBA),
and compares their median steps round by round:

``wrn``
    the Keras WRN-10-1 example (``examples/keras_wresnet``, 7 BatchNorm
    layers, synthetic images, no augmentation) on N ranks, exact (the
    default) against ``--batch-stats local``, DDP's unsynchronised BatchNorm
    (reported);
``rnn``
    :mod:`tmpi_adapters.bench.scripts.lasagne_rnn`, a bidirectional Lasagne
    0.1 recurrent net, on N ranks against 1 (its rows distributed, not
    gathered: the bar, at least 1.6 on 2 ranks);
``mlp``
    :mod:`tmpi_adapters.bench.scripts.keras_mlp`'s model (one BatchNorm
    layer) trained by ``fit`` on N ranks, exact against local (reported);
``wrn_interleaved``
    the same WRN-10-1 model exact and local in one job
    (:mod:`tmpi_adapters.bench.scripts.wrn_interleaved`), their steps taking
    turns (ABBA at the level of steps): separate jobs on a shared machine
    differ by 5-20% from one job to the next, which steps taking turns in
    one job cancel (the bar: exact within 3%).

A step's time is its whole time in the record (compute, exchange, waits and
the time between steps).  Where the WRN example is not beside the package
(an installed wheel), that case is skipped and the JSON says why.
"""
import os
import statistics

from tmpi_adapters.bench.runs import interleaved, paired_ratio, read_record, run, tool

#: Steps of each job left out of the figures (the first calls settle).
WARMUP = 3


def _scripts():
    from tmpi_adapters.bench import scripts
    return os.path.dirname(scripts.__file__)


def wrn_example():
    """The WRN example's ``train.py`` beside the package, or ``None``."""
    import tmpi_adapters
    root = os.path.dirname(os.path.dirname(os.path.abspath(tmpi_adapters.__file__)))
    path = os.path.join(root, "examples", "keras_wresnet", "train.py")
    return path if os.path.exists(path) else None


def _median_step(found):
    """The median whole step of step records, and the last one's collectives."""
    return statistics.median(s["compute_s"] + s["comm_s"] + s["wait_s"] + s["data_s"]
                             for s in found), found[-1]["collectives"] if found else None


def _step_s(record):
    return _median_step(read_record(record)[WARMUP:])


def _steps_by_model(record):
    """Each training function's median step in a job's record (its first
    :data:`WARMUP` steps left out), and its collectives per step."""
    by_model = {}
    for s in read_record(record):
        by_model.setdefault(s["model"], []).append(s)
    return {model: _median_step(found[WARMUP:])
            for model, found in by_model.items() if len(found) > WARMUP}


def _job(framework, ranks, command, record, stats="global"):
    return [tool("tmpi"), "wrap", "-n", str(ranks), "--framework", framework,
            "--threads-per-rank", "1", "--batch-stats", stats, "--record", record] + command


def cases(ranks, steps):
    """``{case: {variant: (framework, ranks, command, batch_stats)}}``."""
    rnn = [os.path.join(_scripts(), "lasagne_rnn.py"), "--steps", str(steps + WARMUP)]
    found = {"rnn": {"one": ("lasagne", 1, rnn, "global"),
                     "ranks": ("lasagne", ranks, rnn, "global")}}
    mlp = [os.path.join(_scripts(), "keras_mlp.py"), "1"]
    found["mlp"] = {"exact": ("keras", ranks, mlp, "global"),
                    "local": ("keras", ranks, mlp, "local")}
    example = wrn_example()
    if example is not None:
        # One epoch of (steps + warm-up) batches of 64 images.
        wrn = [example, "--depth", "10", "--width", "1", "--dataset", "synthetic",
               "--no-augment", "--epochs", "1", "--batch-size", "64",
               "--train-size", str(64 * (steps + WARMUP)), "--val-size", "64"]
        found["wrn"] = {"exact": ("keras", ranks, wrn, "global"),
                        "local": ("keras", ranks, wrn, "local")}
        both = [os.path.join(_scripts(), "wrn_interleaved.py"), os.path.dirname(example),
                str(steps + WARMUP)]
        found["wrn_interleaved"] = {"both": ("keras", ranks, both, "global")}
    return found


def measure(workdir, ranks, steps, rounds, tick=lambda text: None):
    """Each case's variants, ``rounds`` ABBA rounds of separate jobs."""
    result = {"ranks": ranks, "steps": steps, "rounds": rounds}
    for case, variants in cases(ranks, steps).items():
        medians = {}
        collectives = {}
        for r, variant in interleaved(rounds, variants):
            framework, n, command, stats = variants[variant]
            record = os.path.join(workdir, "coupling-%s-%s-%d.jsonl" % (case, variant, r))
            run(_job(framework, n, command, record, stats), "coupling (%s, %s)" % (case, variant))
            if case == "wrn_interleaved":
                # train_function#0 is the exact model, #1 the local one.
                models = _steps_by_model(record)
                for name, model in (("exact", "train_function#0"), ("local", "train_function#1")):
                    step, collectives[name] = models[model]
                    medians.setdefault(name, []).append(step)
            else:
                step, collectives[variant] = _step_s(record)
                medians.setdefault(variant, []).append(step)
            tick("coupling: %s %s" % (case, variant))
        found = {"step_median_s": {v: statistics.median(m) for v, m in medians.items()},
                 "round_medians_s": medians, "collectives_per_step": collectives}
        if case == "rnn":
            found["speedup"], found["speedup_range"] = paired_ratio(medians["one"],
                                                                    medians["ranks"])
        else:
            found["exact_over_local"], found["exact_over_local_range"] = paired_ratio(
                medians["exact"], medians["local"])
        result[case] = found
    if wrn_example() is None:
        result["wrn"] = {"skipped": "examples/keras_wresnet is not beside the package"}
    return result
