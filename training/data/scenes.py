"""``scenes``: 64x64 pictures of one or two coloured shapes, with paraphrased captions and their speech.

Every sample is a pure function of (seed, split, index), so a set rebuilt with the same seed is identical
and growing ``n`` only appends samples. Colour+shape pairs in :data:`HELDOUT_PAIRS` never appear in
train/val/test; the ``heldout`` split holds only scenes that use them, to measure compositional
generalisation.
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw

from unimodal.training.data.speech import Voice, synthesize
from unimodal.training.data.store import Sample
from unimodal.core.grammar import COLORS, IMAGE_SIZE, PAIR_TEMPLATES, POSITIONS, RELATIONS, SHAPES, SINGLE_TEMPLATES, SIZES, scene_caption

HELDOUT_PAIRS = frozenset({("red", "triangle"), ("green", "circle"), ("blue", "cross"), ("yellow", "square")})
PAIR_FRACTION = 0.4  # share of scenes with two objects (the default; ``unimodal data build --pair-fraction``)
SUPERSAMPLE = 4  # draw at 4x and box-filter down: smooth, deterministic edges
POSITION_JITTER = 2  # pixels around a single object's anchor
PAIR_OFFSET = 17  # distance of each object of a pair from the canvas centre along the relation axis
PAIR_CROSS_JITTER = 6  # free offset across the relation axis
COLOR_JITTER = 8  # per-channel variation of an object's colour


def _random_object(rng: np.random.Generator) -> dict:
    return {"shape": SHAPES[rng.integers(len(SHAPES))],
            "color": list(COLORS)[rng.integers(len(COLORS))],
            "size": list(SIZES)[rng.integers(len(SIZES))]}


def _is_heldout(obj: dict) -> bool:
    return (obj["color"], obj["shape"]) in HELDOUT_PAIRS


def sample_attributes(rng: np.random.Generator, heldout: bool, pair_fraction: float = PAIR_FRACTION) -> dict:
    """Draw scene attributes; with ``heldout`` the scene uses a held-out pair, else it uses none.
    ``pair_fraction``: the chance of two objects (decided by the first draw of ``rng``)."""
    while True:
        if rng.random() < pair_fraction:
            a, b = _random_object(rng), _random_object(rng)
            if a["color"] == b["color"]:
                continue  # two objects always differ in colour, so each is identifiable
            attrs = {"objects": [a, b], "relation": RELATIONS[rng.integers(len(RELATIONS))]}
        else:
            obj = _random_object(rng)
            obj["position"] = list(POSITIONS)[rng.integers(len(POSITIONS))]
            attrs = {"objects": [obj], "relation": None}
        if any(_is_heldout(o) for o in attrs["objects"]) == heldout:
            return attrs


def _clamp_center(c: float, side: int) -> float:
    half = side / 2
    return float(np.clip(c, half + 1, IMAGE_SIZE - 1 - half))


def layout_objects(attrs: dict, rng: np.random.Generator) -> list[tuple[float, float]]:
    """Pixel centre (x, y) of each object."""
    objects = attrs["objects"]
    if len(objects) == 1:
        x, y = POSITIONS[objects[0]["position"]]
        jitter = rng.integers(-POSITION_JITTER, POSITION_JITTER + 1, size=2)
        side = SIZES[objects[0]["size"]]
        return [(_clamp_center(x + jitter[0], side), _clamp_center(y + jitter[1], side))]
    sign = -1 if attrs["relation"] in ("left of", "above") else 1  # where the first object goes
    centres = []
    for obj, s in zip(objects, (sign, -sign)):
        along = IMAGE_SIZE / 2 + s * PAIR_OFFSET + rng.integers(-1, 2)
        across = IMAGE_SIZE / 2 + rng.integers(-PAIR_CROSS_JITTER, PAIR_CROSS_JITTER + 1)
        side = SIZES[obj["size"]]
        xy = (along, across) if attrs["relation"] in ("left of", "right of") else (across, along)
        centres.append((_clamp_center(xy[0], side), _clamp_center(xy[1], side)))
    return centres


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, side: float, fill) -> None:
    h = side / 2
    if shape == "circle":
        draw.ellipse([cx - h, cy - h, cx + h, cy + h], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - h, cy - h, cx + h, cy + h], fill=fill)
    elif shape == "triangle":
        draw.polygon([(cx, cy - h), (cx + h, cy + h), (cx - h, cy + h)], fill=fill)
    elif shape == "cross":
        arm = side / 6
        draw.rectangle([cx - arm, cy - h, cx + arm, cy + h], fill=fill)
        draw.rectangle([cx - h, cy - arm, cx + h, cy + arm], fill=fill)
    else:
        raise ValueError(f"unknown shape {shape!r}")


def render_scene(attrs: dict, rng: np.random.Generator) -> tuple[np.ndarray, list[tuple[float, float]]]:
    """Draw the scene; returns the (64, 64, 3) uint8 image and the object centres."""
    s = SUPERSAMPLE
    background = int(rng.integers(16, 49))
    canvas = Image.new("RGB", (IMAGE_SIZE * s, IMAGE_SIZE * s), (background,) * 3)
    draw = ImageDraw.Draw(canvas)
    centres = layout_objects(attrs, rng)
    for obj, (cx, cy) in zip(attrs["objects"], centres):
        jitter = rng.integers(-COLOR_JITTER, COLOR_JITTER + 1, size=3)
        fill = tuple(int(np.clip(c + j, 0, 255)) for c, j in zip(COLORS[obj["color"]], jitter))
        _draw_shape(draw, obj["shape"], cx * s, cy * s, SIZES[obj["size"]] * s, fill)
    return np.asarray(canvas.reduce(s)), centres


def make_sample(seed: int, split_id: int, index: int, heldout: bool, speech: bool = True,
                pair_fraction: float = PAIR_FRACTION, voices: str = "varied") -> Sample:
    """The ``index``-th sample of a split: a pure function of its arguments (``voices``: the voice set of its
    spoken caption, :data:`unimodal.training.data.speech.VOICE_SETS`)."""
    rng = np.random.default_rng([seed, split_id, index])
    attrs = sample_attributes(rng, heldout, pair_fraction)
    image, centres = render_scene(attrs, rng)
    n_templates = len(SINGLE_TEMPLATES) if len(attrs["objects"]) == 1 else len(PAIR_TEMPLATES)
    template = int(rng.integers(n_templates))
    caption = scene_caption(attrs, template)
    voice = Voice.random(rng, voices)
    audio = synthesize(caption, voice) if speech else None
    meta = {"attributes": attrs, "template": template, "centers": [[round(x, 2), round(y, 2)] for x, y in centres],
            "voice": voice.to_dict() if speech else None}
    return Sample(text=caption, image=image, audio=audio, meta=meta)
