"""Turn what a user passes (strings, PIL images, numpy arrays, file paths) into what the codecs take, with
errors that name the argument and say what is accepted."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image

from unimodal.checks import check_image_size, check_text
from unimodal.core.errors import DataError, EmptyInputError, InputError, InputFileError, SampleRateError
from unimodal.core.paths import user_path

SAMPLE_RATE = 16_000


def as_text(value, name: str = "text") -> str:
    value = check_text(value, name)
    if not value.strip():
        raise InputError(f"{name} is empty; give a non-empty prompt or leave it out")
    return value


def _from_file(value, name: str, load):
    """``load(path)`` for an existing file, its failure re-raised as an InputError naming the argument."""
    path = user_path(value, name, InputFileError)
    if not path.is_file():
        raise InputFileError(f"{name}: no such file {str(path)!r}")
    try:
        return load(path)
    except DataError as exc:
        raise InputFileError(f"{name}: {exc}") from None


def as_image(value, size: int, name: str = "image") -> np.ndarray:
    """A PIL image, an (H, W, 3) / (H, W) uint8 array or a file path -> (size, size, 3) uint8."""
    from unimodal.core.media import load_image, square_resize

    if isinstance(value, (str, os.PathLike)):
        from unimodal.checks import check_image_file

        check_image_file(value, name)  # a 0x0 or truncated file is refused by cause, not resized into black
        return _from_file(value, name, lambda path: load_image(path, size))
    if isinstance(value, Image.Image):
        check_image_size(value.size, name)
        value = np.asarray(value.convert("RGB"))
    if not isinstance(value, np.ndarray):
        raise InputError(f"{name} must be a PIL image, a uint8 numpy array or a file path, got {type(value).__name__}")
    array = value
    if array.ndim == 2:
        array = np.repeat(array[:, :, None], 3, axis=2)
    if array.ndim != 3 or array.shape[2] not in (3, 4):
        raise InputError(f"{name} array must be (H, W), (H, W, 3) or (H, W, 4), got shape {value.shape}")
    check_image_size((array.shape[1], array.shape[0]), name)
    if array.dtype != np.uint8:
        if np.issubdtype(array.dtype, np.floating) and array.size and 0.0 <= array.min() and array.max() <= 1.0:
            array = np.round(array * 255)
        else:
            raise InputError(f"{name} array must be uint8 (0..255) or float in [0, 1], got {array.dtype}")
    return square_resize(Image.fromarray(array[:, :, :3].astype(np.uint8)), size)


def as_audio(value, sample_rate: int | None = None, name: str = "audio") -> np.ndarray:
    """A 1-D float array (16 kHz unless ``sample_rate`` says otherwise), ``(array, rate)`` or a file path ->
    mono float32 at 16 kHz."""
    from unimodal.core.media import load_audio, resample

    if isinstance(value, (str, os.PathLike)):
        return _from_file(value, name, lambda path: load_audio(path, SAMPLE_RATE))
    if isinstance(value, tuple) and len(value) == 2:
        value, sample_rate = value
    if sample_rate is not None:
        sample_rate = _sample_rate(sample_rate, name)
    if not isinstance(value, np.ndarray) or not np.issubdtype(value.dtype, np.number):
        raise InputError(f"{name} must be a numeric numpy array, (array, sample_rate) or a file path, "
                         f"got {type(value).__name__}")
    wave = value.astype(np.float32)
    if wave.ndim == 2:
        wave = wave.mean(axis=1 if wave.shape[1] <= 8 else 0)  # (T, channels) or (channels, T)
    if wave.ndim != 1:
        raise InputError(f"{name} must be a mono waveform (T,) or (T, channels), got shape {value.shape}")
    if wave.size == 0:
        raise EmptyInputError(f"{name} holds no samples (shape {value.shape})")
    if np.issubdtype(value.dtype, np.integer):
        wave = wave / float(np.iinfo(value.dtype).max)
    if not np.all(np.isfinite(wave)):
        raise InputError(f"{name} holds NaN or infinite samples")
    rate = SAMPLE_RATE if sample_rate is None else sample_rate
    return resample(wave, rate, SAMPLE_RATE) if rate != SAMPLE_RATE else wave


def _sample_rate(rate, name: str) -> int:
    """A positive whole number of samples per second (an int, or a float such as 16000.0)."""
    if isinstance(rate, bool) or not isinstance(rate, (int, float, np.integer, np.floating)) or not (
            np.isfinite(rate) and rate > 0 and float(rate).is_integer()):
        raise SampleRateError(f"{name} sample rate must be a positive whole number of samples per second "
                              f"(e.g. 16000), got {rate!r}")
    return int(rate)
