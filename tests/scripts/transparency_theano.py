"""Plain-Theano patterns that must give the one-process numbers on N ranks.

    python transparency_theano.py

``scan``   a recurrent net over time-major ``(time, batch, features)`` data
           (``theano.scan`` iterates over axis 0; the examples are on axis 1),
           its cost a mean over the batch; batches of 7 and a short last one;
``eval``   a function without updates returning a mean, a sum, an integer count,
           a maximum, per-row predictions, a parameter's norm, and a function
           whose value mixes rows (normalised by the batch's own mean);
``short``  an MLP trained on batches of 2, 7, 0 (empty), 1 and 5 rows: fewer rows
           than ranks on the first call, an empty batch later.

Each part prints ``final <key> ...`` lines (17 significant digits) and the
class each evaluation function became (``kind <name> <class>``).
"""
import numpy as np
import theano
import theano.tensor as T

floatX = theano.config.floatX


def shared(rng, *shape, name=None, scale=0.3):
    return theano.shared((scale * rng.standard_normal(shape)).astype(floatX), name=name)


def norms(params):
    return " ".join("%.17g" % np.linalg.norm(p.get_value()) for p in params)


def sgd(cost, params, lr):
    return [(p, p - lr * g) for p, g in zip(params, T.grad(cost, params))]


def scan_part(rng):
    steps, features, hidden, classes = 5, 3, 4, 3
    data = rng.standard_normal((steps, 20, features)).astype(floatX)
    labels = rng.randint(0, classes, 20).astype("int32")
    x = T.tensor3("x")   # (time, batch, features)
    y = T.ivector("y")
    W_in = shared(rng, features, hidden, name="W_in")
    W_rec = shared(rng, hidden, hidden, name="W_rec")
    W_out = shared(rng, hidden, classes, name="W_out")
    params = [W_in, W_rec, W_out]

    def step(x_t, h):
        return T.tanh(T.dot(x_t, W_in) + T.dot(h, W_rec))
    states, _ = theano.scan(step, sequences=x, outputs_info=T.zeros((x.shape[1], hidden)))
    probs = T.nnet.softmax(T.dot(states[-1], W_out))
    cost = T.nnet.categorical_crossentropy(probs, y).mean()
    train = theano.function([x, y], cost, updates=sgd(cost, params, 0.5), name="scan_train")
    costs = []
    for epoch in range(3):
        for lo in range(0, 20, 7):   # 7, 7, 6 sequences
            costs.append(train(data[:, lo:lo + 7], labels[lo:lo + 7]))
    print("final scan_cost %.17g %.17g" % (costs[0], costs[-1]))
    print("final scan_norms %s" % norms(params))


def mlp(rng, x, features=6, hidden=5, classes=4):
    W1, b1 = shared(rng, features, hidden, name="W1"), shared(rng, hidden, name="b1")
    W2, b2 = shared(rng, hidden, classes, name="W2"), shared(rng, classes, name="b2")
    probs = T.nnet.softmax(T.dot(T.tanh(T.dot(x, W1) + b1), W2) + b2)
    return probs, [W1, b1, W2, b2]


def eval_part(rng):
    x, y = T.matrix("x"), T.ivector("y")
    probs, params = mlp(rng, x)
    cost = T.nnet.categorical_crossentropy(probs, y).mean()
    predict = T.argmax(probs, axis=1)
    evaluate = theano.function([x, y], [
        cost,                               # a mean over rows
        T.sum(T.neq(predict, y)),           # an integer count (a sum)
        (probs ** 2).sum(),                 # a float sum
        probs.max(),                        # a maximum over rows
        -T.log(probs).min(),                # minus a minimum
        predict,                            # one value per row
        T.sqrt((params[0] ** 2).sum()),     # not from the batch
        x.shape[0],                         # the batch's rows
    ], name="evaluate")
    mixed = theano.function([x], (x - x.mean(axis=0)).max(), name="mixed")
    data = rng.standard_normal((29, 6)).astype(floatX)
    labels = rng.randint(0, 4, 29).astype("int32")
    for name, function in (("evaluate", evaluate), ("mixed", mixed)):
        print("kind %s %s" % (name, type(function).__name__))
    cost_v, errors, squares, top, bottom, predictions, norm, rows = evaluate(data, labels)
    assert np.asarray(errors).dtype.kind == "i", errors
    print("final values %.17g %.1f %.17g %.17g %.17g %.17g %.1f" % (
        cost_v, errors, squares, top, bottom, norm, rows))
    print("final predictions %d %s" % (len(predictions), "".join(map(str, predictions))))
    print("final two_rows %.17g" % evaluate(data[:2], labels[:2])[0])
    print("final mixed %.17g" % mixed(data))


def short_part(rng):
    x, y = T.matrix("x"), T.ivector("y")
    probs, params = mlp(rng, x)
    cost = T.nnet.categorical_crossentropy(probs, y).mean()
    velocity = [theano.shared(np.zeros_like(p.get_value())) for p in params]
    updates = []
    for p, v, g in zip(params, velocity, T.grad(cost, params)):
        updates += [(v, 0.9 * v - 0.1 * g), (p, p + 0.9 * v - 0.1 * g)]
    train = theano.function([x, y], cost, updates=updates, name="short_train")
    data = rng.standard_normal((15, 6)).astype(floatX)
    labels = rng.randint(0, 4, 15).astype("int32")
    costs, lo = [], 0
    for rows in (2, 7, 0, 1, 5):
        costs.append(float(train(data[lo:lo + rows], labels[lo:lo + rows])))
        lo += rows
    print("final short_cost %s" % " ".join("%.17g" % c for c in costs if np.isfinite(c)))
    print("final empty_batches %.1f" % sum(not np.isfinite(c) for c in costs))
    print("final short_norms %s" % norms(params))


if __name__ == "__main__":
    rng = np.random.RandomState(3)
    scan_part(rng)
    eval_part(rng)
    short_part(rng)
