"""Time the GPU exchangers on a GPU machine (EXPERIMENTAL, never run yet).

``mpiexec -n N python -m tmpi_adapters.exchangers.experimental.bench
[--exchanger nccl|cuda-mpi] [--mbytes 100] [--repeats 20] [--json OUT]``

For one model of ``--mbytes`` in 40 float32 arrays, rank 0 prints the median
seconds of: ``raw`` (one sum of one flat buffer of the same bytes through the
same transport, the floor), ``fused_native``/``fused_fp16``/``fused_bf16`` (the
exchanger's weighted mean), ``per_array`` (one call per array: what fusion
saves), ``host_staged`` (the same exchange of numpy arrays) and
``fused_over_raw``.  ``tmpi bench`` measures the ``mpi`` exchanger; this is its
GPU counterpart for the first session that has GPUs.
"""
import functools
import time

import numpy as np

def model_shapes(total_bytes, count=40):
    """Float32 shapes of ``count`` arrays adding up to about ``total_bytes``,
    large and small mixed as in a conv net (weights and biases)."""
    biases = [(64 * (i % 3 + 1),) for i in range(count // 2)]
    left = max(0, int(total_bytes / 4) - sum(b[0] for b in biases))
    parts = [i % 4 + 1 for i in range(count - len(biases))]
    weights = [(max(1, left * p // sum(parts) // 4), 4) for p in parts]
    return [shape for pair in zip(weights, biases) for shape in pair]


def bench(name, total_bytes, repeats, comm=None):
    """Median seconds of the exchanges of one model on every rank; rank 0's dict.

    ``raw`` is one sum of one flat float32 buffer of the same bytes through the
    same transport (the floor); ``fused_*`` the exchanger's weighted mean in
    each precision; ``per_array`` one exchanger call per array; ``host_staged``
    the fused exchange of numpy arrays.
    """
    from tmpi_adapters.pluginmanager import lookup
    exchanger = lookup("exchangers", name)(comm, timeout=600)
    cp = exchanger.cp
    shapes = model_shapes(total_bytes)
    arrays = [cp.random.standard_normal(s, dtype=cp.float32) for s in shapes]
    flat = cp.zeros(sum(a.size for a in arrays), dtype=cp.float32)
    on_host = [a.get() for a in arrays]
    weight = exchanger.rank + 1.0
    cases = {"raw": lambda: exchanger._allreduce_sum(flat)}
    for precision in ("native", "fp16", "bf16"):
        cases["fused_" + precision] = functools.partial(
            exchanger.allreduce, arrays, weight=weight, precision=precision, out=arrays)
    cases["per_array"] = lambda: [exchanger.allreduce([a], out=[a]) for a in arrays]
    cases["host_staged"] = lambda: exchanger.allreduce(on_host, weight=weight, out=on_host)
    result = {"exchanger": name, "ranks": exchanger.size, "bytes": int(flat.nbytes)}
    for case, run in cases.items():
        result[case] = _median_seconds(exchanger, run, repeats)
    result["fused_over_raw"] = result["fused_native"] / result["raw"]
    exchanger.close()
    return result


def _median_seconds(exchanger, run, repeats):
    run()  # warm-up: buffers, NCCL connections
    times = []
    for _ in range(repeats):
        exchanger.barrier()
        start = time.perf_counter()
        run()
        exchanger._wait_stream("bench")
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main(argv=None):
    """The command line of the module doc."""
    import argparse
    import json
    parser = argparse.ArgumentParser(prog="python -m tmpi_adapters.exchangers.experimental.bench",
                                     description="Time the GPU exchangers on this machine.")
    parser.add_argument("--exchanger", default="nccl", choices=["nccl", "cuda-mpi"])
    parser.add_argument("--mbytes", type=float, default=100.0, help="model size in MB")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args(argv)
    result = bench(args.exchanger, int(args.mbytes * 1e6), args.repeats)
    from mpi4py import MPI
    if MPI.COMM_WORLD.Get_rank() == 0:
        for key, value in result.items():
            print("%-16s %s" % (key, "%.6f" % value if isinstance(value, float) else value))
        if args.json:
            with open(args.json, "w") as handle:
                json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
