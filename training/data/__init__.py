"""Data sets: the embedded ``scenes`` and ``digits`` (built offline from a seed) and a user's own ``folder``."""

from unimodal.training.data.store import SPLITS, BuiltDataset, Sample, read_info

__all__ = ["SPLITS", "BuiltDataset", "Sample", "read_info"]
