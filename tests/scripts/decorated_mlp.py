"""The plain Theano MLP with tmpi's decorator: two added lines."""
import sys

import numpy as np

import tmpi_adapters as tmpi


@tmpi.distributed(framework="theano", rule="bsp", seed=11)
def main(epochs=3, batch_size=40):
    from theano import function   # imported before the session hooks theano: rebound
    import theano
    import theano.tensor as T
    from sklearn.datasets import load_digits
    digits = load_digits()
    xs = (digits.data / 16.0).astype(theano.config.floatX)
    ys = digits.target.astype("int32")
    rng = np.random.RandomState(0)
    x, y = T.matrix(), T.ivector()
    W = theano.shared(rng.normal(0, 0.1, (64, 10)).astype(theano.config.floatX), name="W")
    b = theano.shared(np.zeros(10, dtype=theano.config.floatX), name="b")
    p = T.nnet.softmax(T.dot(x, W) + b)
    loss = T.nnet.categorical_crossentropy(p, y).mean()
    gW, gb = theano.grad(loss, [W, b])
    train = function([x, y], loss, updates=[(W, W - 0.2 * gW), (b, b - 0.2 * gb)])
    for epoch in range(epochs):
        order = np.random.permutation(len(xs))
        for i in range(0, len(xs), batch_size):
            idx = order[i:i + batch_size]
            last = train(xs[idx], ys[idx])
    print("final loss %.17g" % last)
    print("final norms %.17g %.17g" % (np.linalg.norm(W.get_value()), np.linalg.norm(b.get_value())))
    return last


if __name__ == "__main__":
    main(epochs=int(sys.argv[1]) if len(sys.argv) > 1 else 3)
