"""The fused exchange's paths on real ranks: ``fused_exchange.py``.

Arrays large enough for reduce-scatter + allgather, split unevenly across
ranks, in buckets and whole, at every precision and with both algorithms;
results must match a float64 computation, be bit-identical on every rank,
come back as views of the exchanger's buffer only when borrowed, and be
counted in the exchanger's statistics.  Rank 0 prints ``fused exchange OK``.
"""
import hashlib

import numpy as np

import tmpi_adapters  # noqa: F401 - applies the shims
from tmpi_adapters.exchangers.mpi import RSAG_MIN_BYTES, MPIExchanger

TOLERANCE = {"native": 1e-6, "fp32": 1e-6, "fp16": 2e-3, "bf16": 1e-2}


def contributions(rank, dtype):
    rng = np.random.RandomState(100 + rank)
    # 3 large arrays (an odd total, so shares are uneven) and small ones.
    shapes = [(301, 257), (7,), (RSAG_MIN_BYTES // 4 + 13,), (), (5, 3)]
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def digest(arrays):
    h = hashlib.sha1()
    for a in arrays:
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def check_case(exchanger, comm, dtype, precision, weighted):
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = contributions(rank, dtype)
    weights = [float(r + 1) for r in range(size)]
    every = [[a.astype(np.float64) for a in contributions(r, dtype)] for r in range(size)]
    if weighted:
        result = exchanger.allreduce(mine, op="mean", weight=weights[rank], precision=precision)
        expected = [sum(weights[r] * every[r][i] for r in range(size)) / sum(weights)
                    for i in range(len(mine))]
        assert exchanger.stats.last_total_weight == sum(weights)
    else:
        result = exchanger.allreduce(mine, op="sum", precision=precision)
        expected = [sum(every[r][i] for r in range(size)) for i in range(len(mine))]
    tol = TOLERANCE[precision]
    for r, e, m in zip(result, expected, mine):
        assert r.dtype == m.dtype and r.shape == m.shape, (r.dtype, r.shape, m.dtype, m.shape)
        scale = np.abs(e).max() if e.size else 1.0
        np.testing.assert_allclose(r, e, rtol=tol, atol=tol * scale)
    digests = comm.allgather(digest(result))
    assert len(set(digests)) == 1, "ranks disagree bit-wise: %s" % digests
    return result


def check_borrowing(comm):
    exchanger = MPIExchanger(comm, timeout=60)
    arrays = contributions(comm.Get_rank(), np.float32)
    fresh = exchanger.allreduce(arrays, op="mean")
    assert all(f.base is None for f in fresh)  # new arrays: the caller owns them
    with exchanger.borrowing():
        first = exchanger.allreduce(arrays, op="mean")
        second = exchanger.allreduce(arrays, op="mean")
    for a, b, f in zip(first, second, fresh):
        assert np.shares_memory(a, b)  # the same buffer, reused
        np.testing.assert_array_equal(b, f)
    out = [np.empty_like(a) for a in arrays]
    returned = exchanger.allreduce(arrays, op="mean", out=out)
    assert all(r is o for r, o in zip(returned, out))
    stats = exchanger.stats.take()
    if comm.Get_size() > 1:  # one rank moves nothing
        assert stats["transfer_s"] > 0 and stats["wire_bytes"] > 0 and stats["collectives"] > 0
    assert exchanger.stats.take()["collectives"] == 0  # take() starts from zero


def check_weight_zero_rsag(comm):
    rank, size = comm.Get_rank(), comm.Get_size()
    exchanger = MPIExchanger(comm, timeout=60, algorithm="rsag")
    n = RSAG_MIN_BYTES // 4 + 1
    values = np.full(n, np.nan if rank == size - 1 else rank + 1.0, dtype=np.float32)
    for precision in ("native", "fp16", "bf16"):
        result = exchanger.allreduce([values], op="mean", weight=0.0 if rank == size - 1
                                     else 1.0, precision=precision)[0]
        live = [r + 1.0 for r in range(size - 1)]
        np.testing.assert_allclose(result, np.mean(live), rtol=TOLERANCE[precision])


def main():
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    for algorithm in ("auto", "rsag", "allreduce"):
        for bucket_bytes in (None, 100_000):
            exchanger = MPIExchanger(comm, timeout=60, algorithm=algorithm,
                                     bucket_bytes=bucket_bytes)
            for dtype in (np.float32, np.float64):
                for precision in ("native", "fp32", "fp16", "bf16"):
                    for weighted in (True, False):
                        check_case(exchanger, comm, dtype, precision, weighted)
            exchanger.close()
    check_borrowing(comm)
    if comm.Get_size() > 1:
        check_weight_zero_rsag(comm)
    if comm.Get_rank() == 0:
        print("fused exchange OK on %d rank(s)" % comm.Get_size(), flush=True)


if __name__ == "__main__":
    main()
