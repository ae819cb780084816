"""The overhead half of `tmpi bench`: one rank, wrapped step against plain step.

``python -m tmpi_adapters.bench.overhead --json OUT [--steps S] [--batch-size B]``

Compiles the benchmark conv net twice in one process: first with plain
Theano, then inside a one-rank tmpi session (what ``tmpi wrap -n 1`` does to a
script: hooked ``theano.grad``/``theano.function``, the in-graph exchange Op,
batch splitting, the recorder).  The two training functions then take steps
alternately, ABBA, so that a busy machine slows both alike; a separate
process per variant would compare two different moments of a shared machine.
"""
import argparse
import statistics
import time

import tmpi_adapters  # noqa: F401 - applies the shims before Theano is imported
from tmpi_adapters.bench.command import write_result


def alternate(plain, wrapped, x, y, batch_size, steps, warmup):
    """Seconds per step of each function, stepping them in ABBA order."""
    samples = {"plain": [], "wrapped": []}
    order = [("plain", plain), ("wrapped", wrapped)]
    n = len(x)
    for i in range(warmup + steps):
        lo = (i * batch_size) % (n - batch_size + 1)
        xb, yb = x[lo:lo + batch_size], y[lo:lo + batch_size]
        for name, fn in (order if i % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            fn(xb, yb)
            if i >= warmup:
                samples[name].append(time.perf_counter() - start)
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", required=True)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    from tmpi_adapters.bench.convnet import build, generated_images
    from tmpi_adapters.options import Options
    from tmpi_adapters.core.session import Session
    x, y = generated_images(max(4 * args.batch_size, 512))
    plain = build()
    session = Session(Options(framework="theano", seed=0, summary=False)).start()
    try:
        wrapped = build()
        samples = alternate(plain, wrapped, x, y, args.batch_size, args.steps, args.warmup)
    finally:
        session.finish()
    # Each step's ratio to its neighbour cancels the machine's slow swings.
    ratios = sorted(w / p - 1.0 for p, w in zip(samples["plain"], samples["wrapped"]))
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    result = {"batch_size": args.batch_size, "steps": args.steps,
              "plain_median_s": statistics.median(samples["plain"]),
              "wrapped_median_s": statistics.median(samples["wrapped"]),
              "overhead": statistics.median(ratios),
              "overhead_quartiles": [quartiles[0], quartiles[-1]],
              "samples_s": samples}
    write_result(args.json, result)


if __name__ == "__main__":
    main()
