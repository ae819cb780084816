"""The scaling part of `tmpi bench`: 1 rank against N, step by step, in one job.

``mpiexec -n N python -m tmpi_adapters.bench.scaling --json OUT [--steps S]``

Every rank compiles the benchmark conv net (:mod:`tmpi_adapters.bench.models`)
twice: plainly, and inside a tmpi session (BSP, the in-graph exchange).
Then, in a rotating order, steps of four kinds:

* an **N-rank step**: every rank calls the distributed function on a batch of
  N x B rows, so each computes B rows and the step's one collective runs;
* the same **without envelopes**: the lockstep envelope switched off in the
  exchanger for this step (what ``TMPI_ENVELOPES=0`` does for a whole job),
  so that its cost is a ratio of neighbouring steps;
* a **1-rank step**: rank 0 alone calls the plain function on B rows while
  the other ranks sleep;
* an **independent step**: every rank calls the plain function on B rows of
  its own, nothing exchanged: what N cores deliver at all, the ceiling of any
  speed-up on this machine at this moment (memory bandwidth, other load).

Taking the kinds in turn compares them under the same load; separate jobs on
a shared machine compare two different moments.  Speed-up = (N x B / N-rank
step) / (B / 1-rank step), the same work per rank, as the median over rounds
of each round's ratio.  The recorder gives the N-rank steps' time split.
"""
import argparse
import statistics
import time

import tmpi_adapters  # noqa: F401 - applies the shims before Theano is imported
from tmpi_adapters.bench.runs import paired_ratio, write_result

KINDS = ("many", "one", "many_no_envelope", "independent")


def _envelopes(exchanger, enabled):
    """Switch the exchanger's lockstep envelopes on or off; ``False`` when it has none."""
    lockstep = getattr(exchanger, "lockstep", None)
    if lockstep is None:
        return False
    lockstep.enabled = enabled
    return True


def paired_steps(session, plain, wrapped, x, y, batch_size, steps, warmup):
    """Seconds of each kind of step, one of each per round (measured on rank 0),
    and the recorder's records of the N-rank steps with envelopes."""
    exchanger, rank, size = session.exchanger, session.rank, session.size
    kinds = KINDS if _envelopes(exchanger, True) else tuple(k for k in KINDS
                                                            if k != "many_no_envelope")
    samples = {kind: [] for kind in kinds}
    records = []
    n = len(x)
    for i in range(warmup + steps):
        lo = (i * batch_size * size) % (n - batch_size * size + 1)
        xs, ys = x[lo:lo + batch_size * size], y[lo:lo + batch_size * size]
        mine = slice(rank * batch_size, (rank + 1) * batch_size)
        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            exchanger.barrier()  # everyone starts together; sleepers sleep here
            start = time.perf_counter()
            if kind.startswith("many"):
                _envelopes(exchanger, kind == "many")
                try:
                    wrapped(xs, ys)
                finally:
                    _envelopes(exchanger, True)
            elif kind == "independent":
                plain(xs[mine], ys[mine])
            elif rank == 0:
                plain(xs[:batch_size], ys[:batch_size])
            if i >= warmup:
                samples[kind].append(time.perf_counter() - start)
                if kind == "many":
                    records.append(session.recorder.steps[-1])
    # N cores deliver as fast as their slowest rank.
    every = exchanger.allgather_object(samples["independent"])
    samples["independent"] = [max(times) for times in zip(*every)]
    return samples, records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--batch-size", type=int, default=64, help="rows per rank")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    from tmpi_adapters.bench.models import MODELS, build, generated_data
    from tmpi_adapters.core.session import Session
    from tmpi_adapters.launch.runtime import import_theano_in_rank_order
    from tmpi_adapters.process.rank import mpi_rank_size
    from tmpi_adapters.options import Options
    options = Options(framework="theano", seed=0, summary=False)
    rank, size = mpi_rank_size()
    import_theano_in_rank_order(options, rank, size)
    x, y = generated_data(max(4 * args.batch_size * size, 512), MODELS["convnet"][0])
    plain = build("convnet")  # before the session: plain Theano
    session = Session(options).start()
    try:
        wrapped = build("convnet")
        samples, records = paired_steps(session, plain, wrapped, x, y, args.batch_size,
                                        args.steps, args.warmup)
    finally:
        session.finish()
    if rank != 0:
        return
    one, many, free = samples["one"], samples["many"], samples["independent"]
    split = {name: statistics.median(r[i] for r in records)
             for i, name in enumerate(("compute_s", "comm_s", "wait_s"))}
    speedup, speedup_range = paired_ratio(one, many, size)
    ceiling, ceiling_range = paired_ratio(one, free, size)
    result = {"ranks": size, "batch_size_per_rank": args.batch_size, "steps": args.steps,
              "step_median_s": {"1": statistics.median(one), str(size): statistics.median(many),
                                "independent": statistics.median(free)},
              "speedup": speedup, "speedup_range": speedup_range,
              "ceiling": ceiling, "ceiling_range": ceiling_range,
              "split_s": split, "samples_s": samples}
    if "many_no_envelope" in samples:
        bare = samples["many_no_envelope"]
        cost, cost_range = paired_ratio(many, bare)
        result["step_median_s"]["no_envelope"] = statistics.median(bare)
        result["envelope_cost"] = cost - 1.0
        result["envelope_cost_range"] = [cost_range[0] - 1.0, cost_range[1] - 1.0]
    result["samples_per_s"] = {"1": args.batch_size / result["step_median_s"]["1"],
                               str(size): size * args.batch_size / result["step_median_s"][
                                   str(size)]}
    result["efficiency"] = result["speedup"] / result["ceiling"]
    write_result(args.json, result)


if __name__ == "__main__":
    main()
