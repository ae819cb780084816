"""The network part of `tmpi bench`: 2 ranks across an emulated link.

For each link (``RATE:DELAY``, by default the issue's 10 Gbit/s with 50 µs
and 2 Gbit/s with 50 µs; :mod:`tmpi_adapters.bench.network` makes them), with
the wide conv net of :mod:`tmpi_adapters.bench.models` (25 MB of gradients):

the link itself
    the one-way latency of a small message, and one ring step (``Sendrecv``
    of half the gradients' bytes each way) against what the rate allows:
    the link's *fidelity*.  This 2-core machine carries 2 Gbit/s in both
    directions faithfully but not 10 (the kernel's TCP copies need more
    cores); a link is *trusted* when its ring step is within 15 % of the
    rate's.
the exchange
    the fused exchange of the gradients at fp32 and with fp16 transfer, and a
    raw ``Allreduce``, repetitions interleaved
    (:mod:`tmpi_adapters.bench.exchange` under ``mpiexec``, each rank in its
    namespace), against the link's ring floor ``2(N-1)/N * bytes / goodput
    + 2(N-1) * latency``, goodput being the rate less TCP/IP headers;
training
    ``tmpi wrap`` of the wide conv net on the 2 ranks (BSP, and BSP with
    ``--overlap`` where ``tmpi wrap`` has it) against the plain script on
    one rank, separate jobs taking turns.  The rows per rank are set for
    10 Gbit/s (``--network-batch-size``) and scaled up on slower links by
    the ratio of the rates, so that every link sees the compute per byte
    exchanged that the 10 Gbit/s link would: 2 Gbit/s is the 10 Gbit/s
    cluster measured five times slower, faithfully.
"""
import os
import statistics
import subprocess

from tmpi_adapters.bench import network
from tmpi_adapters.bench.runs import (bench_environment, models_script, mpiexec, paired_ratio,
                                      parse_steps, python, read_json, read_record, run,
                                      split_of, tool)
from tmpi_adapters.errors import TmpiError

DEFAULT_LINKS = "10gbit:50us,2gbit:50us"
#: The rate the rows per rank are given for.
REFERENCE_RATE = 10e9
#: A link whose ring step takes longer than this times the rate's is not
#: what it claims to be on this machine.
FAITHFUL = 1.15
EXCHANGE_CASES = "raw_allreduce,fused,fused_fp16"


def parse_links(text):
    """``"10gbit:50us,2gbit:50us"`` -> ``[("10gbit", "50us"), ("2gbit", "50us")]``."""
    links = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        rate, _, delay = item.partition(":")
        network.parse_rate(rate)
        network.parse_time(delay or "0")
        links.append((rate, delay or "0"))
    if not links:
        raise TmpiError("--links names no link: write e.g. 10gbit:50us,2gbit:50us")
    return links


def link_name(rate, delay):
    return "%s_%s" % (rate, delay)


def wrap_has(option):
    """Whether ``tmpi wrap`` offers ``option`` (a bench of this version may
    time an installed ``tmpi`` of another)."""
    result = subprocess.run([tool("tmpi"), "wrap", "--help"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    return option in result.stdout


def measure(workdir, links, batch_size, steps, rounds, repetitions, tick=lambda text: None):
    """Every link's fidelity, exchange and training, or ``{"skipped": why}``."""
    parsed = [(rate, delay, network.parse_rate(rate), network.parse_time(delay))
              for rate, delay in links]
    why = network.unavailable(max(p[3] for p in parsed))
    if why:
        return {"skipped": why}
    variants = ["bsp"] + (["bsp_overlap"] if wrap_has("--overlap") else [])
    result = {"model": "wide", "ranks": 2, "variants": variants, "links": {},
              "reference_rate_bps": REFERENCE_RATE, "faithful_within": FAITHFUL}
    for rate, delay, rate_bps, delay_s in parsed:
        name = link_name(rate, delay)
        rows = max(1, int(round(batch_size * REFERENCE_RATE / rate_bps)))
        with network.shaped_link(rate, delay_s) as link:
            found = {"link": link.describe(), "batch_size_per_rank": rows,
                     "compute_scale": REFERENCE_RATE / rate_bps}
            before = link.counters()
            found["exchange"] = _exchange(workdir, link, repetitions)
            after = link.counters()
            found["exchange"]["link_bytes"] = sum(after[ns]["tx_bytes"] - before[ns]["tx_bytes"]
                                                  for ns in after)
            tick("network %s: exchange" % name)
            found["training"] = _training(workdir, link, name, variants, rows, steps, rounds,
                                          tick)
        found["link"]["delay_line"] = link.line_stats
        result["links"][name] = summarize(found, link.goodput)
    return result


def _exchange(workdir, link, repetitions):
    out = os.path.join(workdir, "network-exchange.json")
    command = [python(), "-m", "tmpi_adapters.bench.exchange", "--json", out, "--model",
               "wide", "--cases", EXCHANGE_CASES, "--latency", "--no-torch",
               "--repetitions", str(repetitions)]
    run(link.mpiexec_argv(mpiexec(), [command] * 2), "network exchange",
        env=bench_environment(1, link.env))
    return read_json(out)


def _training(workdir, link, name, variants, rows, steps, rounds, tick):
    """Steps of each variant on 2 ranks across ``link`` and of the plain
    script on one rank, jobs taking turns."""
    script = [models_script(), "--model", "wide", "--steps", str(steps), "--warmup", "2"]
    seconds = {v: [] for v in ["one"] + variants}
    records = {v: [] for v in variants}
    for r in range(rounds):
        order = ["one"] + variants
        for variant in (order if r % 2 == 0 else order[::-1]):
            if variant == "one":
                stdout = run([python()] + script + ["--batch-size", str(rows)],
                             "network: one rank")
            else:
                record = os.path.join(workdir, "network-%s-%s-%d.jsonl" % (name, variant, r))
                # --bind none: the two emulated hosts share this machine's cores with
                # the delay line; a rank bound to a core could not move off it while the
                # delay line ran there (BSP 0.84 against 1.62 unbound).  The ranks of real
                # hosts have their cores to themselves.
                rank = [tool("tmpi"), "wrap", "--bind", "none", "--threads-per-rank", "1",
                        "--record", record, "--no-summary"] + \
                    (["--overlap"] if variant == "bsp_overlap" else []) \
                    + script + ["--batch-size", str(2 * rows)]
                stdout = run(link.mpiexec_argv(mpiexec(), [rank] * 2),
                             "network: %s" % variant, env=bench_environment(1, link.env))
                records[variant] += read_record(record, steps)
            seconds[variant].append(statistics.median(parse_steps(stdout)["seconds"]))
            tick("network %s: %s" % (name, variant))
    return {"steps": steps, "rounds": rounds, "round_medians_s": seconds,
            "split_s": {v: split_of(records[v]) for v in variants if records[v]}}


def summarize(found, goodput):
    """The link's fidelity, the exchange against the ring floor, the speed-ups."""
    exchange, training = found["exchange"], found["training"]
    ranks, nbytes = exchange["ranks"], exchange["bytes"]
    latency = exchange["latency_s"]["min"]
    share = nbytes / ranks
    # What the rate allows: one ring step moves bytes/N each way, the whole
    # ring 2(N-1) of them (the reduce-scatter and the allgather).
    step_floor = share / goodput + latency
    floor = 2 * (ranks - 1) * step_floor
    floor_fp16 = 2 * (ranks - 1) * (share / 2 / goodput + latency)
    median = exchange["median_s"]
    found["fidelity"] = exchange["ring_step_s"] / step_floor
    found["trusted"] = found["fidelity"] <= FAITHFUL
    found["ring_floor_s"] = {"fp32": floor, "fp16": floor_fp16}
    found["exchange_over_ring_floor"] = median["fused"] / floor
    found["fp16_over_ring_floor"] = median["fused_fp16"] / floor_fp16
    found["exchange_over_measured_ring"] = median["fused"] / (2 * (ranks - 1) *
                                                               exchange["ring_step_s"])
    found["fp16_over_fp32"] = exchange["ratios"]["fp16_over_fp32"]
    seconds = training["round_medians_s"]
    training["step_median_s"] = {v: statistics.median(s) for v, s in seconds.items()}
    for variant in (v for v in seconds if v != "one"):
        ratio, extent = paired_ratio(seconds["one"], seconds[variant], ranks)
        training["speedup_%s" % variant] = ratio
        training["speedup_%s_range" % variant] = extent
    best = "speedup_bsp_overlap" if "speedup_bsp_overlap" in training else "speedup_bsp"
    found["speedup_2_ranks"] = training.get(best)
    found["speedup_from"] = best[len("speedup_"):]
    return found


def trusted_link(result):
    """The link whose figures the bars are held to: the fastest trusted one
    (else the most faithful)."""
    links = result.get("links") or {}
    if not links:
        return None
    trusted = [n for n, l in links.items() if l["trusted"]]
    if trusted:
        return max(trusted, key=lambda n: links[n]["link"]["rate_bps"])
    return min(links, key=lambda n: links[n]["fidelity"])
