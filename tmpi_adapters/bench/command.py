"""`tmpi bench` and `tmpi plot`: measured exchange, scaling and overhead.

``tmpi bench [--quick] [--json FILE] [-n N]`` runs, in one go:

exchange
    a whole model's gradients (AlexNet's shapes) reduced on N ranks every way
    side by side: raw mpi4py ``Allreduce`` of one flat buffer (the floor), the
    fused exchange at fp32/fp16/bf16, one collective per parameter, and
    ``torch.distributed`` (gloo) where torch is installed, beside the
    ring-allreduce floor (:mod:`tmpi_adapters.bench.exchange`);
overhead
    a one-rank wrapped training step of a compute-bound conv net
    (:mod:`tmpi_adapters.bench.convnet`) against the plain Theano step, both
    in one process, alternating (:mod:`tmpi_adapters.bench.overhead`);
scaling
    BSP on N ranks against 1 rank at the same work per rank, one BLAS thread
    each, the two kinds of step alternating in one job
    (:mod:`tmpi_adapters.bench.scaling`);
processes
    the conv net as users run it, one job each: the plain script,
    ``tmpi wrap -n 1`` and ``tmpi wrap -n N --record`` (the recorder's split).

Every figure is a median over repetitions or steps, and every ratio comes
from one run; parts that compare two things interleave them, so that a
shared, noisy machine slows both alike.  The results print as a table and,
with ``--json``, land in a file whose top-level keys
``fused_over_raw_allreduce``, ``speedup_2_ranks`` (``speedup_N_ranks``) and
``overhead_1_rank`` carry the headlines.
"""
import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

from tmpi_adapters.errors import TmpiError

#: The bars of the design (value <= or >= bound).
BARS = {
    "fused_over_raw_allreduce": ("<=", 1.1),
    "speedup_2_ranks": (">=", 1.8),
    "overhead_1_rank": ("<=", 0.03),
    "fp16_over_fp32": ("<=", 0.6),
}

#: The parts of a run, in the order they run.
PARTS = ("exchange", "overhead", "scaling", "processes")

#: ``--quick`` (CI-sized) and full settings: the AlexNet width of the
#: exchanged gradients, the exchange's repetitions, and the timed conv net
#: steps of each part.
PRESETS = {
    "quick": {"width": 0.25, "repetitions": 5, "steps": 8},
    "full": {"width": 1.0, "repetitions": 9, "steps": 30},
}
COMPILEDIR_ENV = "TMPI_BENCH_COMPILEDIR"


# -- running the parts --------------------------------------------------------------

def bench_compiledir():
    """Theano's compile cache for the benchmark's runs.

    A cache of its own: a timed run must never wait on the compile lock of
    some other Theano process working in the shared one.
    """
    return os.environ.get(COMPILEDIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "tmpi", "theano-bench")


def bench_environment():
    """One BLAS thread per process, float32 Theano, the benchmark's compile cache."""
    env = dict(os.environ)
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[name] = "1"
    flags = [f for f in env.get("THEANO_FLAGS", "").split(",")
             if f and not f.startswith(("floatX=", "base_compiledir=", "compiledir="))]
    env["THEANO_FLAGS"] = ",".join(flags + ["floatX=float32",
                                            "base_compiledir=" + bench_compiledir()])
    env.pop("TMPI_OPTIONS", None)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _run(command, what, timeout=1800):
    result = subprocess.run(command, env=bench_environment(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, timeout=timeout)
    if result.returncode != 0:
        raise TmpiError("the %s benchmark failed (exit %d): %s\n%s" % (
            what, result.returncode, " ".join(shlex.quote(c) for c in command),
            (result.stderr or result.stdout)[-3000:]))
    return result.stdout


def _python():
    return sys.executable


def _tool(name):
    """A console script installed beside this Python (``tmpi``, ``mpiexec``)."""
    candidate = os.path.join(os.path.dirname(sys.executable), name)
    return candidate if os.access(candidate, os.X_OK) else name


def write_result(path, result):
    """Write a part's ``result`` to ``path`` as JSON, whole or not at all.

    The parts (:mod:`tmpi_adapters.bench.exchange` and the others) run as
    their own processes and hand their results back this way; a part that
    dies half-way leaves no file that reads as a result.
    """
    from tmpi_adapters.files import write_atomic
    write_atomic(path, json.dumps(result, indent=1))


def run_exchange(workdir, ranks, width, repetitions, torch):
    out = os.path.join(workdir, "exchange.json")
    from tmpi_adapters.launch.launcher import find_mpiexec
    command = [find_mpiexec(), "-n", str(ranks), _python(), "-m", "tmpi_adapters.bench.exchange",
               "--json", out, "--width", str(width), "--repetitions", str(repetitions)]
    if not torch:
        command.append("--no-torch")
    _run(command, "exchange")
    with open(out) as handle:
        return json.load(handle)


def run_overhead(workdir, batch_size, steps):
    out = os.path.join(workdir, "overhead.json")
    _run([_python(), "-m", "tmpi_adapters.bench.overhead", "--json", out,
          "--batch-size", str(batch_size), "--steps", str(steps)], "overhead")
    with open(out) as handle:
        return json.load(handle)


def convnet_script():
    from tmpi_adapters.bench import convnet as bench_convnet
    return bench_convnet.__file__


def parse_steps(stdout):
    """The ``bench-steps`` record a conv net run printed last."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("bench-steps "):
            return json.loads(line[len("bench-steps "):])
    raise TmpiError("the conv net printed no bench-steps line:\n%s" % stdout[-2000:])


def read_split(path, timed_steps):
    """Medians of the last ``timed_steps`` step records of a ``--record`` file."""
    with open(path) as handle:
        steps = [r for r in map(json.loads, handle) if r.get("type") == "step"]
    steps = steps[-timed_steps:]
    return {key: statistics.median(s[key] for s in steps)
            for key in ("compute_s", "comm_s", "wait_s", "data_s")}


def run_convnet(workdir, ranks, batch_size, steps, tag, wrapped=True):
    """One run of the conv net: per-step seconds and, when wrapped, the split."""
    args = [convnet_script(), "--batch-size", str(batch_size * ranks), "--steps", str(steps)]
    if not wrapped:
        return parse_steps(_run([_python()] + args, "unwrapped conv net")), None
    record = os.path.join(workdir, "convnet-%s.jsonl" % tag)
    stdout = _run([_tool("tmpi"), "wrap", "-n", str(ranks), "--threads-per-rank", "1",
                   "--record", record, "--no-summary"] + args, "conv net on %d rank(s)" % ranks)
    return parse_steps(stdout), read_split(record, steps)


def run_paired(workdir, ranks, batch_size, steps):
    """1-rank and N-rank steps alternating in one job (the scaling headline)."""
    out = os.path.join(workdir, "scaling.json")
    from tmpi_adapters.launch.launcher import find_mpiexec
    _run([find_mpiexec(), "-n", str(ranks), _python(), "-m", "tmpi_adapters.bench.scaling",
          "--json", out, "--batch-size", str(batch_size), "--steps", str(steps)], "scaling")
    with open(out) as handle:
        return json.load(handle)


def run_processes(workdir, ranks, batch_size, steps, tick):
    """The conv net as users run it: plain, ``tmpi wrap -n 1`` and ``-n N``, one
    process (job) each, with the recorder's split of the wrapped runs."""
    configs = [("unwrapped", 1, False), ("1", 1, True), (str(ranks), ranks, True)]
    step, split = {}, {}
    for key, n, wrapped in configs:
        record, timing = run_convnet(workdir, n, batch_size, steps, key, wrapped)
        step[key] = statistics.median(record["seconds"])
        if timing:
            split[key] = timing
        tick("processes: %s" % ("plain script" if key == "unwrapped" else
                                "tmpi wrap -n %s" % key))
    one, many = step["1"], step[str(ranks)]
    return {"ranks": ranks, "batch_size_per_rank": batch_size, "steps": steps,
            "step_median_s": step, "split_s": split,
            "speedup": ranks * one / many,
            "overhead_1_rank": one / step["unwrapped"] - 1.0}


def warm_compile_cache(batch_size):
    """Compile the conv net once, untimed, so no timed run pays a cold compile."""
    _run([_python(), convnet_script(), "--batch-size", str(batch_size), "--steps", "1",
          "--warmup", "0"], "warm-up")


# -- the results ----------------------------------------------------------------------

def machine():
    """What the numbers were measured on."""
    info = {"system": platform.system(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version()}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import numpy
        import theano  # noqa: F401 - version only
        info["numpy"] = numpy.__version__
        info["theano"] = sys.modules["theano"].__version__
    except ImportError:
        pass
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = [round(v, 2) for v in os.getloadavg()]
    return info


def headline(results, ranks):
    """Top-level ratios and the bars they are held to."""
    top = {}
    exchange = results.get("exchange")
    if exchange:
        ratios = exchange["ratios"]
        for key in ("fused_over_raw_allreduce", "fused_over_raw_allreduce_in_place",
                    "per_parameter_over_fused", "fp16_over_fp32", "bf16_over_fp32",
                    "fp16_over_fp32_wire", "bf16_over_fp32_wire", "torch_gloo_over_fused",
                    "fused_over_ring_floor"):
            if key in ratios:
                top[key] = ratios[key]
    if results.get("scaling"):
        scaling = results["scaling"]
        top["speedup_%d_ranks" % ranks] = scaling["speedup"]
        top["speedup_ceiling_%d_ranks" % ranks] = scaling["ceiling"]
        top["scaling_efficiency"] = scaling["efficiency"]
    if results.get("overhead"):
        top["overhead_1_rank"] = results["overhead"]["overhead"]
    if results.get("processes"):
        top["speedup_%d_ranks_separate_jobs" % ranks] = results["processes"]["speedup"]
        top["overhead_1_rank_separate_processes"] = results["processes"]["overhead_1_rank"]
    bars = {}
    for key, (sense, bound) in BARS.items():
        if key in top:
            value = top[key]
            bars[key] = {"value": value, "bar": "%s %g" % (sense, bound),
                         "met": value <= bound if sense == "<=" else value >= bound}
    return top, bars


def format_table(results):
    """The results as a markdown table (what the README shows)."""
    rows = []
    exchange = results.get("exchange")
    if exchange:
        median, floor = exchange["median_s"], exchange["ring_floor_s"]
        size = "%.0f MB" % (exchange["bytes"] / 1e6)
        names = [("raw mpi4py Allreduce, one flat buffer", "raw_allreduce", "fp32"),
                 ("raw Allreduce, MPI.IN_PLACE", "raw_allreduce_in_place", "fp32"),
                 ("tmpi fused exchange, fp32", "fused", "fp32"),
                 ("tmpi fused, MPI's Allreduce for buckets", "fused_mpi_algorithm", "fp32"),
                 ("tmpi fused, results copied out", "fused_copy_out", "fp32"),
                 ("one Allreduce per parameter", "per_parameter", "fp32"),
                 ("tmpi fused exchange, fp16 transfer", "fused_fp16", "fp16"),
                 ("tmpi fused exchange, bf16 transfer", "fused_bf16", "bf16"),
                 ("torch.distributed all_reduce (gloo)", "torch_gloo", "fp32")]
        rows.append("| exchange of %s (%d arrays) on %d ranks | median | vs raw | ring floor |"
                    % (size, exchange["arrays"], exchange["ranks"]))
        rows.append("|---|---:|---:|---:|")
        for label, key, fmt in names:
            if key in median:
                rows.append("| %s | %.1f ms | %.2f | %.1f ms |" % (
                    label, median[key] * 1e3, median[key] / median["raw_allreduce"],
                    floor[fmt] * 1e3))
        torch = exchange.get("torch")
        if isinstance(torch, dict):
            rows.append("| torch.distributed (gloo) | skipped: %s | | |" % torch["skipped"])
    scaling, overhead = results.get("scaling"), results.get("overhead")
    if scaling or overhead:
        rows.append("")
        rows.append("| conv net step, 1 BLAS thread per rank | step | samples/s | "
                    "compute / comm / wait |")
        rows.append("|---|---:|---:|---|")
    if overhead:
        batch = overhead["batch_size"]
        for key, label in (("plain_median_s", "plain Theano, 1 process"),
                           ("wrapped_median_s", "tmpi, 1 rank (same process, alternating)")):
            rows.append("| %s | %.1f ms | %.0f | |" % (label, overhead[key] * 1e3,
                                                        batch / overhead[key]))
    if scaling:
        n, batch = str(scaling["ranks"]), scaling["batch_size_per_rank"]
        split = scaling["split_s"]
        steps = scaling["step_median_s"]
        for key, label, ranks in (
                ("1", "1 rank, plain (taking turns with the next two)", 1),
                ("independent", "%s ranks, plain, nothing exchanged (the ceiling)" % n, int(n)),
                (n, "tmpi BSP, %s ranks x %d samples" % (n, batch), int(n))):
            per = ("%s ms" % " / ".join("%.1f" % (split[p] * 1e3) for p in
                                        ("compute_s", "comm_s", "wait_s"))) if key == n else ""
            rows.append("| %s | %.1f ms | %.0f | %s |" % (
                label, steps[key] * 1e3, ranks * batch / steps[key], per))
    processes = results.get("processes")
    if processes:
        n = str(processes["ranks"])
        for key, label in (("unwrapped", "separate job: plain script"),
                           ("1", "separate job: tmpi wrap -n 1"),
                           (n, "separate job: tmpi wrap -n %s" % n)):
            split = processes["split_s"].get(key)
            per = ("%s ms" % " / ".join("%.1f" % (split[p] * 1e3) for p in
                                        ("compute_s", "comm_s", "wait_s"))) if split else ""
            ranks = int(n) if key == n else 1
            step = processes["step_median_s"][key]
            rows.append("| %s | %.1f ms | %.0f | %s |" % (
                label, step * 1e3, ranks * processes["batch_size_per_rank"] / step, per))
    top = results.get("headline", {})
    if top:
        rows.append("")
        rows.append("| ratio | measured | bar |")
        rows.append("|---|---:|---|")
        bars = results.get("bars", {})
        for key, value in top.items():
            bar = bars.get(key)
            mark = "" if bar is None else "%s %s" % (bar["bar"], "met" if bar["met"]
                                                      else "**not met**")
            rows.append("| %s | %.3f | %s |" % (key, value, mark))
    return "\n".join(rows)


# -- the command -----------------------------------------------------------------------

def _parser():
    parser = argparse.ArgumentParser(
        prog="tmpi bench", description="Measure tmpi's exchange, scaling and overhead "
                                       "side by side (see bench/README.md).")
    parser.add_argument("--quick", action="store_true",
                        help="CI-sized: smaller model, fewer steps and repetitions")
    parser.add_argument("--json", metavar="FILE", help="write the results here")
    parser.add_argument("-n", "--np", dest="ranks", type=int, default=2,
                        help="ranks for the exchange and scaling parts (default 2)")
    parser.add_argument("--only", action="append", choices=PARTS,
                        help="run only this part (repeat)")
    parser.add_argument("--width", type=float, help="AlexNet width of the exchanged model")
    parser.add_argument("--repetitions", type=int, help="repetitions of the exchange")
    parser.add_argument("--steps", type=int,
                        help="timed conv net steps of each kind (overhead, scaling, per job)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="conv net samples per rank per step (default 64)")
    parser.add_argument("--no-torch", action="store_true",
                        help="skip torch.distributed even where it is installed")
    parser.add_argument("--no-progress", dest="progress", action="store_false",
                        help="no progress bar")
    return parser


def settings(args):
    values = dict(PRESETS["quick" if args.quick else "full"])
    for key in ("width", "repetitions", "steps"):
        if getattr(args, key) is not None:
            values[key] = getattr(args, key)
    return values


def cmd_bench(argv):
    args = _parser().parse_args(argv)
    if args.ranks < 2:
        raise TmpiError("tmpi bench compares 1 rank with N: -n must be at least 2")
    parts = [p for p in PARTS if p in (args.only or PARTS)]
    values = settings(args)
    results = {"command": "tmpi bench " + " ".join(shlex.quote(a) for a in argv),
               "date": time.strftime("%Y-%m-%d"), "quick": args.quick,
               "settings": values, "machine": machine()}
    total = len(parts) + 2 * ("processes" in parts) + (parts != ["exchange"])
    with _progress(total, args.progress) as tick, \
            tempfile.TemporaryDirectory(prefix="tmpi-bench-") as workdir:
        if "exchange" in parts:
            results["exchange"] = run_exchange(workdir, args.ranks, values["width"],
                                               values["repetitions"], torch=not args.no_torch)
            tick("exchange")
        if parts != ["exchange"]:
            warm_compile_cache(args.batch_size)
            tick("compiled the conv net")
        if "overhead" in parts:
            results["overhead"] = run_overhead(workdir, args.batch_size, 2 * values["steps"])
            tick("overhead")
        if "scaling" in parts:
            results["scaling"] = run_paired(workdir, args.ranks, args.batch_size,
                                            values["steps"])
            tick("scaling")
        if "processes" in parts:
            results["processes"] = run_processes(workdir, args.ranks, args.batch_size,
                                                 values["steps"], tick)
    if hasattr(os, "getloadavg"):
        results["machine"]["load_average_at_end"] = [round(v, 2) for v in os.getloadavg()]
    top, bars = headline(results, args.ranks)
    results["headline"], results["bars"] = top, bars
    # The headline keys also sit at the top level, where tools look first.
    results.update(top)
    print(format_table(results))
    if args.json:
        directory = os.path.dirname(os.path.abspath(args.json))
        os.makedirs(directory, exist_ok=True)
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)
            handle.write("\n")
        print("results written to %s" % args.json)
    return 0


class _progress:
    """A tqdm bar over the benchmark's runs; ``tick(text)`` advances it."""

    def __init__(self, total, enabled):
        self.total, self.enabled, self.bar = total, enabled, None

    def __enter__(self):
        if self.enabled:
            from tqdm import tqdm
            self.bar = tqdm(total=self.total, unit="run", file=sys.stderr, dynamic_ncols=True)
        return self.tick

    def tick(self, text):
        if self.bar is not None:
            self.bar.set_description(text, refresh=False)
            self.bar.update(1)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.close()
        return False
