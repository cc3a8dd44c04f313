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


def _weighted_aurocs(scores: np.ndarray, wrong: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """AUROC per row of ``weights`` (draws x items): each item counted as often as its weight says. One sort of
    the scores serves every draw: the pairs are counted bin by bin over the distinct scores (ties count half)."""
    values, bins = np.unique(scores, return_inverse=True)
    out = np.full(len(weights), np.nan)
    for row, weight in enumerate(weights):
        bad = np.bincount(bins, weights=weight * wrong, minlength=len(values))
        good = np.bincount(bins, weights=weight * ~wrong, minlength=len(values))
        pairs = bad.sum() * good.sum()
        if pairs:
            above = good.sum() - np.cumsum(good)  # right items scored strictly higher than each bin
            out[row] = float((bad * (above + 0.5 * good)).sum() / pairs)
    return out


def _case_draws(cases: int, resamples: int, seed: int) -> np.ndarray:
    """How often each case is drawn in each bootstrap resample of the cases (resamples x cases)."""
    rng = np.random.default_rng(seed)
    return np.stack([np.bincount(rng.integers(0, cases, cases), minlength=cases) for _ in range(resamples)])


def _pooled(cases: Sequence[tuple[Sequence[float], Sequence[bool]]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    scores = [np.asarray(s, dtype=float) for s, _ in cases]
    wrong = [np.asarray(w, dtype=bool) for _, w in cases]
    owner = np.concatenate([np.full(len(s), i) for i, s in enumerate(scores)]) if scores else np.zeros(0, int)
    return (np.concatenate(scores) if scores else np.zeros(0), np.concatenate(wrong) if wrong else np.zeros(0, bool),
            owner.astype(int))


def auroc_interval(cases: Sequence[tuple[Sequence[float], Sequence[bool]]], resamples: int = 2000,
                   seed: int = 0) -> list[float] | None:
    """95% bootstrap interval of :func:`auroc` over the pooled tokens of ``cases`` ((scores, wrong) per case),
    resampling whole cases: the tokens of one clip or picture are not independent (a garbled stretch makes
    several wrong codes at once), so resampling tokens would make the interval too narrow. None without both
    kinds of token."""
    scores, wrong, owner = _pooled(cases)
    if auroc(scores, wrong) is None:
        return None
    aurocs = _weighted_aurocs(scores, wrong, _case_draws(len(cases), resamples, seed)[:, owner])
    low, high = np.nanpercentile(aurocs, [2.5, 97.5])
    return [float(low), float(high)]


def auroc_difference(cases: Sequence[tuple[Sequence[float], Sequence[bool]]],
                     reference: Sequence[tuple[Sequence[float], Sequence[bool]]], resamples: int = 2000,
                     seed: int = 0) -> dict | None:
    """``auroc(cases) - auroc(reference)`` over the same cases (two models' fills of the same clips, or two
    critics of the same tokens) and its 95% bootstrap interval, each resample drawing the same cases for both:
    ``{"mean", "ci95", "cases"}``; None when either side lacks a wrong or a right token."""
    if len(cases) != len(reference):
        raise ValueError(f"paired AUROC needs the same cases on both sides, got {len(cases)} and {len(reference)}")
    a, b = _pooled(cases), _pooled(reference)
    first, second = auroc(a[0], a[1]), auroc(b[0], b[1])
    if first is None or second is None:
        return None
    draws = _case_draws(len(cases), resamples, seed)
    diffs = _weighted_aurocs(a[0], a[1], draws[:, a[2]]) - _weighted_aurocs(b[0], b[1], draws[:, b[2]])
    low, high = np.nanpercentile(diffs, [2.5, 97.5])
    return {"mean": first - second, "ci95": [float(low), float(high)], "cases": len(cases)}


__all__ = ["auroc", "auroc_difference", "auroc_interval", "auroc_within"]
