"""The judges' shared helpers: optional dependencies of the ``eval`` extra, and image batches as uint8."""

from __future__ import annotations

import importlib

import numpy as np

from unimodal.core.errors import InputError, MissingDependencyError

EXTRA = "eval"


def require(module: str, package: str, purpose: str):
    """Import an optional dependency, or say which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(package, EXTRA, purpose) from exc


def as_uint8_images(images, what: str) -> np.ndarray:
    """(N, H, W, C) uint8 from one image or a batch, gray or RGB, uint8 or float (0..1 or 0..255)."""
    array = np.asarray(images)
    if array.ndim == 2 or (array.ndim == 3 and array.shape[-1] in (1, 3)):
        array = array[None]  # one image (a batch of 1- or 3-pixel-wide gray images is not a thing)
    if array.ndim == 3:
        array = array[..., None]  # a batch of gray images
    if array.ndim != 4 or array.shape[-1] not in (1, 3) or min(array.shape[1:3]) < 8:
        raise InputError(f"{what} must be an image (H, W), (H, W, 3) or a batch of them; got shape {array.shape}")
    if array.dtype != np.uint8:
        array = array.astype(np.float32)
        if array.size and array.max() <= 1.0:
            array = array * 255.0  # floats in [0, 1]
        array = np.clip(np.rint(array), 0, 255).astype(np.uint8)
    return array


# --------------------------------------------------------------------------------------------------- scenes
