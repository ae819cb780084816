"""The scaling half of `tmpi bench`: 1 rank against N, step by step, in one job.

``mpiexec -n N python -m tmpi_adapters.bench.scaling --json OUT [--steps S]``

Every rank compiles the benchmark conv net twice: plainly, and inside a tmpi
session (BSP, the in-graph fused exchange).  Then, in a rotating order, steps
of three kinds:

* an **N-rank step**: every rank calls the distributed function on a batch of
  N x B rows, so each computes B rows and the gradients are exchanged;
* a **1-rank step**: rank 0 alone calls the plain function on B rows while
  the other ranks sleep;
* an **independent step**: every rank calls the plain function on B rows of
  its own, nothing exchanged: what N cores deliver at all, the ceiling of any
  speed-up on this machine at this moment (memory bandwidth, other load).

Taking the kinds in turn compares them under the same load; separate
1-rank and N-rank jobs on a shared machine compare two different moments.
Speed-up = (N x B / N-rank step) / (B / 1-rank step), the same work per
rank, as the median over rounds of each round's ratio.  The session's
recorder gives the N-rank steps' compute/comm/wait split.
"""
import argparse
import statistics
import time

import tmpi_adapters  # noqa: F401 - applies the shims before Theano is imported
from tmpi_adapters.bench.command import write_result


KINDS = ("many", "one", "independent")


def paired_steps(session, plain, wrapped, x, y, batch_size, steps, warmup):
    """Seconds of each kind of step, one of each per round (measured on rank 0)."""
    exchanger, rank, size = session.exchanger, session.rank, session.size
    samples = {kind: [] for kind in KINDS}
    n = len(x)
    for i in range(warmup + steps):
        lo = (i * batch_size * size) % (n - batch_size * size + 1)
        xs, ys = x[lo:lo + batch_size * size], y[lo:lo + batch_size * size]
        mine = slice(rank * batch_size, (rank + 1) * batch_size)
        for kind in KINDS[i % 3:] + KINDS[:i % 3]:
            exchanger.barrier()  # everyone starts together; sleepers sleep here
            start = time.perf_counter()
            if kind == "many":
                wrapped(xs, ys)
            elif kind == "independent":
                plain(xs[mine], ys[mine])
            elif rank == 0:
                plain(xs[:batch_size], ys[:batch_size])
            if i >= warmup:
                samples[kind].append(time.perf_counter() - start)
    # N cores deliver as fast as their slowest rank.
    every = exchanger.allgather_object(samples["independent"])
    samples["independent"] = [max(times) for times in zip(*every)]
    return samples


def paired_median(numerators, denominators, factor=1.0):
    """Median over rounds of ``factor * numerator / denominator``."""
    return statistics.median(factor * a / b for a, b in zip(numerators, denominators))


def quartiles(numerators, denominators, factor=1.0):
    ratios = sorted(factor * a / b for a, b in zip(numerators, denominators))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    return [q[0], q[-1]]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--batch-size", type=int, default=64, help="rows per rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    from tmpi_adapters.bench.convnet import build, generated_images
    from tmpi_adapters.options import Options
    from tmpi_adapters.launch.runtime import import_theano_in_rank_order, mpi_rank_size
    from tmpi_adapters.core.session import Session
    options = Options(framework="theano", seed=0, summary=False)
    rank, size = mpi_rank_size()
    import_theano_in_rank_order(options, rank, size)
    x, y = generated_images(max(4 * args.batch_size * size, 512))
    plain = build()  # before the session: plain Theano
    session = Session(options).start()
    try:
        wrapped = build()
        samples = paired_steps(session, plain, wrapped, x, y, args.batch_size, args.steps,
                               args.warmup)
        records = session.recorder.steps[args.warmup:]
    finally:
        session.finish()
    if rank != 0:
        return
    one, many, free = samples["one"], samples["many"], samples["independent"]
    split = {name: statistics.median(r[i] for r in records)
             for i, name in enumerate(("compute_s", "comm_s", "wait_s"))}
    result = {"ranks": size, "batch_size_per_rank": args.batch_size, "steps": args.steps,
              "step_median_s": {"1": statistics.median(one), str(size): statistics.median(many),
                                "independent": statistics.median(free)},
              "speedup": paired_median(one, many, size),
              "speedup_quartiles": quartiles(one, many, size),
              "ceiling": paired_median(one, free, size),
              "ceiling_quartiles": quartiles(one, free, size),
              "split_s": split, "samples_s": samples}
    result["samples_per_s"] = {"1": args.batch_size / result["step_median_s"]["1"],
                               str(size): size * args.batch_size / result["step_median_s"][
                                   str(size)]}
    result["efficiency"] = result["speedup"] / result["ceiling"]
    write_result(args.json, result)


if __name__ == "__main__":
    main()
