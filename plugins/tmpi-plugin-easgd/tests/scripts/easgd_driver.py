"""Run EASGD on a tiny least-squares model on every rank and check it by hand.

``mpiexec -n 3 python easgd_driver.py sync``
    Synchronous EASGD (alpha 0.25, tau 2): after every step each rank
    compares its parameters with a numpy re-computation of all ranks'
    gradient steps and elastic exchanges (the paper's synchronous updates);
    at the end every rank must hold the center.  After step 2 the state goes
    through a pickled ``state_dict()`` with the center moved, and back.
``mpiexec -n 3 python easgd_driver.py async``
    Asynchronous EASGD, made deterministic for checking: in each step rank 0
    (the center's holder) trains first, then each worker in turn trains,
    pushes and waits for the answer.  The expected values apply the paper's
    worker and center updates in that order.
``mpiexec -n 3 python easgd_driver.py uneven``
    Asynchronous and free-running, rank r takes 3 + 3 r steps: every push
    must be answered (rank 0 counts every exchange the workers count), every
    rank must end with the same model, the center, and it must fit the data
    better than the start did.

The model, its data and the numpy gradient come from
:mod:`tmpi_adapters.testing`.  Rank 0 prints ``easgd <mode> OK`` when
everything held.
"""
import pickle
import sys

import numpy as np

from tmpi_adapters.testing import (INITIAL, LR, batch, build_least_squares, check, gradient,
                                   loss, parameters, rows_of, run_checks, wait_for)

ALPHA = 0.25
TAU = 2


def restore_with_center_moved(rule):
    """A checkpoint's round trip with the center moved by 0.5 on the way: the
    rule must go on with what was loaded."""
    state = pickle.loads(pickle.dumps(rule.state_dict()))
    for entry in state["models"].values():
        if entry is not None:  # only where the center is held
            entry["center"] = [a + 0.5 for a in entry["center"]]
    rule.load_state_dict(state)


def sync_rounds(session, steps=6):
    rank, size = session.rank, session.size
    train, w, b = build_least_squares()
    workers, center = [INITIAL.copy() for _ in range(size)], INITIAL.copy()
    for step in range(1, steps + 1):
        x, y = batch(step, size)
        train(x, y)
        workers = [xr - LR * gradient(xr, *rows_of(r, x, y)) for r, xr in enumerate(workers)]
        if step % TAU == 0:
            forces = [ALPHA * (xr - center) for xr in workers]
            workers = [xr - f for xr, f in zip(workers, forces)]
            center = center + sum(forces)
        check(parameters(w, b), workers[rank], "rank %d parameters after step %d" % (rank, step))
        if rank == 0:
            check(session.rule.of(train.model).center[0], center[:3],
                  "the center's w after step %d" % step)
        if step == 2:
            restore_with_center_moved(session.rule)
            center = center + 0.5
    session.finish()
    check(parameters(w, b), center, "rank %d final parameters (the center)" % rank)


def async_rounds(session, steps=5):
    rank, size = session.rank, session.size
    rule, exchanger = session.rule, session.exchanger
    train, w, b = build_least_squares()
    model = train.model
    session.synchronize(model)  # the identical start, on every rank at once
    workers, center = [INITIAL.copy() for _ in range(size)], INITIAL.copy()
    for step in range(1, steps + 1):
        x, y = batch(step, size)
        for turn in range(size):
            if turn == rank:
                train(x, y)
            if step % TAU == 0 and turn > 0 and rank in (0, turn):
                # the worker awaits its answer, rank 0 the push it answers
                wait_for(lambda: rule.poll(model) > 0, "rank %d's exchange" % turn)
            exchanger.barrier()
            workers[turn] = workers[turn] - LR * gradient(workers[turn], *rows_of(turn, x, y))
            if step % TAU == 0:
                force = ALPHA * (workers[turn] - center)
                workers[turn] = workers[turn] - force
                center = center + force
        check(parameters(w, b), workers[rank], "rank %d parameters after step %d" % (rank, step))
        if rank == 0:
            check(np.append(*rule.of(model).center), center,
                  "the center after step %d" % step)
        if step == 2:
            restore_with_center_moved(session.rule)
            center = center + 0.5
    session.finish()
    check(parameters(w, b), center, "rank %d final parameters (the center)" % rank)


def uneven(session):
    from mpi4py import MPI
    rank, size = session.rank, session.size
    train, w, b = build_least_squares()
    steps = 3 + 3 * rank
    for step in range(1, steps + 1):
        train(*batch(step, size))
    session.finish()
    comm = MPI.COMM_WORLD
    final = parameters(w, b)
    finals = comm.allgather(final)
    for r, other in enumerate(finals):
        check(other, finals[0], "rank %d's final model against rank 0's" % r, rtol=0)
    counts = comm.allgather(session.rule.exchanges_done)
    # rank 0 counts its own exchanges (3 steps) and every push it answered
    assert counts[0] == 3 // TAU + sum(counts[1:]), counts
    assert all(c > 0 for c in counts), counts
    x, y = batch(0, size)
    assert loss(final, x, y) < loss(INITIAL, x, y), (loss(final, x, y), loss(INITIAL, x, y))


if __name__ == "__main__":
    mode = sys.argv[1]
    run_checks("easgd", mode, {"sync": sync_rounds, "async": async_rounds, "uneven": uneven},
               {"alpha": str(ALPHA), "tau": str(TAU),
                "mode": "sync" if mode == "sync" else "async"})
