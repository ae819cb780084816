"""A Keras 2 MLP trained with ``fit``, on generated data.

Dense - BatchNormalization (moving mean and variance updated by every step)
- Dense, Adam, the loss and the accuracy metric; ``fit`` with a validation
split, then ``evaluate``.

    python keras_mlp.py [EPOCHS]
"""
import sys

import numpy as np
from keras.layers import BatchNormalization, Dense
from keras.models import Sequential

# Generated data: a fixed random pattern per class plus noise (no downloads).
from tmpi_adapters.bench.models import generated_data



def main(epochs=2):
    np.random.seed(1)
    x, y = generated_data(704, (64,))
    model = Sequential([
        Dense(128, activation="relu", input_shape=(64,)),
        BatchNormalization(),
        Dense(10, activation="softmax"),
    ])
    model.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=32, epochs=epochs, validation_split=64 / 704.0, verbose=2)
    loss, accuracy = model.evaluate(x[:64], y[:64], verbose=0)
    print("evaluate: loss %.4f, accuracy %.2f %%" % (loss, 100 * accuracy))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
