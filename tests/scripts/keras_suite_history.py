"""What a test suite's process does to a Keras model on N ranks: an earlier
test that took another path on one rank (its layers' name counters now run
ahead), then a model saved to Google Cloud Storage and loaded back, as Keras'
own tests do with their in-memory stand-in for GCS (each process has its own).

    python keras_suite_history.py
"""
import os

import numpy as np

from keras import backend as K
from keras.layers import Dense
from keras.models import Sequential, load_model
from keras.utils.test_utils import tf_file_io_proxy

#: MPI launchers tell each process its rank in one of these (one process: 0).
rank = next((int(os.environ[name]) for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")
             if name in os.environ), 0)
if rank == 1:
    Dense(4)   # an earlier test's layer, built on this rank only

K.set_floatx("float64")
rng = np.random.RandomState(0)
x = rng.uniform(-1, 1, (64, 5))
y = (x.sum(axis=1) > 0).astype("float64")
np.random.seed(1)
model = Sequential([Dense(8, activation="tanh", input_shape=(5,)), Dense(1, activation="sigmoid")])
model.compile("sgd", "binary_crossentropy")
print("weights named %s" % " ".join(w.name for w in model.weights))
model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)

with tf_file_io_proxy("keras.engine.saving.tf_file_io") as gcs:
    path = gcs.get_filepath("keras_suite_history.h5")
    model.save(path)
    gcs.assert_exists(path)
    loaded = load_model(path)
    model.save_weights(path)
    loaded.load_weights(path)
    gcs.delete_file(path)
same = np.array_equal(loaded.predict(x), model.predict(x))
print("final loaded equal %s" % same)
print("final weights %s" % " ".join("%.17g" % np.linalg.norm(w) for w in model.get_weights()))
