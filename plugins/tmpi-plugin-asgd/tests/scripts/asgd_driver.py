"""Run ASGD (Downpour) on a tiny least-squares model on every rank and check it by hand.

``mpiexec -n 3 python asgd_driver.py rounds``
    Deterministic rounds (tau 2): in each step rank 0, the holder of the
    global parameters, trains first, then each worker in turn trains, pushes
    its accumulated update and waits for the fresh parameters.  After every
    step each rank compares its parameters (and rank 0 the global ones) with
    a numpy re-computation of the pushes and pulls in that order.  After
    step 2 the state goes through a pickled ``state_dict()``, changed, and
    back.
``mpiexec -n 3 python asgd_driver.py uneven``
    Free-running, rank r takes 3 + 3 r steps.  Downpour applies every local
    step to the global parameters exactly once, so at the end every rank must
    hold the start plus ``update_scale`` times the sum of all ranks' gradient
    steps, each taken at the parameters that rank had then: a lost or doubled
    push breaks it.

The model, its data and the numpy gradient come from
:mod:`tmpi_adapters.testing`.  Rank 0 prints ``asgd <mode> OK`` when
everything held.
"""
import pickle
import sys

import numpy as np

from tmpi_adapters.testing import (INITIAL, LR, batch, build_least_squares, check, gradient,
                                   parameters, rows_of, run_checks, wait_for)

TAU = 2


def rounds(session, steps=5):
    rank, size = session.rank, session.size
    rule, exchanger = session.rule, session.exchanger
    train, w, b = build_least_squares()
    model = train.model
    session.synchronize(model)  # the identical start, on every rank at once
    scale = 1.0 / size  # update_scale, left at its default
    workers, pulled = [INITIAL.copy() for _ in range(size)], [INITIAL.copy()] * size
    center = INITIAL.copy()
    for step in range(1, steps + 1):
        x, y = batch(step, size)
        for turn in range(size):
            if turn == rank:
                train(x, y)
            if step % TAU == 0 and turn > 0 and rank in (0, turn):
                # the worker awaits fresh parameters, rank 0 the push it applies
                wait_for(lambda: rule.poll(model) > 0, "rank %d's push" % turn)
            exchanger.barrier()
            workers[turn] = workers[turn] - LR * gradient(workers[turn], *rows_of(turn, x, y))
            if step % TAU == 0:
                center = center + scale * (workers[turn] - pulled[turn])
                workers[turn] = pulled[turn] = center
        check(parameters(w, b), workers[rank], "rank %d parameters after step %d" % (rank, step))
        if rank == 0:
            state = rule.state_dict()["models"][model.name]
            check(np.append(*state["center"]), center, "global parameters after step %d" % step)
        if step == 2:
            # A checkpoint's round trip, changed on the way: the rule must go
            # on with the accumulated updates and global parameters loaded.
            state = pickle.loads(pickle.dumps(rule.state_dict()))
            entry = state["models"][model.name]
            entry["accumulated"] = [a + 0.1 for a in entry["accumulated"]]
            if "center" in entry:
                entry["center"] = [c + 0.5 for c in entry["center"]]
            rule.load_state_dict(state)
            pulled = [p - 0.1 for p in pulled]
            center = center + 0.5
    session.finish()
    # The last pushes: rank 0's own, then the workers' (any order: a sum).
    center = center + scale * sum(xr - pr for xr, pr in zip(workers, pulled))
    check(parameters(w, b), center, "rank %d final parameters" % rank)


def uneven(session):
    from mpi4py import MPI
    rank, size = session.rank, session.size
    train, w, b = build_least_squares()
    moved = np.zeros(4)
    scale = 1.0 / size  # update_scale, left at its default
    steps = 3 + 3 * rank
    for step in range(1, steps + 1):
        x, y = batch(step, size)
        before = parameters(w, b)
        train(x, y)
        moved += -LR * gradient(before, *rows_of(rank, x, y))
    session.finish()
    comm = MPI.COMM_WORLD
    final = parameters(w, b)
    check(final, INITIAL + scale * comm.allreduce(moved), "rank %d final parameters" % rank)
    pushes = comm.allgather(session.rule.pushes)
    # rank 0 applies its own pushes (every TAU of its 3 steps, and a last one),
    # every answered push and one DONE per worker
    assert pushes[0] == 3 // TAU + 1 + sum(pushes[1:]) + size - 1, pushes


if __name__ == "__main__":
    run_checks("asgd", sys.argv[1], {"rounds": rounds, "uneven": uneven}, {"tau": str(TAU)})
