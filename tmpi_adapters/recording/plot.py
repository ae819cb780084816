"""`tmpi plot FILE [-o OUT.png]`: draw a recorded run or a `tmpi bench` result.

A ``--record`` file (JSON lines) gives three panels against the step: the
training function's scalar outputs (loss, accuracy), where each step's time
went (compute, comm, wait, data; stacked), and throughput.  A ``tmpi bench
--json`` file gives the exchange timings beside their ring floors and the
1-rank/N-rank throughput.
"""
import argparse
import json
import os

import numpy as np

from tmpi_adapters.errors import TmpiError
from tmpi_adapters.core.timing import LABELS

#: Colours of the time split, the same in every figure.
PHASE_COLOURS = {"compute": "#4c72b0", "comm": "#dd8452", "wait": "#c44e52", "data": "#8c8c8c"}


def load(path):
    """``("run", records)`` for a JSON-lines record, ``("bench", dict)`` for a bench result."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise TmpiError("cannot read %r: %s" % (path, exc.strerror or exc))
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict) and ("exchange" in whole or "scaling" in whole):
        return "bench", whole
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except ValueError:
            raise TmpiError("%s line %d is not JSON: is it a `tmpi wrap --record` file?"
                            % (path, number))
    if isinstance(whole, dict) and not records:
        records = [whole]
    if not any(r.get("type") == "step" for r in records):
        raise TmpiError("%s has no step records: record a run with `tmpi wrap --record "
                        "FILE.jsonl ...` or pass a `tmpi bench --json` result." % path)
    return "run", records


def rolling_median(values, window):
    """Median of each value and its ``window - 1`` predecessors (NaN-aware)."""
    values = np.asarray(values, dtype=np.float64)
    if window <= 1 or len(values) < 2:
        return values
    out = np.empty_like(values)
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1):i + 1]
        chunk = chunk[np.isfinite(chunk)]
        out[i] = np.median(chunk) if chunk.size else np.nan
    return out


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt
    return plt


#: Colours of the outputs' curves (matplotlib's default cycle).
PLOT_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")


def _label(key, models):
    model, name = key
    return name if len(models) == 1 else "%s: %s" % (model, name)


def plot_run(records, output, window):
    """Outputs, time split and throughput of a recorded run, to ``output``."""
    plt = _pyplot()
    header = next((r for r in records if r.get("type") == "run"), {})
    steps = [r for r in records if r.get("type") == "step"]
    # The run's end measured each step's wait for the slowest rank (rank 0's).
    for waits in (r for r in records if r.get("type") == "waits"):
        first = waits["first_step"] - 1
        for i, (comm, wait) in enumerate(zip(waits["comm_s"], waits["wait_s"])):
            if first + i < len(steps):
                steps[first + i] = dict(steps[first + i], comm_s=comm, wait_s=wait)
    x = np.arange(1, len(steps) + 1)
    models = sorted({s.get("model") for s in steps}, key=str)
    fig, (ax_out, ax_time, ax_rate) = plt.subplots(3, 1, figsize=(9, 10), sharex=True)

    names = []
    for s in steps:
        for name in s.get("outputs", {}):
            key = (s.get("model"), name)
            if key not in names:
                names.append(key)
    # The first output (the loss) on the left axis, the others (accuracy and
    # other metrics, often on another scale) on the right one.
    axes, colours = [ax_out], iter(PLOT_COLOURS)
    for k, (model, name) in enumerate(names):
        if k == 1:
            axes.append(ax_out.twinx())
        axis = axes[min(k, 1)]
        values = [s["outputs"].get(name) if s.get("model") == model else None for s in steps]
        values = np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        label = name if len(models) == 1 else "%s: %s" % (model, name)
        colour = next(colours, None)
        axis.plot(x, values, ".", markersize=2, alpha=0.3, color=colour)
        axis.plot(x, rolling_median(values, window), label=label, color=colour)
    if names:
        handles = [h for axis in axes for h in axis.get_legend_handles_labels()[0]]
        ax_out.legend(handles, [h.get_label() for h in handles], loc="best")
        ax_out.set_ylabel(_label(names[0], models))
        if len(axes) > 1:
            axes[1].set_ylabel(", ".join(_label(n, models) for n in names[1:]))
    else:
        ax_out.text(0.5, 0.5, "the training function returned no scalars",
                    ha="center", va="center", transform=ax_out.transAxes)
        ax_out.set_ylabel("training function outputs")

    stacked = [rolling_median([s[p + "_s"] * 1e3 for s in steps], window)
               for p in PHASE_COLOURS]
    ax_time.stackplot(x, *stacked, labels=[LABELS[p] for p in PHASE_COLOURS],
                      colors=list(PHASE_COLOURS.values()), alpha=0.85)
    ax_time.set_ylabel("ms per step (median of %d)" % window)
    ax_time.legend(loc="upper right", ncol=4)

    rate = [s.get("samples_per_s") for s in steps]
    rate = np.array([np.nan if v is None else v for v in rate], dtype=np.float64)
    ax_rate.plot(x, rolling_median(rate, window), color="#55a868")
    ax_rate.set_ylabel("samples/s (all ranks)")
    ax_rate.set_xlabel("training step")

    title = "%s: %s rank(s), rule %s, %s transfer" % (
        header.get("script") or "run", header.get("ranks", "?"), header.get("rule", "?"),
        header.get("precision") or "native")
    summary = next((r for r in records if r.get("type") == "summary"), None)
    if summary and summary.get("samples_per_s"):
        title += " - %.0f samples/s" % summary["samples_per_s"]
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)


def plot_bench(result, output):
    """Exchange timings against their floors; conv net throughput and split."""
    plt = _pyplot()
    exchange, scaling = result.get("exchange"), result.get("scaling")
    count = (1 if exchange else 0) + (2 if scaling else 0)
    if not count:
        raise TmpiError("the bench result has neither an exchange nor a scaling part")
    fig, axes = plt.subplots(1, count, figsize=(6 * count, 5), squeeze=False)
    axes = list(axes[0])
    if exchange:
        _exchange_panel(axes.pop(0), exchange)
    if scaling:
        _throughput_panel(axes.pop(0), scaling)
        _split_panel(axes.pop(0), scaling)
    fig.suptitle("%s (%s)" % (result.get("command", "tmpi bench"), result.get("date", "")))
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)


def _exchange_panel(ax, exchange):
    median = exchange["median_s"]
    names = list(median)
    floors = [exchange["ring_floor_s"]["fp16" if "fp16" in n else
                                       "bf16" if "bf16" in n else "fp32"] for n in names]
    y = np.arange(len(names))
    ax.barh(y, [median[n] * 1e3 for n in names], color="#4c72b0", label="median")
    ax.scatter([f * 1e3 for f in floors], y, color="#c44e52", marker="|", s=300,
               label="ring floor", zorder=3)
    ax.set_yticks(y)
    ax.set_yticklabels(names)
    ax.invert_yaxis()
    ax.set_xlabel("ms")
    ax.set_title("allreduce of %.0f MB on %d ranks" % (exchange["bytes"] / 1e6,
                                                      exchange["ranks"]))
    ax.legend(loc="lower right")


def _throughput_panel(ax, scaling):
    n, rate = str(scaling["ranks"]), scaling["samples_per_s"]
    steps, batch = scaling["step_median_s"], scaling["batch_size_per_rank"]
    labels = ["1 rank", "%s ranks,\nnothing exchanged" % n, "%s ranks,\ntmpi BSP" % n]
    values = [rate["1"], int(n) * batch / steps["independent"], rate[n]]
    ax.bar(labels, values, color=["#8c8c8c", "#c7c7c7", "#4c72b0"])
    ax.set_ylabel("samples/s")
    ax.set_title("conv net: speed-up %.2f of a possible %.2f" % (scaling["speedup"],
                                                                scaling["ceiling"]))


def _split_panel(ax, scaling):
    n, split = str(scaling["ranks"]), scaling["split_s"]
    bottom = 0.0
    ax.bar(["1 rank"], [scaling["step_median_s"]["1"] * 1e3],
           color=PHASE_COLOURS["compute"])
    for phase in ("compute", "comm", "wait"):
        value = split[phase + "_s"] * 1e3
        ax.bar(["%s ranks (BSP)" % n], [value], bottom=bottom, color=PHASE_COLOURS[phase],
               label=phase)
        bottom += value
    ax.set_ylabel("ms per step (median)")
    ax.set_title("where a step's time goes")
    ax.legend()


def main(argv):
    parser = argparse.ArgumentParser(prog="tmpi plot", description=__doc__.split("\n")[0])
    parser.add_argument("file", help="a `tmpi wrap --record` file or a `tmpi bench --json` file")
    parser.add_argument("-o", "--output", help="PNG to write (default: FILE with .png)")
    parser.add_argument("--window", type=int, default=10,
                        help="steps in the rolling median of curves (default 10)")
    args = parser.parse_args(argv)
    output = args.output or os.path.splitext(args.file)[0] + ".png"
    kind, data = load(args.file)
    if kind == "bench":
        plot_bench(data, output)
    else:
        plot_run(data, output, max(1, args.window))
    print("wrote %s" % output)
    return 0
