"""Data for examples, tests and benchmarks: nothing is ever downloaded.

``digits`` ships inside scikit-learn; ``synthetic_images`` is generated;
``mnist``, ``cifar10`` and ``image_folder`` read files the user already has
and say exactly what is missing when they are not there.

Every loader returns float arrays scaled to [0, 1] in the requested ``dtype``
(Theano's ``floatX`` by default) and int32 labels.
"""
import gzip
import os
import pickle
import struct

import numpy as np

from tmpi_adapters import pickles
from tmpi_adapters.errors import TmpiError


class DataError(TmpiError):
    """A dataset the user pointed at is missing or unreadable."""


def _dtype(dtype):
    if dtype is not None:
        return np.dtype(dtype)
    try:
        import theano
        return np.dtype(theano.config.floatX)
    except ImportError:
        return np.dtype("float32")


def digits(dtype=None, image_shape=False, validation=297, seed=0):
    """scikit-learn's 1797 8x8 digits, shuffled with ``seed`` and split.

    Returns ``(x_train, y_train), (x_val, y_val)``; ``x`` has shape (N, 64), or
    (N, 1, 8, 8) with ``image_shape=True``.
    """
    from sklearn.datasets import load_digits
    data = load_digits()
    x = (data.data / 16.0).astype(_dtype(dtype))
    y = data.target.astype("int32")
    order = np.random.RandomState(seed).permutation(len(x))
    x, y = x[order], y[order]
    if image_shape:
        x = x.reshape(-1, 1, 8, 8)
    split = len(x) - validation
    return (x[:split], y[:split]), (x[split:], y[split:])


def synthetic_images(n, shape=(3, 32, 32), classes=10, dtype=None, seed=0):
    """Learnable generated images: each class is a fixed random pattern plus noise.

    Returns ``(x, y)`` with ``x`` of shape (n,) + shape in [0, 1].
    """
    rng = np.random.RandomState(seed)
    patterns = rng.uniform(0, 1, (classes,) + tuple(shape))
    y = rng.randint(0, classes, n).astype("int32")
    x = 0.7 * patterns[y] + 0.3 * rng.uniform(0, 1, (n,) + tuple(shape))
    return x.astype(_dtype(dtype)), y


def _require(path, what, hint):
    if not os.path.exists(path):
        raise DataError("%s not found at %r. %s" % (what, path, hint))


def _read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as handle:
            magic = struct.unpack(">I", handle.read(4))[0]
            ndim = magic & 0xFF
            shape = struct.unpack(">" + "I" * ndim, handle.read(4 * ndim))
            data = np.frombuffer(handle.read(), dtype=np.uint8)
    except (OSError, struct.error) as exc:
        raise DataError("cannot read IDX file %r: %s" % (path, exc))
    if data.size != int(np.prod(shape)):
        raise DataError("IDX file %r is truncated: expected %d values, found %d"
                        % (path, int(np.prod(shape)), data.size))
    return data.reshape(shape)


def mnist(path, dtype=None, image_shape=True):
    """MNIST from ``mnist.npz`` (Keras' layout) or a directory of the four IDX files.

    Returns ``(x_train, y_train), (x_test, y_test)`` with ``x`` of shape
    (N, 1, 28, 28) (or (N, 784) with ``image_shape=False``).
    """
    dtype = _dtype(dtype)
    hint = ("Pass a path to mnist.npz or to a directory holding train-images-idx3-ubyte"
            "[.gz], train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz] and "
            "t10k-labels-idx1-ubyte[.gz]; tmpi never downloads data.")
    _require(path, "MNIST", hint)
    if os.path.isfile(path):
        try:
            with np.load(path) as archive:
                parts = [archive[k] for k in ("x_train", "y_train", "x_test", "y_test")]
        except (OSError, KeyError, ValueError) as exc:
            raise DataError("cannot read MNIST archive %r: %s. %s" % (path, exc, hint))
    else:
        parts = []
        for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
            candidates = [os.path.join(path, name + ext) for ext in ("", ".gz")]
            found = [c for c in candidates if os.path.exists(c)]
            if not found:
                raise DataError("MNIST file %s[.gz] missing in %r. %s" % (name, path, hint))
            parts.append(_read_idx(found[0]))
    x_train, y_train, x_test, y_test = parts
    shape = (-1, 1, 28, 28) if image_shape else (-1, 784)
    return ((x_train.reshape(shape) / 255.0).astype(dtype), y_train.astype("int32")), \
           ((x_test.reshape(shape) / 255.0).astype(dtype), y_test.astype("int32"))


def cifar10(path, dtype=None, channels_last=False):
    """CIFAR-10 from the python batches (``cifar-10-batches-py``) in ``path``.

    Returns ``(x_train, y_train), (x_test, y_test)`` with ``x`` of shape
    (N, 3, 32, 32), or (N, 32, 32, 3) with ``channels_last=True``.
    """
    dtype = _dtype(dtype)
    hint = ("Unpack cifar-10-python.tar.gz there so that data_batch_1 ... data_batch_5 "
            "and test_batch sit in that directory; tmpi never downloads data.")
    _require(path, "CIFAR-10 directory", hint)

    def load(name):
        file = os.path.join(path, name)
        _require(file, "CIFAR-10 batch %s" % name, hint)
        try:
            with open(file, "rb") as handle:
                # Data only: a file that names any other callable is refused unrun.
                batch = pickles.loads(handle.read(), encoding="bytes")
            images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
            labels = np.asarray(batch[b"labels"], dtype=np.int32)
        except (OSError, KeyError, ValueError, pickle.UnpicklingError, EOFError) as exc:
            raise DataError("cannot read CIFAR-10 batch %r: %s" % (file, exc))
        return images, labels

    train = [load("data_batch_%d" % i) for i in range(1, 6)]
    x_test, y_test = load("test_batch")
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])

    def scale(x):
        x = (x / 255.0).astype(dtype)
        return x.transpose(0, 2, 3, 1).copy() if channels_last else x
    return (scale(x_train), y_train), (scale(x_test), y_test)


IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".ppm", ".gif")


def image_folder(path, size=(32, 32), dtype=None, channels_last=False):
    """Images arranged as ``path/<class name>/<image>``, resized to ``size``.

    Returns ``(x, y, class_names)``; needs Pillow.
    """
    dtype = _dtype(dtype)
    _require(path, "image folder", "Arrange images as <path>/<class>/<file>.")
    classes = sorted(d for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)))
    if not classes:
        raise DataError("image folder %r has no class subdirectories; arrange images as "
                        "<path>/<class>/<file>." % path)
    try:
        from PIL import Image
    except ImportError:
        raise DataError("reading an image folder needs Pillow: pip install pillow")
    images, labels = [], []
    for label, name in enumerate(classes):
        folder = os.path.join(path, name)
        for file in sorted(os.listdir(folder)):
            if not file.lower().endswith(IMAGE_EXTENSIONS):
                continue
            try:
                with Image.open(os.path.join(folder, file)) as image:
                    image = image.convert("RGB").resize(tuple(size)[::-1])
                    images.append(np.asarray(image, dtype=np.uint8))
            except OSError as exc:
                raise DataError("cannot read image %r: %s" % (os.path.join(folder, file), exc))
            labels.append(label)
    if not images:
        raise DataError("image folder %r holds no images (%s)" % (path,
                                                                   ", ".join(IMAGE_EXTENSIONS)))
    x = (np.stack(images) / 255.0).astype(dtype)
    if not channels_last:
        x = x.transpose(0, 3, 1, 2).copy()
    return x, np.asarray(labels, dtype=np.int32), classes
