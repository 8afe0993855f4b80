"""Phalanx: Kueue-compatible gang admission and topology-aware placement for GPU clusters."""

__version__ = "0.1.0"
