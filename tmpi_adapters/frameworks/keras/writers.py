"""What a Keras script writes, on N ranks: tmpi's rule for files.

Keras' own writers follow the rule of :mod:`tmpi_adapters.frameworks.writes`:

``save_model`` (``Model.save``, ``ModelCheckpoint``), ``Network.save_weights``
    a path the ranks share is written once, by the first rank to reach it,
    and every rank returns once the file is complete (a following
    ``load_model`` reads it whole); a rank's own path (a ``tempfile``) is
    written by that rank.
``CSVLogger``
    opens its file under the same rule: one file per path, written once.
``RemoteMonitor``
    reports to its server from rank 0 only (one voice).
a ``gs://`` URL (Google Cloud Storage)
    is no path on this host, so the rule does not apply: each rank saves and
    loads it itself, as Keras does, through a local temporary file of its
    own (Keras names that file after the object alone, one path for every
    rank of a host).

On one rank nothing is hooked.
"""
import functools
import shutil
import tempfile
import weakref

from tmpi_adapters.frameworks.writes import is_path


def patch_writers(adapter):
    """Hook Keras' writers (``keras`` is imported) while ``adapter`` is installed."""
    files = adapter.transparency.files
    if files is None:
        return
    import keras.callbacks
    import keras.models
    from keras.engine import network, saving
    patch = adapter.patcher.patch
    patch(saving, "tempfile", _OwnTemporaryDirectory())
    # Network.save looks save_model up in keras.models at call time.
    save_model = _writing(files, "Keras save_model", saving.save_model)
    patch(saving, "save_model", save_model)
    patch(keras.models, "save_model", save_model)
    patch(network.Network, "save_weights",
          _writing(files, "Keras save_weights", network.Network.save_weights))
    csv_logger = keras.callbacks.CSVLogger
    patch(csv_logger, "on_train_begin", _seen(files, csv_logger.on_train_begin))
    remote = keras.callbacks.RemoteMonitor
    patch(remote, "on_epoch_end", on_rank_zero(adapter.session, remote.on_epoch_end))


class _OwnTemporaryDirectory:
    """What ``keras.engine.saving`` sees as its ``tempfile`` module: a
    ``gettempdir()`` of this process's own (made when first asked for,
    removed with this object), so the ranks' transfers to and from
    ``gs://`` never share a file."""

    def __init__(self):
        self.directory = None

    def gettempdir(self):
        if self.directory is None:
            self.directory = tempfile.mkdtemp(prefix="tmpi-keras-")
            weakref.finalize(self, shutil.rmtree, self.directory, True)
        return self.directory


def _writing(files, what, method):
    """``method(owner, filepath, ...)`` (Keras' save functions) under the rule
    for ``filepath``; an ``h5py`` group instead of a path, or a ``gs://`` URL,
    is written as it is."""
    from keras.engine.saving import _is_gcs_location

    @functools.wraps(method)
    def writing(owner, filepath, *args, **kwargs):
        if not is_path(filepath) or _is_gcs_location(filepath):
            return method(owner, filepath, *args, **kwargs)
        return files.call(what, [filepath], lambda: method(owner, filepath, *args, **kwargs))
    return writing


def _seen(files, method):
    """``method``, whose own ``open`` for writing follows the rule."""
    @functools.wraps(method)
    def seen(*args, **kwargs):
        with files.seeing():
            return method(*args, **kwargs)
    return seen


def on_rank_zero(session, method):
    """``method`` run by rank 0 only (a report to the outside world)."""
    @functools.wraps(method)
    def rank_zero_only(*args, **kwargs):
        return method(*args, **kwargs) if session.rank == 0 else None
    return rank_zero_only
