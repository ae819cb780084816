"""A Theano-MPI style DataClass: digits, sharded [rank::size]."""
import numpy as np
from sklearn.datasets import load_digits


class Digits(object):

    def __init__(self, batch_size, rank=0, size=1, dtype="float32"):
        digits = load_digits()
        x = (digits.data / 16.0).astype(dtype)
        y = digits.target.astype("int32")
        order = np.random.RandomState(1234).permutation(len(x))
        x, y = x[order], y[order]
        self.batch_size = batch_size
        self.train_x, self.train_y = x[:1500][rank::size], y[:1500][rank::size]
        self.val_x, self.val_y = x[1500:][rank::size], y[1500:][rank::size]
        self.n_batch_train = len(self.train_x) // batch_size
        self.n_batch_val = int(np.ceil(len(self.val_x) / float(batch_size)))

    def train_batch(self, i):
        s = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.train_x[s], self.train_y[s]

    def val_batch(self, i):
        s = slice(i * self.batch_size, (i + 1) * self.batch_size)
        return self.val_x[s], self.val_y[s]
