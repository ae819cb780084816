"""Run GoSGD on a tiny least-squares model on every rank and check it by hand.

``mpiexec -n 3 python gosgd_driver.py rounds``
    Deterministic rounds: in each step the ranks train one after another
    (rank order), and the peer a rank pushes to has mixed the message in
    before the next rank trains.  After every step each rank compares its
    parameters and sum-weight with a numpy re-computation of all ranks'
    gradient steps, halvings and mixes; after the end of training, the final
    sum-weighted average.  Half-way, each rank's state goes through a pickled
    ``state_dict()`` with its weight changed, and back through
    ``load_state_dict()``.
``mpiexec -n 3 python gosgd_driver.py uneven``
    Free-running, rank r takes 3 + 3 r steps.  Gossip preserves
    ``sum_r w_r`` and ``sum_r w_r x_r``, so at the end the weights still add
    up to 1 and ``sum_r w_r x_r`` equals the start plus every gradient step
    weighted by its rank's weight at that moment: a lost or doubled message
    would break both.

The model, its data and the numpy gradient come from
:mod:`tmpi_adapters.testing`.  Rank 0 prints ``gosgd <mode> OK`` when
everything held.
"""
import pickle
import sys

import numpy as np

from tmpi_adapters.testing import (INITIAL, LR, batch, build_least_squares, check, gradient,
                                   parameters, rows_of, run_checks, wait_for)


def mix(sim_x, sim_w, sender, receiver):
    """The paper's push: the sender halves its weight, the receiver mixes."""
    sim_w[sender] /= 2
    total = sim_w[receiver] + sim_w[sender]
    sim_x[receiver] = (sim_w[receiver] * sim_x[receiver]
                       + sim_w[sender] * sim_x[sender]) / total
    sim_w[receiver] = total


def rounds(session, steps=4):
    rank, size = session.rank, session.size
    rule, exchanger = session.rule, session.exchanger
    train, w, b = build_least_squares()
    model = train.model
    session.synchronize(model)  # the identical start, on every rank at once
    sim_x, sim_w = [INITIAL.copy() for _ in range(size)], [1.0 / size] * size
    pushes = 0
    for step in range(steps):
        x, y = batch(step, size)
        for turn in range(size):
            if turn == rank:
                train(x, y)
            peer = exchanger.allgather_object(rule.last_peer if rank == turn else None)[turn]
            if peer == rank:
                wait_for(lambda: rule.poll(model) > 0, "rank %d's push" % turn)
            exchanger.barrier()
            sim_x[turn] = sim_x[turn] - LR * gradient(sim_x[turn], *rows_of(turn, x, y))
            if peer is not None:
                pushes += 1
                mix(sim_x, sim_w, turn, peer)
        check(parameters(w, b), sim_x[rank],
              "rank %d parameters after step %d" % (rank, step + 1))
        check(rule.of(model).weight, sim_w[rank],
              "rank %d sum-weight after step %d" % (rank, step + 1))
        if step + 1 == 2:
            # A checkpoint's round trip, each rank's weight changed on the way:
            # the rule must go on with what was loaded.
            state = pickle.loads(pickle.dumps(rule.state_dict()))
            state["models"][model.name]["weight"] *= 1 + rank
            rule.load_state_dict(state)
            sim_w = [wr * (1 + r) for r, wr in enumerate(sim_w)]
    assert 0 < pushes < steps * size, "pushes %d of %d: choose another seed" % (
        pushes, steps * size)
    session.finish()
    consensus = sum(wr * xr for wr, xr in zip(sim_w, sim_x)) / sum(sim_w)
    check(parameters(w, b), consensus, "rank %d final sum-weighted average" % rank)


def uneven(session):
    from mpi4py import MPI
    rank, size = session.rank, session.size
    rule = session.rule
    train, w, b = build_least_squares()
    moved = np.zeros(4)
    for step in range(3 + 3 * rank):
        x, y = batch(step, size)
        before = parameters(w, b)
        gossip = rule.models.get(train.model)  # none before the first step
        weight = gossip.weight if gossip is not None else 1.0 / size
        train(x, y)
        moved += weight * -LR * gradient(before, *rows_of(rank, x, y))
    session.finish()
    comm = MPI.COMM_WORLD
    weight = rule.of(train.model).weight
    check(comm.allreduce(weight), 1.0, "sum of sum-weights")
    check(comm.allreduce(weight * parameters(w, b)), INITIAL + comm.allreduce(moved),
          "sum of weighted models")
    sent, received = comm.allreduce(rule.sent), comm.allreduce(rule.received)
    assert sent == received and sent > 0, "sent %d, mixed in %d" % (sent, received)


if __name__ == "__main__":
    mode = sys.argv[1]
    run_checks("gosgd", mode, {"rounds": rounds, "uneven": uneven},
               {"gossip_probability": "0.5",
                "final_average": "true" if mode == "rounds" else "false"})
