"""A small Keras model that validates as it trains: what a resume must retrace.

Prints the final weights' norms and the validation losses of every epoch.
"""
import numpy as np
from keras import backend as K
from keras.layers import Dense
from keras.models import Sequential
from sklearn.datasets import load_digits

K.set_floatx("float64")
digits = load_digits()
x = (digits.data[:400] / 16.0).astype(K.floatx())
y = np.eye(10, dtype=K.floatx())[digits.target[:400]]
np.random.seed(3)
model = Sequential([Dense(16, activation="relu", input_shape=(64,)),
                    Dense(10, activation="softmax")])
model.compile(optimizer="sgd", loss="categorical_crossentropy", metrics=["accuracy"])
history = model.fit(x, y, batch_size=32, epochs=3, validation_split=0.25, shuffle=False,
                    verbose=0)
print("final norms %s" % " ".join("%.17g" % np.linalg.norm(w) for w in model.get_weights()))
print("final val_loss %s" % " ".join("%.17g" % v for v in history.history["val_loss"]))
print("final test %s" % " ".join("%.17g" % v for v in model.evaluate(x[:64], y[:64],
                                                                     verbose=0)))
