"""Weak scaling for Keras: each rank's ``fit`` sees its own shard of the data.

With ``--scaling weak`` the adapter hands Keras' ``fit_loop`` this rank's
samples (every N-th, :func:`shard_arrays`) and ``fit_generator`` this rank's
batches (every N-th, :func:`shard_batches`), so every rank takes the same
number of whole-batch steps per epoch and N ranks train on a global batch of
N x B.  The ``shard_*_arguments`` functions rewrite the bound arguments of
those two Keras functions.
"""
from tmpi_adapters.core.batches import batch_rows, is_rows
from tmpi_adapters.errors import ConfigError


def shard_arrays(arrays, rank, size):
    """This rank's shard of ``fit``'s inputs: every ``size``-th sample from ``rank``.

    Every rank keeps ``rows // size`` samples (the last ``rows % size`` samples
    are left out) so that all ranks take the same number of steps per epoch.
    Arrays without the sample dimension (the learning-phase flag) pass through.
    """
    rows = batch_rows(arrays)
    if rows is None:
        return arrays
    keep = rows // size
    if keep == 0:
        raise ConfigError(
            "fit was given %d samples for %d ranks with --scaling weak: every rank needs "
            "at least one. Use fewer ranks (-n %d) or --scaling strong." % (rows, size,
                                                                            max(rows, 1)))
    return [a[rank::size][:keep] if is_rows(a, rows) else a for a in arrays]


def shard_batches(generator, steps_per_epoch, rank, size):
    """This rank's share of ``fit_generator``'s batches and its steps per epoch.

    A ``keras.utils.Sequence`` is indexed directly (batch ``i * size + rank``);
    a Python generator is read in full and every ``size``-th batch kept.
    """
    from keras.engine.training_utils import is_sequence
    sequence = is_sequence(generator)
    if steps_per_epoch is None and not sequence:
        return generator, steps_per_epoch  # Keras reports the missing argument
    total = steps_per_epoch if steps_per_epoch is not None else len(generator)
    if total // size == 0:
        raise ConfigError(
            "fit_generator has %d batches per epoch for %d ranks with --scaling weak: "
            "every rank needs at least one. Use fewer ranks or --scaling strong."
            % (total, size))
    if sequence:
        generator = _sharded_sequence(generator, rank, size)
    else:
        generator = _every_nth(generator, rank, size)
    # A Sequence without steps_per_epoch: Keras takes len() of the shard each epoch.
    return generator, (total // size if steps_per_epoch is not None else None)


def shard_fit_arguments(arguments, rank, size):
    """``training_arrays.fit_loop``'s bound ``arguments``, changed in place to
    this rank's samples; False (nothing changed) when ``fit`` runs on symbolic
    tensors (``steps_per_epoch`` given), which every rank then reads whole."""
    if arguments.get("steps_per_epoch") is not None:
        return False
    arguments["fit_inputs"] = shard_arrays(list(arguments["fit_inputs"]), rank, size)
    return True


def shard_generator_arguments(arguments, rank, size):
    """``training_generator.fit_generator``'s bound ``arguments``, changed in
    place to this rank's batches; always True."""
    arguments["generator"], arguments["steps_per_epoch"] = shard_batches(
        arguments["generator"], arguments.get("steps_per_epoch"), rank, size)
    return True


def _every_nth(generator, rank, size):
    """Items ``rank, rank + size, ...`` of an iterator."""
    while True:
        kept = None
        for position in range(size):
            try:
                item = next(generator)
            except StopIteration:
                return
            if position == rank:
                kept = item
        yield kept


def _sharded_sequence(sequence, rank, size):
    from keras.utils import Sequence

    class ShardedSequence(Sequence):
        """Batches ``rank, rank + size, ...`` of a Keras ``Sequence``."""

        def __len__(self):
            return len(sequence) // size

        def __getitem__(self, index):
            return sequence[index * size + rank]

        def on_epoch_end(self):
            sequence.on_epoch_end()

    return ShardedSequence()
