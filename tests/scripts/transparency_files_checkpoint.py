"""A plain Theano script that writes and reads back its own files, the way
tutorial scripts do: the best model pickled to a fixed path (the file left for
the garbage collector to close) and loaded right back, an output folder made
after checking for it, a checkpoint written to a temporary name and renamed,
``numpy.save``, a log appended to every epoch, a per-process temporary
file (``tempfile``) and a file named after the process's rank written and
read back, a file that cannot be opened, and files only the process of rank
0 writes (a flag and ``numpy.savez``, as scripts that write "on the master"
do) while the others go on training.

    python transparency_files_checkpoint.py OUT_DIR [--epochs N]
"""
import argparse
import os
import pickle
import tempfile

import numpy as np
import theano
import theano.tensor as T

parser = argparse.ArgumentParser()
parser.add_argument("out")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()
#: MPI launchers tell each process its rank in one of these (one process: 0).
rank = next((int(os.environ[name]) for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
             if name in os.environ), 0)

rng = np.random.RandomState(0)
data_x = rng.rand(40, 5).astype(theano.config.floatX)
data_y = (data_x.sum(axis=1) > 2.5).astype("int32")
W = theano.shared(np.zeros((5, 2), dtype=theano.config.floatX), name="W")
b = theano.shared(np.zeros(2, dtype=theano.config.floatX), name="b")
x, y = T.matrix("x"), T.ivector("y")
p_y = T.nnet.softmax(T.dot(x, W) + b)
cost = -T.mean(T.log(p_y)[T.arange(y.shape[0]), y])
train = theano.function([x, y], cost, updates=[(p, p - 0.5 * T.grad(cost, p)) for p in (W, b)])

if not os.path.isdir(args.out):
    os.makedirs(args.out)
os.chdir(args.out)
checks = []
for epoch in range(args.epochs):
    if rank == 0:   # the others do not wait for these
        with open("master.txt", "w") as flag:
            flag.write("epoch %d\n" % epoch)
        np.savez("master.npz", W=W.get_value())
    costs = [float(train(data_x[i:i + 10], data_y[i:i + 10])) for i in range(0, 40, 10)]
    params = [W.get_value(), b.get_value()]
    # The tutorials' way: the file object is closed when it is garbage.
    pickle.dump(params, open("best_model.pkl", "wb"))
    loaded = pickle.load(open("best_model.pkl", "rb"))
    checks.append(all(np.array_equal(a, c) for a, c in zip(loaded, params)))
    # A checkpoint written whole under a temporary name, then renamed.
    with open("checkpoint.tmp", "wb") as handle:
        pickle.dump({"epoch": epoch, "params": params}, handle)
    os.replace("checkpoint.tmp", "checkpoint.pkl")
    with open("checkpoint.pkl", "rb") as handle:
        checks.append(pickle.load(handle)["epoch"] == epoch)
    np.save("W.npy", params[0])
    checks.append(np.array_equal(np.load("W.npy"), params[0]))
    # A file of this process's own.
    descriptor, own = tempfile.mkstemp(suffix=".pkl")
    os.close(descriptor)
    with open(own, "wb") as handle:
        pickle.dump(params, handle)
    with open(own, "rb") as handle:
        checks.append(all(np.array_equal(a, c) for a, c in zip(pickle.load(handle), params)))
    os.remove(own)
    mine = "rank%d.txt" % rank   # a path of this rank's own
    with open(mine, "w") as handle:
        handle.write("rank %d epoch %d\n" % (rank, epoch))
    with open(mine) as handle:
        checks.append(handle.read() == "rank %d epoch %d\n" % (rank, epoch))
    os.remove(mine)
    with open("log.txt", "a") as log:
        log.write("epoch %d cost %.10f\n" % (epoch, np.mean(costs)))
    try:    # the writer's error is every rank's
        open(os.path.join("no-such-folder", "notes.txt"), "w")
    except FileNotFoundError:
        checks.append(True)
with open("log.txt") as log:
    lines = log.read().splitlines()
print("final cost %.17g" % np.mean(costs))
print("final params %.17g %.17g" % (np.abs(W.get_value()).sum(), np.abs(b.get_value()).sum()))
if rank == 0:
    with open("master.txt") as flag:
        checks.append(flag.read() == "epoch %d\n" % (args.epochs - 1))
    with np.load("master.npz") as saved:
        checks.append(saved["W"].shape == (5, 2))
print("final files read back %s, log lines %d" % (all(checks), len(lines)))
