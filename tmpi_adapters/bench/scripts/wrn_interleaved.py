"""WRN-10-1, exact and with ``--batch-stats local``, their steps taking turns in one job.

Builds the Keras WRN example's model (``examples/keras_wresnet/wresnet.py``)
twice with the same weights: the first training function is compiled exact
(the default), the second with the session's batch statistics set to local
(what ``--batch-stats local`` does, read when a training function is
compiled).  Then the two models train on synthetic images, one batch each
in turn, forwards and backwards (ABBA at the level of steps), so both see
the machine's same moments: the job's ``--record`` holds
``train_function#0`` (exact) and ``train_function#1`` (local).

    tmpi wrap -n 2 --framework keras --record R wrn_interleaved.py EXAMPLE_DIR STEPS
"""
import sys

import numpy as np


def main(example_dir, steps):
    sys.path.insert(0, example_dir)
    from keras import backend as K
    from keras.optimizers import SGD
    from wresnet import wide_resnet

    from tmpi_adapters import datasets
    from tmpi_adapters.core.session import current_session

    K.set_image_data_format("channels_first")
    x, y = datasets.synthetic_images(64 * 8, shape=(3, 32, 32), dtype=K.floatx(), seed=0)
    x = (x - x.mean()) / (x.std() + 1e-7)
    session = current_session()
    models = []
    for stats in ("global", "local"):
        session.options.batch_stats = stats
        np.random.seed(0)
        model = wide_resnet(10, 1, input_shape=x.shape[1:], classes=int(y.max()) + 1,
                            weight_decay=5e-4)
        model.compile(SGD(lr=0.1, momentum=0.9, nesterov=True),
                      "sparse_categorical_crossentropy", metrics=["accuracy"])
        model.train_on_batch(x[:64], y[:64])  # compiled now, with these statistics
        models.append(model)
    for step in range(steps):
        start = (step % 8) * 64
        for model in (models if step % 2 == 0 else models[::-1]):
            model.train_on_batch(x[start:start + 64], y[start:start + 64])
    print("interleaved %d steps of each" % steps)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
