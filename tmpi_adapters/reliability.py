"""Reliability: failed and stalled ranks, checkpoints and resume, non-finite values."""
