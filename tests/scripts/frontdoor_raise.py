"""A decorated entry point that fails on every rank, started by a bare ``mpiexec``."""
import numpy as np

import tmpi_adapters as tmpi


@tmpi.distributed(framework="theano")
def main():
    import theano
    import theano.tensor as T
    W = theano.shared(np.zeros(3), name="W")
    x = T.dmatrix("x")
    loss = T.sqr(T.dot(x, W) - 1).mean()
    train = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))])
    train(np.ones((4, 3)))
    raise ValueError("the same failure on every rank")


if __name__ == "__main__":
    main()
