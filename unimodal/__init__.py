"""unimodal: one masked-diffusion transformer for text, images and audio, any-to-any.

The top-level import stays light; heavy parts load when first used.
"""

from __future__ import annotations

__version__ = "0.1.0"

# Installed, the parts (backbone, tokenizers_mm, training, inference, demos) live inside this package
# (pyproject.toml's package-dir). In a source checkout they sit beside this folder at the repository's top
# level: let `unimodal.<part>` find them there, so a checkout (a git worktree, the GPU recipe's bare machine
# with PYTHONPATH) imports its own files, not those of whichever tree was installed in editable mode.
def _add_checkout_parts() -> None:
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if os.path.isfile(os.path.join(root, "pyproject.toml")) and os.path.isdir(os.path.join(root, "backbone")):
        __path__.append(root)


_add_checkout_parts()

from unimodal.core.errors import (  # noqa: F401  (re-exported)
    BadRecordsError,
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


__all__ = ["BadRecordsError", "DataError", "DeviceError", "EmptyInputError", "GenerationResult", "InputError",
           "InputFileError", "ManifestError", "MissingDependencyError", "ModelFolderError", "OutputPathError",
           "SampleRateError", "SettingError", "StepsCappedWarning", "TextEncodingError", "UniModal", "UnimodalError",
           "UnknownWordsWarning", "__version__"]
