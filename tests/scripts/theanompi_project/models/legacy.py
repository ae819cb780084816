"""The early Theano-MPI contract: no config, iteration methods without arguments."""
import numpy as np
import theano
import theano.tensor as T

from models.data.digits import Digits


class LegacyLogReg(object):

    def __init__(self):
        self.n_epochs = 3
        self.data = Digits(batch_size=50, dtype=theano.config.floatX)
        self.W = theano.shared(np.zeros((64, 10), dtype=theano.config.floatX), name="W")
        self.b = theano.shared(np.zeros(10, dtype=theano.config.floatX), name="b")
        self.params = [self.W, self.b]
        self.train_t = self.val_t = 0

    def compile_iter_fns(self):
        x, y = T.matrix(), T.ivector()
        p = T.nnet.softmax(T.dot(x, self.W) + self.b)
        cost = T.nnet.categorical_crossentropy(p, y).mean()
        error = T.mean(T.neq(T.argmax(p, axis=1), y))
        gW, gb = T.grad(cost, [self.W, self.b])
        self.train_fn = theano.function([x, y], [cost, error],
                                        updates=[(self.W, self.W - 0.5 * gW),
                                                 (self.b, self.b - 0.5 * gb)])
        self.val_fn = theano.function([x, y], [cost, error])

    def train_iter(self):
        result = self.train_fn(*self.data.train_batch(self.train_t))
        self.train_t = (self.train_t + 1) % self.data.n_batch_train
        return result

    def val_iter(self):
        result = self.val_fn(*self.data.val_batch(self.val_t))
        self.val_t = (self.val_t + 1) % self.data.n_batch_val
        return result

    def adjust_hyperp(self, epoch):
        pass

    def cleanup(self):
        pass
