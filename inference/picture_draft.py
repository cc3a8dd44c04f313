"""Pixel drafts for instructed picture edits: the source picture with one object recoloured, resized or moved.

Why a draft: an instructed edit re-masks the named object's box and has the model redraw it from the target
caption. A change of colour, size or place keeps the object's silhouette, and the source pixels already hold
that silhouette exactly; the model, redrawing it from words, often does not (it draws shapes far less reliably
than colours). So for those changes the plan first moves the object's own pixels, as an image editor would,
the image codec encodes the draft, and the model then reviews the drafted codes inside the region and redraws
the ones it doubts (:mod:`unimodal.instructed`). A change of shape has no draft: the model draws the new shape.

How an object is lifted off the canvas: the scenes' objects are flat colours on a flat grey background, with
anti-aliased edges. Each pixel near the object is ``background + coverage * (colour - background)``; its
coverage is the projection of ``pixel - background`` on ``colour - background``, clipped to [0, 1]. Removing
the object subtracts ``coverage * (colour - background)``; putting it back elsewhere, at another size or in
another colour adds ``coverage' * (colour' - background)`` with the coverage map moved and scaled. Noise and
shading that are not the object's stay where they were.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from unimodal.core.grammar import COLORS, IMAGE_SIZE, POSITIONS, SIZES

GREY_SPREAD = 24  # a background pixel: max - min channel below this (the scenes' background is exact grey)
EDGE = 2  # pixels around the object's saturated core that may hold its anti-aliased edge


def background_colour(rgb: np.ndarray) -> np.ndarray:
    """(3,) float: the median of the picture's grey pixels (of every pixel when too few are grey)."""
    pixels = rgb.reshape(-1, 3).astype(np.float32)
    grey = pixels.max(-1) - pixels.min(-1) < GREY_SPREAD
    return np.median(pixels[grey] if grey.sum() >= pixels.shape[0] // 8 else pixels, axis=0)


def dilated(mask: np.ndarray, radius: int) -> np.ndarray:
    """(H, W) bool: ``mask`` grown by ``radius`` pixels in every direction (a square neighbourhood)."""
    grown = mask.copy()
    for dy in range(-radius, radius + 1):
        for dx in range(-radius, radius + 1):
            grown |= np.roll(np.roll(mask, dy, 0), dx, 1) & _inside_shift(mask.shape, dy, dx)
    return grown


def _inside_shift(shape: tuple[int, int], dy: int, dx: int) -> np.ndarray:
    """Where a roll by (dy, dx) did not wrap around the canvas edge."""
    keep = np.ones(shape, dtype=bool)
    if dy > 0:
        keep[:dy] = False
    elif dy < 0:
        keep[dy:] = False
    if dx > 0:
        keep[:, :dx] = False
    elif dx < 0:
        keep[:, dx:] = False
    return keep


def object_coverage(rgb: np.ndarray, core: np.ndarray, background: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(H, W) coverage in [0, 1] of the object whose saturated pixels are ``core``, and its (3,) colour.

    Only pixels within :data:`EDGE` of the core count: the other object of a pair is never lifted with it."""
    pixels = rgb.astype(np.float32)
    colour = np.median(pixels[core], axis=0)
    direction = colour - background
    coverage = ((pixels - background) @ direction) / max(float(direction @ direction), 1.0)
    return np.clip(coverage, 0.0, 1.0) * dilated(core, EDGE), colour


def coverage_box(coverage: np.ndarray) -> list[float]:
    """The pixel box (x0, y0, x1, y1) of the pixels at least half covered."""
    rows, cols = np.flatnonzero((coverage >= 0.5).any(1)), np.flatnonzero((coverage >= 0.5).any(0))
    return [float(cols[0]), float(rows[0]), float(cols[-1] + 1), float(rows[-1] + 1)]


def _moved(coverage: np.ndarray, centre: tuple[float, float], to: tuple[float, float], scale: float) -> np.ndarray:
    """The coverage map scaled by ``scale`` about ``centre`` and put with that centre at ``to`` (bilinear)."""
    (cx, cy), (tx, ty) = centre, to
    # PIL's affine maps each output pixel (x, y) to the input pixel (a x + b y + c, d x + e y + f).
    coefficients = (1 / scale, 0.0, cx - tx / scale, 0.0, 1 / scale, cy - ty / scale)
    picture = Image.fromarray(coverage.astype(np.float32), mode="F")
    return np.asarray(picture.transform(picture.size, Image.AFFINE, coefficients, resample=Image.BILINEAR))


def _fitted(c: float, side: float) -> float:
    """A centre coordinate moved just enough that an object of ``side`` pixels stays on the canvas."""
    half = side / 2
    return float(np.clip(c, half + 1, IMAGE_SIZE - 1 - half))


def draft_picture(rgb: np.ndarray, core: np.ndarray, before: dict, after: dict) -> np.ndarray | None:
    """(H, W, 3) uint8: ``rgb`` with the object whose saturated pixels are ``core`` changed from its grammar
    attributes ``before`` to ``after`` (colour, size and position); None when the shape changes (there is no
    silhouette to keep) or the object's pixels are not found."""
    if after["shape"] != before["shape"] or core.sum() == 0:
        return None
    background = background_colour(rgb)
    coverage, colour = object_coverage(rgb, core, background)
    if not (coverage >= 0.5).any():
        return None
    x0, y0, x1, y1 = coverage_box(coverage)
    centre, measured = ((x0 + x1) / 2, (y0 + y1) / 2), max(x1 - x0, y1 - y0)
    resized, moved = after["size"] != before["size"], after.get("position") != before.get("position")
    scale = SIZES[after["size"]] / measured if resized else 1.0  # to the grammar's side, whatever it measured
    to = POSITIONS[after["position"]] if moved else centre
    if resized or moved:  # a recolour leaves the object exactly where it is, even at the canvas edge
        to = (_fitted(to[0], measured * scale), _fitted(to[1], measured * scale))
    new_colour = np.array(COLORS[after["color"]], np.float32) if after["color"] != before["color"] else colour
    lifted = rgb.astype(np.float32) - coverage[..., None] * (colour - background)
    placed = _moved(coverage, centre, to, scale)
    drafted = lifted + placed[..., None] * (new_colour - background)
    return np.clip(np.rint(drafted), 0, 255).astype(np.uint8)


__all__ = ["background_colour", "coverage_box", "dilated", "draft_picture", "object_coverage"]
