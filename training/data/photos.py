"""Natural photos that ship inside installed wheels (scikit-learn, scikit-image), for training codecs on
more than our own drawings. Two photos are held out of training to measure codecs on unseen images."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

TRAIN_PHOTOS = ("sklearn:china", "astronaut", "chelsea", "rocket", "hubble_deep_field", "immunohistochemistry",
                "camera", "coins", "brick", "grass", "gravel", "moon", "clock", "horse", "retina", "colorwheel")
HELDOUT_PHOTOS = ("sklearn:flower", "coffee")


def _load(name: str) -> np.ndarray:
    if name.startswith("sklearn:"):
        from sklearn.datasets import load_sample_image

        image = load_sample_image(name.split(":", 1)[1] + ".jpg")
    else:
        import skimage.data

        image = getattr(skimage.data, name)()
    if image.ndim == 2:
        image = np.repeat(image[:, :, None], 3, axis=2)
    return np.ascontiguousarray(image[:, :, :3]).astype(np.uint8)


@lru_cache(maxsize=None)
def photos(heldout: bool = False) -> tuple[np.ndarray, ...]:
    return tuple(_load(name) for name in (HELDOUT_PHOTOS if heldout else TRAIN_PHOTOS))


def random_crop(rng: np.random.Generator, heldout: bool = False, size: int = 64) -> np.ndarray:
    """A random square crop (64 to 256 pixels, possibly mirrored) of a photo, resized to ``size``."""
    pool = photos(heldout)
    image = pool[rng.integers(len(pool))]
    h, w = image.shape[:2]
    side = int(rng.integers(64, min(256, h, w) + 1))
    top, left = int(rng.integers(h - side + 1)), int(rng.integers(w - side + 1))
    crop = Image.fromarray(image[top:top + side, left:left + side]).resize((size, size), Image.LANCZOS)
    crop = np.asarray(crop)
    return crop[:, ::-1].copy() if rng.random() < 0.5 else crop
