"""A decorated script that sets a rule, its options, a seed and a record file."""
import numpy as np

import tmpi_adapters as tmpi


@tmpi.distributed(framework="theano", rule="easgd", rule_options={"tau": 2}, seed=5,
                  record="deco.jsonl")
def main():
    import theano
    import theano.tensor as T
    x = T.matrix("x")
    W = theano.shared(np.zeros((3, 2)), name="W")
    loss = T.sqr(T.dot(x, W) - 1).mean()
    step = theano.function([x], loss, updates=[(W, W - 0.1 * T.grad(loss, W))], name="train")
    for i in range(6):
        last = step(np.random.uniform(size=(8, 3)))  # the seed decides these batches
    print("final loss %.17g" % last)


if __name__ == "__main__":
    main()
