"""DigitJudge: reads a white-on-black digit with a scikit-learn SVC fitted on the real scikit-learn digits
(train split only)."""

from __future__ import annotations

import functools

import numpy as np

from unimodal.core.errors import InputError
from unimodal.core.grammar import IMAGE_SIZE
from unimodal.judges.common import as_uint8_images

DIGIT_FEATURE_SIDE = 8  # the digits' native resolution: a 64x64 rendering area-averaged back to 8x8
N_DIGITS = 1797  # size of scikit-learn's digits set
DIGIT_SPLITS = ("train", "val", "test")


def digit_split_indices(split: str, seed: int = 0) -> np.ndarray:
    """Indices into scikit-learn's digits of one split: the permutation and 80/10/10 cut the data builder uses.

    Train and val sizes are truncated (1437, 179) and test takes the rest (181), as in ``training/data/digits.py``.
    """
    if split not in DIGIT_SPLITS:
        raise InputError(f"split must be one of {list(DIGIT_SPLITS)}; got {split!r}")
    perm = np.random.default_rng(seed).permutation(N_DIGITS)
    n_train, n_val = int(N_DIGITS * 0.8), int(N_DIGITS * 0.1)
    bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val), "test": (n_train + n_val, N_DIGITS)}
    start, end = bounds[split]
    return perm[start:end]


def render_digits(images_8x8: np.ndarray) -> np.ndarray:
    """(N, 64, 64, 3) uint8 white-on-black renderings of (N, 8, 8) digits valued 0..16, as the builder makes them.

    Kept here (not imported from ``training``) so the judge stays independent of the training code.
    """
    from PIL import Image

    gray = np.clip(np.rint(np.asarray(images_8x8, np.float32) * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    big = [np.asarray(Image.fromarray(g).resize((IMAGE_SIZE, IMAGE_SIZE), Image.BICUBIC)) for g in gray]
    return np.repeat(np.stack(big)[..., None], 3, axis=-1)


def digit_features(images) -> np.ndarray:
    """(N, 64) features: gray, area-averaged down to 8x8, scaled to 0..1."""
    from PIL import Image

    batch = as_uint8_images(images, "images").astype(np.float32).mean(-1)  # (N, H, W) gray
    side = DIGIT_FEATURE_SIDE
    small = [np.asarray(Image.fromarray(g).resize((side, side), Image.BOX)) for g in batch]
    return np.stack(small).reshape(len(batch), side * side) / 255.0


@functools.lru_cache(maxsize=4)
def _digit_data(split: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    index = digit_split_indices(split, seed)
    return digit_features(render_digits(digits.images[index])), digits.target[index]


@functools.lru_cache(maxsize=4)
def _fit_digit_classifier(seed: int):
    """SVC fitted once per process on the train split's renderings (about a second)."""
    from sklearn.svm import SVC

    features, labels = _digit_data("train", seed)
    return SVC(C=10.0, gamma="scale").fit(features, labels)


class DigitJudge:
    """Reads a white-on-black digit (64x64, gray or RGB) with an SVC trained on the real digits' train split."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def predict(self, images) -> np.ndarray:
        """(N,) int64 digit of each image (one image gives a length-1 array)."""
        return _fit_digit_classifier(self.seed).predict(digit_features(images)).astype(np.int64)

    def accuracy(self, split: str = "test") -> float:
        """Share of a split's real digits read right (the judge never saw val or test)."""
        features, labels = _digit_data(split, self.seed)
        return float((_fit_digit_classifier(self.seed).predict(features) == labels).mean())


# --------------------------------------------------------------------------------------------------- speech
