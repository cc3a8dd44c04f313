"""The one rule for a seed, shared by every door that accepts one (SamplerConfig, Request, the pipeline, the
request checks of the CLI and the servers), so a seed one of them takes is never refused by another.

A seed is None (draw a fresh one, reported in the result) or an int in ``[0, SEED_LIMIT)``. The limit leaves
room below torch's 2**64 for the seeds derived from it: request ``i`` of a batch uses ``seed + i``.
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


def check_seed_room(seed: int, rounds: int, error: type[InputError] = InputError) -> None:
    """Refuse a ``seed`` whose derived seeds run past the limit: refine's round r regenerates with ``seed + r``, so
    ``rounds`` rounds need ``seed + rounds - 1 < SEED_LIMIT`` (checked before any work, not at the last round)."""
    if seed + max(rounds - 1, 0) >= SEED_LIMIT:
        raise error(f"seed must leave room for its rounds (round r regenerates with seed + r, below 2**62): seed "
                    f"{seed} leaves no room for {rounds} refine rounds; give a seed below {SEED_LIMIT - rounds + 1}")


def fresh_seed() -> int:
    """A random seed inside the accepted range, for a request that asked for none."""
    return secrets.randbelow(SEED_LIMIT)


__all__ = ["SEED_LIMIT", "check_seed", "check_seed_room", "fresh_seed"]
