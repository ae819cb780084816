"""The Lasagne adapter (Lasagne 0.1 and the 0.2 development version)."""
