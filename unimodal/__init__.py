"""unimodal: one masked-diffusion transformer for text, images and audio, any-to-any.

The top-level import stays light; heavy parts load when first used.
"""

from __future__ import annotations

__version__ = "0.1.0"

from unimodal.core.errors import (  # noqa: F401  (re-exported)
    DataError,
    DeviceError,
    EmptyInputError,
    InputError,
    InputFileError,
    ManifestError,
    MissingDependencyError,
    ModelFolderError,
    OutputPathError,
    SampleRateError,
    SettingError,
    StepsCappedWarning,
    TextEncodingError,
    UnimodalError,
    UnknownWordsWarning,
)

_LAZY = {"UniModal": "unimodal.pipeline", "GenerationResult": "unimodal.results"}


def __getattr__(name: str):
    """``unimodal.UniModal`` / ``unimodal.GenerationResult``, imported on first use (torch, diffusers...)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'unimodal' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(list(globals()) + list(_LAZY))


__all__ = ["DataError", "DeviceError", "EmptyInputError", "GenerationResult", "InputError", "InputFileError",
           "ManifestError", "MissingDependencyError", "ModelFolderError", "OutputPathError", "SampleRateError",
           "SettingError", "StepsCappedWarning", "TextEncodingError", "UniModal", "UnimodalError",
           "UnknownWordsWarning", "__version__"]
