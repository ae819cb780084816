"""The shared exchanger test-suite, run on every rank: ``exchanger_suite.py NAME``.

Every registered exchanger must pass it.  Values are checked against sums
computed by hand from what each rank contributes.  Rank 0 prints
``exchanger suite OK`` when everything held.
"""
import sys

import numpy as np

import tmpi_adapters  # noqa: F401 - applies the shims
from tmpi_adapters.exchangers.base import ANY_SOURCE
from tmpi_adapters.pluginmanager import lookup


def check_parts(exchanger, rank, size):
    """A coupling's parts made whole (what a step's rows meeting sends): rows
    joined in rank order from uneven shares, sums, extrema, stacks, a rank
    that gives nothing; the prepared gather reused call after call, and no
    result a view of its buffers."""
    from tmpi_adapters.exchangers.parts import Part, combine_parts
    every, rows, kept = [1] * size, [r + 1 for r in range(size)], []
    for call in range(4):
        parts = [Part(np.full((rows[rank], 2), rank + call, np.float32), "gather", rows),
                 Part(np.arange(3.0) * (rank + 1) + call, "sum", every),
                 Part(np.array([rank - call], np.float64), "max", every),
                 Part(np.array([rank + call], np.int64), "min", [0] + every[1:]),
                 Part(np.arange(4, dtype=np.int64) + rank * call, "stack", every)]
        joined, total, top, low, stacked = combine_parts(exchanger, parts, rank)
        expected = np.concatenate([np.full((r + 1, 2), r + call, np.float32)
                                   for r in range(size)])
        np.testing.assert_array_equal(joined, expected)
        assert joined.dtype == np.float32
        np.testing.assert_array_equal(total, sum(np.arange(3.0) * (r + 1) + call
                                                 for r in range(size)))
        assert top.tolist() == [size - 1 - call]
        assert low is None if size == 1 else low.tolist() == [1 + call]
        np.testing.assert_array_equal(stacked, [np.arange(4) + r * call for r in range(size)])
        kept.append((call, joined, total))
    for call, joined, total in kept:  # later calls left earlier results alone
        assert joined[0, 0] == call and total[0] == size * call
    check_runs(exchanger, rank, size)
    check_started(exchanger, rank, size)


def check_runs(exchanger, rank, size):
    """Reductions side by side (a BatchNorm level's sums) combined as one
    run: each still its own shape and dtype, summed in rank order, a part
    that only rank 0 gives and a float64 sum after the float32 ones kept
    apart, the results left alone by later calls."""
    from tmpi_adapters.exchangers.parts import Part, combine_parts
    every, kept = [1] * size, []
    for call in range(3):
        f32 = [np.arange(2, dtype=np.float32) + rank + call,
               np.full((3, 4), 0.5 * (rank + 1) + call, np.float32),
               np.asarray(rank * 10.0 + call, np.float32)]
        parts = [Part(v, "sum", every) for v in f32]
        parts += [Part(np.array([rank + 0.25 + call]), "sum", every),
                  Part(np.array([7.0 + rank], np.float32), "sum", [1] + [0] * (size - 1)),
                  Part(np.array([rank + call, -rank], np.float32), "max", every),
                  Part(np.array([rank - call], np.float32), "max", every),
                  Part(np.asarray(rank + 0.5 * call), "sum", every)]
        first, block, scalar, f64, only, top, top2, alone = combine_parts(exchanger, parts,
                                                                          rank)
        assert isinstance(alone, np.ndarray) and alone.shape == ()
        assert alone == sum(r + 0.5 * call for r in range(size))
        assert isinstance(scalar, np.ndarray)
        np.testing.assert_array_equal(first, sum(np.arange(2, dtype=np.float32) + r + call
                                                 for r in range(size)))
        assert block.shape == (3, 4) and block.dtype == np.float32
        np.testing.assert_array_equal(block, sum(0.5 * (r + 1) + call for r in range(size)))
        assert scalar.shape == () and scalar == sum(r * 10.0 + call for r in range(size))
        assert f64.dtype == np.float64 and f64.tolist() == [sum(r + 0.25 + call
                                                                for r in range(size))]
        assert only.tolist() == [7.0]
        assert top.tolist() == [size - 1 + call, 0] and top2.tolist() == [size - 1 - call]
        kept.append((call, first, block))
    for call, first, block in kept:
        assert first[0] == sum(r + call for r in range(size))
        assert block[0, 0] == sum(0.5 * (r + 1) + call for r in range(size))


def check_started(exchanger, rank, size):
    """A level's gather started, then left running while the rank computes
    (its values overwritten, another collective run in between), then
    finished: the whole values of what was started, every call."""
    from tmpi_adapters.exchangers.parts import Layout, Part
    every = [1] * size
    values = [np.full(3, rank + 1.0, np.float32), np.asarray(rank * 2.0)]
    layout = Layout(exchanger, [Part(v, "sum", every) for v in values], rank)
    for call in range(3):
        values[0][...] = rank + 1.0 + call
        layout.start(values)
        values[0][...] = -1.0
        between = exchanger.allreduce([np.array([rank + 1.0])], op="sum")[0]
        assert between.tolist() == [size * (size + 1) / 2.0]
        total, doubled = layout.finish()
        np.testing.assert_array_equal(total, sum(r + 1.0 + call for r in range(size)))
        assert doubled.shape == () and doubled == sum(2.0 * r for r in range(size))
    layout.gather.free()


def main(name):
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    exchanger = lookup("exchangers", name)(comm, timeout=60)
    rank, size = exchanger.rank, exchanger.size
    assert (rank, size) == (comm.rank, comm.size)
    xp = np
    if exchanger.memory == "device":
        import cupy as xp  # noqa: F811

    def host(a):
        return a.get() if hasattr(a, "get") else np.asarray(a)

    def contribution(r, shape, dtype, salt):
        return (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * (r + 1)
                + salt).astype(dtype)

    shapes = [(3, 4), (5,), (), (2, 2, 2)]
    for dtype in (np.float32, np.float64):
        mine = [xp.asarray(contribution(rank, s, dtype, i)) for i, s in enumerate(shapes)]
        every = [[contribution(r, s, np.float64, i) for i, s in enumerate(shapes)]
                 for r in range(size)]
        tol = 1e-5 if dtype == np.float32 else 1e-12

        total = exchanger.allreduce(mine, op="sum")
        for i in range(len(shapes)):
            expected = sum(every[r][i] for r in range(size))
            np.testing.assert_allclose(host(total[i]), expected, rtol=tol)
            assert host(total[i]).dtype == dtype and host(total[i]).shape == shapes[i]

        mean = exchanger.allreduce(mine, op="mean")
        for i in range(len(shapes)):
            expected = sum(every[r][i] for r in range(size)) / size
            np.testing.assert_allclose(host(mean[i]), expected, rtol=tol)

        weights = [r + 2.0 for r in range(size)]
        weighted = exchanger.allreduce(mine, op="mean", weight=weights[rank])
        for i in range(len(shapes)):
            expected = sum(weights[r] * every[r][i] for r in range(size)) / sum(weights)
            np.testing.assert_allclose(host(weighted[i]), expected, rtol=tol)

        # A rank with weight 0 contributes nothing, even NaN.
        poisoned = [xp.asarray(np.full(s, np.nan, dtype)) if rank == size - 1 and size > 1
                    else m for s, m in zip(shapes, mine)]
        w = 0.0 if rank == size - 1 and size > 1 else 1.0
        partial = exchanger.allreduce(poisoned, op="mean", weight=w)
        live = [r for r in range(size) if not (r == size - 1 and size > 1)]
        for i in range(len(shapes)):
            expected = sum(every[r][i] for r in live) / len(live)
            np.testing.assert_allclose(host(partial[i]), expected, rtol=tol)

        # In-place output.
        inplace = [m.copy() for m in mine]
        exchanger.allreduce(inplace, op="sum", out=inplace)
        np.testing.assert_allclose(host(inplace[0]), sum(every[r][0] for r in range(size)),
                                   rtol=tol)

        for precision, ptol in (("fp32", 1e-6), ("fp16", 2e-3), ("bf16", 1e-2)):
            reduced = exchanger.allreduce(mine, op="mean", weight=weights[rank],
                                          precision=precision)
            for i in range(len(shapes)):
                expected = sum(weights[r] * every[r][i] for r in range(size)) / sum(weights)
                np.testing.assert_allclose(host(reduced[i]), expected, rtol=ptol,
                                           atol=ptol * np.abs(expected).max())
                assert host(reduced[i]).dtype == dtype

    # Two dtypes in one weighted call, the total unknown: the weights' sum
    # travels with the first dtype and must divide the other's means too.
    weights = [r + 2.0 for r in range(size)]
    mixed = [xp.asarray(contribution(rank, (3, 4), np.float32, 0)),
             xp.asarray(contribution(rank, (5,), np.float64, 1)),
             xp.asarray(contribution(rank, (2,), np.float64, 2))]
    ops = ["mean", "mean", "sum"]
    means = [sum(weights[r] * contribution(r, s, np.float64, i) for r in range(size))
             / sum(weights) for i, s in enumerate([(3, 4), (5,), (2,)])]
    sums = sum(contribution(r, (2,), np.float64, 2) for r in range(size))
    for got in (exchanger.allreduce(mixed, ops=ops, weight=weights[rank]),
                exchanger.start_allreduce(mixed, ops, weight=weights[rank]).finish()):
        np.testing.assert_allclose(host(got[0]), means[0], rtol=1e-5)
        np.testing.assert_allclose(host(got[1]), means[1], rtol=1e-12)
        np.testing.assert_allclose(host(got[2]), sums, rtol=1e-12)

    # Started reductions: several in flight at once (two of the same shapes,
    # told apart by their slot), finished in another order, equal to allreduce;
    # the inputs may change once started.
    for precision in ("native", "fp16"):
        weights = [r + 2.0 for r in range(size)]
        parts = [[xp.asarray(contribution(rank, s, np.float32, i)) for i, s in enumerate(shapes)]
                 for _ in range(2)] + [[xp.asarray(contribution(rank, (7,), np.float64, 9))]]
        ops = [["mean", "sum", "mean", "sum"], ["sum", "mean", "sum", "mean"], ["mean"]]
        expected = [exchanger.allreduce(p, ops=o, weight=weights[rank], precision=precision)
                    for p, o in zip(parts, ops)]
        expected = [[host(a).copy() for a in e] for e in expected]
        started = [exchanger.start_allreduce(p, o, weight=weights[rank], precision=precision,
                                             slot=k) for k, (p, o) in enumerate(zip(parts, ops))]
        for p in parts:
            for a in p:
                a[...] = -1
        started[1].progress()
        for k in (2, 0, 1):
            got = started[k].finish()
            assert started[k].progress()
            for g, e in zip(got, expected[k]):
                np.testing.assert_array_equal(host(g), e)

    # Broadcast overwrites in place with the root's values.
    for root in {0, size - 1}:
        arrays = [xp.asarray(contribution(rank, s, np.float64, i)) for i, s in enumerate(shapes)]
        arrays.append(xp.asarray(np.full((4,), rank, dtype=np.int32)))
        result = exchanger.broadcast(arrays, root=root)
        assert result is arrays
        for i, s in enumerate(shapes):
            np.testing.assert_array_equal(host(arrays[i]), contribution(root, s, np.float64, i))
        np.testing.assert_array_equal(host(arrays[-1]), np.full((4,), root))

    # Rows gathered in rank order, with different counts per rank.
    rows = xp.asarray(np.full((rank + 1, 3), rank, dtype=np.float64))
    gathered = host(exchanger.allgather_rows(rows))
    expected = np.concatenate([np.full((r + 1, 3), r, dtype=np.float64) for r in range(size)])
    np.testing.assert_array_equal(gathered, expected)

    assert exchanger.allgather_object({"rank": rank}) == [{"rank": r} for r in range(size)]
    if exchanger.memory != "device":
        check_parts(exchanger, rank, size)
    exchanger.barrier()

    if size > 1:
        # Blocking ring.
        out = xp.zeros(6, dtype=np.float64)
        right, left = (rank + 1) % size, (rank - 1) % size
        if rank % 2 == 0:
            exchanger.send(xp.full(6, rank, dtype=np.float64), right, tag=3)
            source, tag = exchanger.recv(out, left, tag=3)
        else:
            source, tag = exchanger.recv(out, left, tag=3)
            exchanger.send(xp.full(6, rank, dtype=np.float64), right, tag=3)
        assert (source, tag) == (left, 3)
        np.testing.assert_array_equal(host(out), np.full(6, left))

        # Non-blocking: everyone sends to rank 0, which receives from any source.
        payload = xp.full(5, 10.0 * rank, dtype=np.float32)
        request = exchanger.isend(payload, 0, tag=7) if rank != 0 else None
        if rank == 0:
            seen = set()
            for _ in range(size - 1):
                while exchanger.probe(ANY_SOURCE, 7) is None:
                    pass
                buf = xp.zeros(5, dtype=np.float32)
                source, tag = exchanger.irecv(buf, ANY_SOURCE, 7).wait()
                np.testing.assert_array_equal(host(buf), np.full(5, 10.0 * source))
                seen.add(source)
            assert seen == set(range(1, size)), seen
        else:
            request.wait()
            assert request.test()
        # An unmatched receive can be cancelled.
        pending = exchanger.irecv(xp.zeros(1), ANY_SOURCE, 99)
        assert not pending.test()
        pending.cancel()
        exchanger.barrier()

    exchanger.close()
    if rank == 0:
        print("exchanger suite OK: %s on %d rank(s)" % (name, size), flush=True)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "mpi")
