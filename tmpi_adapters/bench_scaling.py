"""The scaling half of `tmpi bench`: 1 rank against N, step by step, in one job.

``mpiexec -n N python -m tmpi_adapters.bench_scaling --json OUT [--steps S]``

Every rank compiles the benchmark conv net twice: plainly, and inside a tmpi
session (BSP, the in-graph fused exchange).  Then, alternating ABBA:

* an **N-rank step**: every rank calls the distributed function on a batch of
  N x B rows, so each computes B rows and the gradients are exchanged;
* a **1-rank step**: rank 0 alone calls the plain function on B rows while
  the other ranks sleep.

Pairing the two step by step compares them under the same load; separate
1-rank and N-rank jobs on a shared machine compare two different moments.
Speed-up = (N x B / N-rank step) / (B / 1-rank step), the same work per rank.
The session's recorder gives the N-rank steps' compute/comm/wait split.
"""
import argparse
import json
import os
import statistics
import time

import tmpi_adapters  # noqa: F401 - applies the shims before Theano is imported


def paired_steps(session, plain, wrapped, x, y, batch_size, steps, warmup):
    """Seconds of each N-rank and 1-rank step (measured on rank 0)."""
    exchanger, rank, size = session.exchanger, session.rank, session.size
    samples = {"1": [], str(size): []}
    n = len(x)
    for i in range(warmup + steps):
        lo = (i * batch_size * size) % (n - batch_size * size + 1)
        xs, ys = x[lo:lo + batch_size * size], y[lo:lo + batch_size * size]
        for kind in (("many", "one") if i % 2 == 0 else ("one", "many")):
            exchanger.barrier()  # everyone starts together; sleepers sleep here
            start = time.perf_counter()
            if kind == "many":
                wrapped(xs, ys)
                key = str(size)
            elif rank == 0:
                plain(xs[:batch_size], ys[:batch_size])
                key = "1"
            else:
                continue
            if i >= warmup:
                samples[key].append(time.perf_counter() - start)
    exchanger.barrier()
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--batch-size", type=int, default=64, help="rows per rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    from .bench_convnet import build, generated_images
    from .options import Options
    from .runtime import import_theano_in_rank_order, mpi_rank_size
    from .session import make_session
    options = Options(framework="theano", seed=0, summary=False)
    rank, size = mpi_rank_size()
    import_theano_in_rank_order(options, rank, size)
    x, y = generated_images(max(4 * args.batch_size * size, 512))
    plain = build()  # before the session: plain Theano
    session = make_session(options)
    try:
        wrapped = build()
        samples = paired_steps(session, plain, wrapped, x, y, args.batch_size, args.steps,
                               args.warmup)
        records = session.recorder.steps[args.warmup:]
    finally:
        session.finish()
    if rank != 0:
        return
    one, many = statistics.median(samples["1"]), statistics.median(samples[str(size)])
    split = {name: statistics.median(r[i] for r in records)
             for i, name in enumerate(("compute_s", "comm_s", "wait_s"))}
    result = {"ranks": size, "batch_size_per_rank": args.batch_size, "steps": args.steps,
              "step_median_s": {"1": one, str(size): many},
              "samples_per_s": {"1": args.batch_size / one,
                                str(size): size * args.batch_size / many},
              "speedup": size * one / many, "split_s": split, "samples_s": samples}
    tmp = args.json + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle, indent=1)
    os.replace(tmp, args.json)


if __name__ == "__main__":
    main()
