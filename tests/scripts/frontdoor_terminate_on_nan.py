"""A Keras script with its own safety net: TerminateOnNaN stops training at
the first NaN loss (a NaN in the third batch's labels), and the script goes on
to say how far it got."""
import numpy as np
from keras.callbacks import TerminateOnNaN
from keras.layers import Dense
from keras.models import Sequential

x = np.random.RandomState(0).normal(size=(64, 3))
y = x.sum(axis=1)
y[40] = np.nan  # batch 3 of 16 rows
model = Sequential([Dense(1, input_shape=(3,))])
model.compile("sgd", "mse")
history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0,
                    callbacks=[TerminateOnNaN()])
print("stopped by the script after %d epoch(s)" % len(history.history["loss"]))
