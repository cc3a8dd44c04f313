"""AUROC, the one measure of how well a score tells wrong from right: the critic benches use it on tokens,
``unimodal eval --every-draw`` on whole draws (how well reading a draw back tells a wrong one from a right one)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def auroc(scores: np.ndarray, wrong: np.ndarray) -> float | None:
    """Chance that a wrong item scores below a right one (ties count half); None without both kinds."""
    scores, wrong = np.asarray(scores, dtype=float), np.asarray(wrong, dtype=bool)
    bad, good = scores[wrong], scores[~wrong]
    if not len(bad) or not len(good):
        return None
    below = (bad[:, None] < good[None, :]).mean() + 0.5 * (bad[:, None] == good[None, :]).mean()
    return float(below)


def auroc_within(groups: Sequence[tuple[Sequence[float], Sequence[bool]]]) -> float | None:
    """The same chance over pairs drawn from one group only (a wrong and a right draw of the same request): how
    well the score ranks the draws it is asked to choose among, whatever makes one request harder than another.
    ``groups``: (scores, wrong) per group; None without a group holding both kinds."""
    below = pairs = 0.0
    for scores, wrong in groups:
        scores, wrong = np.asarray(scores, dtype=float), np.asarray(wrong, dtype=bool)
        bad, good = scores[wrong], scores[~wrong]
        below += float((bad[:, None] < good[None, :]).sum() + 0.5 * (bad[:, None] == good[None, :]).sum())
        pairs += len(bad) * len(good)
    return below / pairs if pairs else None


__all__ = ["auroc", "auroc_within"]
