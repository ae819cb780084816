"""Training steps whose rows meet, generated: every common way a step ties rows together.

    python batch_coupling.py BATCH [CASE ...]

Each case is a small model on float64 batches of ``BATCH`` rows (the third
batch a short one of ``BATCH - 3``) whose loss, or whose updates, combine the
rows of a batch in one way: a reduction over the rows other than a mean
(a sum, a maximum, a root mean square, a constant batch size), a batch
statistic (centring, batch normalisation and its running averages), rows
picked by index (the first row, halves, pairs, neighbours), products over the
rows (Gram matrices, decorrelation), a softmax or a sort across the batch, a
random permutation of the rows, a scan over the rows, values as long as the batch that are not split (per-row
weights in a shared variable or a constant, class weights that happen to be
as long as the batch), and values the updates read (a learning rate from the
loss, a gated step, a counter of rows).  The cases cycle through SGD,
momentum and Adam written in plain Theano.

Each prints ``final <case> <losses> <checksum of the parameters and state>``,
or ``error <case> <message>`` where compiling or a step raised.  N ranks must
print the one-process numbers, or stop the case with a clear error.
"""
import sys

import numpy as np
import theano
import theano.tensor as T
from theano.ifelse import ifelse

B = int(sys.argv[1])
H = B // 2
SIZES = (B, B, B - 3)
F, D, C = 5, 6, 3
floatX = theano.config.floatX


def shared(rng, *shape, scale=0.3, name="W"):
    return theano.shared((scale * rng.standard_normal(shape)).astype(floatX), name=name)


class Net:
    """``x`` (rows, F) -> ``h`` (rows, D) -> scores (rows, C), labels ``y``."""

    def __init__(self, seed, classes=C):
        self.rng = np.random.RandomState(seed)
        self.x, self.y = T.matrix("x"), T.ivector("y")
        self.W1 = shared(self.rng, F, D, name="W1")
        self.b1 = shared(self.rng, D, scale=0.1, name="b1")
        self.W2 = shared(self.rng, D, classes, name="W2")
        self.params = [self.W1, self.b1, self.W2]
        self.h = T.tanh(T.dot(self.x, self.W1) + self.b1)
        self.scores = T.dot(self.h, self.W2)
        self.p = T.nnet.softmax(self.scores)
        self.nll = -T.log(self.p)[T.arange(self.y.shape[0]), self.y]
        self.classes = classes
        self.state = []      # shared variables the updates change besides the parameters
        self.extra = []      # their updates

    def batches(self, *extra):
        xs = [self.rng.standard_normal((n, F)).astype(floatX) for n in SIZES]
        ys = [self.rng.randint(0, self.classes, n).astype("int32") for n in SIZES]
        return [self.x, self.y] + list(extra), [[x, y] for x, y in zip(xs, ys)]


# -- the cases: (inputs, loss, net[, batches]) ------------------------------------------

def case_mean(n):
    return n.nll.mean()


def case_sum(n):
    return n.nll.sum()


def case_constant_batch_size(n):
    return T.sum(n.nll) / B


def case_times_inverse_batch(n):
    return T.sum(n.nll) * (1.0 / B)


def case_max_row(n):
    return n.nll.max() + 0.1 * n.nll.mean()


def case_min_row(n):
    return n.nll.mean() - 0.2 * n.nll.min()


def case_root_mean_square(n):
    return T.sqrt(T.mean(n.nll ** 2))


def case_centred(n):
    centred = n.h - n.h.mean(axis=0)
    return n.nll.mean() + 0.1 * T.mean(centred ** 2)


def case_batch_norm(n):
    mu, var = n.h.mean(axis=0), n.h.var(axis=0)
    running_mean = theano.shared(np.zeros(D, dtype=floatX), name="running_mean")
    running_var = theano.shared(np.ones(D, dtype=floatX), name="running_var")
    n.state += [running_mean, running_var]
    n.extra += [(running_mean, 0.9 * running_mean + 0.1 * mu),
                (running_var, 0.9 * running_var + 0.1 * var * B / (B - 1.0))]
    normed = (n.h - mu) / T.sqrt(var + 1e-5)
    p = T.nnet.softmax(T.dot(normed, n.W2))
    return T.nnet.categorical_crossentropy(p, n.y).mean()


def case_softmax_over_batch(n):
    weights = T.nnet.softmax(n.scores[:, 0].dimshuffle("x", 0))[0]
    return T.sum(weights * n.nll)


def case_logsumexp_over_batch(n):
    top = T.max(n.nll)
    return top + T.log(T.sum(T.exp(n.nll - top)))


def case_penalty_over_rows(n):
    return n.nll.mean() + 0.5 * T.sum(n.W1 ** 2) / n.x.shape[0]


def case_masked_mean(n):
    mask = T.cast(n.y > 0, floatX)
    return T.sum(mask * n.nll) / (T.sum(mask) + 1.0)


def case_decorrelation(n):
    cov = T.dot(n.h.T, n.h) / n.x.shape[0]
    return n.nll.mean() + 0.01 * T.sum((cov - T.eye(D)) ** 2)


def case_gram(n):
    gram = T.dot(n.h, n.h.T)
    return n.nll.mean() + 0.01 * T.mean(gram ** 2)


def case_first_row(n):
    return n.nll.mean() + T.sum((n.h - n.h[0]) ** 2) / B


def case_pairs_by_reshape(n):
    even = 2 * (n.h.shape[0] // 2)
    paired = n.h[:even].reshape((2, -1, D))          # row i with row i + half
    return n.nll.mean() + T.mean((paired[0] - paired[1]) ** 2)


def case_pairs_by_stride(n):
    even = 2 * (n.h.shape[0] // 2)
    return n.nll.mean() + T.mean((n.h[0:even:2] - n.h[1:even:2]) ** 2)


def case_pairs_by_constant_reshape(n):
    even = 2 * (n.h.shape[0] // 2)
    paired = n.h[:even].reshape((-1, 2, D))          # rows 2i and 2i + 1
    return n.nll.mean() + T.mean((paired[:, 0] - paired[:, 1]) ** 2)


def case_neighbours(n):
    return n.nll.mean() + T.mean((n.h[1:] - n.h[:-1]) ** 2)


def case_halves(n):
    real, fake = n.scores[:H, 0], n.scores[H:, 0]
    return T.mean(T.nnet.softplus(-real)) + T.mean(T.nnet.softplus(fake))


def case_sorted(n):
    return T.mean(T.sort(n.nll)[:H])


def case_cumulative(n):
    return T.mean(T.cumsum(n.nll)) / B


def case_argmax_row(n):
    worst = T.argmax(n.nll)
    return n.nll.mean() + T.sum(n.h[worst] ** 2)


def case_scan_over_rows(n):
    running, _ = theano.scan(lambda row, acc: 0.5 * acc + row, sequences=n.nll,
                             outputs_info=T.constant(0.0, dtype=floatX))
    return running[-1]


def case_whole_matrix_mean(n):
    return T.mean(n.p * n.scores) + n.nll.mean()


def case_per_row_norm(n):
    # Per row only: no coupling (a control).
    normed = n.h / T.sqrt(T.sum(n.h ** 2, axis=1, keepdims=True) + 1e-3)
    return T.nnet.categorical_crossentropy(T.nnet.softmax(T.dot(normed, n.W2)), n.y).mean()


def case_row_weights_shared(n):
    weights = theano.shared(np.linspace(0.5, 1.5, B).astype(floatX), name="row_weights")
    return T.sum(weights[:n.x.shape[0]] * n.nll) / B


def case_row_weights_constant(n):
    return T.mean(np.linspace(0.5, 1.5, B)[:B - 3].astype(floatX) * n.nll[:B - 3])


def case_dataset_normalisation(n):
    total = 10.0 * B
    return T.sum(n.nll) * (total / B) / total + 0.5 * T.sum(n.W1 ** 2) / total


def case_per_class_mean(n):
    one_hot = T.extra_ops.to_one_hot(n.y, C)
    centres = T.dot(one_hot.T, n.h) / (T.sum(one_hot, axis=0)[:, None] + 1.0)
    return n.nll.mean() + 0.1 * T.mean((n.h - T.dot(one_hot, centres)) ** 2)


def case_max_over_rows_per_feature(n):
    top = T.max(n.h, axis=0)
    return n.nll.mean() + 0.1 * T.sum((n.h - top) ** 2) / B


def case_product_over_rows(n):
    return n.nll.mean() - 0.1 * T.prod(T.nnet.sigmoid(n.scores[:, 0]))


def case_log_softmax_over_batch(n):
    return -T.mean(T.nnet.logsoftmax(n.scores.T)[:, 0])


def case_permuted_rows(n):
    from theano.tensor.shared_randomstreams import RandomStreams
    order = RandomStreams(7).permutation(n=n.x.shape[0])   # drawn for the batch's rows
    return n.nll.mean() + 0.1 * T.mean((n.h - n.h[order]) ** 2)


def case_loss_gated(n):
    return ifelse(T.gt(n.nll.mean(), 0.9), n.nll.mean(), 0.5 * n.nll.mean())


def case_gradient_reversal(n):
    from theano.compile.ops import ViewOp

    class Reverse(ViewOp):          # an identity whose gradient is turned round
        def grad(self, inputs, output_grads):
            return [-0.5 * output_grads[0]]

    return n.nll.mean() + 0.1 * T.mean(T.max(Reverse()(n.h), axis=0) ** 2)


def case_reshape_to_a_whole_length(n):
    whole = n.h[::-1]                # gathered: its length is the whole batch's
    pairs = T.reshape(n.h, (whole.shape[0] * 2, D // 2))
    return n.nll.mean() + 0.1 * T.mean(T.sum(pairs ** 2, axis=1))


CASES = {name[len("case_"):]: f for name, f in sorted(globals().items())
         if name.startswith("case_")}


def class_weights_case(seed):
    """A class-weight vector as long as the batch (``B`` classes): not rows."""
    n = Net(seed, classes=B)
    weights = T.vector("class_weights")
    loss = T.sum(weights[n.y] * n.nll) / T.sum(weights[n.y])
    inputs, batches = n.batches()
    table = np.linspace(1.0, 2.0, B).astype(floatX)
    return n, inputs + [weights], loss, [b + [table] for b in batches], None


def joined_halves_case(seed):
    """``[real; fake]`` joined from two inputs of the batch's rows, split again."""
    n = Net(seed)
    fake = T.matrix("fake")
    both = T.concatenate([n.x, T.tanh(fake)], axis=0)
    scores = T.dot(T.tanh(T.dot(both, n.W1) + n.b1), n.W2)[:, 0]
    half = n.x.shape[0]
    loss = T.mean(T.nnet.softplus(-scores[:half])) + T.mean(T.nnet.softplus(scores[half:]))
    inputs, batches = n.batches()
    fakes = [n.rng.standard_normal((size, F)).astype(floatX) for size in SIZES]
    return n, inputs + [fake], loss, [b + [f] for b, f in zip(batches, fakes)], None


#: Inputs beside the batch whose length is not the batch's (or is, by chance):
#: ``case -> (rows of the extra input, how the step reads it)``.
OTHER_LENGTHS = {"reference_mean_7": (7, "reference"), "reference_mean_8": (8, "reference"),
                 "reference_as_long_as_batch": (B, "reference"),
                 "class_embeddings_3": (C, "embeddings"), "support_set_9": (9, "prototypes"),
                 "negatives_16": (16, "negatives")}


def other_length_case(seed, name):
    """An input that does not carry the batch: a fixed reference batch whose
    statistics normalise the rows (virtual batch normalisation), class
    embeddings the scores are read from, a support set of 3 rows per class
    whose class means are prototypes, a pool of negatives every row is
    contrasted with.  It is whole on every rank, whatever its length."""
    rows, use = OTHER_LENGTHS[name]
    n = Net(seed)
    extra = T.matrix("extra")
    inputs, batches = n.batches()
    if use == "reference":
        hr = T.tanh(T.dot(extra, n.W1) + n.b1)
        h = (n.h - hr.mean(axis=0)) / T.sqrt(hr.var(axis=0) + 1e-3)
        p = T.nnet.softmax(T.dot(h, n.W2))
        loss = -T.log(p)[T.arange(n.y.shape[0]), n.y].mean()
        data = n.rng.standard_normal((rows, F))
    elif use == "embeddings":
        p = T.nnet.softmax(n.scores + T.dot(n.h, T.dot(extra, n.W1).T))
        loss = -T.log(p)[T.arange(n.y.shape[0]), n.y].mean()
        data = n.rng.standard_normal((rows, F))
    elif use == "prototypes":
        support = T.tanh(T.dot(extra, n.W1) + n.b1).reshape((C, rows // C, D)).mean(axis=1)
        distances = ((n.h.dimshuffle(0, "x", 1) - support.dimshuffle("x", 0, 1)) ** 2).sum(2)
        p = T.nnet.softmax(n.scores - distances)
        loss = -T.log(p)[T.arange(n.y.shape[0]), n.y].mean()
        data = n.rng.standard_normal((rows, F))
    else:
        negatives = T.tanh(T.dot(extra, n.W1) + n.b1)
        positive = (n.h * T.dot(n.h, n.W2).dot(n.W2.T)).sum(1)
        against = T.dot(n.h, negatives.T)
        top = T.maximum(against.max(axis=1), positive)
        loss = T.mean(top + T.log(T.exp(against - top.dimshuffle(0, "x")).sum(1)
                                   + T.exp(positive - top)) - positive)
        data = n.rng.standard_normal((rows, F))
    data = data.astype(floatX)
    return n, inputs + [extra], loss, [b + [data] for b in batches], None


def read_by_updates_case(seed, kind):
    """The loss or the batch's rows read by the updates."""
    n = Net(seed)
    loss = n.nll.mean()
    inputs, batches = n.batches()
    if kind == "adaptive_rate":
        rate = 0.2 / (1.0 + loss)
    elif kind == "gated_step":
        rate = T.switch(T.gt(loss, 1.0), 0.3, 0.05)
    else:
        seen = theano.shared(np.float64(0).astype(floatX), name="rows_seen")
        n.state.append(seen)
        n.extra.append((seen, seen + T.cast(n.x.shape[0], floatX)))
        rate = 0.3 / (1.0 + 0.01 * seen)
    return n, inputs, loss, batches, rate


def build(name, seed):
    if name == "class_weights":
        return class_weights_case(seed)
    if name == "joined_halves":
        return joined_halves_case(seed)
    if name in OTHER_LENGTHS:
        return other_length_case(seed, name)
    if name in ("adaptive_rate", "gated_step", "row_counter"):
        return read_by_updates_case(seed, name)
    n = Net(seed)
    loss = CASES[name](n)
    inputs, batches = n.batches()
    return n, inputs, loss, batches, None


def optimizer(kind, loss, params, rate):
    grads = T.grad(loss, params)
    rate = 0.2 if rate is None else rate
    if kind == "sgd":
        return [(p, p - rate * g) for p, g in zip(params, grads)], []
    if kind == "momentum":
        velocities = [theano.shared(np.zeros_like(p.get_value()), name="v") for p in params]
        updates = []
        for p, g, v in zip(params, grads, velocities):
            new = 0.9 * v - rate * g
            updates += [(v, new), (p, p + new)]
        return updates, velocities
    step = theano.shared(np.float64(0).astype(floatX), name="t")
    ms = [theano.shared(np.zeros_like(p.get_value()), name="m") for p in params]
    vs = [theano.shared(np.zeros_like(p.get_value()), name="v") for p in params]
    t = step + 1
    updates = [(step, t)]
    for p, g, m, v in zip(params, grads, ms, vs):
        m_new, v_new = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g ** 2
        scale = 0.05 * T.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
        updates += [(m, m_new), (v, v_new), (p, p - scale * m_new / (T.sqrt(v_new) + 1e-8))]
    return updates, [step] + ms + vs


NAMES = sorted(list(CASES) + list(OTHER_LENGTHS) +
               ["class_weights", "joined_halves", "adaptive_rate", "gated_step", "row_counter"])


def run(name, seed):
    kind = ("sgd", "momentum", "adam")[seed % 3]
    try:
        n, inputs, loss, batches, rate = build(name, seed)
        updates, state = optimizer(kind, loss, n.params, rate)
        train = theano.function(inputs, loss, updates=updates + n.extra,
                                on_unused_input="ignore")
        losses = [float(train(*batch)) for batch in batches for _ in range(2)]
    except Exception as error:  # noqa: BLE001 - the error is the case's result
        print("error %s %s" % (name, str(error).splitlines()[0] if str(error) else
                               type(error).__name__))
        return
    values = n.params + n.state + state
    checksum = sum(float(np.abs(v.get_value()).sum()) for v in values)
    print("final %s %s %.17g" % (name, " ".join("%.17g" % v for v in losses), checksum))


if __name__ == "__main__":
    for name in sys.argv[2:] or NAMES:
        run(name, NAMES.index(name))
    sys.stdout.flush()
