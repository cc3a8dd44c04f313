"""``digits``: scikit-learn's bundled real handwritten digits (1,797 of them, 8x8 in 17 grey levels),
resized to 64x64 RGB, with paraphrased captions ("the digit seven", "a handwritten 7", ...) and their speech.

The split is a fixed permutation of the 1,797 digits by seed: 80% train, 10% val, 10% test. The digit judge
(``unimodal/judges/``) is trained on the same train split, so it never saw the test digits.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from PIL import Image

from unimodal.training.data.speech import Voice, synthesize
from unimodal.training.data.store import Sample
from unimodal.core.grammar import DIGIT_TEMPLATES, IMAGE_SIZE, digit_caption

NUM_DIGITS = 1797
SPLIT_FRACTIONS = {"train": 0.8, "val": 0.1, "test": 0.1}


def split_indices(seed: int) -> dict[str, np.ndarray]:
    """Indices into scikit-learn's digits for each split (deterministic by seed)."""
    perm = np.random.default_rng(seed).permutation(NUM_DIGITS)
    n_train = int(NUM_DIGITS * SPLIT_FRACTIONS["train"])
    n_val = int(NUM_DIGITS * SPLIT_FRACTIONS["val"])
    return {"train": perm[:n_train], "val": perm[n_train:n_train + n_val], "test": perm[n_train + n_val:]}


def render_digit(pixels_8x8: np.ndarray, size: int = IMAGE_SIZE) -> np.ndarray:
    """An 8x8 digit (values 0..16) as a (size, size, 3) uint8 white-on-black image, bicubic upsampled."""
    grey = Image.fromarray(np.round(pixels_8x8 * (255 / 16)).astype(np.uint8), mode="L")
    big = np.asarray(grey.resize((size, size), Image.BICUBIC))
    return np.repeat(big[:, :, None], 3, axis=2)


@lru_cache(maxsize=1)
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    return bunch.images, bunch.target


def make_samples(seed: int, split: str, indices: np.ndarray, speech: bool = True, progress=None,
                 voices: str = "varied") -> list[Sample]:
    images, labels = load_digits_arrays()
    samples = []
    for i in indices:
        rng = np.random.default_rng([seed, int(i)])
        template = int(rng.integers(len(DIGIT_TEMPLATES)))
        caption = digit_caption(int(labels[i]), template)
        voice = Voice.random(rng, voices)
        audio = synthesize(caption, voice) if speech else None
        meta = {"attributes": {"digit": int(labels[i])}, "source_index": int(i), "template": template,
                "voice": voice.to_dict() if speech else None}
        samples.append(Sample(text=caption, image=render_digit(images[i]), audio=audio, meta=meta))
        if progress is not None:
            progress.update(1)
    return samples
