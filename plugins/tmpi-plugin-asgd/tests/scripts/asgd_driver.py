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

Rank 0 prints ``asgd <mode> OK`` when everything held.
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
TAU = 2
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


def loss(flat, x, y):
    return 0.5 * np.mean((x.dot(flat[:3]) + flat[3] - y) ** 2)


def build_model():
    """A least-squares model written the plain Theano way (float64, plain SGD)."""
    import theano
    import theano.tensor as T
    w = theano.shared(INITIAL[:3].copy(), name="w")
    b = theano.shared(np.float64(INITIAL[3]), name="b")
    x, y = T.dmatrix("x"), T.dvector("y")
    cost = 0.5 * T.mean((T.dot(x, w) + b - y) ** 2)
    gw, gb = theano.grad(cost, [w, b])
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


def rounds(session, steps=5):
    rank, size = session.rank, session.size
    rule, exchanger = session.rule, session.exchanger
    train, w, b = build_model()
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
        check(flat(w, b), workers[rank], "rank %d parameters after step %d" % (rank, step))
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
    check(flat(w, b), center, "rank %d final parameters" % rank)


def uneven(session):
    from mpi4py import MPI
    rank, size = session.rank, session.size
    train, w, b = build_model()
    moved = np.zeros(4)
    scale = 1.0 / size  # update_scale, left at its default
    steps = 3 + 3 * rank
    for step in range(1, steps + 1):
        x, y = batch(step, size)
        before = flat(w, b)
        train(x, y)
        moved += -LR * gradient(before, *rows_of(rank, x, y))
    session.finish()
    comm = MPI.COMM_WORLD
    final = flat(w, b)
    check(final, INITIAL + scale * comm.allreduce(moved), "rank %d final parameters" % rank)
    pushes = comm.allgather(session.rule.pushes)
    # rank 0 applies its own pushes (every TAU of its 3 steps, and a last one),
    # every answered push and one DONE per worker
    assert pushes[0] == 3 // TAU + 1 + sum(pushes[1:]) + size - 1, pushes


def main(mode):
    options = Options(rule="asgd", seed=7, stall_timeout=300, summary=False,
                      rule_options={"tau": str(TAU)})
    session = Session(options).start()
    try:
        {"rounds": rounds, "uneven": uneven}[mode](session)
    except BaseException as error:
        # One failing rank must end the whole job, not leave the others waiting.
        print("rank %d: %s: %s" % (session.rank, type(error).__name__, error), flush=True)
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)
    if session.rank == 0:
        print("asgd %s OK on %d ranks" % (mode, session.size), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
