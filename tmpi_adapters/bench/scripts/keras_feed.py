"""A Keras 2 conv net trained for a number of steps, from memory (``fit``) or from a
generator (``fit_generator`` on a ``keras.utils.Sequence``, one worker thread).

    python keras_feed.py --feed memory|generator [--steps 40] [--batch-size 128]

The conv net is the benchmark's (two 3x3 convolutions with pooling, a 256-wide
dense layer; 32x32 RGB images, channels first), on generated data.  Under
``tmpi wrap -n N`` the generator-fed run has rank 0 draw every batch and hand
it to every rank; the in-memory one has every rank slice its own copy.
"""
import argparse

import numpy as np
from keras import backend as K
from keras.layers import Conv2D, Dense, Flatten, MaxPooling2D
from keras.models import Sequential
from keras.utils import Sequence

# Generated data: a fixed random pattern per class plus noise (no downloads).
from tmpi_adapters.bench.models import generated_data


class Batches(Sequence):
    """The arrays' rows in order, ``batch_size`` at a time: a generator that keeps up."""

    def __init__(self, x, y, batch_size):
        self.x, self.y, self.batch_size = x, y, batch_size

    def __len__(self):
        return -(-len(self.x) // self.batch_size)

    def __getitem__(self, index):
        rows = slice(index * self.batch_size, (index + 1) * self.batch_size)
        return self.x[rows], self.y[rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--feed", choices=("memory", "generator"), required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    K.set_image_data_format("channels_first")
    np.random.seed(1)
    x, y = generated_data(args.steps * args.batch_size, (3, 32, 32))
    model = Sequential([
        Conv2D(32, (3, 3), padding="same", activation="relu", input_shape=(3, 32, 32)),
        MaxPooling2D(),
        Conv2D(64, (3, 3), padding="same", activation="relu"),
        MaxPooling2D(),
        Flatten(),
        Dense(256, activation="relu"),
        Dense(10, activation="softmax"),
    ])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    if args.feed == "memory":
        model.fit(x, y, batch_size=args.batch_size, epochs=1, shuffle=False, verbose=0)
    else:
        model.fit_generator(Batches(x, y, args.batch_size), epochs=1, shuffle=False,
                            workers=1, verbose=0)


if __name__ == "__main__":
    main()
