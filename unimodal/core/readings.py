"""The one rule for ``agreement``, the reading that chooses among candidates, shared by the request checks of
every door (the CLI, the servers, ``UniModal.generate``), ``unimodal eval`` and the agreement score itself, as
:mod:`unimodal.core.seeds` is for a seed.

``"joint"`` (the default) reads the whole request back from a draw at once; ``"each"`` reads it word by word
(:func:`unimodal.inference.critique.agreement_score`). A reading other than the default chooses among draws, so it
needs candidates > 1.
"""

from __future__ import annotations

from unimodal.core.errors import InputError, SettingError

AGREEMENTS = ("joint", "each")
AGREEMENT_DEFAULT = "joint"


def check_agreement(value, candidates: int = 2, error: type[InputError] = SettingError,
                    name: str = "agreement") -> str:
    """``value`` (None: :data:`AGREEMENT_DEFAULT`) if it is one of :data:`AGREEMENTS` and, unless it is the default,
    ``candidates`` > 1; otherwise ``error`` naming ``name``."""
    if value is None:
        return AGREEMENT_DEFAULT
    if value not in AGREEMENTS:
        raise error(f"{name} must be one of {AGREEMENTS}, got {value!r}")
    if candidates < 2 and value != AGREEMENT_DEFAULT:
        raise error(f"{name}={value!r} chooses among several draws: it needs candidates > 1, got "
                    f"candidates={candidates} (give candidates > 1, e.g. candidates=4)")
    return value


__all__ = ["AGREEMENTS", "AGREEMENT_DEFAULT", "check_agreement"]
