"""An MLP written to Theano-MPI's ModelClass contract."""
import numpy as np
import theano
import theano.tensor as T

from models.data.digits import Digits


class MLP(object):

    def __init__(self, config):
        self.verbose = config["verbose"]
        self.rank = config["rank"]
        self.size = config["size"]
        self.n_epochs = 6
        dtype = theano.config.floatX
        self.data = Digits(batch_size=32, rank=self.rank, size=self.size, dtype=dtype)
        rng = np.random.RandomState(7 + self.rank)   # ranks differ until tmpi syncs them
        self.w1 = theano.shared(rng.normal(0, 0.1, (64, 64)).astype(dtype), name="w1")
        self.b1 = theano.shared(np.zeros(64, dtype=dtype), name="b1")
        self.w2 = theano.shared(rng.normal(0, 0.1, (64, 10)).astype(dtype), name="w2")
        self.b2 = theano.shared(np.zeros(10, dtype=dtype), name="b2")
        self.params = [self.w1, self.b1, self.w2, self.b2]
        self.shared_lr = theano.shared(np.asarray(0.1, dtype=dtype), name="lr")

    def compile_iter_fns(self, sync_type="cdd"):
        x, y = T.matrix("x"), T.ivector("y")
        h = T.tanh(T.dot(x, self.w1) + self.b1)
        p = T.nnet.softmax(T.dot(h, self.w2) + self.b2)
        cost = T.nnet.categorical_crossentropy(p, y).mean()
        error = T.mean(T.neq(T.argmax(p, axis=1), y))
        updates = []
        for param, grad in zip(self.params, T.grad(cost, self.params)):
            velocity = theano.shared(param.get_value() * 0.0)
            updates.append((velocity, 0.9 * velocity - self.shared_lr * grad))
            updates.append((param, param + 0.9 * velocity - self.shared_lr * grad))
        self.train_fn = theano.function([x, y], [cost, error], updates=updates)
        self.val_fn = theano.function([x, y], [cost, error])

    def train_iter(self, count, recorder):
        recorder.start()
        cost, error = self.train_fn(*self.data.train_batch(count))
        recorder.train_error(count, cost, error)
        recorder.end("calc")

    def val_iter(self, count, recorder):
        cost, error = self.val_fn(*self.data.val_batch(count))
        recorder.val_error(count, cost, error, None)

    def adjust_hyperp(self, epoch):
        if epoch == 3:
            self.shared_lr.set_value(self.shared_lr.get_value() * 0.5)

    def cleanup(self):
        pass
