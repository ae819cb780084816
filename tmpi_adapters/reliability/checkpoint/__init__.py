"""Checkpoints written atomically on rank 0, and a resume that equals an uninterrupted run.

What is where:

- :mod:`~tmpi_adapters.reliability.checkpoint.checkpointer`: the
  :class:`Checkpointer` of one run: its hooks (every call, every step, the end
  of the script), what a checkpoint captures, writing and pruning files.
- :mod:`~tmpi_adapters.reliability.checkpoint.policy`: when a checkpoint falls
  due (``--checkpoint-every`` in steps, epochs or seconds; the default gaps).
- :mod:`~tmpi_adapters.reliability.checkpoint.fileformat`: the file's bytes
  (magic, JSON header, checksummed payload), its name, finding the newest,
  clearing partial files of dead writers.
- :mod:`~tmpi_adapters.reliability.checkpoint.payload`: the state as data (a
  JSON tree and numpy arrays, no pickle), and what a state may hold.
- :mod:`~tmpi_adapters.reliability.checkpoint.calllog`: the call log (what
  every call of a compiled function returned, a fingerprint of its arguments).
- :mod:`~tmpi_adapters.reliability.checkpoint.rng`: numpy's, Python's and
  Theano's random generators, saved and set again.
- :mod:`~tmpi_adapters.reliability.checkpoint.replay`: a resume: the
  checkpoint found and shared, the replayed calls checked against the log,
  the saved state loaded at its end.

The atomic write itself is :func:`tmpi_adapters.files.write_atomic`.  Nothing
is imported here: the plugin manager imports this package's ``policy`` to
check ``--checkpoint-every``, and must not pull numpy or Theano in with it.
"""
