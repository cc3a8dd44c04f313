"""Reading media files the same way everywhere: a picture as a square RGB array, a sound as mono float32 at
the codecs' sample rate (used by the data sets, the pipeline's inputs and the servers)."""

from __future__ import annotations

import os

import numpy as np
from PIL import Image, UnidentifiedImageError

from unimodal.core.errors import DataError
from unimodal.core.grammar import IMAGE_SIZE

SAMPLE_RATE = 16_000  # Hz: every clip the codecs read or write


def load_image(path: str | os.PathLike, size: int = IMAGE_SIZE) -> np.ndarray:
    """Any image file as a (size, size, 3) uint8 RGB array: centre square crop, then Lanczos resize."""
    try:
        with Image.open(path) as img:
            img = img.convert("RGB")
    except (OSError, UnidentifiedImageError) as exc:
        raise DataError(f"cannot read image {path}: {exc}") from exc
    return square_resize(img, size)


def square_resize(img: Image.Image, size: int = IMAGE_SIZE) -> np.ndarray:
    """Centre square crop, then Lanczos resize to (size, size); an image already that size is kept as is."""
    if img.size != (size, size):
        w, h = img.size
        side = min(w, h)
        left, top = (w - side) // 2, (h - side) // 2
        img = img.crop((left, top, left + side, top + side)).resize((size, size), Image.LANCZOS)
    return np.asarray(img, dtype=np.uint8)


def load_audio(path: str | os.PathLike, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Any audio file soundfile reads, as mono float32 at ``sample_rate``."""
    import soundfile as sf

    try:
        data, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except (RuntimeError, OSError) as exc:  # soundfile raises LibsndfileError (a RuntimeError)
        raise DataError(f"cannot read audio {path}: {exc}") from exc
    if data.shape[0] == 0:
        raise DataError(f"audio {path} holds no samples")
    return resample(data.mean(axis=1), rate, sample_rate)


def resample(audio: np.ndarray, orig_rate: int, new_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Band-limited resampling of a mono float signal (torchaudio's windowed sinc)."""
    if orig_rate == new_rate:
        return audio.astype(np.float32)
    import torch
    import torchaudio.functional as AF

    wave = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32))
    return AF.resample(wave, orig_rate, new_rate).numpy()
