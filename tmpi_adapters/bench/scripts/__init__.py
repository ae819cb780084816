"""Small real training scripts, each in its framework's own idiom.

The collectives part of `tmpi bench` (:mod:`tmpi_adapters.bench.collectives`)
runs them under ``tmpi wrap -n 2 --record`` and counts the collectives of
every training step.  They know nothing of tmpi; they are run as scripts,
never imported.
"""
