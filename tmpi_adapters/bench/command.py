"""`tmpi bench`: the exchange, the overhead, the scaling and the collectives, side by side.

``tmpi bench [--quick] [--parts a,b,...] [--json FILE] [-n N]`` runs these
parts, in this order, each as processes of its own (:mod:`.runs`):

exchange
    a whole model's gradients (AlexNet's shapes) reduced on N ranks every
    way side by side: raw mpi4py ``Allreduce`` (the floor), the fused
    exchange at fp32/fp16/bf16, one collective per parameter, and
    ``torch.distributed`` (gloo) where torch is installed
    (:mod:`.exchange`);
overhead
    ``tmpi wrap -n 1`` against the plain script, separate processes taking
    turns, on the conv net, the many-array ``deep`` MLP and the ``tiny`` MLP
    (:mod:`.overhead`);
scaling
    BSP on N ranks against 1 rank and against N independent processes (the
    ceiling), step by step in one job (:mod:`.scaling`);
processes
    ``tmpi wrap -n N`` against the plain script with one BLAS thread and
    with the library's default threads (the user's baseline), separate
    jobs: the conv net per step, the tiny MLP per epoch (:mod:`.processes`);
collectives
    collectives per BSP step of a plain Theano, a Lasagne and a Keras
    script, counted from ``--record`` (:mod:`.collectives`);
envelopes
    the same N-rank job with ``TMPI_ENVELOPES=0`` against the default
    (:mod:`.envelopes`);
network
    2 ranks in network namespaces joined by an emulated link
    (:mod:`.remote`, :mod:`.network`); skipped, with the reason, where that
    cannot run (not root, no ``ip netns``);
spread
    the same short N-rank job of the tiny MLP, again and again, each rank
    bound to cores of its own and with ``--bind none``, taking turns: the
    slowest run's median step over the fastest's (:mod:`.spread`);
device
    the conv net on the device ``THEANO_FLAGS`` names (a GPU, or the OpenCL
    device on the CPU): ``tmpi wrap -n 1`` against the plain script, and 2
    ranks sharing the device against 2 independent half-batch processes
    (:mod:`.device`); skipped, saying so, without a device.

Every comparison interleaves its cases so that a shared, noisy machine slows
all of them alike.  The results print as a table and, with ``--json``, land
in one file: each part's results under its name, the headline figures at
the top level (and under ``headline``) and ``bars``: every bar of the
design with its ``value``, its ``bar`` and whether it is ``met``.
"""
import argparse
import json
import math
import os
import shlex
import statistics
import sys
import tempfile
import time

from tmpi_adapters.bench import runs
from tmpi_adapters.errors import TmpiError

#: The parts of a run, in the order they run.
PARTS = ("exchange", "overhead", "scaling", "processes", "collectives", "envelopes", "network",
         "spread", "device")

#: ``--quick`` (CI-sized) and full settings.
#:   width, repetitions: the AlexNet width and repetitions of the exchange;
#:   steps: timed conv net steps per job (scaling, processes);
#:   rounds: ABBA rounds of the parts made of separate jobs;
#:   scale: multiplies the overhead and envelope parts' timed steps;
#:   tiny_epochs, tiny_rows: the tiny MLP's timed epochs and their rows;
#:   links, network_*: the network part's links, steps, rounds, repetitions.
PRESETS = {
    "quick": {"width": 0.25, "repetitions": 5, "steps": 8, "rounds": 2, "scale": 0.25,
              "spread_runs": 10, "spread_steps": 60,
              "tiny_epochs": 2, "tiny_rows": 2000, "links": "2gbit:50us",
              "network_steps": 4, "network_rounds": 1, "network_repetitions": 3},
    "full": {"width": 1.0, "repetitions": 9, "steps": 20, "rounds": 3, "scale": 0.5,
             "spread_runs": 10, "spread_steps": 100,
             "tiny_epochs": 2, "tiny_rows": 4000, "links": "10gbit:50us,2gbit:50us",
             "network_steps": 6, "network_rounds": 2, "network_repetitions": 7},
}

#: The bars: ``key: (sense, bound, issue, what)``; ``key`` is a headline figure.
BARS = {
    "overhead_1_rank_convnet": ("<=", 0.01, 17, "1-rank overhead, conv net, separate processes"),
    "overhead_1_rank_deep": ("<=", 0.01, 17, "1-rank overhead, many-array model (106 arrays)"),
    "overhead_1_rank_tiny": ("<=", 0.01, 17, "1-rank overhead, tiny MLP"),
    "collectives_per_step_theano": ("==", 1, 17, "collectives per BSP step, plain Theano"),
    "collectives_per_step_lasagne": ("==", 1, 17, "collectives per BSP step, Lasagne"),
    "collectives_per_step_keras": ("==", 1, 17, "collectives per BSP step, Keras"),
    "tiny_speedup_per_epoch": (">=", 1.0, 17, "tiny MLP: N-rank epoch vs 1-rank epoch"),
    "convnet_speedup_vs_1_thread": (">=", 1.9, 17,
                                    "conv net: N ranks vs 1 rank, 1 BLAS thread each"),
    "network_speedup": (">=", 1.6, 17,
                        "emulated link: 2-rank BSP vs 1 rank (the bar is for BSP with overlap)"),
    "network_fp16_over_fp32": ("<=", 0.6, 17, "emulated link: fp16 / fp32 exchange time"),
    "network_exchange_over_ring_floor": ("<=", 1.3, 17,
                                         "emulated link: fp32 exchange / ring floor"),
    "spread_bound": ("<=", 2.0, 35, "the same short 2-rank job: slowest / fastest median step"),
    "device_overhead_1_rank": ("<=", 0.02, 32, "device: 1-rank overhead, conv net"),
    "device_two_ranks_over_independent": (">=", 0.95, 32,
                                          "device: 2 ranks sharing it / 2 independent processes"),
    "fused_over_raw_allreduce": ("<=", 1.1, None, "fused exchange / raw Allreduce"),
    "fp16_over_fp32": ("<=", 0.6, None, "fp16 / fp32 exchange time, shared memory"),
}


# -- the parts ------------------------------------------------------------------------

def part_exchange(args, values, workdir, tick):
    out = os.path.join(workdir, "exchange.json")
    command = [runs.mpiexec(), "-n", str(args.ranks), runs.python(), "-m",
               "tmpi_adapters.bench.exchange", "--json", out, "--width", str(values["width"]),
               "--repetitions", str(values["repetitions"])]
    if args.no_torch:
        command.append("--no-torch")
    runs.run(command, "exchange")
    tick("exchange")
    return runs.read_json(out)


def part_overhead(args, values, workdir, tick):
    from tmpi_adapters.bench import overhead
    return overhead.measure(list(overhead.MODELS), values["rounds"], values["scale"],
                            tick=tick)


def part_scaling(args, values, workdir, tick):
    out = os.path.join(workdir, "scaling.json")
    runs.run([runs.mpiexec(), "-n", str(args.ranks), runs.python(), "-m",
              "tmpi_adapters.bench.scaling", "--json", out, "--batch-size",
              str(args.batch_size), "--steps", str(values["steps"])], "scaling")
    tick("scaling")
    return runs.read_json(out)


def part_processes(args, values, workdir, tick):
    from tmpi_adapters.bench import processes
    return {"convnet": processes.convnet(workdir, args.ranks, args.batch_size, values["steps"],
                                         values["rounds"], tick),
            "tiny": processes.tiny_epochs(workdir, args.ranks, values["tiny_epochs"],
                                          values["tiny_rows"], values["rounds"], tick)}


def part_collectives(args, values, workdir, tick):
    from tmpi_adapters.bench import collectives
    frameworks = _names(args.frameworks, collectives.FRAMEWORKS, "--frameworks")
    return collectives.count(workdir, frameworks, args.ranks, tick)


def part_envelopes(args, values, workdir, tick):
    from tmpi_adapters.bench import envelopes
    return envelopes.measure(args.ranks, list(envelopes.MODELS), values["rounds"],
                             values["scale"], tick)


def part_network(args, values, workdir, tick):
    from tmpi_adapters.bench import remote
    result = remote.measure(workdir, remote.parse_links(values["links"]),
                            args.network_batch_size, values["network_steps"],
                            values["network_rounds"], values["network_repetitions"], tick)
    if "bsp_overlap" not in result.get("variants", ()):
        result["overlap"] = ("not implemented: tmpi wrap has no --overlap; the figures are "
                             "BSP without overlap")
    return result


def part_spread(args, values, workdir, tick):
    from tmpi_adapters.bench import spread
    return spread.measure(args.ranks, values["spread_runs"], values["spread_steps"],
                          values["rounds"], values["steps"], tick)


def part_device(args, values, workdir, tick):
    from tmpi_adapters.bench import device
    return device.measure(workdir, args.device_batch_size, values["steps"], values["rounds"],
                          tick)


PART_RUNNERS = {name: globals()["part_" + name] for name in PARTS}


# -- the headline and the bars ----------------------------------------------------------

def headline(results, ranks):
    """The figures the README shows, each a number (``None``: not measured)."""
    top = {}
    exchange = results.get("exchange")
    if exchange:
        for key in ("fused_over_raw_allreduce", "fused_over_raw_allreduce_in_place",
                    "per_parameter_over_fused", "fp16_over_fp32", "bf16_over_fp32",
                    "fp16_over_fp32_wire", "bf16_over_fp32_wire", "torch_gloo_over_fused",
                    "fused_over_ring_floor"):
            if key in exchange["ratios"]:
                top[key] = exchange["ratios"][key]
    overhead = results.get("overhead")
    if overhead:
        for model, found in overhead["models"].items():
            top["overhead_1_rank_" + model] = found["overhead"]
        top["overhead_1_rank"] = max(f["overhead"] for f in overhead["models"].values())
    scaling = results.get("scaling")
    if scaling:
        top["speedup_%d_ranks" % ranks] = scaling["speedup"]
        top["speedup_ceiling_%d_ranks" % ranks] = scaling["ceiling"]
        top["scaling_efficiency"] = scaling["efficiency"]
    processes = results.get("processes")
    if processes:
        convnet, tiny = processes["convnet"], processes["tiny"]
        top["convnet_speedup_vs_1_thread"] = convnet["speedup_vs_1_thread"]
        top["convnet_speedup_vs_user_baseline"] = convnet["speedup_vs_default_threads"]
        top["tiny_speedup_per_epoch"] = tiny["speedup_vs_1_thread"]
        top["tiny_speedup_vs_user_baseline"] = tiny["speedup_vs_default_threads"]
    for framework, found in (results.get("collectives") or {}).items():
        counts = found["collectives_per_step"]
        top["collectives_per_step_" + framework] = counts["max"] if counts else None
    for model, found in (results.get("envelopes") or {}).items():
        top["envelope_cost_" + model] = found["cost"]
    if scaling and "envelope_cost" in scaling:
        top["envelope_cost_convnet_in_one_job"] = scaling["envelope_cost"]
    network = results.get("network")
    if network:
        from tmpi_adapters.bench import remote
        name = remote.trusted_link(network)
        link = network["links"][name] if name else {}
        top["network_speedup"] = link.get("speedup_2_ranks")
        top["network_fp16_over_fp32"] = link.get("fp16_over_fp32")
        top["network_exchange_over_ring_floor"] = link.get("exchange_over_ring_floor")
    found = results.get("spread")
    if found:
        top["spread_bound"] = found["spread"]["bound"]
        top["spread_unbound"] = found["spread"]["unbound"]
        for model, cost in found["binding_cost"].items():
            top["binding_cost_" + model] = cost["bound_over_unbound"]
    device = results.get("device")
    if device and "skipped" not in device:
        top["device_overhead_1_rank"] = device["overhead_1_rank"]
        top["device_two_ranks_over_independent"] = device["two_ranks_over_independent"]
        top["device_two_ranks_over_one_process"] = device["two_ranks_over_one_process"]
        top["device_exchange_ms_per_step"] = 1e3 * device["exchange_s_per_step"]
    return top


def bars(results, top):
    """Every bar whose part ran: ``{key: {"value", "bar", "met", ...}}``."""
    found = {}
    collectives = results.get("collectives") or {}
    for key, (sense, bound, issue, what) in BARS.items():
        if key not in top:
            continue
        value = top[key]
        bar = {"value": value, "bar": "%s %g" % (sense, bound), "met": False, "what": what,
               "issue": issue}
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            bar["note"] = "not measured"
        elif sense == "==":
            counts = collectives[key[len("collectives_per_step_"):]]["collectives_per_step"]
            bar["met"] = counts["min"] == counts["max"] == bound
        else:
            bar["met"] = value <= bound if sense == "<=" else value >= bound
        if key.startswith("network_"):
            network = results["network"]
            if "skipped" in network:
                bar["note"] = "not measured: %s" % network["skipped"]
            elif key == "network_speedup" and "overlap" in network:
                bar["note"] = network["overlap"]
        found[key] = bar
    if "network" in results and "skipped" in results["network"]:
        # The network bars are listed, unmeasured, when the part could not run.
        for key in ("network_speedup", "network_fp16_over_fp32",
                    "network_exchange_over_ring_floor"):
            sense, bound, issue, what = BARS[key]
            found[key] = {"value": None, "bar": "%s %g" % (sense, bound), "met": False,
                          "what": what, "issue": issue,
                          "note": "not measured: %s" % results["network"]["skipped"]}
    return found


# -- the table ------------------------------------------------------------------------------

def _ms(seconds):
    return "%.1f ms" % (seconds * 1e3)


def _table(rows, header):
    return ["", "| %s |" % " | ".join(header),
            "|%s|" % "|".join(["---"] + ["---:"] * (len(header) - 1))] + rows


def _exchange_rows(exchange):
    median, floor = exchange["median_s"], exchange["ring_floor_s"]
    rows = []
    for label, key, fmt in (
            ("raw mpi4py Allreduce, one flat buffer", "raw_allreduce", "fp32"),
            ("raw Allreduce, MPI.IN_PLACE", "raw_allreduce_in_place", "fp32"),
            ("tmpi fused exchange, fp32", "fused", "fp32"),
            ("tmpi fused, MPI's Allreduce for buckets", "fused_mpi_algorithm", "fp32"),
            ("tmpi fused, results copied out", "fused_copy_out", "fp32"),
            ("one Allreduce per parameter", "per_parameter", "fp32"),
            ("tmpi fused exchange, fp16 transfer", "fused_fp16", "fp16"),
            ("tmpi fused exchange, bf16 transfer", "fused_bf16", "bf16"),
            ("torch.distributed all_reduce (gloo)", "torch_gloo", "fp32")):
        if key in median:
            rows.append("| %s | %s | %.2f | %s |" % (label, _ms(median[key]),
                                                     median[key] / median["raw_allreduce"],
                                                     _ms(floor[fmt])))
    if isinstance(exchange.get("torch"), dict):
        rows.append("| torch.distributed (gloo) | skipped: %s | | |"
                    % exchange["torch"]["skipped"])
    return _table(rows, ["exchange of %.0f MB (%d arrays) on %d ranks" % (
        exchange["bytes"] / 1e6, exchange["arrays"], exchange["ranks"]), "median", "vs raw",
        "ring floor"])


def _overhead_rows(overhead):
    rows = ["| %s | %s | %s | %+.1f%% (%+.1f%% .. %+.1f%%) | %s |" % (
        model, _ms(f["plain_median_s"]), _ms(f["wrapped_median_s"]), 100 * f["overhead"],
        100 * f["overhead_range"][0], 100 * f["overhead_range"][1],
        "%+.1f%%" % (100 * f["fastest_step_overhead"]) if "fastest_step_overhead" in f else "")
        for model, f in overhead["models"].items()]
    return _table(rows, ["1 rank, separate processes (%d rounds)" % overhead["rounds"],
                         "plain step", "tmpi wrap -n 1 step", "overhead (range)",
                         "fastest steps"])


def _scaling_rows(scaling):
    n, batch, steps = str(scaling["ranks"]), scaling["batch_size_per_rank"], \
        scaling["step_median_s"]
    split = scaling["split_s"]
    rows = []
    for key, label, ranks in (
            ("1", "1 rank, plain (taking turns with the others)", 1),
            ("independent", "%s ranks, plain, nothing exchanged (the ceiling)" % n, int(n)),
            (n, "tmpi BSP, %s ranks" % n, int(n))):
        per = " / ".join("%.1f" % (split[p] * 1e3) for p in ("compute_s", "comm_s", "wait_s")) \
            if key == n else ""
        rows.append("| %s | %s | %.0f | %s |" % (label, _ms(steps[key]),
                                                 ranks * batch / steps[key], per))
    return _table(rows, ["conv net, %d samples/rank, in one job" % batch, "step", "samples/s",
                         "compute / comm / wait ms"])


def _processes_rows(processes):
    convnet, tiny = processes["convnet"], processes["tiny"]
    n = convnet["ranks"]
    labels = {"plain_1_thread": "plain script, 1 BLAS thread",
              "plain_default_threads": "plain script, default threads (user's baseline)",
              "wrapped": "tmpi wrap -n %d, 1 thread per rank" % n}
    rows = []
    for variant, label in labels.items():
        rows.append("| %s | %s | %s |" % (label, _ms(convnet["step_median_s"][variant]),
                                          _ms(tiny["epoch_median_s"][variant])))
    rows.append("| tmpi speed-up vs 1 thread / vs user's baseline | %.2f / %.2f | %.2f / %.2f |"
                % (convnet["speedup_vs_1_thread"], convnet["speedup_vs_default_threads"],
                   tiny["speedup_vs_1_thread"], tiny["speedup_vs_default_threads"]))
    return _table(rows, ["separate jobs (%d rounds)" % convnet["rounds"],
                         "conv net step (%d samples/rank)" % convnet["batch_size_per_rank"],
                         "tiny MLP epoch (%d rows, batch %d)" % (tiny["rows"],
                                                                 tiny["batch_size"])])


def _collectives_rows(collectives):
    rows = []
    for framework, found in collectives.items():
        counts = found["collectives_per_step"]
        rows.append("| %s | %s | %d | %s |" % (
            framework, found["script"], found["steps"],
            "%d .. %d" % (counts["min"], counts["max"]) if counts else "no steps"))
    return _table(rows, ["framework", "script (tmpi wrap -n %d --record)" % next(
        iter(collectives.values()))["ranks"], "steps", "collectives per step"])


def _envelopes_rows(envelopes):
    rows = ["| %s, %d ranks | %s | %s | %+.1f%% (%+.1f%% .. %+.1f%%) |" % (
        model, f["ranks"], _ms(f["step_median_s"]["envelopes"]),
        _ms(f["step_median_s"]["no_envelopes"]), 100 * f["cost"], 100 * f["cost_range"][0],
        100 * f["cost_range"][1]) for model, f in envelopes.items()]
    return _table(rows, ["lockstep envelopes, separate jobs", "step",
                         "step, TMPI_ENVELOPES=0", "cost (range)"])


def _network_rows(network):
    if "skipped" in network:
        return ["", "network: skipped: %s" % network["skipped"]]
    rows = []
    overlap = "bsp_overlap" in network.get("variants", ())
    for name, link in network["links"].items():
        training = link["training"]
        rows.append("| %s | %.2f%s | %s / %s | %.2f | %.2f | %.2f |%s" % (
            name, link["fidelity"], "" if link["trusted"] else " (not trusted)",
            _ms(link["exchange"]["median_s"]["fused"]),
            _ms(link["exchange"]["median_s"]["fused_fp16"]), link["fp16_over_fp32"],
            link["exchange_over_ring_floor"], training["speedup_bsp"],
            " %.2f |" % training["speedup_bsp_overlap"] if overlap else ""))
    lines = _table(rows, ["link (2 ranks, wide conv net)", "ring step / rate's",
                          "exchange fp32 / fp16", "fp16/fp32", "fp32 / ring floor",
                          "BSP speed-up"] + (["BSP --overlap speed-up"] if overlap else []))
    if "overlap" in network:
        lines.append("overlap: %s" % network["overlap"])
    return lines


def _spread_rows(found):
    rows = ["| %s | %s | %.2f |" % (
        "each rank on cores of its own" if v == "bound" else "--bind none",
        " ".join("%.2f" % (m * 1e3) for m in found["step_median_s"][v]), found["spread"][v])
        for v in ("bound", "unbound")]
    rows += ["| %s, bound / unbound median step | %s / %s | %.3f |" % (
        model, _ms(statistics.median(c["step_median_s"]["bound"])),
        _ms(statistics.median(c["step_median_s"]["unbound"])), c["bound_over_unbound"])
        for model, c in found.get("binding_cost", {}).items()]
    return _table(rows, ["%d runs of %d ranks, tiny MLP, %d steps" % (
        found["runs"], found["ranks"], found["steps"]), "median step of each run (ms)",
        "slowest / fastest"])


def _device_rows(device):
    if "skipped" in device:
        return ["", "device: skipped: %s" % device["skipped"]]
    steps, rates = device["step_median_s"], device["samples_per_s"]
    half = device["batch_size"] // 2
    rows = ["| %s | %s | %.0f |" % (label, _ms(steps[key]), rates[key]) for key, label in (
        ("plain", "plain script, batch %d" % device["batch_size"]),
        ("wrapped_1", "tmpi wrap -n 1"),
        ("wrapped_2", "tmpi wrap -n 2, sharing the device (%d rows each)" % half),
        ("independent_2", "2 plain processes side by side, %d rows each" % half))]
    rows.append("| 1-rank overhead %+.1f%% (%+.1f%% .. %+.1f%%); 2 ranks / 2 processes %.2f; "
                "exchange %s per step | | |" % (
                    100 * device["overhead_1_rank"], 100 * device["overhead_1_rank_range"][0],
                    100 * device["overhead_1_rank_range"][1],
                    device["two_ranks_over_independent"], _ms(device["exchange_s_per_step"])))
    return _table(rows, ["conv net on %s" % device["device"], "step", "samples/s"])


def _bars_rows(found):
    rows = []
    for key, bar in found.items():
        value = bar["value"]
        shown = "-" if value is None else ("%d" % value if isinstance(value, int)
                                           else "%.3f" % value)
        mark = "met" if bar["met"] else "**not met**"
        if bar.get("note"):
            mark += " (%s)" % bar["note"]
        rows.append("| %s | %s | %s %s |" % (bar["what"], shown, bar["bar"], mark))
    return _table(rows, ["bar", "measured", "bar"])


def format_table(results):
    """The results as markdown tables (what bench/README.md shows)."""
    lines = []
    for part, rows in (("exchange", _exchange_rows), ("overhead", _overhead_rows),
                       ("scaling", _scaling_rows), ("processes", _processes_rows),
                       ("collectives", _collectives_rows), ("envelopes", _envelopes_rows),
                       ("network", _network_rows), ("spread", _spread_rows),
                       ("device", _device_rows)):
        if results.get(part):
            lines += rows(results[part])
    others = [k for k in results.get("headline", {}) if k not in results.get("bars", {})]
    if others:
        lines += _table(["| %s | %s |" % (k, "-" if results["headline"][k] is None
                                           else "%.3f" % results["headline"][k])
                         for k in others], ["figure", "measured"])
    if results.get("bars"):
        lines += _bars_rows(results["bars"])
    return "\n".join(lines).strip("\n")


# -- the command -----------------------------------------------------------------------------

def _names(text, known, option):
    names = [n.strip() for n in (text or ",".join(known)).split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise TmpiError("%s: unknown %s (choose from %s)" % (
            option, ", ".join(unknown) or "(none given)", ", ".join(known)))
    return names


def _parser():
    parser = argparse.ArgumentParser(
        prog="tmpi bench", description="Measure tmpi's exchange, overhead, scaling and "
                                       "collectives side by side (see bench/README.md).")
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized: smaller model, fewer steps, rounds and repetitions")
    parser.add_argument("--json", metavar="FILE", help="write the results here")
    parser.add_argument("-n", "--np", dest="ranks", type=int, default=2,
                        help="ranks of the parts that compare 1 rank with N (default 2)")
    parser.add_argument("--parts", help="comma-separated parts to run (default: all of %s)"
                                        % ",".join(PARTS))
    parser.add_argument("--frameworks", help="the collectives part's frameworks "
                                             "(default: theano,lasagne,keras)")
    parser.add_argument("--width", type=float, help="AlexNet width of the exchanged model")
    parser.add_argument("--repetitions", type=int, help="repetitions of the exchange")
    parser.add_argument("--steps", type=int, help="timed conv net steps per job")
    parser.add_argument("--rounds", type=int, help="rounds of the separate-job comparisons")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="conv net samples per rank per step (default 64)")
    parser.add_argument("--links", help="the network part's links, RATE:DELAY,... "
                                        "(default 10gbit:50us,2gbit:50us)")
    parser.add_argument("--network-batch-size", type=int, default=64,
                        help="wide conv net rows per rank on a 10 Gbit/s link (default 64)")
    parser.add_argument("--device-batch-size", type=int, default=128,
                        help="the device part's conv net rows per step (default 128)")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip torch.distributed even where it is installed")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar")
    return parser


def settings(args):
    values = dict(PRESETS["quick" if args.quick else "full"])
    for key in ("width", "repetitions", "steps", "rounds", "links"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    return values


def cmd_bench(argv):
    args = _parser().parse_args(argv)
    if args.ranks < 2:
        raise TmpiError("tmpi bench compares 1 rank with N: -n must be at least 2")
    parts = [p for p in PARTS if p in _names(args.parts, PARTS, "--parts")]
    if "network" in parts and args.ranks != 2:
        raise TmpiError("the network part joins exactly 2 ranks: run it with -n 2")
    values = settings(args)
    results = {"command": "tmpi bench " + " ".join(shlex.quote(a) for a in argv),
               "date": time.strftime("%Y-%m-%d"), "quick": args.quick, "parts": parts,
               "ranks": args.ranks, "settings": values, "machine": runs.machine()}
    started = time.monotonic()
    with _Progress(args.progress) as tick, \
            tempfile.TemporaryDirectory(prefix="tmpi-bench-") as workdir:
        for part in parts:
            begin = time.monotonic()
            results[part] = PART_RUNNERS[part](args, values, workdir, tick)
            results.setdefault("seconds", {})[part] = round(time.monotonic() - begin, 1)
    results["seconds"]["total"] = round(time.monotonic() - started, 1)
    if hasattr(os, "getloadavg"):
        results["machine"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    top = headline(results, args.ranks)
    results["headline"], results["bars"] = top, bars(results, top)
    # The headline figures also sit at the top level, where tools look first.
    results.update(top)
    print(format_table(results))
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
            handle.write("\n")
        print("results written to %s" % args.json)
    return 0


class _Progress:
    """A tqdm counter of the benchmark's runs; ``tick(text)`` advances it."""

    def __init__(self, enabled):
        self.enabled, self.bar = enabled, None

    def __enter__(self):
        if self.enabled:
            from tqdm import tqdm
            self.bar = tqdm(unit="run", file=sys.stderr, dynamic_ncols=True)
        return self.tick

    def tick(self, text):
        if self.bar is not None:
            self.bar.set_description(text, refresh=False)
            self.bar.update(1)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False
