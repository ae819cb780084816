"""The version of tmpi-adapters (read by setup.py, reported by ``tmpi --version``)."""
__version__ = "0.1.0"
