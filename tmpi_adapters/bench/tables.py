"""The tables `tmpi bench` prints and bench/README.md shows, made from a results file alone."""
import statistics


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
        local = found.get("local_collectives_per_step")
        rows.append("| %s | %s | %d | %s | %s | %s |" % (
            framework, found["script"], found["steps"],
            "%d .. %d" % (counts["min"], counts["max"]) if counts else "no steps",
            found.get("floor", "-"),
            "%d .. %d" % (local["min"], local["max"]) if local else "-"))
    return _table(rows, ["framework", "script (tmpi wrap -n %d --record)" % next(
        iter(collectives.values()))["ranks"], "steps", "collectives per step, exact "
        "(the default)", "floor (1 + 2 per BatchNorm layer)", "--batch-stats local"])


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


def _generator_rows(found):
    steps = found["step_median_s"]
    rows = ["| %s | %s |" % (label, _ms(steps[key])) for key, label in (
        ("memory", "`fit` from arrays every rank holds"),
        ("generator", "`fit_generator`, rank 0 draws and hands out each batch"))]
    rows.append("| generator-fed / in-memory %.3f (%.3f .. %.3f); handing a batch out %s, "
                "rank 0 waited %s for it |  |" % (
                    found["generator_over_memory"], found["generator_over_memory_range"][0],
                    found["generator_over_memory_range"][1],
                    "-" if found.get("hand_out_s_per_batch") is None
                    else _ms(found["hand_out_s_per_batch"]),
                    "-" if found.get("rank0_wait_s_per_batch") is None
                    else _ms(found["rank0_wait_s_per_batch"])))
    return _table(rows, ["Keras conv net, %d ranks, %d rows per step (%d rounds)" % (
        found["ranks"], found["batch_size"], found["rounds"]), "step"])


def _coupling_rows(found):
    rows = []
    labels = {"wrn": ("Keras WRN-10-1", "exact", "local", "exact_over_local"),
              "mlp": ("Keras MLP, one BatchNorm layer", "exact", "local", "exact_over_local"),
              "rnn": ("Lasagne recurrent net", "one", "ranks", "speedup")}
    for case, (label, a, b, ratio) in labels.items():
        part = found.get(case)
        if not part:
            continue
        if "skipped" in part:
            rows.append("| %s | skipped: %s | | |" % (label, part["skipped"]))
            continue
        steps, counts = part["step_median_s"], part["collectives_per_step"]
        rows.append("| %s | %s (%s collectives) | %s (%s collectives) | %.3f (%.3f .. %.3f) |" % (
            label, _ms(steps[a]), counts.get(a), _ms(steps[b]), counts.get(b), part[ratio],
            part[ratio + "_range"][0], part[ratio + "_range"][1]))
    return _table(rows, ["%d ranks, %d rounds (rnn: 1 rank, then %d)" % (
        found["ranks"], found["rounds"], found["ranks"]), "exact / 1 rank", "local / N ranks",
        "exact / local; rnn: speedup"])


def _device_rows(device):
    if "skipped" in device:
        return ["", "device: skipped: %s" % device["skipped"]]
    steps, rates = device.get("step_median_s", {}), device.get("samples_per_s", {})
    half = device["batch_size"] // 2
    rows = ["| %s | %s | %.0f |" % (label, _ms(steps[key]), rates[key]) for key, label in (
        ("plain", "plain script, batch %d" % device["batch_size"]),
        ("wrapped_1", "tmpi wrap -n 1"),
        ("wrapped_2", "tmpi wrap -n 2, sharing the device (%d rows each)" % half),
        ("independent_2", "2 plain processes side by side, %d rows each" % half))
        if key in steps]
    title = "conv net on %s" % device["device"]
    if "partial" in device:
        return _table(rows, [title + " (cut short: %d runs)" % len(device.get("runs", [])),
                             "step", "samples/s"])
    rows.append("| 1-rank overhead %+.1f%% (%+.1f%% .. %+.1f%%); 2 ranks / 2 processes %.2f; "
                "exchange %s per step | | |" % (
                    100 * device["overhead_1_rank"], 100 * device["overhead_1_rank_range"][0],
                    100 * device["overhead_1_rank_range"][1],
                    device["two_ranks_over_independent"], _ms(device["exchange_s_per_step"])))
    return _table(rows, [title, "step", "samples/s"])


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
                       ("generator", _generator_rows), ("coupling", _coupling_rows),
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
