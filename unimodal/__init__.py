"""unimodal: one masked-diffusion transformer for text, images and audio, any-to-any.

The top-level import stays light; heavy parts load when first used.
"""

from __future__ import annotations

__version__ = "0.1.0"

from unimodal.errors import (  # noqa: F401  (re-exported)
    DataError,
    InputError,
    ManifestError,
    MissingDependencyError,
    UnimodalError,
)
