"""The learning-rate shape every trainer here uses: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math


def warmup_cosine(step: int, steps: int, warmup: int, min_ratio: float) -> float:
    """Factor on the peak learning rate at ``step`` (0-based) of ``steps``."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, steps - warmup))
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
