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

Rank 0 prints ``easgd <mode> OK`` when everything held.
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
ALPHA = 0.25
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


def restore_with_center_moved(rule):
    """A checkpoint's round trip with the center moved by 0.5 on the way: the
    rule must go on with what was loaded."""
    state = pickle.loads(pickle.dumps(rule.state_dict()))
    for arrays in state["center"].values():  # only where the center is held
        arrays[:] = [a + 0.5 for a in arrays]
    rule.load_state_dict(state)


def sync_rounds(session, steps=6):
    rank, size = session.rank, session.size
    train, w, b = build_model()
    workers, center = [INITIAL.copy() for _ in range(size)], INITIAL.copy()
    for step in range(1, steps + 1):
        x, y = batch(step, size)
        train(x, y)
        workers = [xr - LR * gradient(xr, *rows_of(r, x, y)) for r, xr in enumerate(workers)]
        if step % TAU == 0:
            forces = [ALPHA * (xr - center) for xr in workers]
            workers = [xr - f for xr, f in zip(workers, forces)]
            center = center + sum(forces)
        check(flat(w, b), workers[rank], "rank %d parameters after step %d" % (rank, step))
        if rank == 0:
            check(session.rule.state_dict()["center"][train.model.name][0], center[:3],
                  "the center's w after step %d" % step)
        if step == 2:
            restore_with_center_moved(session.rule)
            center = center + 0.5
    session.finish()
    check(flat(w, b), center, "rank %d final parameters (the center)" % rank)


def async_rounds(session, steps=5):
    rank, size = session.rank, session.size
    rule, exchanger = session.rule, session.exchanger
    train, w, b = build_model()
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
        check(flat(w, b), workers[rank], "rank %d parameters after step %d" % (rank, step))
        if rank == 0:
            check(np.append(*rule.state_dict()["center"][model.name]), center,
                  "the center after step %d" % step)
        if step == 2:
            restore_with_center_moved(session.rule)
            center = center + 0.5
    session.finish()
    check(flat(w, b), center, "rank %d final parameters (the center)" % rank)


def uneven(session):
    from mpi4py import MPI
    rank, size = session.rank, session.size
    train, w, b = build_model()
    steps = 3 + 3 * rank
    for step in range(1, steps + 1):
        train(*batch(step, size))
    session.finish()
    comm = MPI.COMM_WORLD
    final = flat(w, b)
    finals = comm.allgather(final)
    for r, other in enumerate(finals):
        check(other, finals[0], "rank %d's final model against rank 0's" % r, rtol=0)
    counts = comm.allgather(session.rule.exchanges_done)
    # rank 0 counts its own exchanges (3 steps) and every push it answered
    assert counts[0] == 3 // TAU + sum(counts[1:]), counts
    assert all(c > 0 for c in counts), counts
    x, y = batch(0, size)
    assert loss(final, x, y) < loss(INITIAL, x, y), (loss(final, x, y), loss(INITIAL, x, y))


def main(mode):
    options = Options(rule="easgd", seed=7, stall_timeout=300, summary=False,
                      rule_options={"alpha": str(ALPHA), "tau": str(TAU),
                                    "mode": "sync" if mode == "sync" else "async"})
    session = Session(options).start()
    try:
        {"sync": sync_rounds, "async": async_rounds, "uneven": uneven}[mode](session)
    except BaseException as error:
        # One failing rank must end the whole job, not leave the others waiting.
        print("rank %d: %s: %s" % (session.rank, type(error).__name__, error), flush=True)
        from mpi4py import MPI
        MPI.COMM_WORLD.Abort(1)
        os._exit(1)
    if session.rank == 0:
        print("easgd %s OK on %d ranks" % (mode, session.size), flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
