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

Rank 0 prints ``gosgd <mode> OK`` when everything held.
"""
import os
import pickle
import sys
import time
import warnings

import numpy as np

# Pure-Python Theano (no C compiler): a model this small needs no C code, and
# the ranks then never queue on the lock of Theano's shared compile cache.
os.environ["THEANO_FLAGS"] = ",".join(
    flag for flag in (os.environ.get("THEANO_FLAGS", ""), "cxx=") if flag)
warnings.filterwarnings("ignore", message=".*no c\\+\\+ compiler")

from tmpi_adapters.options import Options  # noqa: E402
from tmpi_adapters.session import Session  # noqa: E402

LR = 0.1
ROWS_PER_RANK = 2
TRUE_W = np.array([1.0, -2.0, 0.5])
#: The model's starting ``[w, b]`` (identical on every rank).
INITIAL = np.array([0.2, 0.1, -0.3, 0.05])


def batch(step, size):
    """The global batch of ``step``: identical on every rank."""
    rng = np.random.RandomState(1000 + step)
    x = rng.normal(size=(ROWS_PER_RANK * size, 3))
    return x, x.dot(TRUE_W) + 0.3 + 0.1 * rng.normal(size=len(x))


def rows_of(rank, x, y):
    """The rows tmpi hands ``rank`` of a global batch (contiguous, equal parts)."""
    lo, hi = ROWS_PER_RANK * rank, ROWS_PER_RANK * (rank + 1)
    return x[lo:hi], y[lo:hi]


def gradient(flat, x, y):
    """Gradient of ``0.5 * mean((x w + b - y)^2)`` at ``flat = [w, b]``."""
    residual = x.dot(flat[:3]) + flat[3] - y
    return np.append(x.T.dot(residual) / len(y), residual.mean())


def build_model():
    """A least-squares model written the plain Theano way (float64, plain SGD)."""
    import theano
    import theano.tensor as T
    w = theano.shared(INITIAL[:3].copy(), name="w")
    b = theano.shared(np.float64(INITIAL[3]), name="b")
    x, y = T.dmatrix("x"), T.dvector("y")
    loss = 0.5 * T.mean((T.dot(x, w) + b - y) ** 2)
    gw, gb = theano.grad(loss, [w, b])
    # No outputs: nothing is averaged across ranks per step, so ranks may
    # take different numbers of steps.
    # Little to optimise in a model this small.
    train = theano.function([x, y], [], updates=[(w, w - LR * gw), (b, b - LR * gb)],
                            name="train", mode="FAST_COMPILE")
    return train, w, b


def flat(w, b):
    return np.append(w.get_value(), b.get_value())


def wait_for(condition, what, timeout=60.0):
    deadline = time.time() + timeout
    while not condition():
        if time.time() > deadline:
            raise RuntimeError("timed out waiting for " + what)
        time.sleep(1e-4)


def check(actual, expected, what, rtol=1e-10):
    if not np.allclose(actual, expected, rtol=rtol, atol=1e-12):
        raise AssertionError("%s: got %r, expected %r" % (what, actual, expected))


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
    train, w, b = build_model()
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
        check(flat(w, b), sim_x[rank], "rank %d parameters after step %d" % (rank, step + 1))
        check(rule.state_dict()["weights"][model.name], sim_w[rank],
              "rank %d sum-weight after step %d" % (rank, step + 1))
        if step + 1 == 2:
            # A checkpoint's round trip, each rank's weight changed on the way:
            # the rule must go on with what was loaded.
            state = pickle.loads(pickle.dumps(rule.state_dict()))
            state["weights"][model.name] *= 1 + rank
            rule.load_state_dict(state)
            sim_w = [wr * (1 + r) for r, wr in enumerate(sim_w)]
    assert 0 < pushes < steps * size, "pushes %d of %d: choose another seed" % (
        pushes, steps * size)
    session.finish()
    consensus = sum(wr * xr for wr, xr in zip(sim_w, sim_x)) / sum(sim_w)
    check(flat(w, b), consensus, "rank %d final sum-weighted average" % rank)


def uneven(session):
    from mpi4py import MPI
    rank, size = session.rank, session.size
    rule = session.rule
    train, w, b = build_model()
    moved = np.zeros(4)
    for step in range(3 + 3 * rank):
        x, y = batch(step, size)
        before = flat(w, b)
        weights = rule.state_dict()["weights"]
        weight = weights.get(train.model.name, 1.0 / size)
        train(x, y)
        moved += weight * -LR * gradient(before, *rows_of(rank, x, y))
    session.finish()
    comm = MPI.COMM_WORLD
    weight = rule.state_dict()["weights"][train.model.name]
    check(comm.allreduce(weight), 1.0, "sum of sum-weights")
    check(comm.allreduce(weight * flat(w, b)), INITIAL + comm.allreduce(moved),
          "sum of weighted models")
    sent, received = comm.allreduce(rule.sent), comm.allreduce(rule.received)
    assert sent == received and sent > 0, "sent %d, mixed in %d" % (sent, received)


def main(mode):
    options = Options(rule="gosgd", seed=7, stall_timeout=300, summary=False,
                      rule_options={"gossip_probability": "0.5",
                                    "final_average": "true" if mode == "rounds" else "false"})
    session = Session(options).start()
    try:
        rounds(session) if mode == "rounds" else uneven(session)
    except BaseException as error:
        # One failing rank must end the whole job, not leave the others waiting.
        print("rank %d: %s: %s" % (session.rank, type(error).__name__, error), flush=True)
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)
    if session.rank == 0:
        print("gosgd %s OK on %d ranks" % (mode, session.size), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
