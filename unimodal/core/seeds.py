"""The one rule for a seed, shared by every door that accepts one (SamplerConfig, Request, the pipeline, the
request checks of the CLI and the servers), so a seed one of them takes is never refused by another.

A seed is None (draw a fresh one, reported in the result) or an int in ``[0, SEED_LIMIT)``. The seeds derived
from it (request ``i`` of a batch, candidate ``k``, refine round ``r``: ``seed + i`` and alike) wrap around the
limit (:func:`derived_seed`), so every accepted seed works with any batch size, candidates and rounds, and a seed
below the limit minus the offset derives exactly ``seed + offset``.
"""

from __future__ import annotations

import secrets

from unimodal.core.errors import InputError

SEED_LIMIT = 2**62


def check_seed(seed, name: str = "seed", error: type[InputError] = InputError) -> int | None:
    """``seed`` if it is None or an int in ``[0, SEED_LIMIT)``; otherwise ``error`` naming ``name``."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
        raise error(f"{name} must be a non-negative int below 2**62 (or None for a fresh seed), got {seed!r}")
    return seed


def derived_seed(seed: int, offset: int) -> int:
    """The seed ``offset`` draws after ``seed`` (batch request ``i``, candidate ``k``, refine round ``r``):
    ``seed + offset`` wrapped into ``[0, SEED_LIMIT)``, so it is itself an accepted seed."""
    return (seed + offset) % SEED_LIMIT


def fresh_seed() -> int:
    """A random seed inside the accepted range, for a request that asked for none."""
    return secrets.randbelow(SEED_LIMIT)


__all__ = ["SEED_LIMIT", "check_seed", "derived_seed", "fresh_seed"]
