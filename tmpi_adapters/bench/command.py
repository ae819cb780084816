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
    script, counted from ``--record``, exact (the default; the bar: 1 + 2
    per BatchNorm layer) and with ``--batch-stats local`` (reported)
    (:mod:`.collectives`);
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
generator
    a Keras conv net on N ranks fed by ``fit_generator`` (rank 0 draws each
    batch and hands it to every rank) against the same ``fit`` from memory,
    separate jobs taking turns (:mod:`.generator`);
coupling
    what exactness costs where rows meet: the Keras WRN-10-1 example and a
    Keras MLP with BatchNorm, exact against ``--batch-stats local``, and a
    Lasagne recurrent net on N ranks against 1, separate jobs taking turns
    (:mod:`.coupling`);
device
    the conv net on the device ``THEANO_FLAGS`` names (a GPU, or the OpenCL
    device on the CPU): ``tmpi wrap -n 1`` against the plain script, and 2
    ranks sharing the device against 2 independent half-batch processes
    (:mod:`.device`).  Where no device is named, or Theano cannot open the
    one named (it would compute on the CPU), the device part measures and
    judges nothing: ``--parts device`` stops with status 8, saying why; a
    run of every part leaves it out, with the reason in its results.

Every comparison interleaves its cases so that a shared, noisy machine slows
all of them alike.  The results print as a table and, with ``--json``, land
in one file: each part's results under its name, the headline figures at
the top level (and under ``headline``) and ``bars``: every bar of the
design with its ``value``, its ``bar`` and whether it is ``met``.

Interrupted (Ctrl-C, SIGTERM, SIGHUP) or stopped by an error, the benchmark
stops the process it is running and still prints and writes what it has:
the parts done, and what the part it was in had measured (``partial``; the
device part's runs and the figures they make), with ``stopped`` saying how
it ended; the figures of a part cut short are not judged against the bars.
It then exits 128 + the signal's number (130, 143), or with the error.
"""
import argparse
import json
import math
import os
import shlex
import sys
import tempfile
import time

from tmpi_adapters.bench import runs
from tmpi_adapters.bench.tables import format_table
from tmpi_adapters.errors import DeviceError, TmpiError

#: The parts of a run, in the order they run.
PARTS = ("exchange", "overhead", "scaling", "processes", "collectives", "envelopes", "network",
         "spread", "generator", "coupling", "device")
#: When parts newer than the first ones joined: a full run's results from before
#: that day do not have them.
ADDED = {"generator": "2026-11-28", "coupling": "2026-11-28"}

#: ``--quick`` (CI-sized) and full settings.
#:   width, repetitions: the AlexNet width and repetitions of the exchange;
#:   steps: timed conv net steps per job (scaling, processes);
#:   rounds: ABBA rounds of the parts made of separate jobs;
#:   scale: multiplies the overhead and envelope parts' timed steps;
#:   tiny_epochs, tiny_rows: the tiny MLP's timed epochs and their rows;
#:   links, network_*: the network part's links, steps, rounds, repetitions;
#:   feed_steps: timed steps of each job of the generator and coupling parts;
#:   coupling_rounds: the coupling part's ABBA rounds (its WRN bar is a 3%
#:   difference, under the swings of a shared machine: more rounds than the
#:   other parts; ``--rounds`` sets these too).
PRESETS = {
    "quick": {"width": 0.25, "repetitions": 5, "steps": 8, "rounds": 2, "scale": 0.25,
              "spread_runs": 10, "spread_steps": 60, "feed_steps": 20, "coupling_rounds": 2,
              "tiny_epochs": 2, "tiny_rows": 2000, "links": "2gbit:50us",
              "network_steps": 4, "network_rounds": 1, "network_repetitions": 3},
    "full": {"width": 1.0, "repetitions": 9, "steps": 20, "rounds": 3, "scale": 0.5,
             "spread_runs": 10, "spread_steps": 100, "feed_steps": 40, "coupling_rounds": 5,
             "tiny_epochs": 2, "tiny_rows": 4000, "links": "10gbit:50us,2gbit:50us",
             "network_steps": 6, "network_rounds": 2, "network_repetitions": 7},
}

#: The bars: ``key: (sense, bound, issue, what)``; ``key`` is a headline figure.
BARS = {
    "overhead_1_rank_convnet": ("<=", 0.01, 17, "1-rank overhead, conv net, separate processes"),
    "overhead_1_rank_deep": ("<=", 0.01, 17, "1-rank overhead, many-array model (106 arrays)"),
    "overhead_1_rank_tiny": ("<=", 0.01, 17, "1-rank overhead, tiny MLP"),
    "collectives_per_step_theano": ("<=", 53, 47, "collectives per exact BSP step, plain "
                                    "Theano deep (26 BatchNorm layers: 1 + 2 each)"),
    "collectives_per_step_lasagne": ("==", 1, 17, "collectives per exact BSP step, Lasagne"),
    "collectives_per_step_keras": ("<=", 3, 47, "collectives per exact BSP step, Keras MLP "
                                   "(one BatchNorm layer: 1 + 2)"),
    "tiny_speedup_per_epoch": (">=", 1.0, 17, "tiny MLP: N-rank epoch vs 1-rank epoch"),
    "convnet_speedup_vs_1_thread": (">=", 1.9, 17,
                                    "conv net: N ranks vs 1 rank, 1 BLAS thread each"),
    "network_speedup": (">=", 1.6, 17,
                        "emulated link: 2-rank BSP vs 1 rank (the bar is for BSP with overlap)"),
    "network_fp16_over_fp32": ("<=", 0.6, 17, "emulated link: fp16 / fp32 exchange time"),
    "network_exchange_over_ring_floor": ("<=", 1.3, 17,
                                         "emulated link: fp32 exchange / ring floor"),
    "spread_bound": ("<=", 2.0, 35, "the same short 2-rank job: slowest / fastest median step"),
    "wrn_interleaved_exact_over_local": ("<=", 1.03, 47,
                                         "Keras WRN-10-1: exact step / --batch-stats local step, "
                                         "their steps taking turns in one job"),
    "rnn_speedup": (">=", 1.6, 47, "Lasagne recurrent net: N ranks vs 1 rank"),
    "generator_fed_over_in_memory": ("<=", 1.03, 48, "Keras conv net: generator-fed step "
                                     "(rank 0 draws) / in-memory fit step"),
    "device_overhead_1_rank": ("<=", 0.02, 32, "device: 1-rank overhead, conv net"),
    "device_two_ranks_over_independent": (">=", 0.95, 32,
                                          "device: 2 ranks sharing it / 2 independent processes"),
    "fused_over_raw_allreduce": ("<=", 1.1, None, "fused exchange / raw Allreduce"),
    "fp16_over_fp32": ("<=", 0.6, None, "fp16 / fp32 exchange time, shared memory"),
}


# -- the parts ------------------------------------------------------------------------

def part_exchange(args, values, workdir, tick, found):
    out = os.path.join(workdir, "exchange.json")
    command = [runs.mpiexec(), "-n", str(args.ranks), runs.python(), "-m",
               "tmpi_adapters.bench.exchange", "--json", out, "--width", str(values["width"]),
               "--repetitions", str(values["repetitions"])]
    if args.no_torch:
        command.append("--no-torch")
    runs.run(command, "exchange")
    tick("exchange")
    return runs.read_json(out)


def part_overhead(args, values, workdir, tick, found):
    from tmpi_adapters.bench import overhead
    return overhead.measure(list(overhead.MODELS), values["rounds"], values["scale"],
                            tick=tick)


def part_scaling(args, values, workdir, tick, found):
    out = os.path.join(workdir, "scaling.json")
    runs.run([runs.mpiexec(), "-n", str(args.ranks), runs.python(), "-m",
              "tmpi_adapters.bench.scaling", "--json", out, "--batch-size",
              str(args.batch_size), "--steps", str(values["steps"])], "scaling")
    tick("scaling")
    return runs.read_json(out)


def part_processes(args, values, workdir, tick, found):
    from tmpi_adapters.bench import processes
    return {"convnet": processes.convnet(workdir, args.ranks, args.batch_size, values["steps"],
                                         values["rounds"], tick),
            "tiny": processes.tiny_epochs(workdir, args.ranks, values["tiny_epochs"],
                                          values["tiny_rows"], values["rounds"], tick)}


def part_collectives(args, values, workdir, tick, found):
    from tmpi_adapters.bench import collectives
    frameworks = _names(args.frameworks, collectives.FRAMEWORKS, "--frameworks")
    return collectives.count(workdir, frameworks, args.ranks, tick)


def part_envelopes(args, values, workdir, tick, found):
    from tmpi_adapters.bench import envelopes
    return envelopes.measure(args.ranks, list(envelopes.MODELS), values["rounds"],
                             values["scale"], tick)


def part_network(args, values, workdir, tick, found):
    from tmpi_adapters.bench import remote
    result = remote.measure(workdir, remote.parse_links(values["links"]),
                            args.network_batch_size, values["network_steps"],
                            values["network_rounds"], values["network_repetitions"], tick)
    if "bsp_overlap" not in result.get("variants", ()):
        result["overlap"] = ("not implemented: tmpi wrap has no --overlap; the figures are "
                             "BSP without overlap")
    return result


def part_spread(args, values, workdir, tick, found):
    from tmpi_adapters.bench import spread
    return spread.measure(args.ranks, values["spread_runs"], values["spread_steps"],
                          values["rounds"], values["steps"], tick)


def part_generator(args, values, workdir, tick, found):
    from tmpi_adapters.bench import generator
    return generator.measure(workdir, args.ranks, values["feed_steps"], values["rounds"],
                             args.batch_size * args.ranks, tick)


def part_coupling(args, values, workdir, tick, found):
    from tmpi_adapters.bench import coupling
    return coupling.measure(workdir, args.ranks, values["feed_steps"], values["coupling_rounds"],
                            tick)


def part_device(args, values, workdir, tick, found):
    from tmpi_adapters.bench import device
    return device.measure(workdir, args.device_batch_size, values["steps"], values["rounds"],
                          tick, found)


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
    found = results.get("generator")
    if found and "partial" not in found:
        top["generator_fed_over_in_memory"] = found["generator_over_memory"]
        if found.get("hand_out_s_per_batch") is not None:
            top["generator_hand_out_ms_per_batch"] = 1e3 * found["hand_out_s_per_batch"]
    found = results.get("coupling")
    if found and "partial" not in found:
        if "exact_over_local" in found.get("wrn", {}):
            top["wrn_exact_over_local"] = found["wrn"]["exact_over_local"]
        if "speedup" in found.get("rnn", {}):
            top["rnn_speedup"] = found["rnn"]["speedup"]
        if "exact_over_local" in found.get("mlp", {}):
            top["keras_mlp_exact_over_local"] = found["mlp"]["exact_over_local"]
        if "exact_over_local" in found.get("wrn_interleaved", {}):
            top["wrn_interleaved_exact_over_local"] = found["wrn_interleaved"]["exact_over_local"]
    device = results.get("device")
    if device and "skipped" not in device and "partial" not in device:
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
    if args.rounds is not None:
        values["coupling_rounds"] = args.rounds
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
    parts = take_device_part(results, parts, named=bool(args.parts))
    started = time.monotonic()
    stopped = None
    with _Progress(args.progress) as tick, _Stopping() as stopping, \
            tempfile.TemporaryDirectory(prefix="tmpi-bench-") as workdir:
        for part in parts:
            begin = time.monotonic()
            found = results[part] = {}
            try:
                results[part] = PART_RUNNERS[part](args, values, workdir, tick, found)
            except (KeyboardInterrupt, _Stopped, TmpiError) as error:
                # What was measured so far is written, then the run ends as it was told.
                stopped = error
                results["stopped"] = "%s in the %s part after %.0f s" % (
                    stopping.describe(error), part, time.monotonic() - started)
                if found:
                    found["partial"] = True
                else:
                    del results[part]
                break
            finally:
                results.setdefault("seconds", {})[part] = round(time.monotonic() - begin, 1)
    results["seconds"]["total"] = round(time.monotonic() - started, 1) \
        if "seconds" in results else 0.0
    if hasattr(os, "getloadavg"):
        results["machine"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    top = headline(results, args.ranks)
    results["headline"], results["bars"] = top, bars(results, top)
    # The headline figures also sit at the top level, where tools look first.
    results.update(top)
    print(format_table(results), flush=True)
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
            handle.write("\n")
        print("results written to %s%s" % (args.json, " (%s)" % results["stopped"]
                                            if stopped is not None else ""), flush=True)
    if isinstance(stopped, TmpiError):
        raise stopped
    if stopped is not None:
        print("tmpi bench: %s" % results["stopped"], file=sys.stderr, flush=True)
        return 128 + stopping.signal_number(stopped)
    return 0


def take_device_part(results, parts, named):
    """``parts`` less the device part where it cannot measure a device
    (:func:`~tmpi_adapters.bench.device.refusal`: its results say why); where
    it was ``named`` (``--parts``) that is an error, before anything runs."""
    if "device" not in parts:
        return parts
    from tmpi_adapters.bench import device
    why = device.refusal()
    if why is None:
        return parts
    if named:
        # No figure of the CPU may pass for a device's.
        raise DeviceError("tmpi bench: the device part measures no device here: %s" % why)
    results["device"] = {"skipped": why}
    print("device: skipped: %s" % why, flush=True)
    return [p for p in parts if p != "device"]


class _Stopped(Exception):
    """SIGTERM (or SIGHUP) asked the benchmark to stop."""

    def __init__(self, number):
        super().__init__(number)
        self.number = number


class _Stopping:
    """SIGTERM and SIGHUP stop the benchmark as Ctrl-C does: the process it
    is running is stopped (:func:`runs.stop`), what was measured is written."""

    SIGNALS = ("SIGTERM", "SIGHUP")

    def __enter__(self):
        import signal
        self.saved = {}

        def stop(number, frame):
            raise _Stopped(number)

        for name in self.SIGNALS:
            number = getattr(signal, name, None)
            if number is not None:
                self.saved[number] = signal.signal(number, stop)
        return self

    def __exit__(self, *exc):
        import signal
        for number, handler in self.saved.items():
            signal.signal(number, handler)
        return False

    @staticmethod
    def signal_number(error):
        import signal
        return error.number if isinstance(error, _Stopped) else signal.SIGINT

    def describe(self, error):
        import signal
        if isinstance(error, TmpiError):
            return "stopped by an error (%s)" % str(error).splitlines()[0][:300]
        return "interrupted by %s" % signal.Signals(self.signal_number(error)).name


class _Progress:
    """A tqdm counter of the benchmark's runs; ``tick(text)`` advances it,
    ``tick(text, line=...)`` also prints ``line`` (with or without the bar)."""

    def __init__(self, enabled):
        self.enabled, self.bar = enabled, None

    def __enter__(self):
        if self.enabled:
            from tqdm import tqdm
            self.bar = tqdm(unit="run", file=sys.stderr, dynamic_ncols=True)
        return self.tick

    def tick(self, text, line=None):
        if line is not None:
            if self.bar is not None:
                self.bar.write(line, file=sys.stdout)
            else:
                print(line, flush=True)
        if self.bar is not None:
            self.bar.set_description(text, refresh=False)
            self.bar.update(1)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False
